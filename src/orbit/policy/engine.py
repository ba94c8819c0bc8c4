"""A policy file compiled to CEL programs (the `common-expression-language` package: Rust's
cel-interpreter, microseconds a rule) and evaluated against one submission: each rule's
outcome, the refusals and warnings it gives, the defaults it sets. No `eval`, no expression
language of ORBIT's own.

A rule's variables: `request` (what is frozen: task type and request, template, resources,
env, priority, preemptible, num_nodes, max_runtime_s, target, selector, the names of its
secrets), `user` (`name`, `role`), `experiment` (its name), `now` (a timestamp, UTC) and
`usage` (`gpus`: the GPUs the submitter's runs hold now; `quota_gpus`: their quota, or null).

Cost is bounded where a rule is read: an expression of at most MAX_EXPR characters with at
most MAX_MACROS comprehensions (all, exists, exists_one, map, filter), over a request of bounded
size. A condition that cannot be evaluated (a missing field, a type error) counts as the rule's
`on_error` (deny by default) and is reported as an error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput
from orbit.policy.rules import Outcome, PolicyFile, Rule

MAX_EXPR = 2000
MAX_MACROS = 4
_MACRO = re.compile(r"\.\s*(all|exists|exists_one|map|filter)\s*\((?:\s*([A-Za-z_]\w*)\s*,)?")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
VARIABLES = ("request", "user", "experiment", "now", "usage")
RESOURCE_FIELDS = (
    "gpu_type", "gpu_count", "cpu_count", "memory_gb", "gpu_memory_gb", "gpu", "disk_gb",
    "any_of",
)  # fmt: skip


@dataclass(frozen=True)
class Compiled:
    rule: Rule
    match: Any  # cel.Program | None
    condition: Any
    message: tuple[tuple[str, Any], ...]  # (literal text, program or None) pairs


@dataclass
class Verdict:
    """What a policy says of one submission."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    denied: list[tuple[str, str]] = field(default_factory=list)  # (rule, message): enforced
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (rule, message)
    defaults: dict[str, Any] = field(default_factory=dict)  # applied (enforce mode)
    setters: list[str] = field(default_factory=list)  # the rules that gave them
    errors: list[tuple[str, str]] = field(default_factory=list)  # (rule, why)

    def refusal(self) -> str | None:
        """The one line a refused submit says, or None."""
        if not self.denied:
            return None
        rule, message = self.denied[0]
        more = f" (and {len(self.denied) - 1} more rule(s))" if len(self.denied) > 1 else ""
        return f"policy rule '{rule}': {message}{more}"


