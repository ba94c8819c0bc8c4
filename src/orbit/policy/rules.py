"""A policy file: rules over what is submitted, and the cases that test them. Pure.

    rules:
      - name: batch-takes-two
        match: 'request.priority == "batch"'          # optional: every request by default
        deny: 'request.resources.gpu_count > 2'        # or warn: '...'
        message: 'batch runs take at most 2 GPUs (asked {{ request.resources.gpu_count }})'
        mode: enforce                                  # off | audit | warn | enforce
      - name: cap-runtime
        set: {max_runtime_s: 259200}                   # a default where the request gives none
    tests:
      - name: big batch refused
        request: {priority: batch, resources: {gpu_count: 4}}
        expect: {batch-takes-two: deny}

Each rule keeps the line it starts on, so that a refusal of the file names it."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.model.models import NAME_PATTERN, ExecutionDefaults, Strict

MODES = ("off", "audit", "warn", "enforce")
Mode = Literal["off", "audit", "warn", "enforce"]
Outcome = Literal["allow", "deny", "warn", "set", "error"]
# what a rule's `set` may give a request that does not give it, and the type it must have
SETTABLE: dict[str, tuple[type, ...]] = {
    "max_runtime_s": (int, float),
    "stop_grace_s": (int, float),
    "priority": (str,),
    "preemptible": (bool,),
}
MAX_FILE_BYTES = 1 << 20


class Rule(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    match: str | None = None  # CEL: whether the rule applies (default: always)
    deny: str | None = None  # CEL: true refuses the request (in enforce mode)
    warn: str | None = None  # CEL: true warns, and the request goes on
    message: str | None = None  # with {{ CEL }} parts, rendered for the request
    mode: Mode = "enforce"
    set: dict[str, Any] = {}  # defaults for what the request does not give
    on_error: Literal["deny", "allow"] = "deny"  # a condition that cannot be evaluated
    line: int = 0  # where it starts in its file (not written by hand)

    @model_validator(mode="after")
    def _shape(self) -> Rule:
        if self.deny is not None and self.warn is not None:
            raise ValueError("a rule has deny or warn, not both")
        if (self.deny is not None or self.warn is not None) and self.set:
            raise ValueError("a rule has deny or warn, or set, not both (make it two rules)")
        if self.deny is None and self.warn is None and not self.set:
            raise ValueError("a rule needs deny, warn or set")
        if (self.deny is not None or self.warn is not None) and not self.message:
            raise ValueError("a rule with deny or warn needs a message (what to tell the user)")
        for key, value in self.set.items():
            kinds = SETTABLE.get(key)
            if kinds is None:
                raise ValueError(f"set: '{key}' cannot be set (settable: {', '.join(SETTABLE)})")
            if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
                raise ValueError(f"set.{key}: expected {' or '.join(k.__name__ for k in kinds)}")
        if self.set:  # within what a template's defaults may say (stop_grace_s <= 3600, ...)
            try:
                ExecutionDefaults.model_validate(self.set)
            except ValidationError as exc:
                raise ValueError(describe_validation_error("set", exc)) from None
        return self

    @property
    def condition(self) -> str | None:
        return self.deny if self.deny is not None else self.warn

    @property
    def kind(self) -> Literal["deny", "warn", "set"]:
        return "deny" if self.deny is not None else "warn" if self.warn is not None else "set"


class Case(Strict):
    """A test of the file: a request (laid over a default one), who asks, and the outcome
    expected of each rule named (allow, deny, warn, set or error)."""

    name: str
    request: dict[str, Any] = {}
    user: dict[str, Any] = {}
    experiment: str = "default"
    usage: dict[str, Any] = {}
    now: datetime | None = None  # default: a Monday, 10:00 UTC
    expect: dict[str, Outcome]


class PolicyFile(Strict):
    rules: list[Rule] = []
    tests: list[Case] = []

    @model_validator(mode="after")
    def _unique(self) -> PolicyFile:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named '{rule.name}'")
            seen.add(rule.name)
        for case in self.tests:
            for name in case.expect:
                if name not in seen:
                    raise ValueError(f"test '{case.name}' expects of an unknown rule '{name}'")
        return self


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_policy(text: str, source: str) -> PolicyFile:
    """The file's rules and tests, each rule with its line; InvalidInput in one line naming
    the file, the rule (and its line) and what was expected."""
    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise InvalidInput(f"{source}: over {MAX_FILE_BYTES:,} bytes")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise InvalidInput(f"{source}{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInput(f"{source}: expected a mapping with rules: and tests:")
    lines = _rule_lines(node)
    rules = data.get("rules")
    if isinstance(rules, list):
        for index, rule in enumerate(rules):
            if isinstance(rule, dict) and index < len(lines):
                rule.setdefault("line", lines[index])
                try:
                    Rule.model_validate(rule)
                except ValidationError as exc:
                    name = rule.get("name", f"#{index + 1}")
                    where = f"{source}: rule '{name}' (line {lines[index]})"
                    raise InvalidInput(_said(where, exc, Rule)) from None
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(_said(source, exc, PolicyFile)) from None


def _said(where: str, exc: ValidationError, model: type[Strict]) -> str:
    """The validation error in one line; a whole rule's (or file's) without a field named."""
    return describe_validation_error(where, exc, model).replace(": (top level): ", ": ")


def _rule_lines(node: Any) -> list[int]:
    """The line each item of the top-level `rules:` starts on."""
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if getattr(key, "value", None) == "rules" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []
