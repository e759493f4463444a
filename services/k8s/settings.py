"""Settings of the Kubernetes bridge (built once by the CLI; see services.common.settings.load)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class K8sSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_K8S_"
    """Each field from KOORDBUS_K8S_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    kubeconfig: str = ""
    """Path of a kubeconfig file; "" uses the in-cluster service account (KUBERNETES_SERVICE_HOST …)."""
    kube_context: str = ""
    """Context of the kubeconfig to use; "" is its current-context."""
    configmap_namespace: str = "koordinator-system"
    """Namespace of the colocation ConfigMap, as Koordinator deploys it."""
    configmap_name: str = "slo-controller-config"
    """Name of the colocation ConfigMap; only this one ConfigMap is watched."""
    watch_timeout_seconds: int = 300
    """Server-side timeout of one watch request; the stream then ends cleanly and is resumed at once."""
    watch_read_grace_seconds: float = 30.0
    """A watch that sends nothing for watch_timeout_seconds plus this long is treated as a dead connection."""
    backoff_initial_seconds: float = 0.5
    """First delay after a failed list or watch; it doubles on each consecutive failure."""
    backoff_max_seconds: float = 30.0
    """Upper bound of the delay between retries of a failing list, watch or publish."""
    publish_batch_size: int = 256
    """Pending observed states published concurrently per round (the bus bounds in-flight publishes too)."""
    nodemetric_status_interval_seconds: float = 10.0
    """At most one NodeMetric status write per node this often (koordlet: 0.1 QPS); newer ones coalesce meanwhile."""
    write_conflict_retries: int = 5
    """Re-reads and retries of one write answered 409 Conflict before it counts as failed (then backed off)."""
    write_concurrency: int = 16
    """Objects written concurrently by the writer."""
    write_timeout_seconds: float = 30.0
    """Timeout of one write request (connect and read)."""
    unhealthy_after_write_failures: int = 5
    """Consecutive failed writes after which the writer reports unhealthy (/readyz); one success clears it."""
    quota_write_interval_seconds: float = 1.0
    """At most one ElasticQuota write per quota this often (koord-scheduler writes its status back every second);
    newer statuses coalesce meanwhile."""
    quota_write_delay_seconds: float = 1.0
    """A quota's changed status is written this long after it arrived, at the earliest. A change made with kubectl
    reaches the quota log through the admission webhook (docs/webhook.md) a moment before kube-apiserver stores it:
    written first, the mirror's copy of it would make the user's own create fail with AlreadyExists (a delete with
    NotFound, an edit with a conflict), although the change is made."""
    mirror_quotas: bool = True
    """Mirror koordbus's quota trees to ElasticQuota objects (so koord-scheduler consumes them); false leaves the
    cluster's ElasticQuotas alone."""
    mirror_profiles: bool = False
    """Write the ClusterColocationProfiles of koordbus's REST API to the cluster as objects
    (services.k8s.profile_mirror, labelled app.kubernetes.io/managed-by=koordbus, which the webhook does not apply: it
    applies the log's); needs the ClusterColocationProfile CRD, which the chart does not install, and the right to
    write it. Off: they live in koordbus only (docs/webhook.md)."""
    mirror_topologies: bool = True
    """Write each node's NodeResourceTopology from its agent's topology report (services.k8s.topology_mirror), as
    koordlet does; false leaves the cluster's NodeResourceTopologies to another writer (a koordlet)."""
    bind_pods: bool = True
    """Answer the load-aware extender's bind requests (koord.v1.rpc.k8s.bind) by creating pods/binding; needs that
    right (the Helm chart grants it with loadaware.bind). In record-only mode the Bindings are recorded instead."""
    recorded_writes_kept: int = 1000
    """Record-only mode: how many of the latest writes it would have made are kept in its log."""

    def __post_init__(self) -> None:
        if not self.configmap_namespace or not self.configmap_name:
            raise ValueError("configmap_namespace and configmap_name must not be empty")
        if self.watch_timeout_seconds <= 0:
            raise ValueError("watch_timeout_seconds must be positive")
        if self.watch_read_grace_seconds <= 0:
            raise ValueError("watch_read_grace_seconds must be positive")
        if not 0 < self.backoff_initial_seconds <= self.backoff_max_seconds:
            raise ValueError("backoff bounds must satisfy 0 < backoff_initial_seconds <= backoff_max_seconds")
        if self.publish_batch_size <= 0:
            raise ValueError("publish_batch_size must be positive")
        if self.nodemetric_status_interval_seconds < 0:
            raise ValueError("nodemetric_status_interval_seconds must not be negative")
        if self.write_conflict_retries < 0:
            raise ValueError("write_conflict_retries must not be negative")
        if min(self.write_concurrency, self.unhealthy_after_write_failures, self.recorded_writes_kept) <= 0:
            raise ValueError(
                "write_concurrency, unhealthy_after_write_failures and recorded_writes_kept must be positive"
            )
        if self.quota_write_interval_seconds < 0 or self.quota_write_delay_seconds < 0:
            raise ValueError("quota_write_interval_seconds and quota_write_delay_seconds must not be negative")
        if self.write_timeout_seconds <= 0:
            raise ValueError("write_timeout_seconds must be positive")
