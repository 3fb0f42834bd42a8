"""NVIDIA's plain scalar reads, as data: one row per value, read by one loop per tier.

A plain scalar is one NVML getter of the device handle, with no argument, that answers
one number (or a tuple of which one element is the value): the row names the
``DeviceValues`` field it fills (``ValueField``: a misspelt field is a type error), the
getter (named here and nowhere else; tests/test_nvidia_scalars.py holds every name to the
installed nvidia-ml-py), the tier it is read on, and how its number becomes the value:
a scale into a unit through the range gate (``gated``), or the integer as NVML gives it.
Every read goes through the guarded call (``Caller.read``), so a getter a card lacks is
asked once and a lost GPU raises as everywhere else.

A value that needs more than this (arguments, a struct, a sentinel of its own, a counter
kept between reads) stays a method of ``nvidia.device.NvmlDevice``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any

from exporter.core.labels import ErrorReason
from exporter.core.model import ValueField
from exporter.core.units import scaled
from exporter.sources.nvidia.calls import Caller, u32

PSTATE_UNKNOWN = 32  # nvml.h NVML_PSTATE_UNKNOWN


class Tier(Enum):
    """When a row is read (nvidia/device.py says why each tier is what it is)."""

    STATIC = "static"  # at open, and after the GPU was lost (NvmlDevice.read_static)
    FAST = "fast"  # every cycle (read_fast)
    SLOW = "slow"  # every slow cycle, the value served in between (read_state)
    RARE = "rare"  # every RARE_EVERY-th slow cycle, at open and after an XID (read_rare)


@dataclass(frozen=True)
class Scalar:
    """One plain NVML scalar: ``getter(handle)`` served as ``field``."""

    field: ValueField
    getter: str  # the NVML function
    tier: Tier
    scale: float = 1.0  # NVML's unit -> ``unit`` (mW -> W: 1e-3)
    unit: str = ""  # a units.RANGES key: the range gate; "": an integer, as NVML gives it
    item: int | None = None  # the value's place in a tuple answer
    zero: bool = True  # False: 0 means "not exposed" (what some cards answer for a limit)
    unknown: int | None = None  # this and above mean "unknown" (NVML_PSTATE_UNKNOWN)


SCALARS: tuple[Scalar, ...] = (
    Scalar("pcie_link_max_generation", "nvmlDeviceGetMaxPcieLinkGeneration", Tier.STATIC),
    Scalar("pcie_link_max_width", "nvmlDeviceGetMaxPcieLinkWidth", Tier.STATIC),
    Scalar("power_limit_default_watts", "nvmlDeviceGetPowerManagementDefaultLimit",
           Tier.STATIC, 1e-3, "watts"),
    Scalar("power_watts", "nvmlDeviceGetPowerUsage", Tier.FAST, 1e-3, "watts"),
    Scalar("performance_state", "nvmlDeviceGetPerformanceState", Tier.FAST,
           unknown=PSTATE_UNKNOWN),
    Scalar("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", Tier.SLOW),
    Scalar("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", Tier.SLOW),
    # (sessionCount, averageFps, averageLatency)
    Scalar("encoder_sessions", "nvmlDeviceGetEncoderStats", Tier.SLOW, item=0),
    Scalar("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", Tier.RARE, 1e-3, "watts",
           zero=False),
    Scalar("pcie_replay_errors", "nvmlDeviceGetPcieReplayCounter", Tier.RARE),
)
BY_TIER: dict[Tier, tuple[Scalar, ...]] = {
    tier: tuple(s for s in SCALARS if s.tier is tier) for tier in Tier}


def gated(errors: Counter[ErrorReason], value: float | int | None, scale: float, unit: str
          ) -> float | None:
    """``value`` (in NVML's unit) scaled into ``unit`` and through the range gate; a value
    NVML gave that falls outside it is dropped and counted (reason ``parse``)."""
    out = scaled(value, scale, unit)
    if out is None and value is not None:
        errors[ErrorReason.PARSE] += 1
    return out


def read(call: Caller, errors: Counter[ErrorReason], tier: Tier) -> dict[str, Any]:
    """The present values of ``tier``'s rows, by field name."""
    out: dict[str, Any] = {}
    for row in BY_TIER[tier]:
        answer = call.read(errors, row.getter)
        if answer is not None and row.item is not None:
            answer = answer[row.item]
        number = u32(answer)
        if number is None or (number == 0 and not row.zero) or (
                row.unknown is not None and number >= row.unknown):
            continue
        value = gated(errors, number, row.scale, row.unit) if row.unit else number
        if value is not None:
            out[row.field] = value
    return out
