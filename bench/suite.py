"""The CPU benchmark suite, run inside the image (bench/run.py starts it there): A1 allreduce
bandwidth, A2 tensor fusion, A3 weak scaling, A4 dispatch overhead, A5 distributed start, A8 the
built-in trainer against a bare loop.

Noise control: every rank pins itself to one core and one thread; A and B variants are interleaved
within each repeat (repeat 1 runs every variant, then repeat 2...), so a slow minute hits all of
them alike. The suite first waits (up to 3 minutes) for the machine to be idle, and the run is
flagged when it was not: more than 10 % of the CPUs busy over 2 s (/proc/stat), or a 1-minute load
average above 0.5; ``--quick``, a check of the harness, does not wait: it measures once. The load
average is also recorded before and after each benchmark (the benchmarks' own ranks raise it, by
design). Every repeat's raw record goes to ``<out>/records.jsonl``; ``<out>/meta.json`` holds the
machine, versions, pinning and loads.

Usage: ``python /bench/suite.py --out /out [--quick] [--only A1,A4]``; ``--quick`` runs A8's
digits case alone, over 2 epochs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import launch_overhead
import scaling
import trainer_overhead

HERE = Path(__file__).resolve().parent
SIZES_FULL = [4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20]
SIZES_QUICK = [4 << 10, 1 << 20]


def a1_a2_commands(out: str, quick: bool) -> dict[str, dict[str, list[str]]]:
    """benchmark -> variant -> the command that measures it once (``--repeat`` appended later)."""
    worker = [sys.executable, str(HERE / "collectives.py")]
    sizes = ",".join(str(s) for s in (SIZES_QUICK if quick else SIZES_FULL))
    mpirun = ["mpirun", "-np", "2", "-bind-to", "none"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29512"]
    horovodrun_gloo = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
    flags = ["--out", out] + (["--quick"] if quick else [])

    def a1(library, variant):
        return ["allreduce", "--library", library, "--variant", variant, "--sizes", sizes, *flags]

    def a2(library, variant, *extra):
        return ["fusion", "--library", library, "--variant", variant, *extra, *flags]

    return {
        "A1": {
            "horovod-mpi": [*mpirun, *worker, *a1("horovod", "horovod-mpi")],
            "horovod-mpi-cycle-0.1ms": [*mpirun, "-x", "HOROVOD_CYCLE_TIME=0.1", *worker,
                                        *a1("horovod", "horovod-mpi-cycle-0.1ms")],
            "horovod-gloo": [*horovodrun_gloo, *worker, *a1("horovod", "horovod-gloo")],
            "torch-gloo": [*torchrun, *worker[1:], *a1("torch", "torch-gloo")],
            "mpi4py": [*mpirun, *worker, *a1("mpi4py", "mpi4py")],
            "memcpy": [*worker, *a1("memcpy", "memcpy")],
        },
        "A2": {
            "horovod-gloo-fusion-on": ["env", "HOROVOD_FUSION_THRESHOLD=67108864", *horovodrun_gloo, *worker,
                                       *a2("horovod", "horovod-gloo-fusion-on")],
            "horovod-gloo-fusion-off": ["env", "HOROVOD_FUSION_THRESHOLD=0", *horovodrun_gloo, *worker,
                                        *a2("horovod", "horovod-gloo-fusion-off")],
            "horovod-mpi-fusion-on": [*mpirun, "-x", "HOROVOD_FUSION_THRESHOLD=67108864", *worker,
                                      *a2("horovod", "horovod-mpi-fusion-on")],
            "horovod-mpi-fusion-off": [*mpirun, "-x", "HOROVOD_FUSION_THRESHOLD=0", *worker,
                                       *a2("horovod", "horovod-mpi-fusion-off")],
            "ddp-bucket-1mb": [*torchrun, *worker[1:], *a2("ddp", "ddp-bucket-1mb", "--bucket-mb", "1")],
            "ddp-bucket-25mb": [*torchrun, *worker[1:], *a2("ddp", "ddp-bucket-25mb", "--bucket-mb", "25")],
        },
    }


def run_collectives(benchmark: str, variants: dict[str, list[str]], repeats: int) -> None:
    for repeat in range(repeats):
        for variant, argv in variants.items():
            done = subprocess.run([*argv, "--repeat", str(repeat)], capture_output=True, text=True, timeout=1800,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if done.returncode != 0:
                raise SystemExit(f"{benchmark} {variant} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                                 f"{done.stderr[-3000:]}")


def run_timed_cases(benchmark: str, cases: dict, repeats: int, records: str, work: Path) -> None:
    rows = []
    for repeat in range(repeats):
        for variant, (argv, env, ranks) in cases.items():
            seconds = launch_overhead.time_to_stamps(argv, env, work / "stamps", ranks)
            rows.append({"benchmark": benchmark, "variant": variant, "ranks": ranks, "repeat": repeat,
                         "time_s": seconds})
    common.write_records(records, rows)


def run_scaling(repeats: int, epochs: int, records: str, work: Path) -> None:
    """A3; a case this environment cannot run (``scaling.missing``) is recorded as skipped, once."""
    rows = []
    for case, (_, flags, _) in scaling.CASES.items():
        if scaling.missing(flags):
            rows.append({"benchmark": "A3", "variant": case, "skipped": scaling.missing(flags)})
    for repeat in range(repeats):
        for case, (_, flags, _) in scaling.CASES.items():
            for ranks in (1, 2):
                if not scaling.missing(flags):
                    rows.append({"benchmark": "A3", "variant": case, "ranks": ranks, "repeat": repeat,
                                 "images_per_s": scaling.run_case(work, case, ranks, epochs)})
    common.write_records(records, rows)


def run_trainer_overhead(repeats: int, epochs: int, cases: list[str], records: str, work: Path) -> None:
    """A8; a case this environment cannot run (``scaling.missing``) is recorded as skipped, once."""
    rows = [{"benchmark": "A8", "case": case, "skipped": scaling.missing(trainer_overhead.CASES[case][0])}
            for case in cases if scaling.missing(trainer_overhead.CASES[case][0])]
    for repeat in range(repeats):
        for case in cases:
            if scaling.missing(trainer_overhead.CASES[case][0]):
                continue
            for variant in trainer_overhead.VARIANTS:
                rows.append({"benchmark": "A8", "variant": variant, "case": case, "repeat": repeat,
                             "images_per_s": trainer_overhead.run(work, case, variant, epochs)})
    common.write_records(records, rows)


def versions() -> dict[str, str]:
    names = ("tensorflow", "torch", "horovod", "mpi4py", "nvidia-dali-cuda120", "sagemaker-training", "numpy")
    found = {name: metadata.version(name) for name in names}
    found["openmpi"] = subprocess.run(["ompi_info", "--parsable"], capture_output=True, text=True).stdout \
        .split("ompi:version:full:")[1].split()[0]
    found["image_flavor"] = os.environ.get("FLAVOR", "")
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the harness in seconds")
    parser.add_argument("--only", default="A1,A2,A3,A4,A5,A8")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = str(out / "records.jsonl")
    repeats = 1 if args.quick else args.repeats
    wanted = args.only.split(",")
    busy_at_start = common.wait_for_idle(0 if args.quick else 180)
    load_at_start = common.load_average()
    meta = {"machine": common.machine(), "versions": versions(), "quick": args.quick, "repeats": repeats,
            "pinning": "each rank pinned to one core (sched_setaffinity by local rank), 1 intra-op thread",
            "cpu_busy_at_start": busy_at_start, "load_at_start": load_at_start,
            "flagged_under_load": busy_at_start > common.BUSY_FLAG_THRESHOLD
            or load_at_start > common.LOAD_FLAG_THRESHOLD, "load": {}}
    commands = a1_a2_commands(records, args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for benchmark in wanted:
            before = common.load_average()
            print(f"[bench] {benchmark} (load {before:.2f})", flush=True)
            if benchmark in commands:
                run_collectives(benchmark, commands[benchmark], repeats)
            elif benchmark == "A3":
                run_scaling(repeats, 2 if args.quick else 4, records, work)
            elif benchmark == "A4":
                run_timed_cases("A4", launch_overhead.dispatch_cases(work), 1 if args.quick else 10, records, work)
            elif benchmark == "A5":
                run_timed_cases("A5", launch_overhead.distributed_start_cases(work), repeats, records, work)
            elif benchmark == "A8":
                run_trainer_overhead(repeats, 2 if args.quick else 4,
                                     ["digits-cnn"] if args.quick else list(trainer_overhead.CASES), records, work)
            else:
                raise SystemExit(f"unknown benchmark {benchmark}")
            meta["load"][benchmark] = {"before": before, "after": common.load_average()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"[bench] records in {records}", flush=True)


if __name__ == "__main__":
    main()
