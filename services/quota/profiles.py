"""ElasticQuotaProfiles (spec §3.10): the root quota of a profile's tree, sized by the nodes its selector picks. Pure.

Koordinator's profile controller (koord-manager) turns each profile into an ElasticQuota `<namespace>/<quotaName>`
that roots its own tree: labels `profile`, the profile's quotaLabels, `tree-id` (the quotaLabels' one, else the
FNV-64a hash of `namespace/name` in decimal) and `is-root=true`; min = the selected nodes' allocatable (times
resourceRatio when 0 < ratio ≤ 1) on the profile's resource keys (annotation `resource-keys`, default cpu and
memory), max = MaxInt64/2000 on the same keys; annotations `total-resource` and `unschedulable-resource`.
`desired_root` builds that object; `needs_write` says whether the quota held differs from it. The quota service
runs them on its tick and appends the result as an ordinary (validated, event-sourced) command; the tree's total
is then the root's total-resource (services.quota.model). Deliberate differences: the root also gets
`is-parent=true` unless the quotaLabels say otherwise (a profile's root exists to hold children, and the
webhook refuses children under a non-parent); node schedulability is not observed here, so
unschedulable-resource is always empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Final

from schemas import kube, quota, resources
from schemas.selectors import selector_matches

MAX_AMOUNT: Final = (2**63 - 1) // 2000
"""max of a profile's root on every resource key, as a quantity (Koordinator's MaxInt64/2000: cores for cpu)."""
DEFAULT_RESOURCE_KEYS: Final = ("cpu", "memory")
FNV_OFFSET: Final = 14695981039346656037
FNV_PRIME: Final = 1099511628211


def fnv64a(text: str) -> int:
    value = FNV_OFFSET
    for byte in text.encode():
        value ^= byte
        value = (value * FNV_PRIME) % 2**64
    return value


def tree_id(profile: quota.ElasticQuotaProfile) -> str:
    labels = profile.spec.quota_labels or {}
    meta = profile.metadata
    return labels.get(quota.LABEL_TREE_ID) or str(fnv64a(f"{meta.namespace}/{meta.name}"))


def resource_keys(profile: quota.ElasticQuotaProfile) -> tuple[str, ...]:
    raw = profile.metadata.annotations.get(quota.ANNOTATION_RESOURCE_KEYS)
    if raw:
        try:
            keys = json.loads(raw)
        except ValueError:
            keys = None
        if isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys):
            return tuple(keys)
    return DEFAULT_RESOURCE_KEYS


def ratio(profile: quota.ElasticQuotaProfile) -> Fraction | None:
    """resourceRatio when it is a decimal in (0, 1], else None (not applied)."""
    text = profile.spec.resource_ratio
    if not text:
        return None
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value if 0 < value <= 1 else None


def selected_total(
    profile: quota.ElasticQuotaProfile, nodes: Iterable[tuple[Mapping[str, str], Mapping[str, int]]]
) -> resources.ResourceList:
    """Σ allocatable of the (labels, allocatable) nodes the profile's selector picks, times the ratio."""
    total: resources.ResourceList = {}
    for labels, allocatable in nodes:
        if selector_matches(profile.spec.node_selector, labels):
            total = resources.add(total, allocatable)
    factor = ratio(profile)
    if factor is not None:
        total = {k: int(v * factor) for k, v in total.items()}
    return total


def desired_root(
    profile: quota.ElasticQuotaProfile, nodes: Iterable[tuple[Mapping[str, str], Mapping[str, int]]]
) -> quota.ElasticQuota:
    total = selected_total(profile, nodes)
    keys = resource_keys(profile)
    labels = {quota.LABEL_IS_PARENT: "true", **(profile.spec.quota_labels or {})}
    labels.update({quota.LABEL_PROFILE: profile.metadata.name, quota.LABEL_TREE_ID: tree_id(profile)})
    labels[quota.LABEL_IS_ROOT] = "true"
    annotations = {
        quota.ANNOTATION_TOTAL_RESOURCE: quota.resource_annotation(total),
        quota.ANNOTATION_UNSCHEDULABLE_RESOURCE: quota.resource_annotation({}),
    }
    return quota.ElasticQuota(
        metadata=kube.ObjectMeta(
            name=profile.spec.quota_name,
            namespace=profile.metadata.namespace or quota.QUOTA_NAMESPACE,
            labels=labels,
            annotations=annotations,
        ),
        spec=quota.ElasticQuotaSpec(
            min={k: quota.format_quota_amount(k, total.get(k, 0)) for k in keys},
            max={k: str(MAX_AMOUNT) for k in keys},
        ),
    )


def needs_write(current: quota.ElasticQuota | None, desired: quota.ElasticQuota) -> bool:
    """Whether the quota held differs from the profile's root in what the profile decides."""
    if current is None:
        return True
    try:
        have, want = quota.quota_spec(current), quota.quota_spec(desired)
    except quota.QuotaFormatError:
        return True
    if (have.min, have.max, have.total_resource) != (want.min, want.max, want.total_resource):
        return True
    return any(have.labels.get(k) != v for k, v in want.labels.items())


def merged(current: quota.ElasticQuota | None, desired: quota.ElasticQuota) -> quota.ElasticQuota:
    """The root to write: the desired one, keeping labels and annotations others put on the current object."""
    if current is None:
        return desired
    meta = current.metadata
    labels = {**meta.labels, **desired.metadata.labels}
    annotations = {**meta.annotations, **desired.metadata.annotations}
    return quota.ElasticQuota(
        metadata=kube.ObjectMeta(name=meta.name, namespace=meta.namespace, labels=labels, annotations=annotations),
        spec=desired.spec,
    )
