"""A run's GPU charts through a real `orbit server`, on both stores: the whole of a long run
(the audit's per-minute lines before its per-second tail), a zoom into an hour long past drawn
second by second (charts.json?from=&to=), and a zoom asked for wrongly refused in one line."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orbit.runtime.nvml_audit import Minutes
from tests.helpers import orbit_json, write_spec
from tests.orbit_server import Server

HOURS = 3


def write_audit(artifacts: Path, end: datetime) -> datetime:
    """HOURS of 2 GPUs a second up to `end`, and their minutes, as nvml_audit.py writes them."""
    start = end - timedelta(hours=HOURS)
    minutes = Minutes()
    with (
        (artifacts / "nvml-audit.jsonl").open("w") as out,
        (artifacts / "nvml-minutes.jsonl").open("w") as per_minute,
    ):
        for s in range(HOURS * 3600):
            ts = (start + timedelta(seconds=s)).isoformat(timespec="milliseconds")
            records = [
                {"ts": ts, "index": g, "name": "NVIDIA H200", "util_gpu": s % 100,
                 "mem_used_mib": 1024 * (g + 1), "power_w": 300.0, "temp_c": 60, "xid": 0}
                for g in range(2)
            ]  # fmt: skip
            out.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            per_minute.write(minutes.add(records))
        per_minute.write(minutes.flush())
    return start


def test_the_whole_run_is_charted_and_a_zoom_draws_every_second(
    orbit_server: Server, tmp_path: Path
) -> None:
    env = orbit_server.env()
    run = orbit_json(env, "submit", str(write_spec(tmp_path)), "--wait")["id"]
    with orbit_server.client() as http:
        found = http.get(f"/api/v1/runs/{run}").json()
        artifacts = Path(found["attempts"][-1]["handle"]["location"]) / "artifacts"
        start = write_audit(artifacts, datetime.now(UTC).replace(microsecond=0))
        whole = http.get(f"/ui/runs/{run}/charts.json").json()
        xs = whole["gpus"]["0"]["data"][0]
        assert xs[0] < start.timestamp() + 120 and xs[-1] > start.timestamp() + HOURS * 3600 - 30
        assert len(xs) <= 1200 and sorted(whole["gpus"]) == ["0", "1"]
        # an hour long past, 20 minutes of it, every second
        begin = start.timestamp() + 3600
        zoom = http.get(f"/ui/runs/{run}/charts.json", params={"from": begin, "to": begin + 1200})
        assert zoom.status_code == 200, zoom.text
        xs, util, mem, *_ = zoom.json()["gpus"]["1"]["data"]
        assert len(xs) == 1201 and xs[0] == begin and xs[-1] == begin + 1200
        assert util[:2] == [3600 % 100, 3601 % 100] and set(mem) == {2.0}
        for params, says in (
            ({"from": begin}, "from, to: a zoom names both ends"),
            ({"from": begin, "to": begin + 7200}, "a zoom at full resolution spans at most"),
            ({"from": begin, "to": begin - 1}, "is not after from"),
        ):
            refused = http.get(f"/ui/runs/{run}/charts.json", params=params)
            assert refused.status_code in (400, 422) and says in refused.text, refused.text
        bad = http.get(f"/ui/runs/{run}/charts.json", params={"from": "noon", "to": 1})
        assert bad.status_code in (400, 422) and "Traceback" not in bad.text
