"""The durable store: SQLAlchemy 2 over SQLite (default) or PostgreSQL, migrated by Alembic."""

from orbit.store.repository import Store

__all__ = ["Store"]
