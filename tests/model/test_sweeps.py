"""A sweep's points and how they fill a task: the grid's every combination in order, listed
points, ranges, the placeholders a point fills (and those it must leave alone: a shell's ${x},
JSON braces, an escaped {{x}}), and each bad sweep refused in one line naming where."""

from __future__ import annotations

import pytest

from orbit.model.errors import InvalidInput
from orbit.model.sweeps import (
    Sweep,
    check_fills,
    expand,
    fill,
    parse_sweep_flag,
    sweep_env,
    sweep_of,
    with_flags,
)


def test_a_grid_gives_every_combination_its_first_axis_slowest() -> None:
    sweep = with_flags(None, ["lr=1e-4,3e-4", "seed=0..2"])
    assert sweep is not None
    assert expand(sweep) == [
        {"lr": lr, "seed": seed} for lr in ("1e-4", "3e-4") for seed in ("0", "1", "2")
    ]
    assert parse_sweep_flag("n=0..8..4") == ("n", ["0", "4", "8"])
    assert parse_sweep_flag("n=-2..0") == ("n", ["-2", "-1", "0"])


def test_listed_points_are_taken_as_they_are_and_with_a_grid_each_meets_every_combination() -> None:
    listed = sweep_of({"points": [{"lr": 1, "wd": 0}, {"lr": 2, "wd": 0.1}]}, "spec.yaml")
    assert expand(listed) == [{"lr": "1", "wd": "0"}, {"lr": "2", "wd": "0.1"}]
    both = Sweep(grid={"seed": "0..1"}, points=[{"lr": "1"}, {"lr": "2"}])
    assert expand(both) == [
        {"seed": "0", "lr": "1"},
        {"seed": "0", "lr": "2"},
        {"seed": "1", "lr": "1"},
        {"seed": "1", "lr": "2"},
    ]
    # a flag's axis replaces the spec's axis of that name and keeps the others
    spec = Sweep(grid={"lr": ["1", "2"], "seed": "0..1"})
    assert with_flags(spec, ["lr=5"]) == Sweep(grid={"lr": ["5"], "seed": "0..1"})
    assert with_flags(spec, []) is spec


