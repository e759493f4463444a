"""Prod reclaimable and prod peak prediction (spec §1.7): the models koordlet trains, and its predictors. Pure.

Models. Every training round (koordlet: each minute) adds one sample, weight 1 at the round's time, to a pair of
decaying histograms (services.nodemetric.histogram: CPU in cores with a 12 h half-life, memory in bytes with 24 h)
per model uid: each pod (its uid; the p90 of its CPU and of its memory samples over the last interval), the node
(`__node__`, the node's p90s), each priority class (`__node-koord-prod__` … `__node-koord-free__`, and `__node-__`
for the class ""; the sum of its pods' p90s, 0 without pods) and the system (`__node-sys__`: the node's p90 less the
sum of all pods' p90s, at least 0). A model not trained for 30 minutes is dropped. A model answers p60, p90, p95,
p98 and max (percentile 1.0) as cpu millicores and memory bytes, truncated.

Predictors, fed the node's pods in order, per report round. Reclaimable pods are those of priority class koord-prod
or "". The pod predictor counts, per pod with a model, peak = p95 cpu and p98 memory × (1 + safety margin) as
unreclaimable and request − peak, where positive, as reclaimable; a pod in cold start (created no longer ago than the
cold-start duration) or without a model counts its request as unpredicted (the latter is also an error for that pod);
terminating and finished pods count nothing. Its result is min(allocatable − unreclaimable ≥ 0, reclaimable) and its
peak unreclaimable + unpredicted. The priority predictor sums the requests of the live reclaimable pods and takes as
unreclaimable the system's and the reclaimable classes' p95 cpu / p98 memory × (1 + margin). The min predictor feeds
each pod to both (stopping at the first error) and answers the smaller result and the larger peak. Allocatable is the
node's `node.koordinator.sh/raw-allocatable` annotation when it reads, else `status.allocatable`.

Used by `koordbus calc prod-reclaimable` (koordbus.calc_prediction) and, per node, by the nodemetric service.
Amounts are the integer ResourceLists of schemas.resources; times are Unix nanoseconds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

import msgspec

from schemas import kube, quantity, resources, vocab
from schemas.resources import CPU, MEMORY, ResourceList
from services.nodemetric import aggregate, histogram

SECOND_NS: Final = histogram.SECOND_NS
COLD_START_NS: Final = 24 * 3600 * SECOND_NS
SAFETY_MARGIN_PERCENT: Final = 10
TRAINING_INTERVAL_NS: Final = 60 * SECOND_NS
MODEL_EXPIRATION_NS: Final = 30 * 60 * SECOND_NS
TRAINING_PERCENTILE: Final = 0.9

NODE_UID: Final = "__node__"
ANNOTATION_RAW_ALLOCATABLE: Final = "node.koordinator.sh/raw-allocatable"


def node_item_uid(item: str) -> str:
    """The model uid of a node-level item: a priority class, or `sys`."""
    return f"__node-{item}__"


SYSTEM_UID: Final = node_item_uid("sys")
KNOWN_PRIORITY_CLASSES: Final = (
    vocab.PRIORITY_PROD,
    vocab.PRIORITY_MID,
    vocab.PRIORITY_BATCH,
    vocab.PRIORITY_FREE,
    vocab.PRIORITY_NONE,
)
RECLAIMABLE_CLASSES: Final = frozenset({vocab.PRIORITY_PROD, vocab.PRIORITY_NONE})
PREDICTION_PERCENTILES: Final[Mapping[str, float]] = {"p60": 0.6, "p90": 0.9, "p95": 0.95, "p98": 0.98, "max": 1.0}

Prediction = Mapping[str, Mapping[str, int]]
"""One model's answer: percentile name (p60, p90, p95, p98, max) → {cpu: millicores, memory: bytes}."""
PredictionLookup = Callable[[str], Prediction | None]
"""A model uid's prediction, or None when there is no such model."""


class PredictorError(ValueError):
    """What Koordinator's predictor reports as an error: a missing model, a duplicate pod, no node."""


# --- models and training


def training_sample(values: Sequence[float]) -> float | None:
    """A training round's sample from one series' values over the interval: their nearest-rank p90 (spec §1.5),
    None when there are none (koordlet then skips the pod)."""
    if not values:
        return None
    return aggregate.percentile(values, TRAINING_PERCENTILE)


class PodUsage(NamedTuple):
    """A pod's training input: its model uid, priority class, and p90 cpu (cores) and memory (bytes)."""

    uid: str
    priority_class: str
    cpu: float
    memory: float


