"""The retry policy, the same for every placement. Pure."""

from __future__ import annotations

from orbit.model.models import FailureKind, RetryPolicy, RunStatus


def should_retry(
    policy: RetryPolicy, status: RunStatus, retries_so_far: int, cancel_requested: bool
) -> bool:
    """Infrastructure failures are retried; a task's own exit only if its code is listed;
    nothing a person stopped is retried, and never more than `max_retries` times."""
    if cancel_requested or status.reason is None or retries_so_far >= policy.max_retries:
        return False
    if status.reason.kind is FailureKind.INFRASTRUCTURE:
        return True
    if status.reason.kind is FailureKind.TASK:
        return status.exit_code is not None and status.exit_code in policy.on_exit_codes
    return False


def backoff_delay(policy: RetryPolicy, retries_so_far: int) -> float:
    """Seconds before automatic retry number `retries_so_far + 1`: exponential, capped, so
    that retries to a box that keeps failing do not burn out in a second."""
    return float(min(policy.backoff_max_s, policy.backoff_s * 2**retries_so_far))
