"""ARCHITECTURE.md holds to the code: every file it names exists, and the rows its recipe
and its end-to-end example show are rows of the table they say (the plain NVML scalars,
exporter.sources.nvidia.scalars), so a rename or a changed recipe fails here."""

from __future__ import annotations

import os
import re
from pathlib import Path

from exporter.sources.nvidia import scalars

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "ARCHITECTURE.md").read_text()


def test_every_file_it_names_exists() -> None:
    files = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in {".venv", ".git", "fixtures", "golden"}]
        files += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|js|yml|yaml|toml))`", TEXT))
    assert named
    missing = [n for n in sorted(named)
               if not any(f == n or f.endswith("/" + n.removeprefix("./")) for f in files)]
    assert missing == []


def test_the_rows_it_shows_are_rows_of_the_scalar_table() -> None:
    shown = re.findall(r"`(Scalar\([^`]*\))`", TEXT.replace("\n   ", " "))
    assert len(shown) >= 2  # the recipe's and the power example's
    names = {"Scalar": scalars.Scalar, "Tier": scalars.Tier}
    for text in shown:
        assert eval(text, names) in scalars.SCALARS, text  # noqa: S307 - our own doc
