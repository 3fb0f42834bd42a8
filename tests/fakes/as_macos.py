"""Run the exporter's command line as it runs on a Mac: ``python -m tests.fakes.as_macos``.

``sys.platform`` says ``darwin`` before anything of the exporter is imported, and
``pyudev`` cannot be imported (on macOS it is not installed: its requirement carries
``sys_platform == 'linux'``, and there is no libudev). Everything else is the code a
user runs; the tests put a fake ``macmon`` on PATH.

The standard library is not the subject here and cannot be fooled: modules that
choose by platform at import (``urllib.request`` wants macOS's ``_scproxy``) are
imported first, with the true platform.
"""

from __future__ import annotations

import sys
import urllib.request  # noqa: F401  # before the fake: it imports _scproxy on darwin

sys.platform = "darwin"
sys.modules["pyudev"] = None  # type: ignore[assignment]  # import pyudev -> ImportError

from exporter.app.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