class Model(msgspec.Struct, gc=False):
    """A pod's (or a class's, the system's, the node's) two histograms; not tracked by the cycle collector, as they
    are not (a million of them at 10,000 nodes × 100 pods)."""

    cpu: histogram.DecayingHistogram
    memory: histogram.DecayingHistogram
    last_updated_ns: int

    def prediction(self) -> Prediction:
        return _ModelPrediction(self)

    def percentile(self, name: str, resource: str) -> int:
        """One named percentile (p60 … max) of one resource: cpu millicores or memory bytes."""
        p = PREDICTION_PERCENTILES[name]
        if resource == CPU:
            return int(self.cpu.percentile(p) * 1000.0)
        if resource == MEMORY:
            return int(self.memory.percentile(p))
        raise KeyError(resource)


class _ModelPrediction(Mapping[str, Mapping[str, int]]):
    """A model's answer, each percentile of each resource computed when read (a predictor reads two of the ten)."""

    __slots__ = ("_model",)

    def __init__(self, model: Model) -> None:
        self._model = model

    def __getitem__(self, name: str) -> Mapping[str, int]:
        if name not in PREDICTION_PERCENTILES:
            raise KeyError(name)
        return _ModelPercentile(self._model, name)

    def __iter__(self) -> Iterator[str]:
        return iter(PREDICTION_PERCENTILES)

    def __len__(self) -> int:
        return len(PREDICTION_PERCENTILES)


def _read(prediction: Prediction, percentile: str, resource: str) -> int | None:
    """prediction[percentile][resource], None when absent: a model's answer straight from its histogram (the
    predictors read two per pod and report; the Mapping wrappers cost more than the kept percentile)."""
    if type(prediction) is _ModelPrediction:
        return prediction._model.percentile(percentile, resource)
    return prediction.get(percentile, {}).get(resource)


class _ModelPercentile(Mapping[str, int]):
    __slots__ = ("_model", "_name")

    def __init__(self, model: Model, name: str) -> None:
        self._model, self._name = model, name

    def __getitem__(self, resource: str) -> int:
        return self._model.percentile(self._name, resource)

    def __iter__(self) -> Iterator[str]:
        return iter((CPU, MEMORY))

    def __len__(self) -> int:
        return 2


@dataclass
class Models:
    """A node's models by uid, trained as koordlet's predict server trains them."""

    cpu_half_life_ns: int = histogram.CPU_HALF_LIFE_NS
    memory_half_life_ns: int = histogram.MEMORY_HALF_LIFE_NS
    expiration_ns: int = MODEL_EXPIRATION_NS
    models: dict[str, Model] = field(default_factory=dict)

    def update(self, uid: str, cpu: float, memory: float, now_ns: int) -> None:
        """Add one sample (weight 1, at `now_ns`) to the uid's model, creating it when new."""
        model = self.models.get(uid)
        if model is None:
            model = Model(
                histogram.cpu_histogram(self.cpu_half_life_ns), histogram.memory_histogram(self.memory_half_life_ns), 0
            )
            self.models[uid] = model
        model.last_updated_ns = now_ns
        t = histogram.unix_to_go_ns(now_ns)
        model.cpu.add(cpu, 1.0, t)
        model.memory.add(memory, 1.0, t)

    def train(self, now_ns: int, pods: Iterable[PodUsage], node_cpu: float | None, node_memory: float | None) -> None:
        """One training round from the pods that had samples, and the node's p90 cpu (cores) and memory (bytes),
        None where the node had no samples. The node model is trained only when both are known; the system item
        takes a missing one as 0 (what koordlet's failed query returns)."""
        class_sums: dict[str, tuple[float, float]] = {}
        all_pods: tuple[float, float] | None = None
        for pod in pods:
            self.update(pod.uid, pod.cpu, pod.memory, now_ns)
            class_sums[pod.priority_class] = _plus(class_sums.get(pod.priority_class), pod.cpu, pod.memory)
            all_pods = _plus(all_pods, pod.cpu, pod.memory)
        if node_cpu is not None and node_memory is not None:
            self.update(NODE_UID, node_cpu, node_memory, now_ns)
        for priority_class in KNOWN_PRIORITY_CLASSES:
            cpu, memory = class_sums.get(priority_class, (0.0, 0.0))
            self.update(node_item_uid(priority_class), cpu, memory, now_ns)
        system_cpu, system_memory = node_cpu or 0.0, node_memory or 0.0
        if all_pods is not None:
            system_cpu = max(system_cpu - all_pods[0], 0.0)
            system_memory = max(system_memory - all_pods[1], 0.0)
        self.update(SYSTEM_UID, system_cpu, system_memory, now_ns)

    def expire(self, now_ns: int) -> list[str]:
        """Drop the models not trained for longer than the expiration; their uids, sorted."""
        gone = sorted(uid for uid, m in self.models.items() if now_ns - m.last_updated_ns > self.expiration_ns)
        for uid in gone:
            del self.models[uid]
        return gone

    def prediction(self, uid: str) -> Prediction | None:
        model = self.models.get(uid)
        return None if model is None else _ModelPrediction(model)  # model.prediction(), one call less per pod


