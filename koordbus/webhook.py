"""`koordbus service webhook`'s assembly: the slo-controller-config validators of every service that reads a key, the
ElasticQuota validation with the quota service's client, and the process (settings, the bus, the HTTPS server with
its certificate reloader, the plain port).

The validator table is here because only the composition root may import every service: services.webhook holds the
keys read through services.common (services.webhook.configmap.COMMON_VALIDATORS) and gets the noderesource service's
own parsers for colocation-config and cpu-normalization-config from this table, so each key is checked by the code
that reads it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import ssl
from collections.abc import Mapping
from typing import Any, Final

from koordbus.common import ServiceProcess
from services.common import settings as settings_loader
from services.noderesource import config as colocation_config
from services.noderesource import cpu_normalization
from services.webhook import configmap

SLO_CONFIG_VALIDATORS: Final[Mapping[str, configmap.KeyValidator]] = {
    colocation_config.COLOCATION_CONFIG_KEY: colocation_config.config_problems,
    cpu_normalization.CONFIG_KEY: cpu_normalization.config_problems,
    **configmap.COMMON_VALIDATORS,
}
"""Every key of the slo-controller-config koordbus reads → the check of the service that reads it."""

log = logging.getLogger(__name__)


def webhook_settings(args: argparse.Namespace) -> Any:
    """`service webhook`'s settings and its serving certificate, read before anything connects (a missing or
    unloadable pair stops the process here, with the variable to set)."""
    from services.webhook.settings import WebhookSettings
    from services.webhook.tls import ServingCertificate

    try:
        settings = settings_loader.load(WebhookSettings)
    except settings_loader.SettingsError as e:
        raise SystemExit(
            f"koordbus service webhook: {e} (KOORDBUS_WEBHOOK_TLS_CERT_FILE, KOORDBUS_WEBHOOK_TLS_KEY_FILE)"
        ) from None
    try:
        certificate = ServingCertificate(
            settings.tls_cert_file, settings.tls_key_file, client_ca_file=settings.tls_client_ca_file
        )
    except (OSError, ssl.SSLError) as e:
        raise SystemExit(f"koordbus service webhook: the serving certificate does not load: {e}") from None
    return settings, certificate


async def build_webhook(process: ServiceProcess) -> None:
    """The service on the process's bus, its admission routes over HTTPS on KOORDBUS_WEBHOOK_PORT (once the view is
    replayed), the certificate reloader, and health, readiness and metrics on the plain --port."""
    from koordbus import http_serve, runtime
    from services.quota.client import QuotaClient
    from services.webhook.http import create_app
    from services.webhook.service import VALIDATE_ELASTICQUOTAS, QuotaValidation, WebhookService

    settings, certificate = process.prepared
    quotas = QuotaValidation(
        # within the webhook's own bound (kube-apiserver's timeout): only a request nobody got is sent again in it
        QuotaClient(
            process.bus,
            timeout=settings.quota_timeout_seconds,
            within=settings.quota_timeout_seconds,
            registry=process.registry,
        ).command,
        mirror_users=settings.quota_mirror_users,
        registry=process.registry,
    )
    if not settings.quota_mirror_users:
        log.warning(
            "webhook: KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS is empty: %s takes every ElasticQuota write for a user's "
            "change, the bridge's quota mirror's too (set it to the bridge's user, docs/webhook.md)",
            VALIDATE_ELASTICQUOTAS,
        )
    service = WebhookService(
        process.bus,
        settings,
        registry=process.registry,
        validators=SLO_CONFIG_VALIDATORS,
        extra_routes={VALIDATE_ELASTICQUOTAS: quotas},
    )
    await service.start()
    gc.freeze()  # what start-up built lives as long as the process: keep full collections off it (requests wait)
    process.stack.push_async_callback(service.stop)
    liveness = runtime.bus_liveness(process.bus)
    app = create_app(service, process.registry, liveness=liveness)
    await http_serve.serve_http(
        process.stack, app, host="0.0.0.0", port=settings.webhook_port, ssl_context=certificate.server_context
    )
    runtime.background(process.stack, certificate.watch(settings.tls_reload_seconds), name="webhook-certificate")
    log.info("webhook: admission routes %s over HTTPS on port %d", ", ".join(service.routes), settings.webhook_port)
    if process.args.port:
        plain = create_app(service, process.registry, admission=False, liveness=liveness)
        await http_serve.serve_http(process.stack, plain, host="0.0.0.0", port=process.args.port)
