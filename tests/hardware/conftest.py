"""Mark everything here ``hardware`` and ``slow`` (each test reads a real GPU, most start
nvidia-smi or the exporter) and skip it without a real NVIDIA GPU and nvidia-smi."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _nvidia_gpu_reason() -> str | None:
    """None when NVML answers for at least one GPU and nvidia-smi is on PATH."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (pynvml) not installed"
    if getattr(pynvml, "__fake_shim__", False):
        return "pynvml is the test shim"
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        return f"NVML unavailable: {e}"
    return None if count > 0 else "NVML sees no GPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if HERE in Path(str(i.fspath)).resolve().parents]
    if not mine:
        return
    reason = _nvidia_gpu_reason()
    for item in mine:
        item.add_marker(pytest.mark.hardware)
        item.add_marker(pytest.mark.slow)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
