"""One health verdict per GPU, from the merged sample: the rules, the two families, the table.

Owns: ``gpu_health_status`` (0 healthy, 1 degraded, 2 failed: the worst check) and
``gpu_health_check_status`` per check of a small closed set (CHECKS), computed once per
snapshot (``Snapshot.health``) from what the backends already read, so every vendor gets
the same answer to "can this GPU take work?". The reason of a non-zero check goes to
``/snapshot`` and the landing page, never into a label (a reason is free text).

A check is served only where one of its rules can fire for that GPU (no NVLink, no
``interconnect``; no threshold and no thermal throttle reason, no ``thermal``): nothing
claims a GPU healthy on evidence that was never read. Every rule and its source is in
docs/health.md; the only number that is ours, not the vendor's, is the XID window
(``--health.xid-window``). Slices (MIG instances, partitions) get no
verdict of their own: their parent's is the one that matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from exporter.core.fieldspec import MetricSpec, Otlp
from exporter.core.labels import (
    Check,
    FindingCode,
    HealthStatus,
    RecoveryAction,
    Severity,
    Threshold,
    ThrottleReason,
)
from exporter.core.model import DeviceSample
from exporter.core.xid import meaning as xid_meaning

HEALTHY, DEGRADED, FAILED = 0, 1, 2
STATUS_NAMES = tuple(str(s) for s in HealthStatus)  # by gpu_health_status value
CHECKS = tuple(Check)
SOURCE = "health"  # the `source` of both families: a verdict over every source's values
DEFAULT_XID_WINDOW = 3600.0  # seconds an XID counts towards the verdict (--health.xid-window)

# What an XID says about the GPU, by NVIDIA's XID catalogue (docs.nvidia.com/deploy/
# xid-errors, "Analyzing Xid Errors with the Xid Catalog", Resolution Bucket): code ->
# (check, status). RESTART_APP codes that say nothing about the GPU (13, 31, 43, 45) are
# HEALTHY so that an application fault never degrades a GPU; RESET_GPU / RESTART_BM
# codes fail it; codes the catalogue sends to investigation (63 row-remap recorded, 92
# high SBE rate, 94 a contained ECC error) degrade it. A code not listed here degrades it
# (look). The reason says what the code means (exporter.core.xid: its
# catalogue meaning, or "unknown").
XIDS: Mapping[int, tuple[Check, int]] = {
    13: (Check.XID, HEALTHY), 31: (Check.XID, HEALTHY), 43: (Check.XID, HEALTHY),
    45: (Check.XID, HEALTHY),
    48: (Check.MEMORY, FAILED), 61: (Check.XID, FAILED), 62: (Check.XID, FAILED),
    63: (Check.MEMORY, DEGRADED), 64: (Check.MEMORY, FAILED),
    74: (Check.INTERCONNECT, FAILED), 79: (Check.PCIE, FAILED),
    92: (Check.MEMORY, DEGRADED), 94: (Check.MEMORY, DEGRADED), 95: (Check.MEMORY, FAILED),
    119: (Check.XID, FAILED), 120: (Check.XID, FAILED), 140: (Check.MEMORY, FAILED),
}
# XID 154 says that the recovery action below changed (NVIDIA's XID catalogue, "Xid 154
# linkage"): where the driver's field is read, the action is the finding and the XID that
# announced it is none; without the field it is an unclassified XID (degraded: look).
XID_RECOVERY_CHANGED = 154
# nvml.h nvmlDeviceGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as the
# backend names it: what the driver says must happen before the GPU is usable again.
RECOVERY_ACTIONS: Mapping[str, int] = {
    RecoveryAction.NONE: HEALTHY, RecoveryAction.DRAIN_P2P: DEGRADED,
    RecoveryAction.RECOVER_IMEX_DOMAIN: DEGRADED, RecoveryAction.GPU_RESET: FAILED,
    RecoveryAction.NODE_REBOOT: FAILED, RecoveryAction.DRAIN_AND_RESET: FAILED,
    RecoveryAction.BUS_RESET: FAILED, RecoveryAction.SYSTEM_REBOOT: FAILED,
}
# The NVSwitch fabric (nvmlDeviceGetGpuFabricInfoV; nvml.h nvmlGpuFabricState_t,
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*): until the fabric manager has registered the GPU
# (state NOT_STARTED 1, IN_PROGRESS 2) CUDA refuses NVLink peer-to-peer through the
# NVSwitches, which is what the registration is for; it happens once, when the fabric
# manager starts at boot, so it degrades (GpuFabricNotReady fires when it lasts); a registration
# that COMPLETED (3) with an error status fails the GPU: it will not come up without the
# fabric manager being fixed and the GPU reset. The v3 summary: UNHEALTHY fails,
# LIMITED_CAPACITY degrades.
FABRIC_PENDING = {1: "not started", 2: "in progress"}
FABRIC_COMPLETED = 3
FABRIC_SUMMARY: Mapping[int, tuple[int, str]] = {
    2: (FAILED, "unhealthy"), 3: (DEGRADED, "limited capacity")}
# nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*: (shift, width) of each field of healthMask and the
# words of the values that degrade the GPU (1 is TRUE for the two-bit fields; the
# configuration field's values from 2 up name what is wrong).
FABRIC_MASK_TRUE: Mapping[str, int] = {  # field -> shift; width 0x3, TRUE = 1
    "bandwidth degraded": 0, "route recovery in progress": 2, "route unhealthy": 4,
    "access timeout recovery in progress": 6}
FABRIC_CONFIG_SHIFT, FABRIC_CONFIG_WIDTH = 8, 0xF
FABRIC_CONFIG: Mapping[int, str] = {
    2: "incorrect system GUID", 3: "incorrect chassis serial number", 4: "no partition",
    5: "insufficient NVLinks", 6: "incompatible GPU firmware", 7: "invalid location",
    8: "GPU state invalid"}
# Each sensor's own thresholds (DeviceSample.temperature_limits_celsius) -> the status when
# that sensor reaches it: hwmon's crit is where the firmware starts to slow the GPU down,
# emergency where it shuts down (Documentation/hwmon/sysfs-interface.rst, amdgpu's
# thermal.rst); NVML's slowdown and shutdown of the GPU sensor, and the memory's maximum
# operating temperature (where the GPU throttles for its memory). NVML's max_operating
# (the most an operator may set) is no finding.
LIMIT_STATUS: Mapping[str, int] = {
    Threshold.CRITICAL: DEGRADED, Threshold.SHUTDOWN: FAILED, Threshold.SLOWDOWN: DEGRADED,
    Threshold.MEMORY_MAX_OPERATING: DEGRADED}
# throttle reason (docs/metrics.md) -> check; sw_power_cap is the power limit doing its job.
THROTTLES: Mapping[str, Check] = {
    ThrottleReason.HW_THERMAL: Check.THERMAL, ThrottleReason.SW_THERMAL: Check.THERMAL,
    ThrottleReason.HW_SLOWDOWN: Check.POWER, ThrottleReason.HW_POWER_BRAKE: Check.POWER}
# RAS block -> (check, status) of its uncorrected errors; None: not about the GPU's health.
# Blocks not listed (AMD umc, gfx, sdma, ...; NVML's memory locations) are memory (ECC or
# parity of DRAM and SRAM). Level Zero's zes_ras_error_cat_t: engine resets the driver had
# to do degrade; driver, compute and fixed-function hardware errors fail the device; cache
# errors are memory; programming (application) and display errors are no finding.
RAS_BLOCKS: Mapping[str, tuple[Check, int] | None] = {
    "xgmi_wafl": (Check.INTERCONNECT, FAILED), "pcie_bif": (Check.PCIE, FAILED),
    "reset": (Check.DRIVER, DEGRADED), "driver": (Check.DRIVER, FAILED),
    "compute": (Check.DRIVER, FAILED), "non_compute": (Check.DRIVER, FAILED),
    "cache": (Check.MEMORY, FAILED), "programming": None, "display": None,
}
MEMORY_RAS = (Check.MEMORY, FAILED)
THROTTLE_CODES = {Check.THERMAL: FindingCode.THROTTLE_THERMAL,
                  Check.POWER: FindingCode.THROTTLE_POWER}


@dataclass(frozen=True)
class Finding:
    check: Check
    status: int
    reason: str  # for people: /snapshot and the landing page
    code: FindingCode  # for programs: what kind (dcgm mode maps it to a DCGM_FR_* code)


@dataclass(frozen=True)
class Verdict:
    status: int
    checks: Mapping[Check, int]  # every check this GPU has inputs for -> its status
    findings: tuple[Finding, ...] = ()  # the reasons of the non-zero checks

    def as_dict(self) -> dict[str, object]:
        """What /snapshot shows: the status by name, each check, and the reasons."""
        return {"status": STATUS_NAMES[self.status], "checks": dict(self.checks),
                "reasons": [{"check": f.check, "status": STATUS_NAMES[f.status],
                             "reason": f.reason, "code": f.code} for f in self.findings]}


def _xid(d: DeviceSample, now: float, window: float) -> Iterable[Finding]:
    for code, count in sorted(d.xid_errors.items()):
        seen = d.xid_seen_seconds.get(code)
        if count <= 0 or seen is None or now - seen > window:
            continue
        if code == XID_RECOVERY_CHANGED and d.recovery_action is not None:
            continue  # the action itself is read: it, not its change, is the finding
        check, status = XIDS.get(code, (Check.XID, DEGRADED))
        if status:
            yield Finding(check, status, f"XID {code}: {xid_meaning(code)}", FindingCode.XID)


def _memory(d: DeviceSample) -> Iterable[Finding]:
    if d.remap_failed:
        yield Finding(Check.MEMORY, FAILED, "row remapping failed: no spare rows left",
                      FindingCode.ROW_REMAP_FAILURE)
    if d.remap_pending:
        yield Finding(Check.MEMORY, DEGRADED, "row remap pending: reset the GPU to apply it",
                      FindingCode.ROW_REMAP_PENDING)
    if d.retired_pages_pending:
        yield Finding(Check.MEMORY, DEGRADED,
                      "page retirement pending: reset the GPU to apply it",
                      FindingCode.PAGE_RETIREMENT_PENDING)
    uncorrected = d.ecc_errors.get(Severity.UNCORRECTED, 0)
    if uncorrected > 0:
        yield Finding(Check.MEMORY, FAILED,
                      f"{uncorrected} uncorrected ECC errors since driver load",
                      FindingCode.ECC_UNCORRECTED)
    for (block, severity), n in sorted(d.ras_errors.items()):
        rule = RAS_BLOCKS.get(block, MEMORY_RAS)
        if rule is not None and severity == Severity.UNCORRECTED and n > 0:
            yield Finding(rule[0], rule[1], f"{n} uncorrected RAS errors in {block}",
                          FindingCode.ECC_UNCORRECTED if rule[0] == Check.MEMORY
                          else FindingCode.RAS_UNCORRECTED)


def _limits(d: DeviceSample) -> Iterable[tuple[str, str, float, int]]:
    """(sensor, threshold, °C, status when reached) of every sensor that has a reading and
    a threshold of its own with a rule."""
    for (sensor, threshold), limit in sorted(d.temperature_limits_celsius.items()):
        status = LIMIT_STATUS.get(threshold)
        if status is not None and sensor in d.temperatures_celsius:
            yield sensor, threshold, limit, status


def _thermal(d: DeviceSample) -> Iterable[Finding]:
    for sensor, threshold, limit, status in _limits(d):
        value = d.temperatures_celsius.get(sensor)
        if value is not None and value >= limit:
            yield Finding(Check.THERMAL, status,
                          f"{sensor} {value:g} °C at or above its {threshold} {limit:g} °C",
                          FindingCode.TEMPERATURE)
    for reason, active in sorted(d.throttle_reasons.items()):
        check = THROTTLES.get(reason)
        if active and check:
            yield Finding(check, DEGRADED, f"clocks held back: {reason}",
                          THROTTLE_CODES[check])


def _interconnect(d: DeviceSample) -> Iterable[Finding]:
    # The backends report a link once it has been up, so a link that reads down was up.
    down = sorted(link for (link, _remote), up in d.nvlink_up.items() if not up)
    if down:
        yield Finding(Check.INTERCONNECT, DEGRADED,
                      f"links down that were up: {', '.join(down)}", FindingCode.NVLINK_DOWN)


def _fabric(d: DeviceSample) -> Iterable[Finding]:
    state = d.fabric_state
    if state in FABRIC_PENDING:
        yield Finding(Check.INTERCONNECT, DEGRADED,
                      f"NVSwitch fabric registration {FABRIC_PENDING[state]}: no NVLink "
                      "peer-to-peer until it completes", FindingCode.FABRIC)
    if state == FABRIC_COMPLETED and d.fabric_status:
        yield Finding(Check.INTERCONNECT, FAILED,
                      f"NVSwitch fabric registration failed (NVML error {d.fabric_status}): "
                      "no NVLink peer-to-peer", FindingCode.FABRIC)
    if (summary := FABRIC_SUMMARY.get(d.fabric_health_summary or 0)) is not None:
        yield Finding(Check.INTERCONNECT, summary[0], f"fabric health {summary[1]}",
                      FindingCode.FABRIC)
    mask = d.fabric_health_mask or 0
    for what, shift in FABRIC_MASK_TRUE.items():
        if mask >> shift & 0x3 == 1:
            yield Finding(Check.INTERCONNECT, DEGRADED, f"fabric {what}", FindingCode.FABRIC)
    config = FABRIC_CONFIG.get(mask >> FABRIC_CONFIG_SHIFT & FABRIC_CONFIG_WIDTH)
    if config is not None:
        yield Finding(Check.INTERCONNECT, DEGRADED, f"fabric configuration: {config}",
                      FindingCode.FABRIC)


def _recovery(d: DeviceSample) -> Iterable[Finding]:
    action = d.recovery_action
    status = RECOVERY_ACTIONS.get(action or RecoveryAction.NONE, DEGRADED)
    if status:
        yield Finding(Check.DRIVER, status, f"driver asks for recovery action {action}",
                      FindingCode.RECOVERY_ACTION)


def _inputs(d: DeviceSample) -> set[Check]:
    """The checks that have a rule that can fire for this GPU."""
    ras = {rule[0] for block, _ in d.ras_errors
           if (rule := RAS_BLOCKS.get(block, MEMORY_RAS)) is not None}
    have = {Check.DRIVER} | ras
    # A check is served where one of its rules can fire: a temperature with a threshold of
    # its own, a thermal throttle reason the source reports; the PCIe link's width is no
    # rule (a narrower link is no finding), XID 79 and pcie_bif RAS errors are.
    if next(iter(_limits(d)), None) is not None or any(
            THROTTLES.get(r) == Check.THERMAL for r in d.throttle_reasons):
        have.add(Check.THERMAL)
    if d.ecc_errors or d.remapped_rows or d.remap_failed is not None or d.retired_pages:
        have.add(Check.MEMORY)
    if d.xid_last is not None:  # registered for XID events
        have.add(Check.XID)
    if d.nvlink_up or d.fabric_state is not None:
        have.add(Check.INTERCONNECT)
    if any(THROTTLES.get(r) == Check.POWER for r in d.throttle_reasons):
        have.add(Check.POWER)
    if d.xid_last is not None:
        have.add(Check.PCIE)
    return have


def evaluate(d: DeviceSample, now: float, xid_window: float = DEFAULT_XID_WINDOW) -> Verdict:
    """The verdict of one merged, whole-GPU sample at wall-clock time ``now``."""
    if not d.up:
        finding = Finding(Check.DRIVER, FAILED,
                          "GPU cannot be read: lost, fallen off the bus, or its driver stopped "
                          "answering", FindingCode.GPU_UNREADABLE)
        return Verdict(FAILED, {Check.DRIVER: FAILED}, (finding,))
    findings = [*_xid(d, now, xid_window), *_memory(d), *_thermal(d), *_interconnect(d),
                *_fabric(d), *_recovery(d)]
    present = _inputs(d) | {f.check for f in findings}
    checks = [c for c in CHECKS if c in present]
    status = {c: max((f.status for f in findings if f.check == c), default=HEALTHY)
              for c in checks}
    return Verdict(max(status.values()), status, tuple(findings))


def verdicts(devices: Sequence[tuple[str, DeviceSample]], now: float,
             xid_window: float = DEFAULT_XID_WINDOW) -> tuple[tuple[str, DeviceSample, Verdict],
                                                              ...]:
    """(gpu, sample, verdict) of every whole GPU of a snapshot; slices have none."""
    return tuple((gpu, d, evaluate(d, now, xid_window)) for gpu, d in devices
                 if not d.info.parent_key)


STATUS = MetricSpec("gpu_health_status",
                    "Health verdict of the GPU: 0 healthy, 1 degraded, 2 failed (the worst check).",
                    note="Source `health`; the reasons are in `/snapshot` and on `/` "
                    "(see health.md).",
                    otlp=Otlp("gpu.health.status", "{state}"))
CHECK = MetricSpec("gpu_health_check_status",
                   "One health check of the GPU: 0 healthy, 1 degraded, 2 failed.",
                   labels=("check",), note="`check` is " + ", ".join(f"`{c}`" for c in CHECKS)
                   + "; a check is served where one of its rules can fire for the GPU.",
                   otlp=Otlp("gpu.health.check.status", "{state}"))
LABELS = ("gpu", "uuid", "vendor", "source")


def series(entries: Iterable[tuple[str, DeviceSample, Verdict]]
           ) -> Iterator[tuple[MetricSpec, dict[str, str], float]]:
    """(STATUS or CHECK, labels, value) of each series of a snapshot's verdicts: what the
    exposition's families (exporter.output.render.families) and the OTLP points
    (exporter.output.otlp) are made of."""
    for gpu, d, verdict in entries:
        labels = dict(zip(LABELS, (gpu, d.info.uuid, d.info.vendor, SOURCE), strict=True))
        yield STATUS, labels, verdict.status
        for check, value in verdict.checks.items():
            yield CHECK, {**labels, CHECK.labels[0]: check}, value

