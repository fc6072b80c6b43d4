"""The documentation a user follows: every link resolves (file and heading), every ECR image it
shows carries a tag `make push` makes, and nothing points where a user of the repository cannot
follow (this project's issue tracker, files outside the repository)."""

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
