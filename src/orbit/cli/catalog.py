"""`orbit templates` and `orbit experiments`: what runs can use, and how they are grouped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import (
    JSON,
    OUTPUT,
    console,
    emitted,
    output_format,
    print_json,
    service,
)
from orbit.cli.complete import complete_experiments, complete_templates

EXPERIMENT = typer.Argument(..., metavar="NAME", autocompletion=complete_experiments)

if TYPE_CHECKING:
    from orbit.model.records import ExperimentRecord

templates_app = typer.Typer(
    help="Execution templates: where and how runs execute.", no_args_is_help=True
)
experiments_app = typer.Typer(help="Experiments: named groups of runs.", no_args_is_help=True)


@templates_app.command("list")
def templates_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List templates: built-in, then ./execution_templates/, then $ORBIT_HOME/templates/."""
    from orbit.cli import render

    fmt = output_format(as_json, output)
    views = service().list_templates()
    if not emitted(
        fmt, lambda: [{**v.template.model_dump(mode="json"), "path": v.path} for v in views]
    ):
        console.print(render.templates_table(views))


@templates_app.command("show")
def templates_show(
    template_id: str = typer.Argument(..., metavar="ID", autocompletion=complete_templates),
    as_json: bool = JSON,
) -> None:
    """Show one template as its file says it (valid YAML), and where it was read from."""
    view = service().get_template(template_id)
    if as_json:
        data = {**view.template.model_dump(mode="json"), "path": view.path}
        print_json(data | {"canonical_placement": view.canonical_placement})
        return
    kind = view.template.placement.kind
    sys.stdout.write(f"# from {view.path}\n")
    if kind != view.canonical_placement:
        sys.stdout.write(
            f"# placement '{kind}' is accepted as another name for "
            f"'{view.canonical_placement}', the canonical one (backend "
            f"{view.canonical_placement}_{view.template.launch_mode.kind})\n"
        )
    sys.stdout.write(view.text if view.text.endswith("\n") else view.text + "\n")


@experiments_app.command("create")
def experiments_create(name: str, as_json: bool = JSON) -> None:
    """Create an experiment (submitting to an unknown one creates it too)."""
    experiment = service().create_experiment(name)
    if as_json:
        print_json(experiment.model_dump(mode="json"))
    else:
        console.print(f"created experiment {experiment.name} ({experiment.id})")


@experiments_app.command("list")
def experiments_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List experiments with their run counts."""
    from orbit.cli import render

    fmt = output_format(as_json, output)
    experiments = service().list_experiments()
    if not emitted(fmt, lambda: [e.model_dump(mode="json") for e in experiments], "name"):
        console.print(render.experiments_table(experiments))


@experiments_app.command("show")
def experiments_show(name: str = EXPERIMENT, as_json: bool = JSON) -> None:
    """One experiment: its runs, whether it is restricted, and its members."""
    _said(service().get_experiment(name), as_json)


@experiments_app.command("restrict")
def experiments_restrict(
    name: str = EXPERIMENT,
    members: list[str] = typer.Option(
        [], "--member", "-m", help="A user to add as a member (again for more)."
    ),
    as_json: bool = JSON,
) -> None:
    """Restrict an experiment: only its members (and those who may manage experiments, admins
    by default) see its runs, logs and artifacts, or submit to it. Needs experiments.manage."""
    _said(service().set_experiment(name, True, add=members), as_json)


@experiments_app.command("unrestrict")
def experiments_unrestrict(name: str = EXPERIMENT, as_json: bool = JSON) -> None:
    """Open a restricted experiment to everyone who reads runs again (its members stay)."""
    _said(service().set_experiment(name, False), as_json)


@experiments_app.command("members")
def experiments_members(
    name: str = EXPERIMENT,
    add: list[str] = typer.Option([], "--add", help="A user to add (again for more)."),
    remove: list[str] = typer.Option([], "--remove", help="A user to remove (again for more)."),
    as_json: bool = JSON,
) -> None:
    """Show an experiment's members, or add and remove some (audited). Needs
    experiments.manage to change them."""
    control = service()
    found = control.set_experiment(name, add=add, remove=remove) if add or remove else None
    _said(found or control.get_experiment(name), as_json)


def _said(found: ExperimentRecord, as_json: bool) -> None:
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    access = "restricted to its members" if found.restricted else "open to every reader"
    console.print(f"{found.name} ({found.id}): {found.run_count} runs, {access}")
    console.print(f"  members: {', '.join(found.members) or '(none)'}")
