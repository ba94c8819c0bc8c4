"""Who holds an attempt's launch, and whether they still do: the clock the claims are judged
by, this process's name (HOST:PID), the claim's lease and its renewal, and whether a claimer
is known gone (its lease ran out, or its process is no more). The launch path, the actions and
the server's loops all judge a claim by these."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orbit.model.records import AttemptRecord

LEASE_S = 30.0  # a launch claim lapses this long after its last renewal
RENEW_S = 10.0  # a launching process renews its claim this often


def now() -> datetime:
    return datetime.now(UTC)


def launcher_id() -> str:
    """Who is launching: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_gone(owner: str) -> bool:
    """Whether `owner` (HOST:PID, as `launcher_id` names a process) is a process of this host
    that no longer exists. Another host's process can only be judged by its lease."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def lease_lapsed(attempt: AttemptRecord, at: datetime) -> bool:
    """Whether the process that claimed the launch is known gone: its lease ran out, or it was
    a process of this host that no longer exists."""
    if attempt.lease_owner is None:
        return True
    if attempt.lease_expires_at is None or attempt.lease_expires_at <= at:
        return True
    return process_gone(attempt.lease_owner)
