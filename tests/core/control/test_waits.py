"""What a run not launched yet waits for is made when it is read: figures a pass wrote are
aged to now (an offline node's silence), a placement not started says since when, a backoff
counts down to its real end. Pure: records in, words out."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from orbit.core.control.waits import reason, wait_of
from orbit.model.models import RunState
from orbit.model.records import AttemptRecord

AT = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def attempt(**fields: object) -> AttemptRecord:
    base: dict[str, object] = {
        "id": "run-1-2",
        "run_id": "run-1",
        "number": 2,
        "state": RunState.PREPARED,
        "reason": None,
        "target": None,
        "backend_key": "agent_pool_host_process",
        "trigger": "auto_retry",
        "handle": None,
        "exit_code": None,
        "message": "0/1 nodes fit: 1 offline 12.8 s",  # what a pass wrote long ago
        "cancel_requested": False,
        "created_at": AT - timedelta(minutes=5),
        "updated_at": AT - timedelta(minutes=5),
        "started_at": None,
        "finished_at": None,
    }
    return AttemptRecord.model_validate(base | fields)


def decision(outcome: str, decided_s_ago: float, **record: object) -> dict[str, object]:
    body = {"run": "run-1", "attempt": "run-1-2", "outcome": outcome, "waited_s": 0.0}
    body |= record
    return {
        "run_id": "run-1",
        "attempt_id": "run-1-2",
        "outcome": outcome,
        "tier": "normal",
        "position": 1,
        "body": json.dumps(body),
        "at": AT - timedelta(seconds=decided_s_ago),
    }


OFFLINE = {
    "nodes_total": 1,
    "alternatives": [
        {"counts": {"offline": 1}, "nodes": [{"node": "gpu-b", "reason": "offline", "used": 12.8}]}
    ],
}


def test_an_offline_node_is_said_as_silent_for_as_long_as_it_is_now() -> None:
    wait = wait_of(attempt(), decision("waiting", 60, **OFFLINE), AT)
    assert wait is not None and wait.kind == "room"
    assert reason(wait, AT) == "waits for room: 0/1 nodes fit: 1 offline 72.8 s"


def test_a_placement_not_started_says_so_and_since_when_never_a_backoff() -> None:
    chosen = {"chosen": {"nodes": [{"node": "gpu-b", "gpus": [0]}], "alternative": 0}}
    wait = wait_of(
        attempt(not_before=AT - timedelta(seconds=1)), decision("placed", 30, **chosen), AT
    )
    assert wait is not None
    assert reason(wait, AT) == "placed on gpu-b gpu 0 30s ago, not started yet"
    # what holds the start, where the launch said so
    held = (
        "placed on gpu-b: waiting for attempt 1's files (its checkpoint) to reach the control plane"
    )
    wait = wait_of(attempt(message=held), decision("placed", 30, **chosen), AT)
    assert wait is not None and reason(wait, AT) == f"{held} (placed 30s ago)"


def test_a_backoff_counts_down_to_its_real_end_and_a_quota_is_named() -> None:
    wait = wait_of(attempt(not_before=AT + timedelta(seconds=17)), None, AT)
    assert wait is not None and reason(wait, AT) == "starts in 17s (auto_retry backoff)"
    assert reason(wait, AT + timedelta(seconds=20)) == "due now (auto_retry backoff)"
    quota = {
        "alternatives": [
            {"quota": {"scope": "user", "name": "mia", "used": 8, "limit": 8, "asked": 1}}
        ]
    }
    wait = wait_of(attempt(), decision("waiting", 5, **quota), AT)
    assert wait is not None and wait.kind == "quota"
    assert reason(wait, AT) == "waits for its quota: user mia holds 8 of 8 gpus, asks 1"
