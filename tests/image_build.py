"""The container image, built once per test run and shared (``built_image``, a session
fixture that tests/conftest.py registers): tests/image/build-image.sh builds the
Dockerfile with podman (about 30 s with the base cached, 90 s on a fresh machine) and runs
the image's own checks (``--version``, a snapshot of a fixture sysfs, its HEALTHCHECK),
whose output tests/test_deploy_image.py reads; tests/test_deploy_pod_journey.py runs the
same image the way a kubelet would."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import free_port

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "amd-rdna3-rx7800xt"  # the snapshot the build runs
BASE = "docker.io/library/python:3.11-slim-bookworm"


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    id: str  # what the tests run: the tag may move (another build of the same tag)
    output: str  # build-image.sh's standard output
    config: dict[str, Any]  # podman image inspect's .Config
    seconds: float


def build_image(tmp: Path, tag: str = "gpu-exporter:test") -> BuiltImage:
    if os.geteuid() != 0:
        pytest.skip("podman with chroot isolation needs root")
    iidfile = tmp / "iid"
    started = time.monotonic()
    out = subprocess.run(["bash", "tests/image/build-image.sh", tag], cwd=ROOT,
                         env={**os.environ, "SYSFS": str(FIXTURE / "sys"),
                              "PORT": str(free_port()), "IIDFILE": str(iidfile)},
                         capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    # Old builds left dangling by the re-tag; the last hour's stay as the layer cache.
    subprocess.run(["podman", "image", "prune", "-f", "--filter", "until=1h"],
                   capture_output=True, timeout=120)
    if out.returncode != 0:
        # Inside a container (a fresh Debian container running .ci/run) podman itself may
        # not run, or not store a layer (it remounts /): then even the stand-in base image
        # could not be made, before our Dockerfile was reached. That is the environment,
        # not the Dockerfile; any failure after the base image exists fails the test.
        info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=120)
        base = subprocess.run(["podman", "image", "exists", BASE], capture_output=True,
                              timeout=120)
        if info.returncode != 0 or base.returncode != 0:
            pytest.skip(f"podman cannot build here: {out.stderr.strip()[-300:]}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    image_id = iidfile.read_text().strip()
    inspect = subprocess.run(["podman", "image", "inspect", image_id], capture_output=True,
                             text=True, timeout=120, check=True)
    return BuiltImage(tag, image_id, out.stdout, json.loads(inspect.stdout)[0]["Config"],
                      seconds)


@pytest.fixture(scope="session")
def built_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    return build_image(tmp_path_factory.mktemp("image"))
