"""Settings of the load-aware scheduler extender, built once by the composition root with the shared loader
(services.common.settings.load: defaults, then KOORDBUS_LOADAWARE_* or the shared KOORDBUS_* variables such as
KOORDBUS_ARGS_FILE or KOORDBUS_TLS_CERT_FILE, then overrides); koordbus.service reads the LoadAwareSchedulingArgs
file it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.loadaware.state import ASSUMED_TTL_SECONDS


@dataclass(frozen=True, kw_only=True)
class LoadAwareSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_LOADAWARE_"
    """Each field from KOORDBUS_LOADAWARE_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    args_file: str = ""
    """LoadAwareSchedulingArgs as JSON or YAML, Koordinator's field names (empty: Koordinator's defaults); the
    composition root reads it (services.loadaware.args.load_args)."""
    startup_timeout_seconds: float = 60.0
    """start() waits for the replay of the cluster and NodeMetrics as long as it makes progress; after this many
    seconds without an event it serves with what it has (and logs a warning)."""
    instance: str = ""
    """Names the durables of one replica (replicas each keep the whole state; empty: one replica)."""
    configmap_namespace: str = CONFIGMAP_NAMESPACE
    configmap_name: str = CONFIGMAP_NAME
    """The slo-controller-config ConfigMap: load-watermarks-config and resource-threshold-config."""
    bind_timeout_seconds: float = 5.0
    """The bind verb waits this long for the bridge's answer, then answers kube-scheduler with an error (and takes
    the placement back). Keep it below the extender's httpTimeout in the KubeSchedulerConfiguration."""
    assumed_ttl_seconds: float = ASSUMED_TTL_SECONDS
    """A placement the assume or bind verb recorded counts this long unless the pod watch shows the pod on its node
    by then; then it is forgotten (an assumed pod never bound, or a placement nobody made, frees the node)."""

    tls_cert_file: str = ""
    tls_key_file: str = ""
    """The extender's serving certificate and key (PEM). Set: the verbs (filter, prioritize, assume, bind) are served
    over HTTPS on `extender_port` only, to clients presenting a certificate `tls_client_ca_file` signed (kube-scheduler
    with `enableHTTPS: true` and a `tlsConfig` certFile/keyFile); the plain port keeps health, readiness, metrics and
    explain. Empty: every route on the plain port, without authentication (a NetworkPolicy must keep callers out)."""
    tls_client_ca_file: str = ""
    """The CA bundle (PEM) client certificates must chain to; required with tls_cert_file."""
    extender_port: int = 9443
    """The HTTPS port of the verbs when tls_cert_file is set."""

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    def __post_init__(self) -> None:
        if self.tls_cert_file and not (self.tls_key_file and self.tls_client_ca_file):
            raise ValueError(
                "tls_cert_file needs tls_key_file and tls_client_ca_file: the verbs are served only to clients with "
                "a certificate from that CA"
            )
        if not self.tls_cert_file and (self.tls_key_file or self.tls_client_ca_file):
            raise ValueError("tls_key_file and tls_client_ca_file need tls_cert_file")
        if self.startup_timeout_seconds <= 0:
            raise ValueError("startup_timeout_seconds must be positive")
        if self.bind_timeout_seconds <= 0:
            raise ValueError("bind_timeout_seconds must be positive")
        if self.assumed_ttl_seconds <= 0:
            raise ValueError("assumed_ttl_seconds must be positive")
