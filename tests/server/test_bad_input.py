"""A client's mistakes against a real `orbit server`, on SQLite and PostgreSQL: malformed or
oversized bodies and uploads, tars that try to write outside their folder, unknown and
foreign runs, revoked and expired tokens. Each must be a 4xx problem (application/problem+json)
whose `detail` names the field or file, and must leave nothing behind: no run, no audit event,
no bundle, no file outside the server's scratch folder. The CLI says the same in one line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.core.control.submit import gather_inputs
from orbit.core.tasks import TaskRegistry
from orbit.model.spec import SubmitSpec, to_submission
from tests.orbit_server import Server

PROBLEM = "application/problem+json"
LIMITS = {"body_bytes": 2048, "upload_bytes": 65536, "inputs_bytes": 100_000, "inputs_files": 50}


@pytest.fixture
def limited(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """A server with small limits, whose runs are never launched, and whose scratch folders
    (TMPDIR) are under the test's own folder, where what is left in them can be seen."""
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"limits": LIMITS}), encoding="utf-8")  # JSON is YAML
    (tmp_path / "scratch").mkdir()
    (tmp_path / "outside").mkdir()
    env = {"ORBIT_FAILPOINTS": "launch=skip", "TMPDIR": str(tmp_path / "scratch")}
    return start_server("--config", str(config), "--no-loops", env=env)


@pytest.fixture
def http(limited: Server) -> Iterator[httpx.Client]:
    with limited.client() as client:
        yield client


