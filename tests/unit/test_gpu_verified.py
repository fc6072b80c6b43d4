"""The GPU image is verified for the current GPU build inputs: either the record
(tests/fixtures/gpu-verified.json, written by `make gpu-verify`) matches them, or this run built
the GPU image and ran its checks (`make test` does so when they differ; DTC_GPU_IMAGE is set)."""

import json
import os
import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gpu_inputs


def test_the_gpu_build_was_verified_for_these_inputs():
    recorded = gpu_inputs.recorded_sha256()
    if recorded != gpu_inputs.inputs_sha256():
        assert os.environ.get("DTC_GPU_IMAGE"), (
            "the GPU build's inputs changed since tests/fixtures/gpu-verified.json and this run did not build "
            "and check the GPU image: run `make gpu-verify` and commit the record")


def test_the_record_shows_a_build_within_its_budgets_and_passing_checks():
    record = json.loads(gpu_inputs.RECORD.read_text())
    assert record["build_s"] <= record["build_budget_s"] and record["size_gb"] <= record["size_budget_gb"]
    assert " passed" in record["checks"] and "failed" not in record["checks"] and "skipped" not in record["checks"]


def test_an_input_change_changes_the_hash(tmp_path):
    for name in gpu_inputs.input_files():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    assert gpu_inputs.inputs_sha256(tmp_path) == gpu_inputs.inputs_sha256()
    with open(tmp_path / "versions.env", "a") as handle:
        handle.write("# a comment\n")
    assert gpu_inputs.inputs_sha256(tmp_path) != gpu_inputs.inputs_sha256()
    assert gpu_inputs.main(["check"]) == (0 if gpu_inputs.recorded_sha256() == gpu_inputs.inputs_sha256() else 1)
