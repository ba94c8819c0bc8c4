"""`orbit schema`: JSON Schemas of ORBIT's files, for editors and linters."""

from __future__ import annotations

import typer

from orbit.cli.common import print_json

schema_app = typer.Typer(
    help="JSON Schemas of ORBIT's files, for editors and linters.", no_args_is_help=True
)


@schema_app.command("spec")
def spec() -> None:
    """Print the JSON Schema of spec files (the `task:` block checked per task_type, for every
    task type installed here). Save it and point an editor at it, e.g. with VS Code's YAML
    extension a first line `# yaml-language-server: $schema=./spec.schema.json`:

      orbit schema spec > spec.schema.json
    """
    from orbit.client.spec_schema import spec_schema

    print_json(spec_schema())
