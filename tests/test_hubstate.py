"""A backend's down reason as a code (exporter.pipeline.hubstate.down_code), served as
gpu_exporter_backend_down_reason, and the log lines of its state changes: once each."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.core.labels import DownReason
from exporter.output.render.selfmetrics import exporter_families
from exporter.pipeline import hubstate
from exporter.pipeline.hubstate import down_code
from exporter.pipeline.state import BackendState, Snapshot
from tests.fakes.nvml_real import N

EXPORTER = Path(__file__).resolve().parent.parent / "exporter"


def nvml(code: int) -> str:
    """What the nvidia backend says when nvmlInit raises ``code`` (nvmlErrorString)."""
    return f"NVML could not start: {N.NVMLError(code)}"


@pytest.mark.parametrize(("reason", "code"), [
    ("not started", DownReason.NOT_STARTED),
    # nvidia
    (nvml(N.NVML_ERROR_DRIVER_NOT_LOADED), DownReason.DRIVER),
    (nvml(N.NVML_ERROR_LIB_RM_VERSION_MISMATCH), DownReason.DRIVER),
    (nvml(N.NVML_ERROR_LIBRARY_NOT_FOUND), DownReason.NOT_INSTALLED),
    (nvml(N.NVML_ERROR_NO_PERMISSION), DownReason.PERMISSION),
    (nvml(N.NVML_ERROR_UNKNOWN), DownReason.INIT_FAILED),
    ("nvidia-ml-py (pynvml) is not installed: No module named 'pynvml'",
     DownReason.NOT_INSTALLED),
    ("NVML found no usable NVIDIA GPU", DownReason.NO_DEVICE),
    ("failed: NVML went bad during nvmlDeviceGetPowerUsage: GPU is lost", DownReason.FAILED),
    # amd, amdsmi
    ("no amdgpu card under /sys/class/drm", DownReason.NO_DEVICE),
    ("amdsmi package not importable (No module named 'amdsmi'); install gpu-exporter[amd]",
     DownReason.NOT_INSTALLED),
    ("libamd_smi.so not loadable: libamd_smi.so: cannot open shared object file",
     DownReason.NOT_INSTALLED),
    ("amdsmi_init failed: Error code: 34 | AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
     DownReason.DRIVER),
    ("amdsmi_init failed: Error code: 10 | AMDSMI_STATUS_NO_PERM - Permission Denied",
     DownReason.PERMISSION),
    ("amdsmi found no AMD GPU", DownReason.NO_DEVICE),
    # intel, pmu, level zero
    ("no i915/xe card under /sys/class/drm", DownReason.NO_DEVICE),
    ("perf_event_open denied (EACCES): the i915/xe PMU needs CAP_PERFMON (or CAP_SYS_ADMIN, "
     "or kernel.perf_event_paranoid <= 0); engine utilisation comes from fdinfo sums instead",
     DownReason.PERMISSION),
    ("no i915/xe PMU under /sys/bus/event_source/devices", DownReason.UNSUPPORTED),
    ("no PMU events opened", DownReason.UNSUPPORTED),
    ("Level Zero loader libze_loader.so.1 not found: libze_loader.so.1: cannot open shared "
     "object file: No such file or directory", DownReason.NOT_INSTALLED),
    ("zesInit failed: ZE_RESULT_ERROR_UNINITIALIZED", DownReason.INIT_FAILED),
    ("Level Zero Sysman reports no device with a PCI address", DownReason.NO_DEVICE),
    # fdinfo
    ("no amdgpu, i915 or xe card under /sys/class/drm: no DRM usage stats to read",
     DownReason.NO_DEVICE),
    ("cannot list /proc: Permission denied", DownReason.PERMISSION),
    # apple, other platforms
    ("macmon not found (macmon): install it (brew install macmon) or set --macmon.path",
     DownReason.NOT_INSTALLED),
    ("cannot run /usr/local/bin/macmon: No such file or directory", DownReason.NOT_INSTALLED),
    ("/opt/homebrew/bin/macmon exited with status 1: no output", DownReason.INIT_FAILED),
    ("not on macOS (this is linux)", DownReason.UNSUPPORTED),
    # kubernetes: a socket that is absent, and one that stopped answering (BackendFailed)
    ("kubelet pod-resources socket /var/lib/kubelet/pod-resources/kubelet.sock not found",
     DownReason.UNREACHABLE),
    ("failed: /var/lib/kubelet/pod-resources/kubelet.sock: unavailable: connection refused",
     DownReason.UNREACHABLE),
    ("/var/lib/kubelet/pod-resources/kubelet.sock: timed out after 5s", DownReason.UNREACHABLE),
    # the Hub's own words
    ("sample raised KeyError('x')", DownReason.EXCEPTION),
    ("open failed: RuntimeError('boom')", DownReason.EXCEPTION),
    ("unavailable", DownReason.OTHER),
])
def test_each_backends_reason_maps_to_its_code(reason: str, code: DownReason) -> None:
    assert down_code(reason) is code


def _messages() -> list[tuple[str, str]]:
    """(file, message with every placeholder as "X") of each BackendUnavailable and
    BackendFailed raised in exporter/ with a message written there."""
    found = []
    for path in EXPORTER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("BackendUnavailable", "BackendFailed") and node.args):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                text = arg.value
            elif isinstance(arg, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X"
                               for v in arg.values)
            else:
                continue  # a message made elsewhere (a library's text, a kept reason)
            prefix = "failed: " if node.func.id == "BackendFailed" else ""
            found.append((path.name, prefix + text))
    return found


@pytest.mark.slow
def test_every_message_written_in_the_backends_has_a_code() -> None:
    """A new BackendUnavailable message that no pattern knows would be served as "other":
    each one written in exporter/ maps to a code (placeholders read as "X")."""
    messages = _messages()
    assert len(messages) >= 20
    # (A BackendFailed of the Hub is "failed: <message>": FAILED where no pattern says more.)
    assert [(f, m) for f, m in messages if down_code(m) is DownReason.OTHER] == []


def test_a_lost_kubelet_logs_its_loss_once() -> None:
    """The sample that finds the socket refusing and the reopen that finds it gone are one
    event (unreachable): one line, not two with different words."""
    state = hubstate.opened(BackendState("kubernetes"), 0, 0.0)
    with capture_logs() as logs:
        state = hubstate.down(state, "failed: /var/lib/kubelet/pod-resources/kubelet.sock: "
                              "unavailable: connection refused", "warning", failing=True)
        for _ in range(3):
            state = hubstate.down(state, "kubelet pod-resources socket "
                                  "/var/lib/kubelet/pod-resources/kubelet.sock not found", "info")
    assert [(e["event"], e["code"]) for e in logs] == [("backend down", "unreachable")]
    assert state.code is DownReason.UNREACHABLE and state.down_reason is DownReason.UNREACHABLE
    assert "not found" in state.reason  # /snapshot shows the latest words
    with capture_logs() as logs:
        state = hubstate.down(state, "cannot list /proc: Permission denied", "info")
    assert [e["code"] for e in logs] == ["permission"]  # a new cause is news


def test_the_same_failure_again_is_the_same_state() -> None:
    """A retry of a backend that cannot open (the PMU without events, every 10 s) changes
    nothing: the very same state comes back (no new snapshot, nothing logged); new
    words, or a failure after an open, are a new state."""
    state = hubstate.down(BackendState("pmu"), "no i915/xe PMU under /sys", "info")
    with capture_logs() as logs:
        assert hubstate.down(state, "no i915/xe PMU under /sys", "info") is state
    assert logs == []
    other = hubstate.down(state, "no i915/xe card under /sys/class/drm", "info")
    assert other is not state and other.code is DownReason.NO_DEVICE
    assert hubstate.down(state, "no i915/xe PMU under /sys", "info", failing=True).failing


def test_distinct_exceptions_each_log_their_traceback_once() -> None:
    state = BackendState("amd")
    with capture_logs() as logs:
        for reason in ("sample raised KeyError('a')", "sample raised KeyError('a')",
                       "sample raised KeyError('b')"):
            state = hubstate.down(state, reason, "error", failing=True)
    assert [e["reason"] for e in logs] == ["sample raised KeyError('a')",
                                          "sample raised KeyError('b')"]


def test_a_backend_that_adds_to_other_backends_gpus_logs_no_gpu_count() -> None:
    with capture_logs() as logs:
        hubstate.opened(BackendState("fdinfo"), 0, 0.0)
        hubstate.opened(BackendState("amd"), 2, 0.0)
    assert logs[0] == {"event": "backend up", "backend": "fdinfo", "log_level": "info"}
    assert logs[1]["gpus"] == 2


def _down_series(*states: BackendState) -> dict[str, str]:
    snap = Snapshot(generation=1, created=0.0, ready=True, backends=states, gpu_index={})
    (family,) = [m for m in exporter_families(snap, {})
                 if m.name == "gpu_exporter_backend_down_reason"]
    return {s.labels["backend"]: s.labels["reason"] for s in family.samples
            if s.value == 1}


def test_the_down_reason_is_served_for_each_backend_that_is_off_and_only_then() -> None:
    up = hubstate.opened(BackendState("nvidia"), 1, 0.0)
    stale = replace(hubstate.opened(BackendState("intel"), 1, 0.0), stale=True)
    down = hubstate.down(BackendState("amd"), "no amdgpu card under /sys/class/drm", "info")
    assert _down_series(up, stale, down, BackendState("pmu")) == {
        "intel": "stale", "amd": "no_device", "pmu": "not_started"}


def test_the_vocabulary_is_documented_where_the_family_is() -> None:
    doc = (EXPORTER.parent / "docs" / "troubleshooting.md").read_text()
    for code in DownReason:
        assert re.search(rf"\| `{code.value}` \|", doc), code



def test_the_nvml_messages_the_docs_quote_are_nvmls_own() -> None:
    """troubleshooting.md quotes what the log says: NVML's nvmlErrorString, word for word."""
    doc = (EXPORTER.parent / "docs" / "troubleshooting.md").read_text()
    quoted = re.findall(r"`NVML could not start: ([^`]+)`", doc)
    strings = {str(N.NVMLError(getattr(N, name))) for name in dir(N)
               if name.startswith("NVML_ERROR_") and isinstance(getattr(N, name), int)}
    assert "NVML Shared Library Not Found" in quoted
    assert set(quoted) <= strings