def refused(answer: httpx.Response, status: int, *names: str) -> dict[str, Any]:
    """The answer is a problem with this status whose detail names every one of `names`."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM, answer.headers
    body: dict[str, Any] = answer.json()
    assert body["status"] == status and body["error"], body
    assert "\n" not in body["detail"], body
    for name in names:
        assert name in body["detail"], (name, body)
    return body


class Nothing:
    """What a refused request must not change: runs, the audit trail, experiments, the bundles
    and scratch folders, the folder beside them that a tar may try to write into."""

    def __init__(self, server: Server, tmp_path: Path) -> None:
        self.server, self.tmp_path = server, tmp_path
        self.before = self.state()

    def state(self) -> dict[str, Any]:
        with self.server.client() as http:
            runs = http.get("/api/v1/runs").json()["runs"]
            audit = http.get("/api/v1/audit").json()
            experiments = http.get("/api/v1/experiments").json()
        bundles = self.server.home / "bundles"
        return {
            "runs": [view["run"]["id"] for view in runs],
            "audit": [event["hash"] for event in audit],
            "experiments": [e["id"] for e in experiments],
            "bundles": sorted(p.name for p in bundles.iterdir()) if bundles.exists() else [],
            "home": sorted(p.name for p in self.server.home.iterdir() if p.suffix != ".log"),
            "scratch": sorted(str(p) for p in (self.tmp_path / "scratch").rglob("*")),
            "outside": sorted(str(p) for p in (self.tmp_path / "outside").rglob("*")),
        }

    def changed(self) -> None:
        assert self.state() == self.before


@pytest.fixture
def nothing(limited: Server, tmp_path: Path) -> Callable[[], Nothing]:
    return lambda: Nothing(limited, tmp_path)


# -- JSON bodies ---------------------------------------------------------------------------


def test_a_bad_json_body_is_refused_by_field(
    http: httpx.Client, nothing: Callable[[], Nothing]
) -> None:
    check = nothing()
    for body, status, field, names in [
        (b'{"name": ', 400, "body", ["not valid JSON", "Expecting value"]),
        (b'{"name": "\xff"}', 400, "body", ["not valid JSON", "utf-8"]),
        (b'{"name": "e1", "colour": "red"}', 422, "colour", ["unknown field"]),
        (b'{"name": 5}', 422, "name", ["valid string"]),
        (b"[1, 2]", 422, "(top level)", ["valid dictionary"]),
        (b"{}", 422, "name", ["required"]),
        (b'{"name": "a\\u0000b"}', 422, "name", ["NUL"]),
        (b'{"name": Infinity}', 422, "name", ["finite"]),  # Python's json reads it
    ]:
        answer = http.post(
            "/api/v1/experiments", content=body, headers={"Content-Type": "application/json"}
        )
        assert refused(answer, status, field, *names)["field"] == field, body
    check.changed()


def test_nul_anywhere_a_name_reaches_the_store_is_a_422(
    http: httpx.Client, nothing: Callable[[], Nothing]
) -> None:
    """PostgreSQL cannot hold a NUL in text: without the check these were 503s there."""
    check = nothing()
    for method, path, params, body, field in [
        ("GET", "/api/v1/hosts/a%00b", None, None, "name"),
        ("GET", "/api/v1/audit", {"run": "a\x00b"}, None, "run"),
        ("GET", "/api/v1/runs", {"experiment": "a\x00b"}, None, "experiment"),
        ("DELETE", "/api/v1/tokens/tok%00", None, None, "token_id"),
        ("DELETE", "/api/v1/users/a%00b", None, None, "name"),
        ("POST", "/api/v1/tokens", None, {"name": "a\x00b"}, "name"),
        ("POST", "/api/v1/users", None, {"name": "x", "role": "member", "a\x00": 1}, "a\\x00"),
    ]:
        answer = http.request(method, path, params=params, json=body)
        assert refused(answer, 422, field, "NUL")["field"] == field
    check.changed()


def test_a_json_body_over_the_limit_is_a_413(
    http: httpx.Client, nothing: Callable[[], Nothing]
) -> None:
    check = nothing()
    big = json.dumps({"name": "x" * 4096}).encode()
    answer = http.post(
        "/api/v1/experiments", content=big, headers={"Content-Type": "application/json"}
    )
    refused(answer, 413, "limits.body_bytes", "2,048 bytes")
    chunked = http.post(  # no Content-Length: refused as it goes over
        "/api/v1/experiments",
        content=iter([big[:1000], big[1000:]]),
        headers={"Content-Type": "application/json"},
    )
    assert "content-length" not in chunked.request.headers
    refused(chunked, 413, "limits.body_bytes")
    check.changed()


# -- submissions: the multipart form and its tar ---------------------------------------------


def _gathered(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A valid submission's form fields and its gathered inputs, as the real client makes them
    (orbit.client.remote.RemoteControl._upload)."""
    spec = SubmitSpec.model_validate(
        {
            "experiment": "uploads",
            "task_type": "command",
            "template": "local",
            "task": {"command": "true"},
        }
    )
    submission = to_submission(spec, "spec.yaml", False)
    inputs = tmp_path / "gathered"
    shaped = gather_inputs(TaskRegistry(), submission, tmp_path, "spec.yaml", inputs)
    form = {
        "submission": submission.model_dump_json(exclude_unset=True),
        "shaped": shaped.model_dump_json(),
        "source": "spec.yaml",
    }
    return form, inputs


