"""The CI cluster itself: real sbatch/squeue against the node .ci/slurm-up made, fake GPUs scheduled."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.slurm_kit import ROOT, Cluster, squeue_named


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


def test_a_second_cluster_starts_beside_this_one_over_another_clusters_state(slurm_cluster: Cluster,
                                                                             tmp_path: Path) -> None:
    """Seen on a machine where another single-node cluster had run: slurmctld stopped on "CLUSTER NAME MISMATCH
    ... read 'ci' from the state files in StateSaveLocation" (/var/lib/slurm/slurmctld, every cluster's default),
    and CI went on with every SLURM test skipped. slurm-up keeps its own state, spool, PID files, ports and munge:
    a second one starts beside the session's cluster while the default state location names another cluster."""
    import os

    from tests.slurm_kit import CONF

    foreign = Path("/var/lib/slurm/slurmctld/clustername")
    seeded = not foreign.exists()
    if seeded:
        foreign.parent.mkdir(parents=True, exist_ok=True)
        foreign.write_text("ci")
    root = Path(f"/run/orchestrator-slurm-second-{os.getpid()}")  # the munge and slurm users must reach it
    env = {**os.environ, "SLURM_CI_ROOT": str(root), "SLURM_PIDS_FILE": str(root / "pids"),
           "SLURM_CI_PARTITION": "second"}
    try:
        up = subprocess.run([str(ROOT / ".ci" / "slurm-up")], env=env, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr

        def partitions(conf: Path) -> str:
            return subprocess.run(["sinfo", "-h", "-o", "%P %T"], env={**os.environ, "SLURM_CONF": str(conf)},
                                  capture_output=True, text=True, timeout=30).stdout.split()

        assert partitions(root / "etc" / "slurm.conf") == ["second*", "idle"]
        assert partitions(CONF)[0] == f"{slurm_cluster.partition}*"
        ports = {line.split("=")[0]: line.split("=")[1] for line in (root / "etc" / "slurm.conf").read_text().split()
                 if line.startswith(("SlurmctldPort=", "SlurmdPort="))}
        theirs = {line.split("=")[0]: line.split("=")[1] for line in CONF.read_text().split()
                  if line.startswith(("SlurmctldPort=", "SlurmdPort="))}
        assert not set(ports.values()) & (set(theirs.values()) | {"6817", "6818"}), (ports, theirs)
    finally:
        subprocess.run([str(ROOT / ".ci" / "slurm-down")], env=env, timeout=120, check=False)
        shutil.rmtree(root, ignore_errors=True)
        if seeded:
            foreign.unlink()
