"""`orbit agent`: the daemon on an in-house GPU server. It only ever connects out.

Threads, each with its own job, so that a slow one never holds up another:
- the poll loop keeps a long-poll open and hands each command to a worker pool (a cancel has
  its own small pool: a slow upload or bundle fetch never delays it);
- the heartbeat loop says the node lives, with its node info when that changed;
- the reporter uploads its attempts' files by byte offset, logs and small files first.

Attempts run with the local backends (orbit.core.execution.backends.local_*), as a local run
does, each in `<work dir>/attempts/<attempt id>/`. An attempt starts only after the server
grants its start (the fencing check), and never twice on this node: a start for an attempt
whose folder exists here is not started again. On every (re)connect the agent tells the server
what it runs and stops what the server does not know, by ORBIT's marks only (processes carrying
the attempt's ORBIT_ATTEMPT_ID and this agent's ORBIT_PLANE; containers by their labels)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orbit.agent import protocol as p
from orbit.agent.files import FileState, plan_chunks
from orbit.agent.xids import XidWatch
from orbit.core.execution.backends.base import AttemptContext
from orbit.core.models import ExecutionRequest
from orbit.runtime import hostside

log = logging.getLogger("orbit.agent")

IDENTITY_FILE = "agent-identity.json"
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0
BUNDLE_PATIENCE_S = 60.0  # how long a bundle fetch waits out a server that is away
REFUSED_MAX_S = 60.0  # the longest wait between reports the server refuses as they are
REPORT_EVERY_S = 0.25
INFO_EVERY_S = 30.0


class Revoked(Exception):
    """The server refuses this node's credential: revoked or removed."""


@dataclass
class Tracked:
    """An attempt this agent runs, or ran and is still uploading."""

    attempt_id: str
    run_id: str
    fence: int
    folder: Path
    launch_mode: str
    upload_large: bool
    files: dict[str, FileState] = field(default_factory=dict)
    done: bool = False
    everything: bool = False  # `orbit collect` asked: large files too
    launching: bool = False  # granted, its wrapper not started yet: it counts as alive

    def alive(self) -> bool:
        return self.launching or hostside.wrapper_alive(str(self.folder / "runtime"))

    def marker(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "run_id": self.run_id,
            "fence": self.fence,
            "launch_mode": self.launch_mode,
            "upload_large": self.upload_large,
        }


@dataclass(frozen=True)
class AgentOptions:
    server: str
    work_dir: Path
    join_token: str | None = None
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    max_tasks: int = 1
    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    services: tuple[tuple[str, str], ...] = ()  # model servers here: (name, URL)
    address: str = ""  # where peers reach this node (a gang's master), else its hostname
    verify: bool | str = True  # TLS: True, False, or a CA bundle's path
    poll_wait_s: float = 25.0
    workers: int = 8


