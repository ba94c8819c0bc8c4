"""A site's own filters and scorers: entry points in the groups `orbit.scheduler.filters` and
`orbit.scheduler.scorers`, named in the scheduler config (`filters: [name]`, `weights:
{name: w}`), loaded by name."""

from __future__ import annotations

from typing import Any

from orbit.scheduler.scorers import SCORERS


def plugins(group: str, names: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The entry points of `group` named in `names` (a site's own checks), loaded; a name no
    installed package provides is refused by name."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=group)}
    out = {}
    for name in names:
        if name not in found:
            from orbit.model.errors import InvalidInput

            known = ", ".join(sorted(found)) or "none installed"
            raise InvalidInput(f"scheduler config: no {group} plugin '{name}' (known: {known})")
        out[name] = found[name].load()
    return out


def site_checks(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The site's own filters and scorers a scheduler config names (entry points): filters by
    `filters: [name]`, scorers by a weight under a name ORBIT does not have."""
    filters = plugins("orbit.scheduler.filters", config.filters) if config.filters else {}
    extra = [name for name in config.weights if name not in SCORERS]
    scorers = plugins("orbit.scheduler.scorers", extra) if extra else {}
    return filters, scorers
