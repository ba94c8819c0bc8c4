"""The HTTP session to `orbit server`'s API: requests, the errors their answers name (problem
details), and a request that makes a run sent again, with its idempotency key, while its
answer is lost. orbit.client.remote speaks ControlAPI through it."""

from __future__ import annotations

import sys
import time
import types
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

# httpx imports its own command line (`httpx._main`: click, rich, pygments) unless that fails;
# an empty stand-in makes it fail, which httpx allows for, and spares every `orbit` command
# talking to a server ~50 ms of imports it never uses.
sys.modules.setdefault("httpx._main", types.ModuleType("httpx._main"))
import httpx
from pydantic import BaseModel, TypeAdapter

from orbit.core.control.idempotency import HEADER
from orbit.model.backoff import Backoff, retry_after
from orbit.model.errors import BY_NAME, InvalidInput, OrbitError, ServerError, Unreachable
from orbit.model.version import __version__

M = TypeVar("M", bound=BaseModel)
API = "/api/v1"
# a request that makes a run is sent again, with its idempotency key, for this long after its
# answer was lost (no connection, a broken one, a timeout, or LOST: a server that crashed or
# restarts, its store gone for a moment, a proxy that lost it); the server answers a repeated
# key with the run it made. A 500 is an answer (a bug, a full disk): sent again, it would be too
LOST = frozenset({502, 503, 504})
RESEND_S = 30.0


class Session:
    """Requests to the API at `url`, shown `token`."""

    def __init__(
        self, url: str, token: str | None, *, timeout_s: float = 600.0, resend_s: float = RESEND_S
    ) -> None:
        self.url = url.rstrip("/")
        self.resend_s = resend_s
        headers = {"User-Agent": f"orbit/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # plain http never uses TLS: skip loading the CA bundle (~0.1 s of every command);
            # https verifies against certifi's CAs, or SSL_CERT_FILE's
            verify=not self.url.startswith("http://"),
        )

    def close(self) -> None:
        self.http.close()

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, API + path, **kwargs)
        except httpx.TransportError as exc:
            raise self.unreachable(exc) from None
        raise_for(response)
        return response

    def send_once(
        self,
        method: str,
        path: str,
        rewind: Callable[[], object] = lambda: None,
        key: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """A request that makes a run, with a fresh idempotency key (or `key`): sent again
        with the same key while its answer is lost (see RESEND_S), so that it makes one run
        however often it had to be sent. `rewind` readies a file the request sends for
        another read."""
        headers = {HEADER: key or uuid.uuid4().hex}
        deadline, waits = None, Backoff(base_s=0.2, cap_s=2.0)
        while True:
            rewind()
            asked = None
            try:
                response = self.http.request(method, API + path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                lost: httpx.Response | Exception = exc
            else:
                if response.status_code not in LOST:
                    raise_for(response)
                    return response
                lost, asked = response, retry_after(response.headers)
            deadline = deadline or time.monotonic() + self.resend_s
            pause = waits.next(asked)
            if time.monotonic() + pause > deadline:
                if isinstance(lost, Exception):
                    raise self.unreachable(lost) from None
                raise_for(lost)
            time.sleep(pause)

    def unreachable(self, exc: Exception) -> Unreachable:
        return Unreachable(f"the orbit server at {self.url} did not answer: {exc or type(exc)}")

    def get(self, model: type[M], path: str, **params: Any) -> M:
        return model.model_validate_json(self.send("GET", path, params=query(params)).content)

    def post(self, model: type[M], path: str, body: dict[str, Any] | None = None) -> M:
        return model.model_validate_json(self.send("POST", path, json=body).content)

    def get_list(self, model: type[M], path: str, **params: Any) -> list[M]:
        content = self.send("GET", path, params=query(params)).content
        return TypeAdapter(list[model]).validate_json(content)  # type: ignore[valid-type]


def raise_for(response: httpx.Response) -> None:
    """Raise the error a problem-details answer names, with its one line."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        cls = BY_NAME.get(str(body.get("error")), OrbitError)
        if response.status_code >= 500 and cls is OrbitError:
            cls = ServerError
        raise cls(body["detail"])
    text = response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
    raise ServerError(f"the server answered {response.status_code} {response.reason_phrase} {text}")


def query(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def part(value: str) -> str:
    """A path segment: refused if it could change the path (the server would not find it)."""
    if not value or "/" in value or value in (".", ".."):
        raise InvalidInput(f"{value!r}: not a name or id")
    from urllib.parse import quote

    return quote(value, safe="")
