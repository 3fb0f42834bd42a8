"""``--slurm.job-mapping-dir``: which Slurm jobs hold each GPU, as a join series.

The layout is dcgm-exporter's HPC job mapping (NVIDIA/dcgm-exporter
``internal/pkg/transformation/hpc.go``, commit b14e7f8892bb, its HPC job mapping dir):
one regular file per GPU, named by the GPU's index (a decimal number; other names are
skipped), holding the ids of the jobs on it, one per line. A Slurm prolog writes the
file and the epilog removes it. dcgm-exporter copies every series once per job; we
serve ``gpu_slurm_job_info{gpu, uuid, job} 1`` instead, one series per GPU and job, for
joins (``* on(gpu, instance) group_left(job) gpu_slurm_job_info``), so a job never
multiplies the GPU's series. The file name is matched to our ``gpu`` label, as
dcgm-exporter matches it to its own: on a node whose GPUs are of one vendor, both are
the GPUs' PCI order (NVML's and CUDA's ``PCI_BUS_ID`` order).

The ``slurm`` backend re-lists the directory on the slow tier (``--collector.slow-interval``)
and re-reads a file only when its mtime, size or inode changed, so files appearing, changing
and vanishing are followed without a restart. An absent directory (no job has run
yet) serves nothing and is logged once; a file that cannot be read or is too large is
counted (``unreadable``) and serves nothing.

Bounds: at most MAX_JOBS_PER_GPU jobs per GPU, the first ones of the file; the ids left
out are counted on each scan (``jobs_over_cap``), so one runaway file costs 64 series, not
thousands. A file name is a GPU index written as Python's ``str(int)`` writes it: ``01``
would name GPU 1 as ``1`` does, and which of the two won depended on the listing order;
such a name is skipped and counted (``noncanonical_name``) on each scan.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import structlog

from exporter.core import untrusted_file
from exporter.core.config import Config
from exporter.core.fieldspec import MetricSpec, Otlp
from exporter.core.joins import Row
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.sources.base import DERIVED, PLAIN, Cycle

log = structlog.get_logger(__name__)

SPEC = MetricSpec("gpu_slurm_job_info",
                  "A Slurm job on this GPU (--slurm.job-mapping-dir, dcgm-exporter's layout); "
                  "value 1.", labels=("gpu", "uuid", "job", "source"), note="Source `slurm`.",
                  otlp=Otlp("gpu.slurm.job", "{info}", labels={"job": "gpu.slurm.job.id"}))
FAMILY, DOC = SPEC.name, SPEC.help
MAX_FILE_BYTES = 64 * 1024
SLURM_FILE = untrusted_file.Kind("Slurm job file", MAX_FILE_BYTES)
MAX_JOB_CHARS = 128
# Jobs served per GPU: 8 GPUs x 64 = 512 series at most. A GPU shared by time-slicing
# or MPS carries a few jobs; more than 64 means a prolog that never cleans up.
MAX_JOBS_PER_GPU = 64
_INDEX = re.compile(r"\d+")
_CANONICAL = re.compile(r"0|[1-9]\d*")


def parse_jobs(text: str) -> tuple[str, ...]:
    """The job ids of one file: non-empty lines, stripped, each once, in file order."""
    jobs: dict[str, None] = {}
    for line in text.splitlines():
        job = line.strip()
        if job and len(job) <= MAX_JOB_CHARS:
            jobs[job] = None
    return tuple(jobs)


def capped(jobs: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
    """The first MAX_JOBS_PER_GPU jobs, and how many were left out."""
    return jobs[:MAX_JOBS_PER_GPU], max(0, len(jobs) - MAX_JOBS_PER_GPU)


class SlurmJobs:
    """The join rows of one scan: ``gpu`` label -> job ids."""

    def __init__(self, jobs: Mapping[str, tuple[str, ...]]) -> None:
        self.jobs = MappingProxyType(dict(jobs))

    def join_rows(self, devices: Sequence[tuple[str, DeviceSample]]) -> Iterable[Row]:
        return [(FAMILY, DOC, {"gpu": gpu, "uuid": d.info.uuid, "job": job, "source": "slurm"})
                for gpu, d in devices if not d.info.parent_key
                for job in self.jobs.get(gpu, ())]


class SlurmBackend:
    name = "slurm"
    source = "slurm"  # it reports no device, only join series
    priority = DERIVED
    capabilities = PLAIN

    def __init__(self, config: Config) -> None:
        self.directory = config.slurm_job_mapping_dir or ""
        self.interval: float | None = config.slow_interval
        # file name -> (mtime, size, inode), (its first jobs, how many left out) or None
        self._files: dict[str, tuple[tuple[int, int, int], tuple[tuple[str, ...], int] | None]] \
            = {}
        self._missing: bool | None = None

    def open(self) -> Sequence[DeviceInfo]:
        return ()

    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        try:
            names = [n for n in os.listdir(self.directory) if _INDEX.fullmatch(n)]
            missing = False
            canonical = [n for n in names if _CANONICAL.fullmatch(n)]
            if len(canonical) < len(names):  # 01 beside (or instead of) 1: skipped
                errors[ErrorReason.NONCANONICAL_NAME] += len(names) - len(canonical)
                names = canonical
        except OSError:
            names, missing = [], True
        if missing != self._missing:
            if missing:
                log.info("Slurm job mapping directory not found; no jobs served",
                         directory=self.directory)
            self._missing = missing
        files = {}
        jobs = {}
        for name in names:
            entry = self._read(name)
            if entry is None:
                continue  # vanished between listdir and stat
            files[name] = entry
            if entry[1] is None:
                errors[ErrorReason.UNREADABLE] += 1
                continue
            kept, dropped = entry[1]
            if dropped:
                errors[ErrorReason.JOBS_OVER_CAP] += dropped
            if kept:
                jobs[name] = kept
        self._files = files
        return Cycle(devices=(), errors=dict(errors), joins=SlurmJobs(jobs))

    def _read(self, name: str
              ) -> tuple[tuple[int, int, int], tuple[tuple[str, ...], int] | None] | None:
        path = os.path.join(self.directory, name)
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        old = self._files.get(name)
        if old is not None and old[0] == stamp:
            return old
        if not os.path.isfile(path):
            return None  # a directory named like a GPU: skipped, as dcgm-exporter does
        if st.st_size > MAX_FILE_BYTES:
            return stamp, None
        try:
            return stamp, capped(parse_jobs(untrusted_file.read_text(  # never waits on a FIFO
                path, SLURM_FILE, errors="replace")))
        except OSError:
            return stamp, None

    def close(self) -> None:
        self._files = {}
