"""The bind responder: the load-aware extender's bind verb carried out through the Binding API, since only the
bridge holds cluster credentials.

It answers `koord.v1.rpc.k8s.bind` (core NATS request/reply, schemas.extender.PodBindRequest → PodBindReply) by
POSTing a core/v1 Binding of the pod to the node, the pod's uid in the Binding's metadata so the API server refuses
to bind a pod recreated under the same name. The reply carries the API server's status and message: 201 bound, 404
the pod is gone, 409 it is already bound (or the uid did not match); an unreachable API server is status 0. Nothing
is retried here: kube-scheduler retries a pod whose binding failed. Every answer is counted in
`koordbus_k8s_writes{object="binding"}`. Started by the composition root when the bridge writes to a cluster with
KubeBinder, and in record-only mode (`koordbus up` without a cluster) with RecordingBinder, which keeps the Binding
it would have created (shown under `bindings` at /api/v1/k8s/recorded-writes) and answers 201.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from prometheus_client import CollectorRegistry

from bus import subjects
from bus.api import Bus, Responder
from schemas import extender as wire
from services.k8s import core, instruments, sinks

log = logging.getLogger(__name__)

QUEUE: Final = "k8s-bind"
OUTCOMES: Final = {200: "bound", 201: "bound", 404: "gone", 409: "conflict"}


class Binder(Protocol):
    async def bind(self, request: wire.PodBindRequest) -> wire.PodBindReply: ...


def binding_object(request: wire.PodBindRequest) -> dict[str, Any]:
    """The core/v1 Binding of the pod to its node, its uid in the metadata (the API server then refuses to bind a pod
    recreated under the same name)."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": request.name, "namespace": request.namespace, "uid": request.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": request.node},
    }


class KubeBinder:
    def __init__(self, api_client: ApiClient, *, request_timeout: float = 30.0) -> None:
        self._core = CoreV1Api(api_client)
        self._timeout = request_timeout

    async def bind(self, request: wire.PodBindRequest) -> wire.PodBindReply:
        body: Any = binding_object(request)
        try:
            status, text = await sinks.raw_request(
                self._core.create_namespaced_pod_binding(
                    request.name, request.namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except sinks.WriteFailedError as err:
            return wire.PodBindReply(status=0, error=f"the API server was not reached: {err}")
        if 200 <= status <= 299:
            return wire.PodBindReply(status=status)
        return wire.PodBindReply(status=status, error=f"HTTP {status}: {core.error_status(text)}")


class RecordingBinder:
    """Record-only mode: the Bindings that would have been created (the newest `keep`), each answered as bound."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.log: deque[dict[str, Any]] = deque(maxlen=keep)
        self._clock = clock

    async def bind(self, request: wire.PodBindRequest) -> wire.PodBindReply:
        self.log.append({"at": self._clock(), "binding": binding_object(request)})
        return wire.PodBindReply(status=201)

    def export(self) -> list[dict[str, Any]]:
        return list(self.log)


class BindResponder:
    def __init__(self, bus: Bus, binder: Binder, *, registry: CollectorRegistry, concurrency: int = 16) -> None:
        self.bus = bus
        self.binder = binder
        self._concurrency = concurrency
        self._writes = instruments.kube_writes(registry)
        self._responder: Responder | None = None

    async def start(self) -> None:
        self._responder = await self.bus.serve(
            subjects.K8S_RPC_BIND, self.answer, queue=QUEUE, concurrency=self._concurrency
        )

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
            self._responder = None

    async def answer(self, data: bytes) -> bytes:
        try:
            request = wire.BIND_REQUEST.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            self._writes.labels(object=instruments.OBJECT_BINDING, outcome="rejected").inc()
            return msgspec.json.encode(wire.PodBindReply(error=f"not a PodBindRequest: {err}"))
        reply = await self.binder.bind(request)
        outcome = OUTCOMES.get(reply.status, "failed")
        self._writes.labels(object=instruments.OBJECT_BINDING, outcome=outcome).inc()
        log.log(
            logging.INFO if outcome == "bound" else logging.WARNING,
            "bindings: %s/%s (%s) to %s: %s%s",
            request.namespace,
            request.name,
            request.uid,
            request.node,
            outcome,
            f" — {reply.error}" if reply.error else "",
        )
        return msgspec.json.encode(reply)
