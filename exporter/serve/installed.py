"""The package's files as this process found them at start, for the code a request
imports on first use (the live page, its script and style, the /snapshot JSON:
exporter.serve.server keeps them out of a daemon whose page nobody opens).

An upgrade under a running daemon (``pip install -U``, a package manager, a reinstall
of the checkout) replaces those files before the service is restarted. Importing them
then mixes two versions in one process: a module moved or gone, a name renamed, a
500 on every request. So a first import happens only while the package's files are
still the ones this process started from; otherwise the request gets one clear answer
(``PackageChanged``: restart the exporter) and the log one line. What is already
imported keeps working: /metrics and the probes do not depend on the files.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import structlog

import exporter

log = structlog.get_logger(__name__)

PACKAGE = Path(exporter.__file__).resolve().parent

RESTART = ("gpu-exporter: the installed package changed under this running process (an "
           "upgrade or reinstall); this page's code would be another version's. Restart "
           "the exporter (for example: systemctl restart gpu-exporter). /metrics is still "
           "served.\n")

Fingerprint = frozenset[tuple[str, int, int]]


class PackageChanged(Exception):
    """The package's files are no longer the ones this process started from."""


def fingerprint(root: Path) -> Fingerprint:
    """Every file of the package (not the interpreter's ``__pycache__``, which an import
    writes): its path, modification time and size. pip writes every file it installs,
    so an upgrade or reinstall changes at least the times."""
    out = set()
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        for name in names:
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:  # removed while walking: changed
                continue
            out.add((os.path.relpath(path, root), st.st_mtime_ns, st.st_size))
    return frozenset(out)


class Installed:
    """The package as this process started with it; ``load`` imports from it while the
    files are still those."""

    def __init__(self, root: Path = PACKAGE) -> None:
        self.root = root
        self._started = fingerprint(root)
        self._said = threading.Event()  # the log line, once

    def load(self, name: str) -> ModuleType:
        """Module ``name``, imported now if this process has not yet: ``PackageChanged``
        where the package's files changed since start."""
        module = sys.modules.get(name)
        if module is not None:
            return module
        if fingerprint(self.root) != self._started:
            if not self._said.is_set():
                self._said.set()
                log.error("the installed package changed under this process: restart it",
                          package=str(self.root), needed=name)
            raise PackageChanged(name)
        return importlib.import_module(name)
