"""The affinetes task's `mode: evaluate`, on the node: the actor's evaluate() awaited per task,
`concurrency` at a time, each within timeout_s; each result, as upstream returned it, appended
to artifacts/raw/results.jsonl, the progress (done / total, mean score so far, failed) to
artifacts/logging.jsonl; a watchdog for a task stuck in synchronous code. Standard library
only, Python 3.8+; staged beside the launcher (orbit_affinetes.py, which calls evaluate()) as
orbit_affinetes_evaluate.py.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

RESULTS = os.path.join("raw", "results.jsonl")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def say(line: str) -> None:
    print(line, flush=True)


def call_args(evaluate: Any, offered: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """What evaluate() is given: of ours (model, base_url, task_id, api_key) those its
    signature takes (all, where it takes **kwargs), then evaluate_args as they are."""
    params = inspect.signature(evaluate).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    args = {k: v for k, v in offered.items() if takes_any or k in params}
    args.update(extra)
    return args


def as_json(result: Any) -> Any:
    """Upstream's result as JSON can hold it, nothing taken out or renamed: a pydantic model
    by its own dump, a dataclass by its fields, anything else as json writes it."""
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    if hasattr(result, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(result)
    return result


def score_of(result: Any) -> float | None:
    score = result.get("score") if isinstance(result, dict) else None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    return float(score)


class Tally:
    """Counts, scores and the progress line, as tasks end."""

    def __init__(self, total: int, progress: Any) -> None:
        self.total, self.progress = total, progress
        self.counts = {"ok": 0, "failed": 0, "timed_out": 0}
        self.scores: list[float] = []

    def add(self, record: dict[str, Any]) -> None:
        self.counts[record["status"]] += 1
        score = score_of(record.get("result"))
        if score is not None:
            self.scores.append(score)
        line: dict[str, Any] = {"step": self.done, "max_steps": self.total}
        line["failed"] = self.total_failed
        if self.scores:
            line["score"] = round(sum(self.scores) / len(self.scores), 6)
        self.progress.write(json.dumps(line) + "\n")
        self.progress.flush()

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def total_failed(self) -> int:
        return self.counts["failed"] + self.counts["timed_out"]

    def final_counts(self) -> dict[str, int]:
        """The manifest's counts: each status, what never ran, and the total."""
        return {**self.counts, "not_run": self.total - self.done, "total": self.total}

    def summary(self) -> dict[str, Any]:
        scores = self.scores
        return {
            "scored": len(scores),
            "mean": sum(scores) / len(scores) if scores else None,
            "min": min(scores) if scores else None,
            "max": max(scores) if scores else None,
        }


class Stuck:
    """The watchdog for a task stuck in synchronous code, which asyncio's timeout cannot stop
    (it acts only where the task awaits): once a task is BLOCKED_S past its timeout_s while the
    event loop has not run for BLOCKED_S, the tasks under way are recorded as timed out, the
    manifest is written, and the process ends (exit 1): nothing else could stop that code."""

    BLOCKED_S = 10.0

    def __init__(self, finish: Any) -> None:
        self.finish, self.lock = finish, threading.Lock()
        self.inflight: dict[Any, tuple[float, dict[str, Any], float]] = {}
        self.beat = time.monotonic()

    async def beating(self) -> None:
        while True:
            self.beat = time.monotonic()
            await asyncio.sleep(1)

    def watch(self, out: Any, tally: Tally) -> None:
        threading.Thread(target=self._watch, args=(out, tally), daemon=True).start()

    def _watch(self, out: Any, tally: Tally) -> None:
        while True:
            time.sleep(1)
            at = time.monotonic()
            late = [t for t, (deadline, _, _) in list(self.inflight.items()) if at > deadline]
            if late and at - self.beat > self.BLOCKED_S:
                self._give_up(out, tally)

    def _give_up(self, out: Any, tally: Tally) -> None:
        self.lock.acquire()  # kept until the process ends: the loop's thread writes no more
        for task_id, (_, record, began) in list(self.inflight.items()):
            record.update(
                status="timed_out",
                error="still running past timeout_s in synchronous code, which cannot be "
                "interrupted: the run was stopped",
                finished_at=now(),
                seconds=round(time.monotonic() - began, 3),
            )
            out.write(json.dumps(record, default=repr) + "\n")
            out.flush()
            tally.add(record)
            say(f"task {task_id}: timed_out, stuck in synchronous code")
        say("orbit affinetes: a task ran past its timeout in synchronous code: the run stops")
        code = self.finish(tally.final_counts(), tally.summary())
        sys.stdout.flush()
        os._exit(code)


