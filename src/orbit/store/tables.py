"""Table definitions. Every change here needs a new Alembic migration in migrations/versions/."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class ExperimentRow(Base):
    __tablename__ = "experiments"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime]
    # only its members (experiment_members) and those who manage experiments see its runs
    restricted: Mapped[bool] = mapped_column(Boolean, server_default=false())


class ExperimentMemberRow(Base):
    __tablename__ = "experiment_members"
    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    added_at: Mapped[datetime]
    added_by: Mapped[str] = mapped_column(String(128))


class RunGroupRow(Base):
    """Runs made together by one sweep (orbit.model.groups): its runs name it (runs.group_id)."""

    __tablename__ = "run_groups"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    created_by: Mapped[str] = mapped_column(String(128), index=True)
    size: Mapped[int]
    sweep: Mapped[dict[str, Any]]  # as submitted (orbit.model.sweeps.Sweep)


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
    # its current attempt's state (highest number, rank 0), kept by orbit.store.attempt_states
    # in the transaction that moves or opens an attempt: `runs list --state S` newest first
    state: Mapped[str] = mapped_column(String(16), server_default="prepared")
    # what it recorded of its admission (orbit.model.policies.PolicyStamp); none: made before
    # policies were kept
    policy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the group a sweep made it in (orbit.store.groups); none: submitted on its own
    group_id: Mapped[str | None] = mapped_column(ForeignKey("run_groups.id"), index=True)
    __table_args__ = (
        # `runs list --user U`: a user's runs, newest first
        Index("ix_runs_created_by_created_at", "created_by", "created_at"),
        Index("ix_runs_state_created_at", "state", "created_at"),
    )


class SubmitKeyRow(Base):
    """A submission's idempotency key and the run it made (orbit.store.submit_keys)."""

    __tablename__ = "submit_keys"
    user_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))  # sha256 of what was submitted
    run_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(index=True)


class AttemptRow(Base):
    __tablename__ = "attempts"
    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(32))
    target: Mapped[str | None] = mapped_column(String(256), index=True)  # runs list --node
    backend_key: Mapped[str] = mapped_column(String(64))
    trigger: Mapped[str] = mapped_column(String(16))
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime] = mapped_column(index=True)  # the newest change: Runs.change_stamp
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
    # a prepared attempt held back by a gate (`after`: its run's dependencies have not ended)
    held: Mapped[str | None] = mapped_column(String(16))
    __table_args__ = (Index("ix_attempts_run_number", "run_id", "number", "rank", unique=True),)


class RunDependencyRow(Base):
    """A run waits for another (`after:` in its spec, orbit.model.dependencies)."""

    __tablename__ = "run_dependencies"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    needs: Mapped[str] = mapped_column(String(40), primary_key=True, index=True)
    kind: Mapped[str] = mapped_column(String(8))  # ok | any
    position: Mapped[int] = mapped_column(Integer)  # as written in the spec


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
    info: Mapped[dict[str, Any]]  # orbit.wire.protocol.NodeInfo
    state: Mapped[str] = mapped_column(String(16))  # orbit.model.nodes.NodeState
    max_tasks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    last_seen_at: Mapped[datetime | None]
    session: Mapped[str | None] = mapped_column(String(64))
    report_seq: Mapped[int] = mapped_column(Integer, server_default="0")
    preempted_at: Mapped[datetime | None]  # the last time work was pushed off it
    # why it is out of service (drain or cordon --reason), who said so and when
    reason: Mapped[str | None] = mapped_column(Text)
    reason_by: Mapped[str | None] = mapped_column(String(128))
    reason_at: Mapped[datetime | None]


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


class SchedConfigRow(Base):
    """One row (id 1): the scheduler config last seen valid, as written (orbit.store.
    sched_config_table): the last good one stays live when the file turns invalid."""

    __tablename__ = "sched_config"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    text: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(1024))
    set_at: Mapped[datetime]
    set_by: Mapped[str] = mapped_column(String(128))


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
    role: Mapped[str] = mapped_column(String(16))  # orbit.model.auth.Role
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))


