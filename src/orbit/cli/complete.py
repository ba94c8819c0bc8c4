"""What the shell completes as a word is typed (Typer's `autocompletion`, installed with
`orbit --install-completion`): run ids (the newest first), experiments, templates and node
names, read where the commands would read them (orbit.client.names). A completion that
cannot be answered (no store, the server away) offers nothing and says nothing: it never
prints an error into a shell's line."""

from __future__ import annotations

from orbit.cli.common import settings

SHOWN = 50  # the most offered at once


def offered(what: str, incomplete: str) -> list[str]:
    """The names of `what` (runs, experiments, nodes, templates) that begin as typed."""
    from orbit.client.names import names

    try:
        found = names(settings(), what)
    except Exception:  # a completion offers nothing rather than fail a shell's line
        return []
    return [n for n in dict.fromkeys(found) if n.startswith(incomplete)][:SHOWN]
