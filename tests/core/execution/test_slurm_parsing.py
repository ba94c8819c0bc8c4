"""The pure parts of the Slurm placement: Slurm's text forms, and its ends mapped onto the closed
set of reasons (the real cluster's tests are in backends/test_slurm_host_process.py)."""

from __future__ import annotations

import pytest

from orbit.core.execution.backends.slurm_host_process import SlurmHostProcessBackend
from orbit.core.execution.slurm.facts import (
    expand_hostlist,
    key_values,
    parse_duration,
    parse_gres,
    parse_nodes_text,
)
from orbit.core.execution.slurm.jobs import SlurmJob, parse_squeue
from orbit.model.models import FailureReason, RunState, RunStatus


def test_gres_time_limits_and_hostlists_are_read_as_slurm_writes_them() -> None:
    assert parse_gres("gpu:a100:2(S:0-1),gpu:v100:1,shard:8") == {"a100": 2, "v100": 1}
    assert parse_gres("gpu:4") == {"": 4} and parse_gres("(null)") == {}
    assert parse_duration("UNLIMITED") is None and parse_duration("infinite") is None
    assert parse_duration("00:05:00") == 300 and parse_duration("5:00") == 300
    assert parse_duration("1-02:00:00") == 93600 and parse_duration("30") == 1800
    assert expand_hostlist("gpu[01-03,07],cpu1") == ("gpu01", "gpu02", "gpu03", "gpu07", "cpu1")
    kv = key_values("NodeName=n1 OS=Linux 6.1 #1 SMP Gres=gpu:h100:8 State=MIXED+DRAIN")
    assert kv["OS"] == "Linux 6.1 #1 SMP" and kv["Gres"] == "gpu:h100:8"
    (node,) = parse_nodes_text(
        "NodeName=n1 CPUTot=64 RealMemory=512000 Gres=gpu:h100:8 State=MIXED+DRAIN "
        "Partitions=gpu,all"
    )
    assert node.gpus == {"h100": 8} and node.state == "MIXED" and node.partitions == ("gpu", "all")


def test_squeue_lines_give_state_reason_and_start() -> None:
    job = parse_squeue("7", "PENDING|Resources|2030-01-01T10:00:00\n")
    assert job is not None and job.pending and job.reason == "Resources"
    assert job.describe_pending() == (
        "pending in Slurm as job 7 (Resources); estimated start 2030-01-01 10:00:00"
    )
    assert parse_squeue("7", "") is None


@pytest.mark.parametrize(
    ("slurm_state", "state", "reason"),
    [
        ("TIMEOUT", RunState.TERMINATED, FailureReason.MAX_RUNTIME),
        ("NODE_FAIL", RunState.TERMINATED, FailureReason.NODE_LOST),
        ("PREEMPTED", RunState.TERMINATED, FailureReason.PREEMPTED),
        ("CANCELLED", RunState.TERMINATED, FailureReason.PREEMPTED),
        ("BOOT_FAIL", RunState.FAILED, FailureReason.LAUNCH_FAILED),
    ],
)
def test_slurms_end_of_a_job_the_wrapper_could_not_record_names_the_reason(
    slurm_state: str, state: RunState, reason: FailureReason
) -> None:
    lost = RunStatus(state=RunState.FAILED, reason=FailureReason.RUNTIME_LOST, message="gone")
    seen = SlurmHostProcessBackend._slurm_reason(lost, SlurmJob("9", slurm_state))
    assert (seen.state, seen.reason) == (state, reason)
    assert seen.message == f"Slurm ended job 9 as {slurm_state}; gone"


def test_what_the_wrapper_knew_is_kept_over_slurms_word() -> None:
    cancelled = RunStatus(state=RunState.TERMINATED, reason=FailureReason.CANCELLED)
    kept = SlurmHostProcessBackend._slurm_reason(cancelled, SlurmJob("9", "CANCELLED"))
    assert kept == cancelled
    exited = RunStatus(state=RunState.FAILED, reason=FailureReason.TASK_EXIT_NONZERO)
    assert SlurmHostProcessBackend._slurm_reason(exited, SlurmJob("9", "FAILED")) == exited


def test_a_wrapper_still_alive_after_slurm_ended_its_job_does_not_keep_the_run_going() -> None:
    """A node set DOWN: Slurm says NODE_FAIL at once, while the node may never kill what ran
    there. The run ends as Slurm said (and is retried per its policy), not running on."""
    from orbit.core.execution.backends.slurm_host_process import _rank_status

    running = {"status": '{"state": "running", "host": "n1"}', "alive": True}
    assert _rank_status(running, SlurmJob("9", "RUNNING")).state is RunState.RUNNING
    assert _rank_status(running, None).state is RunState.RUNNING  # Slurm forgot: files say
    ended = _rank_status(running, SlurmJob("9", "NODE_FAIL"))
    assert (ended.state, ended.reason) == (RunState.FAILED, FailureReason.RUNTIME_LOST)
    seen = SlurmHostProcessBackend._slurm_reason(ended, SlurmJob("9", "NODE_FAIL"))
    assert (seen.state, seen.reason) == (RunState.TERMINATED, FailureReason.NODE_LOST)


def test_only_jobs_with_both_orbit_marks_that_agree_are_read_as_orbits() -> None:
    from orbit.core.execution.slurm.orphans import comment, parse_marked

    ours = comment("r1", "a1", "p1")
    text = "\n".join(
        [
            f"11|RUNNING|{ours}|orbit-a1",
            "12|PENDING|orbit:run=r2,attempt=a2|orbit-a2",  # before planes were marked
            "13|RUNNING|(null)|orbit-a3",  # ORBIT's name, no comment
            f"14|RUNNING|{ours}|orbit-other",  # the marks disagree
            f"15|RUNNING|{ours} extra|orbit-a1",
            "16|RUNNING|orbit:run=r|x,attempt=a|orbit-a",  # a comment holding the separator
            "17|RUNNING||my job",
        ]
    )
    found = [(j.job_id, j.state, j.run_id, j.attempt_id, j.plane) for j in parse_marked(text)]
    assert found == [("11", "RUNNING", "r1", "a1", "p1"), ("12", "PENDING", "r2", "a2", None)]