def _plus(total: tuple[float, float] | None, cpu: float, memory: float) -> tuple[float, float]:
    return (cpu, memory) if total is None else (total[0] + cpu, total[1] + memory)


# --- pods and the node as the predictors see them


class PodFacts(NamedTuple):
    """What the predictors read of a pod (pod_facts builds it from a Pod object)."""

    key: str
    uid: str
    priority_class: str
    request: ResourceList
    """The Kubernetes effective request, cpu and memory only."""
    created_ns: int | None
    terminating: bool
    """deletionTimestamp set, or phase Succeeded/Failed."""


def unix_ns(t: dt.datetime) -> int:
    """A datetime (naive = UTC) as integer Unix nanoseconds, without going through a float."""
    aware = t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)
    delta = aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * SECOND_NS + delta.microseconds * 1000


def pod_facts(pod: kube.Pod) -> PodFacts:
    meta = pod.metadata
    return PodFacts(
        key=kube.pod_key(pod),
        uid=meta.uid,
        priority_class=kube.pod_priority_class(pod),
        request=resources.mask(kube.pod_request(pod), (CPU, MEMORY)),
        created_ns=None if meta.creation_timestamp is None else unix_ns(meta.creation_timestamp),
        terminating=meta.deletion_timestamp is not None
        or pod.status.phase in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED),
    )


def raw_allocatable(annotations: Mapping[str, str]) -> ResourceList | None:
    """The raw-allocatable annotation as Go unmarshals it into a ResourceList: None when absent, `null` or
    unreadable (a null quantity is 0)."""
    text = annotations.get(ANNOTATION_RAW_ALLOCATABLE)
    if text is None:
        return None
    try:
        decoded: Any = json.loads(text)
        if not isinstance(decoded, dict):
            return None
        return quantity.resource_list(
            {name: 0 if q is None else q.strip() if isinstance(q, str) else q for name, q in decoded.items()}
        )
    except ValueError:
        return None


def node_allocatable(node: kube.Node | None) -> ResourceList:
    """What the predictors subtract from: raw allocatable, else status.allocatable; an error without either."""
    if node is None:
        raise PredictorError("node is nil")
    raw = raw_allocatable(node.metadata.annotations)
    if raw is not None:
        return raw
    if node.status.allocatable is None:
        raise PredictorError("failed to get allocatable of node, err=invalid node, for node.status.allocation is nil")
    return kube.node_allocatable(node)


def _scaled(amount: int, ratio: float) -> int:
    """An integer amount × ratio in float64, truncated toward zero (Koordinator's MultiplyQuant)."""
    return int(float(amount) * ratio)


def _margin_ratio(safety_margin_percent: int) -> float:
    return float(100 + safety_margin_percent) / 100


def _zero() -> ResourceList:
    return {CPU: 0, MEMORY: 0}


_PEAK_PERCENTILES: Final = ((CPU, "p95"), (MEMORY, "p98"))
"""What a pod predictor takes as a pod's peak: its model's p95 cpu and p98 memory (× (1 + safety margin))."""


def _add_to(total: ResourceList, amounts: Mapping[str, int]) -> None:
    """resources.add(total, amounts) in place, on a sum the predictor owns (its own dict, made with it)."""
    for name, amount in amounts.items():
        total[name] = total.get(name, 0) + amount


def _missing_model(uid: str) -> str:
    return f"UID {uid} not found in predict server"


# --- predictors


class Predictor(Protocol):
    name: str

    def add_pod(self, pod: PodFacts) -> None: ...
    def result(self) -> ResourceList: ...
    def peak(self) -> ResourceList: ...
    def explain(self) -> dict[str, Any]:
        """What the predictor counted, for an operator: the sums and, per pod, what happened to it."""
        ...


