"""Who may launch or look at an attempt, and when it is due, in the store: launch claims
(taken, renewed, given up until a wait is over), the reconcile leases each server replica's
loop takes on its share of the attempts, and the waits for a free node that a freed slot ends."""

from __future__ import annotations

from datetime import datetime

from orbit.model.models import RunState
from orbit.store.base import Part
from orbit.store.sql import Tx, expand

# who claims an attempt for launching, and until when the claim holds without a renewal
Lease = tuple[str, datetime]


def wake_waiting_for_nodes(
    tx: Tx, at: datetime, count: int = 1, after: datetime | None = None
) -> None:
    """Make the oldest attempts waiting for a free node due now (they wait NODE_WAIT_S
    between tries otherwise): a freed slot is taken within a reconcile pass, first come first
    served, without every waiting attempt asking again and again. Only those a scheduler pass
    left waiting (they have its decision): a retry in its backoff keeps its backoff."""
    tx.execute(
        "UPDATE attempts SET not_before = :at, reconcile_due_at = :at "
        "WHERE id IN (SELECT id FROM attempts "
        "WHERE state = :prepared AND handle IS NULL AND lease_owner IS NULL AND held IS NULL "
        "AND backend_key LIKE 'agent_pool%' AND not_before > :at "
        "AND EXISTS (SELECT 1 FROM sched_decisions d WHERE d.attempt_id = attempts.id) "
        + ("AND created_at > :after " if after is not None else "")
        + "ORDER BY created_at LIMIT :n)",
        {"at": at, "prepared": RunState.PREPARED.value, "n": count, "after": after},
    )


def set_launch_claim(
    tx: Tx, attempt_id: str, *, launcher: Lease | None, not_before: datetime | None
) -> None:
    """A new attempt's launch claim (`launcher`) and wait (`not_before`), in the transaction
    that makes it."""
    if launcher is None and not_before is None:
        return
    owner, until = launcher if launcher is not None else (None, None)
    tx.execute(
        "UPDATE attempts SET lease_owner = :owner, lease_expires_at = :until, "
        "not_before = :at WHERE id = :id",
        {"owner": owner, "until": until, "at": not_before, "id": attempt_id},
    )


