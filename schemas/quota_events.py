"""Quota commands and events of the event-sourced quota trees (issue 4, part 2). Pure data, no I/O.

Events carry the full resulting Kubernetes object (ElasticQuota or ElasticQuotaProfile), the actor, the time and
the id of the command that caused them, so a replay needs nothing else. Each has a versioned tag
("quota.created.v1" …) and `decode_quota_event` decodes the union. Attaching/detaching namespaces is folded into
`QuotaUpdated` (the resulting object carries the namespaces annotation); the command is kept separate
(AttachNamespaces / DetachNamespaces) so the API can offer it. Commands are decided by
services.quota.core.decide.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from schemas.quota import ElasticQuota, ElasticQuotaProfile


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    actor: str
    time: dt.datetime
    command_id: str


class QuotaCreated(_Event, frozen=True, kw_only=True, tag="quota.created.v1"):
    quota: ElasticQuota


class QuotaUpdated(_Event, frozen=True, kw_only=True, tag="quota.updated.v1"):
    quota: ElasticQuota


class QuotaDeleted(_Event, frozen=True, kw_only=True, tag="quota.deleted.v1"):
    quota: ElasticQuota
    """The object as it was when deleted."""


class QuotasImported(_Event, frozen=True, kw_only=True, tag="quota.imported.v1"):
    """Existing ElasticQuota objects adopted as one batch (`koordbus quota import`), validated together; all of one
    tree, parents before children. Each is created, or replaces the quota of that name."""

    quotas: list[ElasticQuota]


class ProfileCreated(_Event, frozen=True, kw_only=True, tag="quota.profile.created.v1"):
    profile: ElasticQuotaProfile


class ProfileUpdated(_Event, frozen=True, kw_only=True, tag="quota.profile.updated.v1"):
    profile: ElasticQuotaProfile


class ProfileDeleted(_Event, frozen=True, kw_only=True, tag="quota.profile.deleted.v1"):
    profile: ElasticQuotaProfile


QuotaEvent = (
    QuotaCreated | QuotaUpdated | QuotaDeleted | QuotasImported | ProfileCreated | ProfileUpdated | ProfileDeleted
)

_DECODER: msgspec.json.Decoder[QuotaEvent] = msgspec.json.Decoder(QuotaEvent)


def decode_quota_event(data: bytes) -> QuotaEvent:
    """One event from its JSON bytes; raises msgspec.DecodeError / ValidationError on a bad one."""
    return _DECODER.decode(data)


def encode_quota_event(event: QuotaEvent) -> bytes:
    return msgspec.json.encode(event)


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One broken rule: the quota, the field, a rule id and a plain-words message (services.quota.validation)."""

    quota: str
    field: str
    rule: str
    message: str


# --- commands (tagged, so a request can carry any of them)


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="command"):
    command_id: str


class CreateQuota(_Command, frozen=True, kw_only=True, tag="create-quota"):
    quota: ElasticQuota


class UpdateQuota(_Command, frozen=True, kw_only=True, tag="update-quota"):
    """Full replace of an existing quota's object."""

    quota: ElasticQuota


class PatchQuota(_Command, frozen=True, kw_only=True, tag="patch-quota"):
    """A JSON merge patch (RFC 7386) on the Kubernetes object of quota `name`."""

    name: str
    patch: dict[str, Any]


class DeleteQuota(_Command, frozen=True, kw_only=True, tag="delete-quota"):
    name: str


class AttachNamespaces(_Command, frozen=True, kw_only=True, tag="attach-namespaces"):
    name: str
    namespaces: tuple[str, ...]


class DetachNamespaces(_Command, frozen=True, kw_only=True, tag="detach-namespaces"):
    name: str
    namespaces: tuple[str, ...]


class ImportQuotas(_Command, frozen=True, kw_only=True, tag="import-quotas"):
    """Adopt a set of ElasticQuota objects at once: validated as a tree (in any order: parents are placed first), all
    or nothing per tree; every violation is reported."""

    quotas: tuple[ElasticQuota, ...]


class CreateProfile(_Command, frozen=True, kw_only=True, tag="create-profile"):
    profile: ElasticQuotaProfile


class UpdateProfile(_Command, frozen=True, kw_only=True, tag="update-profile"):
    profile: ElasticQuotaProfile


class DeleteProfile(_Command, frozen=True, kw_only=True, tag="delete-profile"):
    name: str


QuotaCommand = (
    CreateQuota
    | UpdateQuota
    | PatchQuota
    | DeleteQuota
    | AttachNamespaces
    | DetachNamespaces
    | ImportQuotas
    | CreateProfile
    | UpdateProfile
    | DeleteProfile
)
