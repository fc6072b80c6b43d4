"""What changed between two releases' locks (/opt/dtc/requirements.lock, docker/lock-environment.py).

Usage: python lock_diff.py OLD_LOCK NEW_LOCK   (standard library only: scripts/release.sh runs it
with any python3, on a workstation or in CodeBuild). Prints one line per distribution added (+),
removed (-), at another version (~), or at the same version from a wheel with other bytes (!):
for a wheel built in the image's builder stage that is a rebuild, for an index's wheel it is what
hash-locking exists to show (a re-uploaded or substituted file). Exit 0 either way; exit 2 when a
file is not a lock.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:==(?P<version>\S+)| @ file://\S*/(?P<wheel>[^/\s]+\.whl))"
                  r" --hash=sha256:(?P<sha256>[0-9a-f]{64})$")


class Locked(NamedTuple):
    """One lock line: the version, its wheel's sha256 (64 hex), and whether the wheel was built here."""
    version: str
    sha256: str
    local: bool


def parse(text: str) -> dict[str, Locked]:
    """Canonical name (PEP 503) -> Locked, for every requirement line of a lock's ``text``.

    Raises ValueError naming the first line that is neither a comment, a pip option nor a
    hash-locked requirement."""
    locked = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith(("#", "-")):
            continue
        match = LINE.match(line)
        if match is None:
            raise ValueError(f"line {number} is not a hash-locked requirement: {line[:200]}")
        name = re.sub(r"[-_.]+", "-", match["name"]).lower()
        version = match["version"] or match["wheel"].split("-")[1]
        locked[name] = Locked(version, match["sha256"], match["wheel"] is not None)
    return locked


def changes(old: dict[str, Locked], new: dict[str, Locked]) -> list[str]:
    """One line per changed distribution, sorted by name; empty when nothing changed."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before is None:
            lines.append(f"+ {name} {after.version}")
        elif after is None:
            lines.append(f"- {name} {before.version}")
        elif before.version != after.version:
            lines.append(f"~ {name} {before.version} -> {after.version}")
        elif before.sha256 != after.sha256:
            why = "rebuilt here" if after.local else "another wheel at the same version on the index"
            lines.append(f"! {name} {after.version}: {why} (sha256 {before.sha256[:12]} -> {after.sha256[:12]})")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: lock_diff.py OLD_LOCK NEW_LOCK", file=sys.stderr)
        return 2
    try:
        old, new = (parse(Path(path).read_text()) for path in args)
    except (OSError, ValueError) as error:
        print(f"lock_diff: {error}", file=sys.stderr)
        return 2
    lines = changes(old, new)
    for line in lines:
        print(line)
    print(f"{len(lines)} of {len(new)} distributions changed" if lines
          else f"no change: the same {len(new)} distributions from the same wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
