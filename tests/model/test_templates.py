"""Execution templates: the built-ins, the user's folders (later wins), and one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit.core.execution.service import ExecutionService, canonical_placement
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import ExecutionOverrides
from orbit.model.overrides import parse_overrides, resolve
from orbit.model.templates import (
    TemplateRegistry,
    builtin_dir,
    default_search_path,
    load_template_file,
)

GOOD = """\
id: {id}
description: {description}
placement:
  kind: ssh
  port: 2222
launch_mode:
  kind: docker
defaults:
  target: box-1
  resources:
    gpu_count: 2
allow_overrides: [target, resources.gpu_count]
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def registry(orbit_home: Path) -> TemplateRegistry:
    """The registry as a user gets it: built-ins, ./execution_templates/, $ORBIT_HOME/templates/."""
    settings = Settings.from_env()
    assert settings.home == orbit_home
    return TemplateRegistry(default_search_path(settings.templates_dir, Path.cwd()))


def test_builtins_load() -> None:
    reg = TemplateRegistry([builtin_dir()])
    assert {"local", "targon-rental-host"} <= set(reg.ids())

    local = reg.get("local")
    assert local.placement.kind == "local"
    assert local.launch_mode.kind == "host_process"
    assert local.defaults.target == "localhost"
    assert local.defaults.resources.gpu_count == 0
    assert "target" not in local.allow_overrides
    assert Path(reg.source("local").path) == builtin_dir() / "local.yaml"

    rental = reg.get("targon-rental-host")
    assert rental.placement.kind == "targon_rental"  # the ssh placement's original name
    assert rental.defaults.target == ""  # none: the user names the host
    assert {"target", "resources"} <= set(rental.allow_overrides)
    assert [s.template.id for s in reg.all()] == reg.ids()


def test_user_folders_add_templates_and_the_later_one_wins(orbit_home: Path) -> None:
    cwd_file = write(
        Path.cwd() / "execution_templates", "box.yaml", GOOD.format(id="box", description="cwd")
    )
    only_cwd = write(
        Path.cwd() / "execution_templates", "mine.yml", GOOD.format(id="mine", description="cwd")
    )
    reg = registry(orbit_home)
    assert reg.get("box").description == "cwd"
    assert reg.source("box").path == str(cwd_file)
    assert reg.get("box").placement.model_dump() == {"kind": "ssh", "port": 2222}
    assert reg.get("box").defaults.resources.gpu_count == 2
    assert reg.get("box").defaults.resources.cpu_count == 1  # a default of the model
    assert reg.source("mine").path == str(only_cwd)
    assert {"local", "targon-rental-host", "box", "mine"} <= set(reg.ids())

    home_file = write(
        orbit_home / "templates", "box.yaml", GOOD.format(id="box", description="home")
    )
    # $ORBIT_HOME/templates/ comes last, so it wins over ./execution_templates/ ...
    write(orbit_home / "templates", "local.yaml", GOOD.format(id="local", description="mine"))
    reg = registry(orbit_home)
    assert reg.get("box").description == "home"
    assert reg.source("box").path == str(home_file)
    assert reg.source("mine").path == str(only_cwd)
    # ... and both win over a built-in of the same id.
    assert reg.get("local").description == "mine"
    assert reg.source("local").path == str(orbit_home / "templates" / "local.yaml")


def test_missing_folders_are_fine(tmp_path: Path) -> None:
    reg = TemplateRegistry([builtin_dir(), tmp_path / "nope", tmp_path / "nor-this"])
    assert "local" in reg.ids()


