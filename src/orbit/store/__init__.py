"""The durable store: plain SQL over SQLite (default) or PostgreSQL, migrated by Alembic.

Neither SQLAlchemy nor Alembic is imported unless a store needs migrating (see schema.py)."""

from orbit.store.repository import Store
from orbit.store.sql import Conflict, StoreError

__all__ = ["Conflict", "Store", "StoreError"]
