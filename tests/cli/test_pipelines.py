"""Run dependencies (`after:` in a spec, `--after`/`--after-any` on the command line) as a user
meets them: through the real CLI, embedded and against a real `orbit server`, on SQLite and
PostgreSQL. A run waits (prepared, shown waiting in `status` and `queue`, naming what for) until
its dependencies end; under `ok` it runs after a success and fails cleanly after a failure,
under `any` it runs however they ended; an unknown or non-run dependency is refused at submit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.cli.test_cli import env, orbit, orbit_json, store_of
from tests.helpers import eventually, write_spec

__all__ = ["env"]  # the fixture: every test runs embedded and against a server

ENDED = ("succeeded", "failed", "terminated")


def submit(env: dict[str, str], folder: Path, name: str, command: str, *args: str) -> str:
    spec = write_spec(folder, f"{name}.yaml", experiment="pipe", task={"command": command})
    return str(orbit_json(env, "submit", str(spec), *args)["id"])


def ended(env: dict[str, str], run_id: str, timeout: float = 60) -> dict[str, Any]:
    """The run once it has ended: polled with `orbit status`, which (embedded) is what moves
    runs, and looks at what a held run waits for."""

    def check() -> dict[str, Any] | None:
        run = orbit_json(env, "status", run_id)
        return run if run["state"] in ENDED else None

    return eventually(check, timeout=timeout, every=0.3)


def gate(folder: Path, name: str) -> tuple[Path, str]:
    """A flag file, and a command that waits for it: a dependency that ends when the test
    says so."""
    flag = folder / name
    return flag, f"while [ ! -e {flag} ]; do sleep 0.1; done"


def test_after_ok_waits_shown_in_status_and_queue_then_runs_after_success(
    env: dict[str, str], tmp_path: Path
) -> None:
    flag, wait = gate(tmp_path, "go")
    done = tmp_path / "first.done"
    first = submit(env, tmp_path, "first", f"{wait}; touch {done}")
    then = submit(env, tmp_path, "then", f"test -e {done} && echo after-first", "--after", first)

    held = orbit_json(env, "status", then)
    assert held["state"] == "prepared"
    assert held["attempts"][0]["held"] == "after"
    said = f"waiting for its dependencies to end (after.ok: {first})"
    assert held["attempts"][0]["message"] == said
    status = orbit(env, "status", then).stdout
    assert said in status and "starts in" not in status and "backoff" not in status
    assert status.startswith(f"{then}  prepared  attempt 1  ") and said in status
    listed = next(line for line in orbit(env, "runs", "list").stdout.splitlines() if then in line)
    assert listed.endswith(said)
    assert f"after.ok   {first}" in orbit(env, "runs", "show", then).stdout

    (entry,) = [e for e in orbit_json(env, "queue") if e["run"] == then]
    assert entry["outcome"] == "held" and entry["waits_for"] == [first]
    assert re.search(rf"{first} \((submitted|starting|running), after\.ok\)", entry["reason"])
    row = next(line for line in orbit(env, "queue").stdout.splitlines() if then in line)
    assert row.startswith("-") and "after deps" in row and first in row

    flag.touch()
    assert ended(env, first)["state"] == "succeeded"
    final = ended(env, then)
    assert final["state"] == "succeeded", final["attempts"][-1]
    assert orbit(env, "logs", then).stdout == "after-first\n"
    assert final["attempts"][0]["held"] is None
    assert then not in orbit(env, "queue").stdout


def test_after_a_failure_any_runs_and_ok_fails_cleanly_without_a_retry(
    env: dict[str, str], tmp_path: Path
) -> None:
    flag, wait = gate(tmp_path, "go")
    first = submit(env, tmp_path, "first", f"{wait}; exit 3")
    anyway = submit(env, tmp_path, "anyway", "echo cleanup ran", "--after-any", first)
    spec = write_spec(
        tmp_path,
        "needs.yaml",
        experiment="pipe",
        task={"command": "echo must not run"},
        after={"ok": [first]},
        retry={"max_retries": 3, "backoff_s": 0},
    )
    needs = str(orbit_json(env, "submit", str(spec))["id"])
    assert orbit_json(env, "status", anyway)["state"] == "prepared"
    assert orbit_json(env, "status", needs)["state"] == "prepared"

    flag.touch()
    assert ended(env, first)["attempts"][-1]["reason"] == "task_exit_nonzero"
    assert ended(env, anyway)["state"] == "succeeded"
    assert orbit(env, "logs", anyway).stdout == "cleanup ran\n"
    failed = ended(env, needs)
    assert failed["state"] == "failed"
    (attempt,) = failed["attempts"]  # a dependency's failure is not retried, however many
    assert attempt["reason"] == "dependency_failed" and attempt["failure_kind"] == "pipeline"
    assert first in attempt["message"] and "after.ok" in attempt["message"]
    assert attempt["handle"] is None  # it never ran anywhere
    line = orbit(env, "status", needs).stdout
    assert "dependency_failed (pipeline)" in line and f"dependency {first} ended failed" in line

    # a dependency cancelled ends its `ok` dependents the same way
    _, wait2 = gate(tmp_path, "never")
    second = submit(env, tmp_path, "second", wait2)
    after_second = submit(env, tmp_path, "after-second", "true", "--after", second[:10])
    orbit(env, "cancel", second)
    gone = ended(env, after_second)
    assert gone["attempts"][0]["reason"] == "dependency_failed"
    assert f"dependency {second} ended terminated (cancelled)" in gone["attempts"][0]["message"]
    store = store_of(env)
    try:
        actions = [e.action for e in store.audit.list_events(run_id=needs)]
    finally:
        store.close()
    assert "run.auto_retry" not in actions


def test_unknown_or_non_run_dependencies_are_refused_at_submit(
    env: dict[str, str], tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, experiment="pipe")
    cases = [
        (["--after", "run-0000dead00"], "after.ok.0: unknown run 'run-0000dead00'"),
        (["--after-any", "sweep-3"], "--after-any: 'sweep-3' is not a run id"),
    ]
    for args, says in cases:
        proc = orbit(env, "submit", str(spec), *args, check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    grouped = tmp_path / "grouped.yaml"
    data = yaml.safe_load(spec.read_text())
    grouped.write_text(yaml.safe_dump({**data, "after": {"ok": ["group:nightly"]}}))
    proc = orbit(env, "submit", str(grouped), check=False)
    assert proc.returncode == 2
    assert "grouped.yaml: after.ok.0: 'group:nightly' is not a run id" in proc.stderr
    assert "only runs can be waited for (a sweep's group: name its runs" in proc.stderr
    real = orbit_json(env, "submit", str(spec), "--wait")["id"]
    twice = orbit(env, "submit", str(spec), "--after", real, "--after-any", real, check=False)
    assert twice.returncode == 2 and "after.any.0: run" in twice.stderr
    assert "named twice" in twice.stderr
    assert [r["id"] for r in orbit_json(env, "runs", "list")] == [real]  # nothing else written
    assert json.loads(orbit(env, "queue", "--json").stdout) == []


def test_a_chain_advances_with_only_its_last_run_looked_at(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Embedded, nothing moves unless looked at: looking at the last run of a chain looks at
    every run upstream of it, oldest first, so the whole chain advances."""
    flag, wait = gate(tmp_path, "go")
    chain = [submit(env, tmp_path, "step0", wait)]
    for step in range(1, 4):
        chain.append(submit(env, tmp_path, f"step{step}", f"echo {step}", "--after", chain[-1]))
    assert [orbit_json(env, "status", r)["state"] for r in chain[1:]] == ["prepared"] * 3
    flag.touch()
    assert ended(env, chain[-1])["state"] == "succeeded"
    assert [orbit(env, "logs", r).stdout for r in chain[1:]] == ["1\n", "2\n", "3\n"]
