"""What the store knows of runs not launched yet, for what they wait for (core/control/
waits.py): their scheduler decisions, and every agent-pool attempt not launched yet (the
queue, with those in a retry's backoff or placed and not started, beside those a pass keeps
waiting)."""

from __future__ import annotations

from orbit.model.models import RunState
from orbit.model.records import AttemptRecord
from orbit.store.base import Part
from orbit.store.run_queries import ATTEMPT_COLUMNS, attempt_record, stored_request
from orbit.store.sql import Row, expand

CHUNK = 500  # run ids per IN (...)


class WaitReads(Part):
    def decisions_of(self, run_ids: list[str]) -> dict[str, Row]:
        """The latest scheduler decision of each run that has one (run id -> its row)."""
        found: dict[str, Row] = {}
        with self._read() as tx:
            for start in range(0, len(run_ids), CHUNK):
                marks, params = expand("r", run_ids[start : start + CHUNK])
                for row in tx.all(
                    "SELECT run_id, attempt_id, outcome, tier, position, body, at "
                    f"FROM sched_decisions WHERE run_id IN ({marks})",
                    params,
                ):
                    found[row["run_id"]] = row
        return found

    def pool_not_launched(self) -> list[tuple[AttemptRecord, str, str]]:
        """Every agent-pool attempt (a gang's leader) not launched yet, oldest first, with
        its run's tier (the request's priority) and who submitted it."""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE state = :prepared "
                "AND handle IS NULL AND gang_of IS NULL AND backend_key LIKE 'agent_pool%' "
                "ORDER BY created_at, id",
                {"prepared": RunState.PREPARED.value},
            )
            tiers: dict[str, str] = {}
            users: dict[str, str] = {}
            run_ids = sorted({r["run_id"] for r in rows})
            for start in range(0, len(run_ids), CHUNK):
                marks, params = expand("r", run_ids[start : start + CHUNK])
                found = tx.all(
                    f"SELECT id, request, created_by FROM runs WHERE id IN ({marks})", params
                )
                for run in found:
                    tiers[run["id"]] = stored_request(run["request"]).priority
                    users[run["id"]] = run["created_by"]
        return [
            (attempt_record(r), tiers.get(r["run_id"], "normal"), users.get(r["run_id"], ""))
            for r in rows
        ]
