"""The eviction executor: node agents' PodEvictionRequested (koord.v1.node.<node>.eviction) carried out through the
Eviction API, since agents hold no cluster credentials.

A durable consumer on KOORD_NODE (created to start at new messages, then resumed where it stopped, so a restart
neither loses nor repeats requests) hands each request to an Evictor: `KubeEvictor` reads the pod, and POSTs a
policy/v1 Eviction with the pod's uid as a precondition (a new pod that took the name is never evicted by mistake)
only when the pod is bound to the node the request came from; `RecordingEvictor` keeps them in record-only mode.
A request comes from a node, outside the control plane's trust: one whose `node` is not its subject's (an agent may
publish only under its own node) is dead-lettered, and one naming a pod of another node is refused (wrong-node),
so one node's agent can never evict another node's pods. Answers: evicted (201), gone (404), replaced (409, the uid
did not match), wrong-node, blocked (429, a PodDisruptionBudget; the agent asks again while the pressure lasts),
expired (the request is older than `max_age_seconds`, e.g. delivered after a long outage: the agent's view it came
from is stale). A 5xx or an unreachable API server is retried with the consumer's backoff. Every answer is counted
by feature; each one goes to the log at DEBUG, a failed or refused one at WARNING, and once a minute one INFO line
sums them up (services.k8s.instruments.WriteSummary: a thousand nodes' expired requests after an outage used to be a
thousand WARNING lines).
Built by the composition root.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient, CoreV1Api
from prometheus_client import CollectorRegistry, Counter

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery
from bus.errors import PermanentError, TemporaryError
from schemas import names
from schemas.qos import EVICTION_DECODER, PodEvictionRequested
from services.common import observe
from services.k8s import instruments, sinks

log = logging.getLogger(__name__)

SERVICE: Final = "k8s-evictions"
CONSUMER: Final = "k8s-evictions"
NOT_ON_NODE: Final = -2
"""Not an HTTP status: what an Evictor answers for a pod that is not bound to the requesting node."""
ANSWERS: Final = {
    201: "evicted",
    200: "evicted",
    404: "gone",
    409: "replaced",
    429: "blocked",
    NOT_ON_NODE: "wrong-node",
}
REFUSED: Final = frozenset({"wrong-node"})


class Evictor(Protocol):
    async def evict(self, request: PodEvictionRequested) -> int:
        """The API server's HTTP status for the Eviction."""
        ...


class KubeEvictor:
    def __init__(self, api_client: ApiClient, *, request_timeout: float = 30.0) -> None:
        self._core = CoreV1Api(api_client)
        self._timeout = request_timeout

    async def evict(self, request: PodEvictionRequested) -> int:
        what = f"read pod {request.namespace}/{request.name}"
        status, text = await sinks.raw_request(
            self._core.read_namespaced_pod(
                request.name, request.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )
        if status == 404:
            return 404
        pod = sinks.parsed(status, text, what)
        if (pod.get("metadata") or {}).get("uid") != request.uid:
            return 409
        if (pod.get("spec") or {}).get("nodeName") != request.node:
            return NOT_ON_NODE
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": request.name, "namespace": request.namespace},
            "deleteOptions": {"preconditions": {"uid": request.uid}},
        }
        status, text = await sinks.raw_request(
            self._core.create_namespaced_pod_eviction(
                request.name, request.namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
        )
        if status not in ANSWERS:
            sinks.parsed(status, text, f"evict pod {request.namespace}/{request.name}")
        return status


class RecordingEvictor:
    """Record-only mode: the evictions that would have been asked for."""

    def __init__(self, *, keep: int = 1000) -> None:
        self.log: deque[dict[str, Any]] = deque(maxlen=keep)

    async def evict(self, request: PodEvictionRequested) -> int:
        self.log.append(
            {
                "at": request.at,
                "node": request.node,
                "pod": f"{request.namespace}/{request.name}",
                "uid": request.uid,
                "feature": request.feature,
                "reason": request.reason,
            }
        )
        return 201

    def export(self) -> list[dict[str, Any]]:
        return list(self.log)


class _Handler:
    def __init__(self, executor: EvictionExecutor) -> None:
        self._executor = executor

    async def handle(self, delivery: Delivery) -> None:
        request = EVICTION_DECODER.decode(delivery.data)
        node = subjects.node_of(delivery.subject)
        if request.node != node:  # the subject is the agent's own (its permissions); the payload is not checked
            raise PermanentError(
                f"an eviction request naming node {names.shown(request.node)} came on {node!r}'s subject"
            )
        await self._executor.execute(request)

    async def flush(self) -> None:
        return None


class EvictionExecutor:
    def __init__(
        self,
        bus: Bus,
        evictor: Evictor,
        *,
        registry: CollectorRegistry,
        max_age_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.evictor = evictor
        self._max_age = max_age_seconds
        self._clock = clock
        self._registry = registry
        self._consumer: Consumer | None = None
        self._writes = instruments.kube_writes(registry)
        self._summary = instruments.WriteSummary("eviction executor", log)
        self._answers = Counter(
            "koordbus_k8s_node_evictions",
            "Agents' eviction requests by answer and feature",
            ["answer", "feature"],
            registry=registry,
        )

    async def start(self) -> None:
        spec = ConsumerSpec(
            durable=CONSUMER,
            stream=streams.KOORD_NODE,
            filter_subjects=(subjects.NODE_EVICTION_ALL,),
            service=SERVICE,
            deliver_policy="new",
        )
        self._consumer = observe.watch_consumer(self._registry, spec, self.bus.consume(spec, _Handler(self)))
        self._spec = spec

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            observe.retire_consumer(self._registry, self._spec)
            self._consumer = None

    async def wait_idle(self, timeout: float) -> bool:
        return self._consumer is None or await self._consumer.wait_idle(timeout)

    async def execute(self, request: PodEvictionRequested) -> str:
        pod = f"{request.namespace}/{request.name}"
        age = self._clock() - request.at
        if age > self._max_age:
            answer = "expired"
        else:
            try:
                status = await self.evictor.evict(request)
            except sinks.WriteFailedError as e:
                if e.retry:
                    raise TemporaryError(f"evict {pod}: {e}", delay=2.0) from e
                status = -1
                log.warning("evictions: %s from node %s: %s", pod, request.node, e)
            answer = ANSWERS.get(status, "failed")
        self._answers.labels(answer=answer, feature=request.feature).inc()
        self._writes.labels(object=instruments.OBJECT_EVICTION, outcome=answer).inc()
        self._summary.count(instruments.OBJECT_EVICTION, answer)
        log.log(
            logging.WARNING if answer in instruments.FAILED_OUTCOMES | REFUSED else logging.DEBUG,
            "evictions: %s from node %s (%s): %s — %s",
            pod,
            request.node,
            request.feature,
            answer,
            request.reason,
        )
        return answer
