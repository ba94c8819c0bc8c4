"""The control plane over HTTP: ControlAPI spoken to `orbit server`. It returns the records the
service returns and raises the errors it raised (problem details name them), so that a client
of ControlAPI, the CLI first, cannot tell this from the service in its own process."""

from __future__ import annotations

import base64
import json
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

# httpx imports its own command line (`httpx._main`: click, rich, pygments) unless that fails;
# an empty stand-in makes it fail, which httpx allows for, and spares every `orbit` command
# talking to a server ~50 ms of imports it never uses.
sys.modules.setdefault("httpx._main", types.ModuleType("httpx._main"))
import httpx
from pydantic import BaseModel, TypeAdapter

from orbit import __version__
from orbit.core.audit_chain import ChainCheck
from orbit.core.auth import NewToken, Role, TokenRecord, UserRecord
from orbit.core.clusters import ClusterCheck, ClusterRecord, ClusterSpec
from orbit.core.control.views import (
    Explanation,
    HostCheck,
    LogChunk,
    QueueEntry,
    QuotaView,
    RunDiff,
    RunPage,
    RunView,
    Simulation,
    SubmitPlan,
    TemplateView,
)
from orbit.core.control.waiting import WaitsForRuns
from orbit.core.errors import (
    BY_NAME,
    InvalidInput,
    NotFound,
    OrbitError,
    ServerError,
    Unreachable,
)
from orbit.core.hosts import HostRecord, HostSpec
from orbit.core.layers import LogLayer
from orbit.core.models import ExecutionOverrides, RunState, TaskSubmission
from orbit.core.nodes import JoinTokenRecord, NewJoinToken, NodeRecord
from orbit.core.records import AuditEvent, CollectResult, ExperimentRecord, RunRecord
from orbit.forensics.diagnose import Inspection

M = TypeVar("M", bound=BaseModel)
API = "/api/v1"
RESUMES = 20  # a log stream broken off this many times in a row is given up on


