"""Policies through a real `orbit server` on both stores, with the CLI as its users use it: an
admin applies a file (after its diff, never without --yes off a terminal), a member checks one
but may not apply or replay it, a member's submission is refused in one line naming the rule,
a warning is printed and the version recorded on the run, anyone signed in reads the policy in
force, and `policy diff --max-denied` gates a change with its exit status."""

from __future__ import annotations

import json
from pathlib import Path

from tests.core.control.test_policies import LOOSE, POLICY
from tests.helpers import orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_console import token_for


def one_line(proc: object) -> str:
    stderr = getattr(proc, "stderr", "").strip()
    assert getattr(proc, "returncode", 0) != 0 and len(stderr.splitlines()) == 1, stderr
    return str(stderr)


def test_policies_through_a_server_with_their_roles(orbit_server: Server, tmp_path: Path) -> None:
    admin = orbit_server.env()
    mia = orbit_server.env(token_for(orbit_server, "mia", "member"))
    vic = orbit_server.env(token_for(orbit_server, "vic", "viewer"))
    site, loose = tmp_path / "site.yaml", tmp_path / "loose.yaml"
    site.write_text(POLICY)
    loose.write_text(LOOSE)
    assert "tests: 2 of 2 passed" in orbit(mia, "policy", "check", str(site)).stdout
    refused = orbit(mia, "policy", "apply", str(site), "--yes", check=False)
    assert refused.returncode == 2 and "permission policy.write" in one_line(refused)
    assert orbit(mia, "policy", "diff", str(site), check=False).returncode == 2
    asked = orbit(admin, "policy", "apply", str(site), check=False)  # no terminal to ask on
    assert asked.returncode == 2 and "--yes" in asked.stderr
    assert orbit_json(admin, "policy", "history") == []
    made = orbit_json(admin, "policy", "apply", str(site), "--yes")
    assert made["version"] == 1 and made["rules"] == 5

    def submit(*sets: str) -> object:
        spec = write_spec(tmp_path, template="pool", task={"command": "true"})
        return orbit(mia, "submit", str(spec), "--queue-anyway", "--json", *sets, check=False)

    denied = submit("--set", "priority=batch", "--set", "resources.gpu_count=4")
    assert one_line(denied) == (
        "orbit: error: policy rule 'batch-takes-two': batch runs take at most 2 GPUs (asked 4)"
    )
    assert denied.returncode == 2  # type: ignore[attr-defined]
    assert orbit_json(admin, "runs", "list") == []  # nothing written
    warned = submit("--set", "resources.cpu_count=2")
    assert warned.returncode == 0, warned.stderr  # type: ignore[attr-defined]
    assert "policy warning: many-cpus: mia asks 2 CPUs" in warned.stderr  # type: ignore[attr-defined]
    run = json.loads(warned.stdout)  # type: ignore[attr-defined]
    shown = orbit_json(mia, "runs", "show", run["id"])
    assert shown["policy"]["version"] == 1
    assert shown["policy"]["defaults"] == {"max_runtime_s": 259200}
    assert shown["request"]["max_runtime_s"] == 259200
    assert "version 1" in orbit(mia, "runs", "show", run["id"]).stdout
    with orbit_server.client(mia["ORBIT_TOKEN"]) as http:  # and the console's run page
        page = http.get(f"/ui/runs/{run['id']}").text
    assert "admitted under policy version 1" in page
    assert "policy warning: many-cpus: mia asks 2 CPUs" in page
    # anyone signed in reads the policy in force
    assert "  - name: batch-takes-two\n" in orbit(vic, "policy", "show").stdout
    assert [v["version"] for v in orbit_json(vic, "policy", "history")] == [1]
    # a change gated by what it would do to the submissions so far
    stricter = tmp_path / "stricter.yaml"
    stricter.write_text(LOOSE.replace("cpu_count > 1", "cpu_count > 1").replace(
        "    warn: 'request.resources.cpu_count > 1'", "    deny: 'request.resources.cpu_count > 1'"
    ))  # fmt: skip
    report = orbit_json(admin, "policy", "diff", str(stricter))
    assert report["submissions"] == 1 and report["newly_denied"] == 1
    assert {c["rule"]: c["users"] for c in report["changes"]}["many-cpus"] == {"mia": 1}
    gate = orbit(admin, "policy", "diff", str(stricter), "--max-denied", "0", check=False)
    assert gate.returncode == 1 and "over --max-denied 0" in gate.stderr
    assert orbit(admin, "policy", "diff", str(stricter), "--max-denied", "1").returncode == 0
    out = tmp_path / "review.json"
    orbit(admin, "policy", "review", "1", "--out", str(out))
    review = json.loads(out.read_text())
    assert review["version"]["body"] == POLICY and review["check"]["rules"] == 5
    assert orbit(mia, "policy", "review", "1", check=False).returncode == 2  # admins only
    bad = orbit(admin, "policy", "apply", str(tmp_path / "nope.yaml"), "--yes", check=False)
    assert bad.returncode == 2 and "nope.yaml" in one_line(bad)
