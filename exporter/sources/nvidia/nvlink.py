"""NVLink of one GPU: link state and remote type, throughput per link, error counters.

A link is reported once the driver has shown it active (``nvmlDeviceGetNvLinkState``
= 1); from then on it keeps its series, so a link that drops reads ``up 0`` instead of
vanishing. Links that never came up (an NVLink-capable PCIe card without a bridge)
and cards without NVLink (every link NOT_SUPPORTED, as on a passthrough VM or a
PCIe-only lease) have no series at all; the unsupported probes are remembered by
``Caller`` and cost nothing after the first cycle.

Remote type (``nvmlDeviceGetNvLinkRemoteDeviceType``, nvml.h nvmlIntNvLinkDeviceType_t):
GPU -> ``gpu``, SWITCH -> ``switch``, IBMNPU (the POWER9 CPU's NVLink unit) -> ``cpu``;
anything else (UNKNOWN 0xFF, a failed read) -> ``unknown``.

Cost, measured on two NVLink-connected H100s (bench/nvml_calls.py, driver 580.159.04):
each ``nvmlDeviceGetNvLinkErrorCounter`` costs 0.79 ms of CPU, so the 72 counters of 18
links cost 57 ms per GPU; the 36 throughput fields cost 13 ms in one batched call. Read
on the slow tier, an HGX board of 8 GPUs would spend 5.6 % of a core on NVLink alone.
So throughput is read every THROUGHPUT_EVERY-th slow cycle (30 s by default: the rate
is the average over that time) and the error counters every ERRORS_EVERY-th (60 s: a
counter read less often loses nothing), about 1.4 ms of CPU per GPU per second. No
health verdict, chart or dashboard uses them, so both are read on those cycles only
when a scrape, ``/snapshot`` or push came since their last read
(exporter.sources.readers: a rate needs two reads, not a fixed cadence); a daemon
nobody scrapes reads them once. The link state (18 calls on an H100 or H200) is read on
the rare tier (device.py RARE_EVERY) and on the cycle after an XID.

Throughput (every THROUGHPUT_EVERY slow cycles): the cumulative KiB counters
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX with the link in scopeId, batched with the
other slow field values; the rate is the counter's increase over NVML's own timestamps
between two reads. Where a driver has no such fields for a link, the older
``nvmlDeviceGetNvLinkUtilizationCounter`` (counter set 0) is used, but only if its
control already counts bytes: the exporter never sets a control
(``nvmlDeviceSetNvLinkUtilizationControl`` changes the GPU's state). A counter that goes
back (driver reload, counter reset) gives no rate for that interval, never a spike.
Errors (every ERRORS_EVERY slow cycles): ``nvmlDeviceGetNvLinkErrorCounter`` per link
for replay, recovery, CRC flit and CRC data (nvml.h nvmlNvLinkErrorCounter_t).
"""

from __future__ import annotations

import time
from collections import Counter

from exporter.core.labels import Direction, ErrorReason, NvLinkError, Remote
from exporter.core.units import bounded
from exporter.sources.nvidia.calls import Caller, Nvml, u32, u64
from exporter.sources.nvidia.fields import FieldKey, FieldValue, field_id
from exporter.sources.readers import ALWAYS, Readers, Wanted

KIB = 1024
UNKNOWN_REMOTE = Remote.UNKNOWN
REMOTES = {"NVML_NVLINK_DEVICE_TYPE_GPU": Remote.GPU,
           "NVML_NVLINK_DEVICE_TYPE_SWITCH": Remote.SWITCH,
           "NVML_NVLINK_DEVICE_TYPE_IBMNPU": Remote.CPU}
ERROR_COUNTERS = {NvLinkError.REPLAY: "NVML_NVLINK_ERROR_DL_REPLAY",
                  NvLinkError.RECOVERY: "NVML_NVLINK_ERROR_DL_RECOVERY",
                  NvLinkError.CRC_FLIT: "NVML_NVLINK_ERROR_DL_CRC_FLIT",
                  NvLinkError.CRC_DATA: "NVML_NVLINK_ERROR_DL_CRC_DATA"}