def test_a_point_fills_its_placeholders_and_leaves_everything_else_as_written() -> None:
    task = {
        "command": ["python", "t.py", "--lr={lr}", "{{lr}}", "${HOME}", '{"a": {"b": {seed}}}'],
        "env": {"TAG": "run-{lr}-{seed}"},
        "workdir": "{lr}",  # not a filled field: left as it is
    }
    check_fills(task, ("lr", "seed"), "spec.yaml")
    assert fill(task, {"lr": "0.1", "seed": "3"}) == {
        "command": ["python", "t.py", "--lr=0.1", "{lr}", "${HOME}", '{"a": {"b": 3}}'],
        "env": {"TAG": "run-0.1-3"},
        "workdir": "{lr}",
    }
    args = {"args": {"learning_rate": "{lr}", "steps": 10}}  # ms-swift's args: a mapping
    assert fill(args, {"lr": "1e-5"}) == {"args": {"learning_rate": "1e-5", "steps": 10}}
    assert sweep_env({"lr": "0.1", "batch_size": "8"}) == {
        "ORBIT_SWEEP_LR": "0.1",
        "ORBIT_SWEEP_BATCH_SIZE": "8",
    }


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["lr="], "--sweep lr: expected one value or more (an empty one is not a value)"),
        (["lr=1,,2"], "--sweep lr: expected one value or more (an empty one is not a value)"),
        (["seed=0...4"], "--sweep seed: malformed range '0...4' (expected A..B or A..B..STEP"),
        (["seed=4..0"], "--sweep seed: range '4..0' is empty"),
        (["seed=a..b"], "--sweep seed: malformed range 'a..b'"),
        (["seed=0.." + "9" * 5000], "--sweep seed: malformed range"),
        (["lr"], "--sweep 'lr': expected NAME=V1,V2,... or NAME=A..B"),
        (["9lr=1"], "--sweep 9lr: not a sweep key"),
        (["lr=1,1"], "--sweep lr: a value is given twice"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flags: list[str], said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        with_flags(None, flags)
    assert str(refused.value).startswith(said)


def test_a_bad_sweep_is_refused_naming_the_field() -> None:
    def refused(sweep: Sweep, max_points: int = 10_000) -> str:
        with pytest.raises(InvalidInput) as exc:
            expand(sweep, max_points, "spec.yaml: sweep")
        return str(exc.value)

    assert refused(Sweep()) == "spec.yaml: sweep: no points (give grid axes or points)"
    assert refused(Sweep(grid={"lr": []})).startswith("spec.yaml: sweep.grid.lr: expected one")
    assert refused(Sweep(points=[{}])).startswith("spec.yaml: sweep.points[0]: an empty point")
    assert refused(Sweep(points=[{"a": "1"}, {"b": "1"}])) == (
        "spec.yaml: sweep.points: every point must name the same keys"
    )
    assert refused(Sweep(grid={"a": "1"}, points=[{"a": "2"}])).startswith(
        "spec.yaml: sweep.points[0].a: also an axis of the grid"
    )
    assert refused(Sweep(grid={"a": "0..99", "b": "0..100"})).startswith(
        "spec.yaml: sweep: more than 10,000 points"
    )
    assert refused(Sweep(grid={"a": "0..9"}), max_points=9) == (
        "spec.yaml: sweep.grid.a: range '0..9' has more than 9 values (more points than one "
        "sweep may make)"
    )
    assert refused(Sweep(grid={"a": "0..2", "b": "0..3"}), max_points=9).startswith(
        "spec.yaml: sweep: more than 9 points"
    )
    assert len(expand(Sweep(grid={"a": "0..99", "b": "0..99"}))) == 10_000  # the most: taken
    # counted before anything is made: five huge axes are refused at once, not built
    huge = Sweep(grid={f"k{i}": "0..999999" for i in range(5)})
    assert refused(huge).startswith("spec.yaml: sweep.grid.k0: range '0..999999' has more than")
    assert refused(Sweep(grid={f"k{i}": "1" for i in range(65)})) == (
        "spec.yaml: sweep: more than 64 keys"
    )
    assert refused(Sweep(grid={"lr": "1", "LR": "2"})) == (
        "spec.yaml: sweep: keys 'lr' and 'LR' would both be ORBIT_SWEEP_LR; name them apart"
    )
    assert expand(sweep_of({"grid": {"flag": [True, False]}}, "spec.yaml")) == [
        {"flag": "true"},
        {"flag": "false"},
    ]
    with pytest.raises(InvalidInput, match=r"^spec.yaml: sweep.grid.lr"):
        sweep_of({"grid": {"lr": {"a": 1}}}, "spec.yaml")
    with pytest.raises(InvalidInput, match=r"^spec.yaml: sweep.mesh"):
        sweep_of({"mesh": {}}, "spec.yaml")


def test_every_placeholder_needs_a_key_and_every_key_a_placeholder() -> None:
    task = {"command": "train --lr {lr} --wd {wd}"}
    with pytest.raises(InvalidInput) as exc:
        check_fills(task, ("lr",), "spec.yaml")
    assert str(exc.value) == (
        "spec.yaml: task.command: placeholder {wd} is filled by no sweep key (keys: lr; "
        "write {{wd}} to keep it as it is)"
    )
    with pytest.raises(InvalidInput) as exc:
        check_fills(task, ("lr", "wd", "seed"), "spec.yaml")
    assert str(exc.value) == (
        "spec.yaml: sweep key 'seed' fills nothing: write {seed} where its value goes in "
        "task.args, task.command or task.env"
    )
    check_fills({"args": ["{{x}}", "{lr}"]}, ("lr",), "spec.yaml")  # an escaped one needs none
