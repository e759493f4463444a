"""The quota service's whole model: the event-sourced trees, the cluster's pods and nodes, one QuotaTree per tree. Pure.

services.quota.service feeds it quota events (with their stream sequence), pod and node observations and the clock,
and asks it what changed. It holds:

* the commands the log has applied, by command id (the last COMMANDS_KEPT): a command sent again — its caller's
  request timed out while the first copy was applied — is answered from the log, not decided a second time;

* the aggregate (services.quota.core.QuotaTreeState) folded from the events; each event's object gets the
  event's stream sequence as its resourceVersion, so a replay yields identical objects;
* one runtime tree (services.quota.runtime.QuotaTree) per tree id ("default" for the tree of koordinator-root-quota)
  kept in step with the aggregate's specs;
* every pod's resolved quota and load (§3.4/§3.5): pending pods count in request, assigned ones in used too; a
  terminating pod counts until it is ignored by the ElasticQuotaImmediateIgnoreTerminatingPod /
  ElasticQuotaIgnoreTerminatingPod options (the second at deletionTimestamp + grace, re-checked by `tick`);
* the nodes' allocatable, whose sum is the default tree's total; a tree root (label is-root, tree-id) brings its
  own total from its total-resource annotation, taken off the default tree's total unless ignore-default-tree.

Pods are re-resolved lazily, once per `refresh`, when the set of quotas or their namespaces changed, so a burst of
quota events at start-up costs one pass over the pods, not one per event. `refresh` returns the quotas whose
computed state may have changed; the service compares their states with what it last published.
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from schemas import kube, quota, resources
from schemas import quota_events as ev
from schemas.quota_events import Violation
from services.quota import admission, core, profiles
from services.quota.core import DEFAULT_TREE, QuotaTreeState, Rejected
from services.quota.pods import EMPTY_LOAD, QuotaIndex, QuotaLoad, pod_load
from services.quota.runtime import OUTSIDE, QuotaTree

Terminating = Literal["count", "ignore-immediately", "ignore-after-grace"]
DEFAULT_GRACE_SECONDS: Final = 30
"""A deleted pod's grace period when its object does not say (Kubernetes' default terminationGracePeriodSeconds)."""
COMMANDS_KEPT: Final = 10_000
"""How many applied commands (the most recent) a command sent again is recognised among: far more than arrive while
a caller retries a request (seconds), few enough to keep in memory."""


@dataclass(frozen=True, kw_only=True)
class AppliedCommand:
    """What the log holds of one command: its events as stored (resourceVersion stamped), the tree and stream
    sequence of the last one."""

    events: tuple[ev.QuotaEvent, ...]
    tree: str
    seq: int


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """Scheduler args and feature gates the model follows (Koordinator's defaults)."""

    enable_min_quota_scale: bool = True
    guarantee_usage: bool = False
    """ElasticQuotaGuaranteeUsage."""
    disable_default_quota: bool = False
    """DisableDefaultQuota: pods that match no quota belong to none."""
    ignore_overhead: bool = False
    """ElasticQuotaIgnorePodOverhead."""
    terminating: Terminating = "count"
    """count: terminating pods count until gone; ignore-immediately: from their deletionTimestamp
    (ElasticQuotaImmediateIgnoreTerminatingPod); ignore-after-grace: from deletionTimestamp + grace period
    (ElasticQuotaIgnoreTerminatingPod)."""


@dataclass(slots=True)
class _PodEntry:
    pod: kube.Pod
    quota: str | None
    load: QuotaLoad
    ignore_at: float | None = None
    """Unix seconds from which a terminating pod stops counting (ignore-after-grace), while it still counts."""


@dataclass(slots=True)
class _Loads:
    """Per-quota sums of the pods' loads, and how many pods each quota holds."""

    sums: dict[str, QuotaLoad] = field(default_factory=dict)
    pods: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, load: QuotaLoad, sign: int) -> None:
        held = self.sums.get(name, EMPTY_LOAD)
        change = load if sign > 0 else _negate(load)
        summed = held.plus(change)
        self.sums[name] = summed
        self.pods[name] = self.pods.get(name, 0) + sign
        if not self.pods[name]:
            del self.pods[name]
            self.sums.pop(name, None)