def _tar(inputs: Path, *extra: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """The gathered inputs as tar.gz, with `extra` members after them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(inputs, arcname=".")
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> Any:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info, data if kind == tarfile.REGTYPE else None


def _submit(http: httpx.Client, form: dict[str, str], archive: bytes) -> httpx.Response:
    files = {"inputs": ("inputs.tar.gz", archive, "application/gzip")}
    return http.post("/api/v1/runs", data=form, files=files)


def test_a_valid_upload_is_taken(limited: Server, http: httpx.Client, tmp_path: Path) -> None:
    """The baseline every refusal below differs from by one thing."""
    form, inputs = _gathered(tmp_path)
    answer = _submit(http, form, _tar(inputs))
    assert answer.status_code == 201, answer.text
    assert (limited.home / "bundles" / answer.json()["bundle_digest"]).is_dir()
    assert list((tmp_path / "scratch").iterdir()) == []  # its scratch folder is gone
    assert list((limited.home / "bundles").glob(".inputs-*")) == []  # where it unpacked them


def test_tricks_in_the_tar_are_refused_by_name(
    http: httpx.Client, nothing: Callable[[], Nothing], tmp_path: Path
) -> None:
    form, inputs = _gathered(tmp_path)
    outside = tmp_path / "outside"
    # scratch/orbit-inputs-XXXX/inputs/ is where the tar unpacks: three levels below tmp_path
    up = "../../.."
    tricks = {
        "absolute": (_member(str(outside / "abs.txt"), data=b"x"), "an absolute path"),
        "dotdot": (_member(f"{up}/outside/up.txt", data=b"x"), "a path outside the inputs"),
        "symlink": (
            _member("workdir/out", tarfile.SYMTYPE, link=f"../{up}/outside"),
            "a link that leads outside the inputs",
        ),
        "absolute-symlink": (
            _member("workdir/etc", tarfile.SYMTYPE, link="/etc"),
            "a link to an absolute path",
        ),
        "hardlink": (
            _member("workdir/hard", tarfile.LNKTYPE, link=f"{up}/outside/target"),
            "a link that leads outside the inputs",
        ),
        "device": (_member("workdir/null", tarfile.CHRTYPE), "not a file, folder or link"),
    }
    (outside / "target").write_text("kept")
    check = nothing()
    for name, ((info, data), why) in tricks.items():
        # the trick, then a file through a link it may have made
        through = _member(f"{info.name}/evil.txt", data=b"evil")
        answer = _submit(http, form, _tar(inputs, (info, data), through))
        problem = refused(answer, 422, "inputs", info.name, why)
        assert problem["error"] == "InvalidInput", name
    check.changed()
    assert (outside / "target").read_text() == "kept"


def test_uploads_over_the_limits_are_refused(
    http: httpx.Client, nothing: Callable[[], Nothing], tmp_path: Path
) -> None:
    form, inputs = _gathered(tmp_path)
    check = nothing()
    # the request itself: by its Content-Length, and sent chunked without one
    noise = os.urandom(100_000)  # gzip cannot shrink it
    archive = _tar(inputs, _member("workdir/noise.bin", data=noise))
    assert len(archive) > LIMITS["upload_bytes"]
    refused(_submit(http, form, archive), 413, "limits.upload_bytes", "65,536 bytes")
    request = http.build_request(
        "POST", "/api/v1/runs", data=form, files={"inputs": ("i.tgz", archive, "application/gzip")}
    )
    body = request.read()
    chunks = (body[i : i + 8192] for i in range(0, len(body), 8192))
    chunked = http.post(
        "/api/v1/runs",
        content=chunks,
        headers={"Content-Type": request.headers["Content-Type"]},
    )
    assert "content-length" not in chunked.request.headers
    refused(chunked, 413, "limits.upload_bytes")
    # small as sent, too big unpacked (zeros compress ~1000:1)
    bomb = _tar(inputs, _member("workdir/zeros.bin", data=bytes(200_000)))
    assert len(bomb) < LIMITS["upload_bytes"]
    refused(_submit(http, form, bomb), 422, "inputs", "limits.inputs_bytes")
    # too many files
    many = [_member(f"workdir/f{i}.txt", data=b"x") for i in range(60)]
    refused(_submit(http, form, _tar(inputs, *many)), 422, "inputs", "limits.inputs_files")
    # not a tar at all
    refused(_submit(http, form, b"not a tar"), 422, "inputs", "not a readable tar archive")
    check.changed()


def test_a_bad_form_is_refused_by_field(
    http: httpx.Client, nothing: Callable[[], Nothing], tmp_path: Path
) -> None:
    form, inputs = _gathered(tmp_path)
    archive = _tar(inputs)
    check = nothing()
    submission = json.loads(form["submission"])
    huge = form["submission"].replace(
        '"overrides":{}', '"overrides":{"resources":{"memory_gb":1e400}}'
    )
    assert huge != form["submission"]
    cases: list[tuple[dict[str, str], int, list[str]]] = [
        ({**form, "submission": "{not json"}, 422, ["spec.yaml", "Invalid JSON"]),
        (
            {**form, "submission": json.dumps({**submission, "colour": "red"})},
            422,
            ["spec.yaml", "colour", "unknown key"],
        ),
        (
            {**form, "submission": json.dumps({**submission, "template_id": 5})},
            422,
            ["spec.yaml", "template_id"],
        ),
        (
            {**form, "submission": json.dumps({**submission, "template_id": "nowhere"})},
            404,
            ["nowhere"],
        ),
        (
            {**form, "submission": json.dumps({**submission, "experiment_id": "bad name!"})},
            422,
            ["experiment name 'bad name!'"],
        ),
        (
            {
                **form,
                "submission": json.dumps({**submission, "task_request": {"command": "a\x00"}}),
            },
            422,
            ["spec.yaml", "submission.task_request.command", "NUL"],
        ),
        (  # 1e400 reads as infinity, which no JSON column holds (a 503 on PostgreSQL)
            {**form, "submission": huge},
            422,
            ["spec.yaml", "submission.overrides.resources.memory_gb", "finite"],
        ),
        ({**form, "source": "spec\x00.yaml"}, 422, ["source", "NUL"]),
        ({k: v for k, v in form.items() if k != "shaped"}, 422, ["shaped", "required"]),
    ]
    for fields, status, names in cases:
        refused(_submit(http, fields, archive), status, *names)
    refused(http.post("/api/v1/runs", data=form), 422, "inputs", "required", "inputs_digest")
    # inputs named by digest: not a sha256; one this user never sent (the client then sends
    # them); an archive that does not give the digest it came with
    named = {**form, "inputs_digest": "ab" * 32}
    refused(
        http.post("/api/v1/runs", data={**form, "inputs_digest": "AB" * 32}), 422, "inputs_digest"
    )
    assert (
        refused(http.post("/api/v1/runs", data=named), 409, "inputs_digest", "send")["error"]
        == "InputsWanted"
    )
    refused(_submit(http, named, archive), 422, "inputs_digest", "does not match", "abababababab")
    broken = http.post(
        "/api/v1/runs",
        content=b"--x\r\nNone--x--\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert refused(broken, 400, "body")["field"] == "body"
    check.changed()


# -- runs: unknown, and someone else's -------------------------------------------------------


def _run_of(server: Server, tmp_path: Path) -> str:
    from orbit import Client

    with Client(server.url, server.admin_token) as client:
        spec = {"experiment": "mine", "task_type": "command", "template": "local"}
        return client.submit({**spec, "task": {"command": "true"}}, base_dir=tmp_path).id


def _member_token(http: httpx.Client, name: str = "mallory") -> str:
    assert http.post("/api/v1/users", json={"name": name, "role": "member"}).status_code == 201
    answer = http.post("/api/v1/tokens", json={"user": name})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def test_an_unknown_run_is_a_404_everywhere(
    http: httpx.Client, nothing: Callable[[], Nothing]
) -> None:
    check = nothing()
    for method, path in [
        ("GET", "/api/v1/runs/nope"),
        ("GET", "/api/v1/runs/nope/view"),
        ("GET", "/api/v1/runs/nope/inspect"),
        ("GET", "/api/v1/runs/nope/logs/runtime"),
        ("GET", "/api/v1/runs/nope/artifacts"),
        ("POST", "/api/v1/runs/nope/refresh"),
        ("POST", "/api/v1/runs/nope/cancel"),
        ("POST", "/api/v1/runs/nope/retry"),
        ("POST", "/api/v1/runs/nope/replay"),
        ("POST", "/api/v1/runs/nope/leftovers/stop"),
        ("POST", "/api/v1/runs/nope/artifacts"),
        ("GET", "/api/v1/runs/nope/storage"),
        ("POST", "/api/v1/runs/nope/pin"),
        ("DELETE", "/api/v1/runs/nope/pin"),
    ]:
        body = refused(http.request(method, path), 404, "unknown run 'nope'")
        assert body["error"] == "NotFound", path
    check.changed()


def test_a_run_of_someone_else_is_not_a_members_to_control(
    limited: Server, http: httpx.Client, tmp_path: Path, nothing: Callable[[], Nothing]
) -> None:
    run_id = _run_of(limited, tmp_path)
    token = _member_token(http)
    check = nothing()
    with limited.client(token) as member:
        for path in ("cancel", "retry", "leftovers/stop", "pin"):
            body = refused(member.post(f"/api/v1/runs/{run_id}/{path}"), 403, "mallory", "member")
            assert body["error"] == "Forbidden"
        deleting = member.post("/api/v1/runs/delete", json={"runs": [run_id]})
        assert refused(deleting, 403, "mallory", "member")["error"] == "Forbidden"
        assert refused(member.post("/api/v1/gc"), 403, "mallory", "permission storage.gc")
        assert member.get(f"/api/v1/runs/{run_id}").status_code == 200  # reading is allowed
    check.changed()
    attempts = http.get(f"/api/v1/runs/{run_id}").json()["attempts"]
    assert [a["state"] for a in attempts] == ["prepared"]


def test_a_run_on_an_unknown_attempt_is_a_404_before_its_stream(
    limited: Server, http: httpx.Client, tmp_path: Path
) -> None:
    run_id = _run_of(limited, tmp_path)
    for path, params, headers, status, name in [
        ("logs/runtime", {"attempt": 2}, {}, 404, "no attempt 2"),
        ("logs/runtime", {"offset": 2**63}, {}, 422, "offset"),
        ("logs/runtime", {}, {"Last-Event-ID": b"\xb2"}, 422, "last-event-id"),
        ("logs/nowhere", {}, {}, 422, "layer"),
        ("inspect", {"attempt": 10**30}, {}, 404, "no attempt"),
        ("artifacts", {"attempt": 0}, {}, 422, "attempt"),
    ]:
        answer = http.get(f"/api/v1/runs/{run_id}/{path}", params=params, headers=headers)
        refused(answer, status, name)


# -- the CLI and tokens ------------------------------------------------------------------------


def _orbit(
    server: Server, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbit", *args],
        env=server.env(token),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_says_a_servers_refusal_in_one_line(orbit_server: Server, tmp_path: Path) -> None:
    shown = _orbit(orbit_server, "runs", "show", "nope")
    assert shown.returncode == 2, shown
    assert shown.stderr.strip() == "orbit: error: unknown run 'nope' (see 'orbit runs list')", shown
    assert "Traceback" not in shown.stderr + shown.stdout
    with orbit_server.client() as http:
        token = _member_token(http, "eve")
    listed = _orbit(orbit_server, "users", "list", token=token)
    assert listed.returncode == 2, listed
    assert len(listed.stderr.strip().splitlines()) == 1, listed
    assert "eve (member) may not" in listed.stderr
    nobody = _orbit(orbit_server, "runs", "list", token="orbit_not-a-token")
    assert nobody.returncode == 2, nobody
    assert len(nobody.stderr.strip().splitlines()) == 1, nobody
    assert "not accepted" in nobody.stderr
    assert "Traceback" not in listed.stderr + nobody.stderr


def test_a_revoked_or_expired_token_is_refused_at_once(orbit_server: Server) -> None:
    with orbit_server.client() as admin:
        made = admin.post("/api/v1/tokens", json={"name": "short"}).json()
        with orbit_server.client(made["token"]) as http:
            assert http.get("/api/v1/whoami").status_code == 200
            revoked = admin.delete(f"/api/v1/tokens/{made['record']['id']}")
            assert revoked.status_code == 200, revoked.text
            refused(http.get("/api/v1/whoami"), 401, "not accepted")
        brief = admin.post("/api/v1/tokens", json={"name": "brief", "expires": "2s"}).json()
    with orbit_server.client(brief["token"]) as http:
        assert http.get("/api/v1/whoami").status_code == 200
        time.sleep(2.2)
        answer = http.get("/api/v1/whoami")
        refused(answer, 401, "not accepted")
        assert answer.headers["www-authenticate"] == "Bearer"
