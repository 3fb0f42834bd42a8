"""exporter.sources.kernel.perf: the struct layout against the real uapi header, the syscall on
this machine's real kernel (a software event), and counter groups against the fake."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.sources.kernel import perf
from tests.fakes.fake_perf import FakePerf

HEADER = Path("/usr/include/linux/perf_event.h")
FLAGS_AFTER = "read_format"  # the bit-field word has no offsetof: it follows read_format


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not HEADER.exists():
        if os.environ.get("CI"):
            pytest.fail("cc and linux-libc-dev are installed by .ci/run")
        pytest.skip("needs cc and <linux/perf_event.h> (Debian: linux-libc-dev)")
    return cc


@pytest.mark.slow
def test_perf_event_attr_matches_the_uapi_header(tmp_path: Path) -> None:
    names = [n for n, _ in perf.PerfEventAttr._fields_ if n != "flags"]
    lines = [f'printf("{n} %zu\\n", offsetof(struct perf_event_attr, {n}));' for n in names]
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <linux/perf_event.h>\n"
        "int main(void) {\n" + "\n".join(lines) +
        '\nprintf("sizeof %zu\\n", sizeof(struct perf_event_attr));\n'
        'printf("PERF_FORMAT_GROUP %d\\n", PERF_FORMAT_GROUP);\n'
        'printf("PERF_FORMAT_TOTAL_TIME_ENABLED %d\\n", PERF_FORMAT_TOTAL_TIME_ENABLED);\n'
        'printf("PERF_FLAG_FD_CLOEXEC %lu\\n", PERF_FLAG_FD_CLOEXEC);\n'
        'printf("PERF_TYPE_SOFTWARE %d\\n", PERF_TYPE_SOFTWARE);\n'
        'printf("PERF_COUNT_SW_TASK_CLOCK %d\\n", PERF_COUNT_SW_TASK_CLOCK);\n'
        "return 0; }\n")
    binary = tmp_path / "layout"
    built = subprocess.run([_compiler(), "-o", str(binary), str(source)], capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr
    c = dict(line.split() for line in subprocess.check_output([binary], text=True).splitlines())
    for name in names:
        assert int(c[name]) == getattr(perf.PerfEventAttr, name).offset, name
    assert perf.PerfEventAttr.flags.offset == int(c[FLAGS_AFTER]) + 8
    # The header may be newer (config3, 136 bytes): ours is then an older ABI version.
    assert int(c["sizeof"]) >= ctypes.sizeof(perf.PerfEventAttr) == 128
    assert int(c["PERF_FORMAT_GROUP"]) == perf.PERF_FORMAT_GROUP
    assert int(c["PERF_FORMAT_TOTAL_TIME_ENABLED"]) == perf.PERF_FORMAT_TOTAL_TIME_ENABLED
    assert int(c["PERF_FLAG_FD_CLOEXEC"]) == perf.PERF_FLAG_FD_CLOEXEC
    assert int(c["PERF_TYPE_SOFTWARE"]) == perf.PERF_TYPE_SOFTWARE
    assert int(c["PERF_COUNT_SW_TASK_CLOCK"]) == perf.PERF_COUNT_SW_TASK_CLOCK


def test_task_clock_on_the_real_kernel() -> None:
    """The wrapper against this machine's kernel: a task clock group of this process
    (excluding the kernel, which perf_event_paranoid 2 allows without any capability)."""
    attr = perf.counting_attr(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK,
                              perf.PERF_FORMAT_GROUP | perf.PERF_FORMAT_TOTAL_TIME_ENABLED,
                              perf.FLAG_EXCLUDE_KERNEL | perf.FLAG_EXCLUDE_HV)
    try:
        fd = perf.LIBC.open(attr, 0, -1, -1, perf.PERF_FLAG_FD_CLOEXEC)
    except OSError as exc:
        pytest.skip(f"perf_event_open refused here ({errno.errorcode.get(exc.errno or 0)}: "
                    "seccomp or perf_event_paranoid 3); the fake covers the logic")
    group = perf.CounterGroup(perf.LIBC, [fd], [0])
    try:
        first = group.read()
        sum(i * i for i in range(200_000))  # burn some CPU time
        second = group.read()
    finally:
        group.close()
    assert len(second.values) == 1
    assert second.time_enabled_ns > first.time_enabled_ns > 0
    assert second.values[0] > first.values[0]  # ns of CPU this thread ran
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF


def test_a_real_error_is_an_oserror_with_its_errno() -> None:
    """A sampling period on a counting-only request is still a valid call; a PMU type no
    kernel has is not: ENOENT from the real syscall, raised as OSError."""
    attr = perf.counting_attr(0x7FFFFFF0, 0)
    with pytest.raises(OSError) as refused:
        perf.LIBC.open(attr, -1, 0, -1, perf.PERF_FLAG_FD_CLOEXEC)
    assert refused.value.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSYS)


def fake(**pmu: object) -> FakePerf:
    counters = {"0x0": [0, 5], "0x1000": [100, 1], "0x2000": [7, 0]}
    return FakePerf({"pmus": {"12": {"counters": counters, **pmu}}})


def test_group_reads_every_member_together() -> None:
    kernel = fake()
    group, failed = perf.open_group(kernel, 12, [0x0, 0x1000, 0x2000], cpu=3)
    assert failed == {} and group.opened == [0, 1, 2]
    assert {cpu for _, _, cpu in kernel.opens} == {3}
    assert group.read() == perf.GroupRead(1_000_000_000, (5, 101, 7))
    assert group.read() == perf.GroupRead(2_000_000_000, (10, 102, 7))
    group.close()
    assert kernel.open_fds == set()


def test_a_missing_leader_hands_the_lead_to_the_next_event() -> None:
    kernel = fake()
    group, failed = perf.open_group(kernel, 12, [0x9999, 0x1000, 0x7777, 0x0], cpu=0)
    assert failed == {0: errno.ENOENT, 2: errno.ENOENT}
    assert group.opened == [1, 3]
    assert group.read().values == (101, 5)


def test_permission_is_raised_at_once_and_nothing_stays_open() -> None:
    kernel = fake(open_errno="EACCES")
    with pytest.raises(OSError) as denied:
        perf.open_group(kernel, 12, [0x0, 0x1000], cpu=0)
    assert denied.value.errno == errno.EACCES
    assert kernel.attempts == 1 and kernel.open_fds == set()


def test_nothing_opened_raises_the_kernels_answer() -> None:
    with pytest.raises(OSError) as none:
        perf.open_group(fake(), 99, [0x0], cpu=0)
    assert none.value.errno == errno.ENOENT


def test_a_short_read_is_a_value_error_not_garbage() -> None:
    class Short(FakePerf):
        def read(self, fd: int, size: int) -> bytes:
            return super().read(fd, size)[:-8]

    kernel = Short({"pmus": {"12": {"counters": {"0x0": [0, 1], "0x1000": [0, 1]}}}})
    group, _ = perf.open_group(kernel, 12, [0x0, 0x1000], cpu=0)
    with pytest.raises(ValueError, match="short perf read"):
        group.read()
