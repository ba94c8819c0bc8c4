"""Benchmark: the web console (/ui/) of `orbit server` with 100,000 runs in its store.

Run from the repository root:

    PYTHONPATH=src .venv/bin/python bench/ui.py                     # 100,000 runs, SQLite + PG
    PYTHONPATH=src .venv/bin/python bench/ui.py --quick             # 5,000 runs, fewer samples
    PYTHONPATH=src .venv/bin/python bench/ui.py --databases sqlite --json out.json

The store is seeded as bench/api.py seeds it (its plan_seed and write_seed: --runs runs that were
submitted, launched and ended over the last 90 days, their attempts and hash-chained audit
events, in one batch of inserts; PostgreSQL then VACUUM ANALYZEd) into a scratch SQLite file and
a scratch PostgreSQL database (made and dropped again, from --postgres-url), and a real `orbit
server` process (python -m orbit server, loops on, as deployed) is started on it with
bench/api.py's Server. Every request carries the admin's token (`Authorization: Bearer`, as a
script may fetch a console page). For each database:

 1. pages: GET of each console page, --samples times (50; 15 with --quick) from one httpx
    client, one request at a time on one keep-alive connection after a few untimed, p50 and
    p99 and the server's CPU per request (api.py's http_times), and the page's size once:
    /ui/, /ui/runs, /ui/runs?state=succeeded, /ui/runs?q=<6 hex of a random run's id>,
    /ui/runs?before=<the first page's "older" link> (page 2), /ui/runs/rows, /ui/runs/{id} and
    /ui/runs/{id}/decision of random runs, /ui/queue, /ui/nodes, /ui/fair-share, /ui/audit,
    /ui/admin; beside them the API's GET /api/v1/runs?limit=50 and /api/v1/runs/{id}.
 2. a heavy run page: a tiny run submitted with the CLI (`orbit submit --wait`, command `true`
    on the `local` template), then, once ended, its attempt folder given artifacts/training.log
    of --log-mb MB and artifacts/nvml-audit.jsonl with --audit-hours of 8 GPUs at one line
    each a second, as orbit/runtime/nvml_audit.py writes them (json.dumps, sort_keys); then
    what a browser fetches to show it, --loads times: the page (HTML), /charts.json, and the
    training log's stream (it opens at the last 500 lines) read until its `event: end`; each
    one's time and bytes, their sum (one after the other: a browser overlaps them, so this is
    the longer figure), and the static files the page names once (cacheable). What charts.json
    returns is reported too: GPUs, points per GPU, the time span it covers.
 3. open consoles: a running run (`local`, printing a line a second for 10 min), its attempt
    folder given the same NVML audit; the server's CPU (% of one core, all its threads, from
    /proc/PID/stat as psutil reads it) over --window-s seconds (30) with (a) no console open,
    (b) --consoles (100) listeners on /ui/events, (c) those and as many following the run's
    /ui/runs/{id}/logs/training/stream, (d) those and what the run page's script and htmx also
    do in a browser: charts.json again after the refresh_s it says while the run goes (5 s
    for a short run, up to 30 s for a day-long one), and GET /ui/runs/{id} on each
    `changed` event. Every stream is re-opened when the server ends it (after ~25 s), after
    its `retry:` delay and with Last-Event-ID, as a browser's EventSource does. The consoles
    are one asyncio loop of httpx streams in another process: its CPU is not the server's
    (it is printed beside, with the events each listener got).

Goals (the issue): every page p99 <= 100 ms at 100,000 runs, on SQLite and PostgreSQL; a run
page with a 50 MB log and 24 h of 8-GPU audit samples loads under 1 s and under 2 MB; 100 open
consoles following live runs cost the server under 10% of a core. Every figure comes from this
machine in this run; the load average before and after is printed, as other work on the
machine moves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import html
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

# bench/api.py: the seeded store, the server process and the figures
from api import (
    ORBIT,
    Server,
    add_postgres_url,
    cpu_s,
    database,
    database_kinds,
    http_times,
    idle,
    machine,
    plan_seed,
    sayer,
    serving,
    summary,
    write_seed,
)

from orbit.forensics.series import NVML_MINUTES_BYTES, NVML_TAIL_BYTES, gpu_series
from orbit.runtime.nvml_audit import Minutes
from orbit.store import Store

GOAL_PAGE_P99_MS = 100.0
GOAL_LOAD_S = 1.0
GOAL_LOAD_MB = 2.0
GOAL_CONSOLES_CPU = 10.0  # % of one core
LOG_SPEC = "for i in $(seq 1 600); do echo line $i; sleep 1; done"
TERMINAL = {"succeeded", "failed", "terminated"}
CHARTS_EVERY_S = 5.0  # console.js: charts.json again after its refresh_s (5 s if none)


@dataclass
class Sizes:
    runs: int
    samples: int  # GETs per page
    loads: int  # loads of the heavy run page
    window_s: float  # each CPU window of the open consoles
    consoles: int
    log_mb: float
    audit_hours: float
    gpus: int


def sizes(args: argparse.Namespace) -> Sizes:
    quick = args.quick
    return Sizes(
        runs=args.runs or (5000 if quick else 100_000),
        samples=args.samples or (15 if quick else 50),
        loads=3 if quick else 5,
        window_s=args.window_s or (10.0 if quick else 30.0),
        consoles=args.consoles,
        log_mb=args.log_mb,
        audit_hours=args.audit_hours,
        gpus=8,
    )


def bearer(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


# -- 1. the pages -------------------------------------------------------------------------------


def older_link(server: Server) -> str:
    """The first runs page's "older »" link: the next page, by its cursor."""
    page = httpx.get(f"{server.url}/ui/runs", headers=bearer(server), timeout=60)
    page.raise_for_status()
    found = re.search(r'<a href="([^"]+)" rel="next">', page.text)
    if found is None:
        raise RuntimeError("/ui/runs has no 'older' link")
    return html.unescape(found.group(1))


