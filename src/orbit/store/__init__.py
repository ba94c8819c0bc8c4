"""The durable store: plain SQL over SQLite (default) or PostgreSQL, migrated by Alembic.

Neither SQLAlchemy nor Alembic is imported unless a store needs migrating (see schema.py).

May import only the vocabulary (orbit.model, orbit.wire)."""

from orbit.store.drivers import Conflict
from orbit.store.repository import Store
from orbit.store.sql import StoreError

__all__ = ["Conflict", "Store", "StoreError"]
