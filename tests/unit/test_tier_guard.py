"""The unit tier's guard (tests/unit/conftest.py) refuses every way of starting a process."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"]),
    lambda: subprocess.Popen(["true"]),
    lambda: os.system("true"),
    lambda: os.fork(),
], ids=["subprocess.run", "Popen", "os.system", "os.fork"])
def test_starting_a_process_fails_naming_the_tier_to_move_to(start):
    with pytest.raises(AssertionError, match="a unit test started a process .* move it to tests/integration"):
        start()
