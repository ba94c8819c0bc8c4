"""Third-party task types arrive through the `orbit.tasks` entry-point group of an installed
distribution; here a real one is put on sys.path as a .dist-info folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit.core.tasks import TaskRegistry
from orbit.model.errors import InvalidInput

PLUGIN = """
from typing import ClassVar
from pydantic import BaseModel
from orbit.model.task import ShapedTask


class EchoRequest(BaseModel):
    text: str


class EchoTask:
    name: ClassVar[str] = "echo"
    request_model: ClassVar[type[BaseModel]] = EchoRequest

    def shape(self, request, base_dir):
        return ShapedTask(entrypoint=("echo", request.text), request=request.model_dump())
"""


@pytest.fixture
def installed_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "orbit_echo_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "orbit_echo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: orbit-echo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[orbit.tasks]\necho = orbit_echo_plugin:EchoTask\nbroken = no_such_module:Task\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_an_installed_plugin_is_found_by_name(installed_plugins: None, tmp_path: Path) -> None:
    registry = TaskRegistry()
    assert {"command", "python", "echo", "broken"} <= set(registry.names())
    shaped = registry.shape("echo", {"text": "hi"}, tmp_path, "spec.yaml")
    assert shaped.entrypoint == ("echo", "hi")
    with pytest.raises(InvalidInput, match=r"spec.yaml: task.text: Field required"):
        registry.shape("echo", {}, tmp_path, "spec.yaml")


def test_a_broken_plugin_breaks_only_its_own_task_type(
    installed_plugins: None, tmp_path: Path
) -> None:
    registry = TaskRegistry()
    with pytest.raises(InvalidInput, match=r"task type 'broken': its plugin no_such_module:Task"):
        registry.plugin("broken")
    assert registry.shape("command", {"command": "true"}, tmp_path, "s").entrypoint[0] == "bash"