async def run_tasks(
    actor: Any,
    settings: dict[str, Any],
    offered: dict[str, Any],
    out: Any,
    tally: Tally,
    stuck: Stuck,
) -> None:
    gate = asyncio.Semaphore(int(settings["concurrency"]))
    timeout = float(settings["timeout_s"])

    async def one(task_id: Any) -> None:
        async with gate:
            started, record = time.monotonic(), {"task_id": task_id, "started_at": now()}
            stuck.inflight[task_id] = (started + timeout + stuck.BLOCKED_S, record, started)
            args = call_args(
                actor.evaluate, {**offered, "task_id": task_id}, settings["evaluate_args"]
            )
            try:
                result = await asyncio.wait_for(actor.evaluate(**args), timeout)
                record.update(status="ok", result=as_json(result))
            except asyncio.TimeoutError:  # not the builtin before 3.11
                record.update(status="timed_out", error=f"no result within {timeout:g} s")
            except Exception as exc:  # that task's failure, told as upstream raised it
                record.update(
                    status="failed",
                    error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc(limit=20),
                )
            record.update(finished_at=now(), seconds=round(time.monotonic() - started, 3))
            with stuck.lock:
                stuck.inflight.pop(task_id, None)
                out.write(json.dumps(record, default=repr) + "\n")
                out.flush()
                tally.add(record)
            score = score_of(record.get("result"))
            said = f"score {score:g}" if score is not None else record.get("error") or "no score"
            say(f"task {task_id}: {record['status']}, {said} ({record['seconds']:g} s)")

    beating = asyncio.ensure_future(stuck.beating())
    stuck.watch(out, tally)
    try:
        await asyncio.gather(*(one(task_id) for task_id in settings["tasks"]))
    finally:
        beating.cancel()


def evaluate(
    actor: Any,
    settings: dict[str, Any],
    offered: dict[str, Any],
    what: tuple[str, str],
    artifacts: str,
    stuck: Stuck,
) -> tuple[int, dict[str, int], dict[str, Any], bool]:
    """evaluate() for every task: (exit code, counts, score summary, cut short by SIGTERM).
    `what`: the environment at its commit, and the endpoint's URL as it may be shown."""
    where, url = what
    say(
        f"orbit affinetes: {where}, {len(settings['tasks'])} tasks, "
        f"{settings['concurrency']} at a time, model {settings['model']} at {url}"
    )
    os.makedirs(os.path.join(artifacts, "raw"), exist_ok=True)
    with open(os.path.join(artifacts, RESULTS), "a", encoding="utf-8") as out:  # 3.8: no (a, b)
        with open(os.path.join(artifacts, "logging.jsonl"), "a", encoding="utf-8") as progress:
            tally = Tally(len(settings["tasks"]), progress)
            cancelled = _run(actor, settings, offered, out, tally, stuck)
    counts = tally.final_counts()
    if cancelled:
        return 128 + signal.SIGTERM, counts, tally.summary(), True
    if tally.total_failed:
        said = f"{tally.counts['failed']} failed, {tally.counts['timed_out']} timed out"
        say(f"orbit affinetes: {tally.total_failed} of {tally.total} tasks failed ({said})")
        return 1, counts, tally.summary(), False
    mean = tally.summary()["mean"]
    said = f", mean score {mean:g}" if mean is not None else ""
    say(f"orbit affinetes: {tally.total} tasks done{said}")
    return 0, counts, tally.summary(), False


def _run(
    actor: Any,
    settings: dict[str, Any],
    offered: dict[str, Any],
    out: Any,
    tally: Tally,
    stuck: Stuck,
) -> bool:
    """Run the tasks; True when SIGTERM cut them short."""
    loop = asyncio.new_event_loop()
    work = loop.create_task(run_tasks(actor, settings, offered, out, tally, stuck))
    stopped = []

    def stop() -> None:
        stopped.append(True)
        work.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        loop.run_until_complete(work)
    except asyncio.CancelledError:
        pass
    finally:
        loop.close()
    return bool(stopped)
