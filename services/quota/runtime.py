"""The quota tree and its runtime calculation (spec §3.5–3.7), maintained incrementally: pure, no I/O.

Used by `koordbus calc quota-runtime`, and next by the event-sourced quota service, the admission check and the
REST tree view. A `QuotaTree` holds one tree's quotas (QuotaSpec), each quota's own pod load (pods.QuotaLoad) and
the cluster total. Requests, used and guarantees flow up eagerly on every change, as deltas along the path to the
root (O(depth)): a quota's request is its own pods' request plus Σ its children's limited requests, raised to its
min when it may not lend; its limited request min(request, max) is what its parent sees. Runtimes flow down
lazily: a change marks the parents whose distribution inputs changed as dirty; `runtime(name)` / `state(name)`
recompute only the dirty parents on that quota's path, top-down, and `refresh()` recomputes every dirty parent.
Recomputing a parent redistributes its total among its children (services.quota.distribute) and marks a child
dirty only when its runtime actually changed, so one leaf change touches the path to the root and the siblings
it affects, not the forest. services.quota.recompute is the from-scratch calculation it is tested against.

Koordinator semantics kept: the root's total is the cluster total minus what the system and default quotas use
(they are not in the tree; their runtime is their max); the root distributes over the union of every quota's max
keys, any other parent over its own max keys; runtimes are masked to the quota's max keys. Deliberate
differences: a quota whose parent is unknown, or whose parent link would close a cycle, is detached (no runtime)
until the parent appears, where Koordinator has no cycle check; requests are always the converged sums (the
scheduler's delta bookkeeping can drift from them after some update orders).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Final, Protocol

import msgspec

from schemas import quota, resources
from services.quota import distribute, validation
from services.quota.pods import EMPTY_LOAD, QuotaLoad

ROOT: Final = quota.ROOT_QUOTA
OUTSIDE: Final = frozenset({quota.SYSTEM_QUOTA, quota.DEFAULT_QUOTA})
"""Quotas kept outside the runtime tree (§3.2): their used is taken off the root's total."""


class QuotaTreeError(ValueError):
    """A change the tree cannot apply (unknown quota, removing the root)."""


def strip_zeros(rl: Mapping[str, int]) -> resources.ResourceList:
    """Drop zero amounts (absent means zero), so equal figures compare equal however they were summed."""
    return {k: v for k, v in rl.items() if v}


def limited_request(request: Mapping[str, int], max_rl: Mapping[str, int]) -> resources.ResourceList:
    """min(request, max) per key of request; keys without a max stay uncapped."""
    return {k: min(v, max_rl[k]) if k in max_rl else v for k, v in request.items()}


def quota_request(
    spec: quota.QuotaSpec,
    limits: validation.SharingLimits,
    child_request: resources.ResourceList,
    *,
    guarantee_usage: bool,
) -> resources.ResourceList:
    """The quota's request (§3.5): its own and its children's, raised to min when it may not lend; with a
    lending limit (beyond Koordinator, Kueue's lendingLimit) raised to min − lendingLimit, the part it never lends."""
    if spec.name != ROOT and not (spec.allow_lent_resource and not guarantee_usage):
        return strip_zeros(resources.max_rl(child_request, spec.min))
    if limits.lending is None or spec.name == ROOT:
        return child_request
    kept = {k: max(spec.min.get(k, 0) - v, 0) for k, v in limits.lending.items()}
    return strip_zeros(resources.max_rl(child_request, kept))


def request_cap(spec: quota.QuotaSpec, limits: validation.SharingLimits) -> Mapping[str, int]:
    """What caps the request the parent sees: max, and with a borrowing limit (Kueue's borrowingLimit) min +
    borrowingLimit, so the runtime never goes beyond it."""
    if limits.borrowing is None:
        return spec.max
    cap = dict(spec.max)
    for key, value in limits.borrowing.items():
        ceiling = spec.min.get(key, 0) + value
        cap[key] = min(cap.get(key, ceiling), ceiling)
    return cap


