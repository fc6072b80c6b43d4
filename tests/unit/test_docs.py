"""The documentation a user follows: every link resolves (file and heading), every ECR image it
shows carries a tag `make push` makes, and nothing points where a user of the repository cannot
follow (this project's issue tracker, files outside the repository)."""

import os
import re
from pathlib import Path

import pytest

from helpers import REPO, pins

DOCS = [REPO / "README.md", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
ECR_IMAGE = re.compile(r"amazonaws\.com/[\w./-]+:([\w.-]+)")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_to_a_file_and_heading(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links that go nowhere: {broken}"


def test_every_ecr_image_shown_has_a_tag_make_push_makes():
    pinned = pins()
    descriptive = {f"cpu-tf{pinned['TENSORFLOW_VERSION']}-pt{pinned['TORCH_VERSION']}-py{pinned['PYTHON_VERSION']}",
                   f"gpu-tf{pinned['TENSORFLOW_VERSION']}-pt{pinned['TORCH_GPU_VERSION']}-py{pinned['PYTHON_VERSION']}"
                   f"-cu{pinned['CUDA_RUNTIME_VERSION']}"}
    shown = {(doc.relative_to(REPO), tag) for doc in [*DOCS, *sorted((REPO / "examples").rglob("*.py"))]
             for tag in ECR_IMAGE.findall(doc.read_text())}
    assert shown, "no ECR image shown anywhere"
    wrong = [(str(doc), tag) for doc, tag in shown
             if tag not in descriptive and not re.fullmatch(r"(cpu|gpu)-(<git sha>|[0-9a-f]{12})", tag)]
    assert not wrong, f"tags make push never makes (scripts/release.sh): {wrong}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_points_outside_what_a_user_can_follow(doc):
    text = doc.read_text()
    assert "../shared" not in text and "shared/reference" not in text
    assert not re.search(r"\bissues? #\d+", text), "this project's issue numbers mean nothing to a user"


# Files named in text that are not in the repository, and why that is right: upstream files named
# with their project, and files the project writes when it runs.
NAMED_ELSEWHERE = {
    "PERFORMANCE.md": "NVIDIA/nccl-tests doc/PERFORMANCE.md, the busbw formula",
    "FORMAT_SPECIFICATION.md": "GrigoryEvko/nvopen-tools, the fatbin layout",
    "annotations.md": "opencontainers/image-spec annotations.md, the OCI annotation keys",
    "report.md": "written by bench/run.py --gpu",
    "summary.md": "written by the trainers into output/data/report/",
}
MARKDOWN_NAME = re.compile(r"(?<![\w$}{-])([\w-]+\.md)\b")


def test_every_markdown_file_named_in_docs_and_code_is_in_the_repository():
    """Docs, docstrings and comments cite the public source, never a note outside the repository.
    Left out for now: the GPU image's build inputs (scripts/gpu_inputs.py: docker/,
    tests/image/in_image), whose comments still name such notes; any edit there rebuilds both
    images and re-verifies the GPU flavor (about 35 minutes), so they are mended with their next
    real change."""
    skipped = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}
    files = []
    for folder, folders, names in os.walk(REPO):
        folders[:] = [f for f in folders if f not in skipped]
        files += [Path(folder) / name for name in names]
    in_repo = {p.name for p in files}
    left_out = ("docker/", "tests/image/in_image/", "tests/fixtures/")
    texts = [p for p in files if (p.suffix in (".md", ".py", ".sh", ".yml", ".toml") or p.name == "Makefile")
             and not str(p.relative_to(REPO)).startswith(left_out)]
    missing = sorted({(str(p.relative_to(REPO)), found) for p in texts for found in MARKDOWN_NAME.findall(p.read_text())
                      if found not in in_repo and found not in NAMED_ELSEWHERE})
    assert not missing, f"files named that are not in the repository (cite the public source instead): {missing}"


def test_every_variable_make_reads_is_in_the_environment_reference():
    """Each ``NAME ?= default`` of the Makefile has a row in docs/environment.md, as README says."""
    read = re.findall(r"^([A-Z][A-Z0-9_]*) \?=", (REPO / "Makefile").read_text(), re.MULTILINE)
    documented = (REPO / "docs" / "environment.md").read_text()
    missing = [name for name in read if f"`{name}`" not in documented]
    assert read and not missing, f"Makefile variables docs/environment.md lacks: {missing}"
