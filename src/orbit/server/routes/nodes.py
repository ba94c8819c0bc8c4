"""/api/v1/nodes: the agent nodes and the tokens they join with; admins cordon, drain, revoke
and remove them, and push files to them and pull files from them. The agents' own traffic
is orbit.server.agents'."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, Field

from orbit.core.control.service import CoreControlService
from orbit.model.errors import InvalidInput
from orbit.model.nodes import MAX_TRANSFER_BYTES, JoinTokenRecord, NewJoinToken, NodeRecord
from orbit.server.routes.common import NUL, Body, api_router, me
from orbit.server.waiting import on_slow_threads
from orbit.wire.protocol import MAX_LABELS

# a node's name or id (names as orbit.wire.protocol.NODE_NAME allows them)
NODE_REF = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
JOIN_ID = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
NODE_PATH = Annotated[str, Query(min_length=1, max_length=4096, description="under its work dir")]
OCTETS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}
}


class NewJoinTokenBody(Body):
    labels: dict[str, str] = Field(
        default={}, max_length=MAX_LABELS, description="given to every node that joins with it"
    )
    expires: str | None = Field(default=None, min_length=1, max_length=16, examples=["30d"])


class NodeSettings(Body):
    cordon: bool | None = Field(default=None, description="true: no new work; false: again")
    # 0 to 1024, checked by the service (its error names --max-tasks, as the CLI's does)
    max_tasks: int | None = Field(default=None, description="attempts at once, 0 to 1024; 0: drain")
    # 1 to 256 characters, checked by the service (its error names --reason)
    reason: str | None = Field(
        default=None,
        max_length=4096,
        description="why it is out of service (drained or cordoned); cleared when it takes work",
    )


class Pushed(BaseModel):
    node: str
    dest: str
    size: int
    result: dict[str, Any] = {}  # what the node's agent answered


def make_nodes_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    # -- agent nodes -----------------------------------------------------------------------
    # /nodes/join-tokens first: /nodes/{ref} would take it for a node's name
    @router.post("/nodes/join-tokens", response_model=NewJoinToken, status_code=201, tags=["nodes"])
    def create_join_token(who: me, body: NewJoinTokenBody) -> NewJoinToken:
        """A token agents join with (`orbit agent --join-token`), shown in this answer only
        (the server keeps its hash). Nodes that join with it get its labels."""
        with who.acting() as svc:
            return svc.create_join_token(body.labels, body.expires)

    @router.get("/nodes/join-tokens", response_model=list[JoinTokenRecord], tags=["nodes"])
    def list_join_tokens(who: me) -> list[JoinTokenRecord]:
        """Join tokens, never the tokens themselves."""
        return service.list_join_tokens()

    @router.delete("/nodes/join-tokens/{token_id}", response_model=JoinTokenRecord, tags=["nodes"])
    def revoke_join_token(who: me, token_id: JOIN_ID) -> JoinTokenRecord:
        """No node joins with it from now on; nodes that joined with it are not touched."""
        with who.acting() as svc:
            svc.revoke_join_token(token_id)
        return next(t for t in service.list_join_tokens() if t.id == token_id)

    @router.get("/nodes", response_model=list[NodeRecord], tags=["nodes"])
    def list_nodes(who: me) -> list[NodeRecord]:
        return service.list_nodes()

    @router.get("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def get_node(who: me, ref: NODE_REF) -> NodeRecord:
        return service.get_node(ref)

    @router.post("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def set_node(who: me, ref: NODE_REF, body: NodeSettings) -> NodeRecord:
        """Cordon or uncordon a node, or set how many attempts it runs at once (0: drain:
        no new work, and once what runs there ends the node is free for people)."""
        with who.acting() as svc:
            return svc.set_node(
                ref, cordon=body.cordon, max_tasks=body.max_tasks, reason=body.reason
            )

    @router.post("/nodes/{ref}/revoke", response_model=NodeRecord, tags=["nodes"])
    def revoke_node(who: me, ref: NODE_REF) -> NodeRecord:
        """Refuse the node's credential from now on; its attempts are lost (and retried
        elsewhere, as their retry policy says)."""
        with who.acting() as svc:
            return svc.revoke_node(ref)

    @router.delete("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def remove_node(who: me, ref: NODE_REF, force: bool = False) -> NodeRecord:
        """Forget a node (the answer is it as it was). Refused while it runs attempts,
        unless `force` (they are lost)."""
        with who.acting() as svc:
            return svc.remove_node(ref, force)

    @router.post("/nodes/{ref}/push", response_model=Pushed, tags=["nodes"])
    @on_slow_threads  # it waits for the node's agent to fetch it
    def push_file(
        who: me,
        ref: NODE_REF,
        file: Annotated[UploadFile, File(description="the file, at most 48 MiB")],
        dest: Annotated[str, Form(min_length=1, max_length=4096, description="under its work dir")],
    ) -> Pushed:
        """Write a file to `dest` under the node's work dir (its agent fetches it)."""
        if "\x00" in dest:
            raise InvalidInput(f"dest: {NUL}")
        data = file.file.read(MAX_TRANSFER_BYTES + 1)
        if len(data) > MAX_TRANSFER_BYTES:
            raise InvalidInput(f"file: at most {MAX_TRANSFER_BYTES:,} bytes per push")
        node = service.get_node(ref)
        with who.acting() as svc:
            result = svc.push_file(node.id, data, dest)
        return Pushed(node=node.name, dest=dest, size=len(data), result=result)

    @router.get("/nodes/{ref}/pull", tags=["nodes"], response_class=Response, responses=OCTETS)
    @on_slow_threads
    def pull_file(who: me, ref: NODE_REF, path: NODE_PATH) -> Response:
        """A file from under the node's work dir, as it is there."""
        with who.acting() as svc:
            data = svc.pull_file(ref, path)
        return Response(data, media_type="application/octet-stream")

    return router

    return router