class Agent:
    def __init__(self, options: AgentOptions) -> None:
        self.o = options
        self.work = options.work_dir.absolute()
        self.attempts_dir = self.work / "attempts"
        self.bundles_dir = self.work / "bundles"
        self.session = uuid.uuid4().hex
        self.identity: dict[str, str] = {}
        self.tracked: dict[str, Tracked] = {}
        self.cancelled: set[str] = set()
        self.lock = threading.RLock()
        self.attempt_locks: dict[str, threading.Lock] = {}
        self.bundle_lock = threading.Lock()
        self.acks: list[str] = []
        self.handled: dict[str, float] = {}  # command id -> when (a redelivery is skipped)
        self.heartbeat_s = 5.0
        self.max_tasks = options.max_tasks
        self.stop = threading.Event()
        self.connected = threading.Event()
        self.report_wake = threading.Event()
        self.seq = 0
        self.last_info: p.NodeInfo | None = None
        self.info_at = 0.0
        self.xids = XidWatch(on_fault=self._gpu_fault)
        self.http = httpx.Client(
            base_url=options.server.rstrip("/"),
            verify=options.verify,
            timeout=httpx.Timeout(30.0, read=options.poll_wait_s + 15.0),
            headers={
                p.VERSION_HEADER: str(p.PROTOCOL_VERSION),
                "content-type": "application/json",
            },
            limits=httpx.Limits(max_connections=options.workers + 8),
        )
        self.workers = ThreadPoolExecutor(options.workers, thread_name_prefix="agent-work")
        self.urgent = ThreadPoolExecutor(2, thread_name_prefix="agent-cancel")
        self.plane = ""

    # --- identity ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.identity["node_id"]

    def load_or_register(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.attempts_dir.mkdir(exist_ok=True)
        self.bundles_dir.mkdir(exist_ok=True)
        from orbit.core.execution.docker.host import plane_id

        self.plane = plane_id(self.attempts_dir)
        path = self.work / IDENTITY_FILE
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("server") != self.o.server.rstrip("/"):
                raise SystemExit(
                    f"{path}: this work dir belongs to a node of {saved.get('server')}; use "
                    "another --work-dir for another server"
                )
            self.identity = saved
            return
        if not self.o.join_token:
            raise SystemExit(
                f"this node has not joined yet ({path} is missing): give --join-token "
                "(`orbit nodes join-token create` on the control plane makes one)"
            )
        name = self.o.name or os.uname().nodename.split(".")[0]
        body = p.RegisterRequest(
            join_token=self.o.join_token,
            name=name,
            labels=self.o.labels,
            max_tasks=self.o.max_tasks,
            info=self.node_info(),
        )
        answer = self._post("/register", body, p.RegisterResponse, auth=False)
        self.identity = {
            "server": self.o.server.rstrip("/"),
            "node_id": answer.node_id,
            "name": answer.name,
            "credential": answer.credential,
        }
        tmp = path.with_name(f".{path.name}.part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.identity, out)
        os.replace(tmp, path)
        log.info("joined %s as node %s (%s)", self.o.server, answer.name, answer.node_id)

    def _gpu_fault(self) -> None:
        self.info_at = float("-inf")  # the next heartbeat carries the node's facts, fault included

    def node_info(self) -> p.NodeInfo:
        from orbit.agent.nodeinfo import collect

        faults = self.xids.faults()
        return collect(
            self.work,
            models=self.o.models,
            datasets=self.o.datasets,
            faults=faults,
            services=dict(self.o.services),
            address=self.o.address,
        )

    # --- HTTP --------------------------------------------------------------------------------

    def _post(self, path: str, body: p.Message, answer: type[Any], auth: bool = True) -> Any:
        headers = {"authorization": f"Bearer {self.identity['credential']}"} if auth else {}
        content = body.model_dump_json()
        try:
            response = self.http.post(p.PREFIX + path, content=content, headers=headers)
        except httpx.RemoteProtocolError:  # a kept-alive connection the server had closed:
            # every message is safe to send twice, so once more on a fresh one
            response = self.http.post(p.PREFIX + path, content=content, headers=headers)
        return self._answer(response, answer)

    def _answer(self, response: httpx.Response, answer: type[Any]) -> Any:
        if response.status_code == 401:
            raise Revoked(_detail(response))
        if response.status_code >= 400:
            raise ServerSaid(response.status_code, _detail(response))
        return answer.model_validate_json(response.content)

    # --- main loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Until stopped (SIGTERM) or revoked; returns the exit code."""
        try:
            self.load_or_register()
        except Revoked as exc:
            log.error("the server refused to register this node: %s", exc)
            return 3
        except ServerSaid as exc:
            log.error("the server refused to register this node: %s", exc.detail)
            return 3
        self.restore()
        self.xids.start()
        threads = [
            threading.Thread(target=self._guard(self.heartbeat_loop), name="agent-heartbeat"),
            threading.Thread(target=self._guard(self.report_loop), name="agent-report"),
        ]
        for thread in threads:
            thread.daemon = True
            thread.start()
        code = 0
        try:
            self.poll_loop()
        except Revoked as exc:
            log.error("this node is locked out (%s): stopping. Join again with a new token", exc)
            code = 3
        finally:
            self.stop.set()
            self.xids.stop.set()
            self.report_wake.set()
            self.workers.shutdown(wait=False, cancel_futures=True)
            self.urgent.shutdown(wait=False, cancel_futures=True)
        return code

    def _guard(self, loop: Any) -> Any:
        def run() -> None:
            try:
                loop()
            except Revoked as exc:
                log.error("this node is locked out (%s): stopping", exc)
                self.stop.set()

        return run

    def poll_loop(self) -> None:
        backoff = RETRY_MIN_S
        while not self.stop.is_set():
            try:
                if not self.connected.is_set():
                    self.resync()
                    self.connected.set()
                    backoff = RETRY_MIN_S
                    log.info("connected to %s as %s", self.o.server, self.identity["name"])
                self.poll_once()
            except (httpx.HTTPError, ServerSaid) as exc:
                if self.connected.is_set():
                    log.warning("lost the server (%s): reconnecting", _short(exc))
                self.connected.clear()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)

    def poll_once(self) -> None:
        with self.lock:
            acks, self.acks = self.acks, []
        body = p.PollRequest(
            node_id=self.node_id, session=self.session, acks=tuple(acks), wait_s=self.o.poll_wait_s
        )
        try:
            answer: p.PollResponse = self._post("/poll", body, p.PollResponse)
        except BaseException:
            with self.lock:
                self.acks = acks + self.acks  # not acknowledged: say so again next time
            raise
        if answer.resync:
            log.warning("the server did not expect an acknowledgement: resyncing from scratch")
            with self.lock:
                self.acks = []
                self.handled.clear()
            self.connected.clear()
            return
        for command in answer.commands:
            with self.lock:
                self.acks.append(command.id)
                if command.id in self.handled:
                    continue
                self.handled[command.id] = time.monotonic()
            pool = self.urgent if isinstance(command.body, p.CancelAttempt) else self.workers
            pool.submit(self._handle, command)
        self._forget_old_commands()

    def _forget_old_commands(self) -> None:
        cutoff = time.monotonic() - 3600
        with self.lock:
            for cid in [c for c, at in self.handled.items() if at < cutoff]:
                del self.handled[cid]

    def _handle(self, command: p.Command) -> None:
        body = command.body
        try:
            if isinstance(body, p.StartAttempt):
                self.start(body)
            elif isinstance(body, p.CancelAttempt):
                self.cancel(body)
            elif isinstance(body, p.UploadFiles):
                self.upload_everything(body.attempt_id)
            elif isinstance(body, p.PutFile):
                self.put_file(body)
            elif isinstance(body, p.GetFile):
                self.get_file(body)
            elif isinstance(body, p.Resync):
                self.connected.clear()
        except Revoked:
            self.stop.set()
        except Exception:
            log.exception("command %s (%s) failed", command.id, body.kind)

    # --- resync ------------------------------------------------------------------------------

    def running(self) -> list[p.RunningAttempt]:
        with self.lock:
            tracked = list(self.tracked.values())
        return [
            p.RunningAttempt(
                attempt_id=t.attempt_id,
                fence=t.fence,
                alive=t.alive(),
                ended=(t.folder / "runtime" / "result.json").exists(),
            )
            for t in tracked
        ]

    def resync(self) -> None:
        """Tell the server what runs here; stop what it does not know, forget what it lost."""
        info = self.node_info()
        body = p.SyncRequest(
            node_id=self.node_id, session=self.session, running=tuple(self.running()), info=info
        )
        answer: p.SyncResponse = self._post("/sync", body, p.SyncResponse)
        self.last_info, self.info_at = info, time.monotonic()
        self.heartbeat_s, self.max_tasks = answer.heartbeat_s, answer.max_tasks
        with self.lock:  # report numbers go on: they count within this agent's session
            for t in self.tracked.values():
                t.files.clear()  # the server says what it has by its answers to reports
        for attempt_id in answer.stop:
            self.stop_and_clean(attempt_id)
        for attempt_id in answer.lost:
            with self.lock:
                self.tracked.pop(attempt_id, None)
        keep = {a.attempt_id for a in answer.keep}
        # processes of this agent's attempts that it no longer tracks (their folder is gone)
        with self.lock:
            live = sorted(keep | set(self.tracked))
        stopped = hostside.stop_ended(str(self.attempts_dir), live, self.plane)
        if stopped.get("stopped"):
            log.warning("stopped processes of attempts the server does not know: %s", stopped)
        self._sweep_containers(live)
        self.report_wake.set()

    def _sweep_containers(self, live: list[str]) -> None:
        if shutil.which("docker") is None:
            return
        from orbit.core.execution.docker.host import local_runner, sweep_orphans

        with contextlib.suppress(Exception):
            sweep_orphans(local_runner, live, plane=self.plane)

    def stop_and_clean(self, attempt_id: str) -> None:
        folder = self.attempts_dir / attempt_id
        log.warning("stopping attempt %s: the server does not expect it here", attempt_id)
        if folder.is_dir():
            hostside.stop_attempt(str(folder), attempt_id)
        if shutil.which("docker") is not None:
            from orbit.core.execution.docker.host import local_runner, remove_attempt_containers

            with contextlib.suppress(Exception):
                remove_attempt_containers(local_runner, attempt_id)
        with self.lock:
            self.tracked.pop(attempt_id, None)
        shutil.rmtree(folder, ignore_errors=True)
        (self.attempts_dir / f"{attempt_id}.json").unlink(missing_ok=True)

    def restore(self) -> None:
        """The attempts this agent started before it restarted: their markers."""
        for marker in sorted(self.attempts_dir.glob("*.json")):
            try:
                data = json.loads(marker.read_text())
                folder = self.attempts_dir / data["attempt_id"]
                if not (folder / "runtime").is_dir():
                    continue  # never started: the server will call it lost
                self.tracked[data["attempt_id"]] = Tracked(
                    attempt_id=data["attempt_id"],
                    run_id=data["run_id"],
                    fence=int(data["fence"]),
                    folder=folder,
                    launch_mode=data["launch_mode"],
                    upload_large=bool(data["upload_large"]),
                    done=bool(data.get("done")),
                )
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("%s: not an attempt marker this agent can read; left alone", marker)

    # --- starting ----------------------------------------------------------------------------

    def _attempt_lock(self, attempt_id: str) -> threading.Lock:
        with self.lock:
            return self.attempt_locks.setdefault(attempt_id, threading.Lock())

    def _claim(self, start: p.StartAttempt, refuse: str | None = None) -> p.ClaimResponse:
        """Asked up to three times: the same claim is granted again (an answer lost)."""
        body = p.ClaimRequest(
            node_id=self.node_id, attempt_id=start.attempt_id, fence=start.fence, refuse=refuse
        )
        for attempt in range(3):
            try:
                answer: p.ClaimResponse = self._post("/claim", body, p.ClaimResponse)
                return answer
            except (httpx.HTTPError, ServerSaid):
                if attempt == 2:
                    raise
                self.stop.wait(RETRY_MIN_S * (attempt + 1))
        raise AssertionError("unreachable")

    def start(self, start: p.StartAttempt) -> None:
        with self._attempt_lock(start.attempt_id):
            folder = self.attempts_dir / start.attempt_id
            marker = self.attempts_dir / f"{start.attempt_id}.json"
            if folder.exists() or marker.exists() or start.attempt_id in self.tracked:
                return  # started here before: never twice
            if start.attempt_id in self.cancelled:
                self._claim(start, refuse=p.CANCELLED_BEFORE_START)
                return
            with self.lock:
                busy = sum(1 for t in self.tracked.values() if not _ended(t))
            # the server's figure at placement: the last heartbeat's may be older (raised since)
            slots = self.max_tasks if start.max_tasks is None else start.max_tasks
            if busy >= slots:
                self._claim(start, refuse=f"at capacity ({busy} of max_tasks {slots})")
                return
            request = ExecutionRequest.model_validate(start.request)
            tracked = Tracked(
                attempt_id=start.attempt_id,
                run_id=start.run_id,
                fence=start.fence,
                folder=folder,
                launch_mode=request.launch_mode.kind,
                upload_large=start.upload_large,
                launching=True,
            )
            # tracked before the claim: a resync while the claim is on its way reports it, so
            # the server never takes a start it granted for one the node lacks
            with self.lock:
                self.tracked[start.attempt_id] = tracked
            try:
                answer = self._claim(start)
            except BaseException:
                with self.lock:
                    self.tracked.pop(start.attempt_id, None)
                raise
            if not answer.granted:
                with self.lock:
                    self.tracked.pop(start.attempt_id, None)
                log.warning("start of %s not granted: %s", start.attempt_id, answer.why)
                return
            _write_json(marker, tracked.marker())
            try:
                bundle = self.bundle(start.bundle_digest)
                self._launch(bundle, request, start)
            except Exception as exc:  # it did not start: its end says why
                from orbit.core.models import FailureReason

                reason = (
                    FailureReason.STAGING_FAILED
                    if isinstance(exc, StagingError)
                    else FailureReason.LAUNCH_FAILED
                )
                _write_failed(folder, reason.value, str(exc))
            finally:
                tracked.launching = False
            self.report_wake.set()

    def _launch(self, bundle: Path, request: ExecutionRequest, start: p.StartAttempt) -> None:
        from orbit.core.execution.bundle import FrozenBundle

        backend = self._backend(request.launch_mode.kind, start.gpu_indices)
        staged = self._stage_resume(start)
        context = AttemptContext(
            run_id=start.run_id,
            attempt_id=start.attempt_id,
            resume_staged=str(staged) if staged else None,
            resume_relpath=start.resume.relpath if staged and start.resume else None,
            services=dict(self.o.services),
            gang=start.gang.model_dump() if start.gang else None,
        )
        cpus = self._cpus_for(request.resources.cpu_count, start.attempt_id)
        before = os.sched_getaffinity(0)
        try:
            if cpus:
                os.sched_setaffinity(0, cpus)  # this thread only: the wrapper inherits it
            backend.launch(FrozenBundle(start.bundle_digest, bundle), request, context)
        finally:
            if cpus:
                os.sched_setaffinity(0, before)

    def _backend(self, launch_mode: str, gpus: tuple[int, ...]) -> Any:
        from orbit.core.execution.backends.local_docker import LocalDockerBackend
        from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend

        env = {
            "ORBIT_PLANE": self.plane,
            "ORBIT_NODE_NAME": self.identity.get("name", ""),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        }
        if gpus:
            env["ORBIT_GPUS"] = ",".join(map(str, gpus))
        base: type[LocalHostProcessBackend] = (
            LocalDockerBackend if launch_mode == "docker" else LocalHostProcessBackend
        )

        class NodeBackend(base):  # type: ignore[valid-type,misc]
            def launch_env(self) -> dict[str, str]:
                return {**super().launch_env(), **env}

        return NodeBackend(self.attempts_dir)

    def _cpus_for(self, count: int, attempt_id: str) -> set[int]:
        """CPUs for a host process (taskset): `count` of this agent's, those other attempts
        were given last; none (no pinning) when count is 0 or more than there are."""
        have = sorted(os.sched_getaffinity(0))
        if count <= 0 or count >= len(have):
            return set()
        with self.lock:
            used = {c for t in self.tracked.values() if not _ended(t) for c in _pinned(t)}
        free = [c for c in have if c not in used] + [c for c in have if c in used]
        chosen = set(free[:count])
        with contextlib.suppress(OSError):
            (self.attempts_dir / f"{attempt_id}.cpus").write_text(
                ",".join(map(str, sorted(chosen)))
            )
        return chosen

    def bundle(self, digest: str) -> Path:
        """The bundle with this digest, from the cache, else fetched once and checked. An
        archive that does not match its digest is asked for once more, made afresh (the
        server's cached copy may be what went bad)."""
        cached = self.bundles_dir / digest
        if (cached / "job.json").is_file():
            return cached
        with self.bundle_lock:
            if (cached / "job.json").is_file():
                return cached
            try:
                self._fetch_patiently(digest, cached, rebuild=False)
            except BadArchive as exc:
                log.warning("bundle %s: %s; asking for it made afresh", digest[:12], exc)
                try:
                    self._fetch_patiently(digest, cached, rebuild=True)
                except BadArchive as again:
                    raise StagingError(f"bundle {digest[:12]}: {again}") from None
            hostside.compile_scripts(str(cached))
            return cached

    def _fetch_patiently(self, digest: str, cached: Path, rebuild: bool) -> None:
        """`_fetch_bundle`, again while the server is away or failing (restarted, say) for up
        to BUNDLE_PATIENCE_S: a server restart must not fail a start as staging_failed."""
        deadline = time.monotonic() + BUNDLE_PATIENCE_S
        wait = RETRY_MIN_S
        while True:
            try:
                return self._fetch_bundle(digest, cached, rebuild)
            except (httpx.TransportError, ServerAway) as exc:
                if time.monotonic() + wait > deadline or self.stop.is_set():
                    raise StagingError(f"fetching bundle {digest[:12]}: {_short(exc)}") from None
                log.warning("fetching bundle %s (%s): again", digest[:12], _short(exc))
                self.stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_S)

    def _fetch_bundle(self, digest: str, cached: Path, rebuild: bool) -> None:
        from orbit.core.execution.bundle import extract_bundle_archive

        archive = self.bundles_dir / f".{digest}.{uuid.uuid4().hex}.tar"
        headers = {"authorization": f"Bearer {self.identity['credential']}"}
        params = {"rebuild": "true"} if rebuild else None
        try:
            with self.http.stream(
                "GET", f"{p.PREFIX}/bundles/{digest}", headers=headers, params=params
            ) as response:
                if response.status_code == 401:
                    raise Revoked(_detail(response))
                if response.status_code != 200:
                    response.read()
                    if response.status_code >= 500:
                        raise ServerAway(_detail(response))
                    raise StagingError(f"fetching bundle {digest[:12]}: {_detail(response)}")
                with open(archive, "wb") as out:
                    for block in response.iter_bytes(1 << 20):
                        out.write(block)
            try:
                extract_bundle_archive(archive, cached, expected_digest=digest)
            except Exception as exc:
                raise BadArchive(str(exc)) from None
        finally:
            archive.unlink(missing_ok=True)

    def _stage_resume(self, start: p.StartAttempt) -> Path | None:
        """An earlier attempt's checkpoint, put beside the new attempt's folder for its
        wrapper to move in: copied from this node's own folder of that attempt when it has
        one, else fetched from the control plane's copy. Where it cannot be had, the attempt
        starts without it (from the beginning) and the log says why."""
        resume = start.resume
        if resume is None:
            return None
        staged = self.attempts_dir / f".resume-{start.attempt_id}"
        shutil.rmtree(staged, ignore_errors=True)
        local = self.attempts_dir / resume.attempt_id / "artifacts" / resume.relpath
        try:
            if local.is_dir():
                shutil.copytree(local, staged)
            elif local.is_file():
                shutil.copy2(local, staged)
            else:
                self._fetch_checkpoint(resume, staged)
        except (OSError, httpx.HTTPError, StagingError) as exc:
            shutil.rmtree(staged, ignore_errors=True)
            log.warning(
                "attempt %s starts without %s's checkpoint: %s",
                start.attempt_id,
                resume.attempt_id,
                _short(exc),
            )
            return None
        return staged

    def _fetch_checkpoint(self, resume: p.Resume, staged: Path) -> None:
        headers = {"authorization": f"Bearer {self.identity['credential']}"}
        top = f"artifacts/{resume.relpath}"
        for path, size in resume.files:
            inside = path[len(top) :].lstrip("/") if path.startswith(top) else None
            if inside is None:
                continue
            dest = staged / inside if inside else staged
            dest.parent.mkdir(parents=True, exist_ok=True)
            url = f"{p.PREFIX}/attempts/{resume.attempt_id}/files"
            with self.http.stream("GET", url, headers=headers, params={"path": path}) as response:
                if response.status_code != 200:
                    response.read()
                    raise StagingError(f"{path}: {_detail(response)}")
                with open(dest, "wb") as out:
                    for block in response.iter_bytes(1 << 20):
                        out.write(block)
            if dest.stat().st_size != size:
                raise StagingError(f"{path}: {dest.stat().st_size} bytes, {size} expected")

    # --- cancelling --------------------------------------------------------------------------

    def cancel(self, body: p.CancelAttempt) -> None:
        with self._attempt_lock(body.attempt_id):
            with self.lock:
                tracked = self.tracked.get(body.attempt_id)
                if tracked is None:
                    self.cancelled.add(body.attempt_id)
            if tracked is not None:
                hostside.cancel(str(tracked.folder), body.reason)
                self.report_wake.set()
            elif body.fence and not (self.attempts_dir / body.attempt_id).exists():
                # not started here (its start is on its way, or lost): it never will be
                refuse = p.ClaimRequest(
                    node_id=self.node_id,
                    attempt_id=body.attempt_id,
                    fence=body.fence,
                    refuse=p.CANCELLED_BEFORE_START,
                )
                self._post("/claim", refuse, p.ClaimResponse)

    # --- files -------------------------------------------------------------------------------

    def upload_everything(self, attempt_id: str) -> None:
        with self.lock:
            tracked = self.tracked.get(attempt_id)
            if tracked is not None:
                tracked.everything = True
                tracked.done = False
        self.report_wake.set()

    def confined(self, relpath: str) -> Path:
        """`relpath` under the work dir; refused if it would lead out."""
        target = (self.work / relpath.lstrip("/")).resolve()
        if not str(target).startswith(str(self.work.resolve()) + os.sep):
            raise ValueError(f"'{relpath}' is outside the node's work dir")
        return target

    def put_file(self, body: p.PutFile) -> None:
        error = None
        try:
            target = self.confined(body.dest)
            headers = {"authorization": f"Bearer {self.identity['credential']}"}
            response = self.http.get(f"{p.PREFIX}/transfers/{body.transfer_id}", headers=headers)
            if response.status_code != 200:
                raise ValueError(f"fetching the file: {_detail(response)}")
            data = response.content
            if hashlib.sha256(data).hexdigest() != body.sha256:
                raise ValueError("the file that arrived does not match its sha256")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.part")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError as exc:
            error = f"{body.dest}: {_why(exc)}"
        except ValueError as exc:
            error = str(exc)
        self._post(
            "/transfers",
            p.TransferDone(node_id=self.node_id, transfer_id=body.transfer_id, error=error),
            _Ok,
        )

    def get_file(self, body: p.GetFile) -> None:
        done = p.TransferDone(node_id=self.node_id, transfer_id=body.transfer_id)
        try:
            data = self.confined(body.path).read_bytes()
            done = done.model_copy(
                update={
                    "data": base64.b64encode(data).decode(),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        except OSError as exc:
            done = done.model_copy(update={"error": f"{body.path}: {_why(exc)}"})
        except ValueError as exc:
            done = done.model_copy(update={"error": str(exc)})
        self._post("/transfers", done, _Ok)

    # --- liveness ----------------------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        last = time.monotonic()
        # in short steps: the interval is the server's (it says at sync), not the one known
        # before the first sync
        while not self.stop.wait(min(self.heartbeat_s, 0.1)):
            if not self.connected.is_set() or time.monotonic() - last < self.heartbeat_s:
                continue
            last = time.monotonic()
            info = None
            if time.monotonic() - self.info_at >= INFO_EVERY_S:
                fresh = self.node_info()
                self.info_at = time.monotonic()
                if fresh != self.last_info:
                    info, self.last_info = fresh, fresh
            body = p.HeartbeatRequest(node_id=self.node_id, session=self.session, info=info)
            try:
                answer: p.HeartbeatResponse = self._post("/heartbeat", body, p.HeartbeatResponse)
            except (httpx.HTTPError, ServerSaid):
                if info is not None:
                    self.last_info = None  # send it again next time
                continue
            self.heartbeat_s, self.max_tasks = answer.heartbeat_s, answer.max_tasks
            if answer.resync:
                log.warning("the server had this node offline: syncing again")
                self.connected.clear()

    # --- reports -----------------------------------------------------------------------------

    def report_loop(self) -> None:
        pending: p.Report | None = None
        refused_wait = failing_wait = RETRY_MIN_S
        while not self.stop.is_set():
            self.report_wake.wait(REPORT_EVERY_S)
            self.report_wake.clear()
            if not self.connected.is_set():
                continue
            try:
                while True:
                    if pending is None:
                        pending = self.build_report()
                    if pending is None:
                        break
                    answer: p.ReportResponse = self._post("/report", pending, p.ReportResponse)
                    self.applied(pending, answer)
                    refused_wait = failing_wait = RETRY_MIN_S
                    more = any(a.chunks for a in pending.attempts)
                    pending = None
                    if not more:
                        break
            except ServerSaid as exc:
                if exc.status in (409, 429) or exc.status >= 500:
                    # the server's own trouble (its disk, its store): the same report again,
                    # less and less often while it lasts
                    log.warning("report not delivered (%s): sent again", _short(exc))
                    self.stop.wait(failing_wait)
                    failing_wait = min(failing_wait * 2, RETRY_MAX_S)
                    continue
                # refused as it is (malformed, too large): sending the same bytes again cannot
                # help; built afresh, and less and less often while the server keeps refusing
                log.error("report refused (%s): built again in %.0f s", _short(exc), refused_wait)
                pending = None
                self.stop.wait(refused_wait)
                refused_wait = min(refused_wait * 4, REFUSED_MAX_S)
            except httpx.HTTPError as exc:
                log.warning("report not delivered (%s): sent again", _short(exc))
                self.stop.wait(RETRY_MIN_S)
            except Revoked:
                raise  # the agent stops (its guard says why)
            except Exception:  # the loop must outlive any one report (a file gone mid-read)
                log.exception("building a report failed: built again")
                pending = None
                self.stop.wait(RETRY_MAX_S)

    def build_report(self) -> p.Report | None:
        with self.lock:
            tracked = [t for t in self.tracked.values() if not t.done]
        if not tracked:
            return None
        budget = p.MAX_REPORT_BYTES // 2
        attempts: list[p.AttemptReport] = []
        for t in tracked:
            alive = t.alive()
            ended = (t.folder / "runtime" / "result.json").exists()
            chunks, complete, used = plan_chunks(
                t.folder,
                t.files,
                budget,
                ended=ended and not alive,  # its files no longer change
                large=t.upload_large or t.everything,
            )
            budget -= used
            attempts.append(
                p.AttemptReport(
                    attempt_id=t.attempt_id,
                    fence=t.fence,
                    alive=alive,
                    ended=ended,
                    done=complete,
                    chunks=tuple(chunks),
                )
            )
        with self.lock:
            self.seq += 1
            seq = self.seq
        return p.Report(
            node_id=self.node_id, session=self.session, seq=seq, attempts=tuple(attempts)
        )

    def applied(self, report: p.Report, answer: p.ReportResponse) -> None:
        wants = {(w.attempt_id, w.path): w.offset for w in answer.wants}
        with self.lock:
            for a in report.attempts:
                t = self.tracked.get(a.attempt_id)
                if t is None:
                    continue
                for chunk in a.chunks:
                    state = t.files.setdefault(chunk.path, FileState())
                    state.sent(chunk)
                for (attempt_id, path), offset in wants.items():
                    if attempt_id == a.attempt_id:
                        t.files[path] = FileState(offset=offset)
                if a.done and not any(k[0] == a.attempt_id for k in wants):
                    t.done = True
                    marker = self.attempts_dir / f"{t.attempt_id}.json"
                    _write_json(marker, {**t.marker(), "done": True})
            for attempt_id in answer.forget:
                self.tracked.pop(attempt_id, None)
        for attempt_id in answer.stop:
            self.stop_and_clean(attempt_id)


class ServerSaid(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


class StagingError(Exception):
    pass


class ServerAway(Exception):
    """The server answered 5xx: its store away, a restart under way."""


class BadArchive(Exception):
    """A fetched bundle archive that does not unpack to its digest."""


class _Ok(p.Message):
    status: str = "ok"


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except ValueError:
        return response.text[:200] or f"HTTP {response.status_code}"


def _why(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _ended(t: Tracked) -> bool:
    return (t.folder / "runtime" / "result.json").exists() or not t.alive()


def _pinned(t: Tracked) -> set[int]:
    try:
        text = (t.folder.parent / f"{t.attempt_id}.cpus").read_text()
    except OSError:
        return set()
    return {int(c) for c in text.split(",") if c.strip().isdigit()}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.part")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _write_failed(folder: Path, reason: str, message: str) -> None:
    """An attempt that could not start on this node: its end, as the wrapper would write it."""
    from datetime import UTC, datetime

    runtime = folder / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    (folder / "artifacts").mkdir(exist_ok=True)
    now = datetime.now(UTC).isoformat()
    _write_json(
        runtime / "result.json",
        {"state": "failed", "reason": reason, "message": message, "finished_at": now},
    )
