"""The quota runtime calculation (spec §3.5–3.7): distribution math, the tree's propagation, laziness and the
incremental bookkeeping checked against the from-scratch `compute_states`."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import quota as q
from services.quota import distribute as d
from services.quota import pods, recompute, validation
from services.quota import runtime as rt

ROOT = q.ROOT_QUOTA


def spec(
    name: str,
    minimum: int = 0,
    maximum: int = 100_000,
    *,
    weight: int | None = None,
    parent: str = ROOT,
    lent: bool = True,
    is_parent: bool = False,
    key: str = "cpu",
) -> q.QuotaSpec:
    return q.QuotaSpec(
        name=name,
        parent=parent,
        is_parent=is_parent,
        allow_lent_resource=lent,
        min={key: minimum},
        max={key: maximum},
        shared_weight={key: maximum if weight is None else weight},
    )


def worked_example_tree(c_request: int = 50_000) -> rt.QuotaTree:
    """§3.7: total 100 cores; A min 20 req 30 w 60, B min 30 req 10, C min 20 req 50 w 40, D min 10 not lending."""
    tree = rt.QuotaTree({"cpu": 100_000})
    tree.set_quota(spec("A", 20_000, weight=60_000))
    tree.set_quota(spec("B", 30_000, weight=1))
    tree.set_quota(spec("C", 20_000, weight=40_000))
    tree.set_quota(spec("D", 10_000, weight=1, lent=False))
    for name, request in {"A": 30_000, "B": 10_000, "C": c_request, "D": 0}.items():
        tree.set_request(name, {"cpu": request})
    return tree


# --- the distribution math


def test_hamilton_rounding_example_gives_the_unit_to_the_first_name() -> None:
    shares, units = d.hamilton_shares(10, [("c", 1), ("a", 1), ("b", 1)])
    assert shares == {"a": 4, "b": 3, "c": 3}
    assert units == {"a"}


def test_hamilton_largest_remainder_beats_name_and_zero_weight_gets_nothing() -> None:
    # 10 × 2/7 = 2.857 (rem 6), 10 × 4/7 = 5.714 (rem 5), weight 1 → 1.428 (rem 3); W counts the −0 weight too.
    shares, units = d.hamilton_shares(10, [("a", 1), ("b", 2), ("c", 4), ("z", 0)])
    assert shares == {"a": 1, "b": 3, "c": 6, "z": 0}
    assert units == {"b", "c"}
    assert sum(shares.values()) == 10


def test_hamilton_is_exact_for_huge_memory_amounts() -> None:
    total = 2**62 + 7
    shares, _ = d.hamilton_shares(total, [("a", 3), ("b", 3), ("c", 3)])
    assert sum(shares.values()) == total
    assert shares["a"] == total // 3 + 1


def test_distribute_worked_example_rounds() -> None:
    claims = [
        d.Claim("A", request=30, min=20, weight=60),
        d.Claim("B", request=10, min=30, weight=1),
        d.Claim("C", request=50, min=20, weight=40),
        d.Claim("D", request=10, min=10, weight=1, allow_lent=False),
    ]
    dist = d.distribute(100, claims)
    assert dist.runtimes == {"A": 30, "B": 10, "C": 50, "D": 10}
    assert dist.starts == {"A": ("adjustable", 20), "B": ("lent", 10), "C": ("adjustable", 20), "D": ("kept-min", 10)}
    assert dist.pool == 40 and dist.adjustable == ("A", "C")
    first, second = dist.rounds
    assert (first.pool, first.weight_sum, first.shares, first.capped) == (40, 100, {"A": 24, "C": 16}, {"A"})
    assert (second.pool, second.weight_sum, second.shares, second.capped) == (14, 40, {"C": 14}, {"C"})


def test_distribute_pool_exhausted_leaves_request_unmet() -> None:
    claims = [
        d.Claim("A", 30, 20, 60),
        d.Claim("B", 10, 30, 1),
        d.Claim("C", 80, 20, 40),
        d.Claim("D", 10, 10, 1, False),
    ]
    assert d.distribute(100, claims).runtimes["C"] == 50


def test_not_lending_keeps_min_while_idle_and_lending_gives_it_away() -> None:
    dist = d.distribute(100, [d.Claim("keep", 0, 40, 1, allow_lent=False), d.Claim("lend", 0, 40, 1)])
    assert dist.runtimes == {"keep": 40, "lend": 0}


def test_guarantee_above_min_is_the_floor() -> None:
    dist = d.distribute(100, [d.Claim("g", request=50, min=10, weight=1, guarantee=30), d.Claim("h", 100, 0, 1)])
    assert dist.starts["g"] == ("adjustable", 30)
    assert dist.runtimes == {"g": 50, "h": 50}


def test_total_below_starts_takes_nothing_back() -> None:
    dist = d.distribute(10, [d.Claim("a", 30, 20, 1), d.Claim("b", 30, 20, 1)])
    assert dist.runtimes == {"a": 20, "b": 20} and dist.pool == -30 and dist.rounds == ()


def test_three_water_filling_rounds() -> None:
    # Equal weights, pool 90: round 1 gives 30 each (a capped at 10, 20 back); round 2 gives b and c 10 each
    # (b capped at 35, 5 back); round 3 gives c the last 5.
    dist = d.distribute(90, [d.Claim("a", 10, 0, 1), d.Claim("b", 35, 0, 1), d.Claim("c", 100, 0, 1)])
    assert [r.pool for r in dist.rounds] == [90, 20, 5]
    assert dist.runtimes == {"a": 10, "b": 35, "c": 45}


def test_min_scaling_float_truncation_and_untouched_resources() -> None:
    scaled, dims = d.scaled_mins(
        {"cpu": 50, "memory": 1000}, {"x": {"cpu": 40, "memory": 100}, "y": {"cpu": 60, "memory": 100}}
    )
    assert dims == ("cpu",)
    assert scaled == {"x": {"cpu": 20, "memory": 100}, "y": {"cpu": 30, "memory": 100}}
    scaled, _ = d.scaled_mins({"cpu": 10}, {"x": {"cpu": 1}, "y": {"cpu": 1}, "z": {"cpu": 1}} | {"w": {"cpu": 27}})
    assert scaled["x"] == {"cpu": 0} and scaled["w"] == {"cpu": 9}  # 10 × 27 / 30 = 9.0; 10 / 30 truncates to 0
    scaled, dims = d.scaled_mins({"cpu": 0}, {"x": {"cpu": 5}})
    assert scaled == {"x": {"cpu": 0}} and dims == ("cpu",)
    unchanged, dims = d.scaled_mins({"cpu": 1}, {"x": {"cpu": 40}}, enabled=False)
    assert unchanged == {"x": {"cpu": 40}} and dims == ()


# --- the tree


def test_worked_example_through_the_tree_with_explanations() -> None:
    tree = worked_example_tree()
    assert {n: tree.runtime(n) for n in "ABCD"} == {
        "A": {"cpu": 30_000},
        "B": {"cpu": 10_000},
        "C": {"cpu": 50_000},
        "D": {"cpu": 10_000},
    }
    assert tree.state("D").request == {"cpu": 10_000}  # not lending: requests its min
    explained = tree.explain("C").resources["cpu"]
    assert explained.adjustable == ["A", "C"] and explained.pool == 40_000 and explained.parent_total == 100_000
    assert [(r.pool, r.share, r.capped) for r in explained.rounds] == [(40_000, 16_000, False), (14_000, 14_000, True)]
    assert "round 2: +14000 of pool 14000" in explained.message
    assert tree.explain("D").resources["cpu"].start == "kept-min"
    assert worked_example_tree(c_request=80_000).runtime("C") == {"cpu": 50_000}


def test_request_is_limited_by_max_on_its_way_up() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("p", 10, 20, is_parent=True))
    tree.set_quota(spec("leaf", 0, 10, parent="p"))
    tree.set_quota(spec("other", 0, 15, parent="p"))
    tree.set_request("leaf", {"cpu": 30})
    tree.set_request("other", {"cpu": 12})
    leaf, parent = tree.state("leaf"), tree.state("p")
    assert leaf.request == {"cpu": 30} and leaf.limited_request == {"cpu": 10}
    assert parent.child_request == {"cpu": 22} and parent.limited_request == {"cpu": 20}
    assert tree.runtime("p") == {"cpu": 20}
    # p's 20 split by weight (= max) 10:15 → 8 and 12; other is capped at its 12, nothing is left over.
    assert tree.runtime("leaf") == {"cpu": 8} and tree.runtime("other") == {"cpu": 12}


def test_parent_that_does_not_lend_requests_its_min() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("p", 40, 100, is_parent=True, lent=False))
    tree.set_quota(spec("c", 0, 100, parent="p"))
    tree.set_quota(spec("greedy", 0, 100))
    tree.set_request("c", {"cpu": 5})
    tree.set_request("greedy", {"cpu": 100})
    assert tree.state("p").request == {"cpu": 40}
    assert tree.runtime("p") == {"cpu": 40} and tree.runtime("greedy") == {"cpu": 60}
    assert tree.runtime("c") == {"cpu": 5}


def test_runtime_is_masked_to_max_keys_and_the_root_distributes_every_key() -> None:
    tree = rt.QuotaTree({"cpu": 100, "memory": 1000, "nvidia.com/gpu": 8})
    tree.set_quota(q.QuotaSpec(name="cpu-only", max={"cpu": 100}, shared_weight={"cpu": 1}))
    tree.set_quota(q.QuotaSpec(name="gpu", max={"cpu": 100, "nvidia.com/gpu": 8}, shared_weight={"cpu": 1}))
    tree.set_request("cpu-only", {"cpu": 100, "memory": 500})
    tree.set_request("gpu", {"nvidia.com/gpu": 4, "cpu": 10})
    assert tree.runtime("cpu-only") == {"cpu": 90}
    assert tree.state("cpu-only").request == {"cpu": 100}  # memory is not a key of max: not counted
    # gpu has no shared weight for nvidia.com/gpu (0): it only gets its min (0) of the pool there.
    assert tree.runtime("gpu") == {"cpu": 10, "nvidia.com/gpu": 0}
    assert set(tree.distributions(ROOT)) == {"cpu", "nvidia.com/gpu"}


def test_min_scaling_in_the_tree_and_switched_off() -> None:
    for enabled, expected in ((True, {"x": 20, "y": 30}), (False, {"x": 40, "y": 60})):
        tree = rt.QuotaTree({"cpu": 50}, enable_min_quota_scale=enabled)
        tree.set_quota(spec("x", 40, lent=False))
        tree.set_quota(spec("y", 60, lent=False))
        assert {n: tree.runtime(n)["cpu"] for n in "xy"} == expected
        assert tree.state("x").scaled_min == {"cpu": expected["x"]}
        assert tree.explain("x").min_scaled == (["cpu"] if enabled else [])


def test_multi_level_tree() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("org", 60, 100, is_parent=True))
    tree.set_quota(spec("team1", 20, 100, parent="org", is_parent=True))
    tree.set_quota(spec("job1", 0, 100, parent="team1"))
    tree.set_quota(spec("team2", 40, 100, parent="org"))
    tree.set_quota(spec("side", 40, 100))
    tree.set_request("job1", {"cpu": 70})
    tree.set_request("team2", {"cpu": 10})
    tree.set_request("side", {"cpu": 30})
    # root: org asks 80 (> min 60) and side 30 (≤ 40, lends): org 60 + pool 10 = 70.
    assert tree.runtime("org") == {"cpu": 70} and tree.runtime("side") == {"cpu": 30}
    # org's 70: team2 lends (10 ≤ 40), team1 starts at 20 and takes the pool 40 → 60.
    assert tree.runtime("team2") == {"cpu": 10} and tree.runtime("team1") == {"cpu": 60}
    assert tree.runtime("job1") == {"cpu": 60}
    assert tree.state("org").request == {"cpu": 80}


def test_used_and_non_preemptible_sum_up_the_path() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("p", 0, 100, is_parent=True))
    tree.set_quota(spec("a", 0, 100, parent="p"))
    tree.set_quota(spec("b", 0, 100, parent="p"))
    tree.set_load("a", pods.QuotaLoad(request={"cpu": 5}, used={"cpu": 3}, non_preemptible_used={"cpu": 2}))
    tree.set_load("b", pods.QuotaLoad(request={"cpu": 4, "memory": 9}, used={"cpu": 4, "memory": 9}))
    parent = tree.state("p")
    assert parent.used == {"cpu": 7} and parent.non_preemptible_used == {"cpu": 2}
    assert tree.state(ROOT).used == {"cpu": 7}


def test_system_and_default_used_come_off_the_root_total() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("a", 0, 1000))
    tree.set_request("a", {"cpu": 1000})
    tree.set_load(q.DEFAULT_QUOTA, pods.QuotaLoad(request={"cpu": 10}, used={"cpu": 10}))
    tree.set_load(q.SYSTEM_QUOTA, pods.QuotaLoad(used={"cpu": 5}))
    assert tree.root_total() == {"cpu": 85}
    assert tree.runtime("a") == {"cpu": 85}
    assert tree.runtime(q.DEFAULT_QUOTA) == dict(q.DEFAULT_GROUP_MAX)


def test_guarantee_usage_raises_the_floor_to_what_is_used() -> None:
    tree = rt.QuotaTree({"cpu": 100}, guarantee_usage=True)
    tree.set_quota(spec("a", 10, 100))
    tree.set_quota(spec("b", 10, 100))
    tree.set_load("a", pods.QuotaLoad(request={"cpu": 100}, used={"cpu": 60}))
    tree.set_request("b", {"cpu": 100})
    assert tree.state("a").guaranteed == {"cpu": 60}
    assert tree.runtime("a") == {"cpu": 75} and tree.runtime("b") == {"cpu": 25}


def test_lazy_runtime_refreshes_only_the_path() -> None:
    tree = rt.QuotaTree({"cpu": 120})
    for top in ("t1", "t2"):
        tree.set_quota(spec(top, 50, is_parent=True))
        for leaf in ("a", "b"):
            tree.set_quota(spec(f"{top}{leaf}", 0, parent=top))
            tree.set_request(f"{top}{leaf}", {"cpu": 40})
    tree.refresh()
    assert tree.dirty() == frozenset()
    tree.set_request("t1a", {"cpu": 10})
    assert tree.dirty() == {"t1", ROOT}
    assert tree.runtime("t1a") == {"cpu": 10}
    # t1 now asks 50 (= its min, lent), t2 asks 80: t2 goes from 60 to 70, so its children wait to be refreshed.
    assert tree.dirty() == {"t2"}
    assert tree.runtime("t1b") == {"cpu": 40}
    assert tree.refresh() == {"t2a", "t2b"}
    assert tree.runtime("t2a") == {"cpu": 35}


def test_a_child_whose_runtime_stays_but_whose_explanation_moves_is_reported() -> None:
    """A node joins: the total grows, a child capped at its max keeps its runtime, but its status explains the new
    total — refresh must name it, or the service keeps publishing the old explanation (found by tests/faults)."""
    tree = rt.QuotaTree({"cpu": 40_000})
    tree.set_quota(spec("capped", 0, 10_000))
    tree.set_request("capped", {"cpu": 30_000})
    tree.refresh()
    before = tree.explain("capped")
    tree.set_total({"cpu": 46_000})
    assert "capped" in tree.refresh()
    assert tree.runtime("capped") == {"cpu": 10_000} and tree.explain("capped") != before


def test_unknown_parent_and_cycles_are_detached_until_fixed() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("child", 0, parent="later"))
    tree.set_request("child", {"cpu": 30})
    assert not tree.state("child").attached and tree.runtime("child") == {}
    assert "unknown" in tree.explain("child").note
    tree.set_quota(spec("later", 0, is_parent=True))
    assert tree.runtime("child") == {"cpu": 30} and tree.state(ROOT).request == {"cpu": 30}
    tree.set_quota(spec("later", 0, parent="child", is_parent=True))  # later → child → later
    assert not tree.is_attached("child") and not tree.is_attached("later")
    assert tree.state(ROOT).request == {}
    tree.set_quota(spec("later", 0, is_parent=True))
    assert tree.runtime("child") == {"cpu": 30}


def test_remove_detaches_children_and_gives_back_their_share() -> None:
    tree = rt.QuotaTree({"cpu": 100})
    tree.set_quota(spec("p", 0, is_parent=True))
    tree.set_quota(spec("c", 0, parent="p"))
    tree.set_quota(spec("other", 0))
    tree.set_request("c", {"cpu": 80})
    tree.set_request("other", {"cpu": 80})
    assert tree.runtime("other") == {"cpu": 50}
    tree.remove("p")
    assert "p" not in tree and not tree.is_attached("c")
    assert tree.runtime("other") == {"cpu": 80}
    with pytest.raises(rt.QuotaTreeError):
        tree.remove(ROOT)
    with pytest.raises(rt.QuotaTreeError, match="unknown quota 'ghost'"):
        tree.set_request("ghost", {"cpu": 1})


def test_pod_resolution_order() -> None:
    specs = [
        q.QuotaSpec(name="labelled", namespace="x"),
        q.QuotaSpec(name="ns1", namespace="ns1"),
        q.QuotaSpec(name="annotated", namespace="y", namespaces=("ns2", "ns1")),
    ]
    index = pods.QuotaIndex.build(specs)
    assert index.resolve({q.LABEL_QUOTA_NAME: "labelled"}, "ns1") == "labelled"
    assert index.resolve({}, "ns1") == "ns1"  # same-name quota in that namespace wins over the annotation
    assert index.resolve({}, "ns2") == "annotated"
    assert index.resolve({}, "elsewhere") == q.DEFAULT_QUOTA
    assert index.resolve({q.LABEL_QUOTA_NAME: "ghost"}, "ns1") == q.DEFAULT_QUOTA
    assert index.resolve({}, "ns2", disable_default_quota=True) is None
    assert index.resolve({q.LABEL_QUOTA_NAME: "labelled"}, "z", disable_default_quota=True) == "labelled"


# --- properties

NAMES = ("q0", "q1", "q2", "q3", "q4", "q5")
amounts = st.integers(min_value=0, max_value=200)


@st.composite
def quota_specs(draw: st.DrawFn, names: tuple[str, ...] = NAMES) -> q.QuotaSpec:
    name = draw(st.sampled_from(names))
    parent = draw(st.sampled_from((ROOT, *names, *names, "missing")))
    mx = {"cpu": draw(amounts), "memory": draw(amounts)}
    mn = {k: draw(st.integers(0, v)) for k, v in mx.items()}
    weight = {k: draw(st.integers(0, 5)) for k in mx}
    annotations: dict[str, str] = {}  # koordbus's sharing controls, so both calculations must agree on them too
    if draw(st.integers(0, 3)) == 0:
        annotations[validation.ANNOTATION_LENDING_LIMIT] = json.dumps({"cpu": f"{draw(amounts)}m"})
    if draw(st.integers(0, 3)) == 0:
        annotations[validation.ANNOTATION_BORROWING_LIMIT] = json.dumps({"memory": str(draw(amounts))})
    if draw(st.integers(0, 5)) == 0:
        annotations[validation.ANNOTATION_FAIR_SHARING] = "false"
    return q.QuotaSpec(
        name=name,
        parent=parent,
        is_parent=True,
        allow_lent_resource=draw(st.booleans()),
        min=mn,
        max=mx,
        shared_weight=weight if any(weight.values()) else mx,
        annotations=annotations,
    )


resource_lists = st.fixed_dictionaries({"cpu": amounts, "memory": amounts})
loads = st.builds(pods.QuotaLoad, request=resource_lists, used=resource_lists, non_preemptible_used=resource_lists)
picks = st.integers(min_value=0, max_value=50)
operations = st.one_of(
    st.tuples(st.just("set"), quota_specs()),
    st.tuples(st.just("remove"), picks),
    st.tuples(st.just("load"), st.tuples(picks, loads)),
    st.tuples(st.just("total"), resource_lists),
    st.tuples(st.just("read"), picks),
    st.tuples(st.just("refresh"), st.none()),
    st.tuples(st.just("check"), st.none()),
)


def _pick(tree: rt.QuotaTree, index: int) -> str:
    """One of the tree's quotas (the default quota included, so its used changes the root's total)."""
    names = sorted(n for n in tree.names() if n not in (ROOT, q.SYSTEM_QUOTA))
    return names[index % len(names)]


def _apply(tree: rt.QuotaTree, op: tuple[str, Any]) -> None:
    kind, arg = op
    if kind == "set":
        tree.set_quota(arg)
    elif kind == "remove":
        name = _pick(tree, arg)
        if name != q.DEFAULT_QUOTA:
            tree.remove(name)
    elif kind == "load":
        tree.set_load(_pick(tree, arg[0]), arg[1])
    elif kind == "total":
        tree.set_total(arg)
    elif kind == "read":
        tree.runtime(_pick(tree, arg))  # a lazy refresh of one path in between
    elif kind == "refresh":
        tree.refresh()


def _assert_matches_full_recompute(tree: rt.QuotaTree) -> None:
    expected = recompute.compute_states(
        tree.specs(),
        tree.loads(),
        tree.total,
        enable_min_quota_scale=tree.enable_min_quota_scale,
        guarantee_usage=tree.guarantee_usage,
    )
    actual = tree.states()
    assert set(actual) == set(expected)
    for name, state in actual.items():
        assert state.attached == expected[name].attached, name
        if state.attached:
            assert state == expected[name], name


@pytest.mark.parametrize("guarantee_usage", [False, True])
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(operations, max_size=30), scale=st.booleans())
def test_incremental_tree_equals_full_recompute(guarantee_usage: bool, ops: list[tuple[str, Any]], scale: bool) -> None:
    tree = rt.QuotaTree({"cpu": 300, "memory": 300}, enable_min_quota_scale=scale, guarantee_usage=guarantee_usage)
    for op in ops:
        if op[0] == "check":  # compare (which refreshes everything) midway; later ops start from a clean tree
            _assert_matches_full_recompute(tree)
        _apply(tree, op)
    _assert_matches_full_recompute(tree)


@st.composite
def deep_trees(draw: st.DrawFn) -> list[q.QuotaSpec]:
    """3–9 quotas, each under the root or an earlier one: every quota attached, often several levels deep."""
    specs: list[q.QuotaSpec] = []
    for i in range(draw(st.integers(3, 9))):
        parent = draw(st.sampled_from([ROOT] + [s.name for s in specs]))
        specs.append(msgspec.structs.replace(draw(quota_specs()), name=f"n{i}", parent=parent))
    return specs


usage_changes = st.one_of(
    st.tuples(st.just("load"), st.tuples(picks, loads)),
    st.tuples(st.just("total"), resource_lists),
    st.tuples(st.just("read"), picks),
    st.tuples(st.just("check"), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(specs=deep_trees(), ops=st.lists(usage_changes, max_size=20))
def test_deep_tree_after_usage_changes_equals_full_recompute(specs: list[q.QuotaSpec], ops: list[Any]) -> None:
    tree = rt.QuotaTree({"cpu": 300, "memory": 300})
    for quota_spec in specs:
        tree.set_quota(quota_spec)
    for op in ops:
        if op[0] == "check":
            _assert_matches_full_recompute(tree)
        _apply(tree, op)
    _assert_matches_full_recompute(tree)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(operations, max_size=30), total=resource_lists)
def test_children_fit_in_parent_and_get_their_guaranteed_part(
    ops: list[tuple[str, Any]], total: dict[str, int]
) -> None:
    tree = rt.QuotaTree(total)
    for op in ops:
        _apply(tree, op)
    states = tree.states()
    for parent in [n for n in states if states[n].attached and n not in (q.SYSTEM_QUOTA, q.DEFAULT_QUOTA)]:
        kids = [states[c] for c in tree.children(parent)]
        parent_total = tree.root_total() if parent == ROOT else states[parent].runtime
        for key in ("cpu", "memory"):
            if sum(k.min.get(key, 0) for k in kids) <= parent_total.get(key, 0):
                assert sum(k.runtime.get(key, 0) for k in kids) <= parent_total.get(key, 0), (parent, key)
        for kid in kids:
            for key in kid.max:
                floor = min(kid.limited_request.get(key, 0), kid.scaled_min.get(key, 0))
                assert kid.runtime.get(key, 0) >= floor, (kid.name, key)


# --- cases taken from Koordinator's group_quota_manager_test.go (cpu in cores there, millicores here)


def _cpu_mem(cpu: int, memory: int) -> dict[str, int]:
    return {"cpu": cpu, "memory": memory}


def _koord_quota(
    name: str, parent: str, mx: dict[str, int], mn: dict[str, int], lent: bool, is_parent: bool
) -> q.QuotaSpec:
    return q.QuotaSpec(
        name=name, parent=parent, min=mn, max=mx, shared_weight=mx, allow_lent_resource=lent, is_parent=is_parent
    )


def test_koordinator_lending_parent_with_a_non_lending_child() -> None:
    # NotAllowLentResource_3: test-root (lends, min 60) over child1 (keeps min 20) and child2 (lends, min 20).
    tree = rt.QuotaTree(_cpu_mem(100_000, 0))
    tree.set_quota(_koord_quota("test-root", ROOT, _cpu_mem(96_000, 0), _cpu_mem(60_000, 0), True, True))
    tree.set_quota(_koord_quota("test-child1", "test-root", _cpu_mem(96_000, 0), _cpu_mem(20_000, 0), False, False))
    tree.set_quota(_koord_quota("test-child2", "test-root", _cpu_mem(96_000, 0), _cpu_mem(20_000, 0), True, False))
    assert [tree.runtime(n)["cpu"] for n in ("test-root", "test-child1", "test-child2")] == [20_000, 20_000, 0]
    tree.set_request("test-child1", _cpu_mem(60_000, 0))
    assert [tree.runtime(n)["cpu"] for n in ("test-root", "test-child1", "test-child2")] == [60_000, 60_000, 0]


def test_koordinator_scaled_min_and_remainder_units() -> None:
    # MultiUpdateQuotaRequest_WithScaledMinQuota1: p (min 300) over a, b, c (min 100 each, request 200 each),
    # cluster 200 cores / 200 GiB: every min scales to 200/3; the leftover units go to a and b by name.
    gib = 1024**3
    tree = rt.QuotaTree(_cpu_mem(200_000, 200 * gib))
    big = _cpu_mem(1_000_000, 1000 * gib)
    tree.set_quota(_koord_quota("p", ROOT, big, _cpu_mem(300_000, 300 * gib), True, True))
    for name in "abc":
        tree.set_quota(_koord_quota(name, "p", big, _cpu_mem(100_000, 100 * gib), True, False))
        tree.set_request(name, _cpu_mem(200_000, 200 * gib))
    assert tree.runtime("p") == _cpu_mem(200_000, 200 * gib)
    assert tree.state("p").scaled_min == _cpu_mem(200_000, 200 * gib)
    assert tree.runtime("a") == tree.runtime("b") == _cpu_mem(66_667, 200 * gib // 3 + 1)
    assert tree.runtime("c") == _cpu_mem(66_666, 200 * gib // 3)
    assert tree.state("a").scaled_min == _cpu_mem(66_666, 200 * gib // 3)
    tree.set_total(_cpu_mem(600_000, 600 * gib))
    assert [tree.runtime(n) for n in "abc"] == [_cpu_mem(200_000, 200 * gib)] * 3
    assert tree.state("a").scaled_min == _cpu_mem(100_000, 100 * gib)


# --- koordbus's sharing controls (beyond Koordinator)


def annotated(base: q.QuotaSpec, **annotations: str) -> q.QuotaSpec:
    keys = {
        "lending": validation.ANNOTATION_LENDING_LIMIT,
        "borrowing": validation.ANNOTATION_BORROWING_LIMIT,
        "fair": validation.ANNOTATION_FAIR_SHARING,
    }
    return msgspec.structs.replace(base, annotations={keys[k]: v for k, v in annotations.items()})


def two_teams(a: q.QuotaSpec, b: q.QuotaSpec, *, a_request: int, b_request: int) -> rt.QuotaTree:
    tree = rt.QuotaTree({"cpu": 100_000})
    tree.set_quota(a)
    tree.set_quota(b)
    tree.set_request(a.name, {"cpu": a_request})
    tree.set_request(b.name, {"cpu": b_request})
    return tree


def test_a_lending_limit_keeps_part_of_an_idle_min() -> None:
    """b (min 40) is idle; without a limit it lends all 40 and a (asking 100) gets 100. With lendingLimit 10 it
    keeps 30, so a gets 70."""
    a = spec("a", 40_000, weight=1)
    assert two_teams(a, spec("b", 40_000, weight=1), a_request=100_000, b_request=0).runtime("a") == {"cpu": 100_000}
    b = annotated(spec("b", 40_000, weight=1), lending='{"cpu":"10"}')
    tree = two_teams(a, b, a_request=100_000, b_request=0)
    assert tree.runtime("a") == {"cpu": 70_000} and tree.runtime("b") == {"cpu": 30_000}
    assert tree.state("b").request == {"cpu": 30_000}
    assert "lending limit" in tree.explain("b").note


def test_a_borrowing_limit_caps_the_runtime_at_min_plus_the_limit() -> None:
    a = annotated(spec("a", 40_000, weight=1), borrowing='{"cpu":"15"}')
    tree = two_teams(a, spec("b", 40_000, weight=1), a_request=100_000, b_request=0)
    assert tree.runtime("a") == {"cpu": 55_000}
    assert tree.state("a").limited_request == {"cpu": 55_000}
    assert "borrowing limit" in tree.explain("a").note


def test_fair_sharing_off_gives_each_child_at_most_its_min_in_the_whole_subtree() -> None:
    tree = rt.QuotaTree({"cpu": 100_000})
    tree.set_quota(annotated(spec("org", 80_000, is_parent=True), fair="false"))
    tree.set_quota(spec("team", 60_000, parent="org", is_parent=True))
    tree.set_quota(spec("a", 30_000, parent="team"))
    tree.set_quota(spec("b", 30_000, parent="team"))
    tree.set_request("a", {"cpu": 90_000})
    assert tree.runtime("a") == {"cpu": 30_000}  # b's idle min is not lent: strict below org
    assert "fair sharing is off" in tree.explain("a").note
    tree.set_quota(spec("org", 80_000, is_parent=True))  # fair sharing back on: the subtree redistributes
    assert tree.runtime("a") == {"cpu": 90_000}  # its whole request
    states = tree.states()
    assert states == recompute.compute_states(tree.specs(), tree.loads(), tree.total)
