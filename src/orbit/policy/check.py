"""`orbit policy check`: a policy file read, compiled and tried before it is applied. Every rule
is evaluated against a request with every field set to its default (a field a rule names that
no request has, or a comparison of mismatched types, is named with its rule and line), then
the file's own `tests:` are run, each case's request laid over that default one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from orbit.model.errors import InvalidInput
from orbit.model.models import Record
from orbit.model.overrides import merge
from orbit.policy.engine import CompiledPolicy, compile_policy, request_view, variables
from orbit.policy.rules import MODES, PolicyFile, digest, parse_policy

# the time a test case is evaluated at, unless it says: a Monday, 10:00 UTC
CASE_NOW = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


class CaseResult(Record):
    name: str
    passed: bool
    failures: list[str] = []  # "rule R gave allow, expected deny"


class CheckReport(Record):
    """What `policy check` found: the file's hash, its rules, and each test case's result."""

    sha256: str
    rules: int
    modes: dict[str, int]  # how many rules in each mode
    tests: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tests)


def default_request() -> dict[str, Any]:
    """A request with every field present, as a submit to the `local` template would freeze."""
    from orbit.model.models import ExecutionDefaults

    defaults = ExecutionDefaults().model_dump(mode="json")
    resolved = {
        **defaults,
        "template_id": "local",
        "launch_mode": {"kind": "host_process"},
        "placement": {"kind": "local"},
    }
    return request_view(resolved, "command", {"command": "true", "env": {}})


# the fields a request may leave null, given a value of their type: a condition is tried on
# this whether or not its match holds (a match that guards a null, `request.max_runtime_s !=
# null`, is not seen); a rule that compares a null at run time meets its on_error
TYPED: dict[str, Any] = {
    "resources": {"gpu_type": "", "gpu_memory_gb": 0.0, "gpu": "", "disk_gb": 0.0, "any_of": []},
    "max_runtime_s": 0.0,
    "target": "",
}


def check_policy(text: str, source: str) -> tuple[PolicyFile, CompiledPolicy, CheckReport]:
    """The file parsed, compiled and checked; InvalidInput (one line naming the file, the rule
    and its line) when it cannot be used at all. Failing test cases are in the report."""
    policy = parse_policy(text, source)
    compiled = compile_policy(policy, source)
    for name, why in compiled.type_errors(sample(TYPED)):
        rule = next(r for r in policy.rules if r.name == name)
        raise InvalidInput(f"{source}: rule '{name}' (line {rule.line}): {why}")
    results = [_run_case(compiled, case) for case in policy.tests]
    modes = {m: sum(1 for r in policy.rules if r.mode == m) for m in MODES}
    report = CheckReport(sha256=digest(text), rules=len(policy.rules), modes=modes, tests=results)
    return policy, compiled, report


def sample(
    request: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    experiment: str = "default",
    usage: dict[str, Any] | None = None,
    now: datetime = CASE_NOW,
) -> dict[str, Any]:
    """A rule's variables for a request laid over the default one."""
    view = merge(default_request(), request or {})
    who = {"name": "tester", "role": "member", **(user or {})}
    return variables(view, who, experiment, now, usage or {})


def _run_case(compiled: CompiledPolicy, case: Any) -> CaseResult:
    now = case.now if case.now is not None else CASE_NOW
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    verdict = compiled.evaluate(sample(case.request, case.user, case.experiment, case.usage, now))
    failures = [
        f"rule {name} gave {verdict.outcomes.get(name, 'allow')}, expected {want}"
        for name, want in case.expect.items()
        if verdict.outcomes.get(name, "allow") != want
    ]
    return CaseResult(name=case.name, passed=not failures, failures=failures)
