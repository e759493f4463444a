"""The extender verbs over LoadState: request bytes in, response bytes out. Pure: `now` is a parameter.

`Extender.filter` and `.prioritize` decode kube-scheduler's ExtenderArgs, run services.loadaware.core on every
candidate node and encode ExtenderFilterResult / HostPriorityList; a malformed request raises `BadRequest` (the
HTTP shell answers 400 with its message). When kube-scheduler sends whole Node objects (nodeCacheCapable false),
their allocatable is used; with NodeNames the one the bridge reported is. Nodes the state knows nothing about
pass with score 0 and are returned by `unknown` so the shell can log them. `assume` and `bind` record a placement
reported in ExtenderBindingArgs, resolving the pod from the ones recent filter/prioritize calls carried, and refuse a
node the state does not know (`{"Error": "node X is unknown"}`); `undo` takes back a placement whose binding failed.
Each verb first forgets the assumed placements no watch event confirmed in time (LoadState.expire_assumed).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from schemas import extender as wire
from schemas import kube
from services.loadaware import core, estimator, fast, state

RECENT_PODS = 10_000
"""Pods remembered from filter/prioritize requests, for `assume` and `bind` (ExtenderBindingArgs names the pod
only): at most this many,"""
RECENT_POD_SECONDS = 600.0
"""and for at most this long since their last filter/prioritize: kube-scheduler binds a pod in the cycle that
filtered it (seconds), and filters it again before another try. Without an age bound, `koordbus up`'s simulated
cluster kept the last 10,000 pods it ever placed (tens of MB, growing for hours in the soak)."""


class BadRequest(ValueError):
    """A request kube-scheduler's extender API does not allow; the message says what is wrong."""


DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What decoding a hostile body can raise: invalid UTF-8 and absurd nesting included (each a 400)."""


@dataclass(frozen=True, slots=True)
class Candidates:
    pod: kube.Pod
    names: list[str]
    raw_nodes: list[msgspec.Raw] | None
    allocatable: dict[str, dict[str, int]]


def decode_args(body: bytes) -> Candidates:
    try:
        args = wire.EXTENDER_ARGS.decode(body)
    except DECODE_ERRORS as err:
        raise BadRequest(f"not ExtenderArgs: {err}") from None
    if args.nodes is None and args.node_names is None:
        raise BadRequest("ExtenderArgs names no candidate nodes (neither Nodes nor NodeNames)")
    if args.nodes is None:
        return Candidates(pod=args.pod, names=list(args.node_names or ()), raw_nodes=None, allocatable={})
    names: list[str] = []
    allocatable: dict[str, dict[str, int]] = {}
    for i, raw in enumerate(args.nodes.items):
        try:
            node = wire.NODE.decode(raw)
        except DECODE_ERRORS as err:
            raise BadRequest(f"Nodes.items[{i}]: {err}") from None
        if not node.metadata.name:
            raise BadRequest(f"Nodes.items[{i}]: a node without metadata.name")
        names.append(node.metadata.name)
        allocatable[node.metadata.name] = estimator.estimate_node(node)
    return Candidates(pod=args.pod, names=names, raw_nodes=list(args.nodes.items), allocatable=allocatable)


def decode_binding(body: bytes) -> wire.ExtenderBindingArgs:
    try:
        return wire.BINDING_ARGS.decode(body)
    except DECODE_ERRORS as err:
        raise BadRequest(f"not ExtenderBindingArgs: {err}") from None


@dataclass(frozen=True, slots=True)
class Placement:
    """What `Extender.place` did with an ExtenderBindingArgs."""

    binding: wire.ExtenderBindingArgs
    key: str
    """namespace/name, the pod's key in the state."""
    known: bool
    """A filter/prioritize request carried the pod, so its requests (and estimate) are known."""
    assumed: state.AssignedPod | None = None
    """The entry recorded on the node; None when the pod is unknown or the watch already shows it assigned."""
    refused: str = ""
    """Why the placement may not happen at all (the node is unknown); empty: it may."""


