"""Retention rules: how many checkpoints of a run to keep, and how long the artifacts of an ended
run stay, with a rule per experiment over the defaults. A server reads them from the `storage:`
section of its config file and applies them in its gc loop; embedded, `orbit gc` reads
ORBIT_STORAGE_CONFIG, else $ORBIT_HOME/storage.yaml (the same mapping as `storage:`)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from orbit.model.models import Strict

DAY_S = 86400.0


class Rule(Strict):
    """One experiment's rule (or the defaults). None: keep them all, keep them for good."""

    keep_checkpoints: int | None = Field(
        default=None, ge=1, le=100_000, description="the newest N checkpoints of each run"
    )
    artifacts_days: float | None = Field(
        default=None,
        gt=0,
        le=100 * 365,
        description="remove the artifacts of runs that ended more than this many days ago",
    )


class Retention(Rule):
    """The defaults, and per experiment (by name) a rule whose keys replace them."""

    experiments: dict[str, Rule] = Field(default_factory=dict)

    def for_experiment(self, name: str) -> Rule:
        own = self.experiments.get(name)
        if own is None:
            return Rule(keep_checkpoints=self.keep_checkpoints, artifacts_days=self.artifacts_days)
        given = own.model_fields_set  # `artifacts_days: null` there means kept for good
        return Rule(
            keep_checkpoints=(
                own.keep_checkpoints if "keep_checkpoints" in given else self.keep_checkpoints
            ),
            artifacts_days=own.artifacts_days if "artifacts_days" in given else self.artifacts_days,
        )

    @property
    def empty(self) -> bool:
        """No rule removes anything (gc then removes only what nothing refers to)."""
        rules = [self, *self.experiments.values()]
        return all(r.keep_checkpoints is None and r.artifacts_days is None for r in rules)


class StorageConfig(Strict):
    """`storage:` in the server's config file (or the whole of storage.yaml, embedded)."""

    retention: Retention = Field(default_factory=Retention)
    gc_every_s: float = Field(
        default=3600.0,
        ge=0,
        le=30 * DAY_S,
        description="how often the server's gc loop applies the rules (0: never; `orbit gc`)",
    )


def config_file(home: Path) -> Path | None:
    """ORBIT_STORAGE_CONFIG, else $ORBIT_HOME/storage.yaml where there is one."""
    named = os.environ.get("ORBIT_STORAGE_CONFIG")
    if named:
        return Path(named).expanduser()
    default = home / "storage.yaml"
    return default if default.is_file() else None


def load_storage_config(path: Path | None) -> StorageConfig:
    """The file's rules (one line naming the file and field when it is wrong); none: no rules."""
    if path is None:
        return StorageConfig()
    from pydantic import ValidationError

    from orbit.model.errors import InvalidInput, describe_validation_error
    from orbit.model.yamlio import load_yaml_mapping

    data = load_yaml_mapping(path)
    try:
        return StorageConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(str(path), exc)) from None
