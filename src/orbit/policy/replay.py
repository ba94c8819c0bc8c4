"""`orbit policy diff`: a candidate policy evaluated against the submissions the store recorded,
beside the policy in force, and what would change, rule by rule: submissions it would newly
refuse or newly let through, new warnings, defaults that would differ; with counts by user and
experiment and a few example runs. Each submission is evaluated as it was made: its request,
its submitter and their role and usage then, at the time it was made. Pure."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orbit.model.models import Record
from orbit.policy.engine import CompiledPolicy, Verdict, variables

EXAMPLES = 3


@dataclass(frozen=True)
class Recorded:
    """A submission as the store keeps it."""

    run_id: str
    at: datetime
    user: str
    role: str
    experiment: str
    request: dict[str, Any]  # as rules read it (orbit.policy.engine.request_view)
    usage: dict[str, Any]


class RuleChange(Record):
    rule: str
    newly_denied: int = 0  # allowed -> denied
    newly_allowed: int = 0  # denied -> allowed
    newly_warned: int = 0
    defaults_changed: int = 0
    errors: int = 0  # submissions this rule could not be evaluated for
    users: dict[str, int] = {}
    experiments: dict[str, int] = {}
    examples: list[str] = []  # run ids


class DiffReport(Record):
    since: datetime
    submissions: int
    current_version: int | None
    candidate_sha256: str
    refused_before: int  # of the submissions, how many the policy in force refuses
    refused_after: int
    newly_denied: int  # submissions the candidate refuses that the current one did not
    newly_allowed: int
    changes: list[RuleChange]
    elapsed_s: float


class _Tally:
    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.counts: Counter[str] = Counter()
        self.users: Counter[str] = Counter()
        self.experiments: Counter[str] = Counter()
        self.examples: list[str] = []

    def add(self, what: str, sub: Recorded) -> None:
        self.counts[what] += 1
        if what == "errors":
            return
        self.users[sub.user] += 1
        self.experiments[sub.experiment] += 1
        if len(self.examples) < EXAMPLES and sub.run_id not in self.examples:
            self.examples.append(sub.run_id)

    def change(self) -> RuleChange | None:
        if not self.counts:
            return None
        return RuleChange(
            rule=self.rule, **dict(self.counts), users=dict(self.users.most_common()),
            experiments=dict(self.experiments.most_common()), examples=self.examples,
        )  # fmt: skip


def diff(
    current: CompiledPolicy | None,
    current_version: int | None,
    candidate: CompiledPolicy,
    candidate_sha256: str,
    recorded: Iterable[Recorded],
    since: datetime,
) -> DiffReport:
    started = time.monotonic()
    tallies: dict[str, _Tally] = {}
    total = before = after = newly_denied = newly_allowed = 0
    for sub in recorded:
        total += 1
        context = variables(
            sub.request, {"name": sub.user, "role": sub.role}, sub.experiment, sub.at, sub.usage
        )
        old = current.evaluate(context) if current is not None else Verdict()
        new = candidate.evaluate(context)
        before += bool(old.denied)
        after += bool(new.denied)
        newly_denied += bool(new.denied and not old.denied)
        newly_allowed += bool(old.denied and not new.denied)
        for what, rule in _changes(old, new):
            tallies.setdefault(rule, _Tally(rule)).add(what, sub)
    changes = [c for t in tallies.values() if (c := t.change()) is not None]
    return DiffReport(
        since=since, submissions=total, current_version=current_version,
        candidate_sha256=candidate_sha256, refused_before=before, refused_after=after,
        newly_denied=newly_denied, newly_allowed=newly_allowed,
        changes=sorted(changes, key=lambda c: c.rule),
        elapsed_s=round(time.monotonic() - started, 3),
    )  # fmt: skip


def _changes(old: Verdict, new: Verdict) -> list[tuple[str, str]]:
    """(what changed, which rule) for one submission."""
    found = []
    old_denied = {r for r, _ in old.denied}
    new_denied = {r for r, _ in new.denied}
    found += [("newly_denied", r) for r in sorted(new_denied - old_denied)]
    found += [("newly_allowed", r) for r in sorted(old_denied - new_denied)]
    old_warned = {r for r, _ in old.warnings}
    found += [("newly_warned", r) for r, _ in new.warnings if r not in old_warned]
    found += [("errors", r) for r, _ in new.errors]
    if old.defaults != new.defaults:
        setters = [r for r in new.setters if r not in old.setters]
        setters += [r for r in old.setters if r not in new.setters]
        found += [("defaults_changed", r) for r in setters or new.setters]
    return found
