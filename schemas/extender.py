"""kube-scheduler's extender API (k8s.io/kube-scheduler/extender/v1), as its JSON travels.

The Go types carry no json tags, so the wire names are the Go field names (`Pod`, `NodeNames`, `FailedNodes`,
`Host`, `Score`, `PodUID` …). kube-scheduler sends ExtenderArgs to the filter and prioritize verbs (`Nodes` when the
extender is not nodeCacheCapable, else `NodeNames`) and ExtenderBindingArgs to the bind verb. Candidate nodes are
kept as raw JSON so a filter result hands back exactly the Node objects it was given. Read and written by
services.loadaware's HTTP routes and `koordbus scheduler explain`.

`PodBindRequest` / `PodBindReply` carry the bind verb from the extender to the Kubernetes bridge, which alone holds
cluster credentials (core NATS request/reply on `koord.v1.rpc.k8s.bind`, answered by services.k8s.binder).
`NodeStateRequest` / `NodeStateReply` ask the extender for one node's state document (`koord.v1.rpc.loadaware.state`,
answered by services.loadaware.service for the API's `GET /api/v1/scheduler/nodes/{node}/state`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import kube
from schemas.node import NodeName


class NodeList(msgspec.Struct, kw_only=True):
    items: list[msgspec.Raw] = []


class ExtenderArgs(msgspec.Struct, kw_only=True, rename="pascal"):
    pod: kube.Pod
    nodes: NodeList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(msgspec.Struct, kw_only=True, rename="pascal"):
    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = {}
    failed_and_unresolvable_nodes: dict[str, str] = {}
    error: str = ""


class HostPriority(msgspec.Struct, kw_only=True, rename="pascal"):
    host: str
    score: int


class ExtenderBindingArgs(
    msgspec.Struct,
    kw_only=True,
    rename={"pod_uid": "PodUID", "pod_name": "PodName", "pod_namespace": "PodNamespace", "node": "Node"},
):
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


class ExtenderBindingResult(msgspec.Struct, kw_only=True, rename="pascal"):
    error: str = ""


class PodBindRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Bind the pod `namespace/name` to `node`; `uid` is a precondition (a pod recreated under the name is not
    bound)."""

    namespace: str
    name: str
    uid: str
    node: str


class PodBindReply(msgspec.Struct, frozen=True, kw_only=True):
    """The API server's answer: `status` its HTTP code (0 when it could not be reached), `error` its message, empty
    when the pod was bound."""

    status: int = 0
    error: str = ""


class NodeStateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Ask the extender for one node's state as `koordbus calc loadaware` reads it (services.loadaware.snapshot)."""

    node: NodeName


class NodeStateReply(msgspec.Struct, frozen=True, kw_only=True):
    """`state` the node's document, absent when the extender does not know the node; `error` why the request could
    not be answered."""

    state: dict[str, Any] | None = None
    error: str = ""


class _NodeName(msgspec.Struct):
    metadata: kube.ObjectMeta


def node_name(raw: msgspec.Raw) -> str:
    """The name of a Node object kept raw."""
    return _NODE_NAME.decode(raw).metadata.name


_NODE_NAME = msgspec.json.Decoder(_NodeName)
EXTENDER_ARGS = msgspec.json.Decoder(ExtenderArgs)
BINDING_ARGS = msgspec.json.Decoder(ExtenderBindingArgs)
NODE = msgspec.json.Decoder(kube.Node)
HOST_PRIORITY_LIST = msgspec.json.Decoder(list[HostPriority])
FILTER_RESULT = msgspec.json.Decoder(ExtenderFilterResult)
BIND_REQUEST = msgspec.json.Decoder(PodBindRequest)
BIND_REPLY = msgspec.json.Decoder(PodBindReply)
NODE_STATE_REQUEST = msgspec.json.Decoder(NodeStateRequest)
NODE_STATE_REPLY = msgspec.json.Decoder(NodeStateReply)
