"""The ElasticQuota admission rules of spec §3.9 plus cycle rejection and koordbus's optional annotations. Pure.

`default_quota` applies the mutating defaults on create (parent label defaults to the root, tree-id inherited from
the parent, shared-weight keys aligned with max). `validate_quota` checks a new or changed quota against the other
quotas of the state and returns EVERY violation found (not just the first); `validate_delete` does the same for a
delete. A `Violation` names the quota, the field, a rule id and a plain-words message, e.g.
"quota team-a: spec.min.cpu 12 exceeds spec.max.cpu 10 (min must not exceed max)", for the API's 422 JSON.

Beyond Koordinator (issue 4 point 8): `quota.koordbus.io/lending-limit` and `quota.koordbus.io/borrowing-limit`
(JSON ResourceLists, Kueue semantics) and `quota.koordbus.io/fair-sharing: "false"` are parsed and validated here
(non-negative, keys ⊆ max); `sharing_limits` reads them for services.quota.runtime.

`name_violations` / `profile_name_violations` hold an object's names to Kubernetes' rules (schemas.names: object
names, namespaces, label values such as parent and tree-id) before anything else is checked: a name becomes
subjects, keys and labels, so a command naming what Kubernetes would refuse never reaches the quota log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from schemas import names, quota, resources
from schemas.quota import ROOT_QUOTA, SYSTEM_QUOTA, QuotaSpec
from schemas.quota_events import Violation

ANNOTATION_LENDING_LIMIT: Final = "quota.koordbus.io/lending-limit"
ANNOTATION_BORROWING_LIMIT: Final = "quota.koordbus.io/borrowing-limit"
ANNOTATION_FAIR_SHARING: Final = "quota.koordbus.io/fair-sharing"
IMMUTABLE_QUOTAS: Final = frozenset({ROOT_QUOTA, SYSTEM_QUOTA})


def violation(name: str, field: str, rule: str, text: str) -> Violation:
    return Violation(quota=name, field=field, rule=rule, message=f"quota {name}: {text}")


_NameCheck = tuple[Callable[[str, str], str], str, str]
"""(rule of schemas.names, value, field)."""


def name_violations(obj: quota.ElasticQuota) -> list[Violation]:
    """Every name of the quota that Kubernetes' rules refuse: its name, namespace and label values (parent and
    tree-id among them). The quota is named shortened in these (its name may be the problem)."""
    meta = obj.metadata
    checks: list[_NameCheck] = [(names.object_name, meta.name, "metadata.name")]
    if meta.namespace:
        checks.append((names.namespace, meta.namespace, "metadata.namespace"))
    checks += [(names.label_value, value, f"metadata.labels[{key}]") for key, value in sorted(meta.labels.items())]
    return _name_checks(meta.name, checks)


def profile_name_violations(profile: quota.ElasticQuotaProfile) -> list[Violation]:
    """The same for a profile: its name, namespace, spec.quotaName and the values of spec.quotaLabels."""
    meta = profile.metadata
    checks: list[_NameCheck] = [(names.object_name, meta.name, "metadata.name")]
    if meta.namespace:
        checks.append((names.namespace, meta.namespace, "metadata.namespace"))
    if profile.spec.quota_name:
        checks.append((names.object_name, profile.spec.quota_name, "spec.quotaName"))
    labels = profile.spec.quota_labels or {}
    checks += [(names.label_value, value, f"spec.quotaLabels[{key}]") for key, value in sorted(labels.items())]
    return _name_checks(meta.name, checks)


def _name_checks(name: str, checks: list[_NameCheck]) -> list[Violation]:
    out: list[Violation] = []
    who = name if name and len(name) <= names.MAX_SHOWN else names.shown(name)
    for check, value, field in checks:
        try:
            check(value, field)
        except names.InvalidName as e:
            out.append(violation(who, field, "name-format", str(e)))
    return out


def _amount(name: str, value: int) -> str:
    return quota.format_quota_amount(name, value)


def default_quota(obj: quota.ElasticQuota, quotas: Mapping[str, QuotaSpec]) -> quota.ElasticQuota:
    """The §3.9 mutating defaults on create: parent label, tree-id from the parent, shared-weight keys = max keys."""
    meta = obj.metadata
    labels = dict(meta.labels)
    annotations = dict(meta.annotations)
    if meta.name != ROOT_QUOTA and not labels.get(quota.LABEL_PARENT):
        labels[quota.LABEL_PARENT] = ROOT_QUOTA
    parent = quotas.get(labels.get(quota.LABEL_PARENT, ""))
    if parent is not None and parent.tree_id and not labels.get(quota.LABEL_TREE_ID):
        labels[quota.LABEL_TREE_ID] = parent.tree_id
    raw_weight = annotations.get(quota.ANNOTATION_SHARED_WEIGHT)
    if raw_weight:
        try:
            weight = json.loads(raw_weight)
        except ValueError:
            weight = None
        if isinstance(weight, dict):
            max_raw = obj.spec.max or {}
            aligned = {k: weight.get(k, max_raw[k]) for k in max_raw}
            annotations[quota.ANNOTATION_SHARED_WEIGHT] = json.dumps(aligned, sort_keys=True)
    new_meta = msgspec.structs.replace(meta, labels=labels, annotations=annotations)
    return msgspec.structs.replace(obj, metadata=new_meta)


def find_cycle(quotas: Mapping[str, QuotaSpec], name: str) -> list[str] | None:
    """The parent chain from `name` when it revisits a quota (the cycle, in order), else None."""
    chain: list[str] = []
    seen: set[str] = set()
    current: str | None = name
    while current is not None and current in quotas:
        if current in seen:
            return [*chain[chain.index(current) :], current]
        seen.add(current)
        chain.append(current)
        parent = quotas[current].parent
        current = parent if parent and current != ROOT_QUOTA else None
    return None


class SharingLimits(msgspec.Struct, frozen=True, kw_only=True):
    """koordbus's optional sharing controls of one quota (beyond Koordinator, user asks #9–#13)."""

    lending: resources.ResourceList | None = None
    """Kueue's lendingLimit: at most this much of its min may be lent to others (it keeps min − lending)."""
    borrowing: resources.ResourceList | None = None
    """Kueue's borrowingLimit: its runtime stays within min + borrowing."""
    fair_sharing: bool = True
    """False: below this quota, children get at most their own min (no lending to or borrowing from siblings)."""


