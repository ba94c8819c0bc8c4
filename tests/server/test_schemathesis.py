"""Property-based tests of the API from its own /openapi.json (schemathesis 4): a real `orbit
server`, requests generated from the document it serves (valid ones and deliberately invalid
ones, its examples and coverage cases, then fuzzing), and for each answer: no 5xx, a status code
the document names, its content type, and a body its schema accepts. As an admin over every
operation; as an admin over the operations on a run, on a real run; and with no token (401).

What generated requests may do is fenced in. The server starts with `--no-loops` and
ORBIT_FAILPOINTS=launch=skip, so that a submission that happens to be valid is recorded but
never launched: no process starts and nothing is staged anywhere. No operation that contacts a
host named in the request is fuzzed (HOST_CONTACT). And the store is SQLite only: this is
about the API; what differs between stores (NUL bytes, non-finite numbers) is checked in
test_bad_input.py, on both."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orbit import Client
from tests.orbit_server import Server, free_port

PROBLEM = "application/problem+json"
# Operations that reach out to the host a request names (ssh to its `ssh`, `port`,
# `proxy_jump`): never fuzzed, so that the server sends nothing beyond loopback. Each is
# called once instead, with a host on 127.0.0.1 (test_host_operations_on_loopback).
HOST_CONTACT = ["POST /api/v1/hosts", "POST /api/v1/hosts/{name}/check"]
# Operations that need no token: left out of the run without one
OPEN = ["GET /healthz", "GET /metrics", "POST /api/v1/agent/register"]  # register: a join token
SCHEMA_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
CHECKS = [not_a_server_error, *SCHEMA_CHECKS]
EXAMPLES = 6  # fuzzed cases per operation, besides the examples and coverage phases
# examples from the document, then coverage (each parameter's edges and wrong types, one at a
# time), then fuzzing; no stateful sequences, and no methods the document does not name
PHASES = {"coverage": {"unexpected-methods": []}, "stateful": {"enabled": False}}
QUICK = settings(
    deadline=None,  # a request to a real process takes what it takes
    database=None,  # no .hypothesis folder
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True)
def _pytest9_nodeid(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32's from_fixture renames the running test through `node._nodeid`,
    which pytest 9.2 no longer has (it keeps the node's id in `_id`, read through `nodeid`):
    give it the attribute it reads. Harmless once either side changes."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only (see the module's docstring)."""
    return f"sqlite:///{tmp_path / 'orbit.db'}"


