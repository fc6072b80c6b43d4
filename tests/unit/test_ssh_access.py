"""Unit: the authorized_keys line sshd gets for the image's key (dtc_entrypoint.ssh_access)."""

import json

from dtc_entrypoint import ssh_access

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE root@build\n"
RESOLVED = {"algo-1": ["10.0.0.11"], "algo-2": ["10.0.0.12", "fd00::12"], "algo-3": []}


def test_the_key_is_allowed_from_the_loopback_and_every_address_of_each_job_host():
    line = ssh_access.authorized_key(KEY, ["algo-1", "algo-2", "algo-3"], resolve=RESOLVED.__getitem__)
    assert line == 'from="127.0.0.1,::1,10.0.0.11,10.0.0.12,fd00::12" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE root@build'


def test_outside_a_job_only_the_loopback_may_log_in(tmp_path):
    assert ssh_access.job_hosts(str(tmp_path / "missing.json")) == []
    assert ssh_access.authorized_key(KEY, []).startswith('from="127.0.0.1,::1" ssh-ed25519 ')


def test_job_hosts_come_from_resourceconfig_and_a_malformed_file_gives_none(tmp_path):
    path = tmp_path / "resourceconfig.json"
    path.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}))
    assert ssh_access.job_hosts(str(path)) == ["algo-1", "algo-2"]
    for text in ("not json", "[]", '{"hosts": "algo-1"}'):
        path.write_text(text)
        assert ssh_access.job_hosts(str(path)) == []


def test_a_user_other_than_root_gets_no_key(capsys):
    assert ssh_access.main(["nobody"]) == 0
    assert capsys.readouterr().out == ""