NO_LIMITS: Final = SharingLimits()


def sharing_limits(spec: QuotaSpec) -> SharingLimits:
    """The quota's sharing annotations as numbers; an unreadable one counts as absent (validation refuses such a
    quota before it is stored, so this only matters for objects imported around it)."""
    annotations = spec.annotations
    if not any(
        k in annotations for k in (ANNOTATION_LENDING_LIMIT, ANNOTATION_BORROWING_LIMIT, ANNOTATION_FAIR_SHARING)
    ):
        return NO_LIMITS

    def limit(key: str) -> resources.ResourceList | None:
        try:
            rl = quota._annotation_resources(spec.name, annotations, key)
        except quota.QuotaFormatError:
            return None
        return None if rl is None else {k: max(v, 0) for k, v in rl.items()}

    return SharingLimits(
        lending=limit(ANNOTATION_LENDING_LIMIT),
        borrowing=limit(ANNOTATION_BORROWING_LIMIT),
        fair_sharing=annotations.get(ANNOTATION_FAIR_SHARING) != "false",
    )


def _limit_annotation(spec: QuotaSpec, key: str, out: list[Violation]) -> None:
    field = f"metadata.annotations[{key}]"
    text = spec.annotations.get(key)
    if text is None:
        return
    try:
        rl = quota._annotation_resources(spec.name, {key: text}, key) or {}
    except quota.QuotaFormatError as err:
        out.append(violation(spec.name, field, "annotation-format", err.problem))
        return
    for res, value in sorted(rl.items()):
        if value < 0:
            out.append(violation(spec.name, f"{field}.{res}", "non-negative", f"{field}.{res} must not be negative"))
        if res not in spec.max:
            out.append(
                violation(spec.name, f"{field}.{res}", "limit-keys-in-max", f"{field} has {res} which spec.max lacks")
            )