def _negate(load: QuotaLoad) -> QuotaLoad:
    return QuotaLoad(
        request={k: -v for k, v in load.request.items()},
        used={k: -v for k, v in load.used.items()},
        non_preemptible_request={k: -v for k, v in load.non_preemptible_request.items()},
        non_preemptible_used={k: -v for k, v in load.non_preemptible_used.items()},
    )


def stamp(event: ev.QuotaEvent, seq: int) -> ev.QuotaEvent:
    """The event with its object's resourceVersion set to the stream sequence that stored it."""
    match event:
        case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj):
            meta = msgspec.structs.replace(obj.metadata, resource_version=str(seq))
            return msgspec.structs.replace(event, quota=msgspec.structs.replace(obj, metadata=meta))
        case ev.QuotasImported(quotas=objs):
            stamped = [
                msgspec.structs.replace(obj, metadata=msgspec.structs.replace(obj.metadata, resource_version=str(seq)))
                for obj in objs
            ]
            return msgspec.structs.replace(event, quotas=stamped)
        case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p):
            meta = msgspec.structs.replace(p.metadata, resource_version=str(seq))
            return msgspec.structs.replace(event, profile=msgspec.structs.replace(p, metadata=meta))
    return event


def _resolution_key(spec: quota.QuotaSpec) -> tuple[str, tuple[str, ...] | None]:
    """What of a quota the pod → quota lookup (§3.4) reads."""
    return spec.namespace, spec.namespaces


def tree_key(spec: quota.QuotaSpec) -> str:
    return spec.tree_id or DEFAULT_TREE


