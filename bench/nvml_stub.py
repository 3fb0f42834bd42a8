"""A stand-in libnvidia-ml.so: the Python side of NVML calls, measured without a GPU.

``load(gpus=1, nvlinks=0, processes=0)`` compiles a small C library (``cc`` must be on
PATH) whose every NVML entry point that nvidia-ml-py knows returns NVML_SUCCESS at
once, and points the installed ``pynvml`` at it. The driver's own time is then zero,
so what a benchmark measures is nvidia-ml-py's ctypes marshalling plus the exporter's
own Python: exactly the part issue 13 says is ours. Outputs are zeros except where a
zero would stop the code path being measured: the GPU count, handles, UUID and PCI bus
id, field values (SUCCESS, an unsigned long long, NVML's timestamp), NVLink state
(``nvlinks`` active links, the rest INVALID_ARGUMENT; 0 = NOT_SUPPORTED, as on the
single-GPU lease), ECC counters (dram and sram only, as on an H100), the process
lists (``processes`` entries), GPM (supported, as on Hopper: every metric 0) and the
event set (always TIMEOUT: no XID).

Entry-point names come from the installed nvidia-ml-py's source, so the stub always
covers the binding in use. Layouts written here: nvmlFieldValue_t (fieldId, scopeId,
timestamp, latencyUsec, valueType, nvmlReturn, value: 40 bytes), nvmlProcessInfo_t
(pid, usedGpuMemory, gpuInstanceId, computeInstanceId: 24 bytes) and nvmlPciInfo_t
(busId at byte 36), as in nvml.h and nvidia-ml-py's c_nvml* structures.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SPECIAL = """
#include <stdio.h>
#include <string.h>
#include <time.h>
typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec;
                 unsigned valueType; int nvmlReturn; unsigned long long value; } fv_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
static long long now_us(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
                                return t.tv_sec * 1000000LL + t.tv_nsec / 1000; }
int nvml_ok(void) { return 0; }
const char *nvmlErrorString(int r) { (void)r; return "stub"; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = GPUS; return 0; }
int nvmlDeviceGetCount(unsigned *n) { *n = GPUS; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetHandleByIndex(unsigned i, void **h) { *h = (void *)(long)(i + 1); return 0; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { snprintf(b, n, "000.00.00"); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) {
    snprintf(b, n, "GPU-stub-%04ld", (long)h); return 0; }
int nvmlDeviceGetPciInfo_v3(void *h, char *p) {
    snprintf(p + 36, 32, "00000000:%02lX:00.0", 0x17 + (long)h); return 0; }
int nvmlDeviceGetFieldValues(void *h, int n, fv_t *v) {
    (void)h; long long t = now_us();
    for (int i = 0; i < n; i++) { v[i].timestamp = t; v[i].valueType = 3; v[i].nvmlReturn = 0;
                                  v[i].value = 0; }
    return 0; }
int nvmlDeviceGetNvLinkState(void *h, unsigned link, unsigned *on) {
    (void)h; if (NVLINKS == 0) return 3; if (link >= NVLINKS) return 2; *on = 1; return 0; }
int nvmlDeviceGetMemoryErrorCounter(void *h, int t, int c, int loc, unsigned long long *n) {
    (void)h; (void)t; (void)c; if (loc != 2 && loc != 7) return 3; *n = 0; return 0; }
static int procs(unsigned *count, proc_t *p) {
    if (p == NULL || *count < PROCS) { *count = PROCS; return PROCS ? 7 : 0; }
    for (unsigned i = 0; i < PROCS; i++) { p[i].pid = 4000000 + i; p[i].used = (i + 1) << 26;
                                           p[i].gi = p[i].ci = 0xFFFFFFFF; }
    *count = PROCS; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
    (void)h; return procs(c, p); }
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
    (void)h; *c = 0; (void)p; return 0; }
int nvmlDeviceGetMPSComputeRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
    (void)h; *c = 0; (void)p; return 0; }
int nvmlDeviceGetProcessUtilization(void *h, void *s, unsigned *c, unsigned long long t) {
    (void)h; (void)s; (void)c; (void)t; return 6; }
int nvmlGpmQueryDeviceSupport(void *h, unsigned *s) { (void)h; s[1] = 1; return 0; }
int nvmlEventSetWait_v2(void *s, void *d, unsigned ms) { (void)s; (void)d; (void)ms; return 10; }
"""


def _names(pynvml: Any) -> set[str]:
    source = Path(pynvml.__file__).read_text()
    return set(re.findall(r'_nvmlGetFunctionPointer\("(nvml\w+)"\)', source))


def build(pynvml: Any, gpus: int, nvlinks: int, processes: int) -> Path:
    special = (SPECIAL.replace("GPUS", str(gpus)).replace("NVLINKS", str(nvlinks))
               .replace("PROCS", f"{processes}u"))
    defined = set(re.findall(r"\b(nvml\w+)\(", special))
    aliases = "".join(f'int {n}(void) __attribute__((alias("nvml_ok")));\n'
                      for n in sorted(_names(pynvml) - defined))
    out = Path(tempfile.mkdtemp(prefix="nvml-stub-"))
    (out / "stub.c").write_text(special + aliases)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out / "libnvidia-ml.so.1"),
                    str(out / "stub.c")], check=True)
    return out / "libnvidia-ml.so.1"


def load(gpus: int = 1, nvlinks: int = 0, processes: int = 0) -> Any:
    """The installed pynvml, bound to a fresh stub library; call before nvmlInit."""
    import pynvml

    pynvml.nvmlLib = ctypes.CDLL(str(build(pynvml, gpus, nvlinks, processes)))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml
