"""Reading ElasticQuota objects from a cluster, for `koordbus quota import` (adopting an existing quota setup).

Lists every ElasticQuota (scheduling.sigs.k8s.io/v1alpha1, all namespaces) as raw JSON objects, page by page, with
the same connection settings as the bridge (services.k8s.client). Called by the CLI; the objects then go to the
API's import route, which validates them as trees.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from kubernetes_asyncio.client import CustomObjectsApi

from schemas import quota
from services.k8s.client import api_client
from services.k8s.settings import K8sSettings

GROUP, VERSION = quota.API_VERSION.split("/")
PLURAL = "elasticquotas"
PAGE = 500


class ListError(Exception):
    """The cluster did not answer the list (the message says what it answered)."""


async def list_elastic_quotas(settings: K8sSettings) -> list[dict[str, Any]]:
    """Every ElasticQuota in the cluster, as the API server returns them."""
    async with await api_client(settings) as client:
        custom = CustomObjectsApi(client)
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            options: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
            if token:
                options["_continue"] = token
            try:
                response = await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **options)
                async with response:
                    status, body = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise ListError(f"listing ElasticQuotas failed: {type(e).__name__}: {e}") from e
            if status != 200:
                raise ListError(f"listing ElasticQuotas failed: HTTP {status}: {body[:300].decode(errors='replace')}")
            page = json.loads(body)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items