def page_paths(ids: list[str], rng: random.Random, older: str) -> list[tuple[str, Any]]:
    """(name, a function giving the path of the next sample) for each page measured."""

    def fixed(path: str) -> Callable[[], str]:
        return lambda: path

    def run_id() -> str:
        return rng.choice(ids)

    return [
        ("/ui/", fixed("/ui/")),
        ("/ui/runs", fixed("/ui/runs")),
        ("/ui/runs?state=succeeded", fixed("/ui/runs?state=succeeded")),
        ("/ui/runs?q=<6 hex of an id>", lambda: f"/ui/runs?q={run_id()[4:10]}"),
        ("/ui/runs?before=<older> (page 2)", fixed(older)),
        ("/ui/runs/rows", fixed("/ui/runs/rows")),
        ("/ui/runs/{id}", lambda: f"/ui/runs/{run_id()}"),
        ("/ui/runs/{id}/decision", lambda: f"/ui/runs/{run_id()}/decision"),
        ("/ui/queue", fixed("/ui/queue")),
        ("/ui/nodes", fixed("/ui/nodes")),
        ("/ui/fair-share", fixed("/ui/fair-share")),
        ("/ui/audit", fixed("/ui/audit")),
        ("/ui/admin", fixed("/ui/admin")),
        ("API /api/v1/runs?limit=50", fixed("/api/v1/runs?limit=50")),
        ("API /api/v1/runs/{id}", lambda: f"/api/v1/runs/{run_id()}"),
    ]


def measure_pages(server: Server, ids: list[str], samples: int) -> dict[str, Any]:
    rng = random.Random(2028)
    found: dict[str, Any] = {}
    for name, path in page_paths(ids, rng, older_link(server)):
        one = httpx.get(server.url + path(), headers=bearer(server), timeout=60)
        one.raise_for_status()
        found[name] = {**http_times(server, path, samples, warmup=3), "kb": len(one.content) / 1e3}
    return found


# -- 2. the heavy run page ----------------------------------------------------------------------


def cli_env(server: Server, scratch: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "ORBIT_SERVER": server.url,
        "ORBIT_TOKEN": server.token,
        "ORBIT_HOME": str(scratch / "client-home"),
    }
    env.pop("ORBIT_DATABASE_URL", None)
    return env


def submit(server: Server, scratch: Path, name: str, command: str, wait: bool) -> str:
    """A `command` run on the `local` template, submitted with `orbit submit`; its id."""
    folder = scratch / name
    folder.mkdir()
    spec = folder / "spec.yaml"
    task = f"task: {{command: {json.dumps(command)}}}\n"
    spec.write_text(f"experiment: exp\ntask_type: command\ntemplate: local\n{task}", "utf-8")
    argv = [*ORBIT, "submit", "--json", *(["--wait"] if wait else []), str(spec)]
    done = subprocess.run(
        argv, env=cli_env(server, scratch), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"orbit submit: {done.returncode}: {done.stderr[-2000:]}")
    run_id: str = json.loads(done.stdout)["id"]
    return run_id


