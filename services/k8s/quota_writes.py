"""What the quota mirror writes to Kubernetes for one quota status, or that nothing needs writing. Pure.

koordbus owns the quota trees; the cluster's ElasticQuota objects mirror them so koord-scheduler can consume them:
`desired_quota` renders a QuotaStatusComputed as the ElasticQuota object (spec, koordbus's labels and annotations,
and the write-back annotations `runtime`, `request`, `child-request`, `guaranteed`, `allocated`,
`non-preemptible-*` and `status.used` as koord-scheduler writes them, §3.8); `quota_update` gives the object to
PUT over what the server holds (its resourceVersion and uid kept, labels and annotations of other owners kept,
ours — the `quota.scheduling.koordinator.sh/` prefix — brought to ours), or None when the server already holds
the same (amounts compared, not spellings; zero amounts count as absent, as koord-scheduler compares them).
`QuotaRecorder` is what record-only mode keeps. Called by services.k8s.quota_mirror.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from schemas import quantity, quota
from schemas.quota_service import QuotaStatusComputed

Json = dict[str, Any]
OURS: Final = f"{quota.PREFIX}/"
GROUP, VERSION = quota.API_VERSION.split("/")
PLURAL: Final = "elasticquotas"


def desired_quota(status: QuotaStatusComputed) -> Json | None:
    """The ElasticQuota koordbus wants in the cluster for this status; None for a deleted quota."""
    if status.deleted or status.object is None:
        return None
    obj = quota.render_elastic_quota(quota.quota_spec(status.object), status.state)
    meta = obj["metadata"]
    meta.pop("uid", None)
    meta.pop("resourceVersion", None)  # ours counts the quota log; the server has its own
    meta.setdefault("namespace", quota.QUOTA_NAMESPACE)
    return obj


def _amounts(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in (raw or {}).items():
        try:
            amount = quantity.parse_quantity(value).value
        except quantity.QuantityError:
            out[name] = value
            continue
        if amount:
            out[name] = amount
    return out


def _annotation_value(key: str, value: str) -> Any:
    if key in quota.WRITE_BACK_ANNOTATIONS:
        try:
            return _amounts(json.loads(value))
        except (ValueError, AttributeError):
            return value
    return value


def quota_update(current: Json, desired: Json) -> tuple[Json, list[str]] | None:
    """(the object to PUT, what changes in words), or None when `current` already holds `desired`."""
    changes: list[str] = []
    have_spec, want_spec = current.get("spec") or {}, desired.get("spec") or {}
    if any(_amounts(have_spec.get(k)) != _amounts(want_spec.get(k)) for k in ("min", "max")):
        changes.append("spec")
    have_meta, want_meta = current.get("metadata") or {}, desired.get("metadata") or {}
    labels = _owned_merge(have_meta.get("labels") or {}, want_meta.get("labels") or {}, changes, "labels")
    annotations = _owned_merge(
        have_meta.get("annotations") or {}, want_meta.get("annotations") or {}, changes, "annotations"
    )
    have_used = _amounts((current.get("status") or {}).get("used"))
    want_used = _amounts((desired.get("status") or {}).get("used"))
    if have_used != want_used:
        changes.append("status.used")
    if not changes:
        return None
    body = copy.deepcopy(current)
    body["spec"] = copy.deepcopy(want_spec)
    body["metadata"] = {**body.get("metadata", {}), "labels": labels, "annotations": annotations}
    if "status" in desired:
        body["status"] = copy.deepcopy(desired["status"])
    else:
        body.pop("status", None)
    return body, changes


def _owned_merge(have: Mapping[str, str], want: Mapping[str, str], changes: list[str], what: str) -> dict[str, str]:
    """`have` with ours set to `want`'s and ours that `want` lacks removed; notes in `changes` what differs."""
    merged = {k: v for k, v in have.items() if not k.startswith(OURS) or k in want}
    merged.update(want)
    differs = sorted(
        k
        for k in set(merged) | set(have)
        if _annotation_value(k, merged.get(k, "")) != _annotation_value(k, have.get(k, ""))
    )
    if differs:
        changes.append(f"{what} {', '.join(k.removeprefix(OURS) for k in differs)}")
    return merged


@dataclass(frozen=True, kw_only=True)
class RecordedQuotaWrite:
    at: float
    object: str
    action: str
    changes: tuple[str, ...]


class QuotaRecorder:
    """Record-only mode: the ElasticQuotas as they would be after the mirror's writes, and a bounded log."""

    def __init__(self, *, keep: int) -> None:
        self.objects: dict[tuple[str, str], Json] = {}
        self.log: deque[RecordedQuotaWrite] = deque(maxlen=keep)

    def write(self, desired: Json, *, now: float) -> str:
        meta = desired["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        current = self.objects.get(key)
        if current is None:
            self.objects[key] = copy.deepcopy(desired)
            self._log(key, "created", ("created",), now)
            return "created"
        update = quota_update(current, desired)
        if update is None:
            return "unchanged"
        self.objects[key] = update[0]
        self._log(key, "updated", tuple(update[1]), now)
        return "updated"

    def delete(self, namespace: str, name: str, *, now: float) -> str:
        if self.objects.pop((namespace, name), None) is None:
            return "unchanged"
        self._log((namespace, name), "deleted", ("deleted",), now)
        return "deleted"

    def _log(self, key: tuple[str, str], action: str, changes: tuple[str, ...], now: float) -> None:
        self.log.append(
            RecordedQuotaWrite(at=now, object=f"elasticquota/{key[0]}/{key[1]}", action=action, changes=changes)
        )

    def export(self) -> Json:
        return {
            "elasticquotas": [self.objects[key] for key in sorted(self.objects)],
            "writes": [
                {"at": w.at, "object": w.object, "action": w.action, "changes": list(w.changes)} for w in self.log
            ],
        }
