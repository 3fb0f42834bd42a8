"""Rewrite every generated file after a change to what is served, in the order they
depend on each other: the goldens (``UPDATE_GOLDEN=1 pytest -m golden``: tests/golden,
the dcgm goldens), then the docs generated from the catalogue and the goldens
(``tools.metricsdoc``: docs/metrics.md, docs/otlp.md's table, docs/coverage.md,
docs/cardinality.md), then the README's flag tables (``tools.flagsdoc``).

    python -m tests.regenerate

Exits non-zero when a step fails; prints what changed (``git status``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = (
    ("goldens", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                 "golden"], {"UPDATE_GOLDEN": "1"}),
    ("generated docs", [sys.executable, "-m", "tools.metricsdoc"], {}),
    ("README flag tables", [sys.executable, "-m", "tools.flagsdoc"], {}),
)


def main() -> int:
    for name, cmd, env in STEPS:
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env})
        if done.returncode != 0:
            print(f"regenerate: {name} failed ({done.returncode})", file=sys.stderr)
            return done.returncode
    subprocess.run(["git", "status", "--short", "--", "tests/golden", "docs", "README.md"],
                   cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
