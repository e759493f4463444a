"""The NodeSLO mirror: each node's rendered NodeSLO (the KOORD_SLO bucket) written to the cluster as a NodeSLO object
(slo.koordinator.sh/v1alpha1, cluster-scoped, named after the node), for koordlets and anyone reading NodeSLOs.

`NodeSloMirror` follows the bucket's node keys (last value per key, the durable reset at start so a restart
re-applies every node's latest spec) and hands each to services.k8s.latest_writer: a NodeSLO is created when
missing, its spec replaced (guarded by resourceVersion, re-read on 409) when it differs, deleted when the key is
(the node left). Labels and annotations others put on the object are kept; koordbus adds its managed-by label.
The bucket's `_config` key (the slo-controller-config keys in error) becomes a Warning Event on the ConfigMap, and a
Normal one when they are fixed, as the noderesource service's colocation errors do.
`desired_nodeslo` is the object we want, `nodeslo_update` the replacement (None when nothing differs). Where the
writes go is a NodeSloSink: the API server (`KubeNodeSloSink`) or, in record-only mode, `RecordingNodeSloSink`.
Built by the composition root.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import Bus, ConsumerSpec, Delivery, Handler
from schemas.qos import NODE_SLO_DECODER, SLO_CONFIG_STATUS_DECODER, SloConfigStatus
from services.k8s import sinks, writes
from services.k8s.latest_writer import Mirror
from services.k8s.settings import K8sSettings

SERVICE: Final = "k8s-nodeslo-mirror"
CONFIG_KEY: Final = "\x00config"
"""The writer's key for the ConfigMap Event (never a node name)."""
EVENT_REASONS: Final = ("InvalidSloConfig", "SloConfigApplied")
EVENT_COMPONENT: Final = "koordbus-slo"
CONSUMER: Final = "k8s-nodeslo-mirror"
GROUP, VERSION, PLURAL = "slo.koordinator.sh", "v1alpha1", "nodeslos"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "koordbus"}
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409

Json = dict[str, Any]


def desired_nodeslo(node: str, spec: Json) -> Json:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeSLO",
        "metadata": {"name": node, "labels": dict(MANAGED_BY)},
        "spec": copy.deepcopy(spec),
    }


def nodeslo_update(current: Json, desired: Json) -> Json | None:
    """`current` with desired's spec and labels, or None when it already holds them."""
    labels = {**(current.get("metadata", {}).get("labels") or {}), **desired["metadata"]["labels"]}
    if current.get("spec") == desired["spec"] and labels == (current.get("metadata", {}).get("labels") or {}):
        return None
    update = copy.deepcopy(current)
    update["spec"] = copy.deepcopy(desired["spec"])
    update.setdefault("metadata", {})["labels"] = labels
    return update


class NodeSloSink(Protocol):
    async def write(self, desired: Json) -> str: ...

    async def delete(self, node: str) -> str: ...

    async def write_event(self, event: Json) -> str:
        """Create a core/v1 Event; created, or unchanged when it exists (a repeat)."""
        ...


class KubeNodeSloSink:
    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write(self, desired: Json) -> str:
        return await sinks.upsert_custom_object(
            self._custom,
            (GROUP, VERSION, PLURAL),
            desired,
            update=nodeslo_update,
            attempts=self._attempts,
            timeout=self._timeout,
            what=f"NodeSLO {desired['metadata']['name']}",
        )

    async def delete(self, node: str) -> str:
        status, body = await self._request(
            self._custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node, **self._opts())
        )
        if status == HTTP_NOT_FOUND:
            return "unchanged"
        sinks.parsed(status, body, f"delete NodeSLO {node}")
        return "deleted"

    async def write_event(self, event: Json) -> str:
        return "created" if await sinks.create_event(self._core, event, timeout=self._timeout) else "unchanged"

    def _opts(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout}

    @staticmethod
    async def _request(call: Awaitable[object]) -> tuple[int, bytes]:
        return await sinks.raw_request(call)


class RecordingNodeSloSink:
    """Record-only mode: the NodeSLOs that would be written, and the last writes."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.objects: dict[str, Json] = {}
        self.log: deque[Json] = deque(maxlen=keep)
        self._clock = clock

    async def write(self, desired: Json) -> str:
        name = desired["metadata"]["name"]
        current = self.objects.get(name)
        if current is not None and nodeslo_update(current, desired) is None:
            return "unchanged"
        self.objects[name] = desired
        action = "created" if current is None else "updated"
        self.log.append({"at": self._clock(), "node": name, "action": action})
        return action

    async def delete(self, node: str) -> str:
        if self.objects.pop(node, None) is None:
            return "unchanged"
        self.log.append({"at": self._clock(), "node": node, "action": "deleted"})
        return "deleted"

    async def write_event(self, event: Json) -> str:
        self.log.append(
            {"at": self._clock(), "event": event["reason"], "message": event["message"], "action": "created"}
        )
        return "created"

    def export(self) -> Json:
        return {"objects": dict(self.objects), "writes": list(self.log)}


class _Handler:
    def __init__(self, mirror: NodeSloMirror) -> None:
        self._mirror = mirror

    async def handle(self, delivery: Delivery) -> None:
        node = subjects.node_of_slo_key(delivery.subject)
        if node is None:
            if delivery.subject == subjects.SLO_CONFIG_STATUS:
                self._mirror.offer_config_status(SLO_CONFIG_STATUS_DECODER.decode(delivery.data))
            return
        if delivery.headers.get("KV-Operation") in ("DEL", "PURGE"):
            self._mirror.offer(node, None)
        else:
            self._mirror.offer(node, NODE_SLO_DECODER.decode(delivery.data).spec)

    async def flush(self) -> None:
        return None


class NodeSloMirror(Mirror[Json | None]):
    def __init__(
        self,
        bus: Bus,
        sink: NodeSloSink,
        *,
        settings: K8sSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            bus, what="NodeSLO", metric="koordbus_k8s_nodeslo_writes", settings=settings, registry=registry,
            clock=clock,
        )  # fmt: skip
        self.sink = sink
        self._config_error: str | None = None

    def _consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=CONSUMER,
            stream=streams.KV_KOORD_SLO,
            filter_subjects=(subjects.SLO_ALL,),
            service=SERVICE,
            deliver_policy="last_per_subject",
        )

    def _handler(self) -> Handler:
        return _Handler(self)

    def offer(self, node: str, spec: Json | None) -> None:
        self._writer.offer(node, spec)

    def offer_config_status(self, status: SloConfigStatus) -> None:
        """A Warning Event on the ConfigMap for keys in error, a Normal one when they are fixed."""
        error = "; ".join(f"{key}: {reason}" for key, reason in sorted(status.errors.items())) or None
        previous, self._config_error = self._config_error, error
        if not status.configmap_name or error == previous:
            return
        event = writes.configmap_event(
            namespace=status.configmap_namespace,
            name=status.configmap_name,
            error=error,
            previous_error=previous,
            resource_version=status.resource_version,
            at=status.at,
            reasons=EVENT_REASONS,
            what="the slo-controller-config NodeSLO keys",
            component=EVENT_COMPONENT,
        )
        if event is not None:
            self._writer.offer(CONFIG_KEY, event)

    async def _write(self, node: str, spec: Json | None) -> str:
        if node == CONFIG_KEY:
            assert spec is not None
            return await self.sink.write_event(spec)
        if spec is None:
            return await self.sink.delete(node)
        return await self.sink.write(desired_nodeslo(node, spec))