class RemoteControl(WaitsForRuns):
    """ControlAPI at `url`, shown `token`."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
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
        self._tasks: Any = None  # the task plugins, found on the first submit

    def close(self) -> None:
        self.http.close()

    # -- the wire ----------------------------------------------------------------------------
    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, API + path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        _raise_for(response)
        return response

    def _unreachable(self, exc: Exception) -> Unreachable:
        return Unreachable(f"the orbit server at {self.url} did not answer: {exc or type(exc)}")

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        return model.model_validate_json(self._send("GET", path, params=_query(params)).content)

    def _post(self, model: type[M], path: str, body: dict[str, Any] | None = None) -> M:
        return model.model_validate_json(self._send("POST", path, json=body).content)

    def _list(self, model: type[M], path: str, **params: Any) -> list[M]:
        content = self._send("GET", path, params=_query(params)).content
        return TypeAdapter(list[model]).validate_json(content)  # type: ignore[valid-type]

    # -- templates and experiments --------------------------------------------------------------
    def list_templates(self) -> list[TemplateView]:
        return self._list(TemplateView, "/templates")

    def get_template(self, template_id: str) -> TemplateView:
        return self._get(TemplateView, f"/templates/{_part(template_id)}")

    def create_experiment(self, name: str) -> ExperimentRecord:
        return self._post(ExperimentRecord, "/experiments", {"name": name})

    def list_experiments(self) -> list[ExperimentRecord]:
        return self._list(ExperimentRecord, "/experiments")

    # -- submitting ------------------------------------------------------------------------
    def submit_task(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> RunRecord:
        return self._upload(RunRecord, "/runs", submission, base_dir, source)

    def plan_submission(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> SubmitPlan:
        return self._upload(SubmitPlan, "/runs/plan", submission, base_dir, source)

    def _upload(
        self, model: type[M], path: str, submission: TaskSubmission, base_dir: Path, source: str
    ) -> M:
        """Shape the task and gather its inputs here, where its files are, and send them."""
        from orbit.core.control.submit import gather_inputs
        from orbit.core.tasks import TaskRegistry

        if self._tasks is None:
            self._tasks = TaskRegistry()
        with tempfile.TemporaryDirectory(prefix="orbit-submit-") as scratch:
            inputs = Path(scratch) / "inputs"
            shaped = gather_inputs(self._tasks, submission, base_dir, source, inputs)
            archive = Path(scratch) / "inputs.tar.gz"
            with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
                tar.add(inputs, arcname=".")
            form = {
                "submission": submission.model_dump_json(exclude_unset=True),
                "shaped": shaped.model_dump_json(),
                "source": source,
            }
            with archive.open("rb") as data:
                files = {"inputs": ("inputs.tar.gz", data, "application/gzip")}
                try:
                    response = self._send("POST", path, data=form, files=files)
                except NotFound as exc:
                    if not str(exc).startswith("unknown template"):
                        raise
                    raise NotFound(f"{exc}; templates are the server's ({self.url})") from None
        return model.model_validate_json(response.content)

    # -- runs ----------------------------------------------------------------------------
    def get_run(self, ref: str) -> RunRecord:
        return self._get(RunRecord, f"/runs/{_part(ref)}")

    def refresh_run_status(self, ref: str) -> RunRecord:
        return self._post(RunRecord, f"/runs/{_part(ref)}/refresh")

    def run_view(self, ref: str, *, refresh: bool = True, images: bool = False) -> RunView:
        return self._get(RunView, f"/runs/{_part(ref)}/view", refresh=refresh, images=images)

    def run_page(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
    ) -> RunPage:
        state = sorted(s.value for s in states) if states else None
        return self._get(RunPage, "/runs", experiment=experiment, state=state, limit=limit)

    def cancel_run(self, ref: str, wait_s: float | None = None) -> RunRecord:
        return self._post(RunRecord, f"/runs/{_part(ref)}/cancel", {"wait_s": wait_s})

    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        return self._post(RunRecord, f"/runs/{_part(ref)}/retry", _overrides(overrides))

    def replay_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        return self._post(RunRecord, f"/runs/{_part(ref)}/replay", _overrides(overrides))

    def stop_leftovers(self, ref: str) -> int:
        response = self._send("POST", f"/runs/{_part(ref)}/leftovers/stop")
        return int(response.json()["stopped"])

    def inspect_run(self, ref: str, attempt: int | None = None) -> Inspection:
        return self._get(Inspection, f"/runs/{_part(ref)}/inspect", attempt=attempt)

    def diff_runs(self, ref_a: str, ref_b: str) -> RunDiff:
        return self._get(RunDiff, "/diff", a=ref_a, b=ref_b)

    # -- logs ------------------------------------------------------------------------------
    def read_log(
        self, ref: str, layer: LogLayer, offset: int = 0, attempt: int | None = None
    ) -> LogChunk:
        parts: list[bytes] = []
        chunk = self.stream_log(ref, layer, offset, parts.append, attempt)
        return chunk.model_copy(update={"data": b"".join(parts)})

    def stream_log(
        self,
        ref: str,
        layer: LogLayer,
        offset: int,
        sink: Callable[[bytes], None],
        attempt: int | None = None,
        only_attempt: str | None = None,
        follow: bool = False,
    ) -> LogChunk:
        """The log as Server-Sent Events from `offset`. A stream broken off is asked for again
        from the last event's id (its byte offset), so nothing is lost or repeated."""
        params = _query({"offset": offset, "attempt": attempt, "only_attempt": only_attempt})
        params["follow"] = "true" if follow else "false"
        path = f"{API}/runs/{_part(ref)}/logs/{layer.value}"
        broken = 0
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(offset)}
            try:
                with self.http.stream(
                    "GET", path, params={**params, "offset": str(offset)}, headers=headers
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    for event, data in _events(response.iter_lines()):
                        broken = 0
                        if event == "log":
                            piece = base64.b64decode(data)
                            sink(piece)
                            offset += len(piece)
                        elif event == "end":
                            end = json.loads(data)
                            return LogChunk(data=b"", **end)
                        elif event == "error":  # the server hit a problem once streaming
                            problem = json.loads(data)
                            cls = BY_NAME.get(str(problem.get("error")), ServerError)
                            raise cls(str(problem.get("detail")))
            except (httpx.TransportError, httpx.DecodingError) as exc:
                broken += 1
                if broken > RESUMES:
                    raise self._unreachable(exc) from None
                time.sleep(min(0.2 * broken, 2.0))
                continue
            # the stream ended without its `end` event: a proxy cut it; go on from here
            broken += 1
            if broken > RESUMES:
                raise ServerError(f"{self.url}: the log stream keeps ending early")

    # -- artifacts -----------------------------------------------------------------------
    def collect_run_artifacts(
        self, ref: str, dest: Path, attempt: int | None = None
    ) -> CollectResult:
        """The server collects the attempt's artifacts (incrementally, verified against the
        run's manifest) and sends them; they are unpacked into `dest`."""
        path = f"{API}/runs/{_part(ref)}/artifacts"
        with tempfile.TemporaryFile() as spool:
            try:
                with self.http.stream("GET", path, params=_query({"attempt": attempt})) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        _raise_for(resp)
                    summary = json.loads(resp.headers.get("x-orbit-collect", "{}"))
                    for piece in resp.iter_bytes():
                        spool.write(piece)
            except httpx.TransportError as exc:
                raise self._unreachable(exc) from None
            spool.seek(0)
            dest.mkdir(parents=True, exist_ok=True)
            from orbit.core.tarsafe import extract_all

            with tarfile.open(fileobj=spool, mode="r:") as tar:
                extract_all(tar, dest, "artifacts")
        return CollectResult(dest=dest, **summary)

    # -- the audit trail -------------------------------------------------------------------
    def audit(self, run: str | None = None, limit: int | None = None) -> list[AuditEvent]:
        return self._list(AuditEvent, "/audit", run=run, limit=limit)

    def verify_audit(self) -> ChainCheck:
        data = self._send("GET", "/audit/verify").json()
        return ChainCheck(
            events=data["events"], head=data["head"], problems=tuple(data["problems"])
        )

    # -- SSH hosts -------------------------------------------------------------------------
    def add_host(self, spec: HostSpec, *, check: bool = True) -> HostRecord:
        body = {"spec": spec.model_dump(mode="json", exclude_unset=True), "check": check}
        return self._post(HostRecord, "/hosts", body)

    def list_hosts(self) -> list[HostRecord]:
        return self._list(HostRecord, "/hosts")

    def get_host(self, name: str) -> HostRecord:
        return self._get(HostRecord, f"/hosts/{_part(name)}")

    def check_host(self, name: str) -> HostCheck:
        return self._post(HostCheck, f"/hosts/{_part(name)}/check")

    def remove_host(self, name: str) -> list[str]:
        response = self._send("DELETE", f"/hosts/{_part(name)}")
        return list(response.json()["stopped_attempts"])

    # -- Slurm clusters --------------------------------------------------------------------
    def add_cluster(self, spec: ClusterSpec, *, check: bool = True) -> ClusterRecord:
        body = {"spec": spec.model_dump(mode="json", exclude_unset=True), "check": check}
        return self._post(ClusterRecord, "/clusters", body)

    def list_clusters(self) -> list[ClusterRecord]:
        return self._list(ClusterRecord, "/clusters")

    def get_cluster(self, name: str) -> ClusterRecord:
        return self._get(ClusterRecord, f"/clusters/{_part(name)}")

    def check_cluster(self, name: str, *, sweep: bool = False) -> ClusterCheck:
        return self._post(ClusterCheck, f"/clusters/{_part(name)}/check", {"sweep": sweep})

    def remove_cluster(self, name: str) -> list[str]:
        response = self._send("DELETE", f"/clusters/{_part(name)}")
        return list(response.json()["stopped_attempts"])

    # -- users and tokens ------------------------------------------------------------------
    def whoami(self) -> UserRecord | None:
        return self._get(UserRecord, "/whoami")

    def list_users(self) -> list[UserRecord]:
        return self._list(UserRecord, "/users")

    def add_user(self, name: str, role: Role) -> UserRecord:
        return self._post(UserRecord, "/users", {"name": name, "role": role.value})

    def remove_user(self, name: str) -> UserRecord:
        return UserRecord.model_validate_json(self._send("DELETE", f"/users/{_part(name)}").content)

    def create_token(
        self, user: str | None = None, name: str | None = None, expires: str | None = None
    ) -> NewToken:
        return self._post(NewToken, "/tokens", {"user": user, "name": name, "expires": expires})

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        return self._list(TokenRecord, "/tokens", user=user)

    def revoke_token(self, token_id: str) -> TokenRecord:
        response = self._send("DELETE", f"/tokens/{_part(token_id)}")
        return TokenRecord.model_validate_json(response.content)

    # -- agent nodes -----------------------------------------------------------------------
    def create_join_token(
        self, labels: dict[str, str] | None = None, expires: str | None = None
    ) -> NewJoinToken:
        body = {"labels": labels or {}, "expires": expires}
        return self._post(NewJoinToken, "/nodes/join-tokens", body)

    def list_join_tokens(self) -> list[JoinTokenRecord]:
        return self._list(JoinTokenRecord, "/nodes/join-tokens")

    def revoke_join_token(self, token_id: str) -> None:
        self._send("DELETE", f"/nodes/join-tokens/{_part(token_id)}")

    def _node(self, ref: str) -> str:
        """A node's name or id as a path segment. /nodes/join-tokens is the join tokens' own
        path: a node of that name is reached by its id."""
        if ref == "join-tokens":
            found = [n.id for n in self.list_nodes() if n.name == ref]
            if not found:
                raise NotFound(f"no node '{ref}' (see `orbit nodes list`)")
            ref = found[0]
        return _part(ref)

    # -- the scheduler ----------------------------------------------------------------------
    def explain(self, ref: str, replay: bool = False) -> Explanation:
        return self._get(Explanation, f"/runs/{ref}/explain", replay=replay or None)

    def queue(self) -> list[QueueEntry]:
        return self._list(QueueEntry, "/queue")

    def list_quotas(self) -> list[QuotaView]:
        return self._list(QuotaView, "/quotas")

    def set_quota(self, scope: str, name: str, gpus: int, weight: float = 1.0) -> QuotaView:
        body = {"gpus": gpus, "weight": weight}
        content = self._send("PUT", f"/quotas/{scope}/{name}", json=body).content
        return QuotaView.model_validate_json(content)

    def remove_quota(self, scope: str, name: str) -> None:
        self._send("DELETE", f"/quotas/{scope}/{name}")

    def simulate(self, since_s: float, config: dict[str, Any]) -> Simulation:
        return self._post(Simulation, "/sched/simulate", {"since_s": since_s, "config": config})

    def list_nodes(self) -> list[NodeRecord]:
        return self._list(NodeRecord, "/nodes")

    def get_node(self, ref: str) -> NodeRecord:
        return self._get(NodeRecord, f"/nodes/{self._node(ref)}")

    def set_node(
        self, ref: str, *, cordon: bool | None = None, max_tasks: int | None = None
    ) -> NodeRecord:
        body = {"cordon": cordon, "max_tasks": max_tasks}
        return self._post(NodeRecord, f"/nodes/{self._node(ref)}", body)

    def revoke_node(self, ref: str) -> NodeRecord:
        return self._post(NodeRecord, f"/nodes/{self._node(ref)}/revoke")

    def remove_node(self, ref: str, force: bool = False) -> NodeRecord:
        response = self._send(
            "DELETE", f"/nodes/{self._node(ref)}", params=_query({"force": force})
        )
        return NodeRecord.model_validate_json(response.content)

    def push_file(self, ref: str, data: bytes, dest: str) -> dict[str, object]:
        files = {"file": ("file", data, "application/octet-stream")}
        response = self._send(
            "POST", f"/nodes/{self._node(ref)}/push", data={"dest": dest}, files=files
        )
        result: dict[str, object] = response.json()["result"]
        return result

    def pull_file(self, ref: str, path: str) -> bytes:
        return self._send("GET", f"/nodes/{self._node(ref)}/pull", params={"path": path}).content


def _raise_for(response: httpx.Response) -> None:
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


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """Server-Sent Events: (event, data) for each event; comments and ids are skipped (the
    offset travels in the data's length and the `end` event)."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


def _query(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def _part(value: str) -> str:
    """A path segment: refused if it could change the path (the server would not find it)."""
    if not value or "/" in value or value in (".", ".."):
        raise InvalidInput(f"{value!r}: not a name or id")
    from urllib.parse import quote

    return quote(value, safe="")


def _overrides(overrides: ExecutionOverrides | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    return {"overrides": overrides.model_dump(mode="json", exclude_unset=True)}
