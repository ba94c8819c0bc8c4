"""Files on demand: `orbit collect` (everything of an attempt, large files too) and
`orbit nodes push/pull` (one file in the work dir, never the agent's own: its credential,
its bundle cache, its attempts)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.agent import connection
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")


def upload_everything(agent: AgentState, attempt_id: str) -> None:
    with agent.lock:
        tracked = agent.tracked.get(attempt_id)
        if tracked is not None:
            tracked.everything = True
            tracked.done = False
        else:  # nothing of it here: the server hears so, rather than wait for files
            agent.missing.add(attempt_id)
    agent.report_wake.set()


def confined(agent: AgentState, relpath: str) -> Path:
    """`relpath` under the work dir; refused if it would lead out."""
    target = (agent.work / relpath.lstrip("/")).resolve()
    if not str(target).startswith(str(agent.work.resolve()) + os.sep):
        raise ValueError(f"'{relpath}' is outside the node's work dir")
    return target


def writable(agent: AgentState, relpath: str) -> Path:
    """`relpath` under the work dir for `orbit nodes push`; refused where it would write
    the agent's own files: its credential, its bundle cache (frozen code other runs
    execute) or its attempts (their frozen copies and what they wrote)."""
    target = confined(agent, relpath)
    own = (
        agent.bundles_dir,
        agent.attempts_dir,
        agent.work / connection.IDENTITY_FILE,
        agent.token_file,
    )
    for path in own:
        path = path.resolve()
        if target == path or target.is_relative_to(path):
            raise ValueError(
                f"'{relpath}' is the agent's own ({path.relative_to(agent.work.resolve())}): "
                "push elsewhere in its work dir"
            )
    return target


def put_file(agent: AgentState, body: p.PutFile) -> None:
    error = None
    try:
        target = writable(agent, body.dest)
        headers = {"authorization": f"Bearer {agent.identity['credential']}"}
        response = agent.http.get(f"{p.PREFIX}/transfers/{body.transfer_id}", headers=headers)
        if response.status_code != 200:
            raise ValueError(f"fetching the file: {connection.detail(response)}")
        data = response.content
        if hashlib.sha256(data).hexdigest() != body.sha256:
            raise ValueError("the file that arrived does not match its sha256")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        tmp.write_bytes(data)
        with contextlib.suppress(FileNotFoundError):  # a replaced file keeps its mode
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except OSError as exc:
        error = f"{body.dest}: {connection.why(exc)}"
    except ValueError as exc:
        error = str(exc)
    connection.post(
        agent,
        "/transfers",
        p.TransferDone(node_id=agent.node_id, transfer_id=body.transfer_id, error=error),
        connection.Ok,
    )


def get_file(agent: AgentState, body: p.GetFile) -> None:
    done = p.TransferDone(node_id=agent.node_id, transfer_id=body.transfer_id)
    try:
        target = confined(agent, body.path)
        if target in (agent.work.resolve() / connection.IDENTITY_FILE, agent.token_file.resolve()):
            raise ValueError(f"'{body.path}' is the node's credential: it stays on the node")
        data = target.read_bytes()
        done = done.model_copy(
            update={
                "data": base64.b64encode(data).decode(),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    except OSError as exc:
        done = done.model_copy(update={"error": f"{body.path}: {connection.why(exc)}"})
    except ValueError as exc:
        done = done.model_copy(update={"error": str(exc)})
    connection.post(agent, "/transfers", done, connection.Ok)
