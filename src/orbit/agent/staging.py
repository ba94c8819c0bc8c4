"""Staging an attempt: its frozen bundle, from the node's cache or fetched once and checked
against its digest (patiently while the server restarts), and the checkpoint it resumes
from, copied from this node's own folder of the earlier attempt or fetched."""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from orbit.agent import connection
from orbit.agent.files import copy_beneath
from orbit.model.backoff import retry_after
from orbit.runtime import host_staging
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")

BUNDLE_PATIENCE_S = 60.0  # how long a bundle fetch waits out a server that is away


def forget_bundle(agent: AgentState, digest: str) -> None:
    """A cached bundle that no longer gives its digest: removed, fetched anew when next
    needed."""
    log.error("bundle %s in the cache was changed since it was fetched: removed", digest[:12])
    with agent.bundle_lock:
        shutil.rmtree(agent.bundles_dir / digest, ignore_errors=True)


def bundle(agent: AgentState, digest: str) -> Path:
    """The bundle with this digest, from the cache, else fetched once and checked. An
    archive that does not match its digest is asked for once more, made afresh (the
    server's cached copy may be what went bad)."""
    cached = agent.bundles_dir / digest
    if (cached / "job.json").is_file():
        return cached
    with agent.bundle_lock:
        if (cached / "job.json").is_file():
            return cached
        try:
            fetch_patiently(agent, digest, cached, rebuild=False)
        except BadArchive as exc:
            log.warning("bundle %s: %s; asking for it made afresh", digest[:12], exc)
            try:
                fetch_patiently(agent, digest, cached, rebuild=True)
            except BadArchive as again:
                raise StagingError(f"bundle {digest[:12]}: {again}") from None
        host_staging.compile_scripts(str(cached))
        return cached


def fetch_patiently(agent: AgentState, digest: str, cached: Path, rebuild: bool) -> None:
    """`fetch_bundle`, again while the server is away or failing (restarted, say) for up
    to BUNDLE_PATIENCE_S: a server restart must not fail a start as staging_failed."""
    deadline = time.monotonic() + BUNDLE_PATIENCE_S
    waits = connection.backoff()
    while True:
        try:
            return fetch_bundle(agent, digest, cached, rebuild)
        except (httpx.TransportError, connection.ServerAway) as exc:
            wait = waits.next(connection.asked(exc))
            if time.monotonic() + wait > deadline or agent.stop.is_set():
                raise StagingError(
                    f"fetching bundle {digest[:12]}: {connection.short(exc)}"
                ) from None
            log.warning("fetching bundle %s (%s): again", digest[:12], connection.short(exc))
            agent.stop.wait(wait)


def fetch_bundle(agent: AgentState, digest: str, cached: Path, rebuild: bool) -> None:
    from orbit.core.execution.bundle_archive import extract_bundle_archive

    archive = agent.bundles_dir / f".{digest}.{uuid.uuid4().hex}.tar"
    headers = {"authorization": f"Bearer {agent.identity['credential']}"}
    params = {"rebuild": "true"} if rebuild else None
    try:
        with agent.http.stream(
            "GET", f"{p.PREFIX}/bundles/{digest}", headers=headers, params=params
        ) as response:
            if response.status_code == 401:
                raise connection.Revoked(connection.detail(response))
            if response.status_code != 200:
                response.read()
                if response.status_code >= 500:
                    raise connection.ServerAway(
                        connection.detail(response), retry_after(response.headers)
                    )
                raise StagingError(f"fetching bundle {digest[:12]}: {connection.detail(response)}")
            with open(archive, "wb") as out:
                for block in response.iter_bytes(1 << 20):
                    out.write(block)
        try:
            extract_bundle_archive(archive, cached, expected_digest=digest)
        except Exception as exc:
            raise BadArchive(str(exc)) from None
    finally:
        archive.unlink(missing_ok=True)


def stage_resume(agent: AgentState, start: p.StartAttempt) -> Path | None:
    """An earlier attempt's checkpoint, put beside the new attempt's folder for its
    wrapper to move in: copied from this node's own folder of that attempt when it has
    one, else fetched from the control plane's copy. Where it cannot be had, the attempt
    starts without it (from the beginning) and the log says why."""
    resume = start.resume
    if resume is None:
        return None
    staged = agent.attempts_dir / f".resume-{start.attempt_id}"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        try:  # this node's own folder of it: its task wrote it, so nothing in it is
            # followed (copy_beneath), whatever links it left
            copy_beneath(
                agent.attempts_dir / resume.attempt_id, f"artifacts/{resume.relpath}", staged
            )
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)
            fetch_checkpoint(agent, resume, staged)
    except (OSError, httpx.HTTPError, StagingError) as exc:
        shutil.rmtree(staged, ignore_errors=True)
        log.warning(
            "attempt %s starts without %s's checkpoint: %s",
            start.attempt_id,
            resume.attempt_id,
            connection.short(exc),
        )
        return None
    return staged


def fetch_checkpoint(agent: AgentState, resume: p.Resume, staged: Path) -> None:
    headers = {"authorization": f"Bearer {agent.identity['credential']}"}
    top = f"artifacts/{resume.relpath}"
    for path, size in resume.files:
        inside = path[len(top) :].lstrip("/") if path.startswith(top) else None
        if inside is None:
            continue
        dest = staged / inside if inside else staged
        dest.parent.mkdir(parents=True, exist_ok=True)
        url = f"{p.PREFIX}/attempts/{resume.attempt_id}/files"
        with agent.http.stream("GET", url, headers=headers, params={"path": path}) as response:
            if response.status_code != 200:
                response.read()
                raise StagingError(f"{path}: {connection.detail(response)}")
            with open(dest, "wb") as out:
                for block in response.iter_bytes(1 << 20):
                    out.write(block)
        if dest.stat().st_size != size:
            raise StagingError(f"{path}: {dest.stat().st_size} bytes, {size} expected")


class StagingError(Exception):
    pass


class CutOff(Exception):
    """A start the node will not make: cut off from the server past its fence."""


class BadArchive(Exception):
    """A fetched bundle archive that does not unpack to its digest."""
