"""--slurm.job-mapping-dir: the per-GPU job cap and GPU index names, on real directory trees.

The files are written here as a Slurm prolog writes them (one per GPU index, a job id per
line); the expected jobs are read back from those same lines, not from the code under test.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from exporter.attribution import slurm
from exporter.attribution.slurm import SlurmBackend
from exporter.core.config import Config
from tests.daemon import FIXTURES, machine_args, running, values_of

RUNAWAY = 9300  # as found: one 64 KiB mapping file gave 9,300 series on one GPU


def backend(directory: Path) -> SlurmBackend:
    return SlurmBackend(Config(slurm_job_mapping_dir=str(directory)))


def runaway(directory: Path, name: str) -> list[str]:
    jobs = [str(100000 + n) for n in range(RUNAWAY)]
    text = "".join(f"{job}\n" for job in jobs)
    assert len(text) <= 64 * 1024  # under the file size cap: every line is read
    (directory / name).write_text(text)
    return text.split()


def test_jobs_per_gpu_are_capped_and_the_rest_counted(tmp_path: Path) -> None:
    lines = runaway(tmp_path, "0")
    (tmp_path / "1").write_text("4242\n4243\n")
    b = backend(tmp_path)
    cycle = b.sample(slow=True)
    jobs = dict(cycle.joins.jobs)
    assert getattr(slurm, "MAX_JOBS_PER_GPU", None) == 64  # as documented
    assert jobs["0"] == tuple(lines[:64])  # the first ones of the file, in its order
    assert jobs["1"] == ("4242", "4243")  # a GPU under the cap: untouched
    assert cycle.errors == {"jobs_over_cap": RUNAWAY - 64}
    assert b.sample(slow=True).errors == {"jobs_over_cap": RUNAWAY - 64}  # every scan, cached


def test_a_leading_zero_name_is_skipped_and_counted_whatever_the_order(tmp_path: Path) -> None:
    """Files `01` and `1` both named GPU 1 and the last listed won."""
    for order in (("1", "01"), ("01", "1")):
        directory = tmp_path / "-".join(order)
        directory.mkdir()
        for name in order:
            (directory / name).write_text(f"job-from-{name}\n")
        (directory / "00").write_text("job-from-00\n")
        b = backend(directory)
        cycle = b.sample(slow=True)
        assert dict(cycle.joins.jobs) == {"1": ("job-from-1",)}, order
        assert cycle.errors == {"noncanonical_name": 2}
    only = tmp_path / "only"
    only.mkdir()
    (only / "01").write_text("x\n")  # alone: still not GPU 1
    b = backend(only)
    cycle = b.sample(slow=True)
    assert cycle.errors == {"noncanonical_name": 1}
    assert dict(cycle.joins.jobs) == {}


def test_a_fifo_named_like_a_gpu_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "2")
    (tmp_path / "3").write_text("77\n")
    b = backend(tmp_path)
    done = threading.Event()

    cycles = []

    def scan() -> None:
        cycles.append(b.sample(slow=True))
        done.set()

    threading.Thread(target=scan, daemon=True).start()
    assert done.wait(10), "sample() waits on the FIFO"
    assert dict(cycles[0].joins.jobs) == {"3": ("77",)}


@pytest.mark.slow
def test_the_daemon_serves_at_most_the_cap_and_counts_the_rest(tmp_path: Path) -> None:
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    lines = runaway(slurm, "1")
    (slurm / "01").write_text("999\n")
    machine = FIXTURES / "mixed"
    with running([*machine_args(machine), "--slurm.job-mapping-dir", str(slurm)], tmp_path,
                 nvml_json=machine / "nvml.json") as d:
        text = d.get().text
    served = {s.split('job="')[1].split('"')[0] for s in text.splitlines()
              if s.startswith("gpu_slurm_job_info{") and 'gpu="1"' in s}
    assert served == set(lines[:64])
    assert not [s for s in text.splitlines() if s.startswith("gpu_slurm_job_info{")
                and 'gpu="1"' not in s]
    assert values_of(text, "gpu_exporter_collection_errors_total", backend="slurm",
                     reason="jobs_over_cap")[0] >= RUNAWAY - 64
    assert values_of(text, "gpu_exporter_collection_errors_total", backend="slurm",
                     reason="noncanonical_name")[0] >= 1