@dataclass(slots=True)
class Extender:
    state: state.LoadState
    recent: OrderedDict[str, tuple[kube.Pod, float]] = field(default_factory=OrderedDict)
    """Pod uid → the pod and when a request last carried it, oldest first."""
    matrix: fast.Matrix = field(init=False)

    def __post_init__(self) -> None:
        self.matrix = fast.Matrix(self.state)

    def _incoming(self, pod: kube.Pod, *, now: float) -> core.IncomingPod:
        if pod.metadata.uid:
            self.recent[pod.metadata.uid] = (pod, now)
            self.recent.move_to_end(pod.metadata.uid)
        self._forget_old(now)
        return core.incoming(pod, self.state.args)

    def _forget_old(self, now: float) -> None:
        while len(self.recent) > RECENT_PODS:
            self.recent.popitem(last=False)
        while self.recent and now - next(iter(self.recent.values()))[1] > RECENT_POD_SECONDS:
            self.recent.popitem(last=False)

    def unknown(self, names: list[str]) -> list[str]:
        return [name for name in names if name not in self.state.nodes]

    def filter(self, body: bytes, *, now: float) -> tuple[bytes, Candidates]:
        request = decode_args(body)
        self.state.expire_assumed(now)
        pod = self._incoming(request.pod, now=now)
        if request.raw_nodes is None:  # nodeCacheCapable: every figure comes from the state, vectorized
            passed, failed = self.matrix.filter(pod, request.names, now=now)
            return msgspec.json.encode(wire.ExtenderFilterResult(node_names=passed, failed_nodes=failed)), request
        passed = []
        failed = {}
        for name in request.names:
            verdict = core.filter_node(self.state, pod, name, now=now, allocatable=request.allocatable.get(name))
            if verdict.passed:
                passed.append(name)
            else:
                failed[name] = verdict.reason
        keep = set(passed)
        items = [raw for raw, name in zip(request.raw_nodes, request.names, strict=True) if name in keep]
        result = wire.ExtenderFilterResult(nodes=wire.NodeList(items=items), failed_nodes=failed)
        return msgspec.json.encode(result), request

    def prioritize(self, body: bytes, *, now: float) -> tuple[bytes, Candidates]:
        request = decode_args(body)
        self.state.expire_assumed(now)
        pod = self._incoming(request.pod, now=now)
        if request.raw_nodes is None:
            ranked = self.matrix.scores(pod, request.names, now=now)
            priorities = [
                wire.HostPriority(host=name, score=core.extender_score(score))
                for name, score in zip(request.names, ranked, strict=True)
            ]
            return msgspec.json.encode(priorities), request
        scores = [
            wire.HostPriority(
                host=name,
                score=core.extender_score(
                    core.score_node(self.state, pod, name, now=now, allocatable=request.allocatable.get(name)).score
                ),
            )
            for name in request.names
        ]
        return msgspec.json.encode(scores), request

    def assume(self, body: bytes, *, now: float) -> bytes:
        """Record the placement of a pod a filter/prioritize request carried; the pod watch later confirms it."""
        placement = self.place(decode_binding(body), now=now)
        if placement.refused:
            return msgspec.json.encode(wire.ExtenderBindingResult(error=placement.refused))
        if not placement.known:
            binding = placement.binding
            error = f"pod {binding.pod_namespace}/{binding.pod_name} ({binding.pod_uid}) was not seen by filter"
            return msgspec.json.encode(wire.ExtenderBindingResult(error=error))
        return msgspec.json.encode(wire.ExtenderBindingResult())

    def bind(self, body: bytes, *, now: float) -> Placement:
        """The bind verb's first half: record the placement at once (filter and prioritize count it from now on);
        the shell then asks the bridge to bind (unless `refused`) and calls `undo` when that failed."""
        return self.place(decode_binding(body), now=now, bound=True)

    def place(self, binding: wire.ExtenderBindingArgs, *, now: float, bound: bool = False) -> Placement:
        key = f"{binding.pod_namespace}/{binding.pod_name}"  # the key the pod watch uses
        self.state.expire_assumed(now)
        if not self.state.knows_node(binding.node):
            return Placement(binding=binding, key=key, known=False, refused=f"node {binding.node} is unknown")
        self._forget_old(now)
        pod = self.recent[binding.pod_uid][0] if binding.pod_uid in self.recent else None
        if pod is None:
            return Placement(binding=binding, key=key, known=False)
        if self.state.pod_node(key) is not None:  # the watch, when it was first, knows better
            return Placement(binding=binding, key=key, known=True)
        assumed = state.assigned_pod(pod, seen_at=now, args=self.state.args)
        self.state.assume(key, assumed, node=binding.node, bound=bound, assumed_at=now)
        return Placement(binding=binding, key=key, known=True, assumed=assumed)

    def undo(self, placement: Placement) -> bool:
        """Take back what `place` recorded, unless a watch event replaced it since. True when something was undone."""
        return placement.assumed is not None and self.state.forget_assumed(placement.key, placement.assumed)

    def explain(self, pod: kube.Pod, node: str, *, now: float) -> dict[str, object]:
        """The filter verdict and score of `pod` on `node` with their arithmetic (koordbus scheduler explain)."""
        return core.explain(self.state, pod, node, now=now)
