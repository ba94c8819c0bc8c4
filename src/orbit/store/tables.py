"""Table definitions. Every change here needs a new Alembic migration in migrations/versions/."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class ExperimentRow(Base):
    __tablename__ = "experiments"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime]


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"), index=True)
    task_type: Mapped[str] = mapped_column(String(64))
    template_id: Mapped[str] = mapped_column(String(128))
    bundle_digest: Mapped[str] = mapped_column(String(64), index=True)
    submission: Mapped[dict[str, Any]]
    request: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(index=True)
    created_by: Mapped[str] = mapped_column(String(128))
    replay_of: Mapped[str | None] = mapped_column(String(40))


class AttemptRow(Base):
    __tablename__ = "attempts"
    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(32))
    target: Mapped[str | None] = mapped_column(String(256))
    backend_key: Mapped[str] = mapped_column(String(64))
    trigger: Mapped[str] = mapped_column(String(16))
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # the last time its host answered, and since when it has not (SSH hosts)
    last_contact_at: Mapped[datetime | None]
    unreachable_since: Mapped[datetime | None]
    # a prepared attempt: who launches it, until when that claim holds, and when it is due
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None]
    not_before: Mapped[datetime | None]
    # which server replica's reconcile loop looks at it, and when it is next due a look
    reconcile_owner: Mapped[str | None] = mapped_column(String(128))
    reconcile_due_at: Mapped[datetime | None]
    # an agent_pool attempt: its node, the fence its start carries, when the node was granted
    # that start (once), and the GPU indices it was given there
    node_id: Mapped[str | None] = mapped_column(String(40), index=True)
    fence: Mapped[int | None] = mapped_column(Integer)
    node_claimed_at: Mapped[datetime | None]
    node_gpus: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    preempted_by: Mapped[str | None] = mapped_column(String(48))  # the run it was stopped for
    # a gang's member (one per node but rank 0's): its leader attempt and its node's rank.
    # Members follow their leader's state; only leaders are listed, reconciled and retried
    gang_of: Mapped[str | None] = mapped_column(String(48), index=True)
    rank: Mapped[int] = mapped_column(Integer, server_default="0")
    __table_args__ = (Index("ix_attempts_run_number", "run_id", "number", "rank", unique=True),)


class HostRow(Base):
    __tablename__ = "hosts"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    spec: Mapped[dict[str, Any]]  # orbit.core.execution.ssh.hosts.HostSpec
    facts: Mapped[dict[str, Any] | None] = mapped_column(
        JSON
    )  # orbit.core.execution.ssh.hosts.HostFacts
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))


class JoinTokenRow(Base):
    __tablename__ = "join_tokens"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    labels: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    uses: Mapped[int] = mapped_column(Integer, server_default="0")


class NodeRow(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    credential_hash: Mapped[str] = mapped_column(String(64), unique=True)
    labels: Mapped[dict[str, Any]]
    info: Mapped[dict[str, Any]]  # orbit.agent.protocol.NodeInfo
    state: Mapped[str] = mapped_column(String(16))  # orbit.core.nodes.NodeState
    max_tasks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    last_seen_at: Mapped[datetime | None]
    session: Mapped[str | None] = mapped_column(String(64))
    report_seq: Mapped[int] = mapped_column(Integer, server_default="0")
    preempted_at: Mapped[datetime | None]  # the last time work was pushed off it


class NodeCommandRow(Base):
    __tablename__ = "node_commands"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(48), unique=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    kind: Mapped[str] = mapped_column(String(16))
    attempt_id: Mapped[str | None] = mapped_column(String(48))
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    acked_at: Mapped[datetime | None]
    done_at: Mapped[datetime | None]
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    __table_args__ = (Index("ix_node_commands_node_acked", "node_id", "acked_at"),)


class SchedPassRow(Base):
    """A scheduler pass's inputs (the node snapshot and the queue), for replay and simulate."""

    __tablename__ = "sched_passes"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    at: Mapped[datetime] = mapped_column(index=True)
    config: Mapped[dict[str, Any]]
    inputs: Mapped[str] = mapped_column(Text)  # zlib + base64 of the canonical JSON
    placed: Mapped[int] = mapped_column(Integer)
    waiting: Mapped[int] = mapped_column(Integer)
    preempted: Mapped[int] = mapped_column(Integer)


class SchedDecisionRow(Base):
    """A run's latest scheduler decision, byte for byte as its pass made it."""

    __tablename__ = "sched_decisions"
    run_id: Mapped[str] = mapped_column(String(48), primary_key=True)
    attempt_id: Mapped[str] = mapped_column(String(48))
    pass_id: Mapped[str] = mapped_column(String(40), index=True)
    outcome: Mapped[str] = mapped_column(String(16))
    tier: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    gist: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime]


class QuotaRow(Base):
    __tablename__ = "quotas"
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)  # user | experiment
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    weight: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(128))


class UserRow(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # orbit.core.auth.Role
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))


class TokenRow(Base):
    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(128))
    hash: Mapped[str] = mapped_column(String(64), unique=True)  # orbit.core.auth.token_hash
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(40), index=True)
    attempt_id: Mapped[str | None] = mapped_column(String(48))
    data: Mapped[dict[str, Any]]
    # the hash chain (orbit.core.audit_chain): each event names the one before it, so a fork (two
    # events after the same one) is refused by the unique index as well as by the writers' lock
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    __table_args__ = (
        Index("ix_events_hash", "hash", unique=True),
        Index("ix_events_prev_hash", "prev_hash", unique=True),
    )
