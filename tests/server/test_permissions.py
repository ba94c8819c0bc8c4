"""Permissions on a real server: every operation of the OpenAPI document names the one
permission it checks, and each built-in role is let in or refused exactly as this file's own
table says (a walk of the whole document, asking each operation as each role); a site's own
role from the server config; a restricted experiment that a non-member cannot see through the
CLI, the API, the Python client or the console."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.client.remote import RemoteControl
from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import NotFound
from orbit.model.permissions import BUILT_IN, Roles
from tests.helpers import orbit, orbit_json, write_spec
from tests.orbit_server import Server

# the least built-in role each operation lets in (viewer < member < admin); `open` needs no
# token, `agent` a node's credential. Written out by hand: it is what the roles always allowed
VIEWER = """
    runs_list runs_get runs_view runs_refresh runs_explain runs_diff queue_list
    experiments_list experiments_get templates_list templates_get runs_logs runs_log_start
    runs_inspect runs_collect runs_download_artifacts storage_of_run storage_usage hosts_list
    hosts_get clusters_list clusters_get nodes_list nodes_get quotas_list sched_config_get
    sched_simulate users_whoami users_console_link users_roles tokens_list tokens_create
    tokens_revoke secrets_list policy_show policy_history policy_version policy_check
    alerts_list alerts_rules audit_list audit_verify server_metrics groups_list groups_get
    groups_view
"""
MEMBER = """
    runs_submit runs_plan runs_replay experiments_create runs_cancel runs_cancel_many
    runs_stop_leftovers runs_retry runs_retry_many storage_pin storage_unpin
    storage_delete_runs secrets_set secrets_remove groups_submit
"""
ADMIN = """
    experiments_set storage_gc hosts_add hosts_remove hosts_check clusters_add
    clusters_remove clusters_check nodes_set nodes_remove nodes_revoke nodes_pull nodes_push
    join_tokens_list join_tokens_create join_tokens_revoke quotas_set quotas_remove
    sched_config_put users_list users_add users_set users_remove secrets_rotate_key
    policy_diff policy_review policy_apply alerts_acknowledge alerts_silence
