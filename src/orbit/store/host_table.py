"""The hosts registry in the store: add, read, record a check's facts, remove; each audited."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from orbit.core.errors import InvalidInput, NotFound
from orbit.core.hosts import HostFacts, HostRecord, HostSpec
from orbit.store.tables import HostRow

if TYPE_CHECKING:
    from orbit.store.repository import Store


def _aware(value: datetime) -> datetime:
    from orbit.store.repository import _aware as aware

    result = aware(value)
    assert result is not None
    return result


def already_exists(name: str) -> InvalidInput:
    return InvalidInput(f"host '{name}' already exists (orbit hosts remove {name} first)")


class HostTable:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def _record(row: HostRow) -> HostRecord:
        return HostRecord(
            spec=HostSpec.model_validate(row.spec),
            facts=HostFacts.model_validate(row.facts) if row.facts else None,
            created_at=_aware(row.created_at),
            created_by=row.created_by,
        )

    def add(self, spec: HostSpec, facts: HostFacts | None, actor: str) -> HostRecord:
        from orbit.store.repository import utcnow

        try:
            with self._store._tx() as s:
                s.add(
                    HostRow(
                        name=spec.name,
                        spec=spec.model_dump(mode="json"),
                        facts=facts.model_dump(mode="json") if facts else None,
                        created_at=utcnow(),
                        created_by=actor,
                    )
                )
                s.flush()
                self._store._event(s, actor, "host.added", host=spec.name, ssh=spec.ssh)
        except IntegrityError:  # another add won the race
            raise already_exists(spec.name) from None
        return self.get(spec.name)

    def find(self, name: str) -> HostRecord | None:
        with self._store._sessions() as s:
            row = s.get(HostRow, name)
            return None if row is None else self._record(row)

    def get(self, name: str) -> HostRecord:
        found = self.find(name)
        if found is None:
            raise NotFound(f"unknown host '{name}' (see 'orbit hosts list')")
        return found

    def all(self) -> list[HostRecord]:
        with self._store._sessions() as s:
            return [self._record(r) for r in s.scalars(select(HostRow).order_by(HostRow.name))]

    def set_facts(self, name: str, facts: HostFacts, actor: str) -> HostRecord:
        with self._store._tx() as s:
            row = s.get(HostRow, name)
            if row is None:
                raise NotFound(f"unknown host '{name}' (see 'orbit hosts list')")
            row.facts = facts.model_dump(mode="json")
            self._store._event(
                s,
                actor,
                "host.checked",
                host=name,
                gpus=len(facts.gpus),
                python=facts.python_version,
                disk_free_bytes=facts.disk_free_bytes,
            )
        return self.get(name)

    def active_attempts(self, name: str | None = None) -> set[str]:
        """The attempts that have not ended (on host `name`, or anywhere): the ones that may
        still be running. A container sweep keeps every one of them, wherever the store thinks
        it runs: a host registered twice, or re-added under another name, is still one box."""
        from orbit.core.models import RunState
        from orbit.store.tables import AttemptRow

        live = [s.value for s in RunState if not s.terminal]
        query = select(AttemptRow.id).where(AttemptRow.state.in_(live))
        if name is not None:
            query = query.where(AttemptRow.target == name)
        with self._store._sessions() as s:
            return set(s.scalars(query))

    def remove(self, name: str, actor: str) -> None:
        with self._store._tx() as s:
            row = s.get(HostRow, name)
            if row is None:
                raise NotFound(f"unknown host '{name}' (see 'orbit hosts list')")
            s.delete(row)
            self._store._event(s, actor, "host.removed", host=name)
