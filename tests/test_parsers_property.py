"""Property tests (Hypothesis) over every parser of kernel files and what they feed:
sysfs and hwmon values, ``gpu_metrics`` binaries, DRM fdinfo, ``/proc`` files, uevent and
perf PMU descriptions. Whatever the bytes, a parser never raises out of its contract (a
``gpu_metrics`` of an unknown layout raises ``GpuMetricsError``, nothing else does), and
what it returns is within its unit's range (``units.RANGES``) and its own bounds.

Each test runs a fast-lane budget of examples (``BUDGET``), on Hypothesis's default
profile otherwise.
"""

from __future__ import annotations

import math
import re
import struct
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.core import units
from exporter.core.labels import ErrorReason
from exporter.sources.discovery import parse_uevent
from exporter.sources.fdinfo.backend import _Client
from exporter.sources.fdinfo.scan import ClientRead
from exporter.sources.kernel import amdgpu, drm_fdinfo, hwmon, i915_xe_pmu
from exporter.sources.kernel.amdgpu_gpu_metrics import (
    GpuMetricsError,
    decode_raw,
    layout_offsets,
    parse_gpu_metrics,
)
from exporter.sources.kernel.amdgpu_gpu_metrics_layouts import LAYOUTS

BUDGET = settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])

# Text shaped like kernel output: digits, signs, units, separators, and anything else.
_ALPHABET = st.sampled_from(list("0123456789 \t\n:-+.,xXabcdefABCDEF*=_kKMGiBnsHzTGT/") +
                            ["\x00", "\x1b", "é", "٣", "\u202e"])
kernel_text = st.one_of(st.text(_ALPHABET, max_size=80), st.text(max_size=80),
                        st.just("1_000"), st.just("9" * 400))
kernel_bytes = st.one_of(kernel_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
                         st.binary(max_size=120))
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True))
number_text = st.one_of(kernel_text, numbers.map(str), st.integers(0, 2**64).map(hex))


def in_range(value: float | None, unit: str) -> bool:
    low, high = units.RANGES[unit]
    return value is None or (math.isfinite(value) and low <= value <= high)


# -- units: every number from a file goes through these -------------------------------


@BUDGET
@given(st.one_of(number_text, kernel_bytes, st.none()))
def test_parse_int_and_number_never_raise_and_stay_in_u64(text: str | bytes | None) -> None:
    n = units.parse_int(text)
    assert n is None or (isinstance(n, int) and -units.U64_MAX <= n <= units.U64_MAX)
    f = units.parse_number(text)
    assert f is None or math.isfinite(f)


@BUDGET
@given(st.one_of(number_text, kernel_bytes), st.sampled_from([1, 1000, 1e-3, 1e-6, 1e6, 0.1]),
       st.sampled_from(sorted(units.RANGES)))
def test_scaled_values_are_within_their_units_range(text: str | bytes, scale: float,
                                                    unit: str) -> None:
    assert in_range(units.parse_scaled(text, scale, unit), unit)


@BUDGET
@given(numbers, numbers, numbers, st.floats(0, 10))
def test_plausible_increase_never_raises_and_refuses_what_no_rate_allows(
        increase: float, elapsed: float, rate: float, grace: float) -> None:
    ok = units.plausible_increase(increase, elapsed, rate, grace)
    if ok:
        assert 0 <= increase <= rate * (max(0.0, elapsed) * units.RATE_SLACK + grace)
    if not all(math.isfinite(v) for v in (increase, elapsed, rate)):
        assert not ok


@BUDGET
@given(st.one_of(st.integers(-(2**64), 2**64), st.none(), st.booleans()))
def test_valid_pid_is_the_kernels_range(pid: int | None) -> None:
    assert units.valid_pid(pid) == (type(pid) is int and 0 < pid <= units.PID_MAX)


@BUDGET
@given(st.one_of(numbers, st.none()))
def test_ratios_are_ratios(value: float | None) -> None:
    assert in_range(units.ratio_from_percent(value), "ratio")
    assert in_range(units.clamp_ratio(value if isinstance(value, float) else None), "ratio")


@BUDGET
@given(st.one_of(kernel_text, st.none()))
def test_pcie_link_text(text: str | None) -> None:
    assert units.parse_link_speed(text) in (None, 1, 2, 3, 4, 5, 6)
    width = units.parse_link_width(text)
    assert width is None or 0 < width <= 64


