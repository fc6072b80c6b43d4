"""Unit: a requirement that conflicts with the image's pip constraint file (/etc/pip/constraint.txt)
is named on the failure's first line. The inputs are pip 25.3's own reports, recorded from real
runs against a constraint file (tests/integration/test_contract_fixes.py and tests/image run pip)."""

from dtc_entrypoint.program import pinned_conflict

DIRECT = """ERROR: Cannot install torch==2.5.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.5.0
    The user requested (constraint) torch==2.13.0+cpu

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/""".splitlines()

TRANSITIVE = """INFO: pip is looking at multiple versions of scipy to determine which version is compatible.
ERROR: Cannot install -r /tmp/r5.txt (line 1) because these package versions have conflicting dependencies.

The conflict is caused by:
    scipy 1.10.0 depends on numpy<1.27.0 and >=1.19.5
    The user requested (constraint) numpy==2.4.6

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/""".splitlines()

WAYS_OUT = ("use the image's version, build a derived image with the one you need, or set PIP_CONSTRAINT='' "
            "in the job's environment to lift the image's pins at your own risk (docs/versions.md, Protected pins)")


def test_a_requested_version_of_a_pinned_package_is_named_with_the_pin():
    assert pinned_conflict(DIRECT, "requirements.txt", "/etc/pip/constraint.txt") == (
        "requirements.txt asks for torch==2.5.0, but this image pins torch==2.13.0+cpu (/etc/pip/constraint.txt): "
        + WAYS_OUT)


def test_a_dependency_of_a_requirement_that_conflicts_names_both():
    assert pinned_conflict(TRANSITIVE, "requirements.txt", "") == (
        "requirements.txt asks for scipy 1.10.0, which depends on numpy<1.27.0 and >=1.19.5, but this image pins "
        "numpy==2.4.6: " + WAYS_OUT)


def test_other_pip_failures_are_left_to_pips_own_line():
    missing = ["ERROR: Could not find a version that satisfies the requirement nope (from versions: none)",
               "ERROR: No matching distribution found for nope"]
    assert pinned_conflict(missing, "requirements.txt", "/etc/pip/constraint.txt") is None
    unrelated = [line.replace("(constraint) torch", "(constraint) numpy") for line in DIRECT]
    assert pinned_conflict(unrelated, "requirements.txt", "") is None


def test_a_pinned_build_the_image_lacks_is_named_as_missing():
    """A derived image that uninstalled a pinned distribution keeps its pin; a bare requirement of it
    then finds no build that the pin admits."""
    report = [line.replace("torch==2.5.0", "deepspeed").replace("torch==2.13.0+cpu", "deepspeed==0.19.8")
              for line in DIRECT]
    assert pinned_conflict(report, "requirements.txt", "/etc/pip/constraint.txt") == (
        "requirements.txt asks for deepspeed; this image pins deepspeed==0.19.8 (/etc/pip/constraint.txt) "
        "but does not have it, and pip found no such build: use the GPU flavor, or a derived image that has it "
        "(docs/versions.md, Companion libraries)")