class QuotaModel:
    """See the module docstring."""

    def __init__(self, options: ModelOptions | None = None) -> None:
        self.options = options or ModelOptions()
        self.state = QuotaTreeState()
        self.trees: dict[str, QuotaTree] = {}
        self.tree_seq: dict[str, int] = {}
        """Tree → the last stream sequence seen on its subject (applied or not)."""
        self.problems: dict[str, list[str]] = {}
        """Quota → the invariants it breaks right now (used above max; children's runtimes above its runtime),
        checked for every quota whose state may have changed."""
        self.corrupt: dict[str, str] = {}
        """Tree → why its last unusable event was skipped (the tree stays at its last valid state)."""
        self.events_seq = 0
        self.commands: OrderedDict[str, AppliedCommand] = OrderedDict()
        """Command id → what the log holds of it (AppliedCommand), the COMMANDS_KEPT most recent."""
        self.deleted: dict[str, quota.ElasticQuota] = {}
        """Quotas deleted (as they were), until a quota of that name is created again: their tombstones say where
        they lived."""
        self._pods: dict[str, _PodEntry] = {}
        self._loads = _Loads()
        self._nodes: dict[str, resources.ResourceList] = {}
        self._node_labels: dict[str, dict[str, str]] = {}
        self._node_total: resources.ResourceList = {}
        self._index: QuotaIndex | None = None
        self._reresolve = False
        """Quotas appeared, vanished or changed namespaces since the pods were resolved."""
        self._terminating: set[str] = set()
        """Pods that still count but will stop at their ignore_at (ignore-after-grace)."""
        self._touched: set[str] = set()
        self._load_dirty: set[str] = set()
        self._totals_dirty = True
        self._tree_of: dict[str, str] = {}
        for name, spec in self.state.specs().items():
            self._place(name, spec)

    # --- reading

    def tree(self, name: str) -> QuotaTree:
        tree = self.trees.get(name)
        if tree is None:
            tree = QuotaTree(
                enable_min_quota_scale=self.options.enable_min_quota_scale,
                guarantee_usage=self.options.guarantee_usage,
            )
            self.trees[name] = tree
        return tree

    def tree_of_quota(self, name: str) -> str | None:
        return self._tree_of.get(name)

    def pods_by_quota(self) -> Mapping[str, int]:
        self._resolve_if_needed()
        return self._loads.pods

    def pod_count(self, name: str) -> int:
        return self.pods_by_quota().get(name, 0)

    def index(self) -> QuotaIndex:
        if self._index is None:
            self._index = QuotaIndex.build(self.state.specs().values())
        return self._index

    def nodes(self) -> list[tuple[Mapping[str, str], Mapping[str, int]]]:
        """(labels, allocatable) of every node observed."""
        return [(self._node_labels.get(name, {}), allocatable) for name, allocatable in self._nodes.items()]

    def profile_roots(self) -> list[tuple[quota.ElasticQuotaProfile, quota.ElasticQuota]]:
        """Each profile whose root quota differs from what its nodes make it (§3.10), with the root to write."""
        out = []
        for name in sorted(self.state.profiles):
            profile = self.state.profiles[name]
            desired = profiles.desired_root(profile, self.nodes())
            current = self.state.quotas.get(profile.spec.quota_name)
            if profiles.needs_write(current, desired):
                out.append((profile, profiles.merged(current, desired)))
        return out

    @property
    def node_total(self) -> resources.ResourceList:
        return dict(self._node_total)

    # --- quota events

    def apply_event(self, event: ev.QuotaEvent, *, seq: int, tree: str) -> None:
        """Fold one stored event (sequence `seq` on tree `tree`'s subject). Raises quota.QuotaFormatError when its
        object cannot be read; the caller skips it (the tree keeps its last valid state)."""
        self.note_seq(tree, seq)
        event = stamp(event, seq)
        match event:
            case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj):
                spec = quota.quota_spec(obj)  # raises before anything changes
                old = self.state.specs().get(spec.name)
                self.state = self.state.apply(event)
                self._set_spec(spec, resolution_changed=old is None or _resolution_key(old) != _resolution_key(spec))
            case ev.QuotaDeleted(quota=obj):
                self.state = self.state.apply(event)
                self.deleted[obj.metadata.name] = obj
                self._drop_spec(obj.metadata.name)
            case ev.QuotasImported(quotas=objs):
                specs = [quota.quota_spec(obj) for obj in objs]  # all readable, or nothing changes
                olds = [self.state.specs().get(spec.name) for spec in specs]
                self.state = self.state.apply(event)
                for spec, old in zip(specs, olds, strict=True):
                    changed = old is None or _resolution_key(old) != _resolution_key(spec)
                    self._set_spec(spec, resolution_changed=changed)
            case _:
                self.state = self.state.apply(event)
        self._note_command(event, seq=seq, tree=tree)

    def _note_command(self, event: ev.QuotaEvent, *, seq: int, tree: str) -> None:
        if not event.command_id:
            return
        held = self.commands.pop(event.command_id, None)
        events = (*held.events, event) if held is not None else (event,)
        self.commands[event.command_id] = AppliedCommand(events=events, tree=tree, seq=seq)
        while len(self.commands) > COMMANDS_KEPT:
            self.commands.popitem(last=False)

    def applied_command(self, command_id: str) -> AppliedCommand | None:
        """What the log holds of the command `command_id` (None: not applied, or too long ago to remember)."""
        return self.commands.get(command_id) if command_id else None

    def note_seq(self, tree: str, seq: int) -> None:
        self.tree_seq[tree] = max(self.tree_seq.get(tree, 0), seq)
        self.events_seq = max(self.events_seq, seq)

    def _set_spec(self, spec: quota.QuotaSpec, *, resolution_changed: bool) -> None:
        name = spec.name
        self.deleted.pop(name, None)
        old_tree = self._tree_of.get(name)
        if old_tree is not None and old_tree != tree_key(spec) and name not in quota.SPECIAL_QUOTAS:
            self.trees[old_tree].remove(name)
            self._touched.add(name)
        self._place(name, spec)
        if resolution_changed:
            self._index, self._reresolve = None, True
        self._totals_dirty = True

    def _place(self, name: str, spec: quota.QuotaSpec) -> None:
        key = DEFAULT_TREE if name in quota.SPECIAL_QUOTAS else tree_key(spec)
        self._tree_of[name] = key
        self.tree(key).set_quota(spec)
        self._touched.add(name)
        self._load_dirty.add(name)

    def _drop_spec(self, name: str) -> None:
        key = self._tree_of.get(name)
        if key is None:
            return
        if name in quota.SPECIAL_QUOTAS:
            self._place(name, self.state.specs()[name])  # back to the implicit object
        else:
            self.trees[key].remove(name)
            del self._tree_of[name]
        self._touched.add(name)
        self._index, self._reresolve = None, True
        self._totals_dirty = True

    # --- cluster observations

    def set_pod(self, key: str, pod: kube.Pod | None, *, now: float) -> None:
        """A pod as observed (None: gone)."""
        held = self._pods.pop(key, None)
        self._terminating.discard(key)
        if held is not None:
            self._account(held, -1)
        if pod is None:
            return
        entry = _PodEntry(pod=pod, quota=None, load=EMPTY_LOAD)
        self._evaluate(entry, now)
        self._pods[key] = entry
        if entry.ignore_at is not None:
            self._terminating.add(key)
        self._account(entry, +1)

    def set_node(self, name: str, node: kube.Node | None) -> None:
        held = self._nodes.pop(name, None)
        self._node_labels.pop(name, None)
        if held is not None:
            self._node_total = resources.sub(self._node_total, held)
        if node is not None:
            allocatable = kube.node_allocatable(node)
            self._nodes[name] = allocatable
            self._node_labels[name] = dict(node.metadata.labels)
            self._node_total = resources.add(self._node_total, allocatable)
        if held != self._nodes.get(name):
            self._totals_dirty = True

    def tick(self, now: float) -> None:
        """Stop counting terminating pods whose grace period has run out (ignore-after-grace)."""
        for key in [k for k in self._terminating if (self._pods[k].ignore_at or 0.0) <= now]:
            entry = self._pods[key]
            self._terminating.discard(key)
            self._account(entry, -1)
            self._evaluate(entry, now)
            self._account(entry, +1)

    def _evaluate(self, entry: _PodEntry, now: float) -> None:
        """The pod's quota and load as they count now."""
        entry.quota = self.index().resolve_pod(entry.pod, disable_default_quota=self.options.disable_default_quota)
        entry.ignore_at = None
        deleted = entry.pod.metadata.deletion_timestamp
        ignored = False
        if deleted is not None and self.options.terminating == "ignore-immediately":
            ignored = True
        elif deleted is not None and self.options.terminating == "ignore-after-grace":
            grace = entry.pod.metadata.deletion_grace_period_seconds
            ignore_at = deleted.timestamp() + (DEFAULT_GRACE_SECONDS if grace is None else grace)
            ignored = ignore_at <= now
            entry.ignore_at = None if ignored else ignore_at
        entry.load = EMPTY_LOAD if ignored else pod_load(entry.pod, ignore_overhead=self.options.ignore_overhead)

    def _account(self, entry: _PodEntry, sign: int) -> None:
        if entry.quota is None:
            return
        self._loads.add(entry.quota, entry.load, sign)
        self._load_dirty.add(entry.quota)

    def _resolve_if_needed(self) -> None:
        if not self._reresolve:
            return
        self._reresolve = False
        index = self.index()
        for entry in self._pods.values():
            name = index.resolve_pod(entry.pod, disable_default_quota=self.options.disable_default_quota)
            if name != entry.quota:
                self._account(entry, -1)
                entry.quota = name
                self._account(entry, +1)

    # --- computing

    def refresh(self) -> dict[str, set[str]]:
        """Bring every tree up to date; returns tree → the quotas whose state may have changed."""
        self._resolve_if_needed()
        changed: dict[str, set[str]] = {}

        def note(tree: str, names: Iterable[str]) -> None:
            changed.setdefault(tree, set()).update(names)

        for name in self._load_dirty:
            key = self._tree_of.get(name)
            if key is None:
                continue
            tree = self.trees[key]
            tree.set_load(name, self._loads.sums.get(name, EMPTY_LOAD))
            # the system and default quotas have no ancestors, yet the root's runtime is the total less their used
            outside = [quota.ROOT_QUOTA] if name in OUTSIDE else []
            note(key, [name, *(tree.ancestors(name) or ()), *outside])
        self._load_dirty.clear()
        for name in self._touched:
            key = self._tree_of.get(name)
            if key is not None:
                note(key, [name, *(self.trees[key].ancestors(name) or ())])
            else:
                note(DEFAULT_TREE, [name])  # deleted: the service publishes its removal
        self._touched.clear()
        if self._totals_dirty:
            for key in self._set_totals():
                # the root's runtime is the tree's total (less the system and default quotas' used), and the tree's
                # status carries the total: both change with it even when no child's runtime does (the three
                # system quotas alone, or every child capped at its max), so both are published again
                note(key, [quota.ROOT_QUOTA])
        for key, tree in self.trees.items():
            note(key, tree.refresh())
        changed = {k: v for k, v in changed.items() if v}
        for key, names in changed.items():
            self._check_invariants(key, names)
        return changed

    def _check_invariants(self, key: str, names: set[str]) -> None:
        """Re-check the invariants of `names` and of their parents (a child's runtime is in its parent's sum)."""
        tree = self.trees[key]
        parents = {tree.spec(n).parent for n in names if n in tree and tree.is_attached(n)}
        for name in names | parents:
            if name not in tree or name in quota.SPECIAL_QUOTAS - {quota.ROOT_QUOTA} or self._tree_of.get(name) != key:
                if self._tree_of.get(name) is None:
                    self.problems.pop(name, None)
                continue
            found = _invariant_problems(tree, name)
            if found:
                self.problems[name] = found
            else:
                self.problems.pop(name, None)

    def _set_totals(self) -> list[str]:
        """Each tree's total from the nodes and the tree roots' total-resource; returns the trees whose total
        changed."""
        self._totals_dirty = False
        default_total = dict(self._node_total)
        totals: dict[str, resources.ResourceList] = {}
        for key, tree in self.trees.items():
            if key == DEFAULT_TREE:
                continue
            roots = [s for s in tree.specs() if s.is_root and s.total_resource is not None]
            total: resources.ResourceList = {}
            for spec in roots:
                total = resources.add(total, spec.total_resource or {})
                if not spec.ignore_default_tree:
                    default_total = resources.sub(default_total, spec.total_resource or {})
            totals[key] = total
        totals[DEFAULT_TREE] = {k: max(v, 0) for k, v in default_total.items()}
        changed = []
        for key, total in totals.items():
            tree = self.tree(key)
            if tree.total != total:
                changed.append(key)
                tree.set_total(total)
        return changed

    def state_of(self, name: str) -> quota.QuotaState | None:
        key = self._tree_of.get(name)
        return None if key is None else self.trees[key].state(name)

    def explain(self, name: str) -> quota.QuotaRuntimeExplanation | None:
        key = self._tree_of.get(name)
        return None if key is None else self.trees[key].explain(name)

    # --- commands

    def decide(self, command: ev.QuotaCommand, *, now: dt.datetime, actor: str) -> list[ev.QuotaEvent]:
        """The events a command produces (services.quota.core.decide with the pods counted here)."""
        return core.decide(self.state, command, now=now, actor=actor, pods_by_quota=self.pods_by_quota())

    def check(self, pods: Iterable[kube.Pod], *, options: admission.CheckOptions) -> list[admission.Verdict]:
        """§3.8 for pods in order, each fitting one reserved before the next (services.quota.admission). Pods the
        model does not know yet count in their quotas' request while they are checked, as a pending pod does by the
        time koord-scheduler checks it, so the runtime they are checked against includes their own request."""
        self.refresh()
        pods = list(pods)
        index = self.index()
        undo: list[tuple[QuotaTree, str, QuotaLoad]] = []
        for pod in pods:
            target = index.resolve_pod(pod, disable_default_quota=self.options.disable_default_quota)
            if kube.pod_key(pod) in self._pods or target is None or target not in self._tree_of:
                continue
            tree = self._tree_for(target)
            held = tree.load(target)
            undo.append((tree, target, held))
            request = pod_load(pod, ignore_overhead=self.options.ignore_overhead).request
            tree.set_load(target, held.plus(QuotaLoad(request=request)))
        try:
            return admission.check_pods(self._tree_for, index, pods, options=options)
        finally:
            for tree, target, held in reversed(undo):
                tree.set_load(target, held)

    def _tree_for(self, name: str) -> QuotaTree:
        return self.trees[self._tree_of.get(name, DEFAULT_TREE)]

    def what_if(
        self,
        commands: Iterable[ev.QuotaCommand],
        pods: Iterable[tuple[kube.Pod, int, bool]],
        *,
        now: dt.datetime,
        actor: str,
    ) -> WhatIf:
        """The computed states that would change if `commands` were accepted and `pods` ((pod, count, assigned)
        batches) added, without changing anything: the changes are applied to the live trees, read, and undone
        (the trees are exact under any order of changes, so undoing restores every figure). Rejected commands are
        reported and left out. Pods already counted are not re-resolved against hypothetical quotas; the trees'
        totals stay as they are."""
        self.refresh()
        state = self.state
        violations: list[Violation] = []
        for command in commands:
            try:
                events = core.decide(state, command, now=now, actor=actor, pods_by_quota=self.pods_by_quota())
            except Rejected as rejected:
                violations.extend(rejected.violations)
                continue
            for event in events:
                state = state.apply(event)
        undo: list[tuple[QuotaTree, str, quota.QuotaSpec | QuotaLoad | None]] = []
        touched: dict[str, set[str]] = {}
        old_specs, new_specs = self.state.specs(), state.specs()
        for name in sorted(set(old_specs) | set(new_specs)):
            old, new = old_specs.get(name), new_specs.get(name)
            if old == new:
                continue
            either = new if new is not None else old
            assert either is not None
            key = DEFAULT_TREE if name in quota.SPECIAL_QUOTAS else tree_key(either)
            tree = self.tree(key)
            undo.append((tree, name, old if name in tree else None))
            if new is not None:
                tree.set_quota(new)
            elif name not in quota.SPECIAL_QUOTAS:
                tree.remove(name)
            touched.setdefault(key, set()).add(name)
        index = QuotaIndex.build(new_specs.values())
        for pod, count, assigned in pods:
            target = index.resolve_pod(pod, disable_default_quota=self.options.disable_default_quota)
            if target is None:
                continue
            key = DEFAULT_TREE if target in quota.SPECIAL_QUOTAS else tree_key(new_specs[target])
            tree = self.tree(key)
            one = pod_load(pod, ignore_overhead=self.options.ignore_overhead)
            extra = QuotaLoad(request={k: v * count for k, v in one.request.items()})
            if assigned:
                extra = QuotaLoad(request=extra.request, used=dict(extra.request))
            held = tree.load(target)
            undo.append((tree, target, held))
            tree.set_load(target, held.plus(extra))
            touched.setdefault(key, set()).add(target)
        after = self._read_changed(touched)
        for tree, name, previous in reversed(undo):
            if isinstance(previous, QuotaLoad):
                tree.set_load(name, previous)
            elif previous is not None:
                tree.set_quota(previous)
            elif name in tree and name not in quota.SPECIAL_QUOTAS:
                tree.remove(name)
        before = {key: self._read(key, states) for key, states in after.items()}
        changes: list[tuple[str, quota.QuotaState | None, quota.QuotaState | None]] = []
        for key, states in after.items():
            for changed in sorted(states):
                was, will_be = before[key].get(changed), states[changed]
                if was != will_be:
                    changes.append((changed, was, will_be))
        return WhatIf(changes=changes, violations=violations)

    def _read_changed(self, touched: Mapping[str, set[str]]) -> dict[str, dict[str, quota.QuotaState | None]]:
        out: dict[str, dict[str, quota.QuotaState | None]] = {}
        for key, names in touched.items():
            tree = self.trees[key]
            affected = set(tree.refresh())
            for name in names:
                affected.add(name)
                if name in tree:
                    affected.update(tree.ancestors(name) or ())
            out[key] = self._read(key, affected)
        for key, tree in self.trees.items():
            if key not in out and tree.dirty():
                out[key] = self._read(key, set(tree.refresh()))
        return out

    def _read(self, key: str, names: Iterable[str]) -> dict[str, quota.QuotaState | None]:
        tree = self.trees[key]
        tree.refresh()
        return {name: tree.state(name) if name in tree else None for name in names}


