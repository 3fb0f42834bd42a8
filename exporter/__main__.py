"""``python -m exporter``: the same as the ``gpu-exporter`` command."""

import sys

from exporter.app.early import hold_sighup


def run() -> int:
    """The ``gpu-exporter`` command: SIGHUP is held before the heavy imports."""
    hold_sighup()
    from exporter.app.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
