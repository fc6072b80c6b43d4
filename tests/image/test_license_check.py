"""The license check of the image build (dtc_local.licenses) rerun in the built CPU image with an
accepted-license file that lacks MIT and one component entry: it fails, naming the file first and
then each distribution that declares MIT and the entry's component, and writes no licenses."""

import re

import pytest

from dtc_local.licenses import ACCEPTED
from helpers import container, flavor_image

pytestmark = pytest.mark.image


def test_a_license_not_accepted_fails_the_check_naming_each_component(tmp_path):
    text = ACCEPTED.read_text()
    planted = re.sub(r'"MIT", ', "", text, count=1)
    planted = re.sub(r'\[\[component\]\]\nname = "protobuf"\n[^\[]*', "", planted)
    assert planted.count('"MIT"') == text.count('"MIT"') - 1 and 'name = "protobuf"' not in planted
    (tmp_path / "accepted.toml").write_text(planted)
    done = container("run", "--rm", "--network", "none", "-v", f"{tmp_path}:/planted:ro", flavor_image("cpu"),
                     "bash", "-c", "python -m dtc_local.licenses --sbom /opt/dtc/sbom.cdx.json --out /tmp/licenses "
                     "--flavor cpu --accepted /planted/accepted.toml; echo exit=$?; ls /tmp/licenses 2>&1 | head -1")
    lines = done.stderr.splitlines()
    first = [i for i, line in enumerate(lines) if line.startswith("licenses not accepted by /planted/accepted.toml")]
    assert first, done.stderr[-3000:]
    problems = lines[first[0] + 1:]
    assert "exit=1" in done.stdout and "No such file or directory" in done.stdout
    [protobuf] = [p for p in problems if p.startswith("protobuf ")]
    assert protobuf.endswith(": declares no license: read it and add a [[component]] entry with its license and why")
    mit = {p.split(" ")[0] for p in problems if "license 'MIT' is not accepted" in p}
    assert {"six", "urllib3", "attrs"} <= mit, problems
    assert all(("'MIT'" in p) or p.startswith("protobuf ") for p in problems), problems