@dataclass
class PodReclaimablePredictor:
    lookup: PredictionLookup
    allocatable: Callable[[], ResourceList]
    now_ns: int
    cold_start_ns: int = COLD_START_NS
    safety_margin_percent: int = SAFETY_MARGIN_PERCENT
    name: str = "podReclaimablePredictor"
    reclaimable: ResourceList = field(default_factory=_zero)
    unreclaimable: ResourceList = field(default_factory=_zero)
    unpredicted: ResourceList = field(default_factory=_zero)
    notes: list[dict[str, Any]] | None = field(default_factory=list)
    """Each pod's outcome, for the explanation; None: not kept (a report needs only the numbers)."""
    _seen: set[str] = field(default_factory=set)

    def add_pod(self, pod: PodFacts) -> None:
        if pod.priority_class not in RECLAIMABLE_CLASSES:
            return
        if pod.uid in self._seen:
            self._note(pod, "duplicate uid")
            raise PredictorError(f"pod {pod.key} already exist in the pod reclaimable predictor")
        self._seen.add(pod.uid)
        if pod.created_ns is not None and histogram.go_duration(self.now_ns - pod.created_ns) <= self.cold_start_ns:
            _add_to(self.unpredicted, pod.request)
            self._note(pod, "cold start", unpredicted=pod.request)
            return
        if pod.terminating:
            self._note(pod, "terminating")
            return
        prediction = self.lookup(pod.uid)
        if prediction is None:
            _add_to(self.unpredicted, pod.request)
            self._note(pod, "no model", unpredicted=pod.request)
            raise PredictorError(_missing_model(pod.uid))
        ratio = _margin_ratio(self.safety_margin_percent)
        peak: ResourceList = {}
        reclaimable: ResourceList = {}
        unreclaimable_sum, reclaimable_sum = self.unreclaimable, self.reclaimable
        for name, percentile in _PEAK_PERCENTILES:  # each pod of each report: sums added to in place
            predicted = _read(prediction, percentile, name)
            if predicted is None:
                continue
            peak[name] = amount = int(float(predicted) * ratio)  # _scaled
            unreclaimable_sum[name] = unreclaimable_sum.get(name, 0) + amount
            left = pod.request.get(name, 0) - amount
            if left > 0:
                reclaimable[name] = left
                reclaimable_sum[name] = reclaimable_sum.get(name, 0) + left
        if self.notes is not None:
            self._note(pod, "predicted", peak=peak, reclaimable=reclaimable)

    def result(self) -> ResourceList:
        allocatable = self.allocatable()
        return resources.min_rl(resources.sub_nonneg(allocatable, self.unreclaimable), self.reclaimable)

    def peak(self) -> ResourceList:
        return resources.add(self.unreclaimable, self.unpredicted)

    def explain(self) -> dict[str, Any]:
        return {
            "unReclaimable": self.unreclaimable,
            "reclaimable": self.reclaimable,
            "unpredicted": self.unpredicted,
            "pods": self.notes or [],
        }

    def _note(self, pod: PodFacts, outcome: str, **numbers: ResourceList) -> None:
        if self.notes is not None:
            self.notes.append({"pod": pod.key, "uid": pod.uid, "outcome": outcome, **numbers})


