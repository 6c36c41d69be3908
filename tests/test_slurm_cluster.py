"""The CI cluster itself: real sbatch/squeue against the node .ci/slurm-up made, fake GPUs scheduled."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.slurm_kit import Cluster, squeue_named


def test_fake_gpus_are_scheduled_and_oversized_jobs_refused(slurm_cluster: Cluster, tmp_path: Path) -> None:
    gpus = slurm_cluster.gpus
    assert gpus >= 1, "slurm-up gives the node fake GPUs"
    name = f"kit-{time.time_ns()}"  # unique: squeue keeps ended jobs for MinJobAge, across sessions
    out = tmp_path / "out.txt"
    job = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--gpus-per-node={gpus}", f"--output={out}",
                          "--wrap", "echo $CUDA_VISIBLE_DEVICES"], capture_output=True, text=True, check=True)
    assert job.stdout.strip().isdigit()
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert out.read_text().strip() == ",".join(str(i) for i in range(gpus))
    assert len(squeue_named(name)) == 1
    too_many = subprocess.run(["sbatch", "--test-only", f"--gpus-per-node={gpus + 1}", "--wrap", "true"],
                              capture_output=True, text=True)
    assert too_many.returncode != 0 and "not available" in too_many.stderr