# -- /proc files --------------------------------------------------------------------------

@BUDGET
@given(st.one_of(kernel_bytes, st.none()))
def test_comm_and_cmdline_are_printable_and_bounded(raw: bytes | None) -> None:
    name = units.process_name(raw)
    assert name.isprintable() and len(name) <= 64
    command = units.command_line(raw)
    assert command is None or (command.isprintable() and 0 < len(command) <= units.MAX_COMMAND)


_stat = st.builds(lambda pid, comm, fields: f"{pid} ({comm}) {' '.join(fields)}".encode(
    "utf-8", "surrogatepass"), st.integers(-5, 2**32), kernel_text,
    st.lists(st.one_of(st.integers(-10, 2**70).map(str), kernel_text), max_size=30))


@BUDGET
@given(st.one_of(kernel_bytes, _stat, st.none()), st.one_of(kernel_bytes, st.none()))
def test_stat_statm_status_never_raise(stat: bytes | None, status: bytes | None) -> None:
    if stat is not None:
        start = units.parse_start_time(stat)
        assert start is None or start >= 0
    assert in_range(units.parse_rss(stat, status), "bytes")
    uid = units.parse_uid(status)
    assert uid is None or uid >= 0


# -- DRM fdinfo ---------------------------------------------------------------------------

_keys = st.sampled_from(["drm-driver", "drm-pdev", "drm-client-id", "drm-client-name",
                         "drm-engine-gfx", "drm-engine-render", "drm-engine-capacity-vcs",
                         "drm-cycles-rcs", "drm-total-cycles-rcs", "drm-maxfreq-gfx",
                         "drm-memory-vram", "drm-resident-system0", "drm-total-gtt",
                         "drm-shared-vram", "drm-purgeable-local0", "drm-active-stolen",
                         "amd-memory-visible-vram", "pos", "drm-engine-"])
_values = st.one_of(
    st.sampled_from(["amdgpu", "i915", "xe", "0000:03:00.0", "zz:zz", ""]),
    st.builds(lambda n, unit: f"{n} {unit}".strip(), st.integers(-5, 2**80),
              st.sampled_from(["", "ns", "KiB", "MiB", "GiB", "Hz", "MHz", "kHz", "cycles"])),
    kernel_text)
_line = st.one_of(
    st.builds(lambda k, sep, v: f"{k}{sep}{v}", st.one_of(_keys, kernel_text.map(
        lambda t: "drm-engine-" + t)), st.sampled_from([":\t", ": ", ":", ": \t", "\t:"]),
        _values),
    kernel_text)
fdinfo_text = st.lists(_line, max_size=40).map("\n".join)


@BUDGET
@given(fdinfo_text)
def test_fdinfo_parser_never_raises_and_bounds_what_it_keeps(text: str) -> None:
    s = drm_fdinfo.parse_fdinfo(text)
    assert s.malformed >= 0
    for values in (s.engine_ns, s.engine_capacity, s.cycles, s.total_cycles, s.maxfreq_hz,
                   s.resident, s.total, s.shared, s.active, s.purgeable, s.amd):
        assert len(values) <= drm_fdinfo.MAX_NAMES + drm_fdinfo.MAX_NAMES  # memory + alias
        for name, value in values.items():
            assert re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name)
            assert 0 <= value <= units.U64_MAX
    assert all(v > 0 for v in s.engine_capacity.values())
    assert s.client_id is None or 0 <= s.client_id <= units.U64_MAX
    local, host = drm_fdinfo.memory_split(s)
    assert local is None or local >= 0
    assert host is None or host >= 0
    for engine in s.engine_ns:
        assert s.capacity(engine) >= 1
        assert drm_fdinfo.engine_label(engine)


@BUDGET
@given(st.lists(st.tuples(st.one_of(st.integers(0, units.U64_MAX),
                                    st.integers(0, 10**12)),
                          st.floats(0, 100), st.integers(1, 2**64 - 1)), max_size=12))
