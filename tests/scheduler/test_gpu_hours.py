"""GPU-hours over a period: what the console's fair share shows and exports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orbit.scheduler.gpu_hours import gpu_hours, gpus_of

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_hours_are_clipped_to_the_period_and_split_into_its_steps() -> None:
    rows = [
        # 2 GPUs from an hour before the period to 2 h in: 2 h of it count, all in step 0
        ("ann", "exp-a", {"resources": {"gpu_count": 2}}, at(-1), at(2)),
        # the compact form, 2 nodes of 4: 8 GPUs for 1 h, from 5 h to 6 h (step 1)
        ("bob", "exp-b", {"resources": {"gpu": "H100:80GB:4"}, "num_nodes": 2}, at(5), at(6)),
        # still running: counts up to the period's end (from 10 h to 12 h, step 2)
        ("ann", "exp-b", {"resources": {"gpu_count": 1}}, at(10), None),
        # no GPUs, never started, or after the period: nothing
        ("cid", "exp-a", {"resources": {"gpu_count": 0}}, at(1), at(2)),
        ("cid", "exp-a", {"resources": {"gpu_count": 4}}, None, None),
        ("cid", "exp-a", {"resources": {"gpu_count": 4}}, at(13), at(14)),
    ]
    found = gpu_hours(rows, at(0), at(12), steps=3)
    assert found.users == {"ann": pytest.approx(6.0), "bob": pytest.approx(8.0)}
    assert found.experiments == {"exp-a": pytest.approx(4.0), "exp-b": pytest.approx(10.0)}
    assert found.per_step["ann"] == [pytest.approx(4.0), 0.0, pytest.approx(2.0)]
    assert found.per_step["bob"] == [0.0, pytest.approx(8.0), 0.0]
    assert found.steps[1] - found.steps[0] == 4 * 3600


def test_an_attempt_across_steps_is_shared_between_them() -> None:
    rows = [("ann", "e", {"resources": {"gpu_count": 1}}, at(3), at(5))]
    assert gpu_hours(rows, at(0), at(8), steps=2).per_step["ann"] == [1.0, 1.0]


def test_a_request_the_store_kept_oddly_counts_no_gpus() -> None:
    assert gpus_of({"resources": {"gpu": "not a gpu ask"}}) == 0
    assert gpus_of({}) == 0
