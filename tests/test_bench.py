"""`make bench QUICK=1`: the benchmark harness runs end to end in the image and writes well-formed
results (no timing is asserted: performance is judged by `make bench` on an idle machine), plus
the A7 model's arithmetic on known inputs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import common  # noqa: E402
import model  # noqa: E402
from test_image import flavor_image  # noqa: E402


def test_busbw_is_the_nccl_tests_formula():
    assert common.busbw_gbps(8e9, 2.0, 2) == pytest.approx(4.0)        # algbw 4 GB/s x 2(2-1)/2
    assert common.busbw_gbps(8e9, 2.0, 8) == pytest.approx(7.0)        # x 2(8-1)/8
    assert common.summary([3.0, 1.0, 2.0, 4.0, 5.0]) == {"median": 3.0, "iqr": 2.0, "min": 1.0, "max": 5.0,
                                                         "repeats": 5}


def test_the_alpha_beta_fit_recovers_known_parameters_and_the_model_matches_the_horovod_paper():
    alpha, beta = 50e-6, 2e9
    sizes = [4096, 1 << 20, 8 << 20, 32 << 20]
    fitted_alpha, fitted_beta = model.fit_alpha_beta(sizes, [2 * alpha + m / beta for m in sizes])
    assert fitted_alpha == pytest.approx(alpha) and fitted_beta == pytest.approx(beta)
    paper = model.ASSUMPTIONS["paper_link"]
    rows = {r["gpus"]: r for r in model.projection(paper["alpha_s"], paper["beta_bytes_per_s"])}
    for gpus, measured in model.ASSUMPTIONS["paper_efficiency"].items():
        assert rows[gpus]["ring_efficiency"] == pytest.approx(measured, abs=0.03)   # the paper's 88-90 %
    assert rows[128]["ps_efficiency"] < 0.6 < rows[128]["ring_efficiency"]          # and its PS comparison


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
    assert a1 == {(v, s) for v in ("horovod-mpi", "horovod-mpi-cycle-0.1ms", "horovod-gloo", "torch-gloo", "mpi4py", "memcpy")
                  for s in (4096, 1 << 20)}
    assert all(r["busbw_gbps"] > 0 for r in records if r["benchmark"] == "A1" and r["variant"] != "memcpy")
    assert {r["variant"] for r in records if r["benchmark"] == "A2"} == {
        "horovod-gloo-fusion-on", "horovod-gloo-fusion-off", "horovod-mpi-fusion-on", "horovod-mpi-fusion-off",
        "ddp-bucket-1mb", "ddp-bucket-25mb"}
    assert len([r for r in records if r["benchmark"] == "A4"]) == 8         # 4 variants x 2 repeats
    assert {r["variant"] for r in records if r["benchmark"] == "A5"} == {
        "ours-single", "bare-single", "ours-mpi", "bare-mpi", "ours-torchrun", "bare-torchrun"}
    assert all(r["time_s"] > 0 for r in records if r["benchmark"] in ("A2", "A4", "A5"))
    measurements = {r["measurement"] for r in results["ratios"]}
    assert "Horovod step, Gloo (TCP): fusion off / fusion on (speed-up)" in measurements
    a7 = results["a7_model"]
    assert [r["gpus"] for r in a7["projection_paper_link"]] == [8, 16, 32, 64, 128, 256, 512]
    assert (a7["fitted"] or {"beta_bytes_per_s": 1})["beta_bytes_per_s"] > 0 or a7["fit_error"]
    for png in ("a1_allreduce_busbw.png", "a2.png", "a4.png", "a5.png", "a7_projection.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "met" in done.stdout and "fusion off / fusion on" in done.stdout    # the printed ratio table