def _invariant_problems(tree: QuotaTree, name: str) -> list[str]:
    """What `name` breaks of: used ≤ max on every key of max; Σ children's runtimes ≤ its runtime on every key."""
    out: list[str] = []
    spec, used = tree.spec(name), tree.used(name)
    for key, limit in sorted(spec.max.items()):
        if used.get(key, 0) > limit:
            out.append(
                f"quota {name}: used {key} {quota.format_quota_amount(key, used[key])} exceeds max "
                f"{quota.format_quota_amount(key, limit)}"
            )
    children = [c for c in tree.children(name) if c not in quota.SPECIAL_QUOTAS]
    if children and (name == quota.ROOT_QUOTA or tree.is_attached(name)):
        runtime = tree.runtime(name)
        sums: dict[str, int] = {}
        for child in children:
            for key, value in tree.runtime(child).items():
                sums[key] = sums.get(key, 0) + value
        for key, value in sorted(sums.items()):
            if key in runtime and value > runtime[key]:
                out.append(
                    f"quota {name}: its children's runtimes sum to {key} {quota.format_quota_amount(key, value)}, "
                    f"above its runtime {quota.format_quota_amount(key, runtime[key])} (Σ min above the total, "
                    "with min scaling off?)"
                )
    return out


@dataclass(frozen=True, slots=True)
class WhatIf:
    changes: list[tuple[str, quota.QuotaState | None, quota.QuotaState | None]]
    """(quota, state now, state after) for every quota whose computed state would change."""
    violations: list[Violation]
