"""The store and the control service are built from parts, each made with what it uses: one
part works alone, over a database or beside the shared collaborators, with no other part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.accounts import Accounts
from orbit.core.control.base import ServiceConfig, Shared, acting_as
from orbit.core.control.parts import Parts
from orbit.model.auth import Role
from orbit.model.errors import InvalidInput
from orbit.model.signals import Signal
from orbit.store import Store
from orbit.store.audit import AuditTrail
from orbit.store.base import open_database
from orbit.store.users import Users


def test_a_store_part_works_alone_over_its_database(store_url: str) -> None:
    db = open_database(store_url)
    try:
        users, audit = Users(db), AuditTrail(db)
        users.create_user("ana", Role.ADMIN, "installer")
        assert [u.name for u in users.list_users()] == ["ana"]
        assert [(e.actor, e.action) for e in audit.list_events()][-1] == ("installer", "user.add")
    finally:
        db.close()
    whole = Store(store_url)  # the same rows, read through the whole store
    try:
        assert [u.name for u in whole.users.list_users()] == ["ana"]
        assert whole.audit.check_audit().intact
    finally:
        whole.close()


def test_a_control_part_is_made_with_what_it_shares_and_no_other_part(
    store_url: str, tmp_path: Path
) -> None:
    store = Store(store_url)
    unused: Any = None  # what accounts never touch: the execution plane, the hosts
    shared = Shared(
        store, unused, lambda: unused, None, tmp_path, "ana", ServiceConfig(), Signal(), unused
    )
    accounts = Accounts(shared, Parts())  # no other part made
    try:
        accounts.add_user("bob", Role.MEMBER)
        with acting_as("carol"):  # as the server does for a token's user
            accounts.add_user("dave", Role.MEMBER)
        events = [(e.actor, e.data.get("user")) for e in store.audit.list_events()]
        assert events[-2:] == [("ana", "bob"), ("carol", "dave")]
        with pytest.raises(InvalidInput, match="--user: name the user"):
            accounts.create_token()  # embedded: nobody is signed in
    finally:
        store.close()
