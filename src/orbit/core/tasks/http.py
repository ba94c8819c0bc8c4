"""`http`: a request, or a batch of them, to a model server already running on the node (vLLM's
OpenAI-compatible server, a diffusion web UI, any HTTP inference service): many small sampling
jobs without loading the model each time. The node runs orbit/runtime/http_batch.py, staged
into the bundle; its settings travel in the job's env."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orbit.model.errors import InvalidInput
from orbit.model.nodes import SERVICE_LABEL
from orbit.model.secret_names import looks_secret
from orbit.model.task import ShapedTask, StagedPath

SCRIPT = Path(__file__).resolve().parents[2] / "runtime" / "http_batch.py"
REQUESTS = "requests.jsonl"  # where the staged batch lands in the workdir
_SECRET_HEADERS = {"authorization", "proxy-authorization", "cookie"}


def loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def on_the_node(url: str, shape: str) -> str:
    """`url` if it is an http(s) URL of a server on the node itself; else ValueError saying
    so (`shape`: what such a URL looks like)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected {shape}, got {url!r}")
    if not loopback(parts.hostname):
        raise ValueError(
            f"the model server must run on the node itself (127.0.0.1, localhost, ::1); "
            f"got {parts.hostname}"
        )
    return url


class HttpRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, description="the node's own server: loopback only")
    # or a model server the node advertises (orbit agent --service NAME=URL), and the path
    # under its URL: the run is placed on a node that has it
    service: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    path: str = Field(default="/", pattern=r"^/")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    json_body: Any = Field(default=None, alias="json", description="one request's body")
    jsonl_file: str | None = Field(default=None, description="a body per line: a batch")
    concurrency: int = Field(default=8, ge=1, le=256)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    headers: dict[str, str] = {}
    # header -> the name of an env var on the node holding its value (an API key stays there)
    headers_from_env: dict[str, str] = {}
    save: str = Field(default="responses.jsonl", min_length=1)
    allow_failures: int = Field(default=0, ge=0)
    # a request the server could not take (refused connection, 429, 502, 503, 504) is sent
    # again up to this many times, after a jittered wait or the server's Retry-After
    retries: int = Field(default=2, ge=0, le=20)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else on_the_node(value, "http://HOST:PORT/PATH")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in _SECRET_HEADERS or looks_secret(name):
                raise ValueError(
                    f"{name} would be frozen into the bundle: name the env var on the node that "
                    f"holds it in headers_from_env ({{{name}: MY_API_KEY}})"
                )
        return value

    @field_validator("save")
    @classmethod
    def _save(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or value.endswith("/"):
            raise ValueError(f"a file path under the run's artifacts, got {value!r}")
        if path.name == "logging.jsonl":
            raise ValueError("logging.jsonl is where the progress goes: name another file")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> HttpRequest:
        if self.json_body is not None and self.jsonl_file is not None:
            raise ValueError("give json (one request) or jsonl_file (a batch), not both")
        if (self.url is None) == (self.service is None):
            raise ValueError(
                "give url (a server on the node itself) or service (one the node advertises: "
                "orbit agent --service NAME=URL), one of the two"
            )
        return self


class HttpTask:
    name: ClassVar[str] = "http"
    request_model: ClassVar[type[BaseModel]] = HttpRequest

    def selector(self, request: HttpRequest) -> dict[str, str]:
        """A service asked for by name: only a node advertising it will do."""
        return {f"{SERVICE_LABEL}{request.service}": "yes"} if request.service else {}

    def shape(self, request: HttpRequest, base_dir: Path) -> ShapedTask:
        staged = [StagedPath(source=SCRIPT, dest="workdir/http_batch.py")]
        settings: dict[str, Any] = {
            "url": request.url,
            "service": request.service,
            "path": request.path,
            "method": request.method,
            "concurrency": request.concurrency,
            "timeout_s": request.timeout_s,
            "headers": request.headers,
            "headers_from_env": request.headers_from_env,
            "save": request.save,
            "allow_failures": request.allow_failures,
            "retries": request.retries,
        }
        if request.jsonl_file is not None:
            batch = (base_dir / request.jsonl_file).resolve()
            if not batch.is_file():
                raise InvalidInput(f"task.jsonl_file: no such file: {batch}")
            bad = _first_bad_line(batch)
            if bad is not None:
                raise InvalidInput(f"task.jsonl_file: {batch}: line {bad[0]} is not JSON: {bad[1]}")
            staged.append(StagedPath(source=batch, dest=f"workdir/{REQUESTS}"))
            settings["jsonl_file"] = REQUESTS
        elif request.json_body is not None:
            settings["json"] = request.json_body
        return ShapedTask(
            entrypoint=("python3", "http_batch.py"),
            request=request.model_dump(by_alias=True),
            env={"ORBIT_HTTP_REQUEST": json.dumps(settings, sort_keys=True)},
            staged=tuple(staged),
        )


def _first_bad_line(path: Path) -> tuple[int, str] | None:
    """The first line of a batch that is not JSON (blank lines are skipped), read before
    anything is frozen: a batch must not fail on line 90,000 an hour in."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as exc:
                    return number, str(exc)
    return None
