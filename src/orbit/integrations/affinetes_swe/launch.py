#!/usr/bin/env python3
"""The `affinetes` task on the node: one affinetes environment run as a black box.

Staged into the bundle's workdir as orbit_affinetes.py beside orbit_git_tree.py; standard
library only, Python 3.8+. Its settings come in ORBIT_AFFINETES (orbit.integrations
.affinetes_swe.task). In order:

1. The upstream staged at inputs/upstream must be the commit's tree exactly (its git tree id,
   as inputs/.orbit/provenance.json recorded it): otherwise nothing of it runs (exit 2).
2. environments/ENV/env.py is imported from there as it is (no bytecode written beside it),
   the actor made with actor_args, and its async evaluate() awaited per task id, `concurrency`
   at a time, each within timeout_s, with the model, the endpoint's URL, the task id and the
   API key (where evaluate() takes them), and evaluate_args unchanged.
3. Each result goes, as upstream returned it, to artifacts/raw/results.jsonl (one line a task:
   its id, status ok | failed | timed_out, times, and upstream's payload or the error); the
   progress (done / total, mean score so far) to artifacts/logging.jsonl. A failing task is
   that task's failure: the others go on.
4. The tree is checked again: a file changed, added or removed during the run fails it (exit
   3, naming them). Then artifacts/manifests/affinetes_swe_blackbox_run.json, the thin
   manifest: what ran, counts and scores, never upstream's payloads.

Exit 0 when every task gave a result, 1 when some failed or timed out (the last line says how
many), 2 when nothing could run, 3 when the upstream's files changed. SIGTERM (a cancel) stops
the tasks under way and writes the manifest of what was done.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:  # as mypy reads them
    from orbit.integrations.affinetes_swe import bridge, pyenv
    from orbit.runtime import git_tree
else:
    try:  # in the bundle: beside this file
        import orbit_affinetes_bridge as bridge
        import orbit_affinetes_env as pyenv
        import orbit_git_tree as git_tree
    except ImportError:  # as part of the orbit package
        from orbit.integrations.affinetes_swe import bridge, pyenv
        from orbit.runtime import git_tree

SCHEMA = "affinetes_swe_blackbox_run.v1"
MANIFEST = os.path.join("manifests", "affinetes_swe_blackbox_run.json")
RESULTS = os.path.join("raw", "results.jsonl")


class Refused(Exception):
    """Nothing of the upstream can run: exit 2 with this line."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def say(line: str) -> None:
    print(line, flush=True)


def upstream_record(inputs: str) -> dict[str, Any]:
    """What ORBIT recorded of the staged upstream when it froze the bundle."""
    path = os.path.join(inputs, ".orbit", "provenance.json")
    try:
        with open(path, encoding="utf-8") as f:
            sources = json.load(f)["sources"]
    except (OSError, ValueError, KeyError) as exc:
        raise Refused(f"no record of the pinned upstream ({path}: {exc})") from None
    for source in sources:
        if source.get("upstream") == "task.upstream":
            return dict(source)
    raise Refused(f"{path} records no upstream")


def check_tree(tree: str, record: dict[str, Any]) -> bool:
    """Whether the staged tree can be checked against the commit (not with submodules, whose
    commits a folder does not show); raise Refused where it differs."""
    if record.get("submodules_not_staged"):
        return False
    found = git_tree.tree_id(tree)
    if found != record["tree"]:
        raise Refused(
            f"the staged upstream is not commit {record['commit']}: its tree is {found}, the "
            f"commit's {record['tree']}; nothing of it is run"
        )
    return True


def endpoint_url(endpoint: dict[str, Any]) -> str:
    if endpoint.get("base_url"):
        return str(endpoint["base_url"])
    services = json.loads(os.environ.get("ORBIT_SERVICES") or "{}")
    url = services.get(endpoint["service"])
    if not url:
        raise Refused(f"this node does not advertise the model server {endpoint['service']!r}")
    return str(url).rstrip("/") + str(endpoint.get("path") or "")