class TokenRow(Base):
    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(128))
    hash: Mapped[str] = mapped_column(String(64), unique=True)  # orbit.model.auth.token_hash
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class SecretRow(Base):
    """A secret's value, sealed (orbit.model.secret_keys), and its listing (orbit.store.secrets):
    one per scope, owner and name."""

    __tablename__ = "secrets"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(String(128))  # a user's name, an experiment's id, or ""
    name: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[str] = mapped_column(String(32), index=True)  # what re-sealing looks for
    sealed: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    rotated_at: Mapped[datetime | None]
    used_at: Mapped[datetime | None]
    __table_args__ = (Index("ix_secrets_scope_owner_name", "scope", "owner", "name", unique=True),)


class PolicyRow(Base):
    """An applied policy file (orbit.store.policies): the newest version is in force."""

    __tablename__ = "policies"
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    body: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    rules: Mapped[int] = mapped_column(Integer)
    applied_at: Mapped[datetime]
    applied_by: Mapped[str] = mapped_column(String(128))


class AlertRow(Base):
    """An alert (orbit.store.alerts): one open per key while its condition holds."""

    __tablename__ = "alerts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    alert_key: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    objects: Mapped[dict[str, Any]]
    message: Mapped[str] = mapped_column(Text)
    remedy: Mapped[str] = mapped_column(Text)
    raised_at: Mapped[datetime] = mapped_column(index=True)
    resolved_at: Mapped[datetime | None]
    acked_by: Mapped[str | None] = mapped_column(String(128))
    acked_at: Mapped[datetime | None]
    silenced_until: Mapped[datetime | None]
    __table_args__ = (
        Index(
            "ix_alerts_open_key", "alert_key", unique=True,
            sqlite_where=text("resolved_at IS NULL"), postgresql_where=text("resolved_at IS NULL"),
        ),
    )  # fmt: skip


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(40), index=True)
    attempt_id: Mapped[str | None] = mapped_column(String(48))
    data: Mapped[dict[str, Any]]
    # the hash chain (orbit.model.audit_chain): each event names the one before it, so a fork (two
    # events after the same one) is refused by the unique index as well as by the writers' lock
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    # the keyed chain: HMAC of `hash` under the audit key, none before keying began
    mac: Mapped[str | None] = mapped_column(String(64))
    __table_args__ = (
        Index("ix_events_hash", "hash", unique=True),
        Index("ix_events_prev_hash", "prev_hash", unique=True),
    )


class AuditSealRow(Base):
    """One row (id 1): the first keyed event, the key's id and the chain's head, under a MAC
    (orbit.model.audit_chain.Seal), rewritten by every keyed append."""

    __tablename__ = "audit_seal"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    keyed_from: Mapped[int] = mapped_column(Integer)
    key_id: Mapped[str] = mapped_column(String(32))
    head_id: Mapped[int] = mapped_column(Integer)
    head_hash: Mapped[str] = mapped_column(String(64))
    mac: Mapped[str] = mapped_column(String(64))


class RunStorageRow(Base):
    """A run pinned (retention keeps it), deleted or its artifacts expired (orbit.store.storage)."""

    __tablename__ = "run_storage"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    pinned: Mapped[bool] = mapped_column(Boolean, server_default="0")
    pinned_by: Mapped[str | None] = mapped_column(String(128))
    pinned_at: Mapped[datetime | None]
    deleted_at: Mapped[datetime | None]
    deleted_by: Mapped[str | None] = mapped_column(String(128))
    expired_at: Mapped[datetime | None]


class ArtifactRemovalRow(Base):
    """What was removed of an attempt's files: its whole copy (path '') or one entry of it."""

    __tablename__ = "artifact_removals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40))
    attempt_id: Mapped[str] = mapped_column(String(48), index=True)
    path: Mapped[str] = mapped_column(String(1024))
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    why: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime]


class StorageSizeRow(Base):
    """The measured size of a copy that can no longer change: `attempt:ID` or `bundle:DIGEST`."""

    __tablename__ = "storage_sizes"
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    measured_at: Mapped[datetime]


class StorageGcRow(Base):
    """One row (id 1): when the server's next gc pass is due, and who ran the last one."""

    __tablename__ = "storage_gc"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    due_at: Mapped[datetime]
    ran_at: Mapped[datetime | None]
    holder: Mapped[str | None] = mapped_column(String(128))
