"""The scheduling pass, pure: what goes where, what waits and why, in figures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.scheduler.codec import dumps, pass_in, pass_out
from orbit.scheduler.model import Quota, SchedConfig, Snapshot
from orbit.scheduler.ordering import schedule
from tests.scheduler.build import NOW, ask, node, plan, run, running, where


def test_a_run_that_fits_nowhere_says_why_per_node_in_counts() -> None:
    nodes = [
        node("a1", "A100-40GB*4"),
        node("a2", "A100-40GB*4"),
        node("d", "H100-80GB*8", max_tasks=0),
        node("o", "H100-80GB*8", offline_s=45),
    ]
    p = plan(nodes, [run("x", ask("H100"))])
    record = p.decisions["run-x"]
    assert record["outcome"] == "waiting"
    [alt] = record["alternatives"]
    assert alt["counts"] == {"gpu_model": 2, "draining": 1, "offline": 1}
    by_node = {v["node"]: v for v in alt["nodes"]}
    assert by_node["a1"]["capacity"] == "A100-40GB"
    assert by_node["o"]["used"] == 45


def test_the_first_alternative_that_fits_wins() -> None:
    nodes = [node("a", "A100-80GB*2"), node("c", "", cpus=8)]
    p = plan(nodes, [run("x", ask("H100"), ask("A100-80GB:2"), ask(None, cpus=4))])
    assert where(p) == {"x": "a"}
    record = p.decisions["run-x"]
    assert record["chosen"]["alternative"] == 1
    assert record["alternatives"][0]["counts"] == {"gpu_model": 2}  # A100s; no GPU at all
    # GPUs taken: the same request falls through to its CPU alternative
    p = plan(
        nodes,
        [
            run("x", ask("A100-80GB:2"), ask(None, cpus=4)),
            run("y", ask("A100-80GB:2"), ask(None, cpus=4), at=1),
        ],
    )
    assert where(p) == {"x": "a", "y": "c"}


def test_a_run_that_cannot_fit_yet_never_holds_back_the_runs_behind_it() -> None:
    nodes = [node("h", "H100-80GB*1", used={0: 0.0}), node("a", "A100-80GB*2")]
    queue = [
        run("head", ask("H100")),
        run("next", ask("A100"), at=1),
        run("last", ask("A100"), at=2),
    ]
    p = plan(nodes, queue)
    assert where(p) == {"next": "a", "last": "a"}
    assert p.decisions["run-head"]["alternatives"][0]["counts"] == {"gpu_model": 1, "gpus_busy": 1}


def test_a_run_waiting_past_the_age_reserves_its_node_so_small_runs_cannot_starve_it() -> None:
    nodes = [node("a", "A100-80GB*2", used={0: 0.0})]  # one GPU free, two asked
    queue = [run("big", ask("A100:2"), at=-4000), run("small", ask("A100"), at=1)]
    young = plan(nodes, queue, SchedConfig(reserve_after_s=1e9))
    assert where(young) == {"small": "a"}  # backfilled
    old = plan(nodes, queue, SchedConfig(reserve_after_s=3600))
    assert where(old) == {}
    assert old.decisions["run-big"]["reserved"] == "a"
    small = old.decisions["run-small"]["alternatives"][0]
    assert small["counts"] == {"reserved": 1}
    assert small["nodes"][0]["detail"] == "run-big"


def test_tiers_order_the_queue_then_first_come() -> None:
    nodes = [node("a", "A100-80GB*1")]
    queue = [run("batch", ask("A100"), tier=3, at=0), run("urgent", ask("A100"), tier=0, at=5)]
    p = plan(nodes, queue)
    assert where(p) == {"urgent": "a"}
    assert p.order == ["run-urgent", "run-batch"]
    assert p.decisions["run-batch"]["position"] == 2


def test_within_a_tier_the_lowest_dominant_share_goes_first() -> None:
    held = (
        running("a", (0, 1), tier=2, user="alice", preemptible=False),
        running("b", (2,), tier=2, user="bob", preemptible=False),
    )
    nodes = [node("n", "A100-80GB*4", used={0: 0.0, 1: 0.0, 2: 0.0}, running=held)]
    queue = [
        run("alice2", ask("A100"), user="alice", at=0),
        run("bob2", ask("A100"), user="bob", at=9),
    ]
    assert where(plan(nodes, queue)) == {"bob2": "n"}  # bob holds 1/4, alice 2/4
    # a weight is a larger fair share: alice's 2/4 over 4 is 1/8, below bob's 1/4
    weighted = SchedConfig(quotas=(Quota("user", "alice", 99, weight=4.0),))
    assert where(plan(nodes, queue, weighted)) == {"alice2": "n"}


def test_a_run_over_its_quota_waits_with_the_figures_and_may_take_its_cpu_alternative() -> None:
    held = running("r", (0, 1), tier=2, user="alice", preemptible=False)
    nodes = [node("a", "A100-80GB*4", used={0: 0.0, 1: 0.0}, running=(held,))]
    config = SchedConfig(quotas=(Quota("user", "alice", 3),))
    p = plan(nodes, [run("x", ask("A100:2"), user="alice")], config)
    record = p.decisions["run-x"]
    assert record["outcome"] == "waiting"
    assert record["alternatives"][0]["quota"] == {
        "scope": "user",
        "name": "alice",
        "asked": 2,
        "used": 2,
        "limit": 3,
    }
    p = plan(nodes, [run("x", ask("A100:2"), ask(None, cpus=1), user="alice")], config)
    assert p.decisions["run-x"]["chosen"]["alternative"] == 1
    ok = plan(nodes, [run("x", ask("A100:1"), user="alice")], config)
    assert where(ok) == {"x": "a"}


def test_an_unhealthy_gpu_gets_no_work_and_the_decision_says_which() -> None:
    nodes = [node("a", "H100-80GB*2", sick={1: "xid 79"})]
    p = plan(nodes, [run("x", ask("H100:2")), run("y", ask("H100"), at=1)])
    assert where(p) == {"y": "a"}
    verdict = p.decisions["run-x"]["alternatives"][0]["nodes"][0]
    assert verdict["reason"] == "unhealthy" and verdict["detail"] == "gpu 1: xid 79"
    assert p.placements[0].nodes[0][2] == (0,)


def test_reservations_share_a_gpu_and_fill_the_fullest_first() -> None:
    nodes = [node("a", "A100-80GB*2", used={1: 30.0})]
    p = plan(nodes, [run("x", ask("A100", share=40)), run("y", ask("A100", share=40), at=1)])
    gpus = [pl.nodes[0][2] for pl in p.placements]
    assert gpus == [(1,), (0,)]  # the partly used GPU first; then it has no room for 40 more


def test_target_and_selector_narrow_the_nodes() -> None:
    nodes = [
        node("a", "A100-80GB*1", labels={"rack": "1"}),
        node("b", "A100-80GB*1", labels={"rack": "2"}),
    ]
    assert where(plan(nodes, [run("x", ask("A100"), target="b")])) == {"x": "b"}
    p = plan(nodes, [run("x", ask("A100"), selector=(("rack", "2"),))])
    assert where(p) == {"x": "b"}
    p = plan(nodes, [run("x", ask("A100"), selector=(("rack", "9"),))])
    assert p.decisions["run-x"]["alternatives"][0]["counts"] == {"selector": 2}


def test_binpack_fills_a_node_before_starting_another_and_spread_does_the_opposite() -> None:
    nodes = [node("a", "A100-80GB*4"), node("b", "A100-80GB*4", used={0: 0.0})]
    queue = [run(str(i), ask("A100"), at=i) for i in range(3)]
    assert set(where(plan(nodes, queue)).values()) == {"b"}
    spread = where(plan(nodes, queue, SchedConfig(scorer="spread")))
    assert sorted(spread.values()) == ["a", "a", "b"]


def test_a_node_that_caches_the_runs_model_is_preferred() -> None:
    nodes = [node("a", "A100-80GB*4"), node("b", "A100-80GB*4", cached=("meta-llama/Llama-3-8B",))]
    p = plan(nodes, [run("x", ask("A100"), cache_keys=("meta-llama/Llama-3-8B",))])
    assert where(p) == {"x": "b"}


def test_a_gang_is_placed_on_distinct_nodes_all_or_nothing() -> None:
    nodes = [node(n, "H100-80GB*8") for n in ("a", "b", "c")]
    p = plan(nodes, [run("g", ask("H100:8"), num_nodes=2)])
    assert len(p.placements[0].nodes) == 2 and len({n for _, n, _ in p.placements[0].nodes}) == 2
    p = plan(nodes, [run("g", ask("H100:8"), num_nodes=4)])
    assert p.placements == []
    assert p.decisions["run-g"]["alternatives"][0]["fits"] == 3


def test_an_urgent_run_preempts_the_fewest_cheapest_lower_tier_preemptible_attempts() -> None:
    nodes = [
        node(
            "a",
            "H100-80GB*2",
            used={0: 0.0, 1: 0.0},
            running=(running("b1", (0,), tier=3), running("b2", (1,), tier=3, started=10)),
        ),
        node("b", "H100-80GB*2", used={0: 0.0, 1: 0.0}, running=(running("big", (0, 1), tier=3),)),
        node(
            "c",
            "H100-80GB*2",
            used={0: 0.0, 1: 0.0},
            running=(running("keep", (0, 1), tier=3, preemptible=False),),
        ),
    ]
    p = plan(nodes, [run("u", ask("H100:2"), tier=0)])
    [pre] = p.preemptions
    assert pre.node == "b" and [v.attempt_id for v in pre.victims] == ["att-big"]
    record = p.decisions["run-u"]
    assert record["outcome"] == "preempting" and record["reserved"] == "b"
    assert record["victims"][0]["tier"] == "batch"
    p = plan(nodes, [run("u", ask("H100:1"), tier=0)])
    assert [v.attempt_id for v in p.preemptions[0].victims] == ["att-b2"]  # the newest of one


def test_no_preemption_within_a_tier_nor_of_a_higher_one_nor_during_the_cooldown() -> None:
    held = (running("n", (0,), tier=2),)
    nodes = [node("a", "H100-80GB*1", used={0: 0.0}, running=held)]
    assert plan(nodes, [run("x", ask("H100"), tier=2)]).preemptions == []
    assert plan(nodes, [run("x", ask("H100"), tier=3)]).preemptions == []
    cooled = [node("a", "H100-80GB*1", used={0: 0.0}, running=held, preempted_at=NOW - 10)]
    assert plan(cooled, [run("x", ask("H100"), tier=0)]).preemptions == []
    assert len(plan(nodes, [run("x", ask("H100"), tier=0)]).preemptions) == 1


def test_work_being_stopped_for_a_run_holds_its_node_for_that_run() -> None:
    stopping = running("b", (0,), tier=3, preempted_by="run-u")
    nodes = [node("a", "H100-80GB*2", used={0: 0.0}, running=(stopping,))]
    p = plan(nodes, [run("other", ask("H100"), tier=0, at=-5), run("u", ask("H100:2"), tier=0)])
    assert p.preemptions == []  # not a second time
    assert p.decisions["run-u"]["outcome"] == "preempting"
    assert p.decisions["run-other"]["alternatives"][0]["counts"] == {"reserved": 1}


# --- properties ---------------------------------------------------------------------------

MODELS = ["A100-40GB", "A100-80GB", "H100-80GB", "T4"]
nodes_st = st.lists(
    st.tuples(
        st.sampled_from(MODELS),
        st.integers(0, 4),
        st.integers(0, 3),
        st.lists(st.integers(0, 3), max_size=3),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)
runs_st = st.lists(
    st.tuples(
        st.lists(
            st.tuples(
                st.sampled_from(["A100", "H100", "T4", "A100..H100", "none"]), st.integers(1, 3)
            ),
            min_size=1,
            max_size=2,
        ),
        st.integers(0, 3),
        st.booleans(),
        st.sampled_from(["ann", "bob"]),
        st.integers(1, 2),
        st.sampled_from([0.0, 20.0]),
    ),
    max_size=12,
)


def _build(raw_nodes, raw_runs):  # type: ignore[no-untyped-def]
    nodes, n_running = [], 0
    for n, (model, count, max_tasks, busy, cordoned) in enumerate(raw_nodes):
        taken = tuple(sorted({b for b in busy if b < count}))
        held = tuple(
            running(f"h{n}-{i}", (g,), tier=(n + i) % 4, preemptible=bool((n + i) % 2))
            for i, g in enumerate(taken)
        )
        n_running += len(held)
        nodes.append(
            node(
                f"n{n}",
                f"{model}*{count}" if count else "",
                max_tasks=max(max_tasks, len(held)),
                used={g: 0.0 for g in taken},
                running=held,
                state="cordoned" if cordoned else "active",
                cpus=4,
            )
        )
    queue = []
    for i, (alts, tier, pre, user, num, share) in enumerate(raw_runs):
        asks = tuple(
            ask("none" if m == "none" else f"{m}:{c}", share=share if m != "none" else 0, cpus=1)
            for m, c in alts
        )
        queue.append(run(str(i), *asks, tier=tier, preemptible=pre, user=user, num_nodes=num, at=i))
    return nodes, queue


@settings(max_examples=150, deadline=None)
@given(nodes_st, runs_st)
def test_no_node_is_over_capacity_no_run_is_placed_twice_and_replay_is_identical(
    raw_nodes, raw_runs
) -> None:  # type: ignore[no-untyped-def]
    nodes, queue = _build(raw_nodes, raw_runs)
    config = SchedConfig(quotas=(Quota("user", "bob", 3),))
    p = plan(nodes, queue, config)
    placed = [pl.run_id for pl in p.placements]
    assert len(placed) == len(set(placed))
    by_node = {n.name: n for n in nodes}
    tasks = {n.name: len(n.running) for n in nodes}
    gpu_use: dict[tuple[str, int], float] = {}
    for n in nodes:
        for g in n.gpus:
            if g.used_gb is not None:
                gpu_use[n.name, g.index] = 99.0
    for pl in p.placements:
        names = [name for _, name, _ in pl.nodes]
        assert len(names) == len(set(names))  # a gang's nodes are distinct
        for _, name, gpus in pl.nodes:
            tasks[name] += 1
            assert tasks[name] <= by_node[name].max_tasks
            assert by_node[name].state == "active"
            assert len(gpus) == pl.ask.gpu.count
            for g in gpus:
                mem = next(x.memory_gb for x in by_node[name].gpus if x.index == g)
                before = gpu_use.get((name, g))
                assert before != 99.0  # never onto a GPU taken whole
                if pl.ask.gpu_share_gb:
                    gpu_use[name, g] = (before or 0.0) + pl.ask.gpu_share_gb
                    assert gpu_use[name, g] <= mem
                else:
                    assert before is None
                    gpu_use[name, g] = 99.0
    # bob's quota
    bob = sum(
        len(g)
        for pl in p.placements
        for _, _, g in pl.nodes
        if pl.run_id in {r.run_id for r in queue if r.user == "bob"}
    )
    assert bob <= 3
    # preemption only of preemptible attempts of a lower tier, never a cycle
    tier_of = {r.run_id: r.tier for r in queue}
    for pre in p.preemptions:
        for v in pre.victims:
            assert v.preemptible and v.tier > tier_of[pre.run_id]
    # replay: the same inputs through the stored form give the same bytes
    snapshot, again = pass_in(pass_out(Snapshot("v1", NOW, tuple(nodes)), queue))
    replayed = schedule(snapshot, again, config)
    assert dumps(replayed.decisions) == dumps(p.decisions)


def test_a_node_record_becomes_a_view_with_catalog_models_and_health() -> None:
    from datetime import UTC, datetime

    from orbit.model.nodes import NodeRecord, NodeState
    from orbit.scheduler.node_views import node_view

    info = {
        "accelerators": [
            {"index": 0, "model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559},
            {
                "index": 1,
                "model": "NVIDIA H100 80GB HBM3",
                "memory_mb": 81559,
                "healthy": False,
                "problem": "ecc 2 uncorrected since reset",
            },
            {"index": 2, "model": "", "memory_mb": 0, "healthy": False, "problem": "off the bus"},
        ],
        "cpus": 64,
        "memory_mb": 512 * 1024,
        "cached_models": ["meta-llama/Llama-3-8B"],
    }
    now = datetime.now(UTC)
    record = NodeRecord(
        id="node-1",
        name="n1",
        labels={"rack": "a"},
        info=info,
        state=NodeState.ACTIVE,
        max_tasks=4,
        created_at=now,
        created_by="admin",
        last_seen_at=now,
        gpus_in_use={0: 0.0},
    )
    view = node_view(record, now, ())
    assert [(g.model, g.healthy, g.used_gb) for g in view.gpus] == [
        ("H100-80GB", True, 0.0),
        ("H100-80GB", False, None),
        ("H100-80GB", False, None),
    ]
    assert view.offline_s is None and view.cpus == 64 and "meta-llama/Llama-3-8B" in view.cached
    busy = plan([view], [run("x", ask("H100"))]).decisions["run-x"]["alternatives"][0]
    assert busy["nodes"][0]["reason"] == "gpus_busy"  # the one healthy GPU is taken
    p = plan([view], [run("x", ask("H100:2"))])
    verdict = p.decisions["run-x"]["alternatives"][0]["nodes"][0]
    assert verdict["reason"] == "unhealthy" and "ecc 2 uncorrected" in verdict["detail"]


def test_a_waiting_run_is_given_an_estimated_start_from_max_runtimes() -> None:
    from dataclasses import replace

    limited = replace(running("r", (0,), tier=2), ends_by=NOW + 600)
    endless = running("e", (0,), tier=2)
    one = [node("a", "A100-80GB*1", used={0: 0.0}, running=(limited,))]
    p = plan(one, [run("x", ask("A100"))])
    assert p.decisions["run-x"]["estimated_start"] == NOW + 600
    other = [node("a", "A100-80GB*1", used={0: 0.0}, running=(endless,))]
    assert plan(other, [run("x", ask("A100"))]).decisions["run-x"]["estimated_start"] is None


def test_a_running_attempts_progress_gives_its_likely_end_to_the_minute() -> None:
    from datetime import UTC, datetime, timedelta

    from orbit.scheduler.request_views import eta_from_progress

    at = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
    started = at - timedelta(seconds=100)
    # 10 of 40 steps in 100 s: 300 s to go, from 12:00:00 -> 12:05:00
    assert eta_from_progress(10, 40, started, at) == (at + timedelta(seconds=300)).timestamp()
    # 3 of 40 in 100 s: 1233.3 s to go -> 12:20:33.3, kept as 12:21:00
    assert (
        eta_from_progress(3, 40, started, at)
        == datetime(2026, 11, 23, 12, 21, tzinfo=UTC).timestamp()
    )
    for step, total in ((None, 40), (0, 40), (10, None), (50, 40)):
        assert eta_from_progress(step, total, started, at) is None
