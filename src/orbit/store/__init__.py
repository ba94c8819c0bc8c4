"""The durable store: plain SQL over SQLite (default) or PostgreSQL, migrated by Alembic.

Neither SQLAlchemy nor Alembic is imported unless a store needs migrating (see schema.py);
nor is Store's own weight (every part, the records it reads into) until Store is asked for,
so that what needs one driver alone (the shell's completion) imports that alone.

May import only the vocabulary (orbit.model, orbit.wire)."""

from typing import TYPE_CHECKING

from orbit.model.errors import StoreError
from orbit.store.drivers import Conflict

if TYPE_CHECKING:
    from orbit.store.repository import Store

__all__ = ["Conflict", "Store", "StoreError"]


def __getattr__(name: str) -> object:
    if name == "Store":
        from orbit.store.repository import Store

        return Store
    raise AttributeError(f"module 'orbit.store' has no attribute {name!r}")
