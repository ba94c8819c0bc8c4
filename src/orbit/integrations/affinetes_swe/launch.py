#!/usr/bin/env python3
"""The `affinetes` task on the node: one affinetes environment run as a black box.

Staged into the bundle's workdir as orbit_affinetes.py beside its siblings (orbit_git_tree.py,
orbit_affinetes_evaluate.py for step 2-3, orbit_affinetes_bridge.py, orbit_affinetes_env.py);
standard library only, Python 3.8+. Its settings come in ORBIT_AFFINETES (orbit.integrations
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

import importlib.util
import inspect
import json
import os
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:  # as mypy reads them
    from orbit.integrations.affinetes_swe import bridge, evaluating, pyenv
    from orbit.runtime import git_tree
else:
    try:  # in the bundle: beside this file
        import orbit_affinetes_bridge as bridge
        import orbit_affinetes_env as pyenv
        import orbit_affinetes_evaluate as evaluating
        import orbit_git_tree as git_tree
    except ImportError:  # as part of the orbit package
        from orbit.integrations.affinetes_swe import bridge, evaluating, pyenv
        from orbit.runtime import git_tree

now, say = evaluating.now, evaluating.say

SCHEMA = "affinetes_swe_blackbox_run.v1"
MANIFEST = os.path.join("manifests", "affinetes_swe_blackbox_run.json")


class Refused(Exception):
    """Nothing of the upstream can run: exit 2 with this line."""


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


def check_tree(hashes: dict[str, str], record: dict[str, Any]) -> bool:
    """Whether the staged tree (its files' `hashes`) can be checked against the commit (not
    with submodules, whose commits a folder does not show); raise Refused where it differs."""
    if record.get("submodules_not_staged"):
        return False
    found = git_tree.tree_of(hashes)
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
        before = git_tree.file_hashes(tree)  # each file read once: the tree id is made of them
        checked = check_tree(before, record)
        in_env = enter_environment(tree, settings["environment"], record["commit"], artifacts)
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
            "raw": [bridge.EVENTS if settings["mode"] == "bridge" else evaluating.RESULTS],
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
        code, counts, cancelled = bridge.serve(
            actor, settings, artifacts, folder, evaluating.as_json
        )
        return finish(code, counts, None, cancelled)
    stuck = evaluating.Stuck(lambda counts, scores: finish(1, counts, scores, False))
    what = (f"{settings['environment']} at {record['commit'][:12]}", shown_url(url))
    code, counts, scores, cancelled = evaluating.evaluate(
        actor, settings, offered, what, artifacts, stuck
    )
    return finish(code, counts, scores, cancelled)


if __name__ == "__main__":
    sys.exit(main())
