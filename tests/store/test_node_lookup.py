"""A node's record as each agent request looks it up (by its credential): its own running
attempts and GPUs in use, read by the node's own rows only; a list of all nodes says the same."""

from __future__ import annotations

import pytest

from orbit.model.auth import token_hash
from orbit.model.errors import Refused
from orbit.model.models import FailureReason, RunState
from orbit.store import Store
from orbit.store.sql import read_json
from tests.helpers import a_request, a_submission


def test_a_nodes_lookup_holds_its_own_attempts_and_gpus_only(store: Store) -> None:
    store.nodes.create_join_token(token_hash("join"), {}, None, "tests")
    nodes = [
        store.nodes.register_node(
            token_hash("join"), name, {}, 8, {"agent_version": "t"}, token_hash(f"cred-{name}")
        )
        for name in ("a", "b")
    ]
    experiment = store.experiments.create_experiment("e", "tests").id
    placed: dict[str, list[str]] = {"a": [], "b": []}
    for i, node in enumerate([nodes[0], nodes[1], nodes[1], nodes[0], nodes[1]]):
        run = store.runs.create_run(
            experiment_id=experiment, task_type="command", template_id="pool",
            bundle_digest="0" * 64, submission=a_submission(),
            request=a_request("agent_pool_host_process"), actor="tests",
        )  # fmt: skip
        gpus = {"indices": [i], "memory_gb": 0.0}
        assert store.placement.assign_attempt(run.current.id, node.id, gpus, {"kind": "start"}, "t")
        placed[node.name].append(run.current.id)
    ended = placed["b"].pop()  # an ended attempt is no longer running there
    store.attempts.move_attempt(
        ended, RunState.FAILED, actor="tests", reason=FailureReason.NODE_LOST
    )

    a = store.nodes.node_by_credential(token_hash("cred-a"))
    b = store.nodes.node_by_credential(token_hash("cred-b"))
    assert a is not None and b is not None
    assert list(a.running) == placed["a"] and set(a.gpus_in_use) == {0, 3}
    assert list(b.running) == placed["b"] and set(b.gpus_in_use) == {1, 2}
    listed = {n.name: n for n in store.nodes.list_nodes()}
    assert listed["a"].running == a.running and listed["b"].running == b.running
    assert store.nodes.get_node("b").gpus_in_use == b.gpus_in_use


def test_an_attempt_is_placed_once_however_many_launchers_try(store: Store) -> None:
    """A launcher that stalled past its lease while another placed the attempt cannot place it
    a second time: it would start on two nodes, each under its own fence."""
    store.nodes.create_join_token(token_hash("join"), {}, None, "tests")
    x, y = (
        store.nodes.register_node(
            token_hash("join"), name, {}, 8, {"agent_version": "t"}, token_hash(f"cred-{name}")
        )
        for name in ("x", "y")
    )
    experiment = store.experiments.create_experiment("e", "tests").id
    run = store.runs.create_run(
        experiment_id=experiment, task_type="command", template_id="pool",
        bundle_digest="0" * 64, submission=a_submission(),
        request=a_request("agent_pool_host_process"), actor="tests",
    )  # fmt: skip
    gpus = {"indices": [], "memory_gb": 0.0}
    placed = store.placement.assign_attempt(run.current.id, x.id, gpus, {"kind": "start"}, "t")
    assert placed is not None and placed[0] == 1
    with pytest.raises(Refused, match="already placed"):
        store.placement.assign_attempt(run.current.id, y.id, gpus, {"kind": "start"}, "t")
    assert store.placement.attempt_placement(run.current.id)["node_id"] == x.id
    assert store.commands.pending_commands(y.id) == []


def test_a_placement_is_checked_against_the_node_as_it_is_now(store: Store) -> None:
    """A plan made before an admin drained or cordoned a node is refused; one made before the
    admin raised max_tasks tells the agent the new figure, which its last heartbeat may not
    have brought yet."""
    from orbit.model.nodes import NodeState

    store.nodes.create_join_token(token_hash("join"), {}, None, "tests")
    node = store.nodes.register_node(
        token_hash("join"), "n", {}, 1, {"agent_version": "t"}, token_hash("cred-n")
    )
    experiment = store.experiments.create_experiment("e", "tests").id

    def attempt() -> str:
        run = store.runs.create_run(
            experiment_id=experiment, task_type="command", template_id="pool",
            bundle_digest="0" * 64, submission=a_submission(),
            request=a_request("agent_pool_host_process"), actor="tests",
        )  # fmt: skip
        return run.current.id

    gpus = {"indices": [], "memory_gb": 0.0}
    store.nodes.update_node("n", "admin", max_tasks=0)
    assert store.placement.assign_attempt(attempt(), node.id, gpus, {"kind": "start"}, "t") is None
    store.nodes.update_node("n", "admin", max_tasks=2, state=NodeState.CORDONED)
    assert store.placement.assign_attempt(attempt(), node.id, gpus, {"kind": "start"}, "t") is None
    store.nodes.update_node("n", "admin", state=NodeState.ACTIVE)
    assert (
        store.placement.assign_attempt(attempt(), node.id, gpus, {"kind": "start"}, "t") is not None
    )
    [start] = [read_json(c["body"]) for c in store.commands.pending_commands(node.id)]
    assert start["max_tasks"] == 2
