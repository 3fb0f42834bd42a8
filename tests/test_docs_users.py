"""User docs speak to users: no team words, no paths outside the repository.

README.md, CHANGELOG.md and docs/ are read by people who install the exporter; they
have no shared team folder, no notes file, no lent machine and no issue tracker
numbering of ours. The test names the file, line and word. Tests and benchmarks may
not read outside the repository either (CI and users have only the checkout).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEAM_WORDS = re.compile(
    r"\.\./shared|/work/|(?-i:MEASURED\.md|METRICS\.md|DESIGN\.md|STYLE\.md)"
    r"|\bthe lent\b|\blent (machine|device|H100|H200)"
    r"|\blanding\b(?!\s+page)"  # "this landing", "previous landing"; the landing page is a page
    r"|\bissues? #?\d+",
    re.IGNORECASE)
CODE = [*sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "bench").rglob("*.py"))]
# Reading a path outside the checkout: the repository's parent, or the team folder.
OUTSIDE = re.compile(r"""\.parent\s*/\s*["']shared["']|["']\.\./shared|["']/work/shared""")
# Naming the team folder at all (a docstring, a comment, a fixture note, a builder default).
SHARED_PATH = re.compile(rb"(?:\.\.|/work)/shared\b")
TREES = [ROOT / name for name in ("exporter", "tests", "bench", "docs")]


def team_words(text: str) -> list[str]:
    """``line: 'word'`` for each team word (matched across line breaks)."""
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in TEAM_WORDS.finditer(text)]


def test_user_docs_have_no_team_words() -> None:
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in USER_DOCS
             for hit in team_words(path.read_text())]
    assert found == []


def test_tests_and_benchmarks_read_nothing_outside_the_repository() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}" for path in CODE
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if OUTSIDE.search(line) and path.name != Path(__file__).name]
    assert found == []


def files_under(top: Path) -> list[Path]:
    """Every regular file (not a symlink: fixture trees link back up) but caches."""
    return [Path(d) / name for d, dirs, names in os.walk(top)
            if "__pycache__" not in Path(d).parts for name in names
            if not (Path(d) / name).is_symlink()]


def test_no_file_names_the_team_folder() -> None:
    """The captures a fixture builder reads are in tests/fixtures/captures; anything
    else cites its public source. Users and CI have only the checkout."""
    files = [p for top in TREES for p in files_under(top) if p.name != Path(__file__).name]
    assert len(files) > 1000  # the fixture trees are walked too
    found = [f"{path.relative_to(ROOT)}:{n}" for path in files
             for n, line in enumerate(path.read_bytes().splitlines(), 1)
             if SHARED_PATH.search(line)]
    assert found == []


def test_the_checks_can_fail() -> None:
    sample = ("Measured on the lent H100 (issue 13; this landing), see ../shared/fixtures "
              "and MEASURED.md.\nOpen the landing page.")
    assert [hit.split(": ", 1)[1] for hit in team_words(sample)] == [
        "'the lent'", "'issue 13'", "'landing'", "'../shared'", "'MEASURED.md'"]
    assert OUTSIDE.search('METRICS = ROOT.parent / "shared" / "METRICS.md"')
    assert not OUTSIDE.search('ROOT / "docs" / "metrics.md"')
    hits = [bool(SHARED_PATH.search(text)) for text in (
        b"samples in ../shared/fixtures/fdinfo", b'Path("/work/shared/fixtures")',
        b"drm-shared-vram:\t0 KiB", b"gpu_shared_memory_used_bytes", b"../shared_memory")]
    assert hits == [True, True, False, False, False]
