"""ClusterColocationProfiles koordbus holds itself: the events of the profile log (stream KOORD_CCP, one subject per
profile, `koord.v1.ccp.<name>`, the last message per subject kept).

`POST/PUT/PATCH /api/v1/colocation-profiles…` append a `ColocationProfileSet` carrying the whole profile as it was
validated (services.webhook.profiles), `DELETE` a `ColocationProfileDeleted` tombstone; each append names the
profile's last stream sequence (optimistic concurrency), which the REST API shows as the profile's
`metadata.resourceVersion`. services.webhook folds them with the cluster's profiles (schemas.cluster
ColocationProfileObserved): for a name the log holds, the log's profile is the one applied. Written by
services.webhook.client; read by services.webhook (service, client) and the events API.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from schemas.cluster import ColocationProfile, ObjectName
from schemas.node import UnixSeconds

Actor = Annotated[str, msgspec.Meta(max_length=512)]

MIRROR_LABEL: Final = "app.kubernetes.io/managed-by"
MIRROR_VALUE: Final = "koordbus"
"""The label the bridge's profile mirror (services.k8s.profile_mirror, off unless KOORDBUS_K8S_MIRROR_PROFILES) sets
on the copies it writes to the cluster: the webhook applies the log's profile, not the copy (services.webhook.state
skips a cluster profile carrying it)."""


class ColocationProfileSet(msgspec.Struct, frozen=True, kw_only=True, tag="ccp.set.v1"):
    """Profile `name` created or replaced: `profile` is the whole object as it applies from now on."""

    name: ObjectName
    profile: ColocationProfile
    actor: Actor
    """Who asked (the API token's name)."""
    time: UnixSeconds
    command_id: str = ""
    """The request's Idempotency-Key or a generated id: a retried request is stored once."""


class ColocationProfileDeleted(msgspec.Struct, frozen=True, kw_only=True, tag="ccp.deleted.v1"):
    """Profile `name` deleted: its tombstone, the last message of its subject."""

    name: ObjectName
    actor: Actor
    time: UnixSeconds
    command_id: str = ""


ProfileEvent = ColocationProfileSet | ColocationProfileDeleted
PROFILE_EVENT_DECODER: msgspec.json.Decoder[ProfileEvent] = msgspec.json.Decoder(ProfileEvent)
