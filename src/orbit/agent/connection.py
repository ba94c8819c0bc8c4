"""The agent's line to the control plane: joining (the node's identity, kept in its work dir,
and the join token dropped once used), each message posted and its answer read, and what a
server's answer becomes (Revoked, ServerSaid, ServerAway)."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

import httpx

from orbit.model.backoff import Backoff, retry_after
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")

IDENTITY_FILE = "agent-identity.json"
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0  # how soon a message is sent again, at first and at most


def load_or_register(agent: AgentState) -> None:
    # the work dir and attempts/ may be passed through (a task reaches its own attempt's
    # folder in them), never listed; the credential and the bundle cache are the agent's
    for folder, mode in (
        (agent.work, 0o711),
        (agent.attempts_dir, 0o711),
        (agent.bundles_dir, 0o700),
    ):
        folder.mkdir(mode=mode, parents=True, exist_ok=True)
        os.chmod(folder, mode)
    from orbit.core.execution.docker.host import plane_id

    agent.plane = plane_id(agent.attempts_dir)
    path = agent.work / IDENTITY_FILE
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("server") != agent.o.server.rstrip("/"):
            raise SystemExit(
                f"{path}: this work dir belongs to a node of {saved.get('server')}; use "
                "another --work-dir for another server"
            )
        os.chmod(path, 0o600)
        agent.identity = saved
        forget_join_token(agent)
        return
    if not agent.join_token and agent.o.join_token_file is not None:
        try:
            text = agent.o.join_token_file.expanduser().read_text()
        except OSError as exc:
            raise SystemExit(
                f"--join-token-file: {agent.o.join_token_file}: {exc.strerror or exc}"
            ) from None
        agent.join_token = read_join_token(text, f"--join-token-file {agent.o.join_token_file}")
    if not agent.join_token:
        raise SystemExit(
            f"this node has not joined yet ({path} is missing): give --join-token-file "
            "(`orbit nodes join-token create` on the control plane makes one)"
        )
    name = agent.o.name or os.uname().nodename.split(".")[0]
    body = p.RegisterRequest(
        join_token=agent.join_token,
        name=name,
        labels=agent.o.labels,
        max_tasks=agent.o.max_tasks,
        info=agent.node_info(),
    )
    answer = post(agent, "/register", body, p.RegisterResponse, auth=False)
    agent.identity = {
        "server": agent.o.server.rstrip("/"),
        "node_id": answer.node_id,
        "name": answer.name,
        "credential": answer.credential,
    }
    tmp = path.with_name(f".{path.name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(agent.identity, out)
    os.replace(tmp, path)
    log.info("joined %s as node %s (%s)", agent.o.server, answer.name, answer.node_id)
    forget_join_token(agent)


def forget_join_token(agent: AgentState) -> None:
    """Joined: the node's own credential is all it keeps. The join token (reusable: it
    joins more nodes) is dropped, and its file too where it is the agent's own."""
    agent.join_token = None
    given = agent.o.join_token_file
    if given is not None and given.absolute() == agent.token_file:
        agent.token_file.unlink(missing_ok=True)
        log.info("joined: removed the join token's file %s", agent.token_file)


def post(
    agent: AgentState, path: str, body: p.Message, answer: type[Any], auth: bool = True
) -> Any:
    headers = {"authorization": f"Bearer {agent.identity['credential']}"} if auth else {}
    content = body.model_dump_json()
    try:
        response = agent.http.post(p.PREFIX + path, content=content, headers=headers)
    except httpx.RemoteProtocolError:  # a kept-alive connection the server had closed:
        # every message is safe to send twice, so once more on a fresh one
        response = agent.http.post(p.PREFIX + path, content=content, headers=headers)
    return read_answer(agent, response, answer)


def read_answer(agent: AgentState, response: httpx.Response, answer: type[Any]) -> Any:
    if response.status_code == 401:
        raise Revoked(detail(response))
    if response.status_code >= 400:
        raise ServerSaid(response.status_code, detail(response), retry_after(response.headers))
    if agent.identity:  # (registering is no contact of a node yet)
        agent.fence.heard()
    return answer.model_validate_json(response.content)


def read_join_token(text: str, where: str) -> str:
    """The one token `text` holds; InvalidInput (naming `where`) for anything else."""
    from orbit.model.errors import InvalidInput

    token = text.strip()
    if not token or len(token.split()) != 1:
        raise InvalidInput(f"{where}: expected one join token (orbitjoin_...)")
    return token


class Revoked(Exception):
    """The server refuses this node's credential: revoked or removed."""


class ServerSaid(Exception):
    def __init__(self, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail
        self.retry_after = retry_after  # what its Retry-After asked for, in seconds


class ServerAway(Exception):
    """The server answered 5xx: its store away, a restart under way."""

    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


def asked(exc: BaseException) -> float | None:
    """The wait a server's answer asked for (Retry-After), if the failure was one."""
    return getattr(exc, "retry_after", None)


def backoff() -> Backoff:
    """A loop's waits between tries: full jitter from RETRY_MIN_S, capped at RETRY_MAX_S."""
    return Backoff(base_s=RETRY_MIN_S, cap_s=RETRY_MAX_S)


class Ok(p.Message):
    status: str = "ok"


def detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except ValueError:
        return response.text[:200] or f"HTTP {response.status_code}"


def why(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
