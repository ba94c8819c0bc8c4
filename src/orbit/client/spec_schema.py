"""A JSON Schema for spec files (`orbit schema spec`): the spec's own fields, and for each task
type this installation knows (the `orbit.tasks` entry points, third parties' too) the schema of
its `task:` block, chosen by `task_type`. Editors use it to complete and check a spec as it is
typed (VS Code's YAML extension: `# yaml-language-server: $schema=spec.schema.json`).

`orbit submit` still checks a spec itself and says what is wrong in one line; the schema is
what an editor can check before that, not a second set of rules."""

from __future__ import annotations

from typing import Any

from orbit.core.tasks.registry import TaskRegistry
from orbit.model.models import ExecutionOverrides
from orbit.model.spec import SubmitSpec
from orbit.model.task import CommonTaskFields
from orbit.model.version import __version__

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def spec_schema(registry: TaskRegistry | None = None) -> dict[str, Any]:
    tasks = registry or TaskRegistry()
    schema: dict[str, Any] = SubmitSpec.model_json_schema()
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    overrides = ExecutionOverrides.model_json_schema(ref_template="#/$defs/{model}")
    defs.update(overrides.pop("$defs", {}))
    defs["ExecutionOverrides"] = overrides
    props = schema["properties"]
    props["overrides"] = {
        "$ref": "#/$defs/ExecutionOverrides",
        "description": "What the template's allow_overrides lets a spec change.",
    }
    names = tasks.names()
    props["task_type"] = {
        "type": "string",
        "description": "The kind of task: one of the task types installed here.",
        "examples": names,
    }
    common = CommonTaskFields.model_json_schema()
    cases = []
    for name in names:
        model = tasks.plugin(name).request_model
        task = model.model_json_schema(ref_template="#/$defs/{model}", by_alias=True)
        defs.update(task.pop("$defs", {}))
        # the fields every task type takes, which ORBIT handles before the plugin sees it
        task.setdefault("properties", {}).update(common["properties"])
        key = f"task_{name}"
        defs[key] = task
        cases.append(
            {
                "if": {"properties": {"task_type": {"const": name}}, "required": ["task_type"]},
                "then": {"properties": {"task": {"$ref": f"#/$defs/{key}"}}},
            }
        )
    return {
        **schema,
        "$schema": DIALECT,
        "title": "ORBIT run spec",
        "description": "A run spec for `orbit submit SPEC.yaml` (ORBIT "
        f"{__version__}): the experiment, the task type and its task, the template "
        "and the overrides it allows, the retry policy, and the runs it waits for.",
        "allOf": cases,
    }