@dataclass
class PriorityReclaimablePredictor:
    lookup: PredictionLookup
    allocatable: Callable[[], ResourceList]
    safety_margin_percent: int = SAFETY_MARGIN_PERCENT
    name: str = "priorityReclaimablePredictor"
    reclaim_request: ResourceList = field(default_factory=_zero)
    notes: list[dict[str, Any]] = field(default_factory=list)

    def add_pod(self, pod: PodFacts) -> None:
        if pod.priority_class not in RECLAIMABLE_CLASSES:
            return
        if pod.terminating:
            return
        _add_to(self.reclaim_request, pod.request)

    def unreclaimable(self) -> ResourceList:
        """The system's and the reclaimable classes' p95 cpu and p98 memory, summed, × (1 + margin)."""
        total = _zero()
        for item, uid in (("sys", SYSTEM_UID), *((c, node_item_uid(c)) for c in KNOWN_PRIORITY_CLASSES)):
            if item != "sys" and item not in RECLAIMABLE_CLASSES:
                continue
            prediction = self.lookup(uid)
            if prediction is None:
                which = "sys" if item == "sys" else f"priority {item}"
                raise PredictorError(f"failed to get prediction of {which}, err: {_missing_model(uid)}")
            total[CPU] += _read(prediction, "p95", CPU) or 0
            total[MEMORY] += _read(prediction, "p98", MEMORY) or 0
        ratio = _margin_ratio(self.safety_margin_percent)
        return {CPU: _scaled(total[CPU], ratio), MEMORY: _scaled(total[MEMORY], ratio)}

    def result(self) -> ResourceList:
        allocatable = self.allocatable()
        unreclaimable = self.unreclaimable()
        reclaimable = resources.max_rl(resources.sub(self.reclaim_request, unreclaimable), _zero())
        return resources.min_rl(resources.sub_nonneg(allocatable, unreclaimable), reclaimable)

    def peak(self) -> ResourceList:
        return self.unreclaimable()

    def explain(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reclaimRequest": self.reclaim_request}
        try:
            out["unReclaimable"] = self.unreclaimable()
        except PredictorError as err:
            out["error"] = str(err)
        return out


@dataclass
class MinPredictor:
    predictors: Sequence[Predictor]
    name: str = "minPredictor"

    def add_pod(self, pod: PodFacts) -> None:
        for predictor in self.predictors:
            try:
                predictor.add_pod(pod)
            except PredictorError as err:
                raise PredictorError(f"failed to add pod ({pod.key}) to {predictor.name}. error: {err}") from None

    def result(self) -> ResourceList:
        smallest: ResourceList | None = None
        for predictor in self.predictors:
            current = _part(predictor, "result", predictor.result)
            smallest = current if smallest is None else resources.min_rl(smallest, current)
        return smallest if smallest is not None else _zero()

    def peak(self) -> ResourceList:
        largest: ResourceList | None = None
        for predictor in self.predictors:
            current = _part(predictor, "peak", predictor.peak)
            largest = current if largest is None else resources.max_rl(largest, current)
        return largest if largest is not None else _zero()

    def explain(self) -> dict[str, Any]:
        return {predictor.name: predictor.explain() for predictor in self.predictors}


def _part(predictor: Predictor, what: str, get: Callable[[], ResourceList]) -> ResourceList:
    try:
        return get()
    except PredictorError as err:
        raise PredictorError(f"failed to get predictor {predictor.name} {what}, error: {err}") from None


@dataclass(frozen=True)
class Outcome:
    """A predictor's answer for one round: each part, or the error that replaced it; the pods' errors."""

    reclaimable: ResourceList | None
    peak: ResourceList | None
    errors: Mapping[str, str]
    """"reclaimable" / "peak" → why that part failed."""
    pod_errors: Sequence[str]


def predict(predictor: Predictor, pods: Iterable[PodFacts]) -> Outcome:
    """Feed the pods in order (a pod's error ends only that pod's feeding, as koordlet logs it and goes on), then
    ask for the result and the peak."""
    pod_errors: list[str] = []
    for pod in pods:
        try:
            predictor.add_pod(pod)
        except PredictorError as err:
            pod_errors.append(str(err))
    parts: dict[str, ResourceList | None] = {}
    errors: dict[str, str] = {}
    for what, get in (("reclaimable", predictor.result), ("peak", predictor.peak)):
        try:
            parts[what] = get()
        except PredictorError as err:
            parts[what] = None
            errors[what] = str(err)
    return Outcome(parts["reclaimable"], parts["peak"], errors, pod_errors)


def prod_predictor(
    kind: str,
    *,
    lookup: PredictionLookup,
    node: kube.Node | None = None,
    now_ns: int,
    cold_start_ns: int = COLD_START_NS,
    safety_margin_percent: int = SAFETY_MARGIN_PERCENT,
    allocatable: Callable[[], ResourceList] | None = None,
    explain: bool = True,
) -> Predictor:
    """The prod-reclaimable predictor koordlet builds each round ("min"), or one of its two parts alone. What it
    subtracts from is `node`'s allocatable (node_allocatable), or what `allocatable` answers when given; without
    `explain` it keeps no per-pod notes."""

    if allocatable is None:

        def allocatable() -> ResourceList:
            return node_allocatable(node)

    by_pod = PodReclaimablePredictor(
        lookup, allocatable, now_ns, cold_start_ns, safety_margin_percent, notes=[] if explain else None
    )
    by_priority = PriorityReclaimablePredictor(lookup, allocatable, safety_margin_percent)
    if kind == "pod":
        return by_pod
    if kind == "priority":
        return by_priority
    return MinPredictor([by_pod, by_priority])