def implicit_spec(name: str, *, max_rl: Mapping[str, int] | None = None) -> quota.QuotaSpec:
    """The root, system or default quota as koord-scheduler creates it when no object exists."""
    if name == ROOT:
        return quota.QuotaSpec(
            name=ROOT, namespace=quota.QUOTA_NAMESPACE, parent="", is_parent=True, allow_lent_resource=False
        )
    limit = dict(max_rl if max_rl is not None else quota.DEFAULT_GROUP_MAX)
    return quota.QuotaSpec(name=name, namespace=quota.QUOTA_NAMESPACE, max=limit, shared_weight=dict(limit))


def sharing_note(limits: validation.SharingLimits, *, strict: bool) -> str:
    """What koordbus's sharing controls did to a quota's claim, in words (empty when none applies)."""
    notes = []
    if strict:
        notes.append(
            "fair sharing is off above this quota (quota.koordbus.io/fair-sharing=false): it asks for at most its min"
        )
    if limits.lending is not None:
        notes.append(f"lending limit {dict(limits.lending)}: it keeps min − lending limit even when idle")
    if limits.borrowing is not None:
        notes.append(f"borrowing limit {dict(limits.borrowing)}: its runtime stays within min + borrowing limit")
    return "; ".join(notes)


class _Node:
    """One quota's mutable bookkeeping inside a QuotaTree."""

    __slots__ = (
        "allocated",
        "child_request",
        "children",
        "dists",
        "guaranteed",
        "limited",
        "limits",
        "link",
        "load",
        "min_scaled",
        "np_request",
        "np_used",
        "own",
        "request",
        "runtime_full",
        "scaled_min",
        "spec",
        "sub_guaranteed",
        "sub_np_request",
        "sub_np_used",
        "sub_request",
        "sub_used",
        "used",
    )

    def __init__(self, spec: quota.QuotaSpec, load: QuotaLoad) -> None:
        self.spec = spec
        self.limits = validation.sharing_limits(spec)
        self.load = load
        self.link: str | None = None
        self.children: dict[str, None] = {}
        self.own = load
        self.sub_request: resources.ResourceList = {}
        self.sub_used: resources.ResourceList = {}
        self.sub_np_request: resources.ResourceList = {}
        self.sub_np_used: resources.ResourceList = {}
        self.sub_guaranteed: resources.ResourceList = {}
        self.child_request: resources.ResourceList = {}
        self.request: resources.ResourceList = {}
        self.limited: resources.ResourceList = {}
        self.used: resources.ResourceList = {}
        self.np_request: resources.ResourceList = {}
        self.np_used: resources.ResourceList = {}
        self.allocated: resources.ResourceList = {}
        self.guaranteed: resources.ResourceList = {}
        self.runtime_full: resources.ResourceList = {}
        self.scaled_min: resources.ResourceList = dict(spec.min)
        self.dists: dict[str, distribute.Distribution] = {}
        self.min_scaled: tuple[str, ...] = ()


def masked_load(load: QuotaLoad, max_rl: Mapping[str, int]) -> QuotaLoad:
    """A quota's own load as it counts: only the keys of its max, zeros dropped."""
    keys = max_rl.keys()
    return QuotaLoad(
        request=strip_zeros(resources.mask(load.request, keys)),
        used=strip_zeros(resources.mask(load.used, keys)),
        non_preemptible_request=strip_zeros(resources.mask(load.non_preemptible_request, keys)),
        non_preemptible_used=strip_zeros(resources.mask(load.non_preemptible_used, keys)),
    )


