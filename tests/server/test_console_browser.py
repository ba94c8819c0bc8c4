"""The console in a real browser: Debian's chromium driven by playwright against a real `orbit
server` and a real agent. Signs in with a token, sees a submitted run appear and advance without
a reload, watches its log lines arrive live, sees the GPU chart drawn with points, opens the
queue and a waiting run's decision, cancels a run as its owner, and finds no cancel button as a
viewer. Each page's screenshot is saved under the test's temp dir; with ORBIT_UI_SHOTS=docs they
are copied to docs/console-NAME.png too, which is how the README's docs/console-run.png is made.

The GPU samples: no GPU exists here, so the task writes the NVML audit lines itself, with the
values of the H100 recording (tests/data/nvml/h100-recording.json: GPU 0 at 100 %, 80 GiB,
about 700 W, 60 C under gpu_burn), one a second, as the wrapper's sidecar would on that box."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = os.environ.get("ORBIT_UI_SHOTS")  # where to copy the screenshots too (the README's)
# one NVML audit line a second for GPU 0, and a log line, for 40 s
GPU_TASK = (
    "for i in $(seq 1 40); do "
    "echo step $i of 40 '<b>not bold</b>'; "
    'printf \'{"ts": "%s", "index": 0, "name": "NVIDIA H100 80GB HBM3", "util_gpu": 100, '
    '"mem_used_mib": 81000, "mem_total_mib": 81559, "power_w": 699.3, "temp_c": 60}\\n\' '
    '"$(date -u +%Y-%m-%dT%H:%M:%S.000+00:00)" >> $ORBIT_ARTIFACTS_DIR/nvml-audit.jsonl; '
    'echo "{\\"step\\": $i, \\"max_steps\\": 40, \\"loss\\": 1.$((40-i))}" '
    ">> $ORBIT_ARTIFACTS_DIR/logging.jsonl; sleep 1; done"
)


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        if os.environ.get("ORBIT_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is not installed: apt-get install chromium")
        pytest.skip("chromium is not installed: apt-get install chromium")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def sign_in(browser: Any, server: Server, token: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{server.url}/ui/runs")
    assert "/ui/login" in page.url
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/ui/runs")
    return page


def shot(page: Any, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SHOTS) / f"console-{path.name}")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_console_in_a_real_browser(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    browser: Any,
    tmp_path: Path,
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    admin_env = orbit_server.env()
    orbit(admin_env, "users", "add", "vic", "--role", "viewer")
    viewer_token = orbit_json(admin_env, "tokens", "create", "--user", "vic")["token"]
    start_agent(orbit_server, "gpu-a", max_tasks=1)
    wait_online(orbit_server, "gpu-a")

    page = sign_in(browser, orbit_server, orbit_server.admin_token)
    errors: list[str] = []  # the page's own script errors: none
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    # a run submitted now appears in the open list, and advances, without a reload
    spec = write_spec(tmp_path, template="pool", task={"command": GPU_TASK})
    run = orbit_json(admin_env, "submit", str(spec))["id"]
    row = page.locator(f"tr[data-run='{run}']")
    row.wait_for(timeout=20_000)
    page.locator(f"tr[data-run='{run}'] .state.go").wait_for(timeout=30_000)
    # its progress too, as its steps are logged (the rows are swapped in when runs move)
    page.locator(f"tr[data-run='{run}'] progress").wait_for(timeout=30_000)
    shot(page, shots, "runs")

    # its page: log lines arrive live (as text), the GPU and loss charts draw points
    page.click(f"a[href='/ui/runs/{run}']")
    page.wait_for_url(f"**/ui/runs/{run}")
    log = page.locator("#log")
    try:
        eventually(lambda: "step 3 of 40" in log.inner_text(), timeout=30)
    except AssertionError:
        raise AssertionError(
            f"{page.locator('#log-status').inner_text()!r} {log.inner_text()[-300:]!r}"
            f"{orbit_server.output()[-3000:]}"
        ) from None
    first = log.inner_text().count("\n")
    eventually(lambda: log.inner_text().count("\n") > first, timeout=20)
    assert "<b>not bold</b>" in log.inner_text()  # shown as the text it is
    assert page.locator("#log b").count() == 0
    util = page.locator("#chart-util")
    try:
        eventually(lambda: int(util.get_attribute("data-points") or 0) >= 3, timeout=30)
    except AssertionError:
        with orbit_server.client() as http:
            raise AssertionError(http.get(f"/ui/runs/{run}/charts.json").text[:1500]) from None
    assert page.locator("#chart-util canvas").count() == 1
    eventually(lambda: page.locator("#chart-loss canvas").count() == 1, timeout=20)
    # a drag across the GPU chart zooms it: that span comes second by second (charts.json's
    # from/to), until "Back to the whole run"
    over = page.locator("#chart-util .u-over").bounding_box()
    assert over is not None
    with page.expect_response(lambda r: "charts.json?from=" in r.url) as zoom:
        page.mouse.move(over["x"] + over["width"] * 0.2, over["y"] + over["height"] / 2)
        page.mouse.down()
        page.mouse.move(over["x"] + over["width"] * 0.8, over["y"] + over["height"] / 2, steps=5)
        page.mouse.up()
    assert zoom.value.ok and zoom.value.json()["gpus"], zoom.value.text()
    page.locator("#charts-whole").wait_for(state="visible", timeout=10_000)
    page.click("#charts-whole")
    page.locator("#charts-whole").wait_for(state="hidden", timeout=10_000)
    shot(page, shots, "run")

    # a second run waits behind it (the node takes one task): the queue and its decision
    waiting = orbit_json(admin_env, "submit", str(spec))["id"]
    page.goto(f"{orbit_server.url}/ui/queue")
    eventually(lambda: page.reload() or page.locator(f"a:has-text('{waiting}')").count(), 30)
    queued = page.locator(f"tr:has(a:has-text('{waiting}'))").inner_text()
    assert "admin" in queued and "normal" in queued  # who, and the tier
    shot(page, shots, "queue")
    page.click(f"a:has-text('{waiting}')")
    page.wait_for_url(f"**/ui/runs/{waiting}/decision")
    assert "waiting" in page.locator("#decision-line").inner_text()
    page.click("#replay-decision")
    page.locator("#replay-verdict").wait_for()
    shot(page, shots, "decision")

    # a viewer sees the run and no cancel button
    viewer = sign_in(browser, orbit_server, viewer_token)
    viewer.goto(f"{orbit_server.url}/ui/runs/{run}")
    assert viewer.locator("#cancel").count() == 0
    viewer.goto(f"{orbit_server.url}/ui/nodes")
    shot(viewer, shots, "nodes")
    # on a phone's width the page fits, with nothing wider than the screen but the tables,
    # which scroll on their own
    viewer.set_viewport_size({"width": 390, "height": 844})
    viewer.goto(f"{orbit_server.url}/ui/runs/{run}")
    wide = viewer.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right"
        " > 392).map(e => e.tagName + '.' + e.className + '#' + e.id + ' '"
        " + Math.round(e.getBoundingClientRect().right)).slice(0, 12)"
    )
    assert viewer.evaluate("document.documentElement.scrollWidth") <= 390, wide
    shot(viewer, shots, "phone")

    # the owner cancels both, by the button
    for ref in (waiting, run):
        page.goto(f"{orbit_server.url}/ui/runs/{ref}")
        page.click("#cancel")
        page.locator(".notice").wait_for()
        assert "cancel asked" in page.locator(".notice").inner_text()
    # the page open on the running one sees it end, state and attempts, without a reload
    try:
        eventually(lambda: page.locator("#run-state").inner_text() == "terminated", timeout=60)
    except AssertionError:  # which side is behind: the page, or the run itself
        shown = page.locator("#run-state").inner_text()
        with orbit_server.client() as http:
            stored = http.get(f"/api/v1/runs/{run}").json().get("state")
        raise AssertionError(f"the page shows {shown!r}, the server says {stored!r}") from None
    assert "terminated" in page.locator("#attempts").inner_text()
    for ref in (run, waiting):
        state = eventually(
            lambda ref=ref: orbit_json(admin_env, "status", ref)["state"] == "terminated", 60
        )
        assert state
    page.goto(f"{orbit_server.url}/ui/")
    shot(page, shots, "overview")
    assert not [e for e in errors if "favicon" not in e], errors
    assert sorted(p.name for p in shots.iterdir()) == [
        "decision.png",
        "nodes.png",
        "overview.png",
        "phone.png",
        "queue.png",
        "run.png",
        "runs.png",
    ]
