"""bench/machine_speed.py, the machine's speed that make test's phase table prints before and after
its tiers (scripts/test.sh): A8's bare loop run on this host, its reading, and its refusals."""

import json
import math
import subprocess
import sys

from helpers import REPO

SPEED = [sys.executable, str(REPO / "bench" / "machine_speed.py")]


def test_the_bare_loop_runs_here_and_its_median_rate_is_printed_as_one_json_line():
    done = subprocess.run([*SPEED, "--epochs", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.splitlines()
    reading = json.loads(line)
    assert set(reading) == {"bare_loop_images_per_s", "epochs", "seconds"}
    assert reading["epochs"] == 3
    assert math.isfinite(reading["bare_loop_images_per_s"]) and reading["bare_loop_images_per_s"] > 0
    assert 0 < reading["seconds"] < 300


def test_a_single_epoch_is_refused_naming_the_flag():
    done = subprocess.run([*SPEED, "--epochs", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not done.stdout
    assert "--epochs must be at least 2" in done.stderr.splitlines()[-1]
