"""`orbit schema spec`: a JSON Schema (draft 2020-12) that every example spec of this repo
meets, and that catches what an editor should flag: an unknown key, a task block that is not
its task type's, a value of the wrong kind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.helpers import orbit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("home")
    printed = orbit({**os.environ, "ORBIT_HOME": str(home)}, "schema", "spec")
    found: dict[str, Any] = json.loads(printed.stdout)
    jsonschema.Draft202012Validator.check_schema(found)
    return found


def problems(schema: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(spec)]


@pytest.mark.parametrize("path", sorted(ROOT.glob("examples/*/spec.yaml")), ids=str)
def test_every_example_spec_meets_the_schema(schema: dict[str, Any], path: Path) -> None:
    assert problems(schema, yaml.safe_load(path.read_text())) == []


def test_what_an_editor_should_flag_is_flagged(schema: dict[str, Any]) -> None:
    good = {"experiment": "e", "task_type": "http", "template": "pool",
            "task": {"service": "vllm", "path": "/v1/completions", "concurrency": 4}}  # fmt: skip
    assert problems(schema, good) == []
    assert any("tempalte" in p for p in problems(schema, {**good, "tempalte": "x"}))
    wrong_kind = {**good, "task": {**good["task"], "concurrency": "four"}}
    assert any("'four'" in p for p in problems(schema, wrong_kind))
    not_http = {**good, "task": {"command": "echo hi"}}  # a command task's block under http
    assert any("command" in p for p in problems(schema, not_http))
    assert problems(schema, {**good, "task_type": "command", "task": {"command": "x"}}) == []
    assert schema["title"] == "ORBIT run spec"
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
