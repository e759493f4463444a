"""What the webhook knows of the cluster for a Pod's mutation: the ClusterColocationProfiles, each Namespace's labels
and each PriorityClass, folded from the bridge's events (schemas.cluster.AdmissionEvent, last value per object on
KOORD_CLUSTER) and from the profile log koordbus keeps itself (schemas.colocation_events.ProfileEvent, last value
per profile on KOORD_CCP: the REST API's profiles). Pure and incremental: replaying the streams from the start and
following them give the same view.

The profiles that apply are the log's and the cluster's, by name; for a name both hold, the log's (an admin wrote it
through koordbus, which keeps it as the source of truth, as it keeps the quota trees); the cluster's of that name is
`shadowed` and applies again once the log's is deleted. A cluster profile labelled
app.kubernetes.io/managed-by=koordbus is the bridge's copy of one of the log's (services.k8s.profile_mirror, when on)
and is not applied: the log's is, and a copy left behind by a deleted one must not outlive it. They are kept as the
JSON objects services.webhook.colocation reads (`{"metadata": {name, annotations}, "spec": …}`), in name order, built
once per change rather than once per request. A tombstone removes its object. Owned by services.webhook.service; read
by services.webhook.admission.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from schemas.cluster import (
    AdmissionEvent,
    ColocationProfile,
    ColocationProfileObserved,
    NamespaceObserved,
    PriorityClassObserved,
)
from schemas.colocation_events import (
    MIRROR_LABEL,
    MIRROR_VALUE,
    ColocationProfileDeleted,
    ColocationProfileSet,
    ProfileEvent,
)
from services.webhook.colocation import PriorityClass


def is_mirror_copy(profile: ColocationProfile) -> bool:
    """A cluster profile the bridge's profile mirror wrote: a copy of one of the log's, not the cluster's own."""
    return profile.metadata.labels.get(MIRROR_LABEL) == MIRROR_VALUE


class AdmissionView:
    """The cluster as the Pod mutation sees it; `apply` each event in stream order."""

    def __init__(self) -> None:
        self._profiles: dict[str, dict[str, Any]] = {}
        """The cluster's, by name."""
        self._owned: dict[str, dict[str, Any]] = {}
        """The profile log's, by name."""
        self._ordered: tuple[dict[str, Any], ...] = ()
        self._namespaces: dict[str, dict[str, str]] = {}
        self._classes: dict[str, PriorityClass] = {}

    def apply(self, event: AdmissionEvent | ProfileEvent) -> None:
        match event:
            case ColocationProfileObserved(name=name, deleted=deleted, profile=profile):
                if deleted or profile is None or is_mirror_copy(profile):
                    self._profiles.pop(name, None)
                else:
                    self._profiles[name] = msgspec.to_builtins(profile)
                self._order()
            case ColocationProfileSet(name=name, profile=profile):
                self._owned[name] = msgspec.to_builtins(profile)
                self._order()
            case ColocationProfileDeleted(name=name):
                self._owned.pop(name, None)
                self._order()
            case NamespaceObserved(name=name, deleted=deleted, labels=labels):
                if deleted:
                    self._namespaces.pop(name, None)
                else:
                    self._namespaces[name] = dict(labels)
            case PriorityClassObserved(name=name, deleted=deleted):
                if deleted:
                    self._classes.pop(name, None)
                else:
                    self._classes[name] = PriorityClass(value=event.value, preemption_policy=event.preemption_policy)

    def _order(self) -> None:
        effective = {**self._profiles, **self._owned}
        self._ordered = tuple(effective[key] for key in sorted(effective))

    @property
    def profiles(self) -> Sequence[Mapping[str, Any]]:
        """Every profile that applies, in name order (the order they apply in)."""
        return self._ordered

    def shadowed(self) -> list[str]:
        """The cluster's profiles that do not apply because the log holds one of the same name."""
        return sorted(self._profiles.keys() & self._owned.keys())

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The Namespace's labels; None when it is not known (a profile's namespaceSelector then matches, §10.2)."""
        return self._namespaces.get(name)

    @property
    def priority_classes(self) -> Mapping[str, PriorityClass]:
        return self._classes

    def counts(self) -> dict[str, int]:
        """Objects known per kind (the service's gauges): the profiles that apply, and of them the log's; the
        cluster's shadowed by the log's."""
        return {
            "clustercolocationprofile": len(self._ordered),
            "clustercolocationprofile-koordbus": len(self._owned),
            "clustercolocationprofile-shadowed": len(self._profiles.keys() & self._owned.keys()),
            "namespace": len(self._namespaces),
            "priorityclass": len(self._classes),
        }
