"""Content-addressed submits, counted at a real `orbit server`: the real CLI names the inputs it
gathered by their digest first, and sends them only when the server does not hold them for
that user. A resubmit of unchanged code (or another task over the same files, or a sweep of
them) moves no payload byte; one changed file, another user, or inputs whose bundle was
deleted make the archive go again; and the bundle made without an upload holds the same
bytes as one made from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_server import token_for


def counted(server: Server) -> tuple[float, float]:
    """(payload bytes received, submissions served from held inputs), from /metrics."""
    with server.client() as http:
        text = http.get("/metrics").text
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return values["orbit_inputs_received_bytes_total"], values["orbit_inputs_reused_total"]


def test_unchanged_inputs_are_named_not_sent_and_only_to_the_user_who_sent_them(
    orbit_server: Server, tmp_path: Path
) -> None:
    work = tmp_path / "wd"
    work.mkdir()
    (work / "weights.bin").write_bytes(os.urandom(300_000))  # incompressible: it shows
    (work / "train.py").write_text("print('step')\n")
    spec = write_spec(tmp_path, task={"command": "cat train.py", "workdir": "wd"})
    env = orbit_server.env()
    before, _ = counted(orbit_server)

    first = orbit_json(env, "submit", str(spec), "--wait")
    sent, reused = counted(orbit_server)
    assert sent - before > 300_000 and reused == 0  # the first time, the archive goes

    # the same spec again, and another task over the same files: nothing is sent
    again = orbit_json(env, "submit", str(spec), "--wait")
    other = write_spec(
        tmp_path, name="other.yaml", task={"command": "wc -c weights.bin", "workdir": "wd"}
    )
    third = orbit_json(env, "submit", str(other), "--wait")
    assert counted(orbit_server) == (sent, reused + 2)
    assert again["bundle"]["digest"] == first["bundle"]["digest"]
    assert "300000 weights.bin" in orbit(env, "logs", third["id"]).stdout
    bundles = orbit_server.home / "bundles"
    made = bundles / third["bundle"]["digest"] / "inputs" / "workdir"
    assert (made / "weights.bin").read_bytes() == (work / "weights.bin").read_bytes()

    # a sweep of them: nothing is sent either
    task = {"command": "wc -c weights.bin", "workdir": "wd", "env": {"SEED": "{seed}"}}
    swept = write_spec(tmp_path, name="sweep.yaml", task=task)
    group = orbit_json(env, "submit", str(swept), "--sweep", "seed=0..2")
    assert group["size"] == 3
    assert counted(orbit_server) == (sent, reused + 3)

    # held in the newest bundle of them: the first one's runs deleted, still nothing is sent
    orbit(env, "runs", "delete", first["id"], again["id"])
    assert not (bundles / first["bundle"]["digest"]).exists()
    orbit_json(env, "submit", str(other))
    assert counted(orbit_server) == (sent, reused + 4)

    # one file changed: sent again, whole
    (work / "train.py").write_text("print('step 2')\n")
    changed = orbit_json(env, "submit", str(spec), "--wait")
    sent_now, _ = counted(orbit_server)
    assert sent_now - sent > 300_000
    assert "step 2" in orbit(env, "logs", changed["id"]).stdout

    # another user with the very same files: a miss for them (they never sent those bytes)
    ann = orbit_server.env(token_for(orbit_server, "ann", "member"))
    pool = write_spec(
        tmp_path, name="pool.yaml", template="pool", task={"command": "true", "workdir": "wd"}
    )
    orbit_json(ann, "submit", str(pool))
    sent_ann, reused_ann = counted(orbit_server)
    assert sent_ann - sent_now > 300_000 and reused_ann == reused + 4
    orbit_json(ann, "submit", str(pool))  # and theirs from now on
    assert counted(orbit_server) == (sent_ann, reused_ann + 1)

    # the bundle that held them deleted: gc forgets them, the next submit sends them again
    orbit(env, "runs", "delete", changed["id"])
    assert not (bundles / changed["bundle"]["digest"]).exists()
    index = orbit_server.home / "inputs-index"
    held = {e: json.loads(e.read_text())["bundle"] for e in index.glob("*/*.json")}
    assert changed["bundle"]["digest"] in held.values()
    orbit(env, "gc")
    left = {e: json.loads(e.read_text())["bundle"] for e in index.glob("*/*.json")}
    assert left == {e: b for e, b in held.items() if b != changed["bundle"]["digest"]}
    assert all((bundles / b).is_dir() for b in left.values()) and len(left) >= 2
    orbit_json(env, "submit", str(spec), "--wait")
    assert counted(orbit_server)[0] - sent_ann > 300_000
    assert list(bundles.glob(".inputs-*")) == []  # no scratch folder left behind
