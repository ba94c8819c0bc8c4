"""Filters and scorers are plugins: a package's entry points in `orbit.scheduler.filters` and
`orbit.scheduler.scorers`, named by the scheduler config."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit.model.errors import InvalidInput
from orbit.scheduler.config import config_from_dict
from orbit.scheduler.model import Snapshot
from orbit.scheduler.ordering import schedule
from orbit.scheduler.plugins import site_checks
from tests.scheduler.build import NOW, ask, node, run, where


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[None]:
    """The site package installed the way pip leaves it: a dist-info with entry points."""
    info = tmp_path / "orbit_site_checks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: orbit-site-checks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[orbit.scheduler.filters]\nmaintenance = tests.scheduler.site_plugin:under_maintenance\n"
        "[orbit.scheduler.scorers]\nrack_a = tests.scheduler.site_plugin:rack_a\n"
    )
    sys.path.insert(0, str(tmp_path))
    yield
    sys.path.remove(str(tmp_path))


def test_a_sites_filter_and_scorer_take_part_in_placement(installed: None) -> None:
    config = config_from_dict({"filters": ["maintenance"], "weights": {"rack_a": 5}})
    nodes = [
        node("m", "A100-80GB*8", labels={"maintenance": "yes", "rack": "a"}),
        node("b", "A100-80GB*8", labels={"rack": "b"}, used={0: 0.0}),
        node("a", "A100-80GB*8", labels={"rack": "a"}),
    ]
    snapshot = Snapshot("v", NOW, tuple(nodes))
    p = schedule(snapshot, [run("x", ask("A100"))], config, *site_checks(config))
    assert where(p) == {"x": "a"}  # not m (maintenance), and rack a over the fuller b
    p = schedule(snapshot, [run("y", ask("A100"), target="m")], config, *site_checks(config))
    [alt] = p.decisions["run-y"]["alternatives"]
    assert alt["counts"] == {"plugin": 1, "target": 2}
    assert alt["nodes"][0] == {
        "node": "m",
        "reason": "plugin",
        "detail": "maintenance: maintenance",
    }


def test_a_plugin_that_is_not_installed_is_refused_by_name() -> None:
    config = config_from_dict({"filters": ["nope"]})
    with pytest.raises(InvalidInput, match=r"no orbit\.scheduler\.filters plugin 'nope'"):
        site_checks(config)
