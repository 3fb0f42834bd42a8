"""``python -m exporter``: the same as the ``gpu-exporter`` command."""

import sys

from exporter.cli import main

sys.exit(main())
