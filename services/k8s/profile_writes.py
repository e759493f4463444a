"""What the profile mirror writes: a ClusterColocationProfile of koordbus's REST API as the cluster object that copies
it, whether an existing object needs replacing, and what record-only mode keeps. Pure.

The copy is the profile as the REST API keeps it (name, labels, annotations, spec) with the label
app.kubernetes.io/managed-by=koordbus (schemas.colocation_events.MIRROR_LABEL), by which the webhook knows it for a
copy. An existing object is replaced when its spec, labels or annotations differ from the copy's (its
resourceVersion kept as the guard); one already equal is left alone. Called by services.k8s.profile_mirror.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from schemas.colocation_events import MIRROR_LABEL, MIRROR_VALUE, ColocationProfileSet

GROUP: Final = "config.koordinator.sh"
VERSION: Final = "v1alpha1"
PLURAL: Final = "clustercolocationprofiles"
KIND: Final = "ClusterColocationProfile"

Json = dict[str, Any]


def desired_profile(event: ColocationProfileSet) -> Json:
    """The cluster object that copies the profile `event` sets."""
    meta = event.profile.metadata
    metadata: Json = {"name": meta.name, "labels": {**meta.labels, MIRROR_LABEL: MIRROR_VALUE}}
    if meta.annotations:
        metadata["annotations"] = dict(meta.annotations)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": copy.deepcopy(event.profile.spec),
    }


def profile_update(current: Json, desired: Json) -> Json | None:
    """`current` replaced by the copy (its resourceVersion kept), or None when it already is the copy."""
    have, want = current.get("metadata") or {}, desired["metadata"]
    if (
        current.get("spec") == desired["spec"]
        and (have.get("labels") or {}) == want["labels"]
        and (have.get("annotations") or {}) == want.get("annotations", {})
    ):
        return None
    replaced = copy.deepcopy(desired)
    if have.get("resourceVersion"):
        replaced["metadata"]["resourceVersion"] = have["resourceVersion"]
    return replaced


@dataclass(frozen=True, kw_only=True)
class RecordedProfileWrite:
    at: float
    object: str
    action: str


class ProfileRecorder:
    """Record-only mode: the ClusterColocationProfiles as they would be after the mirror's writes, and a bounded
    log."""

    def __init__(self, *, keep: int) -> None:
        self.objects: dict[str, Json] = {}
        self.log: deque[RecordedProfileWrite] = deque(maxlen=keep)

    def write(self, desired: Json, *, now: float) -> str:
        name = desired["metadata"]["name"]
        current = self.objects.get(name)
        if current is not None and profile_update(current, desired) is None:
            return "unchanged"
        self.objects[name] = copy.deepcopy(desired)
        action = "created" if current is None else "updated"
        self.log.append(RecordedProfileWrite(at=now, object=f"clustercolocationprofile/{name}", action=action))
        return action

    def delete(self, name: str, *, now: float) -> str:
        if self.objects.pop(name, None) is None:
            return "unchanged"
        self.log.append(RecordedProfileWrite(at=now, object=f"clustercolocationprofile/{name}", action="deleted"))
        return "deleted"

    def export(self) -> Json:
        return {
            "clustercolocationprofiles": [self.objects[name] for name in sorted(self.objects)],
            "writes": [{"at": w.at, "object": w.object, "action": w.action} for w in self.log],
        }
