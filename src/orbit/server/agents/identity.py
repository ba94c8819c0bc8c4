"""Who an agent is: its node found by its credential (a revoked node refused at once), a
node acting only for itself, the protocol version it speaks, and joining with a join token
(the node's credential, shown once)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from orbit.core.control.service import CoreControlService
from orbit.model.auth import token_hash
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput, Unauthorized
from orbit.model.nodes import NodeRecord, NodeState
from orbit.store import Store
from orbit.wire import protocol as p

CREDENTIAL_PREFIX = "orbitnode_"


def node_of(request: Request) -> NodeRecord:
    node = request.scope.get("state", {}).get("node")
    if not isinstance(node, NodeRecord):  # the middleware sets it on every agent path
        raise Unauthorized("an agent request needs its node credential")
    return node


this_node = Annotated[NodeRecord, Depends(node_of)]


def authenticate_node(service: CoreControlService, header: str) -> NodeRecord:
    from orbit.server.auth_failures import MALFORMED, MISSING, REVOKED, UNKNOWN, AuthFailed

    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise AuthFailed(
            "an agent request needs `Authorization: Bearer <node credential>`",
            MALFORMED if header else MISSING,
        )
    node = service.store.nodes.node_by_credential(token_hash(credential.strip()))
    if node is None:
        raise AuthFailed(
            "the node credential was not accepted (unknown, or its node removed)", UNKNOWN
        )
    if node.state is NodeState.REVOKED:
        raise AuthFailed(f"node '{node.name}' was revoked", REVOKED)
    return node


def own(node: NodeRecord, node_id: str) -> None:
    if node_id != node.id:
        raise Unauthorized(f"this credential is node '{node.name}''s: it cannot act for {node_id}")


def register_node(store: Store, settings: Settings, body: p.RegisterRequest) -> p.RegisterResponse:
    problem = p.labels_problem(body.labels)
    if problem:
        raise InvalidInput(f"labels: {problem}")
    if body.name == "join-tokens":  # /api/v1/nodes/join-tokens is the join tokens' own
        raise InvalidInput("name: 'join-tokens' is reserved; give the node another --name")
    from orbit.model.auth import new_token

    credential = new_token(CREDENTIAL_PREFIX)
    node = store.nodes.register_node(
        token_hash(body.join_token),
        body.name,
        body.labels,
        body.max_tasks,
        body.info.model_dump(mode="json"),
        token_hash(credential),
    )
    return p.RegisterResponse(
        node_id=node.id,
        name=node.name,
        credential=credential,
        heartbeat_s=settings.node_heartbeat_s,
    )


def other_version(version: str | None) -> str | None:
    """Why an agent speaking `version` (its X-Orbit-Agent-Protocol header) is refused."""
    if version != str(p.PROTOCOL_VERSION):
        return (
            f"this server speaks agent protocol {p.PROTOCOL_VERSION}, the agent "
            f"{version or 'none'}: run the same ORBIT version on both"
        )
    return None
