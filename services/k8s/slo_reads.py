"""Reading what a NodeSLO preview compares against, for `koordbus slo preview`: the cluster's Nodes (their labels and
annotations), their NodeSLO objects and the live `slo-controller-config` ConfigMap.

Read-only, with the bridge's connection settings (services.k8s.client); lists are read page by page. Every failure is
a ReadError whose message says what the cluster answered. Called by the CLI; the comparison itself is pure
(services.slo.preview).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from services.k8s import core
from services.k8s.client import api_client
from services.k8s.nodeslo_mirror import GROUP, PLURAL, VERSION
from services.k8s.settings import K8sSettings

PAGE: Final = 500
HTTP_OK, HTTP_NOT_FOUND = 200, 404
Json = dict[str, Any]


class ReadError(Exception):
    """The cluster did not answer a read (the message says which and what it answered)."""


class ClusterSlo:
    """What was read: the nodes in the order asked (or listed), each node's NodeSLO spec, the ConfigMap's data."""

    def __init__(self, nodes: list[Json], nodeslos: dict[str, Json], configmap: dict[str, Any] | None) -> None:
        self.nodes = nodes
        self.nodeslos = nodeslos
        """node name → its NodeSLO's spec (a node without a NodeSLO is absent)."""
        self.configmap = configmap
        """The live ConfigMap's data; None when there is no such ConfigMap."""


async def read_cluster_slo(
    settings: K8sSettings, *, node_names: Sequence[str] | None, request_timeout: float = 30.0
) -> ClusterSlo:
    """The named nodes (None: every node), their NodeSLOs and the ConfigMap of `settings`."""
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": request_timeout}
    async with await api_client(settings) as client:
        core, custom = CoreV1Api(client), CustomObjectsApi(client)
        if node_names is None:
            nodes = await _list(lambda token: core.list_node(**_page(token), **options), "Nodes")
            nodeslos = await _list(
                lambda token: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **_page(token), **options),
                "NodeSLOs",
                missing_is_empty=True,  # the NodeSLO CRD is not installed: no node has one
            )
        else:
            nodes, nodeslos = [], []
            for name in node_names:
                found = await _get(core.read_node(name, **options), f"Node {name}")
                if found is None:
                    raise ReadError(f"there is no Node {name!r} in the cluster")
                nodes.append(found)
                nodeslo = await _get(
                    custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, **options), f"NodeSLO {name}"
                )
                nodeslos += [nodeslo] if nodeslo is not None else []
        configmap = await _get(
            core.read_namespaced_config_map(settings.configmap_name, settings.configmap_namespace, **options),
            f"ConfigMap {settings.configmap_namespace}/{settings.configmap_name}",
        )
    by_name = {(obj.get("metadata") or {}).get("name", ""): obj.get("spec") or {} for obj in nodeslos}
    return ClusterSlo(nodes, by_name, None if configmap is None else dict(configmap.get("data") or {}))


def _page(token: str) -> Json:
    return {"limit": PAGE, **({"_continue": token} if token else {})}


async def _request(call: Awaitable[Any], what: str) -> tuple[int, bytes]:
    try:
        response = await call
        async with response:
            return int(response.status), await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise ReadError(f"reading {what} failed: {type(err).__name__}: {err}") from err


def _decoded(status: int, body: bytes, what: str) -> Json:
    if status != HTTP_OK:
        raise ReadError(f"reading {what} failed: HTTP {status}: {body[:300].decode(errors='replace')}")
    try:
        return core.json_object(body)
    except ValueError as err:
        raise ReadError(f"reading {what} failed: {err}") from None


async def _get(call: Awaitable[Any], what: str) -> Json | None:
    status, body = await _request(call, what)
    return None if status == HTTP_NOT_FOUND else _decoded(status, body, what)


async def _list(call: Any, what: str, *, missing_is_empty: bool = False) -> list[Json]:
    items: list[Json] = []
    token = ""
    while True:
        status, body = await _request(call(token), f"the {what}")
        if status == HTTP_NOT_FOUND and missing_is_empty:
            return items
        page = _decoded(status, body, f"the {what}")
        items.extend(item for item in page.get("items") or [] if isinstance(item, dict))
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items
