"""The runs a filter selects for a bulk action (`orbit cancel --experiment E --state S --user
U`): the same filter as `runs list`, and the user who made each run."""

from __future__ import annotations

from orbit.model.models import RunState
from orbit.model.records import RunRecord
from orbit.store.run_queries import RUN_COLUMNS, RUNS_FROM, RunQueriesMixin, runs_filter


class RunSelectionMixin(RunQueriesMixin):
    def select_runs(
        self,
        *,
        experiment_id: str | None,
        states: set[RunState] | None,
        user: str | None,
        limit: int,
    ) -> list[RunRecord]:
        """Newest first, at most `limit`."""
        condition, params = runs_filter(experiment_id, states)
        if user is not None:
            joiner = " AND " if " WHERE " in condition else " WHERE "
            condition += f"{joiner}r.created_by = :user"
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {RUN_COLUMNS} FROM {RUNS_FROM}{condition} "
                "ORDER BY r.created_at DESC, r.id LIMIT :limit",
                {**params, "user": user, "limit": limit},
            )
            return self._run_records(tx, rows)
