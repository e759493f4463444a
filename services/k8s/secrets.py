"""A Secret that gains keys and never loses or changes one: `koordbus creds ensure-cluster-secret` keeps the NATS
credentials of a Helm release there (the callout's account key, the service users' passwords), made once by a hook
Job because Helm cannot make ed25519 keys, and kept across upgrades (a service added later gets its keys added).

Needs RBAC get, create and update on that Secret.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from services.k8s import sinks

ATTEMPTS = 5


def decoded(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's `data` (base64 values) as text."""
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}


def encoded(data: Mapping[str, str]) -> dict[str, str]:
    """Text values as a Secret's `data` (base64)."""
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


async def ensure_keys(
    api_client: ApiClient,
    *,
    namespace: str,
    name: str,
    additions: Callable[[Mapping[str, str]], Mapping[str, str]],
    labels: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> list[str]:
    """Create the Secret `namespace/name` with `additions({})`, or add `additions(its data)` to the one there (a
    resourceVersion-guarded replace, retried on conflict). Returns the names of the keys added."""
    core_api = CoreV1Api(api_client)
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    what = f"Secret {namespace}/{name}"
    for _ in range(ATTEMPTS):
        status, body = await sinks.raw_request(core_api.read_namespaced_secret(name, namespace, **options))
        if status == sinks.HTTP_NOT_FOUND:
            data = dict(additions({}))
            secret: Any = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                "type": "Opaque",
                "data": encoded(data),
            }
            status, body = await sinks.raw_request(core_api.create_namespaced_secret(namespace, secret, **options))
            if status == sinks.HTTP_CONFLICT:
                continue  # made meanwhile (another hook run): add to that one
            sinks.parsed(status, body, f"create {what}")
            return sorted(data)
        current = sinks.parsed(status, body, f"get {what}")
        existing = decoded(current.get("data"))
        added = {k: v for k, v in additions(existing).items() if k not in existing}
        if not added:
            return []
        replacement: Any = {**current, "data": {**(current.get("data") or {}), **encoded(added)}}
        call = core_api.replace_namespaced_secret(name, namespace, replacement, **options)
        status, body = await sinks.raw_request(call)
        if status == sinks.HTTP_CONFLICT:
            continue
        sinks.parsed(status, body, f"replace {what}")
        return sorted(added)
    raise sinks.WriteFailedError(f"{what}: still changing under us after {ATTEMPTS} tries")
