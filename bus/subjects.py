"""Subject names, and the reversible encoding that turns a Kubernetes name into one subject token.

Kubernetes names may contain dots, which NATS reads as token separators, so names are
encoded before they become a token: `[a-z0-9-]` pass through, `.` becomes `_` (DNS-1123
names never contain `_`), and any other character becomes `~` plus its UTF-8 bytes in hex
(`~5f` for a literal `_`). decode(encode(x)) == x for every string it takes.

A token is refused (SubjectError) for a name longer than MAX_TOKEN_NAME (Kubernetes' longest object name) or
encoding to more than MAX_TOKEN_CHARS: nats-server drops the connection of a client that sends a control line over
4096 bytes, which would take every service of the process down with it. Names are checked where they enter
(schemas.names); this refusal is the backstop that turns a missed check into an error, not a dead connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from bus import subject_transform
from schemas import names

PREFIX = "koord.v1"
MAX_TOKEN_NAME = names.MAX_OBJECT_NAME
MAX_TOKEN_CHARS = 1024
"""A DNS-1123 name encodes to itself; other characters take 3 to 12. Two tokens of this size (a namespace and a
name) with the prefix and a reply subject stay far below nats-server's 4096-byte control line."""
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_ESCAPE = re.compile(r"~([0-9a-f]{2})")


class SubjectError(ValueError):
    """A subject or token that is not ours or not well-formed."""


def encode_token(name: str) -> str:
    """One subject token for a non-empty string of at most MAX_TOKEN_NAME characters (SubjectError otherwise)."""
    if not name:
        raise SubjectError("empty name cannot be a subject token")
    if len(name) > MAX_TOKEN_NAME:
        raise SubjectError(
            f"a name of {len(name)} characters cannot be a subject token (at most {MAX_TOKEN_NAME}): "
            f"{names.shown(name)} was not checked where it entered"
        )
    out: list[str] = []
    for ch in name:
        if ch in _PLAIN:
            out.append(ch)
        elif ch == ".":
            out.append("_")
        else:
            out.extend(f"~{b:02x}" for b in ch.encode())
    token = "".join(out)
    if len(token) > MAX_TOKEN_CHARS:
        raise SubjectError(
            f"{names.shown(name)} encodes to a subject token of {len(token)} characters (at most {MAX_TOKEN_CHARS})"
        )
    return token


def decode_token(token: str) -> str:
    """The name `encode_token` was given."""
    if not token:
        raise SubjectError("empty subject token")
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "~":
            m = _ESCAPE.match(token, i)
            if not m:
                raise SubjectError(f"bad escape in subject token {token!r}")
            raw.append(int(m.group(1), 16))
            i += 3
            continue
        if ch == "_":
            raw.append(ord("."))
        elif ch in _PLAIN:
            raw.append(ord(ch))
        else:
            raise SubjectError(f"character {ch!r} cannot appear in an encoded token {token!r}")
        i += 1
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise SubjectError(f"subject token {token!r} does not decode to UTF-8") from e


# --- node partitions (streams KOORD_NODE and KOORD_NODEMETRIC)
#
# Both streams store a per-node subject `koord.v1.<family>.<node>.<kind>` as `koord.v1.<family>.<node>.<kind>.<p>`
# (a stream subject transform, `partition_transform`: the node token hashed into NODE_PARTITIONS by nats-server,
# bus.subject_transform), so replicas of a service can each consume a share of the nodes: nodemetric replicas split
# KOORD_NODE, noderesource replicas split KOORD_NODEMETRIC. Publishers use the subjects below as they are; readers go
# through the stored forms (`stored`, `partition_filters`); the `*_ALL` filters of both streams match every partition.

NODE_PARTITIONS = 16
"""Fixed for the life of the streams: changing it re-partitions only new messages."""


def partition_transform(family: str) -> tuple[str, str]:
    """The (source, destination) stream subject transform appending the node's partition to `koord.v1.<family>.*.*`."""
    destination = f"{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{{{{partition({NODE_PARTITIONS},1)}}}}"
    return f"{PREFIX}.{family}.*.*", f"{PREFIX}.{family}.{destination}"


def stored(subject: str) -> str:
    """The filter that matches `subject` (a per-node subject as published) as its partitioned stream stores it."""
    return f"{subject}.*"


def partition_filters(every: str, partitions: Iterable[int]) -> tuple[str, ...]:
    """Filters for the messages of every node in `partitions`, from a `*_ALL` filter of a partitioned stream (it
    ends in the partition wildcard `.*`, e.g. NODE_METRICS_ALL or NODEMETRIC_COMPUTED_ALL)."""
    if not every.endswith(".*"):
        raise SubjectError(f"not a filter on a partitioned stream: {every!r}")
    return tuple(f"{every[:-1]}{p}" for p in sorted(partitions))


