"""Alembic environment: ORBIT runs migrations itself, on a connection it passes in."""

from alembic import context

from orbit.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