class QuotaTree:
    """One quota tree with incremental request/used propagation and lazily refreshed runtimes."""

    def __init__(
        self,
        total: Mapping[str, int] | None = None,
        *,
        enable_min_quota_scale: bool = True,
        guarantee_usage: bool = False,
        system_max: Mapping[str, int] | None = None,
        default_max: Mapping[str, int] | None = None,
    ) -> None:
        self.enable_min_quota_scale = enable_min_quota_scale
        self.guarantee_usage = guarantee_usage
        """Feature ElasticQuotaGuaranteeUsage: no quota lends, guaranteed = max(allocated, min) is a floor."""
        self._total: resources.ResourceList = dict(total or {})
        self._implicit = {
            ROOT: implicit_spec(ROOT),
            quota.SYSTEM_QUOTA: implicit_spec(quota.SYSTEM_QUOTA, max_rl=system_max),
            quota.DEFAULT_QUOTA: implicit_spec(quota.DEFAULT_QUOTA, max_rl=default_max),
        }
        """The root, system and default quotas as they stand when no object exists (or after one is deleted)."""
        self._nodes: dict[str, _Node] = {name: _Node(spec, EMPTY_LOAD) for name, spec in self._implicit.items()}
        self._pending: dict[str, dict[str, None]] = {}
        """parent name → quotas waiting for it (unknown parent, or linking would close a cycle)."""
        self._dirty: set[str] = {ROOT}
        self._keys: Counter[str] = Counter()

    # --- reading

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def names(self) -> list[str]:
        return list(self._nodes)

    def spec(self, name: str) -> quota.QuotaSpec:
        return self._node(name).spec

    def specs(self) -> list[quota.QuotaSpec]:
        return [n.spec for n in self._nodes.values()]

    def load(self, name: str) -> QuotaLoad:
        return self._node(name).load

    def loads(self) -> dict[str, QuotaLoad]:
        return {name: n.load for name, n in self._nodes.items() if n.load != EMPTY_LOAD}

    @property
    def total(self) -> resources.ResourceList:
        return dict(self._total)

    def root_total(self) -> resources.ResourceList:
        """The cluster total minus the system and default quotas' used (what the root distributes)."""
        outside = resources.add(self._nodes[quota.SYSTEM_QUOTA].used, self._nodes[quota.DEFAULT_QUOTA].used)
        return resources.sub(self._total, outside)

    def children(self, name: str) -> list[str]:
        return list(self._node(name).children)

    def is_attached(self, name: str) -> bool:
        return self._path(name) is not None

    def dirty(self) -> frozenset[str]:
        """Parents whose distribution is out of date."""
        return frozenset(self._dirty)

    def runtime(self, name: str) -> resources.ResourceList:
        """The quota's runtime masked to its max keys, refreshing only its path (the admission check's read)."""
        node = self._node(name)
        if name == ROOT:
            return self.root_total()
        if name in OUTSIDE:
            return dict(node.spec.max)
        path = self._path(name)
        if path is None:
            return {}
        self._refresh_path(path)
        return resources.mask(node.runtime_full, node.spec.max.keys())

    def used(self, name: str) -> Mapping[str, int]:
        """The quota's used (own pods masked to max, plus its children's), without refreshing anything."""
        return self._node(name).used

    def non_preemptible_used(self, name: str) -> Mapping[str, int]:
        return self._node(name).np_used

    def ancestors(self, name: str) -> list[str] | None:
        """The quota's ancestors from its parent up to the root, or None when it is detached."""
        self._node(name)
        return self._path(name)

    def state(self, name: str) -> quota.QuotaState:
        node = self._node(name)
        runtime = self.runtime(name)
        attached = name == ROOT or name in OUTSIDE or self._path(name) is not None
        if name == ROOT:
            scaled_min: resources.ResourceList = {}
        elif name in OUTSIDE or not attached:
            scaled_min = dict(node.spec.min) if name in OUTSIDE else {}
        else:
            scaled_min = dict(node.scaled_min)
        return make_state(node.spec, node, runtime=runtime, scaled_min=scaled_min, attached=attached)

    def states(self) -> dict[str, quota.QuotaState]:
        self.refresh()
        return {name: self.state(name) for name in self._nodes}

    def distributions(self, parent: str) -> dict[str, distribute.Distribution]:
        """The parent's last distribution per resource (refreshed first): adjustable children, pool, rounds."""
        self._node(parent)
        path = self._path(parent)
        if path is None:
            return {}
        self._refresh_path([parent, *path])
        return dict(self._nodes[parent].dists)

    def explain(self, name: str) -> quota.QuotaRuntimeExplanation:
        node = self._node(name)
        if name == ROOT:
            outside = resources.add(self._nodes[quota.SYSTEM_QUOTA].used, self._nodes[quota.DEFAULT_QUOTA].used)
            note = f"root: runtime = cluster total {self._total} − system/default used {outside}"
            return quota.QuotaRuntimeExplanation(quota=name, note=note)
        if name in OUTSIDE:
            return quota.QuotaRuntimeExplanation(quota=name, note="outside the runtime tree: runtime = max")
        path = self._path(name)
        if path is None:
            note = f"detached: parent {node.spec.parent!r} is unknown or would close a cycle; no runtime"
            return quota.QuotaRuntimeExplanation(quota=name, parent=node.spec.parent, note=note)
        self._refresh_path(path)
        parent = self._nodes[path[0]]
        out: dict[str, quota.ResourceRuntimeExplanation] = {}
        for key, dist in sorted(parent.dists.items()):
            out[key] = distribute.explain(key, dist, self._claim(node, key, strict=self._strict(path[0])))
        return quota.QuotaRuntimeExplanation(
            quota=name,
            parent=path[0],
            min_scaled=list(parent.min_scaled),
            resources=out,
            note=sharing_note(node.limits, strict=self._strict(path[0])),
        )

    # --- changing

    def set_total(self, total: Mapping[str, int]) -> None:
        """The cluster total (Σ node allocatable of the tree)."""
        if dict(total) != self._total:
            self._total = dict(total)
            self._dirty.add(ROOT)

    def set_quota(self, spec: quota.QuotaSpec) -> None:
        """Add a quota or replace its spec; a changed parent moves the quota with its subtree."""
        name = spec.name
        if name == ROOT:
            self._nodes[ROOT].spec = msgspec.structs.replace(spec, parent="")
            return
        node = self._nodes.get(name)
        if node is not None and name in OUTSIDE:
            before = node.used
            node.spec = spec
            node.limits = validation.sharing_limits(spec)
            self._recount(node)
            if node.used != before:
                self._dirty.add(ROOT)
            return
        if node is None:
            node = _Node(spec, EMPTY_LOAD)
            self._nodes[name] = node
            self._count_keys(spec, +1)
            self._recount(node)
            self._link(name)
            self._retry_pending()
            return
        if spec == node.spec:
            return
        self._detach(name)
        old_keys = node.spec.max.keys()
        old_fair = node.limits.fair_sharing
        self._count_keys(node.spec, -1)
        node.spec = spec
        node.limits = validation.sharing_limits(spec)
        self._count_keys(spec, +1)
        if node.children and spec.max.keys() != old_keys:
            self._dirty.add(name)
        if node.limits.fair_sharing != old_fair:
            self._mark_subtree_dirty(name)
        self._recount(node)
        self._link(name)
        self._retry_pending()

    def remove(self, name: str) -> None:
        """Delete a quota; its children wait (detached) until a quota of that name appears again."""
        if name == ROOT:
            raise QuotaTreeError(f"quota {ROOT} cannot be removed")
        node = self._node(name)
        if name in OUTSIDE:
            self.set_quota(self._implicit[name])
            return
        self._detach(name)
        for child in list(node.children):
            self._detach(child)
            self._pending.setdefault(name, {})[child] = None
        self._count_keys(node.spec, -1)
        del self._nodes[name]
        self._dirty.discard(name)
        self._retry_pending()

    def set_load(self, name: str, load: QuotaLoad) -> None:
        """The quota's own pods' request / used / non-preemptible figures (unmasked; masked to max here)."""
        node = self._node(name)
        if load == node.load:
            return
        node.load = load
        before = self._contribution(node)
        self._recount(node)
        if name in OUTSIDE:
            if before[1] != node.used:
                self._dirty.add(ROOT)
            return
        if node.link is not None:
            self._propagate(node.link, _deltas(before, self._contribution(node)))

    def set_request(self, name: str, request: Mapping[str, int]) -> None:
        self.set_load(name, replace(self._node(name).load, request=dict(request)))

    def refresh(self) -> frozenset[str]:
        """Recompute every dirty parent of the attached tree, top-down; returns the quotas whose status may have
        changed: every child of a recomputed parent (its runtime, or only its explanation — the parent's total and
        scaled mins — as when a node joins and a child stays capped at its max)."""
        changed: set[str] = set()
        heap: list[tuple[int, str]] = []
        for name in self._dirty:
            path = self._path(name)
            if path is not None or name == ROOT:
                heap.append((len(path or ()), name))
        heapq.heapify(heap)
        while heap:
            depth, name = heapq.heappop(heap)
            if name not in self._dirty:
                continue
            for child in self._recompute(name):
                changed.add(child)
                if child in self._dirty:
                    heapq.heappush(heap, (depth + 1, child))
        return frozenset(changed)

    # --- internals

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise QuotaTreeError(f"unknown quota {name!r}")
        return node

    def _path(self, name: str) -> list[str] | None:
        """The ancestors from the parent up to the root, or None when the quota is detached."""
        path: list[str] = []
        node = self._nodes[name]
        while node.link is not None:
            path.append(node.link)
            node = self._nodes[node.link]
        if node.spec.name != ROOT:
            return None
        return path

    def _refresh_path(self, path: list[str]) -> None:
        for parent in reversed(path):
            if parent in self._dirty:
                self._recompute(parent)

    def _count_keys(self, spec: quota.QuotaSpec, sign: int) -> None:
        before = set(self._keys)
        self._keys.update({k: sign for k in spec.max})
        self._keys = +self._keys
        if set(self._keys) != before:
            self._dirty.add(ROOT)

    def _recount(self, node: _Node) -> None:
        """Recompute a quota's own figures from its load, its children's sums and its spec."""
        spec = node.spec
        own = masked_load(node.load, spec.max)
        node.own = own
        node.child_request = strip_zeros(resources.add(own.request, node.sub_request))
        node.request = quota_request(spec, node.limits, node.child_request, guarantee_usage=self.guarantee_usage)
        node.limited = strip_zeros(limited_request(node.request, request_cap(spec, node.limits)))
        node.used = strip_zeros(resources.add(own.used, node.sub_used))
        node.np_request = strip_zeros(resources.add(own.non_preemptible_request, node.sub_np_request))
        node.np_used = strip_zeros(resources.add(own.non_preemptible_used, node.sub_np_used))
        if self.guarantee_usage and spec.name != ROOT:
            node.allocated = strip_zeros(resources.add(own.used, node.sub_guaranteed))
            node.guaranteed = strip_zeros(resources.max_rl(node.allocated, spec.min))
        else:
            node.allocated = strip_zeros(node.sub_guaranteed) if self.guarantee_usage else {}
            node.guaranteed = {}

    def _contribution(self, node: _Node) -> _Contribution:
        return (node.limited, node.used, node.np_request, node.np_used, node.guaranteed)

    def _propagate(self, name: str, deltas: _Contribution) -> None:
        """Add a child's change to `name` and pass the resulting change of `name` on towards the root."""
        current: str | None = name
        while current is not None and any(deltas):
            node = self._nodes[current]
            before = self._contribution(node)
            d_limited, d_used, d_np_request, d_np_used, d_guaranteed = deltas
            node.sub_request = strip_zeros(resources.add(node.sub_request, d_limited))
            node.sub_used = strip_zeros(resources.add(node.sub_used, d_used))
            node.sub_np_request = strip_zeros(resources.add(node.sub_np_request, d_np_request))
            node.sub_np_used = strip_zeros(resources.add(node.sub_np_used, d_np_used))
            node.sub_guaranteed = strip_zeros(resources.add(node.sub_guaranteed, d_guaranteed))
            if d_limited or d_guaranteed:
                self._dirty.add(current)
            self._recount(node)
            deltas = _deltas(before, self._contribution(node))
            current = node.link

    def _link(self, name: str) -> None:
        node = self._nodes[name]
        parent = node.spec.parent
        if parent not in self._nodes or parent in OUTSIDE or self._closes_cycle(name, parent):
            self._pending.setdefault(parent, {})[name] = None
            return
        node.link = parent
        self._nodes[parent].children[name] = None
        self._dirty.add(parent)
        self._propagate(parent, self._contribution(node))

    def _retry_pending(self) -> None:
        """Link every waiting quota whose parent now exists, unless that still closes a cycle (few wait)."""
        for parent in [p for p in self._pending if p in self._nodes and p not in OUTSIDE]:
            for waiting in list(self._pending.pop(parent, {})):
                self._link(waiting)

    def _detach(self, name: str) -> None:
        """Unlink a quota from its parent (or its waiting list), taking its figures off the ancestors."""
        node = self._nodes[name]
        if node.link is None:
            waiting = self._pending.get(node.spec.parent)
            if waiting is not None:
                waiting.pop(name, None)
                if not waiting:
                    del self._pending[node.spec.parent]
            return
        parent = node.link
        node.link = None
        del self._nodes[parent].children[name]
        self._dirty.add(parent)
        self._propagate(parent, _deltas(self._contribution(node), ({}, {}, {}, {}, {})))

    def _strict(self, name: str) -> bool:
        """Whether fair sharing is off for `name`'s children: it or an ancestor says fair-sharing "false"."""
        current: str | None = name
        while current is not None:
            node = self._nodes[current]
            if not node.limits.fair_sharing:
                return True
            current = node.link
        return False

    def _mark_subtree_dirty(self, name: str) -> None:
        """Every parent in `name`'s subtree distributes again (its fair-sharing setting changed)."""
        stack = [name]
        while stack:
            node = self._nodes[stack.pop()]
            if node.children:
                self._dirty.add(node.spec.name)
                stack.extend(node.children)

    def _closes_cycle(self, name: str, parent: str) -> bool:
        current: str | None = parent
        while current is not None:
            if current == name:
                return True
            current = self._nodes[current].link
        return False

    def _claim(self, node: _Node, key: str, *, strict: bool = False) -> distribute.Claim:
        """One child's claim; `strict` (fair sharing off above it): it asks for no more than its own min."""
        spec = node.spec
        request = node.limited.get(key, 0)
        if strict:
            request = min(request, node.scaled_min.get(key, 0))
        return distribute.Claim(
            name=spec.name,
            request=request,
            min=node.scaled_min.get(key, 0),
            weight=spec.shared_weight.get(key, 0),
            allow_lent=spec.allow_lent_resource and not self.guarantee_usage,
            guarantee=node.guaranteed.get(key, 0),
        )

    def _recompute(self, name: str) -> list[str]:
        """Redistribute `name`'s total among its children; returns them all (each one's explanation is this
        distribution); those whose runtime changed and have children become dirty in turn."""
        self._dirty.discard(name)
        parent = self._nodes[name]
        if name == ROOT:
            total = self.root_total()
            keys = sorted(self._keys)
        else:
            total = parent.runtime_full
            keys = sorted(parent.spec.max)
        children = [self._nodes[c] for c in parent.children]
        scaled, parent.min_scaled = distribute.scaled_mins(
            total, {c.spec.name: c.spec.min for c in children}, enabled=self.enable_min_quota_scale
        )
        for child in children:
            child.scaled_min = scaled[child.spec.name]
        strict = self._strict(name)
        parent.dists = {
            key: distribute.distribute(total.get(key, 0), [self._claim(c, key, strict=strict) for c in children])
            for key in keys
        }
        for child in children:
            runtime = {key: parent.dists[key].runtimes[child.spec.name] for key in keys}
            if runtime != child.runtime_full:
                child.runtime_full = runtime
                if child.children:
                    self._dirty.add(child.spec.name)
        return [child.spec.name for child in children]