def get_run(server: Server, run_id: str) -> dict[str, Any]:
    found = httpx.get(f"{server.url}/api/v1/runs/{run_id}", headers=bearer(server), timeout=60)
    found.raise_for_status()
    run: dict[str, Any] = found.json()
    return run


def attempt_folder(server: Server, run_id: str) -> Path:
    handle = get_run(server, run_id)["attempts"][-1]["handle"]
    return Path(handle["location"])


def write_log(path: Path, megabytes: float, rng: random.Random) -> int:
    """A training log of `megabytes` MB (10^6 bytes): a line a step, as a trainer prints."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size, step, at = 0, 0, datetime.now(UTC) - timedelta(hours=24)
    with path.open("w", encoding="utf-8") as out:
        while size < megabytes * 1e6:
            lines = []
            for _ in range(5000):
                step += 1
                when = (at + timedelta(seconds=step * 0.17)).isoformat(timespec="seconds")
                lines.append(
                    f"{when} INFO train step {step} loss {2.5 / (1 + step / 5e4):.4f} lr 3.0e-04"
                    f" grad_norm {0.5 + rng.random():.3f} tokens/s {180000 + rng.randrange(9999)}"
                    "\n"
                )
            text = "".join(lines)
            out.write(text)
            size += len(text)
    return size


def write_audit(path: Path, hours: float, gpus: int, rng: random.Random) -> int:
    """`hours` of NVML audit up to now, `gpus` lines a second, as nvml_audit.py writes them,
    and its per-minute lines beside (nvml-minutes.jsonl, by nvml_audit.py's own Minutes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    minutes, per_minute = Minutes(), path.with_name("nvml-minutes.jsonl").open("w")
    ticks = int(hours * 3600)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=ticks)
    uuids = [f"GPU-{rng.getrandbits(128):032x}" for _ in range(gpus)]
    lines = 0
    with path.open("w", encoding="utf-8") as out:
        batch: list[str] = []
        records: list[dict[str, Any]] = []
        for tick in range(ticks):
            ts = (start + timedelta(seconds=tick, milliseconds=rng.randrange(1000))).isoformat(
                timespec="milliseconds"
            )
            busy = 85 + (tick // 600) % 15  # a slow wave, and noise per GPU
            for index in range(gpus):
                util = min(100, busy + rng.randrange(-5, 6))
                record = {
                    "ts": ts,
                    "index": index,
                    "uuid": uuids[index],
                    "name": "NVIDIA H100 80GB HBM3",
                    "util_gpu": util,
                    "util_mem": util // 2,
                    "mem_used_mib": 70000 + rng.randrange(4000),
                    "mem_total_mib": 81559,
                    "temp_c": 55 + util // 5,
                    "power_w": round(350 + 3.5 * util + rng.random() * 20, 3),
                    "sm_clock_mhz": 1980,
                    "mem_clock_mhz": 2619,
                    "ecc_volatile_uncorrected": 0,
                    "xid": 0,
                }
                records.append(record)
            batch.extend(json.dumps(record, sort_keys=True) + "\n" for record in records)
            per_minute.write(minutes.add(records))
            records.clear()
            if len(batch) >= 40_000:
                out.write("".join(batch))
                lines += len(batch)
                batch = []
        out.write("".join(batch))
        lines += len(batch)
    per_minute.write(minutes.flush())
    per_minute.close()
    return lines


def timed_get(client: httpx.Client, path: str) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = client.get(path)
    took = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    return took, response


def read_stream(client: httpx.Client, path: str) -> dict[str, Any]:
    """A log's stream read until its `event: end` (or the server ends it): ms, bytes, lines,
    and the ms to its first `log` event (when the page shows the lines)."""
    start = time.perf_counter()
    events: Counter[str] = Counter()
    log_lines, first_ms = 0, -1.0
    with client.stream("GET", path) as response:
        response.raise_for_status()
        kind = "message"
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "log":
                log_lines += 1
            elif line == "":
                events[kind] += 1
                if kind == "log" and first_ms < 0:
                    first_ms = (time.perf_counter() - start) * 1000
                kind = "message"
        received = response.num_bytes_downloaded
    return {
        "ms": (time.perf_counter() - start) * 1000,
        "bytes": received,
        "ended": events["end"] > 0,
        "log_lines": log_lines,
        "first_ms": first_ms,
    }


def chart_figures(found: dict[str, Any]) -> dict[str, Any]:
    gpus = found.get("gpus") or {}
    points = [len(g["data"][0]) for g in gpus.values()]
    spans = [(g["data"][0][-1] - g["data"][0][0]) / 3600 for g in gpus.values() if g["data"][0]]
    return {
        "gpus": len(gpus),
        "points_per_gpu": max(points, default=0),
        "span_h": round(max(spans, default=0.0), 2),
        "loss_points": len((found.get("loss") or [[]])[0]),
    }


def measure_load(server: Server, run_id: str, loads: int) -> dict[str, Any]:
    """What a browser fetches to show the run page, `loads` times after one untimed."""
    stream = f"/ui/runs/{run_id}/logs/training/stream"
    parts: dict[str, list[tuple[float, int]]] = {"html": [], "charts": [], "log": []}
    first_lines: list[float] = []
    totals: list[tuple[float, int]] = []
    with httpx.Client(base_url=server.url, headers=bearer(server), timeout=120) as client:
        cpu0 = 0.0
        for n in range(loads + 1):
            if n == 1:
                cpu0 = cpu_s(server.process)
            html_ms, page = timed_get(client, f"/ui/runs/{run_id}")
            charts_ms, charts = timed_get(client, f"/ui/runs/{run_id}/charts.json")
            log = read_stream(client, stream)
            if not log["ended"]:
                raise RuntimeError(f"{stream} did not end with `event: end`")
            if n == 0:
                continue
            got = [
                (html_ms, page.num_bytes_downloaded),
                (charts_ms, charts.num_bytes_downloaded),
                (log["ms"], log["bytes"]),
            ]
            first_lines.append(log["first_ms"])
            for name, sample in zip(parts, got, strict=True):
                parts[name].append(sample)
            totals.append((sum(ms for ms, _ in got), sum(b for _, b in got)))
        server_cpu = cpu_s(server.process) - cpu0
        static = {}
        for path in re.findall(r'(?:href|src)="(/ui/static/[^"]+)"', page.text):
            ms, response = timed_get(client, path)
            cache = response.headers.get("cache-control", "-")
            static[path] = {"ms": round(ms, 1), "bytes": response.num_bytes_downloaded,
                            "etag": "etag" in response.headers, "cache_control": cache}  # fmt: skip
    static_ms = sum(s["ms"] for s in static.values())
    static_bytes = sum(s["bytes"] for s in static.values())

    def figures(samples: list[tuple[float, int]]) -> dict[str, Any]:
        return {**summary([ms for ms, _ in samples]), "bytes": max(b for _, b in samples)}

    result: dict[str, Any] = {name: figures(samples) for name, samples in parts.items()}
    result["log"]["lines"] = log["log_lines"]
    result["log_first_lines"] = summary(first_lines)
    result["charts"].update(chart_figures(charts.json()))
    result["total"] = figures(totals)
    result["static"] = {"ms": round(static_ms, 1), "bytes": static_bytes, "files": static}
    result["first_visit"] = {
        "ms": round(result["total"]["p50_ms"] + static_ms, 1),
        "bytes": result["total"]["bytes"] + static_bytes,
    }
    result["server_cpu_ms_per_load"] = round(1000 * server_cpu / loads, 1)
    return result


def charts_parse_ms(audit: Path) -> dict[str, Any]:
    """gpu_series over the audit's last NVML_TAIL_BYTES and the per-minute file's last
    NVML_MINUTES_BYTES, here in this process (what charts.json does with them), and the share
    of the whole audit that tail is."""
    size = audit.stat().st_size
    with audit.open("rb") as f:
        f.seek(max(0, size - NVML_TAIL_BYTES))
        tail = f.read()
    whole = audit.with_name("nvml-minutes.jsonl").read_bytes()
    start = time.perf_counter()
    gpu_series(tail, minutes=whole[-NVML_MINUTES_BYTES:])
    took = (time.perf_counter() - start) * 1000
    return {
        "tail_mib": round(len(tail) / 2**20, 1),
        "file_mib": round(size / 2**20, 1),
        "gpu_series_ms": round(took, 1),
        "whole_file_estimate_s": round(took * size / len(tail) / 1000, 1),
    }


# -- 3. open consoles ---------------------------------------------------------------------------


class Consoles:
    """--consoles browsers' live connections in one asyncio loop (in its own process)."""

    def __init__(self, url: str, token: str, run_id: str, count: int) -> None:
        self.url, self.token, self.run_id, self.count = url, token, run_id, count
        self.stats: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.browser = False
        self.tasks: list[asyncio.Task[None]] = []
        self.rng = random.Random(7)

    async def sse(self, client: httpx.AsyncClient, kind: str, path: str) -> None:
        """An EventSource: read events; when the server ends the stream, after `retry:` ms,
        again with Last-Event-ID; closed on `event: end` (as console.js closes the log's)."""
        await asyncio.sleep(self.rng.random() * 3)  # consoles are opened at their own times
        last_id, retry, ended = "", 3.0, False
        while not self.stop.is_set() and not ended:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            opened = False
            try:
                async with client.stream("GET", path, headers=headers) as response:
                    if response.status_code != 200:
                        self.stats[f"{kind}_status_{response.status_code}"] += 1
                        await response.aread()
                    else:
                        opened = True
                        self.stats[f"{kind}_opened"] += 1
                        self.stats[f"{kind}_open"] += 1
                        event, data = "message", 0
                        async for line in response.aiter_lines():
                            if line == "":
                                if data:
                                    self.stats[f"{kind}_event_{event}"] += 1
                                    ended = ended or self.on_event(client, event)
                                event, data = "message", 0
                                continue
                            field, _, value = line.partition(":")
                            value = value[1:] if value.startswith(" ") else value
                            if field == "event":
                                event = value
                            elif field == "data":
                                data += 1
                            elif field == "id":
                                last_id = value
                            elif field == "retry" and value.isdigit():
                                retry = int(value) / 1000
                        self.stats[f"{kind}_bytes"] += response.num_bytes_downloaded
            except httpx.HTTPError as exc:
                self.stats[f"{kind}_error_{type(exc).__name__}"] += 1
            finally:
                if opened:
                    self.stats[f"{kind}_open"] -= 1
            if not ended:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), retry)

    def on_event(self, client: httpx.AsyncClient, event: str) -> bool:
        """True for the end of the log. A `changed` on a run page: htmx fetches the page again
        (hx-get on #run-state), once the browser-like part is on."""
        if event == "changed" and self.browser:
            self.tasks.append(asyncio.create_task(self.fetch(client, f"/ui/runs/{self.run_id}")))
        return event == "end"

    async def fetch(self, client: httpx.AsyncClient, path: str) -> None:
        try:
            start = time.perf_counter()
            response = await client.get(path)
            self.stats["get_ms"] += round((time.perf_counter() - start) * 1000)
            self.stats[f"get_{response.status_code}"] += 1
            self.stats["get_bytes"] += response.num_bytes_downloaded
        except httpx.HTTPError as exc:
            self.stats[f"get_error_{type(exc).__name__}"] += 1

    async def charts(self, client: httpx.AsyncClient) -> None:
        """console.js: charts.json, then again after the refresh_s it says (5 s when it says
        none) until the run has ended."""
        await asyncio.sleep(self.rng.random() * CHARTS_EVERY_S)
        every = CHARTS_EVERY_S
        while not self.stop.is_set():
            try:
                start = time.perf_counter()
                response = await client.get(f"/ui/runs/{self.run_id}/charts.json")
                self.stats["charts_ms"] += round((time.perf_counter() - start) * 1000)
                self.stats[f"charts_{response.status_code}"] += 1
                self.stats["charts_bytes"] += response.num_bytes_downloaded
                said = response.json() if response.status_code == 200 else {}
                if said.get("state") in TERMINAL:
                    return
                every = float(said.get("refresh_s") or CHARTS_EVERY_S)
            except httpx.HTTPError as exc:
                self.stats[f"charts_error_{type(exc).__name__}"] += 1
            with suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), every)

    def start(self, make: Callable[[], Any]) -> None:
        self.tasks += [asyncio.create_task(make()) for _ in range(self.count)]

    async def all_open(self, key: str) -> None:
        deadline = time.monotonic() + 60
        while self.stats[key] < self.count and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def serve(self, commands: Any, answers: Any) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        timeout = httpx.Timeout(60.0, read=90.0)
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(
            base_url=self.url, headers=headers, limits=limits, timeout=timeout
        ) as client:
            stream = f"/ui/runs/{self.run_id}/logs/training/stream"
            while True:
                command = await asyncio.to_thread(commands.get)
                if command == "events":
                    self.start(lambda: self.sse(client, "events", "/ui/events"))
                    await self.all_open("events_open")
                elif command == "logs":
                    self.start(lambda: self.sse(client, "logs", stream))
                    await self.all_open("logs_open")
                elif command == "browser":
                    self.browser = True
                    self.start(lambda: self.charts(client))
                elif command == "stop":
                    self.stop.set()
                    await asyncio.gather(*self.tasks, return_exceptions=True)
                answers.put(dict(self.stats))
                if command == "stop":
                    return


