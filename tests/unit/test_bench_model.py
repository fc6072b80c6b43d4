"""The benchmark harness's arithmetic on known inputs: busbw (nccl-tests' formula), the A7
model's alpha-beta fit against the Horovod paper's measured efficiencies (bench/common.py,
bench/model.py), and A8's ratios (bench/run.py)."""

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import common
import model
import run


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


def test_a8_compares_the_trainers_median_images_per_s_with_the_bare_loops_per_case():
    rows = [("trainer", "shufflenet", [96.0, 98.0, 97.0]), ("bare-loop", "shufflenet", [101.0, 99.0, 100.0]),
            ("trainer", "digits-cnn", [800.0]), ("bare-loop", "digits-cnn", [1000.0]),
            ("horovod-1-rank", "digits-cnn", [700.0]), ("ddp-1-rank", "digits-cnn", [600.0]),
            ("bare-loop-ddp", "digits-cnn", [750.0]), ("trainer-no-stall-rule", "digits-cnn", [820.0])]
    records = [{"benchmark": "A8", "variant": variant, "case": case, "repeat": repeat, "images_per_s": value}
               for variant, case, values in rows for repeat, value in enumerate(values)]
    summaries, ratios = run.analyse(records)
    assert summaries["A8"]["trainer@shufflenet"]["median"] == 97.0
    a8 = {r["measurement"]: (r["value"], r["target"], r["met"]) for r in ratios if r["benchmark"] == "A8"}
    assert a8 == {
        "built-in trainer / bare loop, training images/s, digits-cnn, 1 process": (pytest.approx(0.8), 0.97, False),
        "built-in trainer / bare loop, training images/s, shufflenet, 1 process": (pytest.approx(0.97), 0.97, True),
        "built-in trainer with / without the stall rule, training images/s, digits-cnn": (
            pytest.approx(800 / 820), None, None),
        "Horovod trainer on 1 rank / bare loop, training images/s, digits-cnn": (pytest.approx(0.7), None, None),
        "DDP trainer on 1 rank / bare loop, training images/s, digits-cnn": (pytest.approx(0.6), None, None),
        "bare loop in DDP (group of 1) / bare loop, training images/s, digits-cnn": (pytest.approx(0.75), None, None),
        "DDP trainer on 1 rank / bare loop in DDP, training images/s, digits-cnn": (pytest.approx(0.8), None, None)}


def test_the_gpu_suite_refuses_a_part_it_does_not_have_before_touching_a_gpu(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import suite

    with pytest.raises(SystemExit) as stopped:
        suite.main(["--out", str(tmp_path), "--parts", "B1,B7"])
    assert stopped.value.code == 2
    assert "--parts: 'B1,B7' is not a comma-separated subset of B1,B2,B3,B4,B5,B6" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())   # nothing measured, nothing written