@pytest.fixture
def fenced(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """A server whose runs are never launched and whose loops never run; whose ssh reads an
    empty config (no alias or ProxyJump of this machine's sends it elsewhere); and whose
    docker CLI, which checking a submission to a docker template asks, finds no daemon. The
    fuzzing shows a user's token to every agent route, where it is a failed node credential
    each time: the limit on failed authentications is set out of its way."""
    (tmp_path / "ssh_config").write_text("")
    config = tmp_path / "server.yaml"
    config.write_text('{"auth_failures": {"burst": 1000000}}', encoding="utf-8")
    env = {
        "ORBIT_FAILPOINTS": "launch=skip",
        "ORBIT_SSH_CONFIG": str(tmp_path / "ssh_config"),
        "DOCKER_HOST": f"unix://{tmp_path / 'no-docker.sock'}",
    }
    return start_server("--no-loops", "--config", str(config), env=env)


@pytest.fixture
def fuzz_token(fenced: Server) -> Iterator[str]:
    """An admin's token for the run. Its user has a name no generated request will guess, so
    that deleting users and revoking tokens (both fuzzed) cannot take it away midway; that
    it was not is checked at the end, so that no part of the run went unauthenticated."""
    name = f"fuzz-{uuid.uuid4().hex}"
    with fenced.client() as http:
        assert http.post("/api/v1/users", json={"name": name, "role": "admin"}).status_code == 201
        answer = http.post("/api/v1/tokens", json={"user": name, "name": "schemathesis"})
        assert answer.status_code == 201, answer.text
    token = str(answer.json()["token"])
    yield token
    with fenced.client(token) as http:
        assert http.get("/api/v1/whoami").json()["name"] == name


@pytest.fixture
def run_id(fenced: Server, tmp_path: Path) -> str:
    """A run (prepared, never launched), so that the operations on one get past its 404."""
    spec = {"experiment": "fuzz", "task_type": "command", "template": "local"}
    with Client(fenced.url, fenced.admin_token) as client:
        return client.submit({**spec, "task": {"command": "true"}}, base_dir=tmp_path).id


def _schema(server: Server, token: str | None, **project: Any) -> schemathesis.BaseSchema:
    """The document as the server serves it (read with the admin's token: it needs one too),
    with a config of its own (no schemathesis.toml found on the way up is read); the calls
    carry `token`, or none."""
    config: dict[str, Any] = {
        "generation": {"max-examples": EXAMPLES, "database": "none"},
        "phases": PHASES,
        **project,
    }
    if token is not None:
        config["headers"] = {"Authorization": f"Bearer {token}"}
    return schemathesis.openapi.from_url(
        f"{server.url}/openapi.json",
        config=schemathesis.Config.from_dict(config),
        headers={"Authorization": f"Bearer {server.admin_token}"},
    )


@pytest.fixture
def as_admin(fenced: Server, fuzz_token: str) -> schemathesis.BaseSchema:
    return _schema(fenced, fuzz_token)


@pytest.fixture
def on_a_run(fenced: Server, fuzz_token: str, run_id: str) -> schemathesis.BaseSchema:
    """`ref` always that run's id, everything else generated but `follow`: a followed log
    stays open (30 s) while its attempt runs, and here no attempt ever ends."""
    return _schema(fenced, fuzz_token, parameters={"ref": run_id, "query.follow": "false"})


@pytest.fixture
def anonymous(fenced: Server) -> schemathesis.BaseSchema:
    """Valid and invalid requests alike: the token is looked at before any body is read."""
    return _schema(
        fenced,
        None,
        generation={"max-examples": 3, "database": "none"},
        phases={"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    )


ON_A_RUN = r"^/api/v1/runs/\{ref\}"  # fuzzed on a real run only: on a made-up `ref` all 404
admin_schema = (
    schemathesis.pytest.from_fixture("as_admin")
    .exclude(name=HOST_CONTACT)
    .exclude(path_regex=ON_A_RUN)
)
run_schema = schemathesis.pytest.from_fixture("on_a_run").include(path_regex=ON_A_RUN)
anonymous_schema = schemathesis.pytest.from_fixture("anonymous").exclude(
    name=[*HOST_CONTACT, *OPEN]
)


@QUICK
@admin_schema.parametrize()
def test_every_operation_as_admin(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)


@QUICK
@run_schema.parametrize()
def test_the_operations_on_a_run(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)


@QUICK
@anonymous_schema.parametrize()
def test_every_operation_without_a_token(case: schemathesis.Case) -> None:
    response = case.call_and_validate(checks=CHECKS)
    assert response.status_code == 401, response.text
    assert response.headers["content-type"] == [PROBLEM]
    assert response.headers["www-authenticate"] == ["Bearer"]
    assert response.json()["error"] == "Unauthorized"


def test_host_operations_on_loopback(fenced: Server, fuzz_token: str) -> None:
    """The operations kept out of the fuzzing, once each, on a host at 127.0.0.1 at a port
    where nothing listens (free a moment ago): checking it is a 502 (a host that does not
    answer is not the client's mistake), documented and shaped as the document says."""
    schema = _schema(fenced, fuzz_token)
    auth = {"Authorization": f"Bearer {fuzz_token}"}
    spec = {"name": "loopback", "ssh": "nobody@127.0.0.1", "port": free_port()}
    add = schema["/api/v1/hosts"]["POST"]
    check = schema["/api/v1/hosts/{name}/check"]["POST"]
    cases = [
        (add.Case(body={"spec": spec, "check": True}), 502),
        (add.Case(body={"spec": spec, "check": False}), 201),
        (check.Case(path_parameters={"name": "loopback"}), 502),
        (check.Case(path_parameters={"name": "nowhere"}), 404),
    ]
    for case, status in cases:
        answer = case.call_and_validate(headers=auth, checks=SCHEMA_CHECKS)
        assert answer.status_code == status, answer.text
        if status == 502:
            assert "Connection refused" in answer.json()["detail"]
