"""What the shell completes as a word is typed (Typer's `autocompletion`, installed with
`orbit --install-completion`): run ids and group ids (the newest first), experiments,
templates and node names, read where the commands would read them (orbit.client.names). A
completion that cannot be answered (no store, the server away) offers nothing and says
nothing: it never prints an error into a shell's line. Light: what reads the names is
imported only when a shell asks, so that the commands that name these completers pay nothing
for them."""

from __future__ import annotations

SHOWN = 50  # the most offered at once


def complete_runs(incomplete: str) -> list[str]:
    return offered("runs", incomplete)


def complete_groups(incomplete: str) -> list[str]:
    return offered("groups", incomplete)


def complete_experiments(incomplete: str) -> list[str]:
    return offered("experiments", incomplete)


def complete_templates(incomplete: str) -> list[str]:
    return offered("templates", incomplete)


def complete_nodes(incomplete: str) -> list[str]:
    return offered("nodes", incomplete)


def offered(what: str, incomplete: str) -> list[str]:
    """The names of `what` (runs, groups, experiments, nodes, templates) that begin as typed."""
    from orbit.client.names import names
    from orbit.model.config import Settings  # as the commands' (--server is in the env)

    try:
        found = names(Settings.from_env(), what)
    except Exception:  # a completion offers nothing rather than fail a shell's line
        return []
    return [n for n in dict.fromkeys(found) if n.startswith(incomplete)][:SHOWN]
