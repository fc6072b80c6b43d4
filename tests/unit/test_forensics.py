"""Reading stacks (dtc_entrypoint.forensics) from faulthandler's real output, written here by this
process into files laid out as dtc_entrypoint.stack_dump writes them."""

import faulthandler
import json
import os
import signal
import sysconfig
import threading

from dtc_entrypoint import forensics, stack_dump


def _dump(path, header: str, depth: int = 0, times: int = 1) -> None:
    """Writes ``header`` then ``times`` dumps of this process, ``depth`` extra frames deep."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(header + "\n")
        out.flush()

        def nested(level: int) -> None:
            if level:
                nested(level - 1)
            else:
                for _ in range(times):
                    faulthandler.dump_traceback(file=out, all_threads=True)

        nested(depth)


def _header(pid: int, rank: str, host: str = "algo-1", forked_from: str = "", argv: str = "python train.py") -> str:
    return (f"{stack_dump.HEADER} pid={pid} host={host} rank={rank} local_rank={rank} world_size=4 "
            f"forked_from={forked_from} argv={argv}")


def test_parse_reads_the_main_thread_of_the_last_dump(tmp_path):
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        _dump(tmp_path / "pid7.txt", _header(7, "3"), depth=2, times=2)
    finally:
        stop.set()
    dump = forensics.parse(str(tmp_path / "pid7.txt"))
    assert (dump.pid, dump.host, dump.rank, dump.local_rank, dump.world_size, dump.argv) == (
        7, "algo-1", 3, 3, 4, "python train.py")
    assert dump.threads >= 2   # this one, the helper (and pytest's own, if any)
    names = [frame.function for frame in dump.main]
    assert names[:4] == ["nested", "nested", "nested", "_dump"], names   # innermost first, one dump's frames
    assert names.count("test_parse_reads_the_main_thread_of_the_last_dump") == 1
    assert dump.main[0].filename == __file__


def test_a_registration_without_a_dump_and_a_forked_child_are_told_apart(tmp_path):
    (tmp_path / "pid8.txt").write_text(_header(8, "0") + "\n")
    assert forensics.parse(str(tmp_path / "pid8.txt")) is None
    _dump(tmp_path / "pid9.txt", _header(9, "0", forked_from="8"))
    assert forensics.parse(str(tmp_path / "pid9.txt")).rank is None   # a DataLoader worker of rank 0
    _dump(tmp_path / "pid10.txt", _header(10, "1", argv="python -m dtc_entrypoint.rank_shim python train.py"))
    assert forensics.parse(str(tmp_path / "pid10.txt")).rank is None   # MPI's shim around rank 1


def _stacks(rank, frames, host="algo-1", world_size=4):
    return forensics.Stacks(100 + rank, host, rank, rank, world_size, "python train.py",
                            tuple(forensics.Frame(*frame) for frame in frames), 1, "")


TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def test_the_ranks_outside_a_collective_are_named_first_with_their_line():
    waiting = [(TORCH, 3252, "all_reduce"), ("/opt/ml/code/train.py", 47, "step"), ("/opt/ml/code/train.py", 60,
                                                                                   "<module>")]
    dumps = [_stacks(rank, waiting, host) for rank, host in ((0, "algo-1"), (1, "algo-1"), (3, "algo-2"))]
    dumps.append(_stacks(2, [(os.path.join(sysconfig.get_paths()["stdlib"], "threading.py"), 320, "wait"),
                             ("/opt/ml/code/loader.py", 30, "load_batch"), ("/opt/ml/code/train.py", 45, "<module>")],
                         "algo-2"))
    assert forensics.where_ranks_are(dumps) == (
        "rank 2 on algo-2 is in loader.py:30 (load_batch) while ranks 0-1, 3 on algo-1, algo-2 wait in all_reduce at "
        "train.py:47 (step)")
    assert forensics.where_ranks_are(dumps[:2]) == (
        "ranks 0-1 on algo-1 wait in all_reduce at train.py:47 (step): the rank they wait for is not on this host")
    assert forensics.where_ranks_are([]) == "no process wrote its stacks"
    mismatched = [_stacks(rank, waiting, world_size=2) for rank in (0, 1)]
    assert forensics.where_ranks_are(mismatched) == (
        "ranks 0-1 on algo-1 wait in all_reduce at train.py:47 (step): every rank waits in a collective (they called "
        "different ones, or in another order, or with other names)")


def test_a_compiled_collective_is_read_from_the_programs_line(tmp_path):
    program = tmp_path / "train.py"
    program.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\ncomm.Barrier()\nhvd.allreduce(x, name='g')\n")
    assert forensics.collective(_stacks(0, [(str(program), 3, "<module>")])) == "barrier"
    assert forensics.collective(_stacks(0, [(str(program), 4, "<module>")])) == "allreduce"
    assert forensics.collective(_stacks(0, [(str(program), 2, "<module>")])) is None


def test_keep_names_each_dump_by_rank_host_and_pid(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    _dump(live / "pid11.txt", _header(11, "2", host="algo-2"))
    _dump(live / "pid12.txt", _header(12, ""))
    (live / "pid13.txt").write_text(_header(13, "0") + "\n")
    assert sorted(os.path.basename(p) for p in stack_dump.dumped(str(live))) == ["pid11.txt", "pid12.txt"]
    folder = forensics.keep(stack_dump.dumped(str(live)), str(tmp_path / "output"))
    assert folder == str(tmp_path / "output" / "data" / "forensics" / "stacks")
    assert sorted(os.listdir(folder)) == ["process-algo-1-pid12.txt", "rank2-algo-2-pid11.txt"]


def test_catches_reads_the_signal_mask_of_a_process():
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert stack_dump.catches(os.getpid())
    finally:
        signal.signal(signal.SIGUSR2, previous)
    if previous in (signal.SIG_DFL, None):
        assert not stack_dump.catches(os.getpid())
    assert not stack_dump.catches(2 ** 22 + 1)   # no such process


def test_a_multi_worker_mirrored_worker_is_named_by_its_index_and_a_parameter_server_task_is_not(monkeypatch):
    """stack_dump's header: MultiWorkerMirrored sets no RANK, its TF_CONFIG's worker index is the
    rank (launch_tf.multi_worker_mirrored_plan); a parameter-server cluster's tasks have none."""
    cluster = {"worker": ["algo-1:8890", "algo-2:8890", "algo-3:8890"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 2}}))
    assert stack_dump.multi_worker_rank() == ("2", "3")
    ps_cluster = {"chief": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["algo-1:2223", "algo-2:2223"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": ps_cluster, "task": {"type": "worker", "index": 0}}))
    assert stack_dump.multi_worker_rank() == ("", "")
    for broken in ("not json", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}}', "[]"):
        monkeypatch.setenv("TF_CONFIG", broken)
        assert stack_dump.multi_worker_rank() == ("", "")
    monkeypatch.delenv("TF_CONFIG")
    assert stack_dump.multi_worker_rank() == ("", "")
