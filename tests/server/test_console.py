"""The web console as a browser's requests see it, against a real `orbit server` on both stores:
sign-in (token form, one-time link, sign-out, a revoked token's session), every page and
fragment, roles (buttons and refusals as on the API), CSRF, escaping, 404s and bad queries."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import httpx
import pytest

from orbit.server.ui import STATIC
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

EVIL = "<script>alert(1)</script>"
# a 1x1 PNG, as printf writes it in a shell
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a5dd1d6a0000000049454e44ae426082"
)
PNG_SHELL = "".join(f"\\x{b:02x}" for b in PNG)


def session(server: Server, token: str) -> httpx.Client:
    """A browser-like client signed in through the form."""
    client = httpx.Client(base_url=server.url, timeout=30)
    form = client.get("/ui/login")
    assert form.status_code == 200
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    answer = client.post(
        "/ui/login", data={"csrf": csrf.group(1), "token": token, "next": "/ui/runs"}
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui/runs"
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found is not None, html[:500]
    return found.group(1)


def token_for(server: Server, user: str, role: str) -> str:
    admin = server.env()
    orbit(admin, "users", "add", user, "--role", role)
    return str(orbit_json(admin, "tokens", "create", "--user", user)["token"])


@pytest.fixture
def people(orbit_server: Server) -> dict[str, str]:
    return {
        "admin": orbit_server.admin_token,
        "ann": token_for(orbit_server, "ann", "member"),
        "vic": token_for(orbit_server, "vic", "viewer"),
    }


def test_nothing_is_reachable_without_a_session_but_the_sign_in_form_and_files(
    orbit_server: Server,
) -> None:
    plain = httpx.Client(base_url=orbit_server.url, timeout=30)
    for path in ("/ui/", "/ui/runs", "/ui/runs/run-x", "/ui/nodes", "/ui/admin", "/ui/events"):
        answer = plain.get(path)
        assert answer.status_code == 303, (path, answer.status_code)
        assert answer.headers["location"].startswith("/ui/login?next=")
    assert plain.post("/ui/runs/run-x/cancel").status_code == 401
    assert plain.get("/ui/login").status_code == 200
    # the vendored files are served as pinned (VENDORED.md names each digest)
    listed = (STATIC / "vendor" / "VENDORED.md").read_text()
    for name in ("htmx.min.js", "sse.js", "uPlot.iife.min.js", "uPlot.min.css"):
        body = plain.get(f"/ui/static/vendor/{name}")
        assert body.status_code == 200
        assert hashlib.sha256(body.content).hexdigest() in listed, name
        assert body.headers["cache-control"] == "public, max-age=86400"  # pinned: kept a day
    assert plain.get("/ui/static/console.js").headers["cache-control"] == "no-cache"
    # a bad cookie is refused and sent back to sign in, saying why
    plain.cookies.set("orbit_session", "not-a-token", path="/ui")
    again = plain.get("/ui/runs", follow_redirects=True)
    assert "/ui/login" in str(again.url) and "not accepted" in again.text
    # what a page says comes from this server only: a link cannot make it say anything
    assert "Pay here" not in plain.get("/ui/login?why=Pay+here&notice=Pay+here").text
    # the server said where the console is when it started
    assert f"{orbit_server.url}/ui/" in orbit_server.output()


def test_sign_in_sets_a_safe_cookie_and_refuses_a_stale_form_or_a_bad_token(
    orbit_server: Server,
) -> None:
    client = httpx.Client(base_url=orbit_server.url, timeout=30)
    client.get("/ui/login")
    stale = client.post("/ui/login", data={"csrf": "forged", "token": orbit_server.admin_token})
    assert stale.status_code == 403 and "stale" in stale.text
    form = client.get("/ui/login?next=//evil.example/")
    bad = client.post("/ui/login", data={"csrf": csrf_in_form(form.text), "token": "nope"})
    assert bad.status_code == 401 and "not accepted" in bad.text
    form = client.get("/ui/login?next=//evil.example/")
    good = client.post(
        "/ui/login",
        data={
            "csrf": csrf_in_form(form.text),
            "token": orbit_server.admin_token,
            "next": "//evil.example/",
        },
    )
    assert good.status_code == 303 and good.headers["location"] == "/ui/"  # never elsewhere
    cookie = next(
        v for k, v in good.headers.multi_items() if k == "set-cookie" and "orbit_session" in v
    )
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/ui" in cookie
    assert "Max-Age=" in cookie
    assert client.get("/ui/").status_code == 200


def csrf_in_form(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_every_page_answers_for_a_signed_in_user_and_a_bearer_header(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    env = orbit_server.env()
    run = orbit_json(env, "submit", str(write_spec(tmp_path)), "--wait")["id"]
    browser = session(orbit_server, people["admin"])
    pages = [
        "/ui/",
        "/ui/runs",
        "/ui/runs/rows",
        f"/ui/runs/{run}",
        f"/ui/runs/{run}/decision",
        f"/ui/runs/{run}/charts.json",
        "/ui/queue",
        "/ui/nodes",
        "/ui/fair-share",
        "/ui/fair-share?format=csv",
        "/ui/audit",
        "/ui/audit?verify=1",
        "/ui/audit?format=jsonl",
        "/ui/admin",
    ]
    for path in pages:
        answer = browser.get(path)
        assert answer.status_code == 200, (path, answer.text[:300])
    assert run in browser.get("/ui/runs").text
    assert "the chain holds" in browser.get("/ui/audit?verify=1").text
    assert "scope,name,gpus" in browser.get("/ui/fair-share?format=csv").text
    bearer = orbit_server.client(people["vic"])
    assert bearer.get(f"/ui/runs/{run}").status_code == 200
    assert bearer.get("/ui/admin").status_code == 403  # a viewer's, as on the API


def test_run_text_is_escaped_and_the_log_streams_from_its_end(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    env = orbit_server.env()
    command = (
        f"for i in $(seq 1 600); do echo line-$i; done; echo '{EVIL}'; "
        "mkdir -p $ORBIT_ARTIFACTS_DIR/previews; "
        f"echo '{EVIL}' > $ORBIT_ARTIFACTS_DIR/previews/note.txt; "
        f"printf '{PNG_SHELL}' > $ORBIT_ARTIFACTS_DIR/previews/dot.png; "
        f"echo '{EVIL}' > $ORBIT_ARTIFACTS_DIR/previews/evil.svg"
    )
    spec = write_spec(tmp_path, task={"command": command})
    run = orbit_json(env, "submit", str(spec), "--wait")["id"]
    browser = session(orbit_server, people["admin"])
    page = browser.get(f"/ui/runs/{run}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and EVIL not in page  # its command
    echoed = browser.get("/ui/runs", params={"q": EVIL, "user": '"><b>x'}).text
    assert EVIL not in echoed and '"><b>x' not in echoed
    with browser.stream("GET", f"/ui/runs/{run}/logs/training/stream") as stream:
        body = "".join(stream.iter_text())
    assert "event: end" in body
    assert EVIL in body  # as text in an event: the page puts it in with textContent
    # the last 500 lines (499 of the loop's and the script line), not the log from its start
    tail_only = "data: line-600\n" in body and "data: line-102\n" in body
    assert tail_only and "data: line-101\n" not in body, "the stream is not the log's tail"
    offsets = re.findall(r"^id: (1:\d+)$", body, re.M)  # the attempt, and the byte offset
    assert offsets, body[:300]
    # a dropped connection resumes from the last event's id: nothing again, only the end
    resumed = browser.get(
        f"/ui/runs/{run}/logs/training/stream", headers={"Last-Event-ID": offsets[-1]}
    ).text
    assert "line-600" not in resumed and "event: end" in resumed
    whole = browser.get(f"/ui/runs/{run}/logs/training/download")
    assert whole.text.startswith("line-1\n") and EVIL in whole.text
    assert "attachment" in whole.headers["content-disposition"]
    rows = browser.get("/ui/runs?q=" + run[4:12]).text
    assert run in rows
    # older lines on demand: whole lines ending where the tail began
    start = int(re.search(r"event: start\ndata: 1:(\d+)", body).group(1))  # type: ignore[union-attr]
    earlier = browser.get(f"/ui/runs/{run}/logs/training/older", params={"offset": start}).json()
    assert earlier["text"].endswith("line-101\n") and earlier["offset"] < start
    assert earlier["text"].startswith("line-")  # a whole first line
    # previews: text as text, an image as an image, anything else not served
    previews = browser.get(f"/ui/runs/{run}/previews").text
    assert "&lt;script&gt;" in previews and EVIL not in previews
    image = browser.get(f"/ui/runs/{run}/previews/dot.png")
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    assert image.headers["x-content-type-options"] == "nosniff"
    assert image.content.startswith(b"\x89PNG")
    assert browser.get(f"/ui/runs/{run}/previews/evil.svg").status_code == 404
    # artifacts: the sealed manifest's, each a download; nothing it does not list
    listed = browser.get(f"/ui/runs/{run}/artifacts").text
    assert "previews/note.txt" in listed and "training.log" in listed
    note = browser.get(f"/ui/runs/{run}/artifacts/previews/note.txt")
    assert note.status_code == 200 and note.text == EVIL + "\n"
    assert "attachment" in note.headers["content-disposition"]
    for sneaky in ("../runtime/status.json", "previews/../../job.json", "nope.bin"):
        # (a client folds `..` away: that asks for another page, which no GET answers)
        assert browser.get(f"/ui/runs/{run}/artifacts/{sneaky}").status_code in (404, 405)
    raw = browser.get(f"/ui/runs/{run}/artifacts/previews%2F..%2F..%2Fjob.json")
    assert raw.status_code == 404 and "no sealed artifact" in raw.text
    # the diff with another run
    other = orbit_json(env, "submit", str(write_spec(tmp_path, name="b.yaml")), "--wait")["id"]
    diff = browser.get(f"/ui/runs/{run}/diff", params={"other": other}).text
    assert "task.command" in diff or "command" in diff


def test_unknown_ids_and_bad_queries_say_so_in_one_line(
    orbit_server: Server, people: dict[str, str]
) -> None:
    browser = session(orbit_server, people["admin"])
    missing = browser.get("/ui/runs/run-doesnotexist")
    assert missing.status_code == 404 and "unknown run" in missing.text
    node = browser.get("/ui/nodes/no-such-node")
    assert node.status_code == 404 and "no-such-node" in node.text
    for query, says in (
        ("state=sleeping", "state must be one of"),
        ("limit=lots", "limit must be a whole number"),
        ("before=yesterday", "before must be"),
        ("experiment=nope", "nope"),
    ):
        answer = browser.get(f"/ui/runs?{query}")
        assert answer.status_code == 200 and says in answer.text, query
    assert browser.get("/ui/runs/x/logs/bogus/stream").status_code in (400, 404)


def test_roles_buttons_csrf_and_a_revoked_token(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    ann_env = orbit_server.env(people["ann"])
    spec = write_spec(tmp_path, task={"command": "sleep 60"})
    admin_env = orbit_server.env()
    run = orbit_json(admin_env, "submit", str(spec))["id"]
    viewer = session(orbit_server, people["vic"])
    page = viewer.get(f"/ui/runs/{run}").text
    assert 'id="cancel"' not in page and "Replay" not in page
    refused = viewer.post(f"/ui/runs/{run}/cancel", data={"csrf": csrf_of(page)})
    assert refused.status_code == 403 and "may not" in refused.text
    member = session(orbit_server, people["ann"])
    page = member.get(f"/ui/runs/{run}").text
    assert 'id="cancel"' not in page  # the admin's run, not ann's
    admin = session(orbit_server, people["admin"])
    page = admin.get(f"/ui/runs/{run}").text
    assert 'id="cancel"' in page
    forged = admin.post(f"/ui/runs/{run}/cancel", data={"csrf": "0" * 64})
    assert forged.status_code == 403 and "CSRF" in forged.text
    assert admin.post(f"/ui/runs/{run}/cancel").status_code == 403
    done = admin.post(f"/ui/runs/{run}/cancel", data={"csrf": csrf_of(page)})
    assert done.status_code == 303, done.text
    assert "cancel asked" in admin.get(done.headers["location"]).text  # said once, there
    eventually(lambda: orbit_json(admin_env, "status", run)["state"] == "terminated", 60)
    # a token revoked: its session ends at the next request
    token_id = next(t["id"] for t in orbit_json(admin_env, "tokens", "list") if t["user"] == "ann")
    orbit(admin_env, "tokens", "revoke", token_id)
    assert member.get("/ui/runs").status_code == 303
    del ann_env


def test_a_one_time_link_signs_in_once(orbit_server: Server, people: dict[str, str]) -> None:
    proc = orbit(orbit_server.env(people["ann"]), "ui")
    link = proc.stdout.strip().splitlines()[-1]
    assert link.startswith(f"{orbit_server.url}/ui/login/"), proc.stdout
    browser = httpx.Client(timeout=30)
    # the link asks first: whose it is, and a button (a link alone signs nobody in)
    asked = browser.get(link)
    assert asked.status_code == 200 and "Sign in as ann" in asked.text
    assert browser.get(f"{orbit_server.url}/ui/").status_code == 303
    # its button without the form's own cookie (another site's form) is refused
    forged = httpx.post(link, data={"csrf": csrf_in_form(asked.text)}, timeout=30)
    assert forged.status_code == 303 and forged.headers["location"] == "/ui/login"
    first = browser.post(link, data={"csrf": csrf_in_form(asked.text)})
    assert first.status_code == 303 and first.headers["location"] == "/ui/"
    assert browser.get(f"{orbit_server.url}/ui/").status_code == 200
    again = httpx.get(link, timeout=30, follow_redirects=True)
    assert "/ui/login" in str(again.url) and "used already" in again.text
    # signing out ends the session here
    out = browser.post(f"{orbit_server.url}/ui/login/out")
    assert out.status_code == 303
    assert "signed out" in browser.get(f"{orbit_server.url}/ui/login").text
    assert browser.get(f"{orbit_server.url}/ui/").status_code == 303


def test_the_live_runs_stream_says_when_something_changed(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    browser = session(orbit_server, people["admin"])
    seen: list[str] = []
    began = time.monotonic()
    with browser.stream("GET", "/ui/events", timeout=40) as stream:
        for line in stream.iter_lines():
            seen.append(line)
            if len(seen) == 1:  # the stream is open: now a run is made
                orbit(orbit_server.env(), "submit", str(write_spec(tmp_path)))
            if line == "event: changed" or time.monotonic() - began > 30:
                break
    assert "event: changed" in seen, seen


def test_the_admin_page_makes_tokens_once_join_tokens_and_quotas(
    orbit_server: Server, people: dict[str, str]
) -> None:
    admin = session(orbit_server, people["admin"])
    csrf = csrf_of(admin.get("/ui/admin").text)
    made = admin.post("/ui/admin/tokens", data={"csrf": csrf, "user": "ann", "name": "laptop"})
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"
    token = re.search(r'id="new-token">([^<]+)<', made.text).group(1)  # type: ignore[union-attr]
    assert orbit_json(orbit_server.env(token), "whoami")["name"] == "ann"
    assert token not in admin.get("/ui/admin").text  # never shown again
    joined = admin.post("/ui/admin/join-tokens", data={"csrf": csrf, "labels": "rack=a"})
    assert joined.status_code == 200 and "Join token" in joined.text
    assert "rack=a" in admin.get("/ui/admin").text
    bad = admin.post("/ui/admin/join-tokens", data={"csrf": csrf, "labels": "rack"})
    assert bad.status_code == 400 and "labels: expected key=value" in bad.text
    quota = admin.post(
        "/ui/admin/quotas", data={"csrf": csrf, "scope": "user", "name": "ann", "gpus": "4"}
    )
    assert quota.status_code == 303
    assert orbit_json(orbit_server.env(), "quotas", "list")[0]["gpus"] == 4
    odd = admin.post(
        "/ui/admin/quotas", data={"csrf": csrf, "scope": "user", "name": "ann", "gpus": "lots"}
    )
    assert odd.status_code == 400 and "gpus: input should be a valid integer" in odd.text
    huge = admin.post(  # the API's own checks: weight at most 1000
        "/ui/admin/quotas",
        data={"csrf": csrf, "scope": "user", "name": "ann", "gpus": "1", "weight": "inf"},
    )
    assert huge.status_code == 400 and "weight: input should be less than" in huge.text
    gone = admin.post("/ui/admin/quotas/user/ann/remove", data={"csrf": csrf})
    assert gone.status_code == 303 and orbit_json(orbit_server.env(), "quotas", "list") == []
    member = session(orbit_server, people["ann"])
    mine = csrf_of(member.get("/ui/runs").text)
    refused = member.post("/ui/admin/join-tokens", data={"csrf": mine})
    assert refused.status_code == 403
    assert member.get("/ui/admin").status_code == 403


def test_nodes_show_their_gpus_labels_and_health_and_the_overview_what_needs_a_look(
    orbit_server: Server, people: dict[str, str]
) -> None:
    from tests.server.test_nodes_admin import INFO, join

    token = orbit_json(orbit_server.env(), "nodes", "join-token", "create")["token"]
    sick = {**INFO, "accelerators": [{**INFO["accelerators"][0], "healthy": False,
                                      "problem": "XID 79: <fell off the bus>"}]}  # fmt: skip
    node = join(orbit_server, token, "gpu-sick", info=sick, labels={"rack": "a"})
    node.heartbeat()
    browser = session(orbit_server, people["vic"])
    listed = browser.get("/ui/nodes").text
    assert "gpu-sick" in listed and "rack=a" in listed
    assert "XID 79: &lt;fell off the bus&gt;" in listed
    page = browser.get("/ui/nodes/gpu-sick").text
    assert "NVIDIA H100 80GB HBM3" in page and "Drain" not in page  # a viewer's: no buttons
    overview = browser.get("/ui/").text
    assert "Needs a look" in overview and "GPU 0: XID 79" in overview
    admin = session(orbit_server, people["admin"])
    page = admin.get("/ui/nodes/gpu-sick").text
    drained = admin.post(
        "/ui/nodes/gpu-sick/set", data={"csrf": csrf_of(page), "do": "drain", "reason": "xid"}
    )
    assert drained.status_code == 303
    assert orbit_json(orbit_server.env(), "nodes", "show", "gpu-sick")["max_tasks"] == 0
    node.close()


def test_what_a_task_writes_cannot_reach_past_its_run(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    """A task's own manifest (while it runs) names the server's admin token; its log carries
    carriage returns shaped like events; its artifact has a name beyond ASCII."""
    forged = '{"files": [{"path": "../../../../admin-token", "size": 1, "sha256": "x"}]}'
    command = (
        f"echo '{forged}' > $ORBIT_ARTIFACTS_DIR/manifest.json; "
        'printf \'a\\r\\revent: problem\\rdata: {"message": "SPOOF"}\\r\\r\\n\'; '
        "printf 'é' > $ORBIT_ARTIFACTS_DIR/résumé.txt; "
        "head -c 70000 /dev/zero | tr '\\0' x; sleep 20"
    )
    env = orbit_server.env()
    run = orbit_json(env, "submit", str(write_spec(tmp_path, task={"command": command})))["id"]
    eventually(lambda: orbit_json(env, "status", run)["state"] == "running", 30)
    browser = session(orbit_server, people["vic"])
    eventually(lambda: "problem" in orbit(env, "logs", run).stdout, 30)
    # the manifest is not believed while the task runs, and no path leaves artifacts/
    listed = browser.get(f"/ui/runs/{run}/artifacts").text
    assert "admin-token" not in listed and "once the attempt has ended" in listed
    for path in ("..%2F..%2F..%2F..%2Fadmin-token", "%2E%2E/%2E%2E/admin-token", "a//b"):
        stolen = browser.get(f"/ui/runs/{run}/artifacts/{path}")
        assert stolen.status_code in (404, 405) and orbit_server.admin_token not in stolen.text
    # a carriage return starts no event of its own; a long line without an end still comes
    with browser.stream("GET", f"/ui/runs/{run}/logs/training/stream") as stream:
        body = ""
        for text in stream.iter_text():
            body += text
            if "x" * 1000 in body:
                break
    assert "\nevent: problem" not in body and "data: event: problem" in body
    assert "x" * 1000 in body  # 70,000 bytes, no newline yet: sent all the same
    orbit(env, "cancel", run)
    eventually(lambda: orbit_json(env, "status", run)["state"] == "terminated", 60)
    # once ended, the wrapper's own manifest: the file by its name, whatever its letters
    listed = browser.get(f"/ui/runs/{run}/artifacts").text
    assert "admin-token" not in listed and "résumé.txt" in listed
    named = browser.get(f"/ui/runs/{run}/artifacts/r%C3%A9sum%C3%A9.txt")
    assert named.status_code == 200 and named.content == "é".encode()
    assert "filename*=UTF-8''r%C3%A9sum%C3%A9.txt" in named.headers["content-disposition"]
    # odd numbers in a query are a line on the page, not a 500
    assert "limit must be a whole number" in browser.get("/ui/runs?limit=%C2%B2").text


def test_a_member_replays_someone_elses_run_as_on_the_api(
    orbit_server: Server, people: dict[str, str], tmp_path: Path
) -> None:
    env = orbit_server.env()
    spec = write_spec(tmp_path, template="local", task={"command": "true"})
    run = orbit_json(env, "submit", str(spec), "--wait")["id"]
    member = session(orbit_server, people["ann"])
    page = member.get(f"/ui/runs/{run}").text
    assert 'id="retry"' not in page  # the admin's run: no retry for ann
    replayed = member.post(f"/ui/runs/{run}/replay", data={"csrf": csrf_of(page)})
    # the local template runs on the server's own host: members may not (local_roles), as
    # the API says; the refusal is the API's words, on the page
    assert replayed.status_code == 403 and "own host, which only admins may use" in replayed.text
    retried = member.post(f"/ui/runs/{run}/retry", data={"csrf": csrf_of(page)})
    assert retried.status_code == 403 and "may not" in retried.text
