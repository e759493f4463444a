"""The quota mirror: koordbus's quota trees written to the cluster as ElasticQuota objects, for koord-scheduler.

`QuotaMirror` follows every quota's latest status (KOORD_QUOTA_STATUS, last value per subject, the durable reset at
start so a restart re-applies the latest state of every quota) and writes each quota's ElasticQuota: created when
missing, replaced when its spec, koordbus's labels and annotations, the write-back annotations or status.used differ
(services.k8s.quota_writes decides; nothing is written when the object already holds the values), deleted when
the quota is. It never writes from the consumer: services.k8s.latest_writer writes the latest status per quota, at
most once per quota every `quota_write_interval_seconds` and `quota_write_delay_seconds` after a change arrived
(a change made with kubectl is in the log a moment before kube-apiserver stores it: docs/webhook.md), retrying
failures with backoff; after
`unhealthy_after_write_failures` consecutive failures `healthy()` is False (/readyz).
Where the writes go is a QuotaSink: the API server (`KubeQuotaSink`, a PUT guarded by the object's resourceVersion,
re-read and retried on 409) or, in record-only mode, a `RecordingQuotaSink`. Built by the composition root.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import Bus, ConsumerSpec, Delivery, Handler
from schemas.quota_service import QUOTA_STATUS_DECODER, QuotaStatusComputed
from services.k8s import quota_writes, sinks
from services.k8s.latest_writer import Mirror
from services.k8s.settings import K8sSettings

log = logging.getLogger(__name__)

SERVICE: Final = "k8s-quota-mirror"
CONSUMER: Final = "k8s-quota-mirror"
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409

Json = dict[str, Any]


class QuotaSink(Protocol):
    async def write(self, desired: Json) -> str:
        """Make the object as desired; returns created / updated / unchanged."""
        ...

    async def delete(self, namespace: str, name: str) -> str:
        """Remove it; returns deleted / unchanged (it was not there)."""
        ...


class KubeQuotaSink:
    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._custom = CustomObjectsApi(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write(self, desired: Json) -> str:
        meta = desired["metadata"]

        def update(current: Json, wanted: Json) -> Json | None:
            change = quota_writes.quota_update(current, wanted)
            return change[0] if change is not None else None

        return await sinks.upsert_custom_object(
            self._custom,
            (quota_writes.GROUP, quota_writes.VERSION, quota_writes.PLURAL),
            desired,
            update=update,
            attempts=self._attempts,
            timeout=self._timeout,
            what=f"ElasticQuota {meta['namespace']}/{meta['name']}",
        )

    async def delete(self, namespace: str, name: str) -> str:
        where = (quota_writes.GROUP, quota_writes.VERSION, namespace, quota_writes.PLURAL)
        status, body = await self._request(self._custom.delete_namespaced_custom_object(*where, name, **self._opts()))
        if status == HTTP_NOT_FOUND:
            return "unchanged"
        sinks.parsed(status, body, f"delete ElasticQuota {namespace}/{name}")
        return "deleted"

    def _opts(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout}

    @staticmethod
    async def _request(call: Awaitable[object]) -> tuple[int, bytes]:
        return await sinks.raw_request(call)


class RecordingQuotaSink:
    """Record-only mode: keeps what would be written (services.k8s.quota_writes.QuotaRecorder)."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.recorder = quota_writes.QuotaRecorder(keep=keep)
        self._clock = clock

    async def write(self, desired: Json) -> str:
        return self.recorder.write(desired, now=self._clock())

    async def delete(self, namespace: str, name: str) -> str:
        return self.recorder.delete(namespace, name, now=self._clock())

    def export(self) -> Json:
        return self.recorder.export()


class _Handler:
    def __init__(self, mirror: QuotaMirror) -> None:
        self._mirror = mirror

    async def handle(self, delivery: Delivery) -> None:
        status = QUOTA_STATUS_DECODER.decode(delivery.data)
        if isinstance(status, QuotaStatusComputed):
            self._mirror.offer(status)

    async def flush(self) -> None:
        return None


class QuotaMirror(Mirror[QuotaStatusComputed]):
    def __init__(
        self,
        bus: Bus,
        sink: QuotaSink,
        *,
        settings: K8sSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            bus, what="ElasticQuota", metric="koordbus_k8s_quota_writes", settings=settings, registry=registry,
            delay=settings.quota_write_delay_seconds, clock=clock,
        )  # fmt: skip
        self.sink = sink
        self.settings = settings

    def _consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=CONSUMER,
            stream=streams.KOORD_QUOTA_STATUS,
            filter_subjects=(subjects.QUOTA_STATUS_ALL,),
            service=SERVICE,
            deliver_policy="last_per_subject",
        )

    def _handler(self) -> Handler:
        return _Handler(self)

    def offer(self, status: QuotaStatusComputed) -> None:
        self._writer.offer(status.quota, status)

    async def _write(self, name: str, status: QuotaStatusComputed) -> str:
        desired = quota_writes.desired_quota(status)
        if desired is not None:
            return await self.sink.write(desired)
        if status.object is not None:
            return await self.sink.delete(status.object.metadata.namespace, name)
        return "skipped"  # a tombstone whose namespace nobody knows any more
