"""The Store on real SQLite and PostgreSQL: migrations, records, the one state-changing function,
the queries, and a race between two processes' worth of stores."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import orbit.store.base as base
from orbit.model.errors import IllegalTransition, InvalidInput, NotFound
from orbit.model.models import FailureReason, Resources, RunState
from orbit.model.records import AttemptRecord, AuditEvent, RunRecord
from orbit.store import Store
from orbit.store.attempt_states import AutoRetry
from orbit.store.schema import HEAD_REVISION
from tests.helpers import a_request, a_submission
from tests.store.raw import query, table_names

S = RunState
ACTOR = "tester"
TABLES = {"experiments", "runs", "attempts", "events", "alembic_version"}


def make_run(store: Store, experiment_id: str, *, digest: str = "d" * 64) -> RunRecord:
    return store.runs.create_run(
        experiment_id=experiment_id,
        task_type="command",
        template_id="local",
        bundle_digest=digest,
        submission=a_submission(),
        request=a_request(target="localhost", resources=Resources(gpu_count=2)),
        actor=ACTOR,
    )


def state_events(store: Store, attempt_id: str) -> list[dict[str, Any]]:
    return [
        e.data
        for e in store.audit.list_events()
        if e.action == "attempt.state" and e.attempt_id == attempt_id
    ]


def drive(store: Store, attempt_id: str, *moves: tuple[RunState, FailureReason | None]) -> None:
    for to, reason in moves:
        assert store.attempts.move_attempt(attempt_id, to, actor=ACTOR, reason=reason)


# --- migrations -------------------------------------------------------------------------------


@pytest.mark.fresh_database
def test_migrations_create_the_tables_and_reopening_is_a_no_op(store_url: str) -> None:
    first = Store(store_url)
    try:
        assert table_names(first) >= TABLES
        assert query(first, "SELECT version_num FROM alembic_version") == [
            {"version_num": HEAD_REVISION}
        ]
        exp = first.experiments.create_experiment("kept", ACTOR)
        make_run(first, exp.id)
    finally:
        first.close()

    for _ in range(2):
        again = Store(store_url)
        try:
            versions = query(again, "SELECT version_num FROM alembic_version")
            assert versions == [{"version_num": HEAD_REVISION}]
            assert table_names(again) >= TABLES
            assert [(e.name, e.run_count) for e in again.experiments.list_experiments()] == [
                ("kept", 1)
            ]
            assert len(again.runs.list_runs()) == 1
        finally:
            again.close()


# --- experiments ------------------------------------------------------------------------------


def test_experiments(store: Store) -> None:
    assert store.experiments.list_experiments() == []
    sft = store.experiments.create_experiment("sft-llama", ACTOR)
    rl = store.experiments.create_experiment("rl.grpo_v2", ACTOR)
    assert sft.id.startswith("exp-") and sft.id != rl.id
    assert sft.run_count == 0
    assert sft.created_at.tzinfo is not None

    with pytest.raises(InvalidInput, match="experiment 'sft-llama' already exists"):
        store.experiments.create_experiment("sft-llama", ACTOR)

    for _ in range(3):
        make_run(store, sft.id)
    make_run(store, rl.id)

    by_name = store.experiments.find_experiment("sft-llama")
    by_id = store.experiments.find_experiment(sft.id)
    assert by_name == by_id
    assert by_name is not None and by_name.id == sft.id and by_name.run_count == 3
    assert by_name.created_at == sft.created_at
    assert store.experiments.get_experiment("rl.grpo_v2").run_count == 1
    assert store.experiments.find_experiment("nope") is None
    with pytest.raises(NotFound, match="unknown experiment 'nope'"):
        store.experiments.get_experiment("nope")

    listed = store.experiments.list_experiments()
    assert [(e.name, e.run_count) for e in listed] == [("sft-llama", 3), ("rl.grpo_v2", 1)]
    created = [e for e in store.audit.list_events() if e.action == "experiment.created"]
    assert [e.data["name"] for e in created] == ["sft-llama", "rl.grpo_v2"]
    assert all(e.actor == ACTOR for e in created)
    # the failed duplicate left nothing behind
    assert len(created) == 2

    # names follow the same rule as everywhere else, on both databases alike
    for bad in ["", "a b", "-lead", ".hidden", "x" * 129, "sft/1", "naïve"]:
        with pytest.raises(InvalidInput, match=r"^experiment name '"):
            store.experiments.create_experiment(bad, ACTOR)
    assert store.experiments.create_experiment("x" * 128, ACTOR).name == "x" * 128
    assert len(store.experiments.list_experiments()) == 3


# --- runs, attempts and the one function that changes a state ---------------------------------


def test_create_run_and_move_attempt(store: Store) -> None:
    exp = store.experiments.create_experiment("e", ACTOR)
    run = make_run(store, exp.id)
    assert run.id.startswith("run-")
    assert run.experiment_name == "e"
    assert run.bundle_digest == "d" * 64
    assert run.submission.task_request == {"command": "true"}
    # the request comes back as the record it went in as, read from its column once
    assert run.request == a_request(target="localhost", resources=Resources(gpu_count=2))
    assert run.request.resources.gpu_count == 2 and run.request.backend_key == "local_host_process"
    assert run.created_by == ACTOR
    assert [a.number for a in run.attempts] == [1]
    first = run.current
    assert first.id == f"{run.id}-1"
    assert first.state is S.PREPARED and run.state is S.PREPARED
    assert (first.reason, first.exit_code, first.finished_at, first.handle) == (None,) * 4
    assert first.target == "localhost" and first.trigger == "submit"
    assert not first.cancel_requested
    assert store.runs.get_run(run.id) == run

    events = store.audit.list_events(run_id=run.id)
    assert [e.action for e in events] == ["run.created", "attempt.created"]
    assert events[0].data["bundle_digest"] == "d" * 64
    assert events[1].attempt_id == first.id and events[1].data["number"] == 1

    aid = first.id
    # an illegal move raises and writes nothing
    with pytest.raises(IllegalTransition):
        store.attempts.move_attempt(aid, S.RUNNING, actor=ACTOR, reason=FailureReason.NODE_LOST)
    assert store.runs.get_attempt(aid).state is S.PREPARED
    assert state_events(store, aid) == []

    assert store.attempts.move_attempt(aid, S.SUBMITTED, actor=ACTOR)
    # the state it is already in: False, no event
    assert store.attempts.move_attempt(aid, S.SUBMITTED, actor=ACTOR) is False
    # backwards is illegal, and nothing is written
    with pytest.raises(IllegalTransition):
        store.attempts.move_attempt(aid, S.PREPARED, actor=ACTOR)
    # a caller that saw another state loses the compare-and-set
    assert store.attempts.move_attempt(aid, S.RUNNING, actor=ACTOR, expect=S.STARTING) is False
    assert store.runs.get_attempt(aid).state is S.SUBMITTED
    assert store.attempts.move_attempt(aid, S.RUNNING, actor=ACTOR, expect=S.SUBMITTED)
    # failing needs a reason
    with pytest.raises(IllegalTransition):
        store.attempts.move_attempt(aid, S.FAILED, actor=ACTOR)
    with pytest.raises(IllegalTransition):
        store.attempts.move_attempt(aid, S.SUCCEEDED, actor=ACTOR, reason=FailureReason.NODE_LOST)
    assert store.attempts.move_attempt(
        aid,
        S.FAILED,
        actor="runtime",
        reason=FailureReason.TASK_EXIT_NONZERO,
        exit_code=3,
        message="exit 3",
    )

    assert state_events(store, aid) == [
        {"from": "prepared", "to": "submitted"},
        {"from": "submitted", "to": "running"},
        {
            "from": "running",
            "to": "failed",
            "reason": "task_exit_nonzero",
            "exit_code": 3,
            "message": "exit 3",
        },
    ]
    ended = store.runs.get_attempt(aid)
    assert ended.state is S.FAILED
    assert ended.reason is FailureReason.TASK_EXIT_NONZERO
    assert (ended.exit_code, ended.message) == (3, "exit 3")
    assert ended.finished_at is not None and ended.finished_at.tzinfo is not None
    assert store.runs.get_run(run.id).state is S.FAILED

    # terminal: nothing moves it again, whatever is asked
    for to in RunState:
        for reason in (None, FailureReason.NODE_LOST, FailureReason.CANCELLED):
            try:
                moved = store.attempts.move_attempt(aid, to, actor=ACTOR, reason=reason)
            except IllegalTransition:
                continue
            assert moved is False and to is S.FAILED
    assert store.runs.get_attempt(aid) == ended
    assert len(state_events(store, aid)) == 3

    with pytest.raises(NotFound, match="unknown attempt"):
        store.attempts.move_attempt("run-nope-1", S.SUBMITTED, actor=ACTOR)


def test_add_attempt_numbers_and_refuses_while_active(store: Store) -> None:
    exp = store.experiments.create_experiment("e", ACTOR)
    run = make_run(store, exp.id)
    with pytest.raises(InvalidInput, match="still prepared"):
        store.runs.add_attempt(
            run.id, target="h", backend_key="ssh_host_process", trigger="retry", actor=ACTOR
        )
    a1 = run.current.id
    drive(store, a1, (S.SUBMITTED, None), (S.RUNNING, None))
    with pytest.raises(InvalidInput, match="still running"):
        store.runs.add_attempt(
            run.id, target="h", backend_key="ssh_host_process", trigger="retry", actor=ACTOR
        )
    drive(store, a1, (S.FAILED, FailureReason.NODE_LOST))

    a2 = store.runs.add_attempt(
        run.id, target="h100-b", backend_key="ssh_host_process", trigger="auto_retry", actor="sched"
    )
    assert (a2.number, a2.id, a2.state) == (2, f"{run.id}-2", S.PREPARED)
    assert (a2.target, a2.backend_key, a2.trigger) == ("h100-b", "ssh_host_process", "auto_retry")
    drive(store, a2.id, (S.TERMINATED, FailureReason.CANCELLED))
    a3 = store.runs.add_attempt(
        run.id, target=None, backend_key="local_host_process", trigger="retry", actor=ACTOR
    )
    assert a3.number == 3

    again = store.runs.get_run(run.id)
    assert [a.number for a in again.attempts] == [1, 2, 3]
    assert [a.state for a in again.attempts] == [S.FAILED, S.TERMINATED, S.PREPARED]
    assert again.current.id == a3.id and again.state is S.PREPARED
    with pytest.raises(NotFound, match="unknown run 'run-nope'"):
        store.runs.add_attempt(
            "run-nope", target=None, backend_key="local_host_process", trigger="retry", actor=ACTOR
        )
    created = [e for e in store.audit.list_events(run_id=run.id) if e.action == "attempt.created"]
    assert [(e.data["number"], e.data["trigger"]) for e in created] == [
        (1, "submit"),
        (2, "auto_retry"),
        (3, "retry"),
    ]


def test_an_end_opens_its_automatic_retry_in_the_same_move(store: Store) -> None:
    """A reader never sees the run ended while its retry is to come, and a process that dies
    after the end cannot lose the retry: both are one transaction. A cancel asked for before
    the end is made opens none; a move that lost its compare-and-set opens none either."""
    exp = store.experiments.create_experiment("e", ACTOR)
    run = make_run(store, exp.id)
    a1 = run.current.id
    drive(store, a1, (S.SUBMITTED, None), (S.RUNNING, None))
    later = base.utcnow()
    retry = AutoRetry(event={"retry": 1, "backoff_s": 5.0}, not_before=later)
    assert store.attempts.move_attempt(
        a1, S.FAILED, actor=ACTOR, reason=FailureReason.NODE_LOST, expect=S.RUNNING, retry=retry
    )
    again = store.runs.get_run(run.id)
    assert [(a.number, a.state, a.trigger) for a in again.attempts] == [
        (1, S.FAILED, "submit"),
        (2, S.PREPARED, "auto_retry"),
    ]
    assert again.current.not_before == later and again.current.lease_owner is None
    assert again.current.target == "localhost"
    actions = [(e.action, e.attempt_id) for e in store.audit.list_events(run_id=run.id)][-3:]
    assert actions == [
        ("attempt.state", a1),
        ("run.auto_retry", a1),
        ("attempt.created", f"{run.id}-2"),
    ]
    # a second process ending the same attempt (it saw it running) loses, and opens nothing
    assert not store.attempts.move_attempt(
        a1, S.FAILED, actor=ACTOR, reason=FailureReason.NODE_LOST, expect=S.RUNNING, retry=retry
    )
    a2 = again.current.id
    claim = ("host:1", later)
    store.attempts.request_cancel(a2, ACTOR)
    assert store.attempts.move_attempt(
        a2,
        S.FAILED,
        actor=ACTOR,
        reason=FailureReason.STAGING_FAILED,
        retry=AutoRetry(launcher=claim),
    )
    assert [a.number for a in store.runs.get_run(run.id).attempts] == [1, 2]


def test_list_runs_filters_on_experiment_and_current_attempt(store: Store) -> None:
    sft = store.experiments.create_experiment("sft", ACTOR)
    rl = store.experiments.create_experiment("rl", ACTOR)
    retried = make_run(store, sft.id)
    drive(
        store,
        retried.current.id,
        (S.SUBMITTED, None),
        (S.RUNNING, None),
        (S.FAILED, FailureReason.NODE_LOST),
    )
    second = store.runs.add_attempt(
        retried.id, target=None, backend_key="local_host_process", trigger="auto_retry", actor="x"
    )
    drive(store, second.id, (S.SUBMITTED, None), (S.RUNNING, None))
    failed = make_run(store, sft.id)
    drive(store, failed.current.id, (S.FAILED, FailureReason.STAGING_FAILED))
    waiting = make_run(store, rl.id)

    def ids(**kw: Any) -> list[str]:
        return [r.id for r in store.runs.list_runs(**kw)]

    assert ids() == [waiting.id, failed.id, retried.id]  # newest first
    assert ids(experiment_id=sft.id) == [failed.id, retried.id]
    assert ids(experiment_id=rl.id) == [waiting.id]
    assert ids(states={S.RUNNING}) == [retried.id]
    assert ids(states={S.FAILED}) == [failed.id]
    assert ids(states={S.FAILED, S.PREPARED}) == [waiting.id, failed.id]
    assert ids(states={S.FAILED}, experiment_id=rl.id) == []
    assert ids(states={S.RUNNING, S.PREPARED}, experiment_id=sft.id) == [retried.id]
    assert ids(states={S.SUCCEEDED}) == []
    assert ids(limit=2) == [waiting.id, failed.id]
    assert ids(states=set()) == ids()
    listed = {r.id: r for r in store.runs.list_runs(states={S.RUNNING})}
    assert [a.state for a in listed[retried.id].attempts] == [S.FAILED, S.RUNNING]

    # count_runs counts what list_runs lists, with the same filters (and no limit)
    assert store.runs.count_runs() == 3
    assert store.runs.count_runs(experiment_id=sft.id) == 2
    assert store.runs.count_runs(states={S.RUNNING}) == 1  # the retried run's first attempt failed
    assert store.runs.count_runs(states={S.FAILED}) == 1
    assert store.runs.count_runs(states={S.FAILED, S.PREPARED}) == 2
    assert store.runs.count_runs(states={S.FAILED}, experiment_id=rl.id) == 0
    assert store.runs.count_runs(states={S.RUNNING, S.PREPARED}, experiment_id=sft.id) == 1
    assert store.runs.count_runs(states=set()) == 3
    assert store.runs.count_runs(experiment_id="exp-unknown") == 0
    for experiment_id in (None, sft.id, rl.id):
        for states in (None, {S.FAILED}, {S.RUNNING, S.PREPARED}, set(S)):
            listed_all = store.runs.list_runs(experiment_id=experiment_id, states=states)
            count = store.runs.count_runs(experiment_id=experiment_id, states=states)
            assert count == len(listed_all), (experiment_id, states)
            assert len(
                store.runs.list_runs(experiment_id=experiment_id, states=states, limit=1)
            ) == min(1, count)


@pytest.fixture
def run_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], None]:
    """Run ids that share prefixes on purpose, in the order given; ids of everything else
    stay random."""
    real = base.new_id

    def use(ids: list[str]) -> None:
        queue = iter(ids)

        def new_id(prefix: str) -> str:
            return next(queue) if prefix == "run" else real(prefix)

        monkeypatch.setattr(base, "new_id", new_id)

    return use


def test_resolve_run_id(store: Store, run_ids: Callable[[list[str]], None]) -> None:
    run_ids(["run-abcd000001", "run-abcd000002", "run-ffff000003"])
    exp = store.experiments.create_experiment("e", ACTOR)
    a, b, f = (make_run(store, exp.id).id for _ in range(3))
    assert (a, b, f) == ("run-abcd000001", "run-abcd000002", "run-ffff000003")
    for ref in (a, "abcd000001"):
        assert store.runs.resolve_run_id(ref) == a
    for ref in ("run-ffff", "ffff", "ffff0", "run-ffff000003"):
        assert store.runs.resolve_run_id(ref) == f
    assert store.runs.get_run("ffff").id == f
    for ref in ("run-abcd", "abcd", "abcd00000"):
        with pytest.raises(InvalidInput) as ambiguous:
            store.runs.resolve_run_id(ref)
        assert str(ambiguous.value) == (
            f"run id '{ref}' is ambiguous: it matches run-abcd000001, run-abcd000002 "
            "(give more characters)"
        )
        with pytest.raises(InvalidInput, match=f"run id '{ref}' is ambiguous"):
            store.runs.get_run(ref)
    # unknown, too short to be a prefix, a pattern, or another case: never a match
    for ref in (
        *("run-0000", "0000", "ff", "run-f", "run-", "", "run-%", "____", "run-abc_"),
        *("ABCD", "run-FFFF", "run-ffff000003x"),
    ):
        with pytest.raises(NotFound, match="unknown run"):
            store.runs.resolve_run_id(ref)


def test_an_ambiguous_prefix_names_five_matches_and_counts_the_rest(
    store: Store, run_ids: Callable[[list[str]], None]
) -> None:
    ids = [f"run-beef{n:06d}" for n in (0, 1, 2, 3, 4, 5, 10, 11)]
    run_ids([*ids, "run-beee000000"])
    exp = store.experiments.create_experiment("e", ACTOR)
    for _ in range(9):
        make_run(store, exp.id)
    with pytest.raises(InvalidInput) as ambiguous:
        store.runs.resolve_run_id("beef")
    assert str(ambiguous.value) == (
        f"run id 'beef' is ambiguous: it matches {', '.join(ids[:5])} and 3 more "
        "(give more characters)"
    )
    with pytest.raises(InvalidInput, match=r"it matches run-beef000010, run-beef000011 \("):
        store.runs.resolve_run_id("run-beef00001")
    assert store.runs.resolve_run_id("beef000011") == ids[7]


def test_list_events_order_filter_and_limit(store: Store) -> None:
    exp = store.experiments.create_experiment("e", ACTOR)
    one = make_run(store, exp.id)
    two = make_run(store, exp.id)
    drive(store, one.current.id, (S.SUBMITTED, None), (S.RUNNING, None))
    store.audit.record_event("alice", "run.note", run_id=two.id, text="hello")
    drive(store, one.current.id, (S.SUCCEEDED, None))
    store.attempts.request_cancel(two.current.id, "bob")

    everything = store.audit.list_events()
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    assert everything[0].action == "experiment.created"

    ones = store.audit.list_events(run_id=one.id)
    assert [e.action for e in ones] == [
        "run.created",
        "attempt.created",
        "attempt.state",
        "attempt.state",
        "attempt.state",
    ]
    assert [e.data.get("to") for e in ones[2:]] == ["submitted", "running", "succeeded"]
    assert all(e.run_id == one.id for e in ones)
    assert [e.at for e in ones] == sorted(e.at for e in ones)
    assert all(e.at.tzinfo is not None for e in ones)

    twos = store.audit.list_events(run_id=two.id)
    assert [(e.actor, e.action) for e in twos] == [
        (ACTOR, "run.created"),
        (ACTOR, "attempt.created"),
        ("alice", "run.note"),
        ("bob", "run.cancel_requested"),
    ]
    assert twos[2].data == {"text": "hello"}
    assert store.runs.get_attempt(two.current.id).cancel_requested

    # limit keeps the newest, still in order
    last2: list[AuditEvent] = store.audit.list_events(run_id=one.id, limit=2)
    assert last2 == ones[-2:]
    assert store.audit.list_events(limit=3) == everything[-3:]
    assert store.audit.list_events(run_id=one.id, limit=100) == ones
    assert store.audit.list_events(run_id="run-unknown") == []


# --- a race -----------------------------------------------------------------------------------


def race(racers: list[Store], act: Callable[[Store, int], Any]) -> list[Any]:
    """Each store, in its own thread, does `act` at the same moment; results or exceptions."""
    barrier = threading.Barrier(len(racers))
    outcomes: list[Any] = []

    def run(store: Store, i: int) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes.append(act(store, i))
        except Exception as exc:  # handed to the main thread
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=(s, i)) for i, s in enumerate(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == len(racers)
    return outcomes


def test_two_stores_race_on_the_same_run(store_url: str) -> None:
    """Two processes' stores both see `running` and both try to fail it: one wins, one event.
    Then both see it failed and both try to retry it: one new attempt, the other refused."""
    setup = Store(store_url)
    racers = [Store(store_url), Store(store_url)]
    reasons = [FailureReason.NODE_LOST, FailureReason.TASK_EXIT_NONZERO]
    try:
        exp = setup.experiments.create_experiment("race", ACTOR)
        for round_ in range(4):
            run = make_run(setup, exp.id)
            aid = run.current.id
            drive(setup, aid, (S.SUBMITTED, None), (S.RUNNING, None))

            moved = race(
                racers,
                lambda store, i, aid=aid: store.attempts.move_attempt(
                    aid, S.FAILED, actor=f"racer-{i}", reason=reasons[i]
                ),
            )
            assert sorted(moved) == [False, True], (round_, moved)
            failed = [e for e in state_events(setup, aid) if e["to"] == "failed"]
            assert len(failed) == 1, failed
            assert failed[0]["from"] == "running"
            ended = setup.runs.get_attempt(aid)
            assert ended.state is S.FAILED
            assert ended.reason is not None and ended.reason.value == failed[0]["reason"]

            added = race(
                racers,
                lambda store, i, run_id=run.id: store.runs.add_attempt(
                    run_id, target=None, backend_key="k", trigger="auto_retry", actor=f"r{i}"
                ),
            )
            won = [a for a in added if isinstance(a, AttemptRecord)]
            lost = [a for a in added if not isinstance(a, AttemptRecord)]
            assert len(won) == 1 and len(lost) == 1, (round_, added)
            assert isinstance(lost[0], InvalidInput), lost
            assert won[0].number == 2
            assert [a.number for a in setup.runs.get_run(run.id).attempts] == [1, 2]
            created = [
                e for e in setup.audit.list_events(run_id=run.id) if e.action == "attempt.created"
            ]
            assert [e.data["number"] for e in created] == [1, 2]
    finally:
        for s in (setup, *racers):
            s.close()