THROUGHPUT_FIELDS = {Direction.TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
                     Direction.RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"}
DEFAULT_MAX_LINKS = 18  # nvml.h NVML_NVLINK_MAX_LINKS before it grew to 36
THROUGHPUT_EVERY = 3  # slow cycles between throughput reads: the rare tier (device.RARE_EVERY)
ERRORS_EVERY = 6  # slow cycles between error-counter reads: every 2nd rare cycle


class NvLinks:
    """The NVLinks of one device handle."""

    def __init__(self, call: Caller, readers: Readers = ALWAYS) -> None:
        self.call = call
        nvml = call.nvml
        self.max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS))
        self.remote_names = {getattr(nvml, k): v for k, v in REMOTES.items() if hasattr(nvml, k)}
        self.errors_by_type = {k: getattr(nvml, c) for k, c in ERROR_COUNTERS.items()
                               if hasattr(nvml, c)}
        self.fields: dict[str, int] = {d: fid for d, n in THROUGHPUT_FIELDS.items()
                       if (fid := field_id(nvml, n)) is not None}
        self.bytes_unit = getattr(nvml, "NVML_NVLINK_COUNTER_UNIT_BYTES", None)
        self.remote: dict[int, str] = {}  # link -> remote type, for links seen active
        self.absent = False  # every link index answered "absent" / "not supported"
        self._last: dict[tuple[int, str], tuple[int, float]] = {}  # (link, dir) -> (B, s)
        self._rates: dict[tuple[str, str], float] = {}
        self._errors: dict[tuple[str, str], int] = {}
        # Throughput and error counters are a reader's only (no verdict or chart uses
        # them): read when due and a scrape came since (exporter.sources.readers).
        self._want_rates, self._want_errors = Wanted(readers), Wanted(readers)

    def throughput_due(self, cycle: int) -> bool:
        """Read throughput on the device's ``cycle``-th slow cycle since it was opened or
        lost (NvmlDevice counts them)? Every THROUGHPUT_EVERY-th, when a reader came since
        the last read (exporter.sources.readers); the first cycle reads."""
        return bool(self.remote) and cycle % THROUGHPUT_EVERY == 0 and self._want_rates.due()

    def errors_due(self, cycle: int) -> bool:
        """Read the error counters now? As ``throughput_due``, every ERRORS_EVERY-th."""
        return bool(self.remote) and cycle % ERRORS_EVERY == 0 and self._want_errors.due()

    def read_state(self, errors: Counter[ErrorReason]) -> dict[tuple[str, str], bool]:
        """(link, remote) -> up, for every link that has been active (rare tier)."""
        out: dict[tuple[str, str], bool] = {}
        if self.absent:
            return out
        for link in range(self.max_links):
            state = u32(self.call.probe(errors, Nvml.DEVICE_GET_NV_LINK_STATE, link))
            if state is None:
                continue
            if link not in self.remote:
                if not state:
                    continue  # never active: not a link this GPU uses
                self.remote[link] = self._remote_type(errors, link)
            out[(str(link), self.remote[link])] = bool(state)
        self.absent = not self.remote and all(
            self.call.absent(Nvml.DEVICE_GET_NV_LINK_STATE, link) for link in range(self.max_links))
        return out

    def _remote_type(self, errors: Counter[ErrorReason], link: int) -> str:
        kind = self.call.get(errors, Nvml.DEVICE_GET_NV_LINK_REMOTE_DEVICE_TYPE, link)
        return UNKNOWN_REMOTE if kind is None else self.remote_names.get(kind, UNKNOWN_REMOTE)

    def throughput_fields(self) -> list[FieldKey]:
        """The (field, link) requests for the slow-tier field batch."""
        return [(fid, link) for link in sorted(self.remote) for fid in self.fields.values()]

    def throughput(self, errors: Counter[ErrorReason], values: dict[FieldKey, FieldValue],
                   dropped: set[FieldKey], due: bool = True) -> dict[tuple[str, str], float]:
        """(link, direction) -> bytes/s from this read and the previous one; between
        reads (``due`` False) the last rates."""
        if not due:
            return dict(self._rates)
        out: dict[tuple[str, str], float] = {}
        now = time.monotonic()
        for link in sorted(self.remote):
            readings: dict[str, tuple[int, float]] = {}
            for direction, fid in self.fields.items():
                fv = values.get((fid, link))
                kib = None if fv is None else u64(fv.value)
                if fv is not None and kib is not None:
                    # NVML's own reading time; a driver that leaves it 0 gets ours.
                    at = fv.timestamp_us / 1e6 if fv.timestamp_us > 0 else now
                    readings[direction] = (kib * KIB, at)
            if not readings and all((fid, link) in dropped for fid in self.fields.values()):
                readings = self._utilization_counter(errors, link, now)
            for direction, (count, at) in readings.items():
                rate = self._rate((link, direction), count, at)
                if rate is not None:
                    out[(str(link), direction)] = rate
        self._rates = out
        return out

    def _utilization_counter(self, errors: Counter[ErrorReason], link: int,
                             now: float) -> dict[str, tuple[int, float]]:
        control = self.call.get(errors, Nvml.DEVICE_GET_NV_LINK_UTILIZATION_CONTROL, link, 0)
        if control is None or self.bytes_unit is None or control.units != self.bytes_unit:
            return {}
        counts = self.call.get(errors, Nvml.DEVICE_GET_NV_LINK_UTILIZATION_COUNTER, link, 0)
        if counts is None:
            return {}
        rx, tx = (u64(c) for c in counts)
        return {d: (c, now) for d, c in (("tx", tx), ("rx", rx)) if c is not None}

    def _rate(self, key: tuple[int, str], count: int, at: float) -> float | None:
        last = self._last.get(key)
        self._last[key] = (count, at)
        if last is None or at <= last[1] or count < last[0]:
            return None  # first reading, no time passed, or the counter was reset
        return bounded((count - last[0]) / (at - last[1]), "bytes_per_second")

    def read_errors(self, errors: Counter[ErrorReason], due: bool = True
                    ) -> dict[tuple[str, str], int]:
        """(link, type) -> counter, for every link that has been active; between reads
        (``due`` False) the last values."""
        if not due:
            return dict(self._errors)
        out: dict[tuple[str, str], int] = {}
        for link in sorted(self.remote):
            for kind, counter in self.errors_by_type.items():
                v = u64(self.call.get(errors, Nvml.DEVICE_GET_NV_LINK_ERROR_COUNTER, link, counter))
                if v is not None:
                    out[(str(link), kind)] = v
        self._errors = out
        return out

    def reset(self) -> None:
        """After a GPU loss: rates restart from a fresh pair of readings, read at once."""
        self._last.clear()
        self._rates, self._errors = {}, {}
        self._want_rates.reset()
        self._want_errors.reset()

