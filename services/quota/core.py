"""The quota service's core, the event-sourced quota aggregate: state, fold and decision. Pure (no I/O, no clock:
time is a parameter). Called by services.quota.model (which folds and decides through it), the quota service's
command handling (which trees a command and an event touch) and the API (the default tree's name).

`QuotaTreeState` holds every quota of every tree plus the ElasticQuotaProfiles, as the Kubernetes objects the
events carry. It is immutable: `apply(event)` returns a new state (copy-on-write of the two dicts), so a what-if
works on the state it was given without touching the service's. The well-known quotas of §3.2
(koordinator-root-quota, -system-quota, -default-quota) exist implicitly in an empty state; an explicit event on
one of them replaces the implicit object. `decide(state, command, now=, actor=, pods_by_quota=)` returns the events
a command produces or raises `Rejected` carrying ALL the violations found (services.quota.validation).

Trees and subjects: the service serialises commands per tree. `tree_of(state, command)` names the tree a command
targets: "default" for the tree of koordinator-root-quota (quotas without a tree-id label), else the tree-id. A
profile's tree is the tree-id in its quotaLabels, else the profile's name (the tree its generated root starts).
Moving a quota between trees is rejected by the tree-id immutability rule.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Final, TypedDict

import msgspec

from schemas import kube, quota
from schemas import quota_events as ev
from schemas.quota import DEFAULT_QUOTA, QUOTA_NAMESPACE, ROOT_QUOTA, SYSTEM_QUOTA, ElasticQuota, QuotaSpec
from schemas.quota_events import Violation
from services.common.mergepatch import merge_patch
from services.quota import validation

DEFAULT_TREE: Final = "default"


class _Common(TypedDict):
    actor: str
    time: dt.datetime
    command_id: str


class Rejected(Exception):
    """A command that breaks one or more rules; `violations` lists them all."""

    def __init__(self, violations: Iterable[Violation]) -> None:
        self.violations = list(violations)
        super().__init__("; ".join(v.message for v in self.violations))


def _implicit(name: str) -> ElasticQuota:
    labels = {quota.LABEL_IS_PARENT: "true"} if name == ROOT_QUOTA else {quota.LABEL_PARENT: ROOT_QUOTA}
    max_raw: kube.RawResourceList = {k: quota.format_quota_amount(k, v) for k, v in quota.DEFAULT_GROUP_MAX.items()}
    return ElasticQuota(
        metadata=kube.ObjectMeta(name=name, namespace=QUOTA_NAMESPACE, labels=labels),
        spec=quota.ElasticQuotaSpec(min={}, max=max_raw),
    )


IMPLICIT_QUOTAS: Final[Mapping[str, ElasticQuota]] = {
    n: _implicit(n) for n in (ROOT_QUOTA, SYSTEM_QUOTA, DEFAULT_QUOTA)
}


class QuotaTreeState:
    """All quotas of all trees and all profiles; immutable (apply returns a new state)."""

    __slots__ = ("_profiles", "_quotas", "_specs")

    def __init__(
        self,
        quotas: Mapping[str, ElasticQuota] | None = None,
        profiles: Mapping[str, quota.ElasticQuotaProfile] | None = None,
    ) -> None:
        self._quotas: dict[str, ElasticQuota] = {**IMPLICIT_QUOTAS, **(quotas or {})}
        self._profiles: dict[str, quota.ElasticQuotaProfile] = dict(profiles or {})
        self._specs: dict[str, QuotaSpec] | None = None

    @property
    def quotas(self) -> Mapping[str, ElasticQuota]:
        return self._quotas

    @property
    def profiles(self) -> Mapping[str, quota.ElasticQuotaProfile]:
        return self._profiles

    def specs(self) -> Mapping[str, QuotaSpec]:
        """The integer view of every quota (cached; every stored object parsed when it was accepted)."""
        if self._specs is None:
            self._specs = {name: quota.quota_spec(obj) for name, obj in self._quotas.items()}
        return self._specs

    def tree_quotas(self, tree: str) -> dict[str, QuotaSpec]:
        return {n: s for n, s in self.specs().items() if (s.tree_id or DEFAULT_TREE) == tree}

    def apply(self, event: ev.QuotaEvent) -> QuotaTreeState:
        """The fold: the state after `event` (the dicts copied at C speed, only the changed quotas parsed)."""
        quotas, profiles = self._quotas, self._profiles
        changed: dict[str, ElasticQuota | None] = {}
        match event:
            case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj):
                changed[obj.metadata.name] = obj
            case ev.QuotaDeleted(quota=obj):
                changed[obj.metadata.name] = None
            case ev.QuotasImported(quotas=objs):
                changed.update((obj.metadata.name, obj) for obj in objs)
            case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p):
                profiles = {**profiles, p.metadata.name: p}
            case ev.ProfileDeleted(profile=p):
                profiles = {k: v for k, v in profiles.items() if k != p.metadata.name}
        if changed:
            quotas = dict(quotas)
            for name, held in changed.items():
                if held is None:
                    quotas.pop(name, None)
                else:
                    quotas[name] = held
        new = QuotaTreeState.__new__(QuotaTreeState)
        new._quotas, new._profiles, new._specs = quotas, profiles, self._carried_specs(changed)
        return new

    def _carried_specs(self, changed: Mapping[str, ElasticQuota | None]) -> dict[str, QuotaSpec] | None:
        """The spec cache after `changed`, from this state's with only the changed objects parsed again, so folding
        a long log costs one parse per event, not one per quota per event."""
        if self._specs is None:
            return None
        if not changed:
            return self._specs
        specs = dict(self._specs)
        try:
            for name, obj in changed.items():
                if obj is None:
                    specs.pop(name, None)
                else:
                    specs[name] = quota.quota_spec(obj)
        except quota.QuotaFormatError:
            return None
        return specs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuotaTreeState):
            return NotImplemented
        return self._quotas == other._quotas and self._profiles == other._profiles

    __hash__ = None  # type: ignore[assignment]


def replay(events: Iterable[ev.QuotaEvent], state: QuotaTreeState | None = None) -> QuotaTreeState:
    out = state or QuotaTreeState()
    for event in events:
        out = out.apply(event)
    return out


def _tree_of_spec(spec: QuotaSpec) -> str:
    return spec.tree_id or DEFAULT_TREE


def tree_of(state: QuotaTreeState, command: ev.QuotaCommand) -> str:
    """The tree (subject key) a command targets."""
    match command:
        case ev.CreateQuota(quota=obj) | ev.UpdateQuota(quota=obj):
            name = obj.metadata.name
            if name in state.quotas:
                return _tree_of_spec(state.specs()[name])
            labels = obj.metadata.labels
            if labels.get(quota.LABEL_TREE_ID):
                return labels[quota.LABEL_TREE_ID]
            parent = state.specs().get(labels.get(quota.LABEL_PARENT, ""))
            return _tree_of_spec(parent) if parent is not None else DEFAULT_TREE
        case (
            ev.PatchQuota(name=name)
            | ev.DeleteQuota(name=name)
            | ev.AttachNamespaces(name=name)
            | ev.DetachNamespaces(name=name)
        ):
            spec = state.specs().get(name)
            return _tree_of_spec(spec) if spec is not None else DEFAULT_TREE
        case ev.ImportQuotas(quotas=objs):
            trees = sorted({tree_of(state, ev.CreateQuota(command_id="", quota=obj)) for obj in objs})
            return trees[0] if trees else DEFAULT_TREE
        case ev.CreateProfile(profile=p) | ev.UpdateProfile(profile=p):
            return _profile_tree(p)
        case ev.DeleteProfile(name=name):
            existing = state.profiles.get(name)
            return _profile_tree(existing) if existing is not None else name
    raise TypeError(f"not a quota command: {command!r}")


def quota_tree(obj: ElasticQuota) -> str:
    """The tree a stored quota belongs to: its tree-id label (set on create from the parent), else the default."""
    return obj.metadata.labels.get(quota.LABEL_TREE_ID) or DEFAULT_TREE


def event_tree(event: ev.QuotaEvent) -> str:
    """The tree whose subject an event is appended to."""
    match event:
        case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj) | ev.QuotaDeleted(quota=obj):
            return quota_tree(obj)
        case ev.QuotasImported(quotas=objs):
            return quota_tree(objs[0]) if objs else DEFAULT_TREE
        case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p) | ev.ProfileDeleted(profile=p):
            return _profile_tree(p)
    raise TypeError(f"not a quota event: {event!r}")


def _profile_tree(profile: quota.ElasticQuotaProfile) -> str:
    return (profile.spec.quota_labels or {}).get(quota.LABEL_TREE_ID) or profile.metadata.name


def decide(
    state: QuotaTreeState,
    command: ev.QuotaCommand,
    *,
    now: dt.datetime,
    actor: str,
    pods_by_quota: Mapping[str, int],
) -> list[ev.QuotaEvent]:
    """The events `command` produces in `state`; raises Rejected with every violation found."""
    common = _Common(actor=actor, time=now, command_id=command.command_id)
    specs = state.specs()
    match command:
        case ev.CreateQuota(quota=obj):
            obj = validation.default_quota(obj, specs)
            _check(specs, obj, None)
            return [ev.QuotaCreated(quota=obj, **common)]
        case ev.UpdateQuota(quota=obj):
            return [ev.QuotaUpdated(quota=_checked_update(state, obj), **common)]
        case ev.PatchQuota(name=name, patch=patch):
            current = _existing(state, name)
            patched = merge_patch(msgspec.to_builtins(current), patch)
            try:
                obj = msgspec.convert(patched, ElasticQuota, strict=False)
            except msgspec.ValidationError as err:
                raise Rejected(
                    [validation.violation(name, "$", "format", f"patch gives an invalid object ({err})")]
                ) from None
            if obj.metadata.name != name:
                raise Rejected(
                    [validation.violation(name, "metadata.name", "rename", "a patch cannot change the name")]
                )
            return [ev.QuotaUpdated(quota=_checked_update(state, obj), **common)]
        case ev.DeleteQuota(name=name):
            violations = validation.validate_delete(specs, name, pods_by_quota.get(name, 0))
            if violations:
                raise Rejected(violations)
            return [ev.QuotaDeleted(quota=state.quotas[name], **common)]
        case ev.AttachNamespaces(name=name, namespaces=add) | ev.DetachNamespaces(name=name, namespaces=add):
            current = _existing(state, name)
            had = list(specs[name].namespaces or ())
            if isinstance(command, ev.AttachNamespaces):
                now_ns = had + [n for n in add if n not in had]
            else:
                now_ns = [n for n in had if n not in add]
            annotations = {**current.metadata.annotations, quota.ANNOTATION_NAMESPACES: json.dumps(now_ns)}
            meta = msgspec.structs.replace(current.metadata, annotations=annotations)
            obj = msgspec.structs.replace(current, metadata=meta)
            return [ev.QuotaUpdated(quota=_checked_update(state, obj), **common)]
        case ev.ImportQuotas(quotas=objs):
            return _import(state, objs, common)
        case ev.CreateProfile(profile=p) | ev.UpdateProfile(profile=p):
            name = p.metadata.name
            creating = isinstance(command, ev.CreateProfile)
            violations = []
            if not name:
                violations.append(
                    validation.violation("<unnamed>", "metadata.name", "required", "profile name is required")
                )
            elif bad_names := validation.profile_name_violations(p):
                violations += bad_names
            elif creating and name in state.profiles:
                violations.append(validation.violation(name, "metadata.name", "name-unique", "profile already exists"))
            elif not creating and name not in state.profiles:
                violations.append(validation.violation(name, "metadata.name", "exists", "profile does not exist"))
            if not p.spec.quota_name:
                violations.append(
                    validation.violation(name, "spec.quotaName", "required", "profile spec.quotaName is required")
                )
            if violations:
                raise Rejected(violations)
            if creating:
                return [ev.ProfileCreated(profile=p, **common)]
            return [ev.ProfileUpdated(profile=p, **common)]
        case ev.DeleteProfile(name=name):
            if name not in state.profiles:
                raise Rejected([validation.violation(name, "metadata.name", "exists", "profile does not exist")])
            return [ev.ProfileDeleted(profile=state.profiles[name], **common)]
    raise TypeError(f"not a quota command: {command!r}")


def _import(state: QuotaTreeState, objs: Iterable[ElasticQuota], common: _Common) -> list[ev.QuotaEvent]:
    """One QuotasImported per tree touched, or Rejected with every violation of the whole batch."""
    objs = list(objs)
    violations = [v for obj in objs for v in validation.name_violations(obj)]
    if violations:  # before anything else: the other checks name quotas and parents in their messages
        raise Rejected(violations)
    seen: set[str] = set()
    for obj in objs:
        if obj.metadata.name in seen:
            violations.append(
                validation.violation(obj.metadata.name, "metadata.name", "name-unique", "appears twice in the import")
            )
        seen.add(obj.metadata.name)
    on_cycle = _cycles(state, objs, violations)
    work = state
    by_tree: dict[str, list[ElasticQuota]] = {}
    for obj in _parents_first(objs):
        name = obj.metadata.name
        if name in on_cycle:
            continue
        try:
            if name in work.quotas:
                if _same_quota(work.quotas[name], obj):
                    continue
                new = _checked_update(work, obj)
                event: ev.QuotaEvent = ev.QuotaUpdated(quota=new, **common)
            else:
                new = validation.default_quota(obj, work.specs())
                _check(work.specs(), new, None)
                event = ev.QuotaCreated(quota=new, **common)
        except Rejected as rejected:
            violations.extend(rejected.violations)
            continue
        work = work.apply(event)
        by_tree.setdefault(quota_tree(new), []).append(new)
    if violations:
        raise Rejected(violations)
    return [ev.QuotasImported(quotas=batch, **common) for _, batch in sorted(by_tree.items())]


def _cycles(state: QuotaTreeState, objs: list[ElasticQuota], violations: list[Violation]) -> set[str]:
    """The batch's quotas whose parent chain (through the batch and the state) loops; one violation each."""
    world = dict(state.specs())
    for obj in objs:
        try:
            world[obj.metadata.name] = quota.quota_spec(obj)
        except quota.QuotaFormatError:
            continue  # reported by the quota's own check
    out: set[str] = set()
    for obj in objs:
        cycle = validation.find_cycle(world, obj.metadata.name)
        if cycle is not None and obj.metadata.name in cycle:
            out.add(obj.metadata.name)
            text = f"parent chain forms a cycle ({' -> '.join(cycle)})"
            violations.append(
                validation.violation(obj.metadata.name, f"metadata.labels[{quota.LABEL_PARENT}]", "no-cycle", text)
            )
    return out


