"""Runs by who submitted them and where their current attempt is, on SQLite and PostgreSQL:
an agent node (by name or id, any rank of a gang), an SSH host or cluster (the attempt's
target), and the attempt's node named in its record; on SQLite, read through the indexes."""

from __future__ import annotations

import sqlite3

from orbit.model.auth import token_hash
from orbit.model.models import FailureReason, RunHandle, RunState
from orbit.model.records import RunRecord
from orbit.store import Store
from orbit.store.attempt_states import AutoRetry
from orbit.store.run_queries import RUN_COLUMNS, RUNS_FROM, runs_filter
from orbit.store.schema import alembic_engine
from tests.helpers import a_request, a_submission
from tests.store.test_audit_chain import migrate_to


def run(store: Store, experiment: str, actor: str, target: str | None, key: str) -> RunRecord:
    return store.runs.create_run(
        experiment_id=experiment, task_type="command", template_id="t",
        bundle_digest="0" * 64, submission=a_submission(),
        request=a_request(key, target), actor=actor,
    )  # fmt: skip


def test_runs_are_found_by_their_user_and_where_their_current_attempt_is(store: Store) -> None:
    store.nodes.create_join_token(token_hash("join"), {}, None, "tests")
    a, b = (
        store.nodes.register_node(token_hash("join"), n, {}, 8, {}, token_hash(f"cred-{n}"))
        for n in ("gpu-a", "gpu-b")
    )
    e = store.experiments.create_experiment("e", "tests").id
    mias = run(store, e, "mia", None, "agent_pool_host_process")
    store.placement.assign_attempt(mias.current.id, a.id, {"indices": []}, {"kind": "start"}, "t")
    gang = run(store, e, "ben", None, "agent_pool_host_process")
    ranks = [(a.id, {"indices": []}, {"kind": "start"}), (b.id, {"indices": []}, {"kind": "start"})]
    assert store.placement.assign_gang(gang.current.id, ranks, "t") is not None
    rented = run(store, e, "mia", "h100-a", "ssh_host_process")
    moved = run(store, e, "ben", None, "agent_pool_host_process")  # was on gpu-b, retried
    store.placement.assign_attempt(moved.current.id, b.id, {"indices": []}, {"kind": "start"}, "t")
    store.attempts.move_attempt(
        moved.current.id, RunState.FAILED, actor="t", reason=FailureReason.NODE_LOST
    )
    store.runs.add_attempt(
        moved.id, target="h100-a", backend_key="ssh_host_process", trigger="retry", actor="t"
    )

    def found(**filters: str) -> set[str]:
        listed = {r.id for r in store.runs.list_runs(**filters)}  # type: ignore[arg-type]
        assert store.runs.count_runs(**filters) == len(listed)  # type: ignore[arg-type]
        return listed

    assert found(user="mia") == {mias.id, rented.id}
    assert found(node="gpu-a") == {mias.id, gang.id}
    assert found(node=a.id) == {mias.id, gang.id}
    assert found(node="gpu-b") == {gang.id}  # rank 1 there; `moved` is elsewhere now
    assert found(node="h100-a") == {rented.id, moved.id}
    assert found(node="h100-a", user="ben") == {moved.id}
    assert found(node="nowhere") == set()
    shown = {r.id: r.current for r in store.runs.list_runs()}
    assert shown[mias.id].where == "gpu-a" and shown[gang.id].where == "gpu-a+gpu-b"
    assert shown[moved.id].where == "h100-a" and store.runs.get_run(mias.id).current.node == "gpu-a"