def validate_quota(quotas: Mapping[str, QuotaSpec], new: QuotaSpec, old: QuotaSpec | None = None) -> list[Violation]:
    """All §3.9 violations of creating (old None) or changing `new` given the other quotas (`quotas` may hold old)."""
    out: list[Violation] = []
    name = new.name
    others = {k: v for k, v in quotas.items() if k != name}
    world = {**others, name: new}
    # immutability of the root / system quota
    if old is not None and name in IMMUTABLE_QUOTAS and _semantic(old) != _semantic(new):
        out.append(violation(name, "spec", "immutable-quota", f"{name} cannot be changed"))
    if old is None and name in quotas:
        out.append(violation(name, "metadata.name", "name-unique", "a quota with this name already exists"))
    # non-negative, min ⊆ max, min ≤ max
    for field, rl in (("spec.min", new.min), ("spec.max", new.max), ("shared-weight", new.shared_weight)):
        for res, value in sorted(rl.items()):
            if value < 0:
                out.append(
                    violation(
                        name, f"{field}.{res}", "non-negative", f"{field}.{res} {_amount(res, value)} is negative"
                    )
                )
    for res, value in sorted(new.min.items()):
        if res not in new.max:
            out.append(
                violation(name, f"spec.min.{res}", "min-keys-in-max", f"spec.min has {res} which spec.max lacks")
            )
        elif value > new.max[res]:
            out.append(
                violation(
                    name,
                    f"spec.min.{res}",
                    "min-le-max",
                    f"spec.min.{res} {_amount(res, value)} exceeds spec.max.{res} {_amount(res, new.max[res])} "
                    "(min must not exceed max)",
                )
            )
    for res in new.max_strict_check_resource_keys or ():
        if res in new.used and res in new.max and new.used[res] > new.max[res]:
            out.append(
                violation(
                    name,
                    f"spec.max.{res}",
                    "max-strict-check",
                    f"status.used.{res} {_amount(res, new.used[res])} exceeds spec.max.{res} "
                    f"{_amount(res, new.max[res])} (strictly checked key)",
                )
            )
    # namespaces bound to at most one quota
    for ns in new.namespaces or ():
        try:
            names.namespace(ns, f"metadata.annotations[{quota.ANNOTATION_NAMESPACES}]")
        except names.InvalidName as e:
            out.append(violation(name, "namespaces", "name-format", str(e)))
            continue
        for other in others.values():
            if ns in (other.namespaces or ()):
                out.append(
                    violation(
                        name, "namespaces", "namespace-unique", f"namespace {ns} is already bound to quota {other.name}"
                    )
                )
    # is-parent transitions: cannot become a leaf while it has children
    children = [q for q in others.values() if q.parent == name]
    if children and not new.is_parent and name != ROOT_QUOTA:
        out.append(
            violation(
                name,
                f"metadata.labels[{quota.LABEL_IS_PARENT}]",
                "is-parent-with-children",
                f"is-parent cannot be false while it has children ({', '.join(sorted(c.name for c in children))})",
            )
        )
    # tree-id immutability
    if old is not None and old.tree_id != new.tree_id:
        out.append(
            violation(name, f"metadata.labels[{quota.LABEL_TREE_ID}]", "tree-id-immutable", "tree-id cannot be changed")
        )
    # parent
    parent = world.get(new.parent) if name != ROOT_QUOTA else None
    if name != ROOT_QUOTA and new.parent != ROOT_QUOTA:
        if parent is None:
            out.append(
                violation(
                    name,
                    f"metadata.labels[{quota.LABEL_PARENT}]",
                    "parent-exists",
                    f"parent {new.parent} does not exist",
                )
            )
        elif not parent.is_parent:
            out.append(
                violation(
                    name,
                    f"metadata.labels[{quota.LABEL_PARENT}]",
                    "parent-is-parent",
                    f"parent {new.parent} is not marked is-parent=true",
                )
            )
    cycle = find_cycle(world, name)
    if cycle is not None:
        out.append(
            violation(
                name,
                f"metadata.labels[{quota.LABEL_PARENT}]",
                "no-cycle",
                f"parent chain forms a cycle ({' -> '.join(cycle)})",
            )
        )
    if parent is not None and parent.name != ROOT_QUOTA and not new.is_root:
        if parent.tree_id != new.tree_id:
            out.append(
                violation(
                    name,
                    f"metadata.labels[{quota.LABEL_TREE_ID}]",
                    "tree-id-parent",
                    f"tree-id {new.tree_id!r} differs from parent {parent.name}'s {parent.tree_id!r}",
                )
            )
        extra = sorted(set(new.max) - set(parent.max))
        if extra:
            out.append(
                violation(
                    name,
                    "spec.max",
                    "keys-in-parent",
                    f"spec.max has {', '.join(extra)} which parent {parent.name} lacks",
                )
            )
    for child in children:
        if child.tree_id != new.tree_id and not child.is_root:
            out.append(
                violation(
                    name,
                    f"metadata.labels[{quota.LABEL_TREE_ID}]",
                    "tree-id-children",
                    f"tree-id {new.tree_id!r} differs from child {child.name}'s {child.tree_id!r}",
                )
            )
        missing = sorted(set(child.max) - set(new.max))
        if missing:
            out.append(
                violation(
                    name,
                    "spec.max",
                    "keys-of-children",
                    f"spec.max lacks {', '.join(missing)} which child {child.name} has",
                )
            )
    # Σ min checks
    if not new.allow_force_update and not new.is_root:
        if parent is not None and parent.name != ROOT_QUOTA:
            siblings = [q for q in others.values() if q.parent == parent.name]
            total = resources.total([*(s.min for s in siblings), new.min])
            out.extend(_completely_leq(name, "spec.min", total, parent.min, f"parent {parent.name}'s spec.min"))
        if children and name != ROOT_QUOTA:
            total = resources.total(c.min for c in children)
            out.extend(_completely_leq(name, "spec.min", total, new.min, "its own spec.min", children_sum=True))
    _limit_annotation(new, ANNOTATION_LENDING_LIMIT, out)
    _limit_annotation(new, ANNOTATION_BORROWING_LIMIT, out)
    fair = new.annotations.get(ANNOTATION_FAIR_SHARING)
    if fair is not None and fair not in ("true", "false"):
        out.append(
            violation(
                name,
                f"metadata.annotations[{ANNOTATION_FAIR_SHARING}]",
                "annotation-format",
                f'{ANNOTATION_FAIR_SHARING} must be "true" or "false", not {fair!r}',
            )
        )
    return out


