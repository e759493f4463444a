"""One parent's distribution of its total among its children, one resource at a time (spec §3.6): pure integer math.

Called by services.quota.runtime for every parent whose inputs changed, and by its full recompute. `distribute`
is Koordinator's `redistribution`: every child starts at its min (adjustable or not lending) or its request
(lending), then the pool left over is water-filled among the adjustable children in proportion to their shared
weights, each round split with the largest-remainder (Hamilton) method in exact integers, ties broken by quota
name, capped at each child's request, the excess going back to the pool for the next round. The result keeps
every round so each child's runtime can be explained. `scaled_mins` is the ScaleMinQuotaManager: when a parent's
total is below Σ children's min for a resource, each child's min shrinks in proportion (float64, truncated, as
Koordinator computes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from schemas import quota, resources

ADJUSTABLE: Final = "adjustable"
LENT: Final = "lent"
KEPT_MIN: Final = "kept-min"


@dataclass(frozen=True, slots=True)
class Claim:
    """What one child brings to a one-resource distribution."""

    name: str
    request: int
    """The limited request (min(request, max))."""
    min: int
    """The (scaled) min."""
    weight: int
    allow_lent: bool = True
    guarantee: int = 0


@dataclass(frozen=True, slots=True)
class Round:
    pool: int
    weight_sum: int
    shares: dict[str, int]
    """name → share for every child in the round (weight ≤ 0 gets 0)."""
    remainder_units: frozenset[str]
    """Children whose share includes one largest-remainder unit."""
    capped: frozenset[str]
    """Children that reached their request in this round."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """The outcome for one resource, and how it came about."""

    total: int
    runtimes: dict[str, int]
    starts: dict[str, tuple[str, int]]
    """name → (ADJUSTABLE | LENT | KEPT_MIN, runtime at the start)."""
    pool: int
    """total − Σ start runtimes (may be negative: nothing is taken back)."""
    adjustable: tuple[str, ...]
    rounds: tuple[Round, ...]


def hamilton_shares(amount: int, weights: Sequence[tuple[str, int]]) -> tuple[dict[str, int], frozenset[str]]:
    """Split `amount` in proportion to positive weights: floors, then one unit each by largest remainder.

    Remainders are compared exactly (w × amount mod W); ties go to the smaller name. Weights ≤ 0 get 0 but
    still count in W, as Koordinator sums every adjustable child's weight.
    """
    shares = {name: 0 for name, _ in weights}
    weight_sum = sum(w for _, w in weights)
    if weight_sum <= 0 or amount <= 0 or not weights:
        return shares, frozenset()
    remainders: list[tuple[int, str]] = []
    distributed = 0
    for name, weight in weights:
        if weight <= 0:
            continue
        base, remainder = divmod(weight * amount, weight_sum)
        shares[name] = base
        distributed += base
        remainders.append((remainder, name))
    residual = amount - distributed
    if residual <= 0 or not remainders:
        return shares, frozenset()
    remainders.sort(key=lambda item: (-item[0], item[1]))
    winners = [name for _, name in remainders[:residual]]
    for name in winners:
        shares[name] += 1
    return shares, frozenset(winners)


def distribute(total: int, claims: Iterable[Claim]) -> Distribution:
    """Koordinator's redistribution of `total` among `claims` (any order: the result does not depend on it)."""
    ordered = sorted(claims, key=lambda c: c.name)
    runtimes: dict[str, int] = {}
    starts: dict[str, tuple[str, int]] = {}
    adjustable: list[Claim] = []
    assigned = 0
    for claim in ordered:
        floor = max(claim.min, claim.guarantee)
        if claim.request > floor:
            adjustable.append(claim)
            start = (ADJUSTABLE, floor)
        elif claim.allow_lent:
            start = (LENT, claim.request)
        else:
            start = (KEPT_MIN, floor)
        starts[claim.name] = start
        runtimes[claim.name] = start[1]
        assigned += start[1]
    pool = total - assigned
    rounds: list[Round] = []
    remaining = pool
    active = adjustable
    weight_sum = sum(c.weight for c in active)
    while remaining > 0 and active and weight_sum > 0:
        shares, units = hamilton_shares(remaining, [(c.name, c.weight) for c in active])
        surplus = 0
        still: list[Claim] = []
        capped: set[str] = set()
        for claim in active:
            value = runtimes[claim.name] + shares[claim.name]
            if value < claim.request:
                still.append(claim)
            else:
                surplus += value - claim.request
                value = claim.request
                capped.add(claim.name)
            runtimes[claim.name] = value
        rounds.append(Round(remaining, weight_sum, shares, units, frozenset(capped)))
        remaining = surplus
        active = still
        weight_sum = sum(c.weight for c in active)
    return Distribution(total, runtimes, starts, pool, tuple(c.name for c in adjustable), tuple(rounds))