def node_partition(node: str) -> int:
    """The partition both partitioned streams store `node`'s messages under (what nats-server's transform computes)."""
    return subject_transform.partition_of(encode_token(node), NODE_PARTITIONS)


# --- node agent → control plane (stream KOORD_NODE, partitioned)

NODE_ALL = f"{PREFIX}.node.>"
NODE_TRANSFORM = partition_transform("node")
NODE_METRICS_ALL = f"{PREFIX}.node.*.metrics.*"
NODE_STATE_ALL = f"{PREFIX}.node.*.state.*"


def node_metrics(node: str) -> str:
    return f"{PREFIX}.node.{encode_token(node)}.metrics"


def node_state(node: str) -> str:
    return f"{PREFIX}.node.{encode_token(node)}.state"


def node_actuation(node: str) -> str:
    """ActuationApplied: what the node's agent changed (or, in dry-run, would change) and why."""
    return f"{PREFIX}.node.{encode_token(node)}.actuation"


def node_eviction(node: str) -> str:
    """PodEvictionRequested: a pod the node's agent wants evicted; the bridge calls the Eviction API."""
    return f"{PREFIX}.node.{encode_token(node)}.eviction"


def node_topology(node: str) -> str:
    """NodeTopologyReported: the node's NUMA zones, CPUs and kubelet CPU manager, for its NodeResourceTopology."""
    return f"{PREFIX}.node.{encode_token(node)}.topology"


NODE_ACTUATION_ALL = f"{PREFIX}.node.*.actuation.*"
NODE_TOPOLOGY_ALL = f"{PREFIX}.node.*.topology.*"
NODE_EVICTION_ALL = f"{PREFIX}.node.*.eviction.*"


def node_prefix(node: str) -> str:
    """Everything one node's agent may publish: `koord.v1.node.<node>.>`."""
    return f"{PREFIX}.node.{encode_token(node)}.>"


# --- nodemetric service (stream KOORD_NODEMETRIC, partitioned)

NODEMETRIC_ALL = f"{PREFIX}.nodemetric.>"
NODEMETRIC_TRANSFORM = partition_transform("nodemetric")
NODEMETRIC_COMPUTED_ALL = f"{PREFIX}.nodemetric.*.computed.*"


def nodemetric_computed(node: str) -> str:
    return f"{PREFIX}.nodemetric.{encode_token(node)}.computed"


# --- the prod predictor's models per node (stream KOORD_PREDICTION, partitioned, the last snapshot per node)

PREDICTION_ALL = f"{PREFIX}.prediction.>"
PREDICTION_TRANSFORM = partition_transform("prediction")
PREDICTION_MODELS_ALL = f"{PREFIX}.prediction.*.models.*"


def nodemetric_rpc_prediction(partition: int | str) -> str:
    """Where the nodemetric replica owning a partition answers for its nodes' predictors (`*`: every partition)."""
    return f"{PREFIX}.rpc.nodemetric.prediction.{partition}"


def prediction_models(node: str) -> str:
    """Node `node`'s model snapshot (schemas.prediction.ModelsSnapshot), written by the replica that owns it."""
    return f"{PREFIX}.prediction.{encode_token(node)}.models"


# --- cluster state seen by services.k8s (stream KOORD_CLUSTER, one message per subject)

CLUSTER_ALL = f"{PREFIX}.k8s.>"
CLUSTER_NODES = f"{PREFIX}.k8s.node.*"
CLUSTER_PODS = f"{PREFIX}.k8s.pod.*.*"
CLUSTER_CONFIGMAPS = f"{PREFIX}.k8s.configmap.*.*"
CLUSTER_TOPOLOGIES = f"{PREFIX}.k8s.nrt.*"
CLUSTER_WORKLOADS = f"{PREFIX}.k8s.workload.*.*"
CLUSTER_PROFILES = f"{PREFIX}.k8s.ccp.*"
CLUSTER_NAMESPACES = f"{PREFIX}.k8s.namespace.*"
CLUSTER_PRIORITY_CLASSES = f"{PREFIX}.k8s.priorityclass.*"


def cluster_node(name: str) -> str:
    return f"{PREFIX}.k8s.node.{encode_token(name)}"


def cluster_pod(namespace: str, name: str) -> str:
    return f"{PREFIX}.k8s.pod.{encode_token(namespace)}.{encode_token(name)}"


