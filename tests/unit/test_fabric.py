"""The EFA warning (`dtc_entrypoint.fabric`): RDMA devices without NCCL's OFI plugin."""

import importlib.util

import pytest

from dtc_entrypoint import fabric

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


@pytest.fixture
def with_nccl(monkeypatch):
    """Makes nvidia.nccl importable-looking (the GPU flavor's NCCL wheel) without installing it."""
    real = importlib.util.find_spec
    monkeypatch.setattr(fabric.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "nvidia.nccl" else real(name, *a))


def test_rdma_devices_without_the_plugin_warn_naming_the_fix(devices, with_nccl):
    warning = fabric.efa_warning({}, str(devices), ldconfig_cache="", )
    assert warning.startswith(f"{devices} has 2 RDMA device(s) (uverbs0, uverbs1) but NCCL's OFI plugin")
    assert "INSTALL_EFA=true" in warning and "TCP sockets" in warning


def test_the_plugin_in_the_linker_cache_or_on_the_library_path_silences_it(devices, with_nccl, tmp_path):
    assert fabric.efa_warning({}, str(devices), ldconfig_cache=LDCONFIG_WITH_PLUGIN) is None
    plugin_dir = tmp_path / "ofi"
    plugin_dir.mkdir()
    (plugin_dir / "libnccl-net-ofi.so").touch()
    assert fabric.efa_warning({"LD_LIBRARY_PATH": f"/nowhere:{plugin_dir}"}, str(devices), ldconfig_cache="") is None


def test_a_named_plugin_is_looked_up_by_its_own_name(devices, with_nccl, tmp_path):
    (tmp_path / "libnccl-net-aws.so").touch()
    env = {"NCCL_NET_PLUGIN": "aws", "LD_LIBRARY_PATH": str(tmp_path)}
    assert fabric.efa_warning(env, str(devices), ldconfig_cache="") is None
    assert "libnccl-net-other.so" in fabric.efa_warning({"NCCL_NET_PLUGIN": "other"}, str(devices), ldconfig_cache="")


def test_no_devices_or_no_nccl_no_warning(tmp_path, devices):
    assert fabric.efa_warning({}, str(tmp_path / "missing"), ldconfig_cache="") is None
    assert importlib.util.find_spec("nvidia.nccl") is None      # the CPU flavor has no NCCL
    assert fabric.efa_warning({}, str(devices), ldconfig_cache="") is None
