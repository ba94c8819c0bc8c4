"""`orbit secrets`: set, list and remove secrets, and rotate the keys that seal them. A value
is read from a file or standard input, never from the command line (where `ps` and the shell's
history would keep it), and is never shown again by anything."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from orbit.cli.common import JSON, OUTPUT, console, emitted, output_format, print_json, service
from orbit.cli.text import Table

secrets_app = typer.Typer(
    help="Secrets: credentials a run gets as environment variables (a spec's `secrets:` names "
    "them). Values are sealed at rest (AES-GCM under the server's key set) and never shown "
    "again; a member keeps its own, an admin sets shared ones for an experiment or everyone.",
    no_args_is_help=True,
)
SCOPE = typer.Option(
    "user",
    "--scope",
    metavar="user|experiment|global",
    help="Whose secret: your own (user), an experiment's (with --experiment) or everyone's; "
    "shared ones are an admin's to set. A run uses its submitter's own first.",
)
EXPERIMENT = typer.Option(None, "--experiment", "-e", help="The experiment of a shared secret.")


@secrets_app.command("set")
def secrets_set(
    name: str = typer.Argument(..., help="The secret's name: letters, digits and _."),
    value_file: Path | None = typer.Option(
        None,
        "--value-file",
        metavar="FILE",
        help="Read the value from FILE (one trailing newline is dropped); without it, from "
        "standard input, or a hidden prompt on a terminal.",
    ),
    scope: str = SCOPE,
    experiment: str | None = EXPERIMENT,
) -> None:
    """Set a secret's value (a new one, or a rotation of the old value: runs launched from
    now on get the new one). Never on the command line.

    \b
    orbit secrets set hf_token --value-file ~/.cache/huggingface/token
    printf %s "$WANDB_API_KEY" | orbit secrets set wandb
    orbit secrets set hf_token --scope experiment -e llama-sft < token.txt   # admins
    """
    from orbit.model.secrets import scope_named

    chosen = scope_named(scope)
    value = _read_value(value_file)
    made = service().set_secret(name, value, chosen, experiment)
    verb = "set" if made.rotated_at is None else "replaced the value of"
    owner = f" of {made.owner}" if made.owner else ""
    console.print(f"{verb} {made.scope.value} secret {made.name}{owner} (key {made.key_id})")


@secrets_app.command("list")
def secrets_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List secrets: names, scope, owner, when set, last rotated and last used. Never values
    (nothing shows one). A member sees its own and the shared ones; an admin every one."""
    fmt = output_format(as_json, output)
    found = service().list_secrets()
    if emitted(fmt, lambda: [s.model_dump(mode="json") for s in found]):
        return
    table = Table("NAME", "SCOPE", "OWNER", "CREATED", "BY", "ROTATED", "USED")
    for s in found:
        table.add_row(
            s.name,
            s.scope.value,
            s.owner or "-",
            f"{s.created_at:%Y-%m-%d %H:%M}",
            s.created_by,
            f"{s.rotated_at:%Y-%m-%d %H:%M}" if s.rotated_at else "-",
            f"{s.used_at:%Y-%m-%d %H:%M}" if s.used_at else "never",
        )
    console.print(table)


@secrets_app.command("rm")
def secrets_rm(
    name: str = typer.Argument(..., help="The secret's name."),
    scope: str = SCOPE,
    experiment: str | None = EXPERIMENT,
) -> None:
    """Remove a secret. A run that names it and launches later fails its launch, saying so."""
    from orbit.model.secrets import scope_named

    gone = service().remove_secret(name, scope_named(scope), experiment)
    console.print(f"removed {gone.scope.value} secret {gone.name}")


@secrets_app.command("rotate-key")
def secrets_rotate_key(as_json: bool = JSON) -> None:
    """Add a new key to the key set, re-seal every value under it and retire the old one, while
    the server runs (admins). Replicas sharing the key file follow at their next use; runs
    going on are not touched (they were given their values at launch)."""
    done = service().rotate_secret_key()
    if as_json:
        print_json(done.model_dump(mode="json"))
        return
    retired = ", ".join(done.retired) or "none"
    console.print(f"key {done.key_id} seals from now on; re-sealed {done.resealed} value(s); "
                  f"retired: {retired}")  # fmt: skip


def _read_value(path: Path | None) -> bytes:
    from orbit.model.errors import InvalidInput

    if path is not None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidInput(f"--value-file: cannot read {path}: {exc.strerror}") from None
    elif sys.stdin.isatty():
        import getpass

        data = getpass.getpass("value (not shown): ").encode()
    else:
        data = sys.stdin.buffer.read()
    if data.endswith(b"\n"):
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    if not data:
        where = f"--value-file: {path}" if path is not None else "value: standard input"
        raise InvalidInput(f"{where} is empty; a secret needs a value")
    return data
