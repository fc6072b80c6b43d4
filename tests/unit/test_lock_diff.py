"""dtc_local.lock_diff: what make push prints between two releases' locks."""

import pytest

from dtc_local.lock_diff import Locked, changes, main, parse

A, B = "a" * 64, "b" * 64
OLD = f"""# header
# horovod-0.28.1-cp311-cp311-linux_x86_64.whl sha256={A}
--only-binary=:all:
--extra-index-url https://download.pytorch.org/whl/cpu
horovod @ file:///opt/dtc/wheels/horovod-0.28.1-cp311-cp311-linux_x86_64.whl --hash=sha256:{A}
Numpy==2.4.5 --hash=sha256:{A}
six==1.17.0 --hash=sha256:{A}
idna==3.20 --hash=sha256:{A}
gone==1.0 --hash=sha256:{A}
"""
NEW = f"""--only-binary=:all:
horovod @ file:///opt/dtc/wheels/horovod-0.28.1-cp311-cp311-linux_x86_64.whl --hash=sha256:{B}
numpy==2.4.6 --hash=sha256:{B}
six==1.17.0 --hash=sha256:{B}
idna==3.20 --hash=sha256:{A}
torch==2.13.0+cpu --hash=sha256:{A}
"""


def test_parse_reads_index_and_local_lines():
    assert parse(OLD)["horovod"] == Locked("0.28.1", A, True)
    assert parse(OLD)["numpy"] == Locked("2.4.5", A, False)
    assert sorted(parse(NEW)) == ["horovod", "idna", "numpy", "six", "torch"]


def test_changes_name_each_kind_and_nothing_else():
    assert changes(parse(OLD), parse(NEW)) == [
        "- gone 1.0",
        f"! horovod 0.28.1: rebuilt here (sha256 {A[:12]} -> {B[:12]})",
        "~ numpy 2.4.5 -> 2.4.6",
        f"! six 1.17.0: another wheel at the same version on the index (sha256 {A[:12]} -> {B[:12]})",
        "+ torch 2.13.0+cpu",
    ]
    assert changes(parse(NEW), parse(NEW)) == []


def test_a_line_without_its_hash_is_not_a_lock(tmp_path, capsys):
    with pytest.raises(ValueError, match="line 2 is not a hash-locked requirement: numpy==2.4.6"):
        parse("--only-binary=:all:\nnumpy==2.4.6\n")
    (tmp_path / "old").write_text("numpy==2.4.6\n")
    (tmp_path / "new").write_text(NEW)
    assert main([str(tmp_path / "old"), str(tmp_path / "new")]) == 2
    assert "line 1 is not a hash-locked requirement" in capsys.readouterr().err
    assert main([str(tmp_path / "new"), str(tmp_path / "new")]) == 0
    assert capsys.readouterr().out == "no change: the same 5 distributions from the same wheels\n"