def test_the_filters_read_through_indexes(store: Store) -> None:
    if not store.url.startswith("sqlite"):
        return  # PostgreSQL plans by its statistics: an empty table is read whole anyway
    path = store.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        for user, node, states, index in (
            ("mia", None, None, "ix_runs_created_by_created_at"),
            (None, "gpu-a", None, "ix_attempts_target"),
            (None, "gpu-a", None, "ix_attempts_node_id"),
            (None, None, {RunState.FAILED}, "ix_runs_state_created_at"),
        ):
            where, params = runs_filter(None, states, user, node)
            sql = f"SELECT {RUN_COLUMNS} FROM {RUNS_FROM}{where} ORDER BY r.created_at DESC"
            plan = " ".join(str(row) for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            assert index in plan, plan


def test_the_consoles_filters_pages_counts_and_holders(store: Store) -> None:
    e = store.experiments.create_experiment("llama-sft", "tests").id
    other = store.experiments.create_experiment("eval", "tests").id
    made = [run(store, e if i % 2 else other, "mia", None, "local_host_process") for i in range(7)]
    gpus = store.runs.create_run(
        experiment_id=e, task_type="command", template_id="big", bundle_digest="0" * 64,
        submission=a_submission(), actor="ben",
        request=a_request("local_host_process", None, resources={"gpu_count": 2}),
    )  # fmt: skip
    store.attempts.move_attempt(gpus.current.id, RunState.SUBMITTED, actor="t")
    store.attempts.move_attempt(gpus.current.id, RunState.RUNNING, actor="t")
    newest_first = [r.id for r in store.runs.list_runs()]
    assert newest_first[0] == gpus.id and len(newest_first) == 8
    # a run by the start of its id (with or without run-), or an experiment by part of its name
    target = made[3].id
    assert {r.id for r in store.runs.list_runs(text=target[4:10])} == {target}
    assert {r.id for r in store.runs.list_runs(text=target[:10])} == {target}
    assert len(store.runs.list_runs(text="SFT")) == 4  # 3 of made, and gpus
    assert {r.id for r in store.runs.list_runs(template_id="big")} == {gpus.id}
    # the next page begins after the last run of this one, in the same order
    first = store.runs.list_runs(limit=3)
    last = first[-1]
    after = store.runs.list_runs(limit=10, before=(last.created_at, last.id))
    assert [r.id for r in first + after] == newest_first
    # a count stops where it was asked to
    assert store.runs.count_runs() == 8 and store.runs.count_runs(cap=5) == 6
    # who holds what now: by the attempts in those states
    held = store.runs.holding({RunState.RUNNING, RunState.STARTING})
    assert len(held) == 1 and held[0][:2] == ("ben", "llama-sft")
    assert held[0][2]["resources"]["gpu_count"] == 2


def test_a_listing_by_state_follows_each_runs_current_attempt(store: Store) -> None:
    """runs.state is the current attempt's state through every way an attempt moves or is
    opened: a launch, a move, an end, a retry asked for, one its policy opened; and a store
    upgraded from before the copy existed has it too."""
    e = store.experiments.create_experiment("exp", "tests").id
    one, two, three = (run(store, e, "mia", None, "local_host_process") for _ in range(3))

    def listed(*states: RunState) -> list[str]:
        return [r.id for r in store.runs.list_runs(states=set(states))]

    assert listed(RunState.PREPARED) == [three.id, two.id, one.id]
    moves = store.attempts.move_attempt
    store.attempts.record_launch(one.current.id, RunHandle(
        backend_key="local_host_process", target="localhost", location="/tmp/x",
        attempt_id=one.current.id,
    ), actor="t")  # fmt: skip
    assert listed(RunState.SUBMITTED) == [one.id]
    moves(one.current.id, RunState.RUNNING, actor="t")
    moves(one.current.id, RunState.FAILED, actor="t", reason=FailureReason.TASK_EXIT_NONZERO)
    assert (
        listed(RunState.FAILED) == [one.id] and store.runs.count_runs(states={RunState.FAILED}) == 1
    )
    store.runs.add_attempt(
        one.id, target=None, backend_key="local_host_process", trigger="retry", actor="t"
    )  # a retry: prepared again
    assert listed(RunState.FAILED) == [] and listed(RunState.PREPARED)[-1] == one.id
    # an end whose policy opens the next attempt in the same transaction
    moves(two.current.id, RunState.SUBMITTED, actor="t")
    moves(two.current.id, RunState.RUNNING, actor="t")
    moves(
        two.current.id, RunState.FAILED, actor="t", reason=FailureReason.TASK_EXIT_NONZERO,
        retry=AutoRetry(event={"retry": 1}),
    )  # fmt: skip
    assert two.id in listed(RunState.PREPARED) and listed(RunState.FAILED) == []
    moves(three.current.id, RunState.TERMINATED, actor="t", reason=FailureReason.CANCELLED)
    assert listed(RunState.TERMINATED, RunState.PREPARED) == [three.id, two.id, one.id]
    # a store from before runs.state: the copy is made from each run's current attempt
    engine = alembic_engine(store.url)
    try:
        migrate_to(engine, "0014", down=True)
    finally:
        engine.dispose()
    store.close()
    again = Store(store.url)
    try:
        assert [r.id for r in again.runs.list_runs(states={RunState.TERMINATED})] == [three.id]
        assert again.runs.count_runs(states={RunState.PREPARED}) == 2
    finally:
        again.close()
