"""Placing attempts on nodes in the store, and the one start each gets: an attempt or a whole
gang placed where the node still has a slot and the GPUs (checked in the placing
transaction, so a stale plan is refused), its start command queued there under a new fence,
the fencing check an agent makes before it starts one, and what is placed where."""

from __future__ import annotations

from typing import Any

from orbit.model.errors import NotFound, Refused
from orbit.model.models import RunState
from orbit.store.attempt_states import ACTIVE_IN
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.node_commands import enqueue
from orbit.store.sql import Row, Tx, read_json

ACTIVE_STATES = tuple(s.value for s in RunState if not s.terminal)


class Placements(Part):
    def assign_attempt(
        self,
        attempt_id: str,
        node_id: str,
        gpus: dict[str, Any],
        start: dict[str, Any],
        actor: str,
    ) -> tuple[int, str] | None:
        """Place an attempt on a node and queue its start command, in one transaction that
        checks the node still takes work and has room, by its max_tasks as they are now (two
        launches never both take its last slot; a plan made before an admin cordoned or drained
        it is refused). The start carries that max_tasks: the agent checks against it, not
        against the one its last heartbeat brought. The fence goes up by one each time; returns
        (fence, command id), or None if the node is full or takes no work. Refused for an
        attempt already placed: a launcher that stalled past its lease while another placed
        the attempt must not place it a second time (it would start on two nodes)."""
        with self._write() as tx:
            if tx.dialect == "postgresql":
                tx.execute("SELECT id FROM nodes WHERE id = :id FOR UPDATE", {"id": node_id})
                tx.execute("SELECT id FROM attempts WHERE id = :a FOR UPDATE", {"a": attempt_id})
            if tx.scalar("SELECT node_id FROM attempts WHERE id = :a", {"a": attempt_id}):
                raise Refused(f"attempt {attempt_id} is already placed on a node")
            max_tasks = _room(tx, node_id, attempt_id, gpus)
            if max_tasks is None:
                return None
            fence = (
                int(
                    tx.scalar(
                        "SELECT COALESCE(fence, 0) FROM attempts WHERE id = :a", {"a": attempt_id}
                    )
                    or 0
                )
                + 1
            )
            tx.execute(
                # due a look now: a wait for a node put its next look far off, and a report
                # that it ended must not take that look for one under way (make_due)
                "UPDATE attempts SET node_id = :n, fence = :f, node_gpus = :g, "
                "node_claimed_at = NULL, reconcile_due_at = :now WHERE id = :a",
                {"n": node_id, "f": fence, "g": gpus, "a": attempt_id, "now": utcnow()},
            )
            command_id = enqueue(
                tx,
                node_id,
                {**start, "fence": fence, "max_tasks": max_tasks},
                attempt_id=attempt_id,
            )
            run_id = tx.scalar("SELECT run_id FROM attempts WHERE id = :a", {"a": attempt_id})
            name = tx.scalar("SELECT name FROM nodes WHERE id = :n", {"n": node_id})
            append_event(
                tx,
                actor,
                "attempt.placed",
                run_id=run_id,
                attempt_id=attempt_id,
                node=name,
                fence=fence,
                gpus=list(gpus.get("indices", ())),
            )
        return fence, command_id

    def assign_gang(
        self,
        attempt_id: str,
        ranks: list[tuple[str, dict[str, Any], dict[str, Any]]],
        actor: str,
    ) -> list[str] | None:
        """Place a gang, all of it or none, in one transaction: rank 0 on the attempt itself,
        each other rank on a member attempt made here (`<attempt>.r<rank>`, following its
        leader's state), each node checked as assign_attempt checks one; `ranks` gives each
        rank's (node id, GPUs, start command). Every start carries fence 1 and its node's
        max_tasks. The attempt ids by rank, or None if a node has no room (the next pass
        places it again). Refused for an attempt already placed."""
        try:
            return self._assign_gang(attempt_id, ranks, actor)
        except _NoRoom:
            return None

    def _assign_gang(
        self,
        attempt_id: str,
        ranks: list[tuple[str, dict[str, Any], dict[str, Any]]],
        actor: str,
    ) -> list[str]:
        with self._write() as tx:
            if tx.dialect == "postgresql":
                for node_id in sorted({n for n, _, _ in ranks}):  # one order: no deadlock
                    tx.execute("SELECT id FROM nodes WHERE id = :id FOR UPDATE", {"id": node_id})
                tx.execute("SELECT id FROM attempts WHERE id = :a FOR UPDATE", {"a": attempt_id})
            leader = tx.one(
                "SELECT run_id, number, node_id, backend_key, target, state, handle "
                "FROM attempts WHERE id = :a",
                {"a": attempt_id},
            )
            if leader is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            if leader["node_id"]:
                raise Refused(f"attempt {attempt_id} is already placed on a node")
            if leader["state"] != RunState.PREPARED.value or leader["handle"] is not None:
                # ended (cancelled, given up on) while a stalled launcher planned it: members
                # made now would run and hold their nodes with nobody to end them
                raise Refused(f"attempt {attempt_id} is {leader['state']}: not placed")
            ids = [attempt_id] + [f"{attempt_id}.r{rank}" for rank in range(1, len(ranks))]
            now = utcnow()
            names = []
            for rank, (node_id, gpus, start) in enumerate(ranks):
                max_tasks = _room(tx, node_id, attempt_id, gpus)
                if max_tasks is None:
                    raise _NoRoom  # rolls back the ranks placed so far: all or nothing
                member = ids[rank]
                if rank:
                    tx.execute(
                        "INSERT INTO attempts (id, run_id, number, rank, gang_of, state, target, "
                        'backend_key, "trigger", cancel_requested, created_at, updated_at) '
                        "VALUES (:id, :run, :number, :rank, :leader, :state, :target, :backend, "
                        "'gang', :no, :now, :now)",
                        {
                            "id": member,
                            "run": leader["run_id"],
                            "number": leader["number"],
                            "rank": rank,
                            "leader": attempt_id,
                            "state": RunState.SUBMITTED.value,
                            "target": leader["target"],
                            "backend": leader["backend_key"],
                            "no": False,
                            "now": now,
                        },
                    )
                tx.execute(
                    "UPDATE attempts SET node_id = :n, fence = 1, node_gpus = :g, "
                    "node_claimed_at = NULL, reconcile_due_at = :now WHERE id = :a",
                    {"n": node_id, "g": gpus, "a": member, "now": now},
                )
                body = {**start, "attempt_id": member, "fence": 1, "max_tasks": max_tasks}
                enqueue(tx, node_id, body, attempt_id=member)
                names.append(tx.scalar("SELECT name FROM nodes WHERE id = :n", {"n": node_id}))
            append_event(
                tx,
                actor,
                "attempt.placed",
                run_id=leader["run_id"],
                attempt_id=attempt_id,
                node=names[0],
                fence=1,
                gpus=list(ranks[0][1].get("indices", ())),
                gang=[{"rank": r, "attempt": ids[r], "node": names[r]} for r in range(len(ranks))],
            )
        return ids

    def claim_start(self, node_id: str, attempt_id: str, fence: int) -> tuple[bool, str]:
        """The fencing check an agent makes before it starts an attempt: granted to the node
        the attempt is placed on, under its current fence, while it has not ended. Asking
        again for the same placement is granted again (an answer lost on the way): the node
        itself never starts an attempt whose folder it has."""
        with self._write() as tx:
            granted = tx.execute(
                "UPDATE attempts SET node_claimed_at = COALESCE(node_claimed_at, :now) "
                "WHERE id = :a AND node_id = :n "
                f"AND fence = :f AND state IN {ACTIVE_IN}",
                {"now": utcnow(), "a": attempt_id, "n": node_id, "f": fence},
            )
            if granted == 1:
                return True, ""
            row = tx.one(
                "SELECT node_id, fence, node_claimed_at, state FROM attempts WHERE id = :a",
                {"a": attempt_id},
            )
        if row is None:
            return False, f"unknown attempt '{attempt_id}'"
        if row["node_id"] != node_id:
            return False, "the attempt is placed on another node"
        if row["fence"] != fence:
            return False, f"stale fence {fence} (the attempt's is {row['fence']})"
        if row["state"] not in ACTIVE_STATES:
            return False, f"the attempt has ended ({row['state']})"
        return False, "not granted"

    def gang_members(self, attempt_id: str) -> list[Row]:
        """A gang's ranks but 0: id, rank, node_id and its node's name, by rank."""
        with self._read() as tx:
            return tx.all(
                "SELECT a.id, a.rank, a.node_id, n.name FROM attempts a "
                "LEFT JOIN nodes n ON n.id = a.node_id WHERE a.gang_of = :a ORDER BY a.rank",
                {"a": attempt_id},
            )

    def node_attempts(self, node_id: str) -> list[Row]:
        """Its attempts that have not ended: id, fence, claimed, state."""
        with self._read() as tx:
            return tx.all(
                "SELECT id, run_id, fence, node_claimed_at, state FROM attempts "
                f"WHERE node_id = :n AND state IN {ACTIVE_IN}",
                {"n": node_id},
            )

    def attempt_placement(self, attempt_id: str) -> Row | None:
        with self._read() as tx:
            return tx.one(
                "SELECT node_id, fence, node_claimed_at, node_gpus, state FROM attempts "
                "WHERE id = :a",
                {"a": attempt_id},
            )

    def node_runs_bundle(self, node_id: str, digest: str) -> bool:
        """Whether an attempt placed on this node and not ended runs the bundle `digest`: the
        only bundles a node may download (another run's frozen code is not its business)."""
        with self._read() as tx:
            return (
                tx.one(
                    "SELECT 1 AS found FROM attempts a JOIN runs r ON r.id = a.run_id "
                    f"WHERE a.node_id = :n AND r.bundle_digest = :d AND a.state IN {ACTIVE_IN}",
                    {"n": node_id, "d": digest},
                )
                is not None
            )


