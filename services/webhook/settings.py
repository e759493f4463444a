"""Settings of the admission webhook (`koordbus service webhook`), built once by the composition root with the shared
loader (services.common.settings.load: defaults, then KOORDBUS_WEBHOOK_* or the shared KOORDBUS_* variables, then
overrides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_WEBHOOK_"
    """Each field from KOORDBUS_WEBHOOK_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    tls_cert_file: str = ""
    tls_key_file: str = ""
    """The serving certificate (PEM, the chain after it) and its key: required, kube-apiserver calls webhooks over
    HTTPS only. Its name must be the one the webhook configurations' clientConfig reaches (the Service's
    `<service>.<namespace>.svc`), signed by the CA in their caBundle. Reloaded when either file changes."""
    tls_client_ca_file: str = ""
    """A CA bundle (PEM): set, only clients presenting a certificate it signed are served (kube-apiserver with an
    AdmissionConfiguration kubeconfig naming a client certificate); empty, any client that can reach the port."""
    tls_reload_seconds: float = 10.0
    """How often the certificate files are checked for a change (a Secret's volume is updated within about a minute
    of the Secret; cert-manager renews long before expiry). A pair that does not load (a half-written file, a key
    that is not the certificate's) is logged and the one in use kept until the next check."""
    webhook_port: int = 9443
    """The HTTPS port of the admission routes (POST /mutate-pods, /validate-configmaps); health, readiness and
    metrics are served there and on the plain --port."""
    skip_mutating_resources: bool = False
    """Koordinator's feature gate ColocationProfileSkipMutatingResources: on, a matched Pod keeps its cpu and memory
    (no batch/mid translation)."""
    configmap_namespace: str = CONFIGMAP_NAMESPACE
    configmap_name: str = CONFIGMAP_NAME
    """The slo-controller-config ConfigMap /validate-configmaps checks (every other ConfigMap passes)."""
    instance: str = ""
    """Names this replica's durable consumer (`webhook-cluster-<instance>`): every replica keeps the whole view, so
    replicas running at once need distinct names (a Deployment passes the pod name); empty for a single one."""
    startup_timeout_seconds: float = 60.0
    """Start-up waits for the replay of the profiles, namespaces and priority classes as long as it makes progress;
    after this many seconds without an event it serves with what it has (and logs a warning)."""
    quota_mirror_users: tuple[str, ...] = ()
    """The users (as kube-apiserver authenticates them: a ServiceAccount is
    `system:serviceaccount:<namespace>:<name>`) whose ElasticQuota writes are the bridge's quota mirror writing the
    quota log's own state: /validate-elasticquotas lets them through without a command. The chart gives the
    bridge's ServiceAccount; empty, every write is taken as a user's change (comma-separated in the variable)."""
    quota_timeout_seconds: float = 4.0
    """How long /validate-elasticquotas waits for the quota service to decide and append: keep it below the webhook
    configuration's timeoutSeconds (5 s in docs/webhook.md's), so kube-apiserver gets this service's refusal with its
    reason rather than a timeout (a healthy quota service answers in milliseconds)."""

    def __post_init__(self) -> None:
        if not (self.tls_cert_file and self.tls_key_file):
            raise ValueError(
                "tls_cert_file and tls_key_file are required: kube-apiserver calls admission webhooks over HTTPS only"
            )
        for name in ("tls_reload_seconds", "startup_timeout_seconds", "quota_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.webhook_port < 65536:
            raise ValueError("webhook_port must be a TCP port (1–65535)")
