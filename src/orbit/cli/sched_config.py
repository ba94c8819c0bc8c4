"""`orbit sched config show | set FILE`: the scheduler config in force, and a new one,
validated before it is written."""

from __future__ import annotations

from pathlib import Path

import typer

from orbit.cli.common import JSON, console, print_json, service
from orbit.cli.text import paint

config_app = typer.Typer(
    help="""The scheduler config in force (tiers, scorer, weights, preemption, site checks).
Its file (ORBIT_SCHEDULER_CONFIG, else $ORBIT_HOME/scheduler.yaml on the server) is watched:
an edit is picked up without a restart once it is valid; a refused one leaves the last good
config live and is shown here with why and since when. Every change is audited with who,
when and the diff.""",
    no_args_is_help=True,
)


@config_app.command("show")
def show(as_json: bool = JSON) -> None:
    """The live config as written, where it came from, who set it and when, and what it comes
    to with every default filled in; a newer config that was refused, with why and since."""
    import yaml

    from orbit.cli.render import when

    view = service().scheduler_config_view()
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    if view.text.strip():
        console.print(f"scheduler config: {view.source}")
        console.print(f"  set by {view.set_by} at {when(view.set_at)}, digest {view.digest[:12]}")
    else:
        console.print(f"scheduler config: the defaults ({view.source})")
    if view.path and view.path != view.source:
        console.print(f"  watched file: {view.path}")
    if view.error is not None:
        since = when(view.error_since)
        console.print(paint(f"REFUSED since {since}: {view.error}", "red"))
        console.print("  (the last good config below stays live until the file is fixed)")
    if view.text.strip():
        console.print("# as written")
        for line in view.text.rstrip("\n").splitlines():
            console.print(line)
    console.print("# in force, every default filled in")
    for line in yaml.safe_dump(view.config, sort_keys=False).splitlines():
        console.print(line)


@config_app.command("set")
def set_(
    file: Path = typer.Argument(
        ..., metavar="FILE", help="The new config (YAML); - reads it from stdin."
    ),
    as_json: bool = JSON,
) -> None:
    """Validate a scheduler config and make it the live one (admins): written to the config
    file (on the server, with one) and kept in the store, audited with who and the diff. A
    config with a mistake is refused in one line naming the key; nothing changes then."""
    import sys

    from orbit.model.errors import InvalidInput
    from orbit.model.yamlio import parse_yaml_mapping
    from orbit.scheduler.config import config_from_dict

    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{file}: cannot read: {exc}") from None
    # its mistakes name this file, before it is sent (the server checks again, site checks too)
    config_from_dict(parse_yaml_mapping(text, str(file)) if text.strip() else {}, str(file))
    view = service().set_scheduler_config(text)
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    console.print(
        f"scheduler config set: {view.source} (digest {view.digest[:12]}, by {view.set_by})"
    )
