"""`make bench QUICK=1`: the benchmark harness runs end to end in the image and writes well-formed
results (no timing is asserted: performance is judged by `make bench` on an idle machine). Its
arithmetic: tests/unit/test_bench_model.py."""

import json
import subprocess
import sys

import pytest

from helpers import REPO, flavor_image


@pytest.mark.image
def test_quick_bench_writes_results_records_and_plots(tmp_path):
    image = flavor_image("cpu")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--image", image, "--quick",
                           "--out-root", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run = tmp_path / "latest"
    results = json.loads((run / "results.json").read_text())
    assert results["quick"] and results["machine"]["cores"] >= 1 and "load_at_start" in results
    assert 0 <= results["cpu_busy_at_start"] <= 1 and isinstance(results["flagged_under_load"], bool)
    assert set(results["versions"]) >= {"torch", "tensorflow", "horovod", "openmpi"}
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    a1 = {(r["variant"], r["size_bytes"]) for r in records if r["benchmark"] == "A1"}
    assert a1 == {(v, s) for v in ("horovod-mpi", "horovod-mpi-cycle-0.1ms", "horovod-gloo", "torch-gloo", "mpi4py",
                                   "memcpy")
                  for s in (4096, 1 << 20)}
    assert all(r["busbw_gbps"] > 0 for r in records if r["benchmark"] == "A1" and r["variant"] != "memcpy")
    assert {r["variant"] for r in records if r["benchmark"] == "A2"} == {
        "horovod-gloo-fusion-on", "horovod-gloo-fusion-off", "horovod-mpi-fusion-on", "horovod-mpi-fusion-off",
        "ddp-bucket-1mb", "ddp-bucket-25mb"}
    assert len([r for r in records if r["benchmark"] == "A4"]) == 5         # 5 variants, one repeat
    assert {r["variant"] for r in records if r["benchmark"] == "A4"} == {
        "ours-single", "ours-single-preflight", "stock-single", "ours-mpi2", "stock-mpi2"}
    assert {r["variant"] for r in records if r["benchmark"] == "A5"} == {
        "ours-single", "bare-single", "ours-mpi", "bare-mpi", "ours-torchrun", "bare-torchrun"}
    assert all(r["time_s"] > 0 for r in records if r["benchmark"] in ("A2", "A4", "A5"))
    # A8: the trainers (no distribution, with and without the stall rule; Horovod and DDP on 1 rank)
    # and the bare loop, alone and in DDP, each measured over epoch 2 of the digits job
    a8 = {(r["variant"], r["case"]): r["images_per_s"] for r in records if r["benchmark"] == "A8"}
    assert set(a8) == {(variant, "digits-cnn") for variant in ("trainer", "trainer-no-stall-rule", "horovod-1-rank",
                                                               "ddp-1-rank", "bare-loop", "bare-loop-ddp")}
    assert all(v > 0 for v in a8.values()), a8
    measurements = {r["measurement"] for r in results["ratios"]}
    assert "Horovod step, Gloo (TCP): fusion off / fusion on (speed-up)" in measurements
    assert "train -> first line, single: seconds the preflight (quick, one CPU host) adds" in measurements
    assert "built-in trainer / bare loop, training images/s, digits-cnn, 1 process" in measurements
    assert "built-in trainer with / without the stall rule, training images/s, digits-cnn" in measurements
    assert "DDP trainer on 1 rank / bare loop, training images/s, digits-cnn" in measurements
    assert "DDP trainer on 1 rank / bare loop in DDP, training images/s, digits-cnn" in measurements
    a7 = results["a7_model"]
    assert [r["gpus"] for r in a7["projection_paper_link"]] == [8, 16, 32, 64, 128, 256, 512]
    assert (a7["fitted"] or {"beta_bytes_per_s": 1})["beta_bytes_per_s"] > 0 or a7["fit_error"]
    for png in ("a1_allreduce_busbw.png", "a2.png", "a4.png", "a5.png", "a8.png", "a7_projection.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "met" in done.stdout and "fusion off / fusion on" in done.stdout    # the printed ratio table
