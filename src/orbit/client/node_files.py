"""A file pushed to a node or pulled from one (`orbit nodes push/pull`), through the server,
its bytes told to a Meter as they go: the push as httpx reads it for sending, the pull as it
arrives (against the answer's Content-Length)."""

from __future__ import annotations

import io
from typing import IO, cast

# orbit.client.session first: it spares httpx its command line's imports (see there)
from orbit.client.session import API, Session, raise_for

# isort: split
import httpx

from orbit.client.meter import QUIET, Meter, MeteredFile


def push_file(
    session: Session, node: str, data: bytes, dest: str, meter: Meter = QUIET
) -> dict[str, object]:
    """Send `data` to `dest` under the node's work dir (`node`: a path segment)."""
    with meter.track("pushing", len(data)) as tick:
        # httpx takes any file that reads, seeks and tells (IO[bytes] is a wider promise)
        file = cast(IO[bytes], MeteredFile(io.BytesIO(data), tick))
        response = session.send(
            "POST",
            f"/nodes/{node}/push",
            data={"dest": dest},
            files={"file": ("file", file, "application/octet-stream")},
        )
    result: dict[str, object] = response.json()["result"]
    return result


def pull_file(session: Session, node: str, path: str, meter: Meter = QUIET) -> bytes:
    """The file at `path` under the node's work dir (`node`: a path segment)."""
    url = f"{API}/nodes/{node}/pull"
    try:
        with session.http.stream("GET", url, params={"path": path}) as response:
            if response.status_code >= 400:
                response.read()
                raise_for(response)
            size = response.headers.get("content-length")
            blocks: list[bytes] = []
            with meter.track("pulling", int(size) if size else None) as tick:
                moved = 0
                for block in response.iter_bytes():
                    blocks.append(block)
                    moved += len(block)
                    tick(moved)
    except httpx.TransportError as exc:
        raise session.unreachable(exc) from None
    return b"".join(blocks)