"""
LEAST = {
    **dict.fromkeys(VIEWER.split(), "viewer"),
    **dict.fromkeys(MEMBER.split(), "member"),
    **dict.fromkeys(ADMIN.split(), "admin"),
    "server_health": "open",
}
RANK = {"viewer": 0, "member": 1, "admin": 2}


def token_for(server: Server, user: str, role: str) -> str:
    admin = server.env()
    orbit(admin, "users", "add", user, "--role", role)
    return str(orbit_json(admin, "tokens", "create", "--user", user)["token"])


def filled(path: str) -> str:
    """The path with each parameter a value that names nothing: a route that lets the caller
    in answers 404 or 422, never 403."""
    return re.sub(r"\{[^}]+\}", lambda m: "7" if "id" in m.group(0) else "nothing-here", path)


def least_holder(permission: str) -> str:
    roles = Roles()
    return min((r for r in BUILT_IN if roles.grants(r, permission)), key=RANK.__getitem__)


def test_every_operation_checks_one_permission_and_each_built_in_role_is_let_in_as_before(
    orbit_server: Server,
) -> None:
    tokens = {
        "admin": orbit_server.admin_token,
        "member": token_for(orbit_server, "mia", "member"),
        "viewer": token_for(orbit_server, "vic", "viewer"),
    }
    headers = {role: {"Authorization": f"Bearer {t}"} for role, t in tokens.items()}
    doc = httpx.get(f"{orbit_server.url}/openapi.json", headers=headers["viewer"]).json()
    seen: set[str] = set()
    with httpx.Client(base_url=orbit_server.url, timeout=30) as http:
        for path, item in doc["paths"].items():
            for method, operation in item.items():
                op, permission = operation["operationId"], operation.get("x-permission")
                assert permission, f"{op}: no permission"
                seen.add(op)
                if permission == "agent":
                    assert op.startswith("agent_")
                    if op != "agent_register":  # a node's credential, never a user's token
                        answer = http.request(method, filled(path), headers=headers["admin"])
                        assert answer.status_code == 401, (op, answer.text)
                    continue
                least = LEAST[op]
                if permission == "open":
                    assert least == "open", op
                    continue
                assert least_holder(permission) == least, (op, permission)
                for role, auth in headers.items():
                    body = {} if method in ("post", "put", "patch") else None
                    answer = http.request(method, filled(path), headers=auth, json=body)
                    refused = answer.status_code == 403
                    assert refused is (RANK[role] < RANK[least]), (op, role, answer.text)
                    if refused:
                        assert f"that needs the permission {permission}" in answer.text, op
    assert seen >= set(LEAST), sorted(set(LEAST) - seen)


def test_a_site_role_holds_what_the_config_gives_it(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    config = tmp_path / "server.yaml"
    operator = {"base": "viewer", "permissions": ["runs.cancel.any", "nodes.manage"]}
    config.write_text(json.dumps({"roles": {"operator": operator}}), encoding="utf-8")
    server = start_server("--config", str(config))
    admin = server.env()
    ops = server.env(token_for(server, "otto", "operator"))
    spec = write_spec(tmp_path, task={"command": "sleep 60"})
    run = orbit_json(admin, "submit", str(spec))["id"]

    roles = {r["name"]: r for r in orbit_json(ops, "users", "roles")}
    assert (
        "runs.cancel.any" in roles["operator"]["permissions"] and not roles["operator"]["built_in"]
    )
    # the operator stops anyone's run...
    assert orbit(ops, "cancel", run).returncode == 0
    # ...and may not change quotas, the policy or users
    refused = orbit(ops, "quotas", "set", "user", "mia", "--gpus", "2", check=False)
    assert refused.returncode == 2
    assert refused.stderr == (
        "orbit: error: otto (operator) may not set quotas and the scheduler's settings: "
        "that needs the permission quotas.write\n"
    )
    refused = orbit(ops, "users", "add", "eve", check=False)
    assert "that needs the permission users.manage" in refused.stderr
    # an unknown role is refused in one line, naming the roles there are
    refused = orbit(admin, "users", "add", "eve", "--role", "intern", check=False)
    assert refused.returncode == 2
    assert refused.stderr == (
        "orbit: error: role: unknown role 'intern' (one of admin, member, viewer, operator; "
        "a site's own are the server setting `roles`)\n"
    )
    # a role changed applies at the next request, and is audited
    orbit(admin, "users", "set-role", "otto", "viewer")
    refused = orbit(ops, "cancel", run, check=False)
    assert "that needs the permission runs.cancel.own" in refused.stderr
    changed = [e for e in orbit_json(admin, "audit") if e["action"] == "user.role"]
    assert changed and changed[-1]["data"] == {"user": "otto", "role": "viewer", "was": "operator"}

    # the export for a review: the policy as applied, the permission changes, the roles
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules:\n  - name: huge\n    warn: 'request.resources.gpu_count > 64'\n"
        "    message: 'that is a lot of GPUs'\n    mode: warn\n",
        encoding="utf-8",
    )
    orbit(admin, "policy", "apply", str(policy), "--yes")
    export = json.loads(orbit(admin, "audit", "export", "--compliance").stdout)
    assert [v["body"] for v in export["policy_versions"]] == [policy.read_text()]
    changes = [(e["action"], e["data"]["user"]) for e in export["permission_changes"]]
    assert ("user.add", "otto") in changes and ("user.role", "otto") in changes
    assert {r["name"] for r in export["roles"]} == {"admin", "member", "viewer", "operator"}
    assert {u["name"]: u["role"] for u in export["users"]}["otto"] == "viewer"
    assert len(export["events"]) == len(orbit_json(admin, "audit", "--limit", "100000"))
    refused = orbit(ops, "audit", "export", "--compliance", check=False)
    assert "that needs the permission users.manage" in refused.stderr


@pytest.fixture
def restricted(orbit_server: Server, tmp_path: Path) -> dict[str, object]:
    """An experiment `secret-x` restricted to mia, with one run of hers; ann is a member who
    is not one of its members; an open experiment's run beside it."""
    admin = orbit_server.env()
    mia = orbit_server.env(token_for(orbit_server, "mia", "member"))
    ann = orbit_server.env(token_for(orbit_server, "ann", "member"))
    orbit(admin, "experiments", "create", "secret-x")
    shown = orbit_json(admin, "experiments", "restrict", "secret-x", "--member", "mia")
    assert shown["restricted"] and shown["members"] == ["mia"]
    spec = write_spec(tmp_path, experiment="secret-x", task={"command": "echo hush"})
    hidden = orbit_json(admin, "submit", str(spec))["id"]
    spec = write_spec(tmp_path, experiment="open-y", task={"command": "echo hello"})
    seen = orbit_json(admin, "submit", str(spec))["id"]
    return {"admin": admin, "mia": mia, "ann": ann, "hidden": hidden, "seen": seen}


