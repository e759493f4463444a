"""The Kubernetes write counter every writer in services.k8s shares: `koordbus_k8s_writes{object, outcome}`.

The NodeMetric/Node/Event/topology writer, the ElasticQuota and NodeSLO mirrors and both eviction paths (agents'
requests, migrations) count each write they make, or decide not to make, here — one family a dashboard sums
over, by object kind (a fixed lower-case name, never an object's own name) and outcome (created, updated,
unchanged, deleted, skipped, failed, rejected; evictions: evicted, gone, replaced, blocked, expired, failed;
bindings: bound, gone, conflict, failed, rejected).
A registry holds one such counter, however many writers share it.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter

from services.common.metrics import once_per_registry

OBJECT_ELASTICQUOTA: Final = "elasticquota"
OBJECT_NODESLO: Final = "nodeslo"
OBJECT_EVICTION: Final = "eviction"
OBJECT_BINDING: Final = "binding"


def kube_writes(registry: CollectorRegistry) -> Counter:
    """The registry's write counter, created on first use."""
    return once_per_registry(registry, "koordbus_k8s_writes", _create)


def _create(registry: CollectorRegistry) -> Counter:
    return Counter(
        "koordbus_k8s_writes",
        "Writes to Kubernetes by object kind and outcome (created, updated, unchanged, deleted, skipped, "
        "failed, rejected; evictions: evicted, gone, replaced, blocked, expired, failed; bindings: bound, gone, "
        "conflict, failed, rejected)",
        ["object", "outcome"],
        registry=registry,
    )
