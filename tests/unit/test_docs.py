"""The committed docs hold no leftover placeholders and no links to files that are not there."""

import re
from pathlib import Path

import pytest

from tests.helpers import readme_sample_run

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


PROSE = [d for d in DOCS if "evidence" not in d.relative_to(ROOT).parts]
TOOL = re.compile(r"\b((?:scripts|bench)/\w+\.py)\b")


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_tool_a_prose_page_names_exists(doc):
    # Defect: scripts/bench_*.py were aliases kept "for one release" with no release; bench/ holds the tools
    assert [t for t in TOOL.findall(doc.read_text()) if not (ROOT / t).is_file()] == []


def test_the_placeholder_rule_catches_a_bare_name_and_not_prose():
    assert PLACEHOLDER.fullmatch("STUDY_RESULTS")
    assert not PLACEHOLDER.fullmatch("README")
    assert not PLACEHOLDER.fullmatch("See STUDY_RESULTS below.")


def test_every_tools_parser_takes_the_readmes_underscore_spelling_of_a_flag():
    """README, Conventions: `--max-new-tokens 9` and `--max_new_tokens=9` both work, in every tool of
    scripts/ (they all parse with OneLineParser), not only in sample.py."""
    from cli.schema_help import OneLineParser

    parser = OneLineParser()
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("prompt", nargs="?")
    assert parser.parse_args(["--cache_dir=a_b"]).cache_dir == "a_b"
    assert parser.parse_args(["--cache_dir", "x", "--force"]).force
    assert parser.parse_args(["--", "--cache_dir"]).prompt == "--cache_dir"  # after `--`: a word, as typed
    sub = OneLineParser().add_subparsers(dest="cmd")
    sub.add_parser("export").add_argument("--out-dir")
    assert sub._name_parser_map["export"].parse_args(["--out_dir=d"]).out_dir == "d"


def test_the_architecture_pages_layout_names_every_module_and_folder():
    """docs/architecture.md's Layout lists each code file of the core packages and each top-level folder."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    layout = re.search(r"## Layout: one line per file\n\n```\n(.*?)```", page, flags=re.DOTALL).group(1)
    words = set(re.findall(r"[\w.]+", layout))
    folders = [p.name for p in ROOT.iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or p.name == "configs"]
    folders += ["bench"]
    core = ("model", "data", "generation", "training", "rundir", "studies", "interop", "cli", "bench")
    modules = [p.name for d in core for p in (ROOT / d).glob("*.py")]
    tests = [p.name for p in (ROOT / "tests").glob("*.py") if p.name != "__init__.py"]
    scripts = [p.name for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("__")]
    missing = [f for f in folders if f"{f}/" not in layout]
    missing += [m for m in modules + tests + scripts if m != "__init__.py" and m not in words]
    assert missing == []


@pytest.mark.parametrize("label", ["plots:    ", "score:    "])
def test_the_readmes_closing_lines_are_what_a_run_prints(tmp_path, monkeypatch, label):
    """The README's sample of a run's last lines: its `plots:` and `score:` lines are those closing_lines writes."""
    from cli.continue_commands import closing_lines

    readme, run = (ROOT / "README.md").read_text().splitlines(), readme_sample_run()
    (tmp_path / run).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("cli.continue_commands.python_command", lambda: "python")  # as with the venv activated
    printed = [line for line in closing_lines(run, {}, []).splitlines() if line.startswith(f"  {label}")]
    shown = [line for line in readme if line.startswith(f"  {label}") and str(run) in line]
    assert shown == printed and printed
