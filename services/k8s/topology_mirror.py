"""The topology mirror: each node agent's NodeTopologyReported (koord.v1.node.<node>.topology, stream KOORD_NODE)
written to the cluster as the node's NodeResourceTopology (topology.node.k8s.io/v1alpha1, cluster-scoped, named after
the node), as koordlet writes it; the agent holds no cluster credentials (issue 23.4).

`TopologyMirror` follows every node's topology subject (last message per subject, the durable reset at start so a
restart re-applies every node's latest report) and hands each report's object to services.k8s.latest_writer: a
NodeResourceTopology is created when missing, replaced (guarded by resourceVersion, re-read on 409) when it differs,
never deleted (a node's reports stop when it leaves; its object is the cluster's to remove); in a cluster without the
CRD a write is skipped, not failed, so /readyz stays ready. What the object holds
and what is kept of others' writes (the noderesource service's batch entries in the zones, foreign labels and
annotations) is services.k8s.topology_writes (`desired_topology`, `topology_update`). A report whose node is not its
subject's (an agent may publish only under its own node) or that does not render (a malformed cpu list) is a
PermanentError: dead-lettered, the consumer goes on, as an undecodable one is. Where the writes go is a TopologySink:
the API server (`KubeTopologySink`) or, in record-only mode, `RecordingTopologySink`. Built by the composition root.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import Bus, ConsumerSpec, Delivery, Handler
from bus.errors import PermanentError
from schemas import names
from schemas.node_topology import TOPOLOGY_DECODER
from services.k8s import sinks
from services.k8s.latest_writer import Mirror
from services.k8s.settings import K8sSettings
from services.k8s.topology_writes import GROUP, PLURAL, VERSION, ReportError, desired_topology, topology_update

SERVICE: Final = "k8s-topology-mirror"
CONSUMER: Final = "k8s-topology-mirror"
SKIPPED: Final = "skipped"
"""The action of a write to a cluster without the NodeResourceTopology CRD: nothing to write to, and nothing wrong
with the bridge (the observer, too, goes on without it)."""

Json = dict[str, Any]


class TopologySink(Protocol):
    async def write(self, desired: Json) -> str:
        """Bring the node's NodeResourceTopology to `desired` (topology_update); created, updated or unchanged."""
        ...


class KubeTopologySink:
    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._custom = CustomObjectsApi(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write(self, desired: Json) -> str:
        try:
            return await sinks.upsert_custom_object(
                self._custom,
                (GROUP, VERSION, PLURAL),
                desired,
                update=topology_update,
                attempts=self._attempts,
                timeout=self._timeout,
                what=f"NodeResourceTopology {desired['metadata']['name']}",
            )
        except sinks.WriteFailedError as err:
            if err.status == sinks.HTTP_NOT_FOUND:  # to the create: the cluster does not serve the CRD
                return SKIPPED
            raise


class RecordingTopologySink:
    """Record-only mode: the NodeResourceTopologies that would be written, and the last writes."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.objects: dict[str, Json] = {}
        self.log: deque[Json] = deque(maxlen=keep)
        self._clock = clock

    async def write(self, desired: Json) -> str:
        name = desired["metadata"]["name"]
        current = self.objects.get(name)
        if current is None:
            self.objects[name] = copy.deepcopy(desired)
            action = "created"
        elif (update := topology_update(current, desired)) is not None:
            self.objects[name] = update
            action = "updated"
        else:
            return "unchanged"
        self.log.append({"at": self._clock(), "node": name, "action": action})
        return action

    def export(self) -> Json:
        return {"objects": dict(self.objects), "writes": list(self.log)}


class _Handler:
    def __init__(self, mirror: TopologyMirror) -> None:
        self._mirror = mirror

    async def handle(self, delivery: Delivery) -> None:
        report = TOPOLOGY_DECODER.decode(delivery.data)
        node = subjects.node_of(delivery.subject)
        if report.node != node:  # the subject is the agent's own (its permissions); the payload is not checked
            raise PermanentError(f"the report names node {names.shown(report.node)}, its subject {node!r}")
        try:
            desired = desired_topology(report)
        except ReportError as err:
            raise PermanentError(f"node {node}: {err}") from None
        self._mirror.offer(node, desired)

    async def flush(self) -> None:
        return None


class TopologyMirror(Mirror[Json]):
    def __init__(
        self,
        bus: Bus,
        sink: TopologySink,
        *,
        settings: K8sSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            bus, what="NodeResourceTopology", metric="koordbus_k8s_topology_writes", settings=settings,
            registry=registry, clock=clock,
        )  # fmt: skip
        self.sink = sink

    def _consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=CONSUMER,
            stream=streams.KOORD_NODE,
            filter_subjects=(subjects.NODE_TOPOLOGY_ALL,),
            service=SERVICE,
            deliver_policy="last_per_subject",
        )

    def _handler(self) -> Handler:
        return _Handler(self)

    def offer(self, node: str, desired: Json) -> None:
        self._writer.offer(node, desired)

    async def _write(self, node: str, desired: Json) -> str:
        return await self.sink.write(desired)