def scaled_mins(
    total: Mapping[str, int], mins: Mapping[str, Mapping[str, int]], *, enabled: bool = True
) -> tuple[dict[str, resources.ResourceList], tuple[str, ...]]:
    """Each child's min after scaling against the parent's total, and the resources that needed scaling.

    A resource of `total` needs scaling when its amount is below Σ children's min; then child i gets
    (total − Σ non-scalable min) × min_i / Σ scalable min (all children are scalable when enabled), 0 when that
    budget is ≤ 0. Other resources keep the original min. Disabled: every min as is.
    """
    if not enabled:
        return {name: dict(m) for name, m in mins.items()}, ()
    min_sum = resources.total(mins.values())
    dims = tuple(sorted(k for k, v in total.items() if v < min_sum.get(k, 0)))
    if not dims:
        return {name: dict(m) for name, m in mins.items()}, ()
    out: dict[str, resources.ResourceList] = {}
    for name, child_min in mins.items():
        scaled = dict(child_min)
        for key in dims:
            budget = total[key]
            scalable_sum = min_sum.get(key, 0)
            if budget <= 0 or scalable_sum <= 0:
                scaled[key] = 0
            else:
                scaled[key] = int(float(budget) * float(child_min.get(key, 0)) / float(scalable_sum))
        out[name] = scaled
    return out, dims


def explain(resource: str, dist: Distribution, claim: Claim) -> quota.ResourceRuntimeExplanation:
    """One child's part of a distribution, as numbers and a sentence."""
    kind, start_runtime = dist.starts[claim.name]
    floor = max(claim.min, claim.guarantee)
    floor_text = f"guarantee {claim.guarantee}" if claim.guarantee > claim.min else f"min {claim.min}"
    if kind == ADJUSTABLE:
        reason = f"request {claim.request} > {floor_text}: starts at {floor} and competes for the pool"
    elif kind == LENT:
        reason = f"request {claim.request} ≤ {floor_text}: gets its request, lends the rest"
    else:
        reason = f"request {claim.request} ≤ {floor_text}, allow-lent-resource=false: keeps {floor}"
    parts = [f"{resource} runtime {dist.runtimes[claim.name]}: {reason}"]
    rounds: list[quota.RoundShare] = []
    for number, rnd in enumerate(dist.rounds, start=1):
        if claim.name not in rnd.shares:
            break
        share = rnd.shares[claim.name]
        unit = claim.name in rnd.remainder_units
        capped = claim.name in rnd.capped
        runtime_after = _runtime_after(dist, claim, number)
        rounds.append(
            quota.RoundShare(
                pool=rnd.pool,
                weight_sum=rnd.weight_sum,
                weight=claim.weight,
                share=share,
                remainder_unit=unit,
                runtime=runtime_after,
                capped=capped,
            )
        )
        text = f"round {number}: +{share} of pool {rnd.pool} (weight {claim.weight}/{rnd.weight_sum}"
        text += ", +1 largest remainder)" if unit else ")"
        if capped:
            before = _runtime_after(dist, claim, number - 1)
            text += f" → capped at request {claim.request} ({before + share - claim.request} back to the pool)"
        else:
            text += f" → {runtime_after}"
        parts.append(text)
    if kind == ADJUSTABLE and not rounds:
        parts.append(f"pool {dist.pool} left nothing to share")
    return quota.ResourceRuntimeExplanation(
        resource=resource,
        runtime=dist.runtimes[claim.name],
        parent_total=dist.total,
        request=claim.request,
        min=claim.min,
        guarantee=claim.guarantee,
        weight=claim.weight,
        start=kind,  # type: ignore[arg-type]  # one of the three Start literals
        start_runtime=start_runtime,
        pool=dist.pool,
        adjustable=list(dist.adjustable),
        rounds=rounds,
        message="; ".join(parts),
    )


def _runtime_after(dist: Distribution, claim: Claim, rounds_done: int) -> int:
    value = dist.starts[claim.name][1]
    for rnd in dist.rounds[:rounds_done]:
        value += rnd.shares.get(claim.name, 0)
        if claim.name in rnd.capped:
            return claim.request
    return value