def test_unknown_id_is_not_found_listing_the_known(orbit_home: Path) -> None:
    write(orbit_home / "templates", "box.yaml", GOOD.format(id="box", description="x"))
    reg = registry(orbit_home)
    with pytest.raises(NotFound) as info:
        reg.get("lcoal")
    message = str(info.value)
    assert "'lcoal'" in message
    for known in reg.ids():
        assert known in message
    assert "box, local" in message  # sorted
    with pytest.raises(NotFound, match=r"known: none"):
        TemplateRegistry([]).source("local")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id: [unclosed\nplacement: {kind: ssh\n", "invalid YAML at line"),
        ("id: a\n  placement: b: c\n", "invalid YAML"),
        ("- id\n- placement\n", "expected a mapping at the top level, got list"),
        ("just a sentence\n", "expected a mapping at the top level, got str"),
        (GOOD.format(id="bad", description="x") + "colour: blue\n", "colour: unknown key"),
        (
            GOOD.format(id="bad", description="x").replace("gpu_count: 2", "gpu_cont: 2"),
            "defaults.resources.gpu_cont: unknown key",
        ),
        (
            GOOD.format(id="bad", description="x").replace("target: box-1", "stop_grace_s: soon"),
            "defaults.stop_grace_s: Input should be a valid number",
        ),
        (
            GOOD.format(id="bad", description="x").replace("kind: docker", "kind: Docker!"),
            "launch_mode.kind: String should match pattern",
        ),
        (
            GOOD.format(id="bad", description="x").replace(
                "allow_overrides: [target, resources.gpu_count]", "allow_overrides: 5"
            ),
            "allow_overrides: Input should be a valid tuple",
        ),
        (
            GOOD.format(id="bad", description="x").replace(
                "allow_overrides: [target, resources.gpu_count]", "allow_overrides: [resource]"
            ),
            "allow_overrides: 'resource' is not a field a submission can override (known: target,",
        ),
        ("", "id: Field required"),
        (GOOD.format(id="other", description="x"), "id: 'other' must match the file name 'bad'"),
    ],
    ids=[
        "yaml-flow",
        "yaml-mapping",
        "list",
        "scalar",
        "unknown-key",
        "unknown-nested-key",
        "wrong-type",
        "bad-pattern",
        "wrong-list",
        "misspelled-override",
        "empty",
        "id-mismatch",
    ],
)
def test_a_bad_template_is_one_line_naming_file_and_field(
    orbit_home: Path, text: str, expected: str
) -> None:
    write(orbit_home / "templates", "ok.yaml", GOOD.format(id="ok", description="x"))
    path = write(Path.cwd() / "execution_templates", "bad.yaml", text)
    reg = registry(orbit_home)
    assert reg.get("ok").id == "ok"  # a broken file breaks only its own template
    with pytest.raises(InvalidInput) as info:
        reg.get("bad")
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert expected in message, message
    assert "\n" not in message


def test_an_id_that_is_not_a_name_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a b.yaml", GOOD.format(id="'a b'", description="x"))
    with pytest.raises(InvalidInput, match=r"a b\.yaml: id: String should match pattern"):
        TemplateRegistry([tmp_path]).get("a b")


# ORBIT's original write-up publishes this file; a user who copies it must get it to run
PUBLISHED_TARGON_TEMPLATE = """\
id: targon-rental-host
description: Run a bundle directly on a registered Targon rental machine host process.
placement:
  kind: targon_rental
launch_mode:
  kind: host_process
defaults:
  target: ""
  detach: true
  resources: { gpu_type: unknown, gpu_count: 1, cpu_count: 0, memory_gb: 0 }
allow_overrides: [target, resources, runtime_env, detach]
"""


def test_the_builtin_rental_template_is_the_published_file_byte_for_byte() -> None:
    path = builtin_dir() / "targon-rental-host.yaml"
    assert path.read_bytes() == PUBLISHED_TARGON_TEMPLATE.encode()
    template = load_template_file(path)
    assert template.placement.kind == "targon_rental"
    resources = template.defaults.resources
    # `unknown` is any model; 0 CPUs or memory is no requirement
    assert resources.gpu_type is None and resources.cpu_count == 0 and resources.memory_gb == 0
    request = resolve(template, parse_overrides({"target": "h100-a"}, "spec"))
    assert request.backend_key == "targon_rental_host_process"
    assert resolve(template, ExecutionOverrides()).target is None  # "" is none given


def test_targon_rental_is_the_ssh_placement_under_its_original_name(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'db'}")
    execution = ExecutionService.default(settings)
    assert canonical_placement("targon_rental") == "ssh"
    for launch in ("host_process", "docker"):
        alias = execution.backend(f"targon_rental_{launch}")
        assert alias is execution.backend(f"ssh_{launch}")
    assert canonical_placement("local") == "local"
