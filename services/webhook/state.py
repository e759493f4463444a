"""What the webhook knows of the cluster for a Pod's mutation: the ClusterColocationProfiles, each Namespace's labels
and each PriorityClass, folded from the bridge's events (schemas.cluster.AdmissionEvent, last value per object on
KOORD_CLUSTER). Pure and incremental: replaying the stream from the start and following it give the same view.

Profiles are kept as the JSON objects services.webhook.colocation reads (`{"metadata": {name, annotations},
"spec": …}`), in name order, built once per change rather than once per request. A tombstone removes its object.
Owned by services.webhook.service; read by services.webhook.admission.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from schemas.cluster import AdmissionEvent, ColocationProfileObserved, NamespaceObserved, PriorityClassObserved
from services.webhook.colocation import PriorityClass


class AdmissionView:
    """The cluster as the Pod mutation sees it; `apply` each event in stream order."""

    def __init__(self) -> None:
        self._profiles: dict[str, dict[str, Any]] = {}
        self._ordered: tuple[dict[str, Any], ...] = ()
        self._namespaces: dict[str, dict[str, str]] = {}
        self._classes: dict[str, PriorityClass] = {}

    def apply(self, event: AdmissionEvent) -> None:
        match event:
            case ColocationProfileObserved(name=name, deleted=deleted, profile=profile):
                if deleted or profile is None:
                    self._profiles.pop(name, None)
                else:
                    self._profiles[name] = msgspec.to_builtins(profile)
                self._ordered = tuple(self._profiles[key] for key in sorted(self._profiles))
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

    @property
    def profiles(self) -> Sequence[Mapping[str, Any]]:
        """Every profile, in name order (the order they apply in)."""
        return self._ordered

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The Namespace's labels; None when it is not known (a profile's namespaceSelector then matches, §10.2)."""
        return self._namespaces.get(name)

    @property
    def priority_classes(self) -> Mapping[str, PriorityClass]:
        return self._classes

    def counts(self) -> dict[str, int]:
        """Objects known per kind (the service's gauges)."""
        return {
            "clustercolocationprofile": len(self._profiles),
            "namespace": len(self._namespaces),
            "priorityclass": len(self._classes),
        }