class CompiledPolicy:
    def __init__(self, policy: PolicyFile, source: str) -> None:
        self.policy = policy
        self.source = source
        self.rules = [_compile_rule(rule, source) for rule in policy.rules if rule.mode != "off"]

    def variables(self) -> set[str]:
        """The variables its rules read (what is worth reading for them)."""
        programs = [p for c in self.rules for p in (c.match, c.condition) if p is not None]
        programs += [p for c in self.rules for _, p in c.message if p is not None]
        return {name for program in programs for name in program.variables()}

    def type_errors(self, variables: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(rule, why) for each condition that mixes types it cannot, evaluated whether or not
        its match holds (a missing key is no type error here: the free-form parts of a
        request, its task and env, have none by default; check_fields names the others)."""
        import cel

        context = cel.Context(dict(variables))
        found = []
        for compiled in self.rules:
            rule = compiled.rule
            for part, program in (("match", compiled.match), (rule.kind, compiled.condition)):
                if program is None:
                    continue
                try:
                    _truth(program.execute(context))
                except KeyError:
                    continue
                except Exception as exc:
                    found.append((rule.name, f"{part}: {_why(exc)}"))
                    break
        return found

    def evaluate(self, variables: Mapping[str, Any]) -> Verdict:
        import cel

        context = cel.Context(dict(variables))
        verdict = Verdict()
        for compiled in self.rules:
            rule = compiled.rule
            try:
                applies = compiled.match is None or _truth(compiled.match.execute(context))
                fired = applies and (
                    compiled.condition is None or _truth(compiled.condition.execute(context))
                )
            except Exception as exc:  # a missing field, a type error: the rule's on_error
                verdict.errors.append((rule.name, _why(exc)))
                verdict.outcomes[rule.name] = "error"
                if rule.on_error == "deny" and rule.kind != "set":
                    self._fired(verdict, rule, f"could not be evaluated: {_why(exc)}")
                continue
            if not applies or (rule.kind != "set" and not fired):
                verdict.outcomes[rule.name] = "allow"
                continue
            if rule.kind == "set":
                verdict.outcomes[rule.name] = "set"
                if rule.mode == "enforce":
                    verdict.setters.append(rule.name)
                    for key, value in rule.set.items():
                        verdict.defaults.setdefault(key, value)
                continue
            self._fired(verdict, rule, _render(compiled.message, context))
        return verdict

    @staticmethod
    def _fired(verdict: Verdict, rule: Rule, message: str) -> None:
        verdict.outcomes.setdefault(rule.name, rule.kind)  # an error stays the outcome
        if rule.mode == "enforce" and rule.kind == "deny":
            verdict.denied.append((rule.name, message))
        elif rule.mode in ("enforce", "warn"):
            verdict.warnings.append((rule.name, message))


def compile_policy(policy: PolicyFile, source: str) -> CompiledPolicy:
    return CompiledPolicy(policy, source)


def _compile_rule(rule: Rule, source: str) -> Compiled:
    where = f"{source}: rule '{rule.name}' (line {rule.line})"
    message: list[tuple[str, Any]] = []
    text = rule.message or ""
    at = 0
    for found in _TEMPLATE.finditer(text):
        message.append((text[at : found.start()], None))
        message.append(("", _program(found.group(1).strip(), f"{where}: message", where)))
        at = found.end()
    message.append((text[at:], None))
    return Compiled(
        rule=rule,
        match=_program(rule.match, f"{where}: match", where) if rule.match else None,
        condition=(
            _program(rule.condition, f"{where}: {rule.kind}", where) if rule.condition else None
        ),
        message=tuple(message),
    )


def _program(expression: str, field: str, where: str) -> Any:
    import cel

    if len(expression) > MAX_EXPR:
        raise InvalidInput(f"{field}: over {MAX_EXPR} characters")
    code = _STRINGS.sub('""', expression)  # what is not in a string literal
    if len(_MACRO.findall(code)) > MAX_MACROS:
        raise InvalidInput(f"{field}: more than {MAX_MACROS} comprehensions (all, exists, map...)")
    try:
        program = cel.compile(expression)
    except Exception as exc:
        raise InvalidInput(f"{field}: not CEL: {_why(exc)}") from None
    bound = {m.group(2) for m in _MACRO.finditer(code) if m.group(2)}  # x of .all(x, ...)
    unknown = sorted(set(program.variables()) - set(VARIABLES) - bound)
    if unknown:
        raise InvalidInput(
            f"{field}: unknown variable {', '.join(unknown)} (known: {', '.join(VARIABLES)})"
        )
    bad = check_fields(expression)
    if bad is not None:
        raise InvalidInput(f"{field}: {bad}")
    return program


# the fields a rule may name under each variable; None: free-form (a task's own fields, env)
SCHEMA: dict[str, Any] = {
    "request": {
        "task_type": {}, "task": None, "template": {}, "launch_mode": None,
        "resources": {name: {} for name in RESOURCE_FIELDS}, "env": None, "secrets": {},
        "priority": {}, "preemptible": {}, "num_nodes": {}, "max_runtime_s": {},
        "stop_grace_s": {}, "target": {}, "selector": None,
    },
    "user": {"name": {}, "role": {}},
    "usage": {"gpus": {}, "quota_gpus": {}},
    "experiment": {},
    "now": {},
}  # fmt: skip
# CEL's string literals (raw, triple-quoted, or with escapes), to be left out of what is read
_STRINGS = re.compile(
    "|".join(
        [
            r"[rR]'''.*?'''",
            r'[rR]""".*?"""',
            r"[rR]'[^'\n]*'",
            r'[rR]"[^"\n]*"',
            r"'''(?:\\.|.)*?'''",
            r'"""(?:\\.|.)*?"""',
            r"'(?:\\.|[^'\\\n])*'",
            r'"(?:\\.|[^"\\\n])*"',
        ]
    ),
    re.S,
)
_PATH = re.compile(r"(?<![\w.])([A-Za-z_]\w*)((?:\s*\.\s*[A-Za-z_]\w*)+)\b(?!\s*\()")


def check_fields(expression: str) -> str | None:
    """The first dotted name in `expression` that no request, user or usage has (a typo such as
    `request.resources.gpu_cnt`), said in words; None when every one is known. Methods
    (`now.getHours()`) and the free-form parts (request.task, env, selector) are not checked."""
    code = _STRINGS.sub('""', expression)
    for found in _PATH.finditer(code):
        head = found.group(1)
        if head not in SCHEMA:
            continue
        node: Any = SCHEMA[head]
        path = head
        for part in (p.strip() for p in found.group(2).split(".")[1:]):
            if node is None:
                break
            if part not in node:
                known = ", ".join(node) or "none"
                return f"no field '{part}' in {path} (known: {known})"
            node, path = node[part], f"{path}.{part}"
    return None


def _truth(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"the condition gave {type(value).__name__} {value!r}, not a bool")
    return value


def _render(parts: tuple[tuple[str, Any], ...], context: Any) -> str:
    """The message with its {{ CEL }} parts' values, on one line."""
    out = []
    for text, program in parts:
        if program is None:
            out.append(text)
            continue
        try:
            out.append(str(program.execute(context)))
        except Exception:
            out.append("?")
    return " ".join("".join(out).split())


def _why(exc: Exception) -> str:
    """A CEL error in one short line (its long hint and its caret drawing left out)."""
    text = " ".join(str(exc).split())
    for cut in (". CEL does not coerce", ". Check that the variable", " | ", " expecting {"):
        text = text.split(cut)[0]
    if isinstance(exc, KeyError):
        text = f"no field {text}"
    return text[:300]


def request_view(
    request: Mapping[str, Any], task_type: str, task_request: Mapping[str, Any]
) -> dict[str, Any]:
    """`request` as rules read it, from a run's resolved request (ExecutionRequest as JSON)
    and its task: every field present (null where unset), so that a rule reads a field that
    is not set as null rather than failing."""
    resources = dict(request.get("resources") or {})
    task_env = task_request.get("env") if isinstance(task_request.get("env"), dict) else {}
    return {
        "task_type": task_type,
        "task": dict(task_request),
        "template": request.get("template_id"),
        "launch_mode": dict(request.get("launch_mode") or {}),
        "resources": {name: resources.get(name) for name in RESOURCE_FIELDS},
        "env": {**(request.get("runtime_env") or {}), **(task_env or {})},
        "secrets": sorted(request.get("secrets") or {}),
        "priority": request.get("priority", "normal"),
        "preemptible": bool(request.get("preemptible", False)),
        "num_nodes": int(request.get("num_nodes", 1)),
        "max_runtime_s": request.get("max_runtime_s"),
        "stop_grace_s": request.get("stop_grace_s"),
        "target": request.get("target"),
        "selector": dict(request.get("selector") or {}),
    }


def variables(
    request: dict[str, Any],
    user: Mapping[str, Any],
    experiment: str,
    now: datetime,
    usage: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "request": request,
        "user": {"name": user.get("name", ""), "role": user.get("role", "member")},
        "experiment": experiment,
        "now": now,
        "usage": {"gpus": usage.get("gpus", 0), "quota_gpus": usage.get("quota_gpus")},
    }
