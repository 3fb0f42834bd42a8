"""parse_fdinfo over every shape the drivers print (each case below is a real capture).

The texts below are this project's own test data in those shapes: same keys,
separators and units as the captures, different values. Expected numbers are
worked out by hand (KiB x 1024, MiB x 1048576).
"""

from __future__ import annotations

from exporter.sources.kernel.drm_fdinfo import (
    DrmClientStats,
    engine_label,
    memory_split,
    parse_fdinfo,
)

KiB = 1024
MiB = 1024 * 1024


def test_amdgpu_legacy_keys_with_tabs_and_space_tab() -> None:
    # APU shape: "drm-memory-gtt: \t" (space then TAB), amd-* keys, drm-shared-*.
    s = parse_fdinfo(
        "drm-driver:\tamdgpu\n"
        "drm-client-id:\t212\n"
        "drm-pdev:\t0000:C4:00.0\n"
        "drm-memory-vram:\t2048 KiB\n"
        "drm-memory-gtt: \t300 KiB\n"
        "drm-memory-cpu: \t0 KiB\n"
        "amd-memory-visible-vram:\t1024 KiB\n"
        "amd-requested-vram:\t2048 KiB\n"
        "drm-shared-vram:\t0 KiB\n"
        "drm-shared-gtt:\t4 KiB\n"
    )
    assert s.driver == "amdgpu"
    assert s.client_id == 212
    assert s.pdev == "0000:c4:00.0"  # normalised like sysfs
    assert dict(s.resident) == {"vram": 2097152, "gtt": 307200, "cpu": 0}
    assert dict(s.shared) == {"vram": 0, "gtt": 4096}
    assert dict(s.amd) == {"memory-visible-vram": 1048576, "requested-vram": 2097152}
    assert s.malformed == 0
    assert memory_split(s) == (2097152, 307200)


def test_amdgpu_spaces_header_keys_and_all_amd_keys() -> None:
    # `cat /proc/<pid>/fdinfo/<fd>` of a ROCm process, spaces after the colon.
    s = parse_fdinfo(
        "pos:    0\nflags:  02100002\nmnt_id: 1873\nino:    19\npasid:  32771\n"
        "drm-driver:     amdgpu\n"
        "drm-pdev:       0000:83:00.0\n"
        "drm-client-id:  5501\n"
        "drm-memory-vram:        80 KiB\n"
        "drm-memory-gtt:         40 KiB\n"
        "drm-memory-cpu:         6000 KiB\n"
        "amd-memory-visible-vram:        80 KiB\n"
        "amd-evicted-vram:       0 KiB\n"
        "amd-evicted-visible-vram:       0 KiB\n"
        "amd-requested-vram:     80 KiB\n"
        "amd-requested-visible-vram:     80 KiB\n"
        "amd-requested-gtt:      52 KiB\n"
    )
    assert (s.driver, s.pdev, s.client_id) == ("amdgpu", "0000:83:00.0", 5501)
    assert len(s.amd) == 6
    assert s.amd["requested-gtt"] == 52 * 1024
    # host memory: gtt + cpu = 40 KiB + 6000 KiB
    assert memory_split(s) == (81920, 6184960)


def test_identity_keys_printed_twice_first_wins() -> None:
    s = parse_fdinfo(
        "pos:\t0\nflags:\t02100002\nmnt_id:\t34\nino:\t659\n"
        "drm-driver:\tamdgpu\ndrm-client-id:\t500\ndrm-pdev:\t0000:63:00.0\npasid:\t32789\n"
        "drm-driver:\tamdgpu\ndrm-pdev:\t0000:63:00.0\ndrm-client-id:\t777001\n"
        "drm-memory-vram:\t1000 KiB\ndrm-memory-gtt: \t10 KiB\n"
    )
    assert s.client_id == 500
    assert s.resident["vram"] == 1024000
    assert s.malformed == 0


def test_value_printed_twice_keeps_first() -> None:
    s = parse_fdinfo("drm-driver: i915\ndrm-engine-render: 5 ns\ndrm-engine-render: 9 ns\n")
    assert dict(s.engine_ns) == {"render": 5}


def test_i915_engines_capacity_and_stolen_regions() -> None:
    s = parse_fdinfo(
        "pos:\t0\nflags:\t02100002\nmnt_id:\t1233\nino:\t846\n"
        "drm-driver:\ti915\ndrm-client-id:\t41\ndrm-pdev:\t0000:00:02.0\n"
        "drm-total-system0:\t2000 KiB\ndrm-shared-system0:\t100 KiB\n"
        "drm-active-system0:\t50 KiB\ndrm-resident-system0:\t1500 KiB\n"
        "drm-purgeable-system0:\t8 KiB\n"
        "drm-total-stolen-system0:\t0\ndrm-resident-stolen-system0:\t0\n"
        "drm-engine-render:\t123456789 ns\ndrm-engine-copy:\t0 ns\n"
        "drm-engine-video:\t1000 ns\ndrm-engine-capacity-video:\t2\n"
        "drm-engine-video-enhance:\t0 ns\n"
    )
    assert dict(s.engine_ns) == {"render": 123456789, "copy": 0, "video": 1000,
                                 "video-enhance": 0}
    assert s.capacity("video") == 2 and s.capacity("render") == 1
    assert s.total["system0"] == 2048000
    assert s.purgeable["system0"] == 8192
    # iGPU: nothing device-local; resident system0 (1500 KiB) + stolen-system0 (0) is host
    assert memory_split(s) == (None, 1536000)


