"""The `orbit ...` command lines a document shows, and whether the real CLI parses each one.

Lines come from fenced shell blocks (```bash, ```sh, ``` with no language) and from inline
code spans that start with `orbit `. The documents' shorthand is read as a person reads it:
`# comment`, `a ; b` (two commands), `orbit templates list | show ID` (alternatives of one
group), `[--json]` (optional: checked with it), `> file` (a redirect), `sudo`, a trailing `\\`.
Parsing is click's own (`make_context`, the real Typer app), which converts every value and
runs no command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

import typer.main
from typer import _click as click  # the click Typer parses with (its own copy, since 0.26)
from typer._click import exceptions
from typer.core import TyperGroup

FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
SHELL = {"", "bash", "sh", "shell", "console"}
INLINE = re.compile(r"`(orbit [^`]+)`")
# what the documents write for a value, and a sample of it the CLI's types accept
SAMPLES = {"N": "2", "PORT": "8470", "SECONDS": "30"}


@dataclass(frozen=True)
class Line:
    where: str  # README.md:51, or `orbit clusters --help`
    words: tuple[str, ...]  # after `orbit`
    whole: bool  # a full command (code block): missing arguments count as wrong

    def __str__(self) -> str:
        return f"{self.where}: orbit {shlex.join(self.words)}"


def block_lines(text: str, name: str) -> Iterator[tuple[str, str]]:
    """(where, line) of each shell line in the fenced blocks, continuations joined."""
    lang: str | None = None
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(1).lower()
            continue
        if lang not in SHELL:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield f"{name}:{start}", pending + line
        pending = ""


def inline_spans(text: str, name: str) -> Iterator[tuple[str, str]]:
    """(where, span) of each inline `orbit ...` outside the fenced blocks."""
    outside = []
    lang: str | None = None
    for line in text.splitlines():
        if FENCE.match(line):
            lang = None if lang is not None else "x"
            outside.append("")
            continue
        outside.append(line if lang is None else "")
    joined = "\n".join(outside)
    for match in INLINE.finditer(joined):
        number = joined.count("\n", 0, match.start()) + 1
        yield f"{name}:{number}", " ".join(match.group(1).split())


def commands(text: str, where: str, whole: bool) -> Iterator[Line]:
    """The orbit commands of one shell line, its shorthand expanded."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote: prose, not a command
        return
    for part in _split(tokens, ";"):
        if part[:1] == ["sudo"]:
            part = part[1:]
        if part[:1] != ["orbit"]:
            continue
        alternatives = _split(_no_redirects(part[1:]), "|")
        first = [_sample(w) for w in _unbracket(alternatives[0])]
        yield Line(where, tuple(first), whole)
        group = _group_path(first)
        for alt in alternatives[1:]:
            words = [_sample(w) for w in _unbracket(alt)]
            if words[:1] == ["orbit"]:
                yield Line(where, tuple(words[1:]), whole)
            elif words and group is not None and words[0] in group[1].commands:
                yield Line(where, (*group[0], *words), whole)


def _split(tokens: list[str], sep: str) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token == sep:
            parts.append([])
        else:
            parts[-1].append(token)
    return parts


def _no_redirects(tokens: list[str]) -> list[str]:
    out, skip = [], False
    for token in tokens:
        if skip:
            skip = False
        elif token in (">", ">>", "<", "2>"):
            skip = True
        else:
            out.append(token)
    return out


def _unbracket(tokens: list[str]) -> list[str]:
    """`[--dest DIR]` -> `--dest DIR`: an optional part is checked as if given."""
    return [t.removeprefix("[").removesuffix("]") for t in tokens if t not in ("[", "]")]


def _sample(word: str) -> str:
    return SAMPLES.get(word, word)


def app() -> TyperGroup:
    from orbit.cli.app import app as typer_app

    command = typer.main.get_command(typer_app)
    assert isinstance(command, TyperGroup)
    return command


def _group_path(words: list[str]) -> tuple[list[str], TyperGroup] | None:
    """The words naming the innermost group of `words` (`["nodes", "join-token"]`), and it."""
    group, path = app(), []
    for word in words:
        sub = group.commands.get(word)
        if not isinstance(sub, TyperGroup):
            break
        group, path = sub, [*path, word]
    return path, group


def problem(line: Line) -> str | None:
    """What is wrong with the line as the CLI parses it, or None."""
    command: click.Command = app()
    ctx: click.Context | None = None
    args, name = list(line.words), "orbit"
    try:
        while True:
            ctx = command.make_context(name, args, parent=ctx, resilient_parsing=False)
            if not isinstance(command, TyperGroup):
                return None
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            if not rest:
                return None
            found, sub, args = command.resolve_command(ctx, rest)
            if sub is None:
                return f"No such command {rest[0]!r}"
            command, name = sub, str(found)
    except exceptions.MissingParameter as exc:
        return None if not line.whole else exc.format_message()
    except exceptions.BadParameter as exc:
        if "does not exist" in exc.format_message():
            return None  # a file the line names that is not here: it parsed as a path
        return exc.format_message()
    except exceptions.ClickException as exc:
        said = exc.format_message()
        # prose names an option without its value ("its `orbit agent --address`")
        return None if not line.whole and said.endswith("requires an argument.") else said
    except typer.Exit:  # --help, --version
        return None


def help_texts(group: TyperGroup | None = None, path: tuple[str, ...] = ()) -> Iterator[Line]:
    """The `orbit ...` lines every --help shows (examples in docstrings and help)."""
    group = group or app()
    for name, command in sorted(group.commands.items()):
        words = (*path, name)
        where = f"`orbit {' '.join(words)} --help`"
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            for raw in text.splitlines():
                # an example's words end where two spaces set its description apart
                stripped = re.split(r"\s{2,}", raw.strip())[0]
                if stripped.startswith(("orbit ", "sudo orbit ")):
                    yield from commands(stripped, where, whole=True)
        for span in INLINE.finditer(" ".join(texts)):
            yield from commands(" ".join(span.group(1).split()), where, whole=False)
        if isinstance(command, TyperGroup):
            yield from help_texts(command, words)
