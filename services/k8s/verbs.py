"""The verb responder: cluster verbs a deciding service asks for, carried out with the bridge's credentials.

It answers `koord.v1.rpc.k8s.verb` (core NATS request/reply, schemas.k8s_verbs.Verb → VerbAnswer) for the migration
executor (services.migration.executor), which decides what to read, evict, reserve and write: `KubeVerbs` reads a
pod, evicts it by the policy asked (POSTs a policy/v1 Eviction or DELETEs the pod, with the delete options given, or
merge-patches only the pod's soft-eviction annotation), creates, reads or deletes a Reservation, merge-patches a
PodMigrationJob's status subresource or deletes the job, and the answer carries the API server's status and message
(a successful read its object, as sent). An unreachable API server is status 0. Nothing is decided or retried here:
the asker reads the status and tries again on its next pass. Evictions of every policy are counted in
`koordbus_k8s_writes{object="eviction"}` by answer (evicted, gone, replaced, blocked, failed). Started by the
composition root (koordbus.bridge) when the bridge writes to a cluster, and over recorded verbs
(services.k8s.recording_verbs) when `koordbus up` runs the simulated cluster.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol

import msgspec
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from prometheus_client import CollectorRegistry

from bus import subjects
from bus.api import Bus, Responder
from schemas import k8s_verbs as wire
from services.k8s import core, instruments, sinks
from services.k8s.eviction_executor import ANSWERS

log = logging.getLogger(__name__)

QUEUE: Final = "k8s-verbs"
PMJ: Final = ("scheduling.koordinator.sh", "v1alpha1", "podmigrationjobs")
RESERVATIONS: Final = ("scheduling.koordinator.sh", "v1alpha1", "reservations")
_RAW: Final[dict[str, Any]] = {"_preload_content": False}


class KubeVerbs:
    """Each verb as one API request; returns the answer, never raises for what the API server said."""

    def __init__(self, api_client: ApiClient, *, request_timeout: float = 30.0) -> None:
        self._core = CoreV1Api(api_client)
        self._custom = CustomObjectsApi(api_client)
        self._options: dict[str, Any] = {**_RAW, "_request_timeout": request_timeout}

    async def carry_out(self, verb: wire.Verb) -> wire.VerbAnswer:
        read = isinstance(verb, wire.GetPod | wire.GetReservation)
        try:
            status, body = await sinks.raw_request(self._call(verb))
        except sinks.WriteFailedError as err:
            return wire.VerbAnswer(error=f"the API server was not reached: {err}")
        if not 200 <= status <= 299:
            return wire.VerbAnswer(status=status, error=core.error_status(body))
        if not read:
            return wire.VerbAnswer(status=status)
        try:
            core.json_object(body)
        except ValueError as err:
            return wire.VerbAnswer(error=str(err))
        return wire.VerbAnswer(status=status, object=msgspec.Raw(body))

    def _call(self, verb: wire.Verb) -> Any:
        options = self._options
        match verb:
            case wire.GetPod(namespace=namespace, name=name):
                return self._core.read_namespaced_pod(name, namespace, **options)
            case wire.EvictPod(namespace=namespace, name=name, delete_options=delete_options):
                body: Any = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace},
                }
                if delete_options is not None:
                    body["deleteOptions"] = _json(delete_options)
                return self._core.create_namespaced_pod_eviction(name, namespace, body, **options)
            case wire.DeletePod(namespace=namespace, name=name, delete_options=delete_options):
                if delete_options is None:
                    return self._core.delete_namespaced_pod(name, namespace, **options)
                delete_body: Any = _json(delete_options)  # a dict is sent as is (no V1DeleteOptions round trip)
                return self._core.delete_namespaced_pod(name, namespace, body=delete_body, **options)
            case wire.SoftEvictPod(namespace=namespace, name=name, spec=spec):
                value = msgspec.json.encode(spec).decode()
                patch = {"metadata": {"annotations": {wire.ANNOTATION_SOFT_EVICTION: value}}}
                merge_patch: dict[str, Any] = {**options, "_content_type": "application/merge-patch+json"}
                return self._core.patch_namespaced_pod(name, namespace, patch, **merge_patch)
            case wire.CreateReservation(reservation=reservation):
                return self._custom.create_cluster_custom_object(*RESERVATIONS, reservation, **options)
            case wire.GetReservation(name=name):
                return self._custom.get_cluster_custom_object(*RESERVATIONS, name, **options)
            case wire.DeleteReservation(name=name):
                return self._custom.delete_cluster_custom_object(*RESERVATIONS, name, **options)
            case wire.WriteMigrationJobStatus(name=name, status=status):
                merge: dict[str, Any] = {**options, "_content_type": "application/merge-patch+json"}
                return self._custom.patch_cluster_custom_object_status(*PMJ, name, {"status": status}, **merge)
            case wire.DeleteMigrationJob(name=name):
                return self._custom.delete_cluster_custom_object(*PMJ, name, **options)


class Verbs(Protocol):
    """Carries out one verb: KubeVerbs against an API server, services.k8s.recording_verbs.RecordingVerbs without."""

    async def carry_out(self, verb: wire.Verb) -> wire.VerbAnswer: ...


class VerbResponder:
    def __init__(self, bus: Bus, verbs: Verbs, *, registry: CollectorRegistry, concurrency: int = 16) -> None:
        self.bus = bus
        self.verbs = verbs
        self._concurrency = concurrency
        self._writes = instruments.kube_writes(registry)
        self._responder: Responder | None = None

    async def start(self) -> None:
        self._responder = await self.bus.serve(
            subjects.K8S_RPC_VERB, self.answer, queue=QUEUE, concurrency=self._concurrency
        )

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
            self._responder = None

    async def answer(self, data: bytes) -> bytes:
        try:
            verb = wire.VERB_DECODER.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            log.warning("cluster verbs: not a verb: %s", err)
            return msgspec.json.encode(wire.VerbAnswer(error=f"not a cluster verb: {err}"))
        answer = await self.verbs.carry_out(verb)
        if isinstance(verb, wire.EvictPod | wire.DeletePod | wire.SoftEvictPod):
            outcome = ANSWERS.get(answer.status, "failed")
            self._writes.labels(object=instruments.OBJECT_EVICTION, outcome=outcome).inc()
        log.debug("cluster verbs: %s %s: %s %s", wire.verb_name(verb), _target(verb), answer.status, answer.error)
        return msgspec.json.encode(answer)


def _json(value: msgspec.Struct) -> dict[str, Any]:
    out = msgspec.to_builtins(value)
    assert isinstance(out, dict)
    return out


def _target(verb: wire.Verb) -> str:
    match verb:
        case (
            wire.GetPod(namespace=namespace, name=name)
            | wire.EvictPod(namespace=namespace, name=name)
            | wire.DeletePod(namespace=namespace, name=name)
            | wire.SoftEvictPod(namespace=namespace, name=name)
        ):
            return f"{namespace}/{name}"
        case wire.CreateReservation(reservation=reservation):
            return str((reservation.get("metadata") or {}).get("name", "?"))
        case _:
            return verb.name