def test_a_restricted_experiment_is_invisible_to_a_non_member_everywhere(
    orbit_server: Server, restricted: dict[str, object], tmp_path: Path
) -> None:
    hidden, seen = str(restricted["hidden"]), str(restricted["seen"])
    ann, mia, admin = restricted["ann"], restricted["mia"], restricted["admin"]
    assert isinstance(ann, dict) and isinstance(mia, dict) and isinstance(admin, dict)

    # the CLI: not listed, not shown, no logs, not cancelled, no experiment
    ids = {r["id"] for r in orbit_json(ann, "runs", "list")}
    assert seen in ids and hidden not in ids
    for args in (["runs", "show", hidden], ["logs", hidden], ["cancel", hidden]):
        refused = orbit(ann, *args, check=False)
        assert refused.returncode != 0
        assert f"unknown run '{hidden}'" in refused.stderr, (args, refused.stderr)
    assert "secret-x" not in {e["name"] for e in orbit_json(ann, "experiments", "list")}
    refused = orbit(ann, "experiments", "show", "secret-x", check=False)
    assert "unknown experiment 'secret-x'" in refused.stderr
    # submitting into it is refused, naming why
    spec = write_spec(tmp_path, experiment="secret-x", task={"command": "true"})
    refused = orbit(ann, "submit", str(spec), check=False)
    assert refused.returncode == 2
    assert "experiment: 'secret-x' is restricted to its members" in refused.stderr
    # its members and admins see it
    assert hidden in {r["id"] for r in orbit_json(mia, "runs", "list")}
    assert hidden in {r["id"] for r in orbit_json(admin, "runs", "list")}
    assert orbit_json(mia, "runs", "show", hidden)["id"] == hidden

    # the API: 404 as for a run that is not there, on every route of a run
    auth = {"Authorization": f"Bearer {ann['ORBIT_TOKEN']}"}
    for path in ("", "/view", "/logs/training", "/explain", "/artifacts", "/storage"):
        answer = httpx.get(f"{orbit_server.url}/api/v1/runs/{hidden}{path}", headers=auth)
        assert answer.status_code == 404, (path, answer.text)
    answer = httpx.get(f"{orbit_server.url}/api/v1/diff?a={seen}&b={hidden}", headers=auth)
    assert answer.status_code == 404
    queue = httpx.get(f"{orbit_server.url}/api/v1/queue", headers=auth).json()
    assert hidden not in {e["run"] for e in queue}
    bulk = httpx.post(
        f"{orbit_server.url}/api/v1/runs/cancel", headers=auth, json={"ids": [hidden]}
    )
    assert bulk.status_code == 404 and hidden in bulk.json()["detail"]
    trail = httpx.get(f"{orbit_server.url}/api/v1/audit", headers=auth).json()
    assert {e["run_id"] for e in trail} >= {seen} and hidden not in {e["run_id"] for e in trail}
    of_run = httpx.get(f"{orbit_server.url}/api/v1/audit", headers=auth, params={"run": hidden})
    assert of_run.status_code == 404

    # the Python client
    client = RemoteControl(orbit_server.url, str(ann["ORBIT_TOKEN"]))
    with pytest.raises(NotFound):
        client.get_run(hidden)
    assert hidden not in {v.run.id for v in client.run_page(limit=100).runs}

    # the console
    with httpx.Client(base_url=orbit_server.url, headers=auth) as console:
        missing = console.get(f"/ui/runs/{hidden}")
        assert missing.status_code == 404 and missing.headers["content-type"].startswith(
            "text/html"
        )
        assert f"unknown run &#39;{hidden}&#39;" in missing.text and "ann · member" in missing.text
        assert console.get(f"/ui/runs/{hidden}/artifacts").status_code == 404
        page = console.get("/ui/runs").text
        assert seen in page and hidden not in page
        assert (
            hidden
            in httpx.get(
                f"{orbit_server.url}/ui/runs",
                headers={"Authorization": f"Bearer {mia['ORBIT_TOKEN']}"},
            ).text
        )

    # opened again, everyone who reads runs sees it; each change is in the audit
    orbit(admin, "experiments", "unrestrict", "secret-x")
    assert hidden in {r["id"] for r in orbit_json(ann, "runs", "list")}
    kinds = [e["action"] for e in orbit_json(admin, "audit")]
    for kind in ("experiment.restricted", "experiment.member_added", "experiment.opened"):
        assert kind in kinds


