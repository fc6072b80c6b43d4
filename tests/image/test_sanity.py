"""The image sanity checks (dtc_local.image_sanity) on the built CPU image, and on an
image derived from it with a credential file, a private key, a key made readable, a secret
variable, an unhardened binary and a CUDA library planted in it: each is named, and nothing else.
"""

import datetime
import subprocess
import uuid

import pytest

from dtc_local.image_sanity import load_exceptions
from helpers import flavor_image, image_sanity

pytestmark = pytest.mark.image
FAILED = "FAILED "


def failed(done: subprocess.CompletedProcess) -> dict[tuple[str, str], str]:
    """(check, subject) -> detail of every FAILED line."""
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith(FAILED):
            check, rest = line[len(FAILED):].split(" ", 1)
            subject, detail = rest.split(": ", 1)
            found[(check, subject)] = detail
    return found


def test_the_cpu_image_has_nothing_but_its_listed_exceptions_and_they_expire():
    image = flavor_image("cpu")
    exceptions = [e for e in load_exceptions() if "cpu" in e.flavors]
    done = image_sanity(image, "cpu")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"{image}: 0 failed, {len(exceptions)} excepted"
    # The day after the earliest review date, that entry's findings fail, naming the date.
    earliest = min(e.review_by for e in exceptions)
    due = {(e.check, e.subject) for e in exceptions if e.review_by == earliest}
    late = image_sanity(image, "cpu", "--today", (earliest + datetime.timedelta(days=1)).isoformat())
    assert late.returncode == 1
    assert {subject for _, subject in failed(late)} == {subject for _, subject in due}, late.stdout[-4000:]
    assert all(check == "exceptions" and f"expired on {earliest}" in detail
               for (check, _), detail in failed(late).items())


def test_planted_credentials_a_secret_variable_an_unhardened_binary_and_a_cuda_library_are_each_named(tmp_path):
    base = flavor_image("cpu")
    context = tmp_path / "context"
    context.mkdir()
    # An unhardened shared library, as a careless build would make it.
    (tmp_path / "planted.c").write_text("int planted(char *d, const char *s, int n) {\n"
                                        "  char b[64]; __builtin_memcpy(b, s, n); return b[0] + d[0]; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-fno-stack-protector", "-U_FORTIFY_SOURCE",
                    "-Wl,-z,norelro", "-Wl,-z,execstack", "-o", str(context / "libplanted.so"),
                    str(tmp_path / "planted.c")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(context / "deploy_key")], check=True)
    (context / "credentials").write_text("[default]\naws_access_key_id = AKIAPLANTED\n")
    (context / "Containerfile").write_text(
        f"FROM {base}\n"
        "COPY libplanted.so /usr/local/lib/libplanted.so\n"
        "COPY libplanted.so /usr/lib/x86_64-linux-gnu/libcudart.so.12\n"
        "COPY credentials /root/.aws/credentials\n"
        "COPY deploy_key /opt/dtc/deploy_key\n"
        "RUN chmod 0644 /etc/ssh/ssh_host_ed25519_key\n"
        "ENV WANDB_API_KEY=planted SAGEMAKER_SESSION_TOKEN=not-a-secret-of-the-image\n")
    planted = f"localhost/dtc-sanity-planted:{uuid.uuid4().hex[:8]}"
    built = subprocess.run(["podman", "build", "--pull=never", "--isolation", "chroot", "-q", "-t", planted,
                            "-f", str(context / "Containerfile"), str(context)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    try:
        done = image_sanity(planted, "cpu")
    finally:
        subprocess.run(["podman", "rmi", "-f", planted], capture_output=True)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    found = failed(done)
    weak = ("executable stack", "no RELRO", "no canary", "not fortified")
    assert found == {
        **{("hardening", f"{path} ({w})"): "1 of 1 ELF files" for w in weak
           for path in ("usr/local/lib/libplanted.so", "usr/lib/x86_64-linux-gnu/libcudart.so.12")},
        ("cuda", "usr/lib/x86_64-linux-gnu/libcudart.so.12"): "a CUDA library that no wheel bundles, in the CPU flavor",
        ("credentials", "root/.aws/credentials"): "a credential file",
        ("credentials", "opt/dtc/deploy_key"):
            "a private key that no package ships and docs/image.md does not document",
        ("credentials", "etc/ssh/ssh_host_ed25519_key"):
            "a documented key readable beyond root (mode 0644, uid 0; want 0600, root)",
        ("environment", "WANDB_API_KEY"): "a secret-looking variable with a value in the image's configuration",
    }, done.stdout[-4000:]