def test_fdinfo_busy_counters_never_go_back_nor_outrun_time(
        reads: list[tuple[int, float, int]]) -> None:
    """Whatever a client's fdinfo says from read to read (counters garbled, going back,
    capacities absurd), the busy counters it feeds never go back, and each increase is
    one the time since the last counted read allows."""
    client = _Client(pid=10, vendor="amd", driver="amdgpu")
    busy: Counter[str] = Counter()
    errors: Counter[ErrorReason] = Counter()
    at, last_counted = 1000.0, (0, 0.0)
    for ns, dt, capacity in reads:
        at += dt
        stats = drm_fdinfo.parse_fdinfo(
            f"drm-driver:\tamdgpu\ndrm-client-id:\t1\ndrm-engine-gfx:\t{ns} ns\n"
            f"drm-engine-capacity-gfx:\t{capacity}\n")
        before = busy["gfx"]
        client.update(ClientRead(("0000:03:00.0", "1"), 10, stats, at), errors, busy)
        gained = busy["gfx"] - before
        assert gained >= 0
        if gained:
            elapsed = at - last_counted[1] if last_counted[1] else at
            assert units.plausible_increase(gained / 1e9, elapsed, 64)
            last_counted = (ns, at)
        for ratio in client.ratio.values():
            assert math.isfinite(ratio) and ratio >= 0


# -- sysfs: amdgpu text files, uevent, perf PMUs ------------------------------------------

_dpm_line = st.builds(lambda lvl, gts, mhz, star: f"{lvl}: {gts}{mhz}Mhz{star}",
                      st.sampled_from(["0", "1", "S", "x"]),
                      st.sampled_from(["", "8.0GT/s, x16 ", "2.5GT/s, x0 ", "99GT/s, x99 "]),
                      st.integers(-5, 2**70), st.sampled_from(["", " *", "*"]))


@BUDGET
@given(st.one_of(st.lists(st.one_of(_dpm_line, kernel_text), max_size=12).map("\n".join),
                 st.none()))
def test_amdgpu_text_files(text: str | None) -> None:
    levels, bad = amdgpu.parse_pp_dpm(text)
    assert bad >= 0 and all(in_range(lv.hz, "hertz") for lv in levels)
    assert all(lv.pcie_width is None or 0 < lv.pcie_width <= 64 for lv in levels)
    assert in_range(amdgpu.dpm_current_hz(levels), "hertz")
    assert in_range(amdgpu.dpm_max_hz(levels), "hertz")
    counts, bad = amdgpu.parse_ras_count(text)
    assert bad >= 0 and all(0 <= v < units.U64_MAX for v in counts.values())
    bw = amdgpu.parse_pcie_bw(text)
    assert bw is None or all(in_range(v, "bytes_per_second") for v in bw)
    props = amdgpu.parse_kfd_properties(text)
    assert all(v >= 0 for v in props.values())
    bus = amdgpu.kfd_pci_bus_id(props)
    assert bus is None or re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bus)
    assert parse_uevent(text) is not None


@BUDGET
@given(st.integers(0, 2**64))
def test_gfx_target(version: int) -> None:
    target = amdgpu.gfx_target(version)
    assert target == "" or re.fullmatch(r"gfx[0-9]{1,2}[0-9a-f]{2}", target)


@BUDGET
@given(st.one_of(kernel_text, st.none()))
def test_perf_pmu_descriptions(text: str | None) -> None:
    cpu = i915_xe_pmu.parse_cpumask(text)
    assert cpu is None or 0 <= cpu < 1 << 20
    fmt = i915_xe_pmu.parse_format(text)
    assert fmt is None or all(0 <= low <= high <= 63 for low, high in fmt)
    terms = i915_xe_pmu.parse_terms(text)
    assert terms is None or all(v >= 0 for v in terms.values())
    if text is not None:
        i915_xe_pmu.parse_pmu_name(text)


# -- gpu_metrics binaries -----------------------------------------------------------------

_revisions = sorted(LAYOUTS)