def _parents_first(objs: list[ElasticQuota]) -> list[ElasticQuota]:
    """Each quota after its parent when the parent is in the batch; quotas on a cycle keep their order (the
    validation then reports the cycle)."""
    by_name = {obj.metadata.name: obj for obj in objs}
    out: list[ElasticQuota] = []
    placed: set[str] = set()
    for obj in objs:
        chain: list[ElasticQuota] = []
        current: ElasticQuota | None = obj
        while current is not None and current.metadata.name not in placed and current not in chain:
            chain.append(current)
            current = by_name.get(current.metadata.labels.get(quota.LABEL_PARENT, ""))
        for item in reversed(chain):
            if item.metadata.name not in placed:
                placed.add(item.metadata.name)
                out.append(item)
    return out


def _same_quota(held: ElasticQuota, wanted: ElasticQuota) -> bool:
    """Whether `wanted` would change nothing of `held` that a quota's meaning depends on."""
    try:
        have, want = quota.quota_spec(held), quota.quota_spec(wanted)
    except quota.QuotaFormatError:
        return False
    keep = {"resource_version", "uid", "used", "labels", "annotations"}
    fields = [f for f in have.__struct_fields__ if f not in keep]
    return all(getattr(have, f) == getattr(want, f) for f in fields)


def _existing(state: QuotaTreeState, name: str) -> ElasticQuota:
    current = state.quotas.get(name)
    if current is None:
        raise Rejected([validation.violation(name, "metadata.name", "exists", "does not exist")])
    return current


def _check_names(obj: ElasticQuota) -> None:
    violations = validation.name_violations(obj)
    if violations:
        raise Rejected(violations)


def _checked_update(state: QuotaTreeState, obj: ElasticQuota) -> ElasticQuota:
    """The changed object, checked; its resourceVersion cleared (the event's stream sequence becomes it)."""
    _check_names(obj)
    name = obj.metadata.name
    _existing(state, name)
    _check(state.specs(), obj, state.specs()[name])
    return msgspec.structs.replace(obj, metadata=msgspec.structs.replace(obj.metadata, resource_version=""))


def _check(specs: Mapping[str, QuotaSpec], obj: ElasticQuota, old: QuotaSpec | None) -> None:
    name = obj.metadata.name or "<unnamed>"
    if not obj.metadata.name:
        raise Rejected([validation.violation(name, "metadata.name", "required", "metadata.name is required")])
    _check_names(obj)
    try:
        spec = quota.quota_spec(obj)
    except quota.QuotaFormatError as err:
        raise Rejected([validation.violation(err.quota, err.field, "format", f"{err.field}: {err.problem}")]) from None
    violations = validation.validate_quota(specs, spec, old)
    if violations:
        raise Rejected(violations)
