"""Docs and CLI cannot drift: every `orbit ...` line of the README's shell blocks (and inline
spans), and every example a `--help` shows, parses against the real CLI (click's own parsing
of the real Typer app: options, arguments, their types; nothing runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.command_lines import Line, block_lines, commands, help_texts, inline_spans, problem

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_lines() -> list[Line]:
    text = README.read_text(encoding="utf-8")
    found = []
    for where, line in block_lines(text, "README.md"):
        found += commands(line, where, whole=True)
    for where, span in inline_spans(text, "README.md"):
        found += commands(span, where, whole=False)
    return found


def test_the_readme_shows_many_command_lines() -> None:
    lines = readme_lines()
    assert len(lines) > 100
    # the shorthand is read as written: `a ; b`, `list | show ID`, `[--json]`, `sudo`, `\`
    shown = {" ".join(line.words) for line in lines}
    assert {"tokens list", "tokens revoke tok-1234abcd", "templates show ID"} <= shown
    assert "submit spec.yaml --dry-run --json" in shown
    assert any(w.startswith("agent --server") and "--name gpu-07" in w for w in shown)


def test_every_readme_command_line_parses() -> None:
    wrong = [f"{line}: {why}" for line in readme_lines() if (why := problem(line))]
    assert not wrong, "\n".join(wrong)


def test_every_help_example_parses() -> None:
    lines = list(help_texts())
    assert len(lines) > 10
    wrong = [f"{line}: {why}" for line in lines if (why := problem(line))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("line", "wrong"),
    [
        ("orbit submit spec.yaml --templat slurm", "No such option"),
        ("orbit runs lst", "No such command"),
        ("orbit runs list --limit many", "--limit"),
        ("orbit nodes set gpu-a", None),  # a fragment: its missing option is the prose's
    ],
)
def test_the_check_catches_what_drifted(line: str, wrong: str | None) -> None:
    [parsed] = commands(line, "test", whole=False)
    found = problem(parsed)
    assert (found is None) if wrong is None else (found is not None and wrong in found)
