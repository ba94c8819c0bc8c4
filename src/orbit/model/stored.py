"""Values as a store hands them back: datetimes aware and in UTC, JSON decoded. The store reads
its columns with these, and so does whatever turns its rows into views (the scheduler's
inputs)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any


def utc(value: datetime) -> datetime:
    """A naive datetime is UTC (SQLite hands them back without a zone)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def read_time(value: Any) -> datetime | None:
    """A stored datetime, aware and in UTC: SQLite's text (with or without `+00:00`) or
    PostgreSQL's datetime in the session's zone."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime), value
    return utc(value)


def read_time_required(value: Any) -> datetime:
    result = read_time(value)
    assert result is not None
    return result


def read_json(value: Any) -> Any:
    """A JSON column: text on SQLite, already decoded by psycopg on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value
