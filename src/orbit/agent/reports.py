"""The reporter: each tracked attempt's liveness, end and files (by byte offset, logs and small
files first, within one report's budget), sent until delivered; what the answer says is
applied (offsets, what to forget, what to stop)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx

from orbit.agent import connection, stopping
from orbit.agent.connection import RETRY_MAX_S, RETRY_MIN_S
from orbit.agent.files import FileState, plan_chunks
from orbit.agent.tracked import has_ended, write_json
from orbit.model.backoff import Backoff
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")

REPORT_EVERY_S = 0.25
REFUSED_MAX_S = 60.0  # the longest wait between reports the server refuses as they are


def report_loop(agent: AgentState) -> None:
    pending: p.Report | None = None
    failing = connection.backoff()  # the same report again while the server fails
    refused = Backoff(base_s=RETRY_MIN_S, cap_s=REFUSED_MAX_S)  # built afresh, refused again
    while not agent.stop.is_set():
        agent.report_wake.wait(REPORT_EVERY_S)
        agent.report_wake.clear()
        if not agent.connected.is_set():
            continue
        try:
            while True:
                if pending is None:
                    pending = build_report(agent)
                if pending is None:
                    break
                answer: p.ReportResponse = connection.post(
                    agent, "/report", pending, p.ReportResponse
                )
                applied(agent, pending, answer)
                failing.reset()
                refused.reset()
                more = any(a.chunks for a in pending.attempts)
                pending = None
                if not more:
                    break
        except connection.ServerSaid as exc:
            if exc.status in (409, 429) or exc.status >= 500:
                # the server's own trouble (its disk, its store): the same report again,
                # less and less often while it lasts
                log.warning("report not delivered (%s): sent again", connection.short(exc))
                agent.stop.wait(failing.next(exc.retry_after))
                continue
            # refused as it is (malformed, too large): sending the same bytes again cannot
            # help; built afresh, and less and less often while the server keeps refusing
            wait = refused.next()
            log.error("report refused (%s): built again in %.1f s", connection.short(exc), wait)
            pending = None
            agent.stop.wait(wait)
        except httpx.HTTPError as exc:
            log.warning("report not delivered (%s): sent again", connection.short(exc))
            agent.stop.wait(failing.next())
        except connection.Revoked:
            raise  # the agent stops (its guard says why)
        except Exception:  # the loop must outlive any one report (a file gone mid-read)
            log.exception("building a report failed: built again")
            pending = None
            agent.stop.wait(RETRY_MAX_S)


def release_users(agent: AgentState) -> None:
    """Attempts that ended give their user back (see orbit.agent.isolation)."""
    if agent.users is None:
        return
    with agent.lock:
        tracked = list(agent.tracked.values())
    for t in tracked:
        if agent.users.uid_of(t.attempt_id) is not None and has_ended(t) and not t.alive():
            agent.users.give_back(t.attempt_id, t.folder)


def build_report(agent: AgentState) -> p.Report | None:
    release_users(agent)
    with agent.lock:
        gone = [t for t in agent.tracked.values() if not t.launching and not t.folder.is_dir()]
        for t in gone:
            # its folder is gone (a work dir wiped): its files will never come from here
            log.warning("attempt %s: its folder %s is gone", t.attempt_id, t.folder)
            agent.tracked.pop(t.attempt_id)
            agent.missing.add(t.attempt_id)
        tracked = [t for t in agent.tracked.values() if not t.done]
        missing = tuple(sorted(agent.missing))
    if not tracked and not missing:
        return None
    budget = p.MAX_REPORT_BYTES // 2
    attempts: list[p.AttemptReport] = []
    for t in tracked:
        alive = t.alive()
        ended = (t.folder / "runtime" / "result.json").exists()
        if not alive and not ended and not t.swept:
            # its wrapper died without a result (killed, the node rebooted): what it left
            # is stopped, and its files, which nothing writes any more, go up and are sealed
            t.swept = True
            stopping.sweep_dead(agent, t)
        chunks, complete, used = plan_chunks(
            t.folder,
            t.files,
            budget,
            ended=not alive,  # its files no longer change
            large=t.upload_large or t.everything,
        )
        budget -= used
        # a folder wiped while it was read is not complete: the next report says it is gone
        complete = complete and (t.folder / "runtime").is_dir()
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
    with agent.lock:
        agent.seq += 1
        seq = agent.seq
    return p.Report(
        node_id=agent.node_id,
        session=agent.session,
        seq=seq,
        attempts=tuple(attempts),
        missing=missing,
    )


def applied(agent: AgentState, report: p.Report, answer: p.ReportResponse) -> None:
    wants = {(w.attempt_id, w.path): w.offset for w in answer.wants}
    with agent.lock:
        for a in report.attempts:
            t = agent.tracked.get(a.attempt_id)
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
                marker = agent.attempts_dir / f"{t.attempt_id}.json"
                write_json(marker, {**t.marker(), "done": True})
        forgotten = [a for a in answer.forget if agent.tracked.pop(a, None) is not None]
    for attempt_id in forgotten:  # not ours (any more): its user is given back too
        if agent.users is not None:
            agent.users.give_back(attempt_id, agent.attempts_dir / attempt_id)
    with agent.lock:
        agent.missing.difference_update(report.missing)
    for attempt_id in answer.stop:
        stopping.halt(agent, attempt_id, "the control plane has ended it")
