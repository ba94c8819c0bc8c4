"""`orbit login`, `orbit users` and `orbit tokens`: who may use an `orbit server`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import JSON, OUTPUT, console, emitted, err, output_format, print_json, service
from orbit.cli.text import Table, paint

if TYPE_CHECKING:
    from orbit.model.auth import TokenRecord, UserRecord

users_app = typer.Typer(
    help="Users of an orbit server and their roles (users.manage: admins, unless a site role "
    "says otherwise). `orbit users roles` lists each role's permissions.",
    no_args_is_help=True,
)
tokens_app = typer.Typer(
    help="API tokens: each is shown once, when made; the server keeps only its hash.",
    no_args_is_help=True,
)
ROLE_HELP = (
    "viewer: reads; member: submits and controls its own runs; admin: everything; or a role "
    "of the site's (server setting roles; see orbit users roles)."
)


def login(
    url: str = typer.Argument(..., metavar="URL", help="The server, e.g. https://orbit.lab:8470"),
    token_file: str | None = typer.Option(
        None,
        "--token-file",
        metavar="PATH",
        help="Read the token from this file, or from stdin with '-'.",
    ),
    token: str | None = typer.Option(
        None, "--token", hidden=True, help="Refused: argv is kept in shell history and ps."
    ),
) -> None:
    """Check a token against a server and save both for the next commands.

    The token comes from --token-file PATH, from stdin (--token-file -), from ORBIT_TOKEN, or
    is asked for with a hidden prompt on a terminal; never from the command line, where shell
    history and ps would keep it. Saved (mode 0600) in ~/.config/orbit/credentials.json
    ($XDG_CONFIG_HOME honoured), or in $ORBIT_HOME where that is set or ~/.orbit holds one
    already; from then on every command talks to that server (ORBIT_SERVER and ORBIT_TOKEN
    still win).
    `orbit logout` forgets it.
    """
    from orbit.cli.common import settings
    from orbit.client.remote import RemoteControl
    from orbit.model.config import save_login

    found = _login_token(token_file, token)
    url = url.rstrip("/")
    remote = RemoteControl(url, found)
    try:
        user = remote.whoami()
    finally:
        remote.close()
    assert user is not None
    save_login(settings().credentials_file, url, found)
    console.print(f"logged in to {url} as {paint(user.name, 'bold')} ({user.role})")


TOKEN_SOURCES = "--token-file PATH, --token-file - (stdin), ORBIT_TOKEN, or the hidden prompt"


def _login_token(token_file: str | None, argv_token: str | None) -> str:
    """The token from a file or stdin, else ORBIT_TOKEN, else a hidden prompt on a terminal."""
    import os
    import sys

    from orbit.model.errors import InvalidInput

    if argv_token is not None:
        raise InvalidInput(
            "--token: a token on the command line stays in shell history and ps; "
            f"give it by {TOKEN_SOURCES}"
        )
    if token_file is not None:
        return _token_from_file(token_file)
    if os.environ.get("ORBIT_TOKEN"):
        return os.environ["ORBIT_TOKEN"].strip()
    if not sys.stdin.isatty():
        raise InvalidInput(f"no token: give it by {TOKEN_SOURCES} (on a terminal)")
    import getpass

    typed = getpass.getpass("token: ").strip()
    if not typed:
        raise InvalidInput("no token typed")
    return typed


def _token_from_file(token_file: str) -> str:
    import sys

    from orbit.model.errors import InvalidInput

    where = "stdin" if token_file == "-" else token_file
    try:
        text = sys.stdin.read() if token_file == "-" else Path(token_file).read_text("utf-8")
    except OSError as exc:
        raise InvalidInput(f"--token-file: {token_file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"--token-file: {where}: not a text file") from None
    if not text.strip():
        raise InvalidInput(f"--token-file: {where} holds no token")
    return text.strip()


def logout() -> None:
    """Forget the server and token `orbit login` saved: commands are embedded again."""
    from orbit.model.config import login_path, orbit_home

    path = login_path(orbit_home())  # read nothing: a damaged file goes just the same
    if path.exists():
        path.unlink()
        console.print(f"logged out (removed {path})")
    else:
        err.print("not logged in")


def whoami(as_json: bool = JSON) -> None:
    """Who the server knows you as (embedded: the local user, with no token)."""
    from orbit.cli.common import settings

    user = service().whoami()
    if as_json:
        print_json(user.model_dump(mode="json") if user else None)
    elif user is None:
        console.print("embedded mode: no server, no token (the local user acts)")
    else:
        console.print(f"{user.name} ({user.role}) at {settings().server}")


def ui() -> None:
    """Print a one-time link that signs you in to the server's web console.

    The link works once, within two minutes, and signs the browser in with the token this
    CLI uses (its role and expiry apply). Or open the console's address (URL/ui/) and paste
    the token.
    """
    from orbit.client.remote import RemoteControl
    from orbit.model.errors import InvalidInput

    control = service()
    if not isinstance(control, RemoteControl):
        raise InvalidInput(
            "the web console is served by `orbit server`: log in to one first "
            "(orbit login URL), or start one"
        )
    console.print("Open this link within 2 minutes (it works once):")
    print(control.sign_in_link())


def _user_row(user: UserRecord) -> list[str]:
    return [user.name, user.role, f"{user.created_at:%Y-%m-%d %H:%M}", user.created_by]


@users_app.command("add")
def users_add(
    name: str = typer.Argument(..., metavar="NAME"),
    role: str = typer.Option("member", "--role", "-r", help=ROLE_HELP),
    as_json: bool = JSON,
) -> None:
    """Add a user. Then make them a token: orbit tokens create --user NAME."""
    user = service().add_user(name, _role(role))
    if as_json:
        print_json(user.model_dump(mode="json"))
    else:
        console.print(f"added {paint(user.name, 'bold')} ({user.role})")
        console.print(f"  give them a token: orbit tokens create --user {user.name}", style="dim")


@users_app.command("list")
def users_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List users and their roles."""
    fmt = output_format(as_json, output)
    users = service().list_users()
    if emitted(fmt, lambda: [u.model_dump(mode="json") for u in users], "name"):
        return
    table = Table("USER", "ROLE", "CREATED", "BY")
    for user in users:
        table.add_row(*_user_row(user))
    console.print(table)