class _NoRoom(Exception):
    """A gang's node had no room: its transaction is rolled back."""


def _room(tx: Tx, node_id: str, attempt_id: str, gpus: dict[str, Any]) -> int | None:
    """The node's max_tasks if it takes work and has a slot and the GPUs for the attempt
    (`gpus`, as placed) now, else None."""
    node = tx.one("SELECT state, max_tasks FROM nodes WHERE id = :n", {"n": node_id})
    if node is None or node["state"] != "active":
        return None
    max_tasks = int(node["max_tasks"])
    busy = tx.scalar(
        f"SELECT count(*) FROM attempts WHERE node_id = :n AND state IN {ACTIVE_IN} AND id <> :a",
        {"n": node_id, "a": attempt_id},
    )
    if busy >= max_tasks or not _gpus_free(tx, node_id, attempt_id, gpus):
        return None
    return max_tasks


def _gpus_free(tx: Tx, node_id: str, attempt_id: str, gpus: dict[str, Any]) -> bool:
    """Whether the GPUs a placement asks for are still free on the node (whole), or still
    have room for its reservation: a plan made before another placement took them is
    refused, not committed over it."""
    want = [int(i) for i in gpus.get("indices", ())]
    if not want:
        return True
    held: dict[int, float] = {}
    for row in tx.all(
        f"SELECT node_gpus FROM attempts WHERE node_id = :n AND state IN {ACTIVE_IN} "
        "AND id <> :a AND node_gpus IS NOT NULL",
        {"n": node_id, "a": attempt_id},
    ):
        placed = read_json(row["node_gpus"]) or {}
        per = float(placed.get("memory_gb", 0.0) or 0.0)
        for index in placed.get("indices", ()):
            held[int(index)] = float("inf") if per == 0 else held.get(int(index), 0.0) + per
    share = float(gpus.get("memory_gb", 0.0) or 0.0)
    totals = gpus.get("gpu_gb") or {}
    for index in want:
        if not share and index in held:
            return False
        if share and held.get(index, 0.0) + share > float(totals.get(str(index), float("inf"))):
            return False
    return True