def _completely_leq(
    name: str, field: str, total: Mapping[str, int], bound: Mapping[str, int], what: str, *, children_sum: bool = False
) -> list[Violation]:
    out: list[Violation] = []
    sum_of = "sum of children's spec.min" if children_sum else "sum of siblings' spec.min plus own"
    for res, value in sorted(total.items()):
        if res not in bound:
            out.append(violation(name, f"{field}.{res}", "min-sum", f"{sum_of} has {res} which {what} lacks"))
        elif value > bound[res]:
            out.append(
                violation(
                    name,
                    f"{field}.{res}",
                    "min-sum",
                    f"{sum_of} {res} {_amount(res, value)} exceeds {what} {_amount(res, bound[res])}",
                )
            )
    return out


def validate_delete(quotas: Mapping[str, QuotaSpec], name: str, pods: int) -> list[Violation]:
    """All violations of deleting quota `name` that has `pods` pods."""
    out: list[Violation] = []
    if name in quota.SPECIAL_QUOTAS:
        out.append(violation(name, "metadata.name", "undeletable", f"{name} cannot be deleted"))
    if name not in quotas and name not in quota.SPECIAL_QUOTAS:
        out.append(violation(name, "metadata.name", "exists", "does not exist"))
    children = sorted(q.name for q in quotas.values() if q.parent == name and q.name != name)
    if children:
        out.append(violation(name, "metadata.name", "delete-with-children", f"has children ({', '.join(children)})"))
    if pods:
        out.append(violation(name, "metadata.name", "delete-with-pods", f"still has {pods} pod(s)"))
    return out


def _semantic(spec: QuotaSpec) -> QuotaSpec:
    return msgspec.structs.replace(spec, uid="", resource_version="", used={})
