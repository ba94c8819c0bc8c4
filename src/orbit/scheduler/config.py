"""The scheduler's config: a YAML mapping an admin writes (`orbit server --scheduler-config`,
`orbit sched simulate --config`), read into a SchedConfig with one-line errors that name the
field. Quotas are admin settings kept in the store (`orbit quotas`); a config file may give
its own to try them out in a simulation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.scheduler.model import DEFAULT_TIERS, Quota, SchedConfig


class _Preemption(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    cooldown_s: float = Field(default=300.0, ge=0)
    max_per_pass: int = Field(default=4, ge=0)


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str | None = None
    experiment: str | None = None
    gpus: int = Field(ge=0)
    weight: float = Field(default=1.0, gt=0)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tiers: list[str] = Field(default=list(DEFAULT_TIERS), min_length=1)
    scorer: str = Field(default="binpack", pattern="^(binpack|spread)$")
    weights: dict[str, float] = {}
    score_nodes: int = Field(default=8, ge=1, le=10_000)
    reserve_after_s: float = Field(default=1800.0, ge=0)
    preemption: _Preemption = _Preemption()
    quotas: list[_Quota] | None = None
    filters: list[str] = []

    @field_validator("tiers")
    @classmethod
    def _distinct(cls, tiers: list[str]) -> list[str]:
        if len(set(tiers)) != len(tiers):
            raise ValueError("a tier is named twice")
        return tiers


def quota_of(raw: dict[str, Any], where: str) -> Quota:
    try:
        q = _Quota.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(where, exc, _Quota)) from None
    if (q.user is None) == (q.experiment is None):
        raise InvalidInput(f"{where}: a quota names either a user or an experiment, not both")
    scope, name = ("user", q.user) if q.user is not None else ("experiment", q.experiment)
    return Quota(scope=scope, name=str(name), gpus=q.gpus, weight=q.weight)


def config_from_dict(
    data: dict[str, Any], where: str = "scheduler config", quotas: tuple[Quota, ...] = ()
) -> SchedConfig:
    """A config from its mapping. `quotas` are the store's, used unless the mapping gives its
    own."""
    try:
        f = _File.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(where, exc, _File)) from None
    weights = {"binpack": 1.0, "spread": 1.0, "cached": 0.5, **f.weights}
    if f.quotas is not None:
        quotas = tuple(
            quota_of(q.model_dump(), f"{where}: quotas[{n}]") for n, q in enumerate(f.quotas)
        )
    return SchedConfig(
        tiers=tuple(f.tiers),
        scorer=f.scorer,
        weights=weights,
        score_nodes=f.score_nodes,
        reserve_after_s=f.reserve_after_s,
        preemption=f.preemption.enabled,
        preempt_cooldown_s=f.preemption.cooldown_s,
        max_preemptions_per_pass=f.preemption.max_per_pass,
        quotas=tuple(sorted(quotas, key=lambda q: (q.scope, q.name))),
        filters=tuple(f.filters),
    )


def config_to_dict(config: SchedConfig) -> dict[str, Any]:
    """The mapping that reads back to `config` (stored beside each pass, for replay)."""
    return {
        "tiers": list(config.tiers),
        "scorer": config.scorer,
        "weights": dict(config.weights),
        "score_nodes": config.score_nodes,
        "reserve_after_s": config.reserve_after_s,
        "preemption": {
            "enabled": config.preemption,
            "cooldown_s": config.preempt_cooldown_s,
            "max_per_pass": config.max_preemptions_per_pass,
        },
        "quotas": [{q.scope: q.name, "gpus": q.gpus, "weight": q.weight} for q in config.quotas],
        "filters": list(config.filters),
    }
