"""Every quota's state computed from nothing (spec §3.5–3.7): the reference services.quota.runtime is tested against.

`compute_states` builds the tree from the specs' parent labels, sums requests, used and guarantees bottom-up in one
pass and runs each parent's distribution top-down, with none of QuotaTree's incremental bookkeeping (deltas,
dirty parents, lazy paths). Both share the per-parent math (services.quota.distribute) and the figure helpers, so a
difference between them is a bookkeeping bug. Also usable for a one-shot calculation or a rebuild check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from schemas import quota, resources
from services.quota import distribute, validation
from services.quota.pods import EMPTY_LOAD, QuotaLoad
from services.quota.runtime import (
    OUTSIDE,
    ROOT,
    implicit_spec,
    limited_request,
    make_state,
    masked_load,
    quota_request,
    request_cap,
    strip_zeros,
)


class _Figures:
    """A quota's figures in the full recompute (the same names as _Node's)."""

    __slots__ = ("allocated", "child_request", "guaranteed", "limited", "np_request", "np_used", "request", "used")

    def __init__(self) -> None:
        self.child_request: resources.ResourceList = {}
        self.request: resources.ResourceList = {}
        self.limited: resources.ResourceList = {}
        self.used: resources.ResourceList = {}
        self.np_request: resources.ResourceList = {}
        self.np_used: resources.ResourceList = {}
        self.allocated: resources.ResourceList = {}
        self.guaranteed: resources.ResourceList = {}


def compute_states(
    specs: Iterable[quota.QuotaSpec],
    loads: Mapping[str, QuotaLoad],
    total: Mapping[str, int],
    *,
    enable_min_quota_scale: bool = True,
    guarantee_usage: bool = False,
) -> dict[str, quota.QuotaState]:
    """Every quota's state computed from nothing: requests bottom-up, then distributions top-down.

    Quotas outside the root's tree (unknown parent, cycle) come back with attached=False and no runtime.
    """
    by_name: dict[str, quota.QuotaSpec] = {n: implicit_spec(n) for n in (ROOT, *sorted(OUTSIDE))}
    for spec in specs:
        by_name[spec.name] = msgspec.structs.replace(spec, parent="") if spec.name == ROOT else spec
    children: dict[str, list[str]] = {name: [] for name in by_name}
    for spec in by_name.values():
        if spec.name != ROOT and spec.name not in OUTSIDE and spec.parent in by_name and spec.parent not in OUTSIDE:
            children[spec.parent].append(spec.name)
    order: list[str] = []  # attached quotas, parents before children
    stack = [ROOT]
    while stack:
        name = stack.pop()
        order.append(name)
        stack.extend(children[name])
    attached = set(order)
    figures = {name: _Figures() for name in by_name}
    for name in [*reversed(order), *sorted(OUTSIDE)]:
        spec, fig = by_name[name], figures[name]
        own = masked_load(loads.get(name, EMPTY_LOAD), spec.max)
        kids = [figures[c] for c in children[name]] if name in attached else []
        fig.child_request = strip_zeros(resources.add(own.request, resources.total(k.limited for k in kids)))
        limits = validation.sharing_limits(spec)
        fig.request = quota_request(spec, limits, fig.child_request, guarantee_usage=guarantee_usage)
        fig.limited = strip_zeros(limited_request(fig.request, request_cap(spec, limits)))
        fig.used = strip_zeros(resources.add(own.used, resources.total(k.used for k in kids)))
        fig.np_request = strip_zeros(
            resources.add(own.non_preemptible_request, resources.total(k.np_request for k in kids))
        )
        fig.np_used = strip_zeros(resources.add(own.non_preemptible_used, resources.total(k.np_used for k in kids)))
        if guarantee_usage:
            fig.allocated = strip_zeros(
                resources.add(own.used if name != ROOT else {}, resources.total(k.guaranteed for k in kids))
            )
            fig.guaranteed = strip_zeros(resources.max_rl(fig.allocated, spec.min)) if name != ROOT else {}
    outside_used = resources.add(figures[quota.SYSTEM_QUOTA].used, figures[quota.DEFAULT_QUOTA].used)
    root_total = resources.sub(dict(total), outside_used)
    all_keys = sorted({k for s in by_name.values() if s.name not in quota.SPECIAL_QUOTAS for k in s.max})
    runtime_full: dict[str, resources.ResourceList] = {ROOT: root_total}
    scaled_by_name: dict[str, resources.ResourceList] = {}
    strict: dict[str, bool] = {}  # fair sharing off at or above the quota
    for name in order:
        above = strict.get(by_name[name].parent, False) if name != ROOT else False
        strict[name] = above or not validation.sharing_limits(by_name[name]).fair_sharing
        parent_total = runtime_full[name]
        kid_names = children[name]
        if not kid_names:
            continue
        keys = all_keys if name == ROOT else sorted(by_name[name].max)
        scaled, _ = distribute.scaled_mins(
            parent_total, {k: by_name[k].min for k in kid_names}, enabled=enable_min_quota_scale
        )
        scaled_by_name.update(scaled)
        runtime_by_key: dict[str, dict[str, int]] = {}
        for key in keys:
            claims = [
                distribute.Claim(
                    name=kid,
                    request=(
                        min(figures[kid].limited.get(key, 0), scaled[kid].get(key, 0))
                        if strict[name]
                        else figures[kid].limited.get(key, 0)
                    ),
                    min=scaled[kid].get(key, 0),
                    weight=by_name[kid].shared_weight.get(key, 0),
                    allow_lent=by_name[kid].allow_lent_resource and not guarantee_usage,
                    guarantee=figures[kid].guaranteed.get(key, 0),
                )
                for kid in kid_names
            ]
            runtime_by_key[key] = distribute.distribute(parent_total.get(key, 0), claims).runtimes
        for kid in kid_names:
            runtime_full[kid] = {key: runtime_by_key[key][kid] for key in keys}
    out: dict[str, quota.QuotaState] = {}
    for name, spec in by_name.items():
        if name == ROOT:
            runtime, scaled_min, is_attached = root_total, {}, True
        elif name in OUTSIDE:
            runtime, scaled_min, is_attached = dict(spec.max), dict(spec.min), True
        elif name in attached:
            runtime = resources.mask(runtime_full[name], spec.max.keys())
            scaled_min, is_attached = scaled_by_name[name], True
        else:
            runtime, scaled_min, is_attached = {}, {}, False
        out[name] = make_state(spec, figures[name], runtime=runtime, scaled_min=scaled_min, attached=is_attached)
    return out
