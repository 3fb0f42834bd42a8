"""The container image, built once per test run and shared (``built_image``, a session
fixture that tests/conftest.py registers): tests/image/build-image.sh builds the
Dockerfile with podman (about 60 s: a fresh storage each run) and runs the image's own
checks (``--version``, a snapshot of a fixture sysfs, its HEALTHCHECK), whose output
tests/test_deploy_image.py reads; tests/test_deploy_pod_journey.py runs the same image the
way a kubelet would.

Everything podman makes lives in a storage of the run's own (``Store``: ``--root``,
``--runroot`` and libpod's state under a temporary directory, deleted when the run ends),
under names in ``localhost/gpu-exporter-test/``: the machine's default storage
(/var/lib/containers) and its image list are never read or written, nothing is pruned,
no other name is tagged (tests/test_readme_journey.py checks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import free_port

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "amd-rdna3-rx7800xt"  # the snapshot the build runs
NAMES = "localhost/gpu-exporter-test/"  # every name the image tests give
STANDIN = NAMES + "python:3.11-slim-bookworm"  # the Dockerfile's base (build-image.sh)


@dataclass(frozen=True)
class Store:
    """A podman storage of the test run's own under ``path``; ``podman`` is the command
    line that uses it (explicit flags: a command can never fall back to the default)."""

    path: Path

    @property
    def podman(self) -> list[str]:
        return ["podman", "--root", str(self.path / "storage"), "--runroot",
                str(self.path / "run"), "--tmpdir", str(self.path / "libpod"),
                "--events-backend", "none"]

    def remove(self) -> None:
        """Every container, then the directory. A mount left under it (a build-image.sh
        that was killed before its trap ran) is taken off first, so that no file of the
        tree mounted there is deleted; one that will not come off keeps the directory."""
        subprocess.run([*self.podman, "rm", "-af"], capture_output=True, timeout=300)
        prefix = str(self.path) + "/"
        for target in reversed([line.split()[4] for line in
                                Path("/proc/self/mountinfo").read_text().splitlines()]):
            if target.startswith(prefix):
                subprocess.run(["umount", "-l", target], capture_output=True, timeout=60)
        if any(line.split()[4].startswith(prefix)
               for line in Path("/proc/self/mountinfo").read_text().splitlines()):
            raise AssertionError(f"mounts left under {self.path}: not deleted")
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    id: str  # what the tests run: the tag may move (another build of the same tag)
    output: str  # build-image.sh's standard output
    config: dict[str, Any]  # podman image inspect's .Config
    seconds: float
    store: Store  # where it is: run podman as store.podman


def build_image(store: Store, tag: str = NAMES + "gpu-exporter:test") -> BuiltImage:
    if os.geteuid() != 0:
        pytest.skip("podman with chroot isolation needs root")
    missing = [t for t in ("podman", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{' and '.join(missing)} missing: .ci/run installs them")
        pytest.skip(f"{' and '.join(missing)} not installed (.ci/run installs them)")
    iidfile = store.path / "iid"
    started = time.monotonic()
    out = subprocess.run(["bash", "tests/image/build-image.sh", tag], cwd=ROOT,
                         env={**os.environ, "SYSFS": str(FIXTURE / "sys"), "STORE": str(store.path),
                              "PORT": str(free_port()), "IIDFILE": str(iidfile)},
                         capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    if out.returncode != 0:
        # Inside a container (a fresh Debian container running .ci/run) podman itself may
        # not run, or not store a layer (it remounts /): then even the stand-in base image
        # could not be made, before our Dockerfile was reached. That is the environment,
        # not the Dockerfile; any failure after the base image exists fails the test.
        info = subprocess.run([*store.podman, "info"], capture_output=True, text=True,
                              timeout=120)
        base = subprocess.run([*store.podman, "image", "exists", STANDIN],
                              capture_output=True, timeout=120)
        if info.returncode != 0 or base.returncode != 0:
            pytest.skip(f"podman cannot build here: {out.stderr.strip()[-300:]}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    image_id = iidfile.read_text().strip()
    inspect = subprocess.run([*store.podman, "image", "inspect", image_id],
                             capture_output=True, text=True, timeout=120, check=True)
    # Nothing of the build reached the machine's default storage.
    default = subprocess.run(["podman", "images", "-a", "--no-trunc", "--format",
                              "{{.ID}} {{.Repository}}"], capture_output=True, text=True,
                             timeout=120)
    assert image_id not in default.stdout and NAMES not in default.stdout, default.stdout
    return BuiltImage(tag, image_id, out.stdout, json.loads(inspect.stdout)[0]["Config"],
                      seconds, store)


@pytest.fixture(scope="session")
def built_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltImage]:
    store = Store(tmp_path_factory.mktemp("podman"))
    try:
        yield build_image(store)
    finally:
        store.remove()
