"""The committed docs hold no leftover placeholders and no links to files that are not there."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")  # a line that is only a name like STUDY_RESULTS


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_doc_has_no_placeholder_line(doc):
    lines = [line.strip() for line in doc.read_text().splitlines()]
    assert not [line for line in lines if PLACEHOLDER.fullmatch(line)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_docs_relative_links_name_files_that_exist(doc):
    targets = [t for t in LINK.findall(doc.read_text()) if "://" not in t and not t.startswith("mailto:")]
    assert [t for t in targets if not (doc.parent / t).exists()] == []


def test_the_placeholder_rule_catches_a_bare_name_and_not_prose():
    assert PLACEHOLDER.fullmatch("STUDY_RESULTS")
    assert not PLACEHOLDER.fullmatch("README")
    assert not PLACEHOLDER.fullmatch("See STUDY_RESULTS below.")
