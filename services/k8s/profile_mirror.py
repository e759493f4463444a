"""The profile mirror: the ClusterColocationProfiles of koordbus's REST API written to the cluster as objects, for
`kubectl get clustercolocationprofiles` and whatever else reads them there. Off unless
KOORDBUS_K8S_MIRROR_PROFILES (the chart does not install the CRD; docs/webhook.md).

`ProfileMirror` follows the profile log (KOORD_CCP, last value per subject, the durable reset at start so a restart
re-applies every profile's latest state) and writes each profile's copy (services.k8s.profile_writes: the profile
labelled app.kubernetes.io/managed-by=koordbus, which the webhook does not apply, since it applies the log's):
created when missing, replaced when it differs (a cluster object of that name that is not a copy too: the log's
profile wins), deleted when the log's is, but only when the object is still a copy (one re-created by someone else
meanwhile is left alone). Writes go through services.k8s.latest_writer (the latest intent per profile, retried with
backoff, `healthy()` for /readyz). Where they go is a ProfileSink: the API server (`KubeProfileSink`) or, in
record-only mode, a `RecordingProfileSink`. Built by the composition root (koordbus.bridge).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import Bus, ConsumerSpec, Delivery, Handler
from schemas.colocation_events import (
    MIRROR_LABEL,
    MIRROR_VALUE,
    PROFILE_EVENT_DECODER,
    ColocationProfileSet,
    ProfileEvent,
)
from services.k8s import profile_writes, sinks
from services.k8s.latest_writer import Mirror
from services.k8s.settings import K8sSettings

SERVICE: Final = "k8s-profile-mirror"
CONSUMER: Final = "k8s-profile-mirror"
HTTP_NOT_FOUND: Final = 404
RESOURCE: Final = (profile_writes.GROUP, profile_writes.VERSION, profile_writes.PLURAL)

Json = dict[str, Any]


class ProfileSink(Protocol):
    async def write(self, desired: Json) -> str:
        """Make the object as desired; returns created / updated / unchanged."""
        ...

    async def delete(self, name: str) -> str:
        """Remove the copy; returns deleted / unchanged (not there) / skipped (not a copy)."""
        ...


class KubeProfileSink:
    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._custom = CustomObjectsApi(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write(self, desired: Json) -> str:
        return await sinks.upsert_custom_object(
            self._custom,
            RESOURCE,
            desired,
            update=profile_writes.profile_update,
            attempts=self._attempts,
            timeout=self._timeout,
            what=f"ClusterColocationProfile {desired['metadata']['name']}",
        )

    async def delete(self, name: str) -> str:
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        status, body = await sinks.raw_request(self._custom.get_cluster_custom_object(*RESOURCE, name, **options))
        if status == HTTP_NOT_FOUND:
            return "unchanged"
        current = sinks.parsed(status, body, f"get ClusterColocationProfile {name}")
        if ((current.get("metadata") or {}).get("labels") or {}).get(MIRROR_LABEL) != MIRROR_VALUE:
            return "skipped"
        status, body = await sinks.raw_request(self._custom.delete_cluster_custom_object(*RESOURCE, name, **options))
        if status == HTTP_NOT_FOUND:
            return "unchanged"
        sinks.parsed(status, body, f"delete ClusterColocationProfile {name}")
        return "deleted"


class RecordingProfileSink:
    """Record-only mode: keeps what would be written (services.k8s.profile_writes.ProfileRecorder)."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.recorder = profile_writes.ProfileRecorder(keep=keep)
        self._clock = clock

    async def write(self, desired: Json) -> str:
        return self.recorder.write(desired, now=self._clock())

    async def delete(self, name: str) -> str:
        return self.recorder.delete(name, now=self._clock())

    def export(self) -> Json:
        return self.recorder.export()


class _Handler:
    def __init__(self, mirror: ProfileMirror) -> None:
        self._mirror = mirror

    async def handle(self, delivery: Delivery) -> None:
        self._mirror.offer(PROFILE_EVENT_DECODER.decode(delivery.data))

    async def flush(self) -> None:
        return None


class ProfileMirror(Mirror[ProfileEvent]):
    def __init__(
        self,
        bus: Bus,
        sink: ProfileSink,
        *,
        settings: K8sSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            bus, what="ClusterColocationProfile", metric="koordbus_k8s_profile_writes", settings=settings,
            registry=registry, clock=clock,
        )  # fmt: skip
        self.sink = sink

    def _consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=CONSUMER,
            stream=streams.KOORD_CCP,
            filter_subjects=(subjects.PROFILES_ALL,),
            service=SERVICE,
            deliver_policy="last_per_subject",
        )

    def _handler(self) -> Handler:
        return _Handler(self)

    def offer(self, event: ProfileEvent) -> None:
        self._writer.offer(event.name, event)

    async def _write(self, name: str, event: ProfileEvent) -> str:
        if isinstance(event, ColocationProfileSet):
            return await self.sink.write(profile_writes.desired_profile(event))
        return await self.sink.delete(name)
