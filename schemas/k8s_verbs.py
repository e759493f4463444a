"""Cluster verbs a service asks the Kubernetes bridge to carry out, and the bridge's answer (core NATS request/reply
on `koord.v1.rpc.k8s.verb`).

The service that decides (services.migration.executor: what to read, evict, reserve or write back) sends one `Verb`
— read a pod; evict it by one of Koordinator's eviction policies (the Eviction API, a DELETE, or the soft-eviction
annotation that leaves the deleting to whoever watches for it), each with its `DeleteOptions`; create, read or
delete a Reservation; write a PodMigrationJob's status through its status subresource; delete a PodMigrationJob —
and the bridge (services.k8s.verbs), which alone
holds cluster credentials, carries it out and answers a `VerbAnswer`: the API server's HTTP status (0: it was not
reached), its message when the status is not 2xx, and for a successful read the object as the API server sent it.
What a status means for the job (a 404 on a read is "gone", a 429 on an eviction "try again later") is the asker's
to decide. Versioned tags; `VERB_DECODER` decodes the union, `ANSWER_DECODER` the answer.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Final, Literal

import msgspec

ANNOTATION_SOFT_EVICTION: Final = "scheduling.koordinator.sh/soft-eviction"
"""On a pod: Koordinator's soft eviction, a JSON `SoftEvictionSpec` (Koordinator's apis/extension)."""


class Preconditions(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel", forbid_unknown_fields=True
):
    uid: str | None = None
    resource_version: str | None = None


class DeleteOptions(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel", forbid_unknown_fields=True
):
    """The metav1.DeleteOptions an eviction is sent with (a PodMigrationJob's spec.deleteOptions, or the args'
    defaultDeleteOptions). Decoded strictly wherever it enters (args file, job, verb): an unknown field — among
    them ignoreStoreReadErrorWithClusterBreakingPotential, an unsafe deletion koordbus never asks for — a negative
    grace period, an unknown propagation policy or dryRun value is refused."""

    api_version: Literal["v1", "meta.k8s.io/v1"] | None = None
    kind: Literal["DeleteOptions"] | None = None
    grace_period_seconds: Annotated[int, msgspec.Meta(ge=0)] | None = None
    preconditions: Preconditions | None = None
    orphan_dependents: bool | None = None
    propagation_policy: Literal["Orphan", "Background", "Foreground"] | None = None
    dry_run: list[Literal["All"]] | None = None

    def __post_init__(self) -> None:
        if self.orphan_dependents is not None and self.propagation_policy is not None:
            raise ValueError("orphanDependents and propagationPolicy may not both be set")


class SoftEvictionSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """The value of the soft-eviction annotation (Koordinator's extension.SoftEvictionSpec): when the eviction was
    asked for, with which delete options, by what (the descheduling plugin that asked) and why."""

    timestamp: dt.datetime | None = None
    delete_options: DeleteOptions | None = None
    initiator: str = ""
    reason: str = ""


class GetPod(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.pod.get.v1"):
    namespace: str
    name: str


class EvictPod(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.pod.evict.v1"):
    """A policy/v1 Eviction of the pod (PodDisruptionBudgets hold: the API server answers 429 while one does):
    the evictionPolicy `Eviction`."""

    namespace: str
    name: str
    delete_options: DeleteOptions | None = None


class DeletePod(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.pod.delete.v1"):
    """A DELETE of the pod with `delete_options` (no disruption budget is asked): the evictionPolicy `Delete`."""

    namespace: str
    name: str
    delete_options: DeleteOptions | None = None


class SoftEvictPod(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.pod.softevict.v1"):
    """A merge patch setting the pod's soft-eviction annotation to `spec` (and nothing else): the evictionPolicy
    `SoftEviction`; whatever watches for the annotation evicts the pod."""

    namespace: str
    name: str
    spec: SoftEvictionSpec


class CreateReservation(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.reservation.create.v1"):
    reservation: dict[str, Any]
    """The whole scheduling.koordinator.sh/v1alpha1 Reservation to create (cluster-scoped)."""


class GetReservation(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.reservation.get.v1"):
    name: str


class DeleteReservation(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.reservation.delete.v1"):
    name: str


class WriteMigrationJobStatus(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.podmigrationjob.status.v1"):
    """A JSON merge patch `{"status": status}` of the PodMigrationJob's status subresource."""

    name: str
    status: dict[str, Any]


class DeleteMigrationJob(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.podmigrationjob.delete.v1"):
    name: str


Verb = (
    GetPod
    | EvictPod
    | DeletePod
    | SoftEvictPod
    | CreateReservation
    | GetReservation
    | DeleteReservation
    | WriteMigrationJobStatus
    | DeleteMigrationJob
)


class VerbAnswer(msgspec.Struct, frozen=True, kw_only=True):
    status: int = 0
    """The API server's HTTP status; 0 when it was not reached (or the request was not a verb)."""
    error: str = ""
    """Why, when `status` is not 2xx: the API server's message, or what kept the request from it."""
    object: msgspec.Raw = msgspec.Raw(b"null")
    """A successful read's object (one JSON object, as the API server sent it); null otherwise."""


def verb_name(verb: Verb) -> str:
    """The verb's tag without its version (`k8s.pod.evict`), for metric labels and log lines."""
    tag = type(verb).__struct_config__.tag
    return str(tag).rsplit(".", 1)[0]


VERB_DECODER: Final = msgspec.json.Decoder(Verb)
ANSWER_DECODER: Final = msgspec.json.Decoder(VerbAnswer)
