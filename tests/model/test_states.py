"""The state table, the failure reasons and the retry policy: pure, so checked exhaustively."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit.model.errors import IllegalTransition
from orbit.model.models import (
    TERMINAL_STATES,
    FailureKind,
    FailureReason,
    RetryPolicy,
    RunState,
    RunStatus,
)
from orbit.model.retry import should_retry
from orbit.model.states import ALLOWED, check_move

S = RunState
# The one order every move must follow; the three endings share the last rank.
RANK = {
    S.PREPARED: 0,
    S.SUBMITTED: 1,
    S.PROVISIONING: 2,
    S.STARTING: 3,
    S.RUNNING: 4,
    S.SUCCEEDED: 5,
    S.FAILED: 5,
    S.TERMINATED: 5,
}
NEEDS_REASON = {S.FAILED, S.TERMINATED}
INFRASTRUCTURE = {
    FailureReason.NODE_LOST,
    FailureReason.HOST_UNREACHABLE,
    FailureReason.STAGING_FAILED,
    FailureReason.LAUNCH_FAILED,
    FailureReason.RUNTIME_LOST,
    FailureReason.PREEMPTED,
}
TASK = {FailureReason.TASK_EXIT_NONZERO, FailureReason.TASK_KILLED, FailureReason.MAX_RUNTIME}

states = st.sampled_from(list(RunState))
reasons = st.sampled_from(list(FailureReason))
maybe_reason = st.none() | reasons


def _legal(current: RunState, new: RunState, reason: FailureReason | None) -> bool:
    return new in ALLOWED[current] and (reason is not None) == (new in NEEDS_REASON)


# --- the table --------------------------------------------------------------------------------


def test_table_covers_every_state_and_names_only_states() -> None:
    assert set(ALLOWED) == set(RunState)
    for targets in ALLOWED.values():
        assert targets <= set(RunState)
    assert {S.SUCCEEDED, S.FAILED, S.TERMINATED} == TERMINAL_STATES
    assert {s for s in RunState if s.terminal} == TERMINAL_STATES


def test_every_live_state_can_end_in_every_way() -> None:
    """A short task can start and finish between two looks: no live state is a dead end."""
    for state in RunState:
        if not state.terminal:
            assert ALLOWED[state] >= TERMINAL_STATES, state


def test_forward_path_through_every_state_is_allowed() -> None:
    path = [S.PREPARED, S.SUBMITTED, S.PROVISIONING, S.STARTING, S.RUNNING]
    for current, new in itertools.pairwise(path):
        check_move(current, new, None)
    check_move(S.RUNNING, S.SUCCEEDED, None)


@given(states, states)
def test_allowed_moves_only_go_forward(current: RunState, new: RunState) -> None:
    if new in ALLOWED[current]:
        assert RANK[new] > RANK[current]
    if RANK[new] <= RANK[current]:
        assert new not in ALLOWED[current]


@given(st.sampled_from(sorted(TERMINAL_STATES)), states, maybe_reason)
def test_nothing_ever_leaves_a_terminal_state(
    current: RunState, new: RunState, reason: FailureReason | None
) -> None:
    assert ALLOWED[current] == frozenset()
    with pytest.raises(IllegalTransition):
        check_move(current, new, reason)


@given(states, states, maybe_reason)
def test_check_move_agrees_with_the_table(
    current: RunState, new: RunState, reason: FailureReason | None
) -> None:
    if _legal(current, new, reason):
        check_move(current, new, reason)  # no exception
    else:
        with pytest.raises(IllegalTransition):
            check_move(current, new, reason)


@given(states, states, maybe_reason)
def test_pairs_outside_the_table_are_refused_whatever_the_reason(
    current: RunState, new: RunState, reason: FailureReason | None
) -> None:
    if new in ALLOWED[current]:
        return
    with pytest.raises(IllegalTransition, match="not an allowed move"):
        check_move(current, new, reason)


@given(states, st.sampled_from(sorted(NEEDS_REASON)))
def test_failed_and_terminated_need_a_reason(current: RunState, new: RunState) -> None:
    if new not in ALLOWED[current]:
        return
    with pytest.raises(IllegalTransition, match="needs a reason"):
        check_move(current, new, None)


@given(states, states, reasons)
def test_other_states_refuse_a_reason(
    current: RunState, new: RunState, reason: FailureReason
) -> None:
    if new in NEEDS_REASON or new not in ALLOWED[current]:
        return
    with pytest.raises(IllegalTransition, match="carries no failure reason"):
        check_move(current, new, reason)


# --- failure reasons --------------------------------------------------------------------------


ENVIRONMENT = {
    FailureReason.DEPENDENCY_MISSING,
    FailureReason.DEPENDENCY_MISMATCH,
    FailureReason.IMAGE_NOT_FOUND,
}


def test_failure_reasons_are_sorted_into_kinds() -> None:
    assert {r for r in FailureReason if r.kind is FailureKind.INFRASTRUCTURE} == INFRASTRUCTURE
    assert {r for r in FailureReason if r.kind is FailureKind.TASK} == TASK
    assert {r for r in FailureReason if r.kind is FailureKind.USER} == {FailureReason.CANCELLED}
    assert {r for r in FailureReason if r.kind is FailureKind.ENVIRONMENT} == ENVIRONMENT
    pipeline = {FailureReason.DEPENDENCY_FAILED}
    assert {r for r in FailureReason if r.kind is FailureKind.PIPELINE} == pipeline
    # The set is closed: every reason has exactly one kind.
    every = INFRASTRUCTURE | TASK | ENVIRONMENT | pipeline | {FailureReason.CANCELLED}
    assert every == set(FailureReason)


# --- the retry policy -------------------------------------------------------------------------

policies = st.builds(
    RetryPolicy,
    max_retries=st.integers(0, 6),
    on_exit_codes=st.lists(st.integers(-3, 140), max_size=4).map(tuple),
)
exit_codes = st.none() | st.integers(-3, 140)


@st.composite
def failures(draw: st.DrawFn, reason: st.SearchStrategy[FailureReason] = reasons) -> RunStatus:
    return RunStatus(
        state=draw(st.sampled_from([S.FAILED, S.TERMINATED])),
        reason=draw(reason),
        exit_code=draw(exit_codes),
    )


@given(policies, failures(), st.integers(0, 10), st.booleans())
def test_never_retries_past_max_retries(
    policy: RetryPolicy, status: RunStatus, so_far: int, cancel: bool
) -> None:
    if so_far >= policy.max_retries:
        assert not should_retry(policy, status, so_far, cancel)


@given(policies, failures(), st.integers(0, 10))
def test_never_retries_a_cancelled_attempt(
    policy: RetryPolicy, status: RunStatus, so_far: int
) -> None:
    assert not should_retry(policy, status, so_far, cancel_requested=True)
    cancelled = status.model_copy(update={"reason": FailureReason.CANCELLED})
    assert not should_retry(policy, cancelled, so_far, cancel_requested=False)


@given(policies, failures(st.sampled_from(sorted(INFRASTRUCTURE))), st.integers(0, 10))
def test_always_retries_infrastructure_under_the_limit(
    policy: RetryPolicy, status: RunStatus, so_far: int
) -> None:
    expected = so_far < policy.max_retries
    assert should_retry(policy, status, so_far, cancel_requested=False) is expected


@given(policies, failures(st.sampled_from(sorted(TASK))), st.integers(0, 10))
def test_task_exit_retried_only_when_its_code_is_listed(
    policy: RetryPolicy, status: RunStatus, so_far: int
) -> None:
    listed = status.exit_code is not None and status.exit_code in policy.on_exit_codes
    expected = listed and so_far < policy.max_retries
    assert should_retry(policy, status, so_far, cancel_requested=False) is expected


@given(policies, st.integers(0, 10), st.booleans())
def test_success_is_never_retried(policy: RetryPolicy, so_far: int, cancel: bool) -> None:
    ok = RunStatus(state=S.SUCCEEDED, exit_code=0)
    assert not should_retry(policy, ok, so_far, cancel)


def test_retry_examples() -> None:
    policy = RetryPolicy(max_retries=2, on_exit_codes=(137,))
    lost = RunStatus(state=S.FAILED, reason=FailureReason.NODE_LOST)
    oom = RunStatus(state=S.FAILED, reason=FailureReason.TASK_EXIT_NONZERO, exit_code=137)
    bug = RunStatus(state=S.FAILED, reason=FailureReason.TASK_EXIT_NONZERO, exit_code=1)
    assert should_retry(policy, lost, 0, False)
    assert should_retry(policy, lost, 1, False)
    assert not should_retry(policy, lost, 2, False)
    assert should_retry(policy, oom, 0, False)
    assert not should_retry(policy, bug, 0, False)
    assert not should_retry(RetryPolicy(max_retries=0), lost, 0, False)
