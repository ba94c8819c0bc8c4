"""`orbit templates` and `orbit experiments`: what runs can use, and how they are grouped."""

from __future__ import annotations

import sys

import typer

from orbit.cli.common import JSON, OUTPUT, console, emitted, output_format, print_json, service

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
    template_id: str = typer.Argument(..., metavar="ID"), as_json: bool = JSON
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
