"""Nodes: in-house servers whose agents connect out to the control plane. Records and the pure
rules about them (online or not, their condition); the store keeps them, orbit.wire.protocol
is how their agents talk, and orbit.scheduler decides what runs where."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from orbit.model.config import HEARTBEAT_S as HEARTBEAT_S
from orbit.model.config import LOST_GRACE_S as LOST_GRACE_S
from orbit.model.config import OFFLINE_AFTER_S

MAX_TRANSFER_BYTES = 48 * 1024 * 1024  # `orbit nodes push` or `pull` moves one file up to this
MAX_REASON = 256  # characters of a drain's or cordon's --reason


SERVICE_LABEL = "service/"  # + a model server's name: the label of a node that advertises it


class NodeState(StrEnum):
    ACTIVE = "active"
    CORDONED = "cordoned"  # takes no new work; what it runs goes on
    REVOKED = "revoked"  # its credential is refused; it gets nothing


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    labels: dict[str, str]
    info: dict[str, Any]  # orbit.wire.protocol.NodeInfo
    state: NodeState
    max_tasks: int
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    running: tuple[str, ...] = ()  # its attempts that have not ended (placed or started)
    gpus_in_use: dict[int, float] = {}  # GPU index -> GB reserved there (0: the whole GPU)
    # the offline timeout of the control plane that gave this record: a reader elsewhere (the
    # CLI against a server) judges online and condition as that control plane does
    offline_after_s: float = OFFLINE_AFTER_S
    preempted_at: datetime | None = None  # the last time work was pushed off it
    # why it is out of service (`drain`/`cordon --reason`), who said so and when; cleared
    # when it takes work again
    reason: str | None = None
    reason_by: str | None = None
    reason_at: datetime | None = None

    def seen_ago(self, now: datetime) -> float | None:
        if self.last_seen_at is None:
            return None
        return max(0.0, (now - self.last_seen_at).total_seconds())

    def online(self, now: datetime, offline_after_s: float | None = None) -> bool:
        ago = self.seen_ago(now)
        limit = self.offline_after_s if offline_after_s is None else offline_after_s
        return ago is not None and ago < limit

    def condition(self, now: datetime, offline_after_s: float | None = None) -> str:
        """What a person reading `orbit nodes list` wants to know first."""
        if self.state is NodeState.REVOKED:
            return "revoked"
        if not self.online(now, offline_after_s):
            return "offline"
        if self.state is NodeState.CORDONED:
            return "cordoned" if self.running else "cordoned (free)"
        if self.max_tasks == 0:
            return "draining" if self.running else "drained (free for people)"
        return "busy" if len(self.running) >= self.max_tasks else "ready"


class JoinTokenRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    uses: int


class NewJoinToken(BaseModel):
    """A join token as made: the only time its value is shown."""

    model_config = ConfigDict(frozen=True)
    record: JoinTokenRecord
    token: str
