"""What Slurm says of one job (squeue while slurmctld remembers it, sacct after, where the
cluster keeps accounting) and what that means for the attempt. The mapping is pure."""

from __future__ import annotations

from dataclasses import dataclass

from orbit.core.execution.slurm.shell import ClusterShell, slurm_message
from orbit.model.errors import Unreachable
from orbit.model.models import FailureReason, RunState

PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ACTIVE = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING"})
ACTIVE |= PENDING | {"SIGNALING", "STAGE_OUT"}

# Slurm's end of a job that the wrapper could not record (killed outright, node gone), or that
# names the cause better than the wrapper's view of a SIGTERM: (state, reason)
ENDINGS: dict[str, tuple[RunState, FailureReason]] = {
    "TIMEOUT": (RunState.TERMINATED, FailureReason.MAX_RUNTIME),
    "DEADLINE": (RunState.TERMINATED, FailureReason.MAX_RUNTIME),
    "PREEMPTED": (RunState.TERMINATED, FailureReason.PREEMPTED),
    "NODE_FAIL": (RunState.TERMINATED, FailureReason.NODE_LOST),
    "BOOT_FAIL": (RunState.FAILED, FailureReason.LAUNCH_FAILED),
    # scancel by someone else (or an admin): the job was taken away, as a preemption is
    "CANCELLED": (RunState.TERMINATED, FailureReason.PREEMPTED),
    "OUT_OF_MEMORY": (RunState.FAILED, FailureReason.TASK_KILLED),
}


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str  # COMPLETED, PENDING, ... ("CANCELLED by 0" is read as CANCELLED)
    reason: str = ""  # why it is pending ("None" when Slurm gives none)
    start: str = ""  # the estimated start of a pending job, when Slurm has one

    @property
    def pending(self) -> bool:
        return self.state in PENDING

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def describe_pending(self) -> str:
        why = self.reason if self.reason and self.reason != "None" else "no reason given yet"
        start = (
            f"; estimated start {self.start.replace('T', ' ')}"
            if self.start and self.start not in ("N/A", "Unknown")
            else ""
        )
        return f"pending in Slurm as job {self.job_id} ({why}){start}"


def parse_squeue(job_id: str, text: str) -> SlurmJob | None:
    """`squeue -h -j ID --states=all -o %T|%r|%S`: one line, or none once it is forgotten."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            return SlurmJob(job_id, parts[0].split()[0], parts[1], parts[2])
    return None


def parse_sacct(job_id: str, text: str) -> SlurmJob | None:
    """`sacct -n -P -X -j ID -o State`: its end, where accounting is kept."""
    for line in text.splitlines():
        if line.strip():
            return SlurmJob(job_id, line.split()[0])
    return None


def look(shell: ClusterShell, job_id: str) -> SlurmJob | None:
    """The job as Slurm has it now; None when neither squeue nor sacct knows it any more.
    Raises Unreachable when slurmctld does not answer (restarting, say): not knowing is not
    the job's end, and the attempt keeps its state as on a host that does not answer."""
    done = shell.run(["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T|%r|%S"])
    if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
        raise Unreachable(
            f"{shell.where}: squeue failed: {slurm_message(done.stderr) or 'no message'}"
        )
    found = parse_squeue(job_id, done.stdout) if done.returncode == 0 else None
    if found is not None:
        return found
    acct = shell.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"])
    return parse_sacct(job_id, acct.stdout) if acct.returncode == 0 else None