def test_only_who_manages_experiments_restricts_one(restricted: dict[str, object]) -> None:
    mia = restricted["mia"]
    assert isinstance(mia, dict)
    refused = orbit(mia, "experiments", "members", "secret-x", "--add", "ann", check=False)
    assert refused.returncode == 2
    assert refused.stderr == (
        "orbit: error: mia (member) may not restrict experiments, name their members and see "
        "every run: that needs the permission experiments.manage\n"
    )
    # naming a user who does not exist is refused, and nothing changes
    admin = restricted["admin"]
    assert isinstance(admin, dict)
    refused = orbit(admin, "experiments", "members", "secret-x", "--add", "nobody", check=False)
    assert refused.returncode != 0 and "nobody" in refused.stderr
    shown = orbit_json(admin, "experiments", "members", "secret-x")
    assert shown["members"] == ["mia"]


def test_every_route_of_the_app_has_its_permission_in_a_table(
    service: CoreControlService, settings: Settings
) -> None:
    """The gates refuse a route no table names to everyone; this says which one that is
    before a user meets it: each API route by its operation id, each console route by its
    name (unique among them), and no table entry names a route that is not there."""
    from fastapi.routing import APIRoute

    from orbit.server.app import create_app
    from orbit.server.config import ServerConfig
    from orbit.server.openapi import operation_id
    from orbit.server.permissions import API, CONSOLE

    def flat(routes: list[Any]) -> list[APIRoute]:  # an included router's routes, its own
        found: list[APIRoute] = []
        for route in routes:
            inner = getattr(route, "original_router", None)
            found += flat(inner.routes) if inner is not None else [route]
        return [r for r in found if isinstance(r, APIRoute)]

    app = create_app(service, ServerConfig(loops=False), settings)
    routes = flat(list(app.router.routes))
    pages = [r for r in routes if r.path == "/ui" or r.path.startswith("/ui/")]
    console = [r.name for r in pages]
    api = [operation_id(r) for r in routes if r not in pages]
    assert len(console) == len(set(console)), "console routes' names must be unique"
    assert set(console) == set(CONSOLE), set(console) ^ set(CONSOLE)
    assert set(api) == set(API), set(api) ^ set(API)