@st.composite
def gpu_metrics_blobs(draw: st.DrawFn) -> bytes:
    """A known revision's header with random (and truncated, and padded) contents, or
    any bytes at all."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=64))
    fmt, content = draw(st.sampled_from(_revisions))
    layout = draw(st.sampled_from(LAYOUTS[(fmt, content)]))
    size = layout_offsets(layout)[1]
    declared = draw(st.one_of(st.just(size), st.integers(0, 0xFFFF)))
    body = draw(st.one_of(
        st.binary(min_size=size, max_size=size),
        st.just(b"\xff" * size), st.just(b"\x00" * size),
        st.binary(max_size=size)))  # truncated
    return struct.pack("<HBB", declared, fmt, content) + body[4:]


@BUDGET
@given(gpu_metrics_blobs())
def test_gpu_metrics_decoder_raises_only_its_error_and_bounds_every_value(data: bytes) -> None:
    try:
        m = parse_gpu_metrics(data)
    except GpuMetricsError:
        return
    assert all(in_range(v, "celsius") for v in m.temperatures_celsius.values())
    assert all(in_range(v, "hertz") for v in m.clocks_hertz.values())
    for ratio in (m.gfx_activity_ratio, m.memory_activity_ratio, m.video_activity_ratio):
        assert in_range(ratio, "ratio")
    assert in_range(m.socket_power_watts, "watts")
    assert in_range(m.energy_joules, "joules")
    assert in_range(m.fan_rpm, "rpm")
    assert m.pcie_link_width is None or 0 < m.pcie_link_width <= 64
    for link in (m.xgmi_read_bytes, m.xgmi_write_bytes):
        assert all(in_range(v, "bytes") for v in link.values())
    assert m.dropped >= 0
    assert isinstance(m.throttle_reasons, dict)


@BUDGET
@given(st.sampled_from(_revisions), st.data())
def test_a_short_gpu_metrics_read_is_the_whole_table_with_all_ones_past_its_last_whole_field(
        revision: tuple[int, int], data: st.DataObject) -> None:
    """A read cut anywhere decodes the fields that fit whole, each as the whole table
    gives it, and nothing of the rest: the same values as the whole table with every
    byte from the first field that does not fit on set to all ones ("not filled")."""
    fmt, content = revision
    layout = data.draw(st.sampled_from(LAYOUTS[revision]))
    fields, size, _ = layout_offsets(layout)
    body = data.draw(st.binary(min_size=size, max_size=size))
    whole = struct.pack("<HBB", size, fmt, content) + body[4:]
    cut_at = data.draw(st.integers(4, size))
    short = whole[:cut_at]
    plain = [(name, offset, offset + struct.calcsize(code[-1]) * int(code[:-1] or 1))
             for name, offset, code in fields if isinstance(code, str)]
    first_out = next((offset for _, offset, end in plain if end > cut_at), size)
    ones = whole[:first_out] + b"\xff" * (size - first_out)
    fitting = {name for name, _, end in plain if end <= cut_at}

    _, _, _, raw_short = decode_raw(short)
    _, _, _, raw_whole = decode_raw(whole)
    assert set(raw_short) == fitting
    assert raw_short == {name: raw_whole[name] for name in fitting}
    parsed = parse_gpu_metrics(short)
    assert dict(parsed.raw) == raw_short
    assert replace(parsed, raw={}) == replace(parse_gpu_metrics(ones), raw={})


# -- hwmon: the files of one hwmon directory ------------------------------------------------

_hwmon_names = st.sampled_from(["temp1_input", "temp2_input", "temp1_label", "temp1_crit",
                                "power1_average", "power1_input", "power1_cap",
                                "energy1_input", "energy1_label", "fan1_input", "fan1_max",
                                "pwm1", "pwm1_max", "freq1_input", "in0_input", "name"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_hwmon_names, st.one_of(number_text.map(str.encode), kernel_bytes),
                       max_size=10))
def test_hwmon_readers_never_raise_and_bound_their_values(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "hwmon0"
        d.mkdir()
        for name, content in files.items():
            (d / name).write_bytes(content)
        errors: Counter[ErrorReason] = Counter()
        assert all(in_range(v, "celsius") for v in hwmon.read_temperatures(d, errors).values())
        assert all(in_range(v, "watts") for v in hwmon.read_power(d, errors).values())
        assert all(in_range(v, "watts") for v in hwmon.read_power_caps(d, "cap", errors).values())
        assert all(in_range(v, "joules") for v in hwmon.read_energy(d, errors).values())
        assert all(in_range(v, "ratio") for v in hwmon.read_fan_ratios(d, errors).values())
        assert all(in_range(v, "hertz") for v in hwmon.read_frequencies(d, errors).values())
        assert all(in_range(v, "volts") for v in hwmon.read_voltages(d, errors).values())
        assert all(n >= 0 for n in errors.values())
