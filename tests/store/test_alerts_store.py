"""Alerts in the store, on SQLite and PostgreSQL: one open alert per key however often (and by
however many replicas) a firing condition is synced, resolved once it stops firing and raised
anew if it fires again; and the runs the conditions read: those waiting to be placed, and
those still going on more attempts than allowed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orbit.model.alerts import AlertsConfig, Firing
from orbit.model.models import (
    ExecutionRequest,
    FailureReason,
    LaunchMode,
    Placement,
    RunState,
    TaskSubmission,
)
from orbit.server.alerts.conditions import run_alerts
from orbit.store import Store


def firing(key: str) -> Firing:
    return Firing(
        key=key, kind="node_offline", severity="critical", objects={"node": key},
        message=f"{key}: no word", remedy=f"orbit nodes drain {key}",
    )  # fmt: skip


def test_one_open_alert_per_key_resolved_when_it_stops_and_raised_anew(store: Store) -> None:
    raised, resolved = store.alerts.sync([firing("a"), firing("b")])
    assert [a.key for a in raised] == ["a", "b"] and resolved == []
    other_replica = Store(store.db.url)  # a second server on the same store
    try:
        assert other_replica.alerts.sync([firing("a"), firing("b")]) == ([], [])  # no news
    finally:
        other_replica.close()
    raised, resolved = store.alerts.sync([firing("a")])
    assert raised == [] and [a.key for a in resolved] == ["b"] and resolved[0].resolved_at
    raised, _ = store.alerts.sync([firing("a"), firing("b")])
    assert [a.key for a in raised] == ["b"]  # fires again: a new alert
    assert [a.key for a in store.alerts.list_alerts()] == ["b", "a"]
    assert len(store.alerts.list_alerts(include_resolved=True)) == 3
    acked = store.alerts.acknowledge(raised[0].id, "ann")
    assert acked.acked_by == "ann" and acked.acked_at is not None
    actions = [e.action for e in store.audit.list_events()]
    assert actions.count("alert.raised") == 3 and actions.count("alert.resolved") == 1


def test_the_runs_the_conditions_read(store: Store) -> None:
    experiment = store.experiments.create_experiment("llm", "ann")
    request = ExecutionRequest(
        template_id="pool", placement=Placement(kind="agent_pool"),
        launch_mode=LaunchMode(kind="host_process"), target=None, detach=True,
        resources={"gpu_count": 1}, runtime_env={}, stop_grace_s=10,
    )  # fmt: skip
    submission = TaskSubmission(
        experiment_id=experiment.id, task_type="command", task_request={"command": "true"},
        template_id="pool",
    )  # fmt: skip

    def make() -> str:
        return store.runs.create_run(
            experiment_id=experiment.id, task_type="command", template_id="pool",
            bundle_digest="0" * 64, submission=submission, request=request, actor="ann",
        ).id  # fmt: skip

    waiting, retried = make(), make()
    for _ in range(3):  # attempts 2, 3 and 4, each after the one before ended
        current = store.runs.get_run(retried).current
        store.attempts.move_attempt(
            current.id, RunState.FAILED, actor="orbit", reason=FailureReason.LAUNCH_FAILED
        )
        store.runs.add_attempt(retried, target=None, backend_key="agent_pool_host_process",
                               trigger="auto_retry", actor="orbit")  # fmt: skip
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert {r for r, _, _ in store.alerts.waiting_runs(later)} == {waiting, retried}
    assert store.alerts.retried_runs(3) == [(retried, "ann", 4)]
    assert store.alerts.retried_runs(4) == []
    fired = run_alerts(
        store.alerts.waiting_runs(later), store.alerts.retried_runs(3),
        later + timedelta(hours=2), AlertsConfig(run_waiting_s=3600, retries_over=3),
    )  # fmt: skip
    keys = sorted(f.key for f in fired)
    assert keys == sorted([f"run-waiting:{waiting}", f"run-waiting:{retried}",
                           f"run-retried:{retried}"])  # fmt: skip
    retry = next(f for f in fired if f.kind == "run_retried")
    assert retry.message == f"{retried} of ann is on attempt 4 (over 3)"
    assert (
        retry.remedy == f"see what failed: orbit inspect {retried}; stop it: orbit cancel {retried}"
    )