def cluster_configmap(namespace: str, name: str) -> str:
    return f"{PREFIX}.k8s.configmap.{encode_token(namespace)}.{encode_token(name)}"


def cluster_workload(namespace: str, name: str) -> str:
    """A pod controller (ReplicaSet, StatefulSet, Job …) with its expected replicas."""
    return f"{PREFIX}.k8s.workload.{encode_token(namespace)}.{encode_token(name)}"


def cluster_topology(name: str) -> str:
    """The NodeResourceTopology of node `name`."""
    return f"{PREFIX}.k8s.nrt.{encode_token(name)}"


def cluster_profile(name: str) -> str:
    """The ClusterColocationProfile `name` (cluster-scoped)."""
    return f"{PREFIX}.k8s.ccp.{encode_token(name)}"


def cluster_namespace(name: str) -> str:
    """The Namespace `name` (its labels)."""
    return f"{PREFIX}.k8s.namespace.{encode_token(name)}"


def cluster_priority_class(name: str) -> str:
    """The PriorityClass `name`."""
    return f"{PREFIX}.k8s.priorityclass.{encode_token(name)}"


# --- ClusterColocationProfiles koordbus holds (stream KOORD_CCP, one message per subject; schemas.colocation_events)

PROFILES_ALL = f"{PREFIX}.ccp.*"


def colocation_profile(name: str) -> str:
    """The ClusterColocationProfile `name` as the REST API keeps it (the cluster's own: `cluster_profile`)."""
    return f"{PREFIX}.ccp.{encode_token(name)}"


# --- noderesource service (stream KOORD_NODERESOURCE)

NODERESOURCE_ALL = f"{PREFIX}.noderesource.>"
NODERESOURCE_COMPUTED_ALL = f"{PREFIX}.noderesource.*.computed"


def noderesource_computed(node: str) -> str:
    return f"{PREFIX}.noderesource.{encode_token(node)}.computed"


NODERESOURCE_CONFIG_STATUS = f"{PREFIX}.noderesource.config.status"
"""ColocationConfigStatus, a last-value subject (consumers read it with last_per_subject); its last token is not
`computed`, so NODERESOURCE_COMPUTED_ALL never matches it, whatever a node is called."""


# --- quota service: the event log (stream KOORD_QUOTA), computed status (KOORD_QUOTA_STATUS), requests (no stream)

QUOTA_EVENTS_ALL = f"{PREFIX}.quota.events.*"
QUOTA_STATUS_ALL = f"{PREFIX}.quota.status.*"
QUOTA_TREES_ALL = f"{PREFIX}.quota.trees.*"
QUOTA_RPC_COMMAND = f"{PREFIX}.rpc.quota.command"
QUOTA_RPC_CHECK = f"{PREFIX}.rpc.quota.check"
QUOTA_RPC_WHAT_IF = f"{PREFIX}.rpc.quota.what-if"

# --- the Kubernetes bridge's requests (no stream)

K8S_RPC_BIND = f"{PREFIX}.rpc.k8s.bind"
"""Bind a pod to a node (schemas.extender.PodBindRequest → PodBindReply): the load-aware extender's bind verb."""
K8S_RPC_VERB = f"{PREFIX}.rpc.k8s.verb"
"""A cluster verb (schemas.k8s_verbs.Verb → VerbAnswer): the migration executor's reads, evictions, Reservations and
PodMigrationJob status writes, carried out by services.k8s.verbs."""

# --- the load-aware extender's requests (no stream)

LOADAWARE_RPC_STATE = f"{PREFIX}.rpc.loadaware.state"
"""One node's extender state (schemas.extender.NodeStateRequest → NodeStateReply), for the API's state export."""


def quota_events(tree: str) -> str:
    """The event log of one quota tree: commands on a tree append here with optimistic concurrency."""
    return f"{PREFIX}.quota.events.{encode_token(tree)}"


def tree_of_quota_events(subject: str) -> str:
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:4]) != f"{PREFIX}.quota.events":
        raise SubjectError(f"not a quota event subject: {subject!r}")
    return decode_token(parts[4])


def quota_status(name: str) -> str:
    """One quota's latest computed status (a last-value subject; quota names are unique across trees)."""
    return f"{PREFIX}.quota.status.{encode_token(name)}"


def quota_tree_status(tree: str) -> str:
    """One tree's latest summary: total, problems (a last-value subject)."""
    return f"{PREFIX}.quota.trees.{encode_token(tree)}"


# --- pod migration (stream KOORD_MIGRATION)

