"""`orbit policy`: the site's submission rules, as a file of CEL rules and their own tests:
check one, see what it would have changed against past submissions, apply it (after that diff,
and a question), show the one in force and its history."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import JSON, console, print_json, service
from orbit.cli.text import Table

if TYPE_CHECKING:
    from orbit.policy.replay import DiffReport

policy_app = typer.Typer(
    help="Submission rules as code: CEL conditions over what is submitted (deny, warn, or set "
    "a default), each in a mode (off, audit, warn, enforce), tested and replayed against past "
    "submissions before they are applied. Every run records the version it was admitted under.",
    no_args_is_help=True,
)
FILE = typer.Argument(..., metavar="FILE", help="A policy file (YAML): rules: and tests:.")
SINCE = typer.Option(
    "30d", "--since", metavar="DURATION", help="Replay the submissions of this long back: 7d, 12h."
)


def _read(path: Path) -> str:
    from orbit.model.errors import InvalidInput

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot read it ({exc})") from None


def _since(text: str) -> timedelta:
    from orbit.model.durations import parse_duration

    return parse_duration(text, "--since")


@policy_app.command("check")
def policy_check(file: Path = FILE, as_json: bool = JSON) -> None:
    """Read, compile and type-check a policy file and run its own tests; applies nothing.
    A file that cannot be used: one line naming the rule and its line, exit 2. A failing
    test: exit 1.

    \b
    rules:
      - name: batch-takes-two
        match: 'request.priority == "batch"'      # optional: every request
        deny: 'request.resources.gpu_count > 2'    # or warn: '...'
        message: 'batch runs take at most 2 GPUs (asked {{ request.resources.gpu_count }})'
        mode: enforce                              # off | audit | warn | enforce
      - name: cap-runtime
        set: {max_runtime_s: 259200}               # a default where none is given
    tests:
      - name: big batch refused
        request: {priority: batch, resources: {gpu_count: 4}}
        expect: {batch-takes-two: deny}
    """
    report = service().check_policy(_read(file), str(file))
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        modes = ", ".join(f"{n} {m}" for m, n in report.modes.items() if n)
        console.print(
            f"{file}: {report.rules} rule(s) ({modes or 'none'}), sha256 {report.sha256[:12]}"
        )
        for case in report.tests:
            mark = "ok  " if case.passed else "FAIL"
            console.print(
                f"  {mark} {case.name}" + (f": {'; '.join(case.failures)}" if case.failures else "")
            )
        passed = sum(t.passed for t in report.tests)
        console.print(f"tests: {passed} of {len(report.tests)} passed")
    if not report.passed:
        raise typer.Exit(1)


@policy_app.command("diff")
def policy_diff(
    file: Path = FILE,
    since: str = SINCE,
    max_denied: int | None = typer.Option(
        None,
        "--max-denied",
        metavar="N",
        help="Exit 1 when the file would refuse more than N submissions the policy in force "
        "let through (a gate for a site's own CI).",
    ),
    as_json: bool = JSON,
) -> None:
    """What FILE would have changed, rule by rule, against every submission recorded since
    --since, beside the policy in force: submissions newly refused or let through, new
    warnings, defaults that differ; counts by user and experiment, example runs (admins)."""
    report = service().diff_policy(_read(file), str(file), _since(since))
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        _show_diff(report)
    if max_denied is not None and report.newly_denied > max_denied:
        print(
            f"policy diff: {report.newly_denied} submission(s) newly refused, over "
            f"--max-denied {max_denied}", file=sys.stderr,
        )  # fmt: skip
        raise typer.Exit(1)


def _show_diff(report: DiffReport) -> None:
    current = f"version {report.current_version}" if report.current_version else "no policy"
    console.print(
        f"{report.submissions} submission(s) since {report.since:%Y-%m-%d %H:%M} UTC, against "
        f"{current}: refused {report.refused_before} -> {report.refused_after} "
        f"(newly refused {report.newly_denied}, newly let through {report.newly_allowed}; "
        f"{report.elapsed_s:.1f}s)"
    )
    if not report.changes:
        console.print("no rule changes what any of them got")
        return
    table = Table("RULE", "DENIED", "ALLOWED", "WARNED", "DEFAULTS", "ERRORS", "USERS", "EXAMPLES")
    for c in report.changes:
        users = ", ".join(f"{u} {n}" for u, n in list(c.users.items())[:3])
        table.add_row(
            c.rule, str(c.newly_denied), str(c.newly_allowed), str(c.newly_warned),
            str(c.defaults_changed), str(c.errors), users or "-", " ".join(c.examples) or "-",
        )  # fmt: skip
    console.print(table)


@policy_app.command("apply")
def policy_apply(
    file: Path = FILE,
    since: str = SINCE,
    yes: bool = typer.Option(False, "--yes", "-y", help="Apply without asking."),
    as_json: bool = JSON,
) -> None:
    """Apply FILE as the next policy version, in force from the next submit (admins): it is
    checked (its tests must pass), what it would change since --since is shown, and you are
    asked first unless --yes."""
    svc = service()
    text = _read(file)
    if not yes:
        report = svc.diff_policy(text, str(file), _since(since))
        _show_diff(report)
        if not sys.stdin.isatty():
            from orbit.model.errors import InvalidInput

            raise InvalidInput("--yes: not asked on a terminal; pass --yes to apply")
        if not typer.confirm(f"apply {file} as the next policy version?"):
            raise typer.Exit(1)
    made = svc.apply_policy(text, str(file))
    if as_json:
        print_json(made.model_dump(mode="json"))
        return
    console.print(
        f"policy version {made.version} in force ({made.rules} rule(s), sha256 {made.sha256[:12]})"
    )


@policy_app.command("show")
def policy_show(
    version: int | None = typer.Option(None, "--version", metavar="N", help="An older version."),
    as_json: bool = JSON,
) -> None:
    """The policy in force (or version N), as it was applied."""
    found = service().show_policy(version)
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    console.print(
        f"# policy version {found.version}, applied {found.applied_at:%Y-%m-%d %H:%M} by "
        f"{found.applied_by}, sha256 {found.sha256}"
    )
    print(found.body or "", end="" if (found.body or "").endswith("\n") else "\n")


@policy_app.command("review")
def policy_review(
    version: int = typer.Argument(..., metavar="N", help="The policy version."),
    since: str = SINCE,
    out: Path | None = typer.Option(None, "--out", metavar="FILE", help="Write it here."),
) -> None:
    """Version N as one JSON document for a review (admins): the file as applied and its
    sha256, its check (its own tests), and what it changed against the version before it,
    rule by rule, over the submissions of --since before it was applied."""
    import json

    found = service().review_policy(version, _since(since))
    text = json.dumps(found.model_dump(mode="json"), indent=2) + "\n"
    if out is None:
        print(text, end="")
        return
    out.write_text(text, encoding="utf-8")
    console.print(f"wrote the review of policy version {version} to {out}")


@policy_app.command("history")
def policy_history(as_json: bool = JSON) -> None:
    """Every policy version applied, newest first."""
    found = service().policy_history()
    if as_json:
        print_json([v.model_dump(mode="json") for v in found])
        return
    table = Table("VERSION", "APPLIED", "BY", "RULES", "SHA256")
    for v in found:
        table.add_row(
            str(v.version), f"{v.applied_at:%Y-%m-%d %H:%M}", v.applied_by, str(v.rules),
            v.sha256[:12],
        )  # fmt: skip
    console.print(table)
