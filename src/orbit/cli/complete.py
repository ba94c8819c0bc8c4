"""What the shell completes as a word is typed (Typer's `autocompletion`, installed with
`orbit --install-completion`): run ids (the newest first), experiments, templates and node
names, read where the commands would read them (orbit.client.names). A completion that
cannot be answered (no store, the server away) offers nothing and says nothing: it never
prints an error into a shell's line."""

from __future__ import annotations

from orbit.cli.common import settings

SHOWN = 50  # the most offered at once


def runs(incomplete: str) -> list[str]:
    return _offered("runs", incomplete)


def experiments(incomplete: str) -> list[str]:
    return _offered("experiments", incomplete)


def nodes(incomplete: str) -> list[str]:
    return _offered("nodes", incomplete)


def templates(incomplete: str) -> list[str]:
    return _offered("templates", incomplete)


def _offered(what: str, incomplete: str) -> list[str]:
    from orbit.client.names import names

    try:
        found = names(settings(), what)
    except Exception:
        return []
    return [n for n in dict.fromkeys(found) if n.startswith(incomplete)][:SHOWN]