class AttemptLeases(Part):
    def claim_launch(
        self, attempt_id: str, owner: str, until: datetime, *, expect: str | None
    ) -> bool:
        """Claim a prepared, unlaunched attempt for launching, if its claim is still `expect`'s
        (None: unclaimed). Compare-and-set: of two processes, one wins."""
        held = "lease_owner IS NULL" if expect is None else "lease_owner = :expect"
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE attempts SET lease_owner = :owner, lease_expires_at = :until "
                f"WHERE id = :id AND state = :prepared AND handle IS NULL AND {held}",
                {
                    "owner": owner,
                    "until": until,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "expect": expect,
                },
            )
        return changed == 1

    def renew_launch(self, attempt_id: str, owner: str, until: datetime) -> bool:
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE attempts SET lease_expires_at = :until "
                "WHERE id = :id AND state = :prepared AND lease_owner = :owner",
                {
                    "until": until,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "owner": owner,
                },
            )
        return changed == 1

    def defer_launch(
        self, attempt_id: str, owner: str, not_before: datetime, message: str | None = None
    ) -> None:
        """Give up `owner`'s launch claim; the attempt is due again at `not_before`. `message`
        says what it waits for (a free node), shown with the run."""
        sets = ", message = :message" if message is not None else ""
        with self._write() as tx:
            tx.execute(
                "UPDATE attempts SET lease_owner = NULL, lease_expires_at = NULL, "
                f"not_before = :at, reconcile_due_at = :at{sets} WHERE id = :id "
                "AND state = :prepared AND lease_owner = :owner",
                {
                    "message": message,
                    "at": not_before,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "owner": owner,
                },
            )

    def claim_reconcile(
        self, owner: str, *, at: datetime, lease_until: datetime, limit: int
    ) -> list[tuple[str, str]]:
        """Up to `limit` attempts that have not ended and are due a reconcile at `at` (never
        looked at first, then the longest due), leased to `owner` until `lease_until`:
        [(run_id, attempt_id)]. Each server replica's reconcile loop claims its share, so no
        two look at one attempt at once: SQLite's writers take turns, and on PostgreSQL rows
        another replica is claiming are skipped (FOR UPDATE SKIP LOCKED), not waited for."""
        if limit <= 0:
            return []
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        lock = " FOR UPDATE SKIP LOCKED" if self.dialect == "postgresql" else ""
        # SQLite would search by gang_of (null for nearly every attempt) and read them all:
        # 21 ms a pass, every second, at 100,000 attempts; a unary + keeps it on the state's
        # index (0.2 ms). PostgreSQL plans by its statistics (and has no + for text).
        gang = "+gang_of" if self.dialect == "sqlite" else "gang_of"
        with self._write() as tx:
            rows = tx.all(
                # a gang's members are looked at through their leader
                f"SELECT id, run_id FROM attempts WHERE state IN ({placeholders}) "
                f"AND {gang} IS NULL AND (reconcile_due_at IS NULL OR reconcile_due_at <= :at) "
                f"ORDER BY reconcile_due_at IS NOT NULL, reconcile_due_at, id LIMIT :limit{lock}",
                {**states, "at": at, "limit": limit},
            )
            if rows:
                ids, params = expand("id", [r["id"] for r in rows])
                tx.execute(
                    "UPDATE attempts SET reconcile_owner = :owner, reconcile_due_at = :until "
                    f"WHERE id IN ({ids})",
                    {**params, "owner": owner, "until": lease_until},
                )
        return [(r["run_id"], r["id"]) for r in rows]

    def reconcile_done(self, attempt_id: str, owner: str, next_due: datetime) -> None:
        """`owner` has looked at the attempt: it is due again at `next_due`, or, a prepared
        attempt waiting (a backoff, a free node), when its wait is over. A lease another
        replica has taken over meanwhile (this one's ran out) is left to it."""
        with self._write() as tx:
            tx.execute(
                "UPDATE attempts SET reconcile_due_at = CASE WHEN state = :prepared AND "
                "lease_owner IS NULL AND not_before > :due THEN not_before ELSE :due END "
                "WHERE id = :id AND reconcile_owner = :owner",
                {
                    "due": next_due,
                    "id": attempt_id,
                    "owner": owner,
                    "prepared": RunState.PREPARED.value,
                },
            )

    def make_due(self, attempt_ids: list[str], at: datetime, unless_after: datetime) -> int:
        """These attempts are due a reconcile at `at`: their execution plane has news (an
        agent reported them ended). One whose look is under way (due at its lease's end,
        past `unless_after`) is left alone: no second look at once. How many."""
        if not attempt_ids:
            return 0
        ids, params = expand("id", attempt_ids)
        with self._write() as tx:
            return tx.execute(
                # a gang member's news is its leader's (members are looked at through it)
                f"UPDATE attempts SET reconcile_due_at = :at WHERE (id IN ({ids}) OR id IN "
                f"(SELECT gang_of FROM attempts WHERE id IN ({ids}))) AND gang_of IS NULL "
                "AND (reconcile_due_at IS NULL OR reconcile_due_at <= :unless_after)",
                {**params, "at": at, "unless_after": unless_after},
            )

    def reconcile_holders(self, at: datetime) -> list[str]:
        """Who holds the reconcile leases of active attempts not due at `at`: a replica with a
        look under way, or the one whose last look scheduled the next."""
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        with self._read() as tx:
            rows = tx.all(
                "SELECT DISTINCT reconcile_owner FROM attempts "
                f"WHERE state IN ({placeholders}) AND reconcile_due_at > :at "
                "AND reconcile_owner IS NOT NULL",
                {**states, "at": at},
            )
        return sorted(str(r["reconcile_owner"]) for r in rows)

    def release_reconcile(self, owner: str, at: datetime) -> int:
        """`owner` is known gone (killed mid-look, say): the active attempts it holds are due
        at `at`, instead of when its leases would have run out. How many."""
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        with self._write() as tx:
            return tx.execute(
                "UPDATE attempts SET reconcile_due_at = :at "
                f"WHERE reconcile_owner = :owner AND state IN ({placeholders}) "
                "AND reconcile_due_at > :at",
                {**states, "owner": owner, "at": at},
            )
