"""Bulk cancel and retry as a team meets them on a real `orbit server` (SQLite and PostgreSQL):
a member acts on its own runs only, the others are reported refused (never skipped in silence)
and the exit code says so; a viewer controls nothing; one API call does it all (ids or a
filter), and so does `orbit.Client`; the audit names who did it."""

from __future__ import annotations

import json
from pathlib import Path

from orbit import Client
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_server import token_for


def running(env: dict[str, str], runs: list[str]) -> bool:
    return all(orbit_json(env, "status", r)["state"] == "running" for r in runs)


def test_a_member_acts_on_its_own_runs_and_the_others_are_refused(
    members_here: Server, tmp_path: Path
) -> None:
    orbit_server = members_here  # members run `local` too: the runs here are sleeps on it
    admin = orbit_server.env()
    mia_token = token_for(orbit_server, "mia", "member")
    mia = orbit_server.env(mia_token)
    vic = orbit_server.env(token_for(orbit_server, "vic", "viewer"))
    spec = write_spec(tmp_path, task={"command": "sleep 120"})
    mine = [orbit_json(mia, "submit", str(spec))["id"] for _ in range(2)]
    theirs = [orbit_json(admin, "submit", str(spec))["id"] for _ in range(2)]
    eventually(lambda: running(admin, mine + theirs), timeout=60, every=0.3)

    # by filter: mia's own are cancelled, the admin's are reported refused, exit 1
    proc = orbit(mia, "cancel", "--experiment", "exp", "--yes", "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["counts"] == {"cancelled": 2, "refused": 2}
    outcomes = {i["run"]: (i["outcome"], i["user"], i["message"]) for i in result["items"]}
    for run in mine:
        assert outcomes[run][:2] == ("cancelled", "mia")
    for run in theirs:
        refused = (
            "refused",
            "admin",
            "admin's run: mia (member) may not cancel anyone's runs: that needs the permission "
            "runs.cancel.any",
        )
        assert outcomes[run] == refused
    eventually(lambda: {orbit_json(admin, "status", r)["state"] for r in mine} == {"terminated"})
    assert running(admin, theirs)

    # by ids, in words: each refused run named, with why
    said = orbit(mia, "cancel", *theirs, check=False)
    assert said.returncode == 1
    for run in theirs:
        (line,) = [line for line in said.stdout.splitlines() if run in line]
        assert "refused" in line and "admin's run" in line
    assert said.stdout.splitlines()[-1] == "cancel: 2 refused"

    # retry: the filter --user picks mia's runs; hers are retried
    again = orbit_json(mia, "retry", "--user", "mia", "--state", "terminated", "--yes")
    assert again["counts"] == {"retried": 2}
    # a viewer controls nothing: one line, exit 2, nothing done
    denied = orbit(vic, "cancel", "--user", "mia", "--yes", check=False)
    assert denied.returncode == 2
    assert denied.stderr == (
        "orbit: error: vic (viewer) may not cancel their own runs: that needs the permission "
        "runs.cancel.own\n"
    )

    # the API: one call, ids or a filter; a bad selection is one problem naming it
    with orbit_server.client(mia_token) as http:
        answer = http.post("/api/v1/runs/cancel", json={"user": "mia", "dry_run": True})
        assert answer.status_code == 200 and answer.json()["items"][0]["outcome"] == "would_cancel"
        both = http.post("/api/v1/runs/cancel", json={"ids": [mine[0]], "user": "mia"})
        assert both.status_code == 422
        assert (
            both.json()["detail"]
            == "give run ids or a filter (experiment, group, state, user), not both"
        )
        assert http.post("/api/v1/runs/cancel", json={}).status_code == 422
        answer = http.post("/api/v1/runs/cancel", json={"ids": mine + theirs[:1]})
        assert answer.status_code == 200
        assert {i["run"]: i["outcome"] for i in answer.json()["items"]} == {
            mine[0]: "cancelled",
            mine[1]: "cancelled",
            theirs[0]: "refused",
        }

    # orbit.Client: the admin may do anything
    eventually(lambda: {orbit_json(admin, "status", r)["state"] for r in mine} == {"terminated"})
    with Client(orbit_server.url, orbit_server.admin_token) as client:
        done = client.cancel_runs(experiment="exp", state=["submitted", "starting", "running"])
    assert {i.run for i in done.items} == set(theirs) and done.counts() == {"cancelled": 2}

    bulk = [e for e in orbit_json(admin, "audit") if e["action"].startswith("runs.")]
    assert [(e["actor"], e["action"], e["data"]["counts"]) for e in bulk] == [
        ("mia", "runs.cancel", {"cancelled": 2, "refused": 2}),
        ("mia", "runs.cancel", {"refused": 2}),
        ("mia", "runs.retry", {"retried": 2}),
        ("mia", "runs.cancel", {"cancelled": 2, "refused": 1}),
        ("admin", "runs.cancel", {"cancelled": 2}),
    ]
    cancels = [e for e in orbit_json(admin, "audit", "--run", mine[0]) if "cancel" in e["action"]]
    assert cancels and {e["actor"] for e in cancels} == {"mia"}