def test_i915_doc_example_spaces_no_memory() -> None:
    s = parse_fdinfo(
        "pos:    0\nflags:  0100002\nmnt_id: 21\n"
        "drm-driver: i915\ndrm-pdev:   0000:00:02.0\ndrm-client-id:      7\n"
        "drm-engine-render:  100 ns\ndrm-engine-copy:    20 ns\n"
        "drm-engine-video:   0 ns\ndrm-engine-capacity-video:   2\n"
    )
    assert (s.driver, s.client_id) == ("i915", 7)
    assert s.engine_ns["copy"] == 20
    assert memory_split(s) == (None, None)  # not exposed, not zero


def test_xe_regions_cycles_and_mixed_units() -> None:
    s = parse_fdinfo(
        "drm-driver:     xe\ndrm-client-id:  3\ndrm-pdev:       0000:03:00.0\n"
        "drm-total-system:       0\ndrm-resident-system:    0\n"
        "drm-purgeable-system:   0\n"
        "drm-total-gtt:  192 KiB\ndrm-resident-gtt:       192 KiB\n"
        "drm-total-vram0:        30000 KiB\ndrm-shared-vram0:       16 MiB\n"
        "drm-resident-vram0:     20000 KiB\n"
        "drm-total-stolen:       0\ndrm-resident-stolen:    0\n"
        "drm-cycles-rcs: 1000\ndrm-total-cycles-rcs:   50000\n"
        "drm-cycles-vcs: 0\ndrm-total-cycles-vcs:   50000\ndrm-engine-capacity-vcs:        2\n"
        "drm-cycles-ccs: 7\ndrm-total-cycles-ccs:   50000\ndrm-engine-capacity-ccs:        4\n"
    )
    assert dict(s.engine_ns) == {}  # xe prints cycles, not ns
    assert dict(s.cycles) == {"rcs": 1000, "vcs": 0, "ccs": 7}
    assert dict(s.total_cycles) == {"rcs": 50000, "vcs": 50000, "ccs": 50000}
    assert s.capacity("ccs") == 4
    assert s.shared["vram0"] == 16 * MiB
    # resident wins over total: vram0 20000 KiB (+ stolen 0 follows vram); host gtt+system
    assert memory_split(s) == (20480000, 196608)


def test_msm_cycles_and_maxfreq() -> None:
    s = parse_fdinfo(
        "pos:\t0\nflags:\t02400002\nmnt_id:\t21\nino:\t162\n"
        "drm-driver:\tmsm\ndrm-client-id:\t9\n"
        "drm-engine-gpu:\t2000 ns\ndrm-cycles-gpu:\t1500\ndrm-maxfreq-gpu:\t800000000 Hz\n"
    )
    assert s.pdev is None
    assert (s.engine_ns["gpu"], s.cycles["gpu"], s.maxfreq_hz["gpu"]) == (2000, 1500, 800000000)


def test_panfrost_mib_kib_curfreq_ignored() -> None:
    s = parse_fdinfo(
        "drm-driver:     panfrost\ndrm-client-id:  14\n"
        "drm-engine-fragment:    100 ns\ndrm-cycles-fragment:    80\n"
        "drm-maxfreq-fragment:   800 MHz\ndrm-curfreq-fragment:   799999987 Hz\n"
        "drm-engine-vertex-tiler:        7 ns\n"
        "drm-total-memory:       290 MiB\ndrm-shared-memory:      0 MiB\n"
        "drm-resident-memory:    36000 KiB\ndrm-purgeable-memory:   128 KiB\n"
    )
    assert s.maxfreq_hz["fragment"] == 800_000_000
    assert s.total["memory"] == 290 * MiB
    assert s.resident["memory"] == 36000 * KiB
    assert s.malformed == 0  # drm-curfreq-* is not in the spec: ignored, not an error
    assert memory_split(s) == (None, 36000 * KiB)  # "memory" is system RAM


def test_v3d_non_drm_job_lines_ignored() -> None:
    s = parse_fdinfo(
        "drm-driver:     v3d\ndrm-client-id:  44\n"
        "drm-engine-bin:         16 ns\nv3d-jobs-bin:   19 jobs\n"
        "drm-engine-cache_clean:         27 ns\nv3d-jobs-cache_clean:   2 job\n"
        "drm-total-memory:       15000 KiB\ndrm-shared-memory:      9000 KiB\n"
        "drm-active-memory:      0\n"
    )
    assert dict(s.engine_ns) == {"bin": 16, "cache_clean": 27}
    assert s.malformed == 0
    # only total printed: it stands in for resident
    assert memory_split(s) == (None, 15000 * KiB)


