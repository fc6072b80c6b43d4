"""dtc_local.buildspec, the runner behind `make push` and tests/image/test_delivery.py: CodeBuild's
phase transitions, variable precedence and artifact rules (CodeBuild User Guide, "Build
specification reference", "Build phase transitions"), on small buildspecs run by a real shell."""

import json
import subprocess
import sys

import pytest

from dtc_local import buildspec
from helpers import REPO


def run(tmp_path, text: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "buildspec.yml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "dtc_local.buildspec", str(tmp_path / "buildspec.yml"),
                           "--artifacts-dir", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})
    result = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    return done, result


def test_phases_share_one_shell_in_codebuild_order_and_export_variables(tmp_path):
    done, result = run(tmp_path, """
version: 0.2
env:
  shell: bash
  variables: {GREETING: from-buildspec, KEPT: default}
  exported-variables: [RESULT]
phases:
  post_build: {commands: [echo "post $CODEBUILD_BUILD_SUCCEEDING $STEP" >> trace]}
  build: {commands: ['STEP=built; echo "build $GREETING $KEPT" >> trace', 'export RESULT=$(cat trace | wc -l)']}
  pre_build: {commands: [mkdir -p sub, cd sub, cd .., echo pre >> trace]}
artifacts: {files: ['trace'], discard-paths: yes}
""", env={"KEPT": "from-environment"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "trace").read_text().splitlines() == ["pre", "build from-buildspec from-environment",
                                                             "post 1 built"]
    assert result == {"status": 0, "exported_variables": {"RESULT": "2"}}
    assert (tmp_path / "out" / "trace").is_file()


def test_a_failed_build_still_runs_post_build_and_fails_without_artifacts(tmp_path):
    done, result = run(tmp_path, """
version: 0.2
phases:
  build: {commands: ['echo one >> trace', 'exit_code() { return 3; }; exit_code', 'echo never >> trace']}
  post_build: {commands: ['echo "post $CODEBUILD_BUILD_SUCCEEDING" >> trace']}
artifacts: {files: [trace]}
""")
    assert done.returncode == 3 and result["status"] == 3
    assert (tmp_path / "trace").read_text().splitlines() == ["one", "post 0"]
    assert "Phase BUILD failed: command exited 3" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_failed_pre_build_ends_the_build(tmp_path):
    done, _ = run(tmp_path, """
version: 0.2
phases:
  pre_build: {commands: ['false']}
  build: {commands: ['touch built']}
  post_build: {commands: ['touch posted']}
""")
    assert done.returncode == 1
    assert not (tmp_path / "built").exists() and not (tmp_path / "posted").exists()


def test_an_artifact_pattern_that_matches_nothing_fails_the_build(tmp_path):
    done, _ = run(tmp_path,
                  "version: 0.2\nphases:\n  build: {commands: ['true']}\nartifacts: {files: [missing/*.txt]}\n")
    assert done.returncode == 2 and "'missing/*.txt' matched no file" in done.stderr


@pytest.mark.parametrize("text, message", [
    ("version: 0.1\nphases: {}\n", "version must be 0.2"),
    ("version: 0.2\nphases:\n  build: {commands: [x], finally: [y]}\n", "phases.build: finally not supported"),
    ("version: 0.2\nphases:\n  deploy: {commands: [x]}\n", "phases.deploy is not a CodeBuild phase"),
    ("version: 0.2\nenv: {secrets-manager: {A: b}}\n", "env: secrets-manager not supported"),
    ("version: 0.2\nreports: {}\n", "reports not supported"),
    ("- a list\n", "the top level must be a mapping"),
])
def test_malformed_or_unsupported_buildspecs_are_refused_by_key(text, message):
    with pytest.raises(buildspec.BuildspecError, match=message):
        buildspec.parse(text, "buildspec.yml")


def test_the_projects_buildspec_parses_and_calls_release_steps_only():
    spec = buildspec.parse((REPO / "buildspec.yml").read_text())
    commands = [c for _, phase in spec.phases for c in phase]
    assert [c.split()[1] for c in commands if c.startswith("scripts/release.sh")] == [
        "repository", "login", "build", "test", "push"]
    assert spec.shell == "bash" and spec.exported_variables == ("IMAGE_URI",)
