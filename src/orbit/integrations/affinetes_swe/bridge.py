"""The affinetes task's `mode: bridge`, on the node: the environment's own methods (reset,
step, state, checkpoint, restore, stop: whatever its actor has) served on a Unix socket to a
controller script of the user's, which ORBIT starts beside it with the socket's path in
ORBIT_AFFINETES_SOCKET. The run lasts as long as the controller and ends as it does.

One JSON object a line each way. A call: {"id": ANY, "method": NAME, "args": {...}}; its
answer: {"id": ANY, "result": ...} or {"id": ANY, "error": "..."}. The method "orbit.methods"
answers with the names there are. Every call and answer is appended to
artifacts/raw/bridge_events.jsonl as it happens. Standard library only, Python 3.8+; staged
beside the launcher as orbit_affinetes_bridge.py.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import os
import signal
import sys
import tempfile
from typing import Any

EVENTS = os.path.join("raw", "bridge_events.jsonl")
SOCKET_NAME = "affinetes.sock"
MAX_SOCKET_PATH = 100  # a Unix socket's path must fit in 108 bytes


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def methods_of(actor: Any) -> dict[str, Any]:
    return {
        name: getattr(actor, name)
        for name in dir(actor)
        if not name.startswith("_") and callable(getattr(actor, name, None))
    }


def socket_path(folder: str) -> str:
    """In the attempt's folder, or, where that path is too long for a socket, in a private
    folder of its own (0700) under the system's temporary one."""
    path = os.path.join(folder, SOCKET_NAME)
    if len(path.encode()) <= MAX_SOCKET_PATH:
        return path
    return os.path.join(tempfile.mkdtemp(prefix="orbit-bridge-"), SOCKET_NAME)


class Bridge:
    def __init__(self, actor: Any, events: Any, as_json: Any) -> None:
        self.methods, self.events, self.as_json = methods_of(actor), events, as_json
        self.calls, self.errors = 0, 0

    async def answer(self, line: bytes) -> dict[str, Any]:
        try:
            call = json.loads(line)
            name, args = call["method"], call.get("args") or {}
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("method must be a name and args a mapping")
        except (ValueError, KeyError, TypeError) as exc:
            return {"id": None, "error": f"not a call {{id, method, args}}: {exc}"}
        said: dict[str, Any] = {"id": call.get("id")}
        if name == "orbit.methods":
            said["result"] = sorted(self.methods)
        elif name not in self.methods:
            said["error"] = f"no method {name!r} (there are: {', '.join(sorted(self.methods))})"
        else:
            try:
                result = self.methods[name](**args)
                if inspect.isawaitable(result):
                    result = await result
                said["result"] = self.as_json(result)
            except Exception as exc:  # the environment's own error, told to the controller
                said["error"] = f"{type(exc).__name__}: {exc}"
        self.calls += 1
        self.errors += "error" in said
        record = {"at": now(), "method": name, "args": args, "answer": said}
        self.events.write(json.dumps(record, default=repr) + "\n")
        self.events.flush()
        return said

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                said = await self.answer(line)
                writer.write((json.dumps(said, default=repr) + "\n").encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


async def _run(bridge: Bridge, path: str, argv: list[str], stop: asyncio.Event) -> int | None:
    server = await asyncio.start_unix_server(bridge.serve, path=path)
    os.chmod(path, 0o600)
    env = {**os.environ, "ORBIT_AFFINETES_SOCKET": path}
    controller = await asyncio.create_subprocess_exec(*argv, env=env)
    ended = asyncio.ensure_future(controller.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([ended, stopped], return_when=asyncio.FIRST_COMPLETED)
    code = None
    if ended.done():
        code = ended.result()
    else:  # a cancel: the controller goes first, then the socket
        controller.terminate()
        await controller.wait()
    stopped.cancel()
    server.close()
    await server.wait_closed()
    return code


def serve(
    actor: Any, settings: dict[str, Any], artifacts: str, folder: str, as_json: Any
) -> tuple[int, dict[str, int], bool]:
    """Serve `actor` until the controller exits: (its exit code, counts, cut short by SIGTERM)."""
    os.makedirs(os.path.join(artifacts, "raw"), exist_ok=True)
    path = socket_path(folder)
    argv = [sys.executable, settings["controller"], *settings.get("controller_args", [])]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # 3.8/3.9 bind an Event to the current loop when made
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with open(os.path.join(artifacts, EVENTS), "a", encoding="utf-8") as events:
        bridge = Bridge(actor, events, as_json)
        print(f"orbit affinetes: bridge on {path} ({len(bridge.methods)} methods)", flush=True)
        try:
            code = loop.run_until_complete(_run(bridge, path, argv, stop))
        finally:
            loop.close()
            if os.path.exists(path):
                os.unlink(path)
            if os.path.basename(os.path.dirname(path)).startswith("orbit-bridge-"):
                os.rmdir(os.path.dirname(path))  # the private folder made for it
    counts = {"calls": bridge.calls, "errors": bridge.errors}
    return (128 + signal.SIGTERM if code is None else code), counts, code is None