def consoles_process(
    url: str, token: str, run_id: str, count: int, commands: Any, answers: Any
) -> None:
    try:
        asyncio.run(Consoles(url, token, run_id, count).serve(commands, answers))
    except BaseException as exc:
        answers.put({"error": repr(exc)})
        raise


def run_state(server: Server, run_id: str) -> str:
    """The run's current attempt's state ("unknown" while the server does not answer)."""
    try:
        state: str = get_run(server, run_id)["attempts"][-1]["state"]
    except httpx.HTTPError:
        return "unknown"
    return state


def wait_state(server: Server, run_id: str, states: set[str], timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        state = run_state(server, run_id)
        if state in states or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def measure_consoles(
    server: Server, run_id: str, sz: Sizes, say: Callable[[str], None]
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    commands, answers = ctx.Queue(), ctx.Queue()
    client = ctx.Process(
        target=consoles_process,
        args=(server.url, server.token, run_id, sz.consoles, commands, answers),
    )
    client.start()
    assert client.pid is not None
    client_ps = psutil.Process(client.pid)
    result: dict[str, Any] = {"consoles": sz.consoles}

    def ask(command: str) -> dict[str, int]:
        commands.put(command)
        answer: dict[str, int] = answers.get(timeout=120)
        if "error" in answer:
            raise RuntimeError(f"the consoles' process failed: {answer['error']}")
        return answer

    def window(name: str) -> None:
        time.sleep(5)  # the connections settle
        before, client0 = ask("count"), cpu_s(client_ps)
        idle_figures = idle(server.process, sz.window_s)
        after = ask("count")
        client_cpu = round(100 * (cpu_s(client_ps) - client0) / sz.window_s, 1)
        counts = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        counts.update({k: v for k, v in after.items() if k.endswith("_open")})  # open now
        figures: dict[str, Any] = {**idle_figures, "client_cpu_pct": client_cpu, "counts": counts}
        figures["threads"] = server.process.num_threads()
        figures["state"] = run_state(server, run_id)
        result[name] = figures
        say(f"consoles {name}: {figures}")

    try:
        window("none")
        ask("events")
        window("events")
        ask("logs")
        window("events_logs")
        ask("browser")
        window("browser")
        result["final_counts"] = ask("stop")
    finally:
        client.join(timeout=60)
        if client.is_alive():
            client.kill()
            client.join()
    return result


def cancel(server: Server, run_id: str) -> None:
    """Cancel the run (it would outlive the server: a local run is detached), and make sure."""
    with suppress(httpx.HTTPError):
        httpx.post(
            f"{server.url}/api/v1/runs/{run_id}/cancel",
            headers=bearer(server),
            json={},
            timeout=60,
        )
    if wait_state(server, run_id, TERMINAL, timeout_s=180) not in TERMINAL:
        raise RuntimeError(f"{run_id} did not end once cancelled: stop it by hand")


# -- one database -------------------------------------------------------------------------------


@contextmanager
def seeded(kind: str, home: Path, admin_url: str, seed: Any, runs: int) -> Iterator[str]:
    """A new store holding the seed (bench/api.py's write_seed), its URL."""
    with database(kind, home, admin_url) as url:
        store = Store(url)
        try:
            write_seed(store, seed)
            assert store.runs.count_runs() == runs
        finally:
            store.close()
        yield url


def measure_database(
    kind: str,
    sz: Sizes,
    seed: Any,
    files: dict[str, Path],
    admin_url: str,
    say: Callable[[str], None],
) -> dict[str, Any]:
    report: dict[str, Any] = {"loadavg_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix=f"orbit-bench-ui-{kind}-") as scratch_name:
        scratch = Path(scratch_name)
        home = scratch / "home"
        start = time.monotonic()
        with seeded(kind, home, admin_url, seed, sz.runs) as url, serving(home, url) as server:
            say(f"{kind}: seeded {sz.runs:,} runs in {time.monotonic() - start:.1f} s")
            if kind == "postgres":
                store = Store(url)
                with store.db.transaction(write=False) as tx:
                    report["server_version"] = tx.scalar("SHOW server_version")
                store.close()
            try:
                report["pages"] = measure_pages(server, seed.run_ids, sz.samples)
            except httpx.HTTPStatusError:
                say(f"{kind}: the server's log ends:\n{server.log.read_text()[-4000:]}")
                raise
            for name, figures in report["pages"].items():
                say(f"{kind}: {name}: {figures}")

            heavy = submit(server, scratch, "heavy", "true", wait=True)
            folder = attempt_folder(server, heavy)
            for name, source in files.items():
                shutil.copyfile(source, folder / "artifacts" / name)
            report["load"] = measure_load(server, heavy, sz.loads)
            report["load"]["run"] = heavy
            say(f"{kind}: run page {report['load']}")

            live = submit(server, scratch, "live", LOG_SPEC, wait=False)
            try:
                if wait_state(server, live, {"running"} | TERMINAL) != "running":
                    raise RuntimeError(f"{live} is not running: {get_run(server, live)}")
                artifacts = attempt_folder(server, live) / "artifacts"
                for name in ("nvml-audit.jsonl", "nvml-minutes.jsonl"):
                    shutil.copyfile(files[name], artifacts / name)
                report["live"] = measure_consoles(server, live, sz, say)
            finally:
                cancel(server, live)
            report["server_rss_mb"] = round(server.process.memory_info().rss / 1e6, 1)
    report["loadavg_after"] = round(os.getloadavg()[0], 2)
    return report


# -- the report ---------------------------------------------------------------------------------


def rows(db: dict[str, Any]) -> list[list[str]]:
    """[metric, p50 / value, p99, server CPU ms, size, goal, met?] lines of the table."""

    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    out = []
    for name, p in db["pages"].items():
        api = name.startswith("API")
        ok = met(p["p99_ms"] <= GOAL_PAGE_P99_MS) if not api else ""
        out.append([name, f"{p['p50_ms']:.1f}", f"{p['p99_ms']:.1f}",
                    f"{p['server_cpu_ms_each']:.1f}", f"{p['kb']:.1f} kB",
                    "" if api else "<= 100", ok])  # fmt: skip
    load = db["load"]
    for name, label in (("html", "GET /ui/runs/{id}"), ("charts", "  charts.json"),
                        ("log", "  log stream to `end`")):  # fmt: skip
        part = load[name]
        out.append([f"heavy run: {label}", f"{part['p50_ms']:.1f}", f"{part['p99_ms']:.1f}",
                    "", f"{part['bytes'] / 1e3:.1f} kB", "", ""])  # fmt: skip
    lines = load["log_first_lines"]
    out.append(["    its first `log` event (500 lines)", f"{lines['p50_ms']:.1f}",
                f"{lines['p99_ms']:.1f}", "", "", "", ""])  # fmt: skip
    total, static, first = load["total"], load["static"], load["first_visit"]
    out.append(["heavy run: the three, one after another", f"{total['p50_ms']:.1f}",
                f"{total['p99_ms']:.1f}", f"{load['server_cpu_ms_per_load']:.1f}",
                f"{total['bytes'] / 1e3:.1f} kB", "", ""])  # fmt: skip
    out.append([f"  static files ({len(static['files'])}, once)", f"{static['ms']:.1f}", "", "",
                f"{static['bytes'] / 1e3:.1f} kB", "", ""])  # fmt: skip
    ok = first["ms"] < GOAL_LOAD_S * 1000 and first["bytes"] < GOAL_LOAD_MB * 1e6
    out.append(["  first visit (p50 + static)", f"{first['ms']:.1f}", "", "",
                f"{first['bytes'] / 1e3:.1f} kB", "< 1 s, < 2 MB", met(ok)])  # fmt: skip
    live = db["live"]
    n = live["consoles"]
    for key, label, goal in (("none", "0 consoles (1 running run)", ""),
                             ("events", f"{n} x /ui/events", ""),
                             ("events_logs", f"{n} x (/ui/events + log stream)", "< 10"),
                             ("browser", "  + charts, page on `changed`", "< 10")):  # fmt: skip
        cpu = live[key]["cpu_pct"]
        out.append([f"server CPU %: {label}", f"{cpu:.1f}", "", "", "", goal,
                    met(cpu < GOAL_CONSOLES_CPU) if goal else ""])  # fmt: skip
    return out


def print_table(kind: str, sz: Sizes, db: dict[str, Any]) -> None:
    version = f" {db['server_version']}" if "server_version" in db else ""
    print(
        f"\n{kind}{version}: {sz.runs:,} runs in the store; {sz.samples} samples a page; load "
        f"average {db['loadavg_before']} before, {db['loadavg_after']} after; server RSS "
        f"{db['server_rss_mb']} MB at the end"
    )
    head = ["page / figure", "p50 ms", "p99 ms", "CPU ms", "size", "goal", "met?"]
    widths = [42, 8, 8, 7, 10, 14, 4]
    for row in [head, *rows(db)]:
        cells = zip(row, widths, strict=True)
        print(" ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(cells)))
    charts = db["load"]["charts"]
    print(
        f"  charts.json: {charts['gpus']} GPUs, {charts['points_per_gpu']} points each over "
        f"{charts['span_h']} h (of the audit's {sz.audit_hours:g} h); log stream: "
        f"{db['load']['log']['lines']} lines"
    )
    for key in ("events", "events_logs", "browser"):
        w = db["live"][key]
        print(f"  {key}: client CPU {w['client_cpu_pct']}%, server threads {w['threads']}, "
              f"in {w['seconds']} s: {w['counts']}")  # fmt: skip


def code_version() -> str:
    """The commit the server runs from, and how many files under src/ differ from it."""
    repo = Path(__file__).resolve().parents[1]

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip()

    changed = len(git("status", "--porcelain", "--", "src").splitlines())
    return f"{git('rev-parse', '--short', 'HEAD')} ({changed} files changed under src/)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs in the store (100,000)")
    parser.add_argument("--quick", action="store_true", help="5,000 runs, fewer samples")
    parser.add_argument("--databases", default="sqlite,postgres", help="sqlite,postgres")
    parser.add_argument("--samples", type=int, default=None, help="GETs a page (50)")
    parser.add_argument("--window-s", type=float, default=None, help="each CPU window (30)")
    parser.add_argument("--consoles", type=int, default=100, help="open consoles (100)")
    parser.add_argument("--log-mb", type=float, default=50.0, help="the heavy run's log (50)")
    parser.add_argument("--audit-hours", type=float, default=24.0, help="its NVML audit (24)")
    add_postgres_url(parser)
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = parser.parse_args()
    kinds = database_kinds(parser, args.databases)
    sz = sizes(args)
    began = time.monotonic()
    say = sayer(began)
    result: dict[str, Any] = {"sizes": sz.__dict__, "machine_before": machine(), "databases": {}}
    result["code"] = code_version()

    with tempfile.TemporaryDirectory(prefix="orbit-bench-ui-files-") as files_dir:
        rng = random.Random(20281)
        files = {
            "training.log": Path(files_dir) / "training.log",
            "nvml-audit.jsonl": Path(files_dir) / "nvml-audit.jsonl",
            "nvml-minutes.jsonl": Path(files_dir) / "nvml-minutes.jsonl",
        }
        size = write_log(files["training.log"], sz.log_mb, rng)
        lines = write_audit(files["nvml-audit.jsonl"], sz.audit_hours, sz.gpus, rng)
        result["heavy_files"] = {
            "training_log_bytes": size,
            "nvml_audit_lines": lines,
            "nvml_audit_bytes": files["nvml-audit.jsonl"].stat().st_size,
            "nvml_minutes_bytes": files["nvml-minutes.jsonl"].stat().st_size,
            "charts_parse": charts_parse_ms(files["nvml-audit.jsonl"]),
        }
        say(f"wrote the heavy run's files: {result['heavy_files']}")

        start = time.monotonic()
        gc.disable()  # as bench/api.py: millions of long-lived objects
        seed = plan_seed(sz.runs, random.Random(20261123))
        seed.chain()
        gc.freeze()
        gc.enable()
        took = time.monotonic() - start
        say(f"planned {sz.runs:,} runs, {len(seed.chained):,} events in {took:.1f} s")
        for kind in kinds:
            result["databases"][kind] = measure_database(
                kind, sz, seed, files, args.postgres_url, say
            )
    result["machine_after"] = machine()
    result["seconds"] = round(time.monotonic() - began, 1)

    m0, m1, heavy = result["machine_before"], result["machine_after"], result["heavy_files"]
    print(
        f"\n{m0['cpus']} CPUs ({m0['cpu']}), Python {m0['python']}, SQLite {m0['sqlite']}; load "
        f"average {m0['loadavg'][0]} before, {m1['loadavg'][0]} after; {result['seconds']:.0f} s"
        f" in all; code {result['code']}.\nHeavy run: training.log "
        f"{heavy['training_log_bytes'] / 1e6:.1f} MB, NVML "
        f"audit {heavy['nvml_audit_lines']:,} lines ({heavy['nvml_audit_bytes'] / 1e6:.0f} MB); "
        f"gpu_series over its last {heavy['charts_parse']['tail_mib']} MiB: "
        f"{heavy['charts_parse']['gpu_series_ms']} ms here (the whole file, at that rate: "
        f"~{heavy['charts_parse']['whole_file_estimate_s']} s)"
    )
    for kind, db in result["databases"].items():
        print_table(kind, sz, db)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
