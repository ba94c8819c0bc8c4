"""The task registry: built-in plugins plus whatever the `orbit.tasks` entry points add."""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orbit.model.errors import InvalidInput, NotFound, describe_validation_error
from orbit.model.models import ExecutionRequest
from orbit.model.task import COMMON_KEYS, IMPORT_NAME, CommonTaskFields, ShapedTask, TaskPlugin

ENTRY_POINT_GROUP = "orbit.tasks"


Loader = type[TaskPlugin] | EntryPoint


def _discover() -> dict[str, Loader]:
    """Built-ins, then the entry points, which stay unloaded until their type is asked for:
    one broken third-party plugin must not break every other task type."""
    from orbit.core.tasks.command import CommandTask
    from orbit.core.tasks.http import HttpTask
    from orbit.core.tasks.python import PythonTask
    from orbit.core.tasks.swift import SwiftTask
    from orbit.core.tasks.torchrun import TorchrunTask

    found: dict[str, Loader] = {"command": CommandTask, "python": PythonTask, "http": HttpTask}
    found["torchrun"] = TorchrunTask
    found["swift"] = SwiftTask
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        builtin = found.get(ep.name)
        if (
            not isinstance(builtin, type)
            or ep.value != f"{builtin.__module__}:{builtin.__qualname__}"
        ):
            found[ep.name] = ep
    return found


class TaskRegistry:
    """Task plugins by name. The entry points are looked up on first use: a command that
    submits nothing never reads the installed packages' metadata."""

    def __init__(self, plugins: dict[str, type[TaskPlugin]] | None = None) -> None:
        self._found: dict[str, Loader] | None = dict(plugins) if plugins is not None else None

    @property
    def _plugins(self) -> dict[str, Loader]:
        if self._found is None:
            self._found = _discover()
        return self._found

    def names(self) -> list[str]:
        return sorted(self._plugins)

    def plugin(self, task_type: str) -> TaskPlugin:
        try:
            plugin = self._plugins[task_type]
        except KeyError:
            known = ", ".join(self.names())
            raise NotFound(f"unknown task type '{task_type}' (known: {known})") from None
        if isinstance(plugin, EntryPoint):
            try:
                plugin = self._plugins[task_type] = plugin.load()
            except Exception as exc:
                raise InvalidInput(
                    f"task type '{task_type}': its plugin {plugin.value} "
                    f"(entry point group {ENTRY_POINT_GROUP}) failed to load: {exc}"
                ) from None
        return plugin()  # outside the try: a KeyError of the plugin's own is not "unknown"

    def shape(self, task_type: str, raw: dict[str, Any], base_dir: Path, source: str) -> ShapedTask:
        """Validate `raw` with the plugin's model and shape it. Errors name `task.<field>`.
        The fields every task shares (CommonTaskFields) are not the plugin's to see."""
        plugin = self.plugin(task_type)
        return plugin.shape(self._request(plugin, raw, source), base_dir)

    def selector(self, task_type: str, raw: dict[str, Any], source: str) -> dict[str, str]:
        """Labels a node must have for the task (a plugin's optional `selector(request)`: the
        `http` task asking for a model server by name), {} for most."""
        plugin = self.plugin(task_type)
        wants = getattr(plugin, "selector", None)
        return dict(wants(self._request(plugin, raw, source))) if wants else {}

    def check_resources(
        self, task_type: str, raw: dict[str, Any], source: str, request: ExecutionRequest
    ) -> None:
        """What needs the placement (the template with its overrides): a plugin's optional
        `check_placement(request, execution_request)`, with its alternatives as they are (the
        `torchrun` task's processes per node against each one's GPUs, the `swift` task's GRPO
        batch over its processes)."""
        plugin = self.plugin(task_type)
        placement = getattr(plugin, "check_placement", None)
        if placement is not None:
            placement(self._request(plugin, raw, source), request)

    def service_field(self, task_type: str) -> str:
        """The request field that names a model server (a plugin's `service_field`), for the
        refusals that say none is there."""
        return str(getattr(self.plugin(task_type), "service_field", "task.service"))

    @staticmethod
    def _request(plugin: TaskPlugin, raw: dict[str, Any], source: str) -> BaseModel:
        own = {k: v for k, v in raw.items() if k not in COMMON_KEYS}
        return _validate(plugin.request_model, own, source, tuple(COMMON_KEYS))

    @staticmethod
    def common_fields(raw: dict[str, Any], source: str) -> CommonTaskFields:
        shared = {k: v for k, v in raw.items() if k in COMMON_KEYS}
        common = _validate(CommonTaskFields, shared, source)
        assert isinstance(common, CommonTaskFields)
        for index, name in enumerate(common.critical_imports):
            if not re.match(IMPORT_NAME, name):
                raise InvalidInput(
                    f"{source}: task.critical_imports.{index}: '{name}' is not an import name "
                    "(expected e.g. torch, transformers, swift)"
                )
        return common


def _validate(
    model: type[BaseModel], data: dict[str, Any], source: str, also: tuple[str, ...] = ()
) -> BaseModel:
    """`also`: the keys every task type takes beside the model's own (named when near)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        line = describe_validation_error(source, exc, model, also)
        raise InvalidInput(line.replace(f"{source}: ", f"{source}: task.", 1)) from None
