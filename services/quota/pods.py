"""Which quota a pod belongs to (spec §3.4) and what it adds to that quota's request and used (§3.5): pure.

Called by `koordbus calc quota-runtime` and, later, by the quota service when pod events arrive and by the admission
check. `QuotaIndex` is built once per set of quotas (names, the same-name-namespace rule, the namespaces
annotation); `resolve` applies the lookup order of koord-scheduler's GetQuotaName. `PodLoad` is one pod's share:
its effective request (schemas.kube.pod_request, overhead optionally excluded) counts in request; it counts in used
only when assigned (spec.nodeName set and not Succeeded/Failed); both also count as non-preemptible when the pod
carries preemptible=false. The tree masks them to the quota's max keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas import kube, quota, resources


@dataclass(frozen=True, slots=True)
class QuotaLoad:
    """What a quota's own pods add up to (before masking to the quota's max keys)."""

    request: resources.ResourceList = field(default_factory=dict)
    used: resources.ResourceList = field(default_factory=dict)
    non_preemptible_request: resources.ResourceList = field(default_factory=dict)
    non_preemptible_used: resources.ResourceList = field(default_factory=dict)

    def plus(self, other: QuotaLoad) -> QuotaLoad:
        return QuotaLoad(
            request=resources.add(self.request, other.request),
            used=resources.add(self.used, other.used),
            non_preemptible_request=resources.add(self.non_preemptible_request, other.non_preemptible_request),
            non_preemptible_used=resources.add(self.non_preemptible_used, other.non_preemptible_used),
        )


EMPTY_LOAD = QuotaLoad()


def is_non_preemptible(pod: kube.Pod) -> bool:
    return pod.metadata.labels.get(quota.LABEL_PREEMPTIBLE) == "false"


def is_assigned(pod: kube.Pod) -> bool:
    """Bound to a node and not terminated: counts in used (koord-scheduler's fail-over rule)."""
    return bool(pod.spec.node_name) and pod.status.phase not in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED)


def pod_load(pod: kube.Pod, *, ignore_overhead: bool = False) -> QuotaLoad:
    """One pod's contribution; `ignore_overhead` models the ElasticQuotaIgnorePodOverhead feature gate."""
    request = kube.pod_request(pod)
    if ignore_overhead and pod.spec.overhead:
        request = resources.sub(request, kube.resource_amounts(pod.spec.overhead))
    used = request if is_assigned(pod) else {}
    if is_non_preemptible(pod):
        return QuotaLoad(request, used, request, used)
    return QuotaLoad(request, used)


@dataclass(frozen=True, slots=True)
class QuotaIndex:
    """The lookups of §3.4 over one set of quotas."""

    specs: Mapping[str, quota.QuotaSpec]
    namespace_owner: Mapping[str, str]
    """namespace → the first quota whose namespaces annotation lists it."""

    @classmethod
    def build(cls, specs: Iterable[quota.QuotaSpec]) -> QuotaIndex:
        by_name: dict[str, quota.QuotaSpec] = {}
        owners: dict[str, str] = {}
        for spec in specs:
            by_name[spec.name] = spec
            for namespace in spec.namespaces or ():
                owners.setdefault(namespace, spec.name)
        return cls(by_name, owners)

    def resolve(self, labels: Mapping[str, str], namespace: str, *, disable_default_quota: bool = False) -> str | None:
        """The quota name a pod maps to; None only with DisableDefaultQuota when nothing matches."""
        name = labels.get(quota.LABEL_QUOTA_NAME, "")
        if not name and not disable_default_quota:
            same = self.specs.get(namespace)
            if same is not None and same.namespace == namespace:
                name = same.name
            else:
                name = self.namespace_owner.get(namespace, quota.DEFAULT_QUOTA)
        if name in self.specs or (name == quota.DEFAULT_QUOTA and not disable_default_quota):
            return name
        return None if disable_default_quota else quota.DEFAULT_QUOTA

    def resolve_pod(self, pod: kube.Pod, *, disable_default_quota: bool = False) -> str | None:
        return self.resolve(pod.metadata.labels, pod.metadata.namespace, disable_default_quota=disable_default_quota)
