"""`orbit cancel` and `orbit retry` of many runs, by ids and by filter, through the real CLI,
embedded and against a real `orbit server`, on SQLite and PostgreSQL: a report of what became of
each run and a count; a dry run that does nothing; a filter that would act on several runs asks
first (here, without a terminal: refused unless --yes); a filter that matches nothing says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cli.test_cli import env, orbit, orbit_json, store_of
from tests.helpers import eventually, write_spec

__all__ = ["env"]  # the fixture: every test runs embedded and against a server


def submit(env: dict[str, str], folder: Path, experiment: str, command: str) -> str:
    spec = write_spec(
        folder, f"{experiment}.yaml", experiment=experiment, task={"command": command}
    )
    return str(orbit_json(env, "submit", str(spec))["id"])


def states(env: dict[str, str], *runs: str) -> list[str]:
    return [orbit_json(env, "status", run)["state"] for run in runs]


def by_run(result: dict[str, Any]) -> dict[str, str]:
    return {item["run"]: item["outcome"] for item in result["items"]}


def test_cancel_and_retry_many_by_ids_and_by_filter(env: dict[str, str], tmp_path: Path) -> None:
    forever = f"while [ ! -e {tmp_path / 'never'} ]; do sleep 0.1; done"
    sweep = [submit(env, tmp_path, "sweep", forever) for _ in range(3)]
    other = submit(env, tmp_path, "other", forever)
    eventually(lambda: set(states(env, *sweep, other)) == {"running"}, timeout=60, every=0.3)

    # a filter that would cancel several runs asks first: without a terminal, --yes is needed
    asked = orbit(env, "cancel", "--experiment", "sweep", check=False)
    assert asked.returncode == 2 and asked.stdout == ""
    assert asked.stderr == (
        "orbit: error: the filter (experiment 'sweep') would cancel 3 runs: add --yes to do "
        "it (--dry-run lists them)\n"
    )
    dry = orbit_json(env, "cancel", "--experiment", "sweep", "--dry-run")
    assert dry["dry_run"] is True and dry["counts"] == {"would_cancel": 3}
    assert [i["run"] for i in dry["items"]] == sweep[::-1]  # newest first
    listed = orbit(env, "cancel", "-e", "sweep", "--state", "running", "--dry-run").stdout
    assert listed.splitlines()[0].split() == ["RUN", "USER", "STATE", "ATTEMPT", "OUTCOME", "NOTE"]
    assert listed.splitlines()[-1] == "dry run, nothing done: 3 would cancel"
    assert set(states(env, *sweep, other)) == {"running"}  # nothing was done

    done = orbit_json(env, "cancel", "--experiment", "sweep", "--yes")
    assert done["counts"] == {"cancelled": 3} and set(by_run(done)) == set(sweep)
    eventually(lambda: set(states(env, *sweep)) == {"terminated"}, timeout=30, every=0.3)
    assert states(env, other) == ["running"]  # not of the filter: untouched

    # by ids: each reported, already ended ones too, and counted
    mixed = orbit(env, "cancel", other, sweep[0][:10])
    assert mixed.returncode == 0
    lines = mixed.stdout.splitlines()
    assert lines[-1] == "cancel: 1 cancelled, 1 already ended"
    assert any(other in line and "cancelled" in line for line in lines)
    assert any(sweep[0] in line and "already ended" in line for line in lines)

    # retry by filter: a new attempt of each ended run, oldest first
    retried = orbit_json(env, "retry", "--experiment", "sweep", "--state", "terminated", "--yes")
    assert retried["counts"] == {"retried": 3}
    assert [i["run"] for i in retried["items"]] == sweep and {
        i["attempt"] for i in retried["items"]
    } == {2}
    again = orbit_json(env, "retry", sweep[0], sweep[1])
    assert again["counts"] == {"not_ended": 2}
    assert {i["message"] for i in again["items"]} == {"cancel it first"}
    assert orbit(env, "retry", sweep[0], sweep[1], "--set", "target=x", check=False).returncode == 2

    # a filter that matches nothing says so, and does nothing
    none = orbit(env, "cancel", "--experiment", "sweep", "--state", "failed", "--yes")
    assert none.stdout == "no runs match experiment 'sweep', state failed: nothing to cancel\n"
    # mistakes: one line, exit 2, nothing done
    for args, says in (
        (["cancel"], "give a run id, several, or a filter"),
        (["cancel", sweep[0], "--experiment", "sweep"], "give run ids or a filter"),
        (["cancel", sweep[0], "run-00000000ff"], "unknown run 'run-00000000ff'"),
        (["cancel", "--experiment", "ghost", "--yes"], "unknown experiment 'ghost'"),
        (["retry", "--state", "sleeping"], "--state: unknown state 'sleeping'"),
    ):
        proc = orbit(env, *args, check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr
    assert set(states(env, *sweep)) <= {"submitted", "starting", "running"}

    assert orbit_json(env, "cancel", *sweep, other)["counts"] == {
        "cancelled": 3,
        "already_ended": 1,
    }
    store = store_of(env)
    try:
        bulk = [e for e in store.audit.list_events() if e.action.startswith("runs.")]
    finally:
        store.close()
    assert [(e.action, e.data["counts"]) for e in bulk] == [
        ("runs.cancel", {"cancelled": 3}),
        ("runs.cancel", {"cancelled": 1, "already_ended": 1}),
        ("runs.retry", {"retried": 3}),
        ("runs.retry", {"not_ended": 2}),
        ("runs.cancel", {"cancelled": 3, "already_ended": 1}),
    ]
