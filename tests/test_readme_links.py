"""The README stands alone: its links stay inside the repository and its anchors exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_no_reference_outside_the_repository():
    assert "../" not in TEXT and "shared/DESIGN.md" not in TEXT


def test_links_point_into_the_repository_or_to_its_headings():
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", TEXT, re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", TEXT):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            assert target[1:] in anchors, f"the README links to #{target[1:]}, which no heading has"
        else:
            assert (ROOT / target.split("#")[0]).exists(), f"the README links to {target}, not in the repository"


def test_it_explains_the_design_and_a_cpu_only_torch():
    assert "## How gdask works" in TEXT
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in TEXT
