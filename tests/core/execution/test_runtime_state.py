"""status_from_files: an attempt's state rebuilt from what the runtime wrapper left in runtime/."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.model.models import FailureKind, FailureReason, RunState

STARTED = "2024-05-01T10:00:00.000+00:00"
FINISHED = "2024-05-01T10:05:30.250+00:00"
TERMINAL = {RunState.SUCCEEDED, RunState.FAILED, RunState.TERMINATED}


def status_file(state: str, **extra: Any) -> dict[str, Any]:
    """What runtime/status.json holds, as the wrapper writes it."""
    return {
        "state": state,
        "updated_at": STARTED,
        "host": "gpu-box-7",
        "wrapper_pid": 4242,
        **extra,
    }


def result_file(state: str, **extra: Any) -> dict[str, Any]:
    """What runtime/result.json holds, as the wrapper writes it."""
    return {
        "state": state,
        "host": "gpu-box-7",
        "started_at": STARTED,
        "finished_at": FINISHED,
        **extra,
    }


# --- result.json present: it wins ----------------------------------------------------------


@pytest.mark.parametrize("alive", [True, False])
def test_a_success_result_wins_over_status_and_liveness(alive: bool) -> None:
    found = status_from_files(
        status_file("running", task_pid=99, started_at=STARTED),
        result_file("succeeded", exit_code=0),
        wrapper_alive=alive,
    )
    assert found.state is RunState.SUCCEEDED
    assert found.reason is None
    assert found.exit_code == 0
    assert found.signal is None
    assert found.started_at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert found.finished_at == datetime(2024, 5, 1, 10, 5, 30, 250000, tzinfo=UTC)
    assert found.host == "gpu-box-7"


def test_a_failed_result_keeps_the_task_reason_and_exit_code() -> None:
    found = status_from_files(
        None,
        result_file("failed", reason="task_exit_nonzero", exit_code=3),
        wrapper_alive=False,
    )
    assert found.state is RunState.FAILED
    assert found.reason is FailureReason.TASK_EXIT_NONZERO
    assert found.reason.kind is FailureKind.TASK
    assert found.exit_code == 3
    assert found.signal is None


def test_a_terminated_result_keeps_the_stop_reason_and_signal() -> None:
    found = status_from_files(
        status_file("running"),
        result_file("terminated", reason="preempted", signal=9),
        wrapper_alive=False,
    )
    assert found.state is RunState.TERMINATED
    assert found.reason is FailureReason.PREEMPTED
    assert found.signal == 9
    assert found.exit_code is None


def test_a_result_with_a_message_passes_it_on() -> None:
    found = status_from_files(
        None,
        result_file("failed", reason="task_exit_nonzero", exit_code=127, message="cannot start"),
        wrapper_alive=False,
    )
    assert found.message == "cannot start"


def test_a_success_never_carries_a_failure_reason() -> None:
    found = status_from_files(
        None, result_file("succeeded", exit_code=0, reason="cancelled"), wrapper_alive=False
    )
    assert found.state is RunState.SUCCEEDED
    assert found.reason is None


def test_a_failure_with_an_unknown_reason_is_an_infrastructure_failure() -> None:
    found = status_from_files(
        None, result_file("failed", reason="cosmic_rays", exit_code=1), wrapper_alive=False
    )
    assert found.state is RunState.FAILED
    assert found.reason is FailureReason.RUNTIME_LOST
    assert found.reason.kind is FailureKind.INFRASTRUCTURE


def test_a_result_that_is_not_terminal_is_ignored() -> None:
    found = status_from_files(
        status_file("running", started_at=STARTED), result_file("running"), wrapper_alive=True
    )
    assert found.state is RunState.RUNNING
    gone = status_from_files(status_file("running"), result_file("running"), wrapper_alive=False)
    assert gone.state is RunState.FAILED
    assert gone.reason is FailureReason.RUNTIME_LOST


def test_badly_typed_result_fields_are_dropped_not_trusted() -> None:
    found = status_from_files(
        None,
        result_file(
            "failed",
            reason="task_exit_nonzero",
            exit_code="3",
            signal=True,
            started_at="yesterday",
            finished_at=17,
            host=5,
            message=["not", "text"],
        ),
        wrapper_alive=False,
    )
    assert found.state is RunState.FAILED
    assert found.exit_code is None
    assert found.signal is None
    assert found.started_at is None
    assert found.finished_at is None
    assert found.host is None
    assert found.message is None


@pytest.mark.parametrize("alive", [True, False])
def test_a_badly_typed_status_host_is_dropped(alive: bool) -> None:
    found = status_from_files(
        status_file("running", host=False, started_at=3), None, wrapper_alive=alive
    )
    assert found.host is None
    assert found.started_at is None


# --- no result yet: the wrapper's liveness decides ------------------------------------------


def test_alive_with_a_running_status_is_running() -> None:
    found = status_from_files(
        status_file("running", task_pid=99, started_at=STARTED), None, wrapper_alive=True
    )
    assert found.state is RunState.RUNNING
    assert found.reason is None
    assert found.started_at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert found.host == "gpu-box-7"


def test_alive_with_a_starting_status_is_starting() -> None:
    found = status_from_files(status_file("starting"), None, wrapper_alive=True)
    assert found.state is RunState.STARTING


def test_alive_without_any_status_is_starting() -> None:
    found = status_from_files(None, None, wrapper_alive=True)
    assert found.state is RunState.STARTING
    assert found.reason is None


@pytest.mark.parametrize("state", ["succeeded", "failed", "terminated"])
def test_alive_with_a_terminal_status_but_no_result_is_still_running(state: str) -> None:
    """The wrapper writes result.json, then status.json, then lets go of its lock: a terminal
    status alone means it is still finishing, not that it is done."""
    found = status_from_files(status_file(state), None, wrapper_alive=True)
    assert found.state is RunState.RUNNING


@pytest.mark.parametrize("last", ["starting", "running", "succeeded", None])
def test_dead_without_a_result_is_runtime_lost(last: str | None) -> None:
    status = status_file(last) if last else None
    found = status_from_files(status, None, wrapper_alive=False)
    assert found.state is RunState.FAILED
    assert found.reason is FailureReason.RUNTIME_LOST
    assert found.reason.kind is FailureKind.INFRASTRUCTURE
    assert found.message and "without writing a result" in found.message
    if last:
        assert found.host == "gpu-box-7"
        assert last in found.message


# --- torn or invalid files read as missing --------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [None, "", b"", '{"state": "succ', "not json at all", "[1, 2]", "42", '"running"', "null"],
)
def test_parse_json_reads_torn_or_non_object_files_as_missing(text: str | bytes | None) -> None:
    assert parse_json(text) is None


def test_parse_json_reads_a_whole_file_as_text_or_bytes() -> None:
    data = result_file("succeeded", exit_code=0)
    assert parse_json(json.dumps(data)) == data
    assert parse_json(json.dumps(data).encode()) == data


def test_a_torn_result_counts_as_missing() -> None:
    torn = json.dumps(result_file("succeeded", exit_code=0))[:-7]
    running = json.dumps(status_file("running", started_at=STARTED))
    alive = status_from_files(parse_json(running), parse_json(torn), wrapper_alive=True)
    assert alive.state is RunState.RUNNING
    dead = status_from_files(parse_json(running), parse_json(torn), wrapper_alive=False)
    assert dead.state is RunState.FAILED
    assert dead.reason is FailureReason.RUNTIME_LOST


def test_a_torn_status_counts_as_missing() -> None:
    torn = json.dumps(status_file("running"))[:12]
    assert status_from_files(parse_json(torn), None, wrapper_alive=True).state is (
        RunState.STARTING
    )
    lost = status_from_files(parse_json(torn), None, wrapper_alive=False)
    assert lost.reason is FailureReason.RUNTIME_LOST
    assert lost.host is None


# --- whatever the files hold, the answer is well-formed -------------------------------------

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
STATES = st.sampled_from([s.value for s in RunState] + ["bogus"])
REASONS = st.sampled_from([r.value for r in FailureReason] + ["bogus"])
RUNTIME_FILE = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "state": STATES | JSON_SCALARS,
        "reason": REASONS | JSON_SCALARS,
        "exit_code": JSON_SCALARS,
        "signal": JSON_SCALARS,
        "started_at": st.just(STARTED) | JSON_SCALARS,
        "finished_at": st.just(FINISHED) | JSON_SCALARS,
        "host": JSON_SCALARS,
        "message": JSON_SCALARS,
        "task_pid": JSON_SCALARS,
    },
)


@settings(max_examples=300, deadline=None)
@given(status=RUNTIME_FILE, result=RUNTIME_FILE, alive=st.booleans())
def test_any_file_content_gives_a_well_formed_status(
    status: dict[str, Any] | None, result: dict[str, Any] | None, alive: bool
) -> None:
    """Files come from boxes that may be broken: nothing in them may crash the status loop,
    and a gone wrapper is never reported as still running."""
    found = status_from_files(status, result, wrapper_alive=alive)
    result_state = (result or {}).get("state")
    if result_state in {s.value for s in TERMINAL}:
        assert found.state.value == result_state
    elif alive:
        assert found.state not in TERMINAL
    else:
        assert found.state is RunState.FAILED
        assert found.reason is FailureReason.RUNTIME_LOST
    if found.state is RunState.SUCCEEDED:
        assert found.reason is None
    elif found.state in TERMINAL:
        assert found.reason is not None
