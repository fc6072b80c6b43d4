"""dtc_local.image_sanity's pure parts: the exceptions' verdict, the exceptions file, the
environment rule (the image checks themselves: tests/image/test_sanity.py)."""

import datetime

import pytest

from dtc_local.image_sanity import EXCEPTIONS, Exception_, Finding, environment_findings, judge, load_exceptions

TODAY = datetime.date(2026, 11, 29)


def entry(check, subject, review_by=datetime.date(2026, 12, 31), flavors=("cpu",)):
    return Exception_(check, subject, flavors, "because", review_by)


def test_an_excepted_finding_passes_until_its_review_date_and_fails_after_it():
    finding = Finding("hardening", "horovod", "of 2 ELF files: no canary 2")
    ok = judge([finding], [entry("hardening", "horovod")], "cpu", TODAY)
    assert ok.failed == () and ok.excepted == ((finding, entry("hardening", "horovod")),)
    on_the_day = judge([finding], [entry("hardening", "horovod", TODAY)], "cpu", TODAY)
    assert on_the_day.failed == ()
    late = judge([finding], [entry("hardening", "horovod", TODAY)], "cpu", TODAY + datetime.timedelta(days=1))
    assert late.excepted == ()
    assert late.failed == (Finding("exceptions", "horovod", "the exception for this hardening finding expired on "
                                   "2026-11-29: fix it or review the entry (of 2 ELF files: no canary 2)"),)


def test_a_finding_of_another_check_or_flavor_is_not_excepted_and_an_unused_entry_fails():
    findings = [Finding("cuda", "horovod", "bundles libcudart.so.12"), Finding("labels", "x", "missing")]
    verdict = judge(findings, [entry("hardening", "horovod"), entry("labels", "x", flavors=("gpu",))], "cpu", TODAY)
    assert verdict.excepted == ()
    assert verdict.failed == (*findings, Finding("exceptions", "horovod", "the hardening exception matches nothing in "
                                                  "the cpu image: remove it from image_sanity_exceptions.toml"))


def test_the_projects_exceptions_file_loads_and_every_entry_says_why(tmp_path):
    entries = load_exceptions(EXCEPTIONS)
    assert entries and all(e.why.strip() and e.flavors and isinstance(e.review_by, datetime.date) for e in entries)
    assert len({(e.check, e.subject) for e in entries}) == len(entries)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[exception]]\ncheck = "cuda"\nsubject = "torchvision"\nflavors = ["cpu"]\nwhy = "x"\n'
                   'review_by = "soon"\n')
    with pytest.raises(ValueError, match=r"bad.toml: exception 1 \(torchvision\) needs .*review_by"):
        load_exceptions(bad)


def test_secret_looking_variables_with_a_value_are_found_and_sagemakers_own_are_not():
    env = ["WANDB_API_KEY=abc", "AWS_SECRET_ACCESS_KEY=x", "HF_TOKEN=t", "DB_PASSWORD=p", "GITHUB_TOKEN=",
           "SAGEMAKER_SESSION_TOKEN=s", "PATH=/usr/bin", "TOKENIZERS_PARALLELISM=false", "PIP_CONSTRAINT=/etc/pip"]
    assert [f.subject for f in environment_findings(env)] == ["WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                                                              "DB_PASSWORD"]
