"""The descheduler's view of a LowNodeLoad round (schemas.descheduler.DeschedulerRound), built from the round's
decision (services.migration.lownodeload_round.Decision). Pure.

Each node of each pool gets its class, whether it is abnormal, and why in one line that names the figures that put
it there (its usage against the thresholds, in percent of its allocatable, as Koordinator's eviction reasons do);
each pool its counts and why its round ended where it did; each eviction the job asked for, if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from schemas.descheduler import MAX_ROUND_NODES, DeschedulerRound, EvictionView, NodeLoadView, PoolView
from services.migration import lownodeload_balance as balance
from services.migration import lownodeload_util as util
from services.migration.lownodeload_round import Decision

CLASS_ORDER = ("highNodes", "prodHighNodes", "lowNodes", "bothLowNodes", "prodLowNodes", "normal", "unusable")
"""The order nodes are listed in within a pool: the ones the round acts on first."""


def round_view(decision: Decision, *, planned: bool = False, jobs: Mapping[str, str] | None = None) -> DeschedulerRound:
    """The view of one round; `jobs`: the PodMigrationJob asked for each evicted pod (namespace/name), if any."""
    jobs = jobs or {}
    pools: list[PoolView] = []
    nodes: list[NodeLoadView] = []
    for pool in decision.pools:
        pool_nodes = _pool_nodes(pool)
        counts = {c: 0 for c in CLASS_ORDER}
        for view in pool_nodes:
            counts[view.node_class] += 1
        counts["abnormal"] = len(pool.abnormal_nodes)
        counts["abnormalProd"] = len(pool.abnormal_prod_nodes)
        outcome = "paused: no round runs" if decision.paused else pool.outcome
        pools.append(PoolView(name=pool.name, nodes=len(pool.nodes), counts=counts, outcome=outcome))
        nodes.extend(pool_nodes)
    evictions = [
        EvictionView(pod=e.pod, node=e.node, pool=e.pool, prod=e.prod, reason=e.reason, job=jobs.get(e.pod, ""))
        for e in decision.evictions
    ]
    rank = {c: i for i, c in enumerate(CLASS_ORDER)}
    nodes.sort(key=lambda v: rank[v.node_class])  # stable: pools in order within each class
    return DeschedulerRound(
        at=decision.at,
        planned=planned,
        dry_run=decision.dry_run,
        paused=decision.paused,
        problems=list(decision.problems),
        pools=pools,
        nodes=nodes[:MAX_ROUND_NODES],
        nodes_omitted=max(len(nodes) - MAX_ROUND_NODES, 0),
        evictions=evictions,
    )


def _pool_nodes(pool: balance.PoolResult) -> list[NodeLoadView]:
    class_of = {name: c for c, members in pool.classes.items() for name in members}
    abnormal = set(pool.abnormal_nodes) | set(pool.abnormal_prod_nodes)
    views = [
        _node_view(pool.name, load, class_of.get(load.name, "normal"), load.name in abnormal) for load in pool.loads
    ]
    views += [
        NodeLoadView(node=name, pool=pool.name, node_class="unusable", why=why) for name, why in pool.unusable.items()
    ]
    rank = {c: i for i, c in enumerate(CLASS_ORDER)}
    views.sort(key=lambda v: (rank[v.node_class], v.node))
    return views


def _node_view(pool: str, load: balance.NodeLoad, node_class: str, abnormal: bool) -> NodeLoadView:
    return NodeLoadView(
        node=load.name,
        pool=pool,
        node_class=node_class,  # type: ignore[arg-type]  # one of balance.CLASSES or "normal"
        abnormal=abnormal,
        why=_why(load, node_class, abnormal),
        allocatable=_ints(load.allocatable),
        usage=_ints(load.usage),
        prod_usage=_ints(load.prod_usage),
        low=_ints(load.low),
        high=_ints(load.high),
        prod_low=_ints(load.prod_low),
        prod_high=_ints(load.prod_high),
    )


def _why(load: balance.NodeLoad, node_class: str, abnormal: bool) -> str:
    between = "usage between low and high: " + _compare(load, load.usage, load.high, over=False)
    if node_class == "highNodes":
        text = "usage over high: " + _compare(load, load.usage, load.high, over=True)
    elif node_class == "prodHighNodes":
        text = "prod usage over prodHigh: " + _compare(load, load.prod_usage, load.prod_high, over=True)
    elif node_class == "lowNodes":
        text = "usage under every low threshold: " + _compare(load, load.usage, load.low, over=False)
    elif node_class == "bothLowNodes":
        text = "usage under every low threshold and prod usage under every prodLow threshold: " + _compare(
            load, load.usage, load.low, over=False
        )
    elif node_class == "prodLowNodes":
        text = f"{between}; prod usage under every prodLow threshold: " + _compare(
            load, load.prod_usage, load.prod_low, over=False
        )
    else:
        text = f"{between}; prod usage between prodLow and prodHigh"
    if node_class in ("highNodes", "prodHighNodes"):
        text += "; abnormal" if abnormal else "; not abnormal yet (the anomaly condition counts consecutive rounds)"
    return text


def _compare(load: balance.NodeLoad, usage: util.Amounts, thresholds: util.Amounts, *, over: bool) -> str:
    """`cpu 82.0% > 65.0%` for each resource over (over=True) or at or under (False) its threshold, by name."""
    used = util.usage_percentages(usage, load.allocatable)
    limits = util.usage_percentages(thresholds, load.allocatable)
    parts = []
    for name in sorted(thresholds):
        if name not in usage or name not in used:
            continue
        is_over = usage[name] > thresholds[name]
        if is_over == over:
            parts.append(f"{name} {used[name]:.1f}% {'>' if over else '≤'} {limits.get(name, 0.0):.1f}%")
    return ", ".join(parts) or "no resource with an allocatable"


def _ints(amounts: Mapping[str, Fraction]) -> dict[str, int]:
    return {name: util.scaled(name, value) for name, value in sorted(amounts.items())}
