"""The admission webhook's certificate in a cluster: the Secret that holds it, and the caBundle of the webhook
configurations that must trust its CA.

`koordbus certs webhook --secret …` (the Helm chart's hook Job; koordbus.certs decides whether a pair is still good
and makes a new one) calls `ensure_secret`, then `ensure_ca_bundle` on each configuration the chart renders. Both
are idempotent, so the Job runs before and after every install and upgrade: a good Secret is kept, and a caBundle
that already trusts its CA is left alone. When a new CA replaces one, the caBundle trusts both (the new one first)
until the next replacement, so the webhook's pods, which load the new files within about a minute, are trusted with
the old certificate and the new one alike. A configuration not there yet (the pre-install run) is skipped.

Needs RBAC: get, create and update on the Secret; get and patch on the named webhook configurations.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, CoreV1Api

from services.common import x509
from services.k8s import secrets, sinks

Json = dict[str, Any]

ATTEMPTS: Final = 5
MUTATING: Final = "MutatingWebhookConfiguration"
VALIDATING: Final = "ValidatingWebhookConfiguration"
JSON_PATCH: Final = "application/json-patch+json"
HTTP_UNPROCESSABLE: Final = 422
"""What kube-apiserver answers a JSON patch whose `test` failed: the object changed since our read."""


@dataclass(frozen=True, kw_only=True)
class SecretOutcome:
    data: dict[str, str]
    """The Secret's data as it now is (text)."""
    issued: str | None
    """Why a new pair was written (no Secret, a pair that does not verify, one about to expire), or None: kept."""
    replaced: dict[str, str] | None
    """The data a new pair replaced, or None."""


def _text(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's data as text; a value that is not base64 or not UTF-8 comes out as what cannot verify."""
    result = {}
    for key, value in (data or {}).items():
        try:
            result[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, ValueError):
            result[key] = ""
    return result


async def ensure_secret(
    api_client: ApiClient,
    *,
    namespace: str,
    name: str,
    reissue: Callable[[Mapping[str, str]], str | None],
    issue: Callable[[], Mapping[str, str]],
    labels: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> SecretOutcome:
    """Keep the Secret `namespace/name` when `reissue(its data)` is None; else write `issue()` into it (a
    resourceVersion-guarded replace, keeping its type) or create it (type kubernetes.io/tls). A conflict (made or
    changed meanwhile, another run) starts over from a fresh read."""
    core_api = CoreV1Api(api_client)
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    what = f"Secret {namespace}/{name}"
    for _ in range(ATTEMPTS):
        status, body = await sinks.raw_request(core_api.read_namespaced_secret(name, namespace, **options))
        if status == sinks.HTTP_NOT_FOUND:
            data = dict(issue())
            secret: Any = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                "type": "kubernetes.io/tls",
                "data": secrets.encoded(data),
            }
            status, body = await sinks.raw_request(core_api.create_namespaced_secret(namespace, secret, **options))
            if status == sinks.HTTP_CONFLICT:
                continue
            sinks.parsed(status, body, f"create {what}")
            return SecretOutcome(data=data, issued="there was no Secret", replaced=None)
        current = sinks.parsed(status, body, f"get {what}")
        existing = _text(current.get("data"))
        reason = reissue(existing)
        if reason is None:
            return SecretOutcome(data=existing, issued=None, replaced=None)
        data = dict(issue())
        replacement: Any = {**current, "data": secrets.encoded(data)}
        status, body = await sinks.raw_request(
            core_api.replace_namespaced_secret(name, namespace, replacement, **options)
        )
        if status in sinks.RETRY_AT_ONCE:
            continue
        sinks.parsed(status, body, f"replace {what}")
        return SecretOutcome(data=data, issued=reason, replaced=existing)
    raise sinks.WriteFailedError(f"{what}: still changing under us after {ATTEMPTS} tries")


def _bundle(webhook: Json) -> list[str]:
    encoded = (webhook.get("clientConfig") or {}).get("caBundle") or ""
    try:
        return x509.pem_certificates(base64.b64decode(encoded, validate=True).decode())
    except (binascii.Error, ValueError):
        return []


def ca_bundle_patch(configuration: Json, *, ca: str, keep: Sequence[str] = ()) -> tuple[list[Json], list[str]]:
    """The JSON patch (RFC 6902) making every webhook of `configuration` trust the PEM CA `ca` and those in `keep`
    (the CA it replaces), and the names of the webhooks it changes. A webhook whose caBundle already holds them all
    is left alone; another gets `ca` then `keep`. Each change is guarded by a `test` of the webhook's name at its
    index, so a configuration reordered since our read fails the patch instead of trusting the wrong webhook."""
    wanted = [*x509.pem_certificates(ca), *(c for k in keep for c in x509.pem_certificates(k))]
    if not wanted:
        raise ValueError("the CA is not a PEM certificate")
    wanted = list(dict.fromkeys(wanted))
    operations: list[Json] = []
    changed: list[str] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        if set(wanted) <= set(_bundle(webhook)):
            continue
        bundle = base64.b64encode("".join(wanted).encode()).decode()
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle})
        changed.append(str(webhook.get("name")))
    return operations, changed


async def ensure_ca_bundle(
    api_client: ApiClient, *, kind: str, name: str, ca: str, keep: Sequence[str] = (), timeout: float = 10.0
) -> list[str] | None:
    """Make the webhook configuration `kind`/`name` trust `ca` and `keep` (ca_bundle_patch). Returns the names of
    the webhooks changed ([] when it trusted them already), None when there is no such configuration."""
    api = AdmissionregistrationV1Api(api_client)
    read: Callable[..., Awaitable[object]]
    patch: Callable[..., Awaitable[object]]
    if kind == MUTATING:
        read, patch = api.read_mutating_webhook_configuration, api.patch_mutating_webhook_configuration
    elif kind == VALIDATING:
        read, patch = api.read_validating_webhook_configuration, api.patch_validating_webhook_configuration
    else:
        raise ValueError(f"not a webhook configuration kind: {kind}")
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    what = f"{kind} {name}"
    for _ in range(ATTEMPTS):
        status, body = await sinks.raw_request(read(name, **options))
        if status == sinks.HTTP_NOT_FOUND:
            return None
        operations, changed = ca_bundle_patch(sinks.parsed(status, body, f"get {what}"), ca=ca, keep=keep)
        if not operations:
            return []
        status, body = await sinks.raw_request(patch(name, operations, **{**options, "_content_type": JSON_PATCH}))
        if status in (sinks.HTTP_CONFLICT, HTTP_UNPROCESSABLE, sinks.HTTP_NOT_FOUND):
            continue  # changed (a failed test) or deleted since our read: read again
        sinks.parsed(status, body, f"patch {what}")
        return changed
    raise sinks.WriteFailedError(f"{what}: still changing under us after {ATTEMPTS} tries")
