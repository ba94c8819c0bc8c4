"""Words that match the tool, through the real CLI (embedded and against a real server): a
misspelt key is named with the nearest known one, at every level of a spec, and `orbit submit
--template NAME` runs a spec with another template than its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import env, orbit, orbit_json, store_of
from tests.helpers import eventually

__all__ = ["env"]  # the fixture: embedded, then through a real `orbit server`

SPEC = {"experiment": "e", "task_type": "command", "template": "local", "task": {"command": "x"}}
MISSPELT = {
    "top level": (
        {"tsk": {"command": "x"}},
        "task",
        "spec.yaml: tsk: unknown key; did you mean task?",
    ),
    "task": (
        {"task": {"command": "x", "workdri": "."}},
        None,
        "spec.yaml: task.workdri: unknown key; did you mean workdir?",
    ),
    "a key every task takes": (
        {"task": {"command": "x", "critical_import": ["torch"]}},
        None,
        "spec.yaml: task.critical_import: unknown key; did you mean critical_imports?",
    ),
    "retry": (
        {"retry": {"max_retry": 1}},
        None,
        "spec.yaml: retry.max_retry: unknown key; did you mean max_retries?",
    ),
    "overrides": (
        {"overrides": {"resources": {"cpu_cont": 2}}},
        None,
        "spec.yaml: overrides: resources.cpu_cont: unknown key; did you mean cpu_count?",
    ),
    "nothing near": (
        {"colour": "blue"},
        None,
        "spec.yaml: colour: unknown key (known: after, experiment, overrides, preemptible, "
        "priority, retry, secrets, sweep, task, task_type, template)",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSPELT))
def test_a_misspelt_key_is_named_with_the_nearest_known_one(
    env: dict[str, str], tmp_path: Path, case: str
) -> None:
    changes, dropped, line = MISSPELT[case]
    data = {k: v for k, v in SPEC.items() if k != dropped} | changes
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = orbit(env, "submit", str(spec), check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"orbit: error: {spec}: {line.split(': ', 1)[1]}"]
    store = store_of(env)
    try:
        assert store.runs.list_runs() == []
    finally:
        store.close()


def test_submit_template_runs_the_spec_with_another_template(
    env: dict[str, str], tmp_path: Path
) -> None:
    # the spec's own template (pool) would wait for agents; --template local runs it here
    spec = tmp_path / "spec.yaml"
    data = {**SPEC, "template": "pool", "task": {"command": "echo here"}}
    spec.write_text(yaml.safe_dump(data), encoding="utf-8")
    run = orbit_json(env, "submit", str(spec), "--template", "local", "--wait")
    assert run["template_id"] == "local" and run["state"] == "succeeded"
    assert run["request"]["placement"]["kind"] == "local"
    assert orbit(env, "logs", run["id"]).stdout == "here\n"
    # a spec may leave its template to the command line
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({k: v for k, v in SPEC.items() if k != "template"}))
    plan = orbit_json(env, "submit", str(bare), "-t", "local", "--dry-run")
    assert plan["template_id"] == "local"
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "succeeded")


@pytest.mark.parametrize(
    ("spec", "args", "expected"),
    [
        # overrides (the spec's and --set's) are checked against the template chosen
        (
            {"overrides": {"target": "h1"}},
            ["--template", "local"],
            r"override 'target' is not allowed by template 'local'",
        ),
        (
            {},
            ["--template", "local", "--set", "target=h1"],
            r"override 'target' is not allowed by template 'local'",
        ),
        (
            {},
            ["--template", "targon-rental-host"],
            r"template 'targon-rental-host' runs on a registered SSH host: give one with "
            r"--set target=NAME",
        ),
        ({}, ["--template", "nope"], r"unknown template 'nope'"),
        (
            {},
            ["--set", "template=local"],
            r"--set 'template=local': the template is not an override; use --template local",
        ),
    ],
)
def test_submit_template_and_set_refusals_are_one_line(
    env: dict[str, str], tmp_path: Path, spec: dict[str, object], args: list[str], expected: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "template": "pool", **spec}), encoding="utf-8")
    proc = orbit(env, "submit", str(path), *args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(expected, lines[0]), proc.stderr