_Contribution = tuple[
    resources.ResourceList,
    resources.ResourceList,
    resources.ResourceList,
    resources.ResourceList,
    resources.ResourceList,
]
"""(limited request, used, non-preemptible request, non-preemptible used, guaranteed): what a quota adds to its
parent's sums."""


def _deltas(before: _Contribution, after: _Contribution) -> _Contribution:
    d = tuple(strip_zeros(resources.sub(a, b)) for a, b in zip(after, before, strict=True))
    return (d[0], d[1], d[2], d[3], d[4])


class Figures(Protocol):
    """A quota's computed lists, as the tree's nodes and the full recompute hold them."""

    child_request: resources.ResourceList
    request: resources.ResourceList
    limited: resources.ResourceList
    used: resources.ResourceList
    np_request: resources.ResourceList
    np_used: resources.ResourceList
    allocated: resources.ResourceList
    guaranteed: resources.ResourceList


def make_state(
    spec: quota.QuotaSpec,
    node: Figures,
    *,
    runtime: resources.ResourceList,
    scaled_min: resources.ResourceList,
    attached: bool,
) -> quota.QuotaState:
    return quota.QuotaState(
        name=spec.name,
        parent=spec.parent,
        attached=attached,
        runtime=runtime,
        request=dict(node.request),
        child_request=dict(node.child_request),
        limited_request=dict(node.limited),
        used=dict(node.used),
        non_preemptible_request=dict(node.np_request),
        non_preemptible_used=dict(node.np_used),
        min=dict(spec.min),
        scaled_min=scaled_min,
        max=dict(spec.max),
        shared_weight=dict(spec.shared_weight),
        guaranteed=dict(node.guaranteed),
        allocated=dict(node.allocated),
    )