@users_app.command("set-role")
def users_set_role(
    name: str = typer.Argument(..., metavar="NAME"),
    role: str = typer.Argument(..., metavar="ROLE", help=ROLE_HELP),
    as_json: bool = JSON,
) -> None:
    """Give a user another role; it applies to their next request (audited as user.role)."""
    user = service().set_role(name, _role(role))
    if as_json:
        print_json(user.model_dump(mode="json"))
    else:
        console.print(f"{paint(user.name, 'bold')} is now {user.role}")


@users_app.command("roles")
def users_roles(as_json: bool = JSON) -> None:
    """Each role the server knows (built in, and the site's) and the permissions it holds."""
    from orbit.model.permissions import PERMISSIONS

    views = service().roles()
    if as_json:
        print_json([v.model_dump(mode="json") for v in views])
        return
    for view in views:
        kind = "built in" if view.built_in else "the site's"
        console.print(f"{paint(view.name, 'bold')} ({kind}): {view.description}")
        for name in view.permissions:
            console.print(f"  {name:<22} {PERMISSIONS[name]}", style="dim")


def _role(role: str) -> str:
    """A role's name as the server stores one; whether the server knows it is its to say
    (embedded, with no server: a built-in role)."""
    from orbit.client.remote import RemoteControl
    from orbit.model.errors import InvalidInput
    from orbit.model.permissions import ROLE_NAME, Roles

    if not re.fullmatch(ROLE_NAME, role):
        raise InvalidInput(f"--role: {role!r} is not a role's name (admin, member, viewer, ...)")
    if not isinstance(service(), RemoteControl):
        Roles().check(role, "--role")
    return role


@users_app.command("remove")
def users_remove(name: str = typer.Argument(..., metavar="NAME"), as_json: bool = JSON) -> None:
    """Remove a user; their tokens stop working at once. Their runs stay."""
    user = service().remove_user(name)
    if as_json:
        print_json(user.model_dump(mode="json"))
    else:
        console.print(f"removed {user.name}; their tokens no longer work")


def _token_row(token: TokenRecord) -> list[str]:
    from datetime import UTC, datetime

    at = datetime.now(UTC)
    if token.revoked_at is not None:
        state = "revoked"
    elif token.expires_at is not None and token.expires_at <= at:
        state = "expired"
    else:
        state = "active"
    expires = f"{token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "never"
    used = f"{token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "-"
    return [token.id, token.user, token.name or "-", state, expires, used]


@tokens_app.command("create")
def tokens_create(
    user: str | None = typer.Option(
        None, "--user", "-u", help="For this user (admins only; default: yourself)."
    ),
    expires: str | None = typer.Option(
        None, "--expires", metavar="DURATION", help="e.g. 30d, 12h (default: until revoked)."
    ),
    name: str | None = typer.Option(None, "--name", help="What it is for, e.g. ci."),
    as_json: bool = JSON,
) -> None:
    """Make a token. It is printed this once and never again (the server keeps its hash)."""
    made = service().create_token(user, name, expires)
    if as_json:
        record = made.record.model_dump(mode="json")
        print_json({"token": made.token, **record, "clamped": made.clamped})
        return
    print(made.token)
    until = made.record.expires_at
    lasts = f"expires {until:%Y-%m-%d %H:%M} UTC" if until else "lasts until revoked"
    if made.clamped:
        lasts += " (no later than the token that made it)"
    err.print(
        f"token {made.record.id} for {made.record.user}, {lasts}: shown this once; store it now",
        style="dim",
    )


@tokens_app.command("list")
def tokens_list(
    user: str | None = typer.Option(None, "--user", "-u", help="Only this user's."),
    as_json: bool = JSON,
    output: str | None = OUTPUT,
) -> None:
    """List tokens (yours; an admin sees everyone's). Never the tokens themselves."""
    fmt = output_format(as_json, output)
    tokens = service().list_tokens(user)
    if emitted(fmt, lambda: [t.model_dump(mode="json") for t in tokens]):
        return
    table = Table("ID", "USER", "NAME", "STATE", "EXPIRES", "LAST USED")
    for token in tokens:
        table.add_row(*_token_row(token))
    console.print(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: str = typer.Argument(..., metavar="ID", help="The token's id (tokens list)."),
    as_json: bool = JSON,
) -> None:
    """Revoke a token: it is refused from the next request on."""
    token = service().revoke_token(token_id)
    if as_json:
        print_json(token.model_dump(mode="json"))
    else:
        console.print(f"revoked {token.id} ({token.user})")