def shown_url(url: str) -> str:
    """The URL without a user or password in it (for the manifest)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def load_actor(tree: str, environment: str, name: str | None, args: dict[str, Any]) -> Any:
    """env.py's actor (`name`; else upstream's own `Actor`, else its one class with an
    evaluate()), made with `args`. Imports as upstream's container does: env.py's siblings
    as top-level modules, then the repository's own package (affinetes.core, ...)."""
    folder = os.path.join(tree, "environments", environment)
    sys.path[:0] = [folder, tree]
    spec = importlib.util.spec_from_file_location(
        f"affinetes_env_{os.getpid()}", os.path.join(folder, "env.py")
    )
    if spec is None or spec.loader is None:
        raise Refused(f"environments/{environment}/env.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if name is None and inspect.isclass(getattr(module, "Actor", None)):
        name = "Actor"  # what upstream's framework makes (`Actor = InfiniteActor` included)
    if name is None:
        found = {
            id(value): value
            for value in vars(module).values()
            if inspect.isclass(value)
            and value.__module__ == module.__name__
            and callable(getattr(value, "evaluate", None))
        }
        if len(found) != 1:
            raise Refused(f"environments/{environment}/env.py has {len(found)} actors: name one")
        return next(iter(found.values()))(**args)
    return getattr(module, name)(**args)


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
        counts = {**tally.counts, "not_run": tally.total - tally.done, "total": tally.total}
        code = self.finish(counts, tally.summary())
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


def enter_environment(
    tree: str, environment: str, commit: str, artifacts: str
) -> dict[str, Any] | None:
    """Where the environment has its own requirements.txt: go on in the per-commit Python
    environment made for them (this program again, under its python); there, what it is."""
    requirements = pyenv.requirements_of(tree, environment)
    if requirements is None:
        return None
    folder = os.environ.get("ORBIT_AFFINETES_ENV")
    if not folder:  # not in it yet
        folder, made = pyenv.ensure(commit, requirements, say)
        os.makedirs(os.path.join(artifacts, "raw"), exist_ok=True)
        with open(os.path.join(artifacts, "raw", "python_env.txt"), "w", encoding="utf-8") as f:
            f.write(pyenv.freeze(folder))  # what upstream's code will import, as pip says
        os.environ["ORBIT_AFFINETES_ENV"] = folder
        python = pyenv.python_of(folder)
        sys.stdout.flush()
        os.execv(python, [python, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    with open(os.path.join(folder, pyenv.STAMP), encoding="utf-8") as f:
        made = json.load(f)
    return {"path": folder, **made, "freeze": "raw/python_env.txt", **precheck_here(artifacts)}


def precheck_here(artifacts: str) -> dict[str, str]:
    """The bundle's own precheck, run again in this interpreter (the per-commit environment):
    what upstream's code loads, recorded as the precheck records the task's interpreter, in
    raw/python_env-precheck.json and .log (the wrapper's own, of python3, stays as it is)."""
    bundle = os.environ.get("ORBIT_BUNDLE_DIR")
    if not bundle:
        return {}
    try:
        sys.path.insert(0, os.path.join(bundle, "scripts"))
        import orbit_precheck  # type: ignore[import-not-found]

        with open(os.path.join(bundle, "job.json"), encoding="utf-8") as f:
            report, _ = orbit_precheck.run(json.load(f), os.path.join(bundle, "inputs"))
        base = os.path.join(artifacts, "raw", "python_env-precheck")
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        with open(base + ".log", "w", encoding="utf-8") as f:
            f.write(orbit_precheck.human(report))
    except Exception as exc:  # a record, never what stops the run
        say(f"orbit affinetes: the environment's precheck could not run: {exc}")
        return {}
    finally:
        sys.path.remove(os.path.join(bundle, "scripts"))
    return {"precheck": "raw/python_env-precheck.log"}


def main() -> int:
    settings = json.loads(os.environ["ORBIT_AFFINETES"])
    artifacts = os.environ.get("ORBIT_ARTIFACTS_DIR") or "artifacts"
    inputs = os.environ.get("ORBIT_INPUTS_DIR") or ".."
    tree = os.path.normpath(os.path.join(os.getcwd(), settings["upstream_dir"]))
    sys.dont_write_bytecode = True  # nothing written into the upstream's tree
    started = now()
    try:
        record = upstream_record(inputs)
        checked = check_tree(tree, record)
        in_env = enter_environment(tree, settings["environment"], record["commit"], artifacts)
        before = git_tree.file_hashes(tree)
        url = endpoint_url(settings["endpoint"])
        actor = load_actor(tree, settings["environment"], settings["actor"], settings["actor_args"])
    except (Refused, pyenv.NotMade) as exc:
        say(f"orbit affinetes: {exc}")
        return 2
    key_env = settings.get("api_key_env")
    # an OpenAI client refuses no key at all, and a server on the node takes any
    key = os.environ.get(key_env) if key_env else "EMPTY"
    offered = {"model": settings["model"], "base_url": url, "api_key": key}

    def finish(code: int, counts: dict[str, int], scores: Any, cancelled: bool) -> int:
        """The tree checked again, the manifest written: the run's exit."""
        changed = git_tree.changed_files(before, git_tree.file_hashes(tree))
        manifest = {
            "schema_version": SCHEMA,
            "upstream": {
                "repo": record.get("origin_url") or record.get("repo"),
                "commit": record["commit"],
                "tree": record.get("tree"),
                "tree_checked": checked,
                "changed_during_run": list(changed),
            },
            "environment": settings["environment"],
            "actor": type(actor).__name__,
            "method": settings["mode"],
            "task_ids": settings["tasks"],
            "model": settings["model"],
            "endpoint": {**settings["endpoint"], "url": shown_url(url)},
            "counts": counts,
            "score": scores,
            "cancelled": cancelled,
            "started_at": started,
            "finished_at": now(),
            "orbit": {
                "run_id": os.environ.get("ORBIT_RUN_ID") or "manual",
                "attempt_id": os.environ.get("ORBIT_ATTEMPT_ID") or "manual",
                "bundle_digest": os.environ.get("ORBIT_BUNDLE_DIGEST") or None,
            },
            "python_env": in_env,
            "raw": [bridge.EVENTS if settings["mode"] == "bridge" else RESULTS],
        }
        os.makedirs(os.path.join(artifacts, "manifests"), exist_ok=True)
        with open(os.path.join(artifacts, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
        if changed:
            shown = ", ".join(changed[:10]) + (
                f", and {len(changed) - 10} more" if changed[10:] else ""
            )
            say(f"orbit affinetes: the upstream's files changed during the run: {shown}")
            return 3
        return code

    if settings["mode"] == "bridge":
        folder = os.environ.get("ORBIT_BUNDLE_DIR") or os.getcwd()
        code, counts, cancelled = bridge.serve(actor, settings, artifacts, folder, as_json)
        return finish(code, counts, None, cancelled)
    stuck = Stuck(lambda counts, scores: finish(1, counts, scores, False))
    code, counts, scores, cancelled = evaluate(
        actor, settings, offered, url, record, artifacts, stuck
    )
    return finish(code, counts, scores, cancelled)


def evaluate(
    actor: Any,
    settings: dict[str, Any],
    offered: dict[str, Any],
    url: str,
    record: dict[str, Any],
    artifacts: str,
    stuck: Stuck,
) -> tuple[int, dict[str, int], dict[str, Any], bool]:
    """evaluate() for every task: (exit code, counts, score summary, cut short by SIGTERM)."""
    say(
        f"orbit affinetes: {settings['environment']} at {record['commit'][:12]}, "
        f"{len(settings['tasks'])} tasks, {settings['concurrency']} at a time, model "
        f"{settings['model']} at {shown_url(url)}"
    )
    os.makedirs(os.path.join(artifacts, "raw"), exist_ok=True)
    with open(os.path.join(artifacts, RESULTS), "a", encoding="utf-8") as out:  # 3.8: no (a, b)
        with open(os.path.join(artifacts, "logging.jsonl"), "a", encoding="utf-8") as progress:
            tally = Tally(len(settings["tasks"]), progress)
            cancelled = _run(actor, settings, offered, out, tally, stuck)
    counts = {**tally.counts, "not_run": tally.total - tally.done, "total": tally.total}
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


if __name__ == "__main__":
    sys.exit(main())