def test_grep_prefixed_lines() -> None:
    s = parse_fdinfo(
        "/proc/2390/fdinfo/23:drm-driver:              v3d\n"
        "/proc/2390/fdinfo/23:drm-client-id:           14\n"
        "/proc/2390/fdinfo/23:drm-engine-render:       1400 ns\n"
        "/proc/2390/fdinfo/23:drm-resident-memory:     43 KiB\n"
    )
    assert (s.driver, s.client_id, s.engine_ns["render"]) == ("v3d", 14, 1400)
    assert s.resident["memory"] == 43 * 1024


def test_reprinted_with_indent_accel_driver() -> None:
    s = parse_fdinfo(
        "  drm-driver:    amdxdna_accel_driver\n  drm-client-id:    76\n"
        "  drm-pdev:    0000:c5:00.1\n  drm-engine-npu-amdxdna:    0 ns\n"
        "  drm-total-memory:    0\n"
    )
    assert (s.driver, s.pdev, s.client_id) == ("amdxdna_accel_driver", "0000:c5:00.1", 76)
    assert dict(s.engine_ns) == {"npu-amdxdna": 0}


def test_nothing_after_colon_and_bare_bytes() -> None:
    s = parse_fdinfo("drm-driver:xe\ndrm-client-id:12\ndrm-total-vram0:4096\n")
    assert (s.driver, s.client_id, s.total["vram0"]) == ("xe", 12, 4096)


def test_bad_values_are_counted_and_dropped() -> None:
    s = parse_fdinfo(
        "drm-driver:\ti915\n"
        "drm-client-id:\tabc\n"  # not a uint
        "drm-engine-render:\t12 us\n"  # wrong unit
        "drm-total-system0:\t5 GiB\n"  # not a spec unit
        "drm-engine-capacity-video:\t0\n"  # zero capacity is not allowed
        "drm-engine-copy:\t-4 ns\n"
        "drm-engine-video:\t3 ns\n"
    )
    assert s.client_id is None
    assert dict(s.engine_ns) == {"video": 3}
    assert s.capacity("video") == 1
    assert dict(s.total) == {}
    assert s.malformed == 5


def test_garbage_never_raises() -> None:
    assert parse_fdinfo("") == DrmClientStats()
    assert parse_fdinfo("pos:\t0\nflags:\t02\n") == DrmClientStats()  # nvidia-drm: no stats
    s = parse_fdinfo("\x00\x01drm-\ufffd:\n::::\ndrm-engine-:\t1 ns\n" + "x" * 10000)
    assert s.driver is None and s.malformed >= 1


def test_engine_names_are_bounded() -> None:
    text = "drm-driver: xe\n" + "".join(f"drm-engine-e{i}: 1 ns\n" for i in range(100))
    s = parse_fdinfo(text)
    assert len(s.engine_ns) == 32
    assert s.malformed == 68


def test_engine_labels() -> None:
    assert [engine_label(e) for e in ("rcs", "bcs", "vcs", "vecs", "ccs")] == [
        "render", "copy", "video", "video_enhance", "compute"]
    assert engine_label("video-enhance") == "video_enhance"
    assert [engine_label(e) for e in ("gfx", "dec", "enc", "jpeg")] == [
        "gfx", "decoder", "encoder", "jpeg"]


def test_i915_dgpu_local_regions_are_device_local() -> None:
    s = parse_fdinfo(
        "drm-driver: i915\ndrm-resident-system0: 1 KiB\ndrm-resident-local0: 3 KiB\n"
        "drm-resident-stolen-local0: 1 KiB\n"
    )
    assert memory_split(s) == (4096, 1024)


def test_numbers_are_u64_or_dropped() -> None:
    # Item 11 of issue 8: a 400-digit counter parsed as a Python int and raised
    # OverflowError later, in float conversion. Every number is now a u64 (what the
    # kernel prints) once its unit is applied, else the line is dropped and counted.
    u64_max = 2**64 - 1
    s = parse_fdinfo(
        "drm-driver:\tamdgpu\n"
        f"drm-client-id:\t{'7' * 400}\n"
        f"drm-engine-gfx:\t{'9' * 400} ns\n"
        f"drm-engine-compute:\t{u64_max + 1} ns\n"
        f"drm-engine-dma:\t{u64_max} ns\n"
        "drm-engine-jpeg:\t1e400 ns\n"
        "drm-engine-vcn:\tNaN ns\n"
        f"drm-memory-vram:\t{u64_max // 1024 + 1} KiB\n"  # a u64, but not once in bytes
        f"drm-memory-gtt:\t{u64_max // 1024} KiB\n"
        f"drm-maxfreq-gfx:\t{u64_max} MHz\n"
        f"drm-engine-capacity-gfx:\t{'1' * 30}\n"
    )
    assert s.client_id is None
    assert dict(s.engine_ns) == {"dma": u64_max}
    assert dict(s.resident) == {"gtt": u64_max // 1024 * 1024}
    assert dict(s.maxfreq_hz) == {} and dict(s.engine_capacity) == {}
    assert s.malformed == 8