MIGRATION_ALL = f"{PREFIX}.migration.>"
MIGRATION_REQUESTS = f"{PREFIX}.migration.requests"
"""MigrationRequested from every intake (cluster PodMigrationJobs, the API, the descheduling loop)."""
MIGRATION_ARBITER = f"{PREFIX}.migration.arbiter"
"""MigrationRound: the arbiter's single-writer subject (appended with the expected last sequence)."""
MIGRATION_ABORTS = f"{PREFIX}.migration.aborts"
MIGRATION_EXECUTION = f"{PREFIX}.migration.execution"
"""MigrationPhaseChanged from the executor (services.migration.executor; the bridge carries out its cluster verbs)."""
MIGRATION_RPC_PLAN = f"{PREFIX}.rpc.migration.plan"
"""A DeschedulerRound the migration service computes for its current state without acting on it (a dry run)."""

# --- the descheduler's rounds (stream KOORD_DESCHEDULER)

DESCHEDULER_ROUNDS = f"{PREFIX}.descheduler.rounds"
"""DeschedulerRound after every LowNodeLoad round of the migration service (schemas.descheduler)."""


# --- rendered NodeSLO specs: a JetStream key-value bucket (stream KV_KOORD_SLO), one key per node

SLO_BUCKET = "KOORD_SLO"
SLO_ALL = f"$KV.{SLO_BUCKET}.>"
SLO_CONFIG_STATUS = f"$KV.{SLO_BUCKET}._config"
"""The slo-controller-config's errors (SloConfigStatus). Encoded node names never start with `_`."""


SLO_WATERMARKS_ALL = f"$KV.{SLO_BUCKET}._watermarks-*"


def slo_watermarks(service: str) -> str:
    """The key where `service` (loadaware, descheduler) states the load watermarks it uses (WatermarksInEffect)."""
    return f"$KV.{SLO_BUCKET}._watermarks-{service}"


def slo_key(node: str) -> str:
    """The subject of node `node`'s key: its NodeSLO spec, or a delete marker when the node is gone."""
    return f"$KV.{SLO_BUCKET}.{encode_token(node)}"


def node_of_slo_key(subject: str) -> str | None:
    """The node a key subject names; None for the bucket's own keys (`_config`, `_watermarks-*`)."""
    prefix = f"$KV.{SLO_BUCKET}."
    if not subject.startswith(prefix) or "." in subject[len(prefix) :]:
        raise SubjectError(f"not a {SLO_BUCKET} key subject: {subject!r}")
    token = subject[len(prefix) :]
    return None if token.startswith("_") else decode_token(token)


# --- dead letters (stream KOORD_DLQ)

DLQ_ALL = f"{PREFIX}.dlq.>"


def dlq(service: str) -> str:
    return f"{PREFIX}.dlq.{encode_token(service)}"


def node_of(subject: str) -> str:
    """The node name in a `koord.v1.node.<n>.…` or `koord.v1.nodemetric.<n>.…` subject, as published or as stored
    (with the partition token)."""
    parts = subject.split(".")
    if len(parts) < 4 or parts[0] + "." + parts[1] != PREFIX or parts[2] not in ("node", "nodemetric"):
        raise SubjectError(f"not a per-node subject: {subject!r}")
    return decode_token(parts[3])


# --- service replicas' heartbeats (stream KOORD_MEMBERS, services.common.membership)

MEMBERS_ALL = f"{PREFIX}.members.>"


def member(service: str, instance: str) -> str:
    return f"{PREFIX}.members.{encode_token(service)}.{encode_token(instance)}"


def members_of(service: str) -> str:
    return f"{PREFIX}.members.{encode_token(service)}.*"


def member_instance(subject: str) -> str:
    """The instance a heartbeat subject names."""
    return decode_token(subject.rsplit(".", 1)[1])


# --- what nats-server accepts

MAX_SUBJECT_BYTES = 3840
"""The longest subject we publish on: nats-server drops a connection whose protocol line is longer than its
max_control_line (4096 bytes by default), and a JetStream publish's line also carries a reply subject and two sizes
(the rest of the 4096). nats-py then closes the client for good, so one long subject would take the bus away from
every service of the process."""


def check_publishable(subject: str) -> str:
    """`subject`, or SubjectError when it is too long to publish (MAX_SUBJECT_BYTES)."""
    size = len(subject.encode())
    if size > MAX_SUBJECT_BYTES:
        raise SubjectError(f"a subject of {size} bytes is longer than the {MAX_SUBJECT_BYTES} nats-server accepts")
    return subject
