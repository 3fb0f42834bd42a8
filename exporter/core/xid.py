"""What an XID code means: a short table of the common codes, from NVIDIA's catalogue.

Source: NVIDIA, "XID Errors", https://docs.nvidia.com/deploy/xid-errors/ — the Xid
catalogue for Ampere and later (analyzing-xid-catalog.html: Code, Mnemonic, Description
columns), read with the driver's own names for the codes (``nverror.h`` of
NVIDIA/open-gpu-kernel-modules, ``ROBUST_CHANNEL_*`` and friends). Each meaning here is
that description in a few words of our own, facts only: no advice, no severity (the
health verdict's rules are exporter.pipeline.health's). A code not listed is "unknown": look it up
in the catalogue (Volta and older GPUs have a catalogue of their own there).

A GPU counts at most ``MAX_CODES`` distinct codes; every code past them is counted under
the one code ``OTHER`` (served as ``xid="other"``): the driver can report any 16-bit code,
and 3,000 odd ones made 6,001 series of one GPU.

Served as ``gpu_xid_info{xid, meaning}`` next to ``gpu_xid_errors_total{xid}`` (join on
``xid``), in the health reasons (``/snapshot``, the landing page, ``gpu-exporter top``)
and in the ``GpuXidErrors`` alert's description.
"""

from __future__ import annotations

from collections.abc import Mapping

UNKNOWN = "unknown"
MAX_CODES = 64  # distinct codes counted per GPU (the catalogue lists about 100 in all)


class _Other(int):
    """The code every XID past a GPU's ``MAX_CODES`` is counted under: an int as the
    other codes are (ordered, hashed, a key of the same mappings), that reads ``other``
    where it becomes a label value or a word (as exporter.core.labels' vocabularies do)."""

    def __str__(self) -> str:
        return "other"

    def __repr__(self) -> str:
        return "OTHER"

    def __format__(self, spec: str) -> str:
        return format("other", spec)


OTHER: int = _Other(-1)  # no XID code is negative

_COPY_ENGINE = "copy engine exception"
_NVLINK5 = "NVLink error ({})"

CATALOGUE: Mapping[int, str] = {
    8: "GPU stopped processing (channel idle timeout)",
    11: "invalid or corrupted push buffer stream",
    13: "graphics engine exception",
    14: "injected test error",
    25: "invalid or corrupted push buffer stream (illegal notify)",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream (DMA engine error)",
    38: "driver firmware error (watchdog timeout)",
    **{code: _COPY_ENGINE for code in (39, 40, 41, 70, 71, 72, 75, 76, 77, 85)},
    43: "GPU stopped processing (channel reset after an application fault)",
    44: "graphics engine fault during context switch",
    45: "preemptive cleanup after an earlier error",
    46: "GPU stopped processing (timeout)",
    48: "double-bit ECC error",
    54: "clocks reduced: auxiliary power not connected",
    56: "display engine error",
    57: "error programming the video memory interface",
    58: "unstable video memory interface",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "memory row remapping or page retirement recorded",
    64: "memory row remapping or page retirement failed",
    68: "video decoder exception",
    69: "graphics engine class error",
    74: "NVLink error",
    78: "vGPU start error",
    79: "GPU has fallen off the bus",
    80: "corrupted data sent to the GPU",
    92: "high single-bit ECC error rate",
    93: "InfoROM erase limit exceeded",
    94: "contained memory error",
    95: "uncontained memory error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    136: "NVLink link training failed",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    144: _NVLINK5.format("SAW"),
    145: _NVLINK5.format("RLW"),
    146: _NVLINK5.format("TLW"),
    147: _NVLINK5.format("TREX"),
    148: _NVLINK5.format("NVLPW control"),
    149: _NVLINK5.format("NETIR"),
    150: _NVLINK5.format("MSE"),
    154: "GPU recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event",
    157: "resource retirement failure",
    158: "GPU fatal timeout",
}


def meaning(code: int) -> str:
    """The catalogue's meaning of ``code``, or "unknown"."""
    if code == OTHER:
        return f"codes past the first {MAX_CODES} of this GPU"
    return CATALOGUE.get(code, UNKNOWN)
