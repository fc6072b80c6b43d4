"""The unit tier starts no process: a test here that tries (subprocess, os.system, fork, spawn)
fails naming what it started. Tests that need a real process belong in tests/integration."""

import os
import subprocess

import pytest


class ProcessStarted(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_process_is_started(monkeypatch):
    def refuse(name):
        def refused(*args, **kwargs):
            shown = args[1] if name == "subprocess.Popen" and len(args) > 1 else args[:1]
            raise ProcessStarted(f"a unit test started a process ({name} {shown!r}): move it to tests/integration")

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
