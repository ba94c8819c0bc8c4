"""Run dependencies: a spec's `after: {ok: [RUN...], any: [RUN...]}`, Slurm's afterok and
afterany. A run with dependencies is launched only once every run it names has ended: under
`ok` each must have succeeded (one that ends otherwise fails the dependent, `dependency_failed`,
without an automatic retry), under `any` however it ended. Only runs that already exist can be
named, so no cycle can ever be made. Pure: the store keeps them (orbit.store.dependencies) and
the control plane's launch path holds a run back on them (orbit.core.control.dependencies)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from orbit.model.states import FailureReason, RunState

KINDS = ("ok", "any")  # Slurm's afterok and afterany
MAX_DEPENDENCIES = 100  # runs one run may wait for
HELD = "after"  # attempts.held: the gate that holds it back (its dependencies)
# a run id (`run-` and hex) or a unique prefix of one, as every command takes it
RUN_REF = re.compile(r"^(run-)?[0-9a-f]{4,40}$")


def not_a_run(ref: str) -> str | None:
    """Why `ref` cannot name a run to wait for, or None: anything but a run id (or a prefix
    of one) is refused, a group of runs too (its runs are named one by one)."""
    if RUN_REF.fullmatch(ref):
        return None
    return (
        f"'{ref}' is not a run id: only runs can be waited for (a sweep's group: name its "
        "runs, as `orbit runs list --group GROUP` shows them); give a run's id"
    )


def _run_ref(ref: str) -> str:
    why = not_a_run(ref)
    if why is not None:
        raise ValueError(why)
    return ref


RunRef = Annotated[str, AfterValidator(_run_ref)]


class After(BaseModel):
    """The runs a run waits for, by kind: `ok` (each must succeed) and `any` (each must end)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    ok: tuple[RunRef, ...] = Field(default=(), max_length=MAX_DEPENDENCIES)
    any: tuple[RunRef, ...] = Field(default=(), max_length=MAX_DEPENDENCIES)

    @model_validator(mode="after")
    def _at_most(self) -> After:
        if len(self.ok) + len(self.any) > MAX_DEPENDENCIES:
            raise ValueError(f"at most {MAX_DEPENDENCIES} runs to wait for")
        return self

    def named(self) -> list[tuple[str, int, str]]:
        """(kind, index, ref) of every run named, `ok` first, in the order written."""
        return [(kind, i, ref) for kind in KINDS for i, ref in enumerate(getattr(self, kind))]

    def __bool__(self) -> bool:
        return bool(self.ok or self.any)


@dataclass(frozen=True)
class Needed:
    """A run this one waits for, and how that run stands now (its current attempt)."""

    run_id: str
    kind: str  # ok | any
    state: RunState
    reason: FailureReason | None = None

    @property
    def ended(self) -> bool:
        return self.state.terminal


@dataclass(frozen=True)
class Judgement:
    """Whether a run may be launched: `failed` names an `ok` dependency that ended without
    success (the run fails), else `waiting` lists those still to end (empty: it may go)."""

    waiting: tuple[Needed, ...] = ()
    failed: Needed | None = None

    @property
    def met(self) -> bool:
        return self.failed is None and not self.waiting


def judge(needed: list[Needed]) -> Judgement:
    """An `ok` dependency that ended otherwise fails the run at once, whatever the others are
    doing (as Slurm's afterok does); otherwise the run waits for every one to end."""
    for dep in needed:
        if dep.kind == "ok" and dep.ended and dep.state is not RunState.SUCCEEDED:
            return Judgement(failed=dep)
    return Judgement(waiting=tuple(d for d in needed if not d.ended))


def waiting_message(waiting: tuple[Needed, ...]) -> str:
    """What a held run says it waits for: the runs still to end, by kind. No states: they
    change without the held run hearing of it, and a message must never go stale."""
    parts = []
    for kind in KINDS:
        ids = [d.run_id for d in waiting if d.kind == kind]
        if ids:
            parts.append(f"after.{kind}: {', '.join(ids)}")
    return "waiting for its dependencies to end (" + "; ".join(parts) + ")"


def failed_message(dep: Needed) -> str:
    how = f"{dep.state} ({dep.reason})" if dep.reason is not None else str(dep.state)
    return (
        f"dependency {dep.run_id} ended {how}, and this run was to start only after it "
        "succeeded (after.ok); retry it, then retry this run"
    )
