"""Policy versions as the store keeps them, and what a run records of the policy it was
admitted under (orbit.policy evaluates them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.model.models import Record


class PolicyVersion(Record):
    """One applied policy file: numbered from 1, never changed; the newest is in force."""

    version: int
    sha256: str
    rules: int
    applied_at: datetime
    applied_by: str
    body: str | None = None  # the file as applied (left out of a history)


class PolicyStamp(Record):
    """What a run keeps of its admission: the policy version in force (none: no policy yet),
    what it said (warnings, audited outcomes, defaults it set), and what the rules were given
    beside the request (the submitter's role and usage then), so that `policy diff` can
    evaluate the submission again as it was made."""

    version: int | None = None
    warnings: list[str] = []  # "rule: message"
    audited: dict[str, str] = {}  # rule -> outcome, for rules in audit mode
    defaults: dict[str, Any] = {}
    replaced: dict[str, Any] = {}  # what the request had where a default was set
    errors: list[str] = []  # "rule: why" for rules that could not be evaluated
    role: str = "member"
    usage: dict[str, Any] = {}
