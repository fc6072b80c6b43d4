"""EFA (`dtc_entrypoint.fabric`): the RDMA devices a container sees, and where NCCL's `dlopen` would
find its OFI plugin; the preflight's EFA finding reads both (tests/unit/test_preflight.py)."""

import pytest

from dtc_entrypoint import fabric
from dtc_entrypoint.preflight import checks

LDCONFIG_WITH_PLUGIN = """\t2 libs found in cache `/etc/ld.so.cache'
\tlibnccl-net.so (libc6,x86-64) => /opt/amazon/ofi-nccl/lib/libnccl-net.so
\tlibfabric.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libfabric.so.1
"""


@pytest.fixture
def devices(tmp_path):
    directory = tmp_path / "infiniband"
    directory.mkdir()
    for name in ("uverbs0", "uverbs1", "rdma_cm"):
        (directory / name).touch()
    return directory


def test_rdma_devices_without_the_plugin_warn_naming_the_fix(devices):
    found = fabric.efa_devices(str(devices))
    assert found == ["uverbs0", "uverbs1"]
    assert fabric.find_plugin({}, ldconfig_cache="", default_dirs=()) is None
    finding = checks.efa_finding("ml.p4d.24xlarge", 2, found, None, has_nccl=True)
    assert finding.status == "warn" and "INSTALL_EFA=true" in finding.message and "TCP sockets" in finding.message


def test_the_plugin_in_the_linker_cache_or_on_the_library_path_is_found(tmp_path):
    assert fabric.find_plugin({}, LDCONFIG_WITH_PLUGIN, default_dirs=()) == "/opt/amazon/ofi-nccl/lib/libnccl-net.so"
    plugin_dir = tmp_path / "ofi"
    plugin_dir.mkdir()
    (plugin_dir / "libnccl-net-ofi.so").touch()
    assert fabric.find_plugin({"LD_LIBRARY_PATH": f"/nowhere:{plugin_dir}"}, "", default_dirs=()) == str(
        plugin_dir / "libnccl-net-ofi.so")


def test_a_named_plugin_is_looked_up_by_its_own_name(tmp_path):
    (tmp_path / "libnccl-net-aws.so").touch()
    env = {"NCCL_NET_PLUGIN": "aws", "LD_LIBRARY_PATH": str(tmp_path)}
    assert fabric.find_plugin(env, "", default_dirs=()) == str(tmp_path / "libnccl-net-aws.so")
    assert fabric.plugin_names({"NCCL_NET_PLUGIN": "other"}) == ("libnccl-net-other.so", "other")
    assert fabric.find_plugin({"NCCL_NET_PLUGIN": "other", "LD_LIBRARY_PATH": str(tmp_path)}, "",
                              default_dirs=()) is None


def test_no_device_directory_no_devices(tmp_path):
    assert fabric.efa_devices(str(tmp_path / "missing")) == []
