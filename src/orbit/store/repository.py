"""The Store: every read and write of ORBIT's durable state, and the one place a state changes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orbit.core.audit_chain import ChainCheck, canonical_data, check_chain, event_hash
from orbit.core.errors import InvalidInput, NotFound
from orbit.core.models import NAME_PATTERN, FailureReason, RunHandle, RunState
from orbit.core.records import AttemptRecord, AuditEvent, ExperimentRecord, RunRecord
from orbit.core.states import check_move
from orbit.store.db import WRITE, make_engine, migrate
from orbit.store.host_table import HostTable
from orbit.store.tables import AttemptRow, EventRow, ExperimentRow, RunRow

# pg_advisory_xact_lock key ("ORBITAUD") serialising appends to the audit chain on PostgreSQL
AUDIT_LOCK_KEY = 0x4F52424954415544


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _aware(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back without a zone; everything ORBIT stores is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class Store:
    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or make_engine(url)
        migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # write transactions: BEGIN IMMEDIATE on SQLite (see db.WRITE)
        self._writes = sessionmaker(
            self.engine.execution_options(**{WRITE: True}), expire_on_commit=False
        )
        self.hosts = HostTable(self)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._writes() as session, session.begin():
            yield session

    @staticmethod
    def _event(
        session: Session,
        actor: str,
        action: str,
        *,
        run_id: str | None = None,
        attempt_id: str | None = None,
        **data: Any,
    ) -> None:
        """Append one event to the audit chain, in the caller's write transaction.

        Appends are serialised, so no two events ever chain onto the same one: on PostgreSQL
        by a transaction-scoped advisory lock taken before the last hash is read (held to
        commit; taking it again in the same transaction is free); on SQLite by the write
        transaction's BEGIN IMMEDIATE, which `_tx` opens. The id is assigned under the same
        lock, so id order is chain order."""
        connection = session.connection()
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
        elif not connection.get_execution_options().get(WRITE):
            raise RuntimeError("audit events are written only inside Store._tx")
        prev = session.scalar(select(EventRow.hash).order_by(EventRow.id.desc()).limit(1))
        at = utcnow()
        content = canonical_data(data)
        row = EventRow(
            at=at,
            actor=actor,
            action=action,
            run_id=run_id,
            attempt_id=attempt_id,
            data=content,
            prev_hash=prev,
            hash=event_hash(
                prev_hash=prev,
                at=at,
                actor=actor,
                action=action,
                run_id=run_id,
                attempt_id=attempt_id,
                data=content,
            ),
        )
        session.add(row)
        session.flush()

    # --- experiments ----------------------------------------------------------------------

    def create_experiment(self, name: str, actor: str) -> ExperimentRecord:
        if not re.fullmatch(NAME_PATTERN, name):
            raise InvalidInput(
                f"experiment name '{name}': use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        try:
            with self._tx() as s:
                row = ExperimentRow(id=new_id("exp"), name=name, created_at=utcnow())
                s.add(row)
                s.flush()
                self._event(s, actor, "experiment.created", experiment_id=row.id, name=name)
        except IntegrityError:
            raise InvalidInput(f"experiment '{name}' already exists") from None
        return ExperimentRecord(id=row.id, name=row.name, created_at=row.created_at)

    def find_experiment(self, name_or_id: str) -> ExperimentRecord | None:
        with self._sessions() as s:
            row = s.scalars(
                select(ExperimentRow).where(
                    (ExperimentRow.name == name_or_id) | (ExperimentRow.id == name_or_id)
                )
            ).first()
            if row is None:
                return None
            count = s.scalar(select(func.count()).where(RunRow.experiment_id == row.id)) or 0
            return ExperimentRecord(
                id=row.id, name=row.name, created_at=_aware(row.created_at), run_count=count
            )

    def get_experiment(self, name_or_id: str) -> ExperimentRecord:
        found = self.find_experiment(name_or_id)
        if found is None:
            raise NotFound(f"unknown experiment '{name_or_id}' (see 'orbit experiments list')")
        return found

    def list_experiments(self) -> list[ExperimentRecord]:
        with self._sessions() as s:
            counts = dict(
                s.execute(
                    select(RunRow.experiment_id, func.count()).group_by(RunRow.experiment_id)
                ).all()
            )
            rows = s.scalars(select(ExperimentRow).order_by(ExperimentRow.created_at)).all()
            return [
                ExperimentRecord(
                    id=r.id,
                    name=r.name,
                    created_at=_aware(r.created_at),
                    run_count=counts.get(r.id, 0),
                )
                for r in rows
            ]

    # --- runs and attempts ----------------------------------------------------------------

    def create_run(
        self,
        *,
        experiment_id: str,
        task_type: str,
        template_id: str,
        bundle_digest: str,
        submission: dict[str, Any],
        request: dict[str, Any],
        target: str | None,
        backend_key: str,
        actor: str,
        replay_of: str | None = None,
    ) -> RunRecord:
        """A new run with its first attempt, in state prepared."""
        now = utcnow()
        run_id = new_id("run")
        with self._tx() as s:
            s.add(
                RunRow(
                    id=run_id,
                    experiment_id=experiment_id,
                    task_type=task_type,
                    template_id=template_id,
                    bundle_digest=bundle_digest,
                    submission=submission,
                    request=request,
                    created_at=now,
                    created_by=actor,
                    replay_of=replay_of,
                )
            )
            s.flush()
            self._event(
                s,
                actor,
                "run.created",
                run_id=run_id,
                bundle_digest=bundle_digest,
                template_id=template_id,
                task_type=task_type,
            )
            self._add_attempt(s, run_id, 1, target, backend_key, "submit", actor)
        return self.get_run(run_id)

    def _add_attempt(
        self,
        s: Session,
        run_id: str,
        number: int,
        target: str | None,
        backend_key: str,
        trigger: str,
        actor: str,
    ) -> str:
        now = utcnow()
        attempt_id = f"{run_id}-{number}"
        s.add(
            AttemptRow(
                id=attempt_id,
                run_id=run_id,
                number=number,
                state=RunState.PREPARED.value,
                target=target,
                backend_key=backend_key,
                trigger=trigger,
                cancel_requested=False,
                created_at=now,
                updated_at=now,
            )
        )
        self._event(
            s,
            actor,
            "attempt.created",
            run_id=run_id,
            attempt_id=attempt_id,
            number=number,
            target=target,
            trigger=trigger,
        )
        return attempt_id

    def add_attempt(
        self,
        run_id: str,
        *,
        target: str | None,
        backend_key: str,
        trigger: str,
        actor: str,
        not_before: datetime | None = None,
    ) -> AttemptRecord:
        """A new attempt of the run's bundle, once the current one has ended."""
        try:
            with self._tx() as s:
                last = s.scalars(
                    select(AttemptRow)
                    .where(AttemptRow.run_id == run_id)
                    .order_by(AttemptRow.number.desc())
                    .limit(1)
                ).first()
                if last is None:
                    raise NotFound(f"unknown run '{run_id}'")
                if not RunState(last.state).terminal:
                    raise InvalidInput(
                        f"run {run_id} is still {last.state}: cancel it before retrying"
                    )
                number = last.number + 1
                attempt_id = self._add_attempt(
                    s, run_id, number, target, backend_key, trigger, actor
                )
                if not_before is not None:
                    s.flush()
                    s.execute(
                        update(AttemptRow)
                        .where(AttemptRow.id == attempt_id)
                        .values(not_before=not_before)
                    )
        except IntegrityError:  # another process added attempt `number` first
            raise InvalidInput(
                f"run {run_id} already has a new attempt {number}: another retry was first"
            ) from None
        return self.get_attempt(attempt_id)

    def move_attempt(
        self,
        attempt_id: str,
        to: RunState,
        *,
        actor: str,
        reason: FailureReason | None = None,
        expect: RunState | None = None,
        exit_code: int | None = None,
        message: str | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
    ) -> bool:
        """The one function that changes a state. It checks the move against the table,
        compares-and-sets the row (so two processes never both make the same move), and writes
        the event in the same transaction. Returns False when the attempt is already there
        (or, with `expect`, no longer where the caller saw it)."""
        with self._tx() as s:
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            current = RunState(row.state)
            if current == to or (expect is not None and current != expect):
                return False
            check_move(current, to, reason)
            now = utcnow()
            values: dict[str, Any] = {"state": to.value, "updated_at": now, "reason": reason}
            if exit_code is not None:
                values["exit_code"] = exit_code
            if message is not None:
                values["message"] = message
            if started_at is not None:
                values["started_at"] = started_at
            if to.terminal:
                values["finished_at"] = finished_at or now
            result = s.execute(
                update(AttemptRow)
                .where(AttemptRow.id == attempt_id, AttemptRow.state == current.value)
                .values(**values)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                return False
            data: dict[str, Any] = {"from": current.value, "to": to.value}
            if reason is not None:
                data["reason"] = reason.value
            if exit_code is not None:
                data["exit_code"] = exit_code
            if message:
                data["message"] = message
            self._event(s, actor, "attempt.state", run_id=row.run_id, attempt_id=attempt_id, **data)
        return True

    def set_handle(self, attempt_id: str, handle: RunHandle) -> None:
        """Where the launched attempt is; launching it was a contact with its host."""
        now = utcnow()
        with self._tx() as s:
            s.execute(
                update(AttemptRow)
                .where(AttemptRow.id == attempt_id)
                .values(handle=handle.model_dump(mode="json"), updated_at=now, last_contact_at=now)
            )

    def record_launch(self, attempt_id: str, handle: RunHandle, *, actor: str, **data: Any) -> bool:
        """The attempt was launched: its handle and the move prepared -> submitted, with both
        events, in one compare-and-set. False when the attempt had already left prepared (a
        reconciler judged it meanwhile): the handle is then not recorded."""
        now = utcnow()
        with self._tx() as s:
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            check_move(RunState.PREPARED, RunState.SUBMITTED, None)
            result = s.execute(
                update(AttemptRow)
                .where(AttemptRow.id == attempt_id, AttemptRow.state == RunState.PREPARED.value)
                .values(
                    state=RunState.SUBMITTED.value,
                    handle=handle.model_dump(mode="json"),
                    updated_at=now,
                    last_contact_at=now,
                    unreachable_since=None,
                    reason=None,
                    message=None,
                    lease_owner=None,
                    lease_expires_at=None,
                    not_before=None,
                )
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                return False
            self._event(
                s,
                actor,
                "attempt.state",
                run_id=row.run_id,
                attempt_id=attempt_id,
                **{"from": RunState.PREPARED.value, "to": RunState.SUBMITTED.value},
            )
            self._event(
                s,
                actor,
                "run.submitted",
                run_id=row.run_id,
                attempt_id=attempt_id,
                backend=handle.backend_key,
                target=handle.target,
                location=handle.location,
                **data,
            )
        return True

    def claim_launch(
        self, attempt_id: str, owner: str, until: datetime, *, expect: str | None
    ) -> bool:
        """Claim a prepared, unlaunched attempt for launching, if its claim is still `expect`'s
        (None: unclaimed). Compare-and-set: of two processes, one wins."""
        with self._tx() as s:
            held = (
                AttemptRow.lease_owner.is_(None)
                if expect is None
                else AttemptRow.lease_owner == expect
            )
            result = s.execute(
                update(AttemptRow)
                .where(
                    AttemptRow.id == attempt_id,
                    AttemptRow.state == RunState.PREPARED.value,
                    AttemptRow.handle.is_(None),
                    held,
                )
                .values(lease_owner=owner, lease_expires_at=until)
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def renew_launch(self, attempt_id: str, owner: str, until: datetime) -> bool:
        with self._tx() as s:
            result = s.execute(
                update(AttemptRow)
                .where(
                    AttemptRow.id == attempt_id,
                    AttemptRow.state == RunState.PREPARED.value,
                    AttemptRow.lease_owner == owner,
                )
                .values(lease_expires_at=until)
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def defer_launch(self, attempt_id: str, not_before: datetime) -> None:
        """Give up the launch claim; the attempt is due again at `not_before`."""
        with self._tx() as s:
            s.execute(
                update(AttemptRow)
                .where(AttemptRow.id == attempt_id, AttemptRow.state == RunState.PREPARED.value)
                .values(lease_owner=None, lease_expires_at=None, not_before=not_before)
            )

    def record_contact(
        self, attempt_id: str, *, reachable: bool, actor: str, message: str | None = None
    ) -> None:
        """Whether the attempt's host answered just now. Not a state change: an unreachable
        host's attempt keeps its state, with reason host_unreachable and the time of the last
        contact, until it answers again or the service gives up on it. Only the first miss and
        the first contact after one are audited."""
        now = utcnow()
        with self._tx() as s:
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            if RunState(row.state).terminal:
                return
            if reachable:
                if row.unreachable_since is not None:
                    self._event(s, actor, "host.reachable", run_id=row.run_id, attempt_id=row.id)
                    row.reason, row.message = None, None
                row.last_contact_at, row.unreachable_since = now, None
            else:
                if row.unreachable_since is None:
                    self._event(
                        s,
                        actor,
                        "host.unreachable",
                        run_id=row.run_id,
                        attempt_id=row.id,
                        message=message,
                    )
                    row.unreachable_since = now
                row.reason = FailureReason.HOST_UNREACHABLE.value
                row.message = message

    def request_cancel(self, attempt_id: str, actor: str) -> None:
        with self._tx() as s:
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            row.cancel_requested = True
            self._event(s, actor, "run.cancel_requested", run_id=row.run_id, attempt_id=row.id)

    def record_event(
        self,
        actor: str,
        action: str,
        *,
        run_id: str | None = None,
        attempt_id: str | None = None,
        **data: Any,
    ) -> None:
        with self._tx() as s:
            self._event(s, actor, action, run_id=run_id, attempt_id=attempt_id, **data)

    # --- reads ----------------------------------------------------------------------------

    def resolve_run_id(self, ref: str) -> str:
        """A full run id, or a unique prefix of one (at least 4 characters after `run-`)."""
        with self._sessions() as s:
            if s.get(RunRow, ref) is not None:
                return ref
            candidates = [ref, f"run-{ref}"] if not ref.startswith("run-") else [ref]
            for prefix in candidates:
                if len(prefix) < len("run-") + 4:
                    continue
                ids = s.scalars(
                    select(RunRow.id).where(RunRow.id.startswith(prefix, autoescape=True)).limit(2)
                ).all()
                if len(ids) == 1:
                    return ids[0]
                if len(ids) > 1:
                    raise InvalidInput(f"run id '{ref}' is ambiguous: give more characters")
        raise NotFound(f"unknown run '{ref}' (see 'orbit runs list')")

    @staticmethod
    def _attempt_record(row: AttemptRow) -> AttemptRecord:
        return AttemptRecord(
            id=row.id,
            run_id=row.run_id,
            number=row.number,
            state=RunState(row.state),
            reason=FailureReason(row.reason) if row.reason else None,
            target=row.target,
            backend_key=row.backend_key,
            trigger=row.trigger,
            handle=RunHandle.model_validate(row.handle) if row.handle else None,
            exit_code=row.exit_code,
            message=row.message,
            cancel_requested=row.cancel_requested,
            created_at=_aware(row.created_at),
            updated_at=_aware(row.updated_at),
            started_at=_aware(row.started_at),
            finished_at=_aware(row.finished_at),
            last_contact_at=_aware(row.last_contact_at),
            unreachable_since=_aware(row.unreachable_since),
            lease_owner=row.lease_owner,
            lease_expires_at=_aware(row.lease_expires_at),
            not_before=_aware(row.not_before),
        )

    def get_attempt(self, attempt_id: str) -> AttemptRecord:
        with self._sessions() as s:
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            return self._attempt_record(row)

    def _run_records(self, s: Session, rows: list[RunRow]) -> list[RunRecord]:
        if not rows:
            return []
        ids = [r.id for r in rows]
        attempts: dict[str, list[AttemptRecord]] = {i: [] for i in ids}
        for a in s.scalars(
            select(AttemptRow).where(AttemptRow.run_id.in_(ids)).order_by(AttemptRow.number)
        ):
            attempts[a.run_id].append(self._attempt_record(a))
        names = dict(
            s.execute(
                select(ExperimentRow.id, ExperimentRow.name).where(
                    ExperimentRow.id.in_({r.experiment_id for r in rows})
                )
            ).all()
        )
        return [
            RunRecord(
                id=r.id,
                experiment_id=r.experiment_id,
                experiment_name=names[r.experiment_id],
                task_type=r.task_type,
                template_id=r.template_id,
                bundle_digest=r.bundle_digest,
                submission=r.submission,
                request=r.request,
                created_at=_aware(r.created_at),
                created_by=r.created_by,
                replay_of=r.replay_of,
                attempts=tuple(attempts[r.id]),
            )
            for r in rows
        ]

    def get_run(self, ref: str) -> RunRecord:
        run_id = self.resolve_run_id(ref)
        with self._sessions() as s:
            row = s.get(RunRow, run_id)
            assert row is not None
            return self._run_records(s, [row])[0]

    def list_runs(
        self,
        *,
        experiment_id: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Newest first. `states` filters on each run's current attempt."""
        with self._sessions() as s:
            query = select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id)
            if experiment_id is not None:
                query = query.where(RunRow.experiment_id == experiment_id)
            if states:
                latest = (
                    select(AttemptRow.run_id, func.max(AttemptRow.number).label("n"))
                    .group_by(AttemptRow.run_id)
                    .subquery()
                )
                query = (
                    query.join(latest, latest.c.run_id == RunRow.id)
                    .join(
                        AttemptRow,
                        (AttemptRow.run_id == RunRow.id) & (AttemptRow.number == latest.c.n),
                    )
                    .where(AttemptRow.state.in_([st.value for st in states]))
                )
            if limit is not None:
                query = query.limit(limit)
            return self._run_records(s, list(s.scalars(query).all()))

    def count_runs(
        self, *, experiment_id: str | None = None, states: set[RunState] | None = None
    ) -> int:
        """How many runs `list_runs` would give without a limit."""
        return len(self.list_runs(experiment_id=experiment_id, states=states))

    def list_events(
        self, *, run_id: str | None = None, limit: int | None = None
    ) -> list[AuditEvent]:
        with self._sessions() as s:
            query = select(EventRow).order_by(EventRow.id)
            if run_id is not None:
                query = query.where(EventRow.run_id == run_id)
            if limit is not None:
                query = query.order_by(None).order_by(EventRow.id.desc()).limit(limit)
            rows = list(s.scalars(query).all())
            if limit is not None:
                rows.reverse()
            return [self._event_record(r) for r in rows]

    @staticmethod
    def _event_record(row: EventRow) -> AuditEvent:
        return AuditEvent(
            id=row.id,
            at=_aware(row.at),
            actor=row.actor,
            action=row.action,
            run_id=row.run_id,
            attempt_id=row.attempt_id,
            data=row.data,
            prev_hash=row.prev_hash,
            hash=row.hash,
        )

    def check_audit(self) -> ChainCheck:
        """Walk the whole audit chain, oldest first, in one read transaction."""
        with self._sessions() as s:
            rows = s.scalars(
                select(EventRow).order_by(EventRow.id).execution_options(yield_per=1000)
            )
            return check_chain(self._event_record(r) for r in rows)

    def verify_audit(self) -> list[str]:
        """Every problem with the audit chain, one line each naming the event; empty when the
        chain is intact."""
        return list(self.check_audit().problems)
