"""Reading what the runtime wrapper wrote into runtime/: one pure function every backend shares,
whether the files came from the local disk, over SSH or from an agent's report."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from orbit.model.models import FailureReason, RunState, RunStatus

_STATES = {s.value: s for s in RunState}
_REASONS = {r.value: r for r in FailureReason}


def parse_json(text: str | bytes | None) -> dict[str, Any] | None:
    """A runtime file's content, or None when it is missing or torn."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def status_from_files(
    status: dict[str, Any] | None, result: dict[str, Any] | None, wrapper_alive: bool
) -> RunStatus:
    """The attempt's state from runtime/status.json, runtime/result.json and whether the
    wrapper still holds its lock. A wrapper that is gone without a result is `runtime_lost`:
    an infrastructure failure, never a run stuck in `running`."""
    ended = _STATES.get(str((result or {}).get("state")))
    if result is not None and ended is not None and ended.terminal:
        state = ended
        reason = _REASONS.get(str(result.get("reason")))
        if state is not RunState.SUCCEEDED and reason is None:
            reason = FailureReason.RUNTIME_LOST
        return RunStatus(
            state=state,
            reason=None if state is RunState.SUCCEEDED else reason,
            exit_code=_int(result.get("exit_code")),
            signal=_int(result.get("signal")),
            started_at=_time(result.get("started_at")),
            finished_at=_time(result.get("finished_at")),
            host=_str(result.get("host")),
            message=_str(result.get("message")),
        )
    last = _STATES.get(str((status or {}).get("state")), RunState.STARTING)
    if wrapper_alive:
        if last.terminal:  # status written, result not yet: still finishing
            last = RunState.RUNNING
        return RunStatus(
            state=last,
            started_at=_time((status or {}).get("started_at")),
            host=_str((status or {}).get("host")),
        )
    return RunStatus(
        state=RunState.FAILED,
        reason=FailureReason.RUNTIME_LOST,
        host=_str((status or {}).get("host")),
        message=f"the runtime wrapper is gone without writing a result (last state: {last})",
    )
