"""versions.env: every pin's release date beside it (<KEY>_VERSION_RELEASED), as the SBOM shows it."""

import datetime
import re

from helpers import REPO

NO_REACHABLE_SOURCE = {"EFA_INSTALLER_VERSION"}    # AWS's site: not reachable from the build machines


def test_every_version_pin_is_followed_by_its_release_date():
    lines = [line for line in (REPO / "versions.env").read_text().splitlines() if re.match(r"^[A-Z]", line)]
    dated = 0
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0]
        if key.endswith("_RELEASED"):
            assert lines[index - 1].startswith(key[:-len("_RELEASED")] + "="), f"{key} does not follow its pin"
        elif key.endswith("_VERSION"):
            follower = lines[index + 1] if index + 1 < len(lines) else ""
            assert follower.startswith(f"{key}_RELEASED="), f"{key} has no {key}_RELEASED line after it"
            value = follower.split("=", 1)[1]
            if value == "unknown":
                assert key in NO_REACHABLE_SOURCE, f"{key}_RELEASED=unknown: give the date"
                continue
            released = datetime.date.fromisoformat(value)
            assert datetime.date(2020, 1, 1) <= released <= datetime.date.today(), line
            dated += 1
    assert dated >= 50
