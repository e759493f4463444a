"""A node's prod predictor as the nodemetric service runs it (spec §1.7): its models trained from the agent's
rounds, and the prediction each NodeMetric report carries. Pure.

koordlet trains its models inside the agent, every minute, from its own samples. Here the agent still measures each
round (the p90s of the node's and every pod's samples over the minute, schemas.node.TrainingRound, sent with the
batch that ends the minute) and the nodemetric service, which holds every node's window already, trains the node's
models (services.nodemetric.predictor.Models) from them. A round is applied at most once and in order: one that ends
at or before the last round applied is skipped, so a replay of the stream trains nothing twice. A round whose batch
names a pod list the window does not hold is skipped whole (and counted): without the pods' classes the priority-class
and system items would be trained wrong.

Each report asks `predict` with the pods of the node's newest batch and the node's allocatable. Koordinator reads the
allocatable from the Node object (its raw-allocatable annotation, else status.allocatable); the nodemetric service
reads no Node, so it uses the capacity the agent reports (NodeStateReported: cores and MemTotal), which the cap
min(allocatable − unreclaimable, reclaimable) then bounds from above, and says so in the explanation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from schemas import node
from schemas.prediction import HistogramState, ModelsSnapshot, ModelState, ModelView, PredictionView
from schemas.resources import CPU, MEMORY, ResourceList
from services.nodemetric import histogram, predictor
from services.nodemetric.core import PodInfo

SECOND_NS: Final = predictor.SECOND_NS
ALLOCATABLE_SOURCE: Final = "the agent's reported capacity (cores, MemTotal): the nodemetric service reads no Node"


def seconds_ns(t: float) -> int:
    """Unix seconds as integer nanoseconds (rounded: agent times are whole or decimal seconds)."""
    return round(t * SECOND_NS)


def pod_facts(info: PodInfo) -> predictor.PodFacts:
    """What the predictors read of a pod, from what the window knows of it."""
    created_at = info.created_at
    return predictor.PodFacts(  # positionally: once per reclaimable pod and report, 100 a node at 10,000 nodes
        f"{info.namespace}/{info.name}",
        info.uid,
        info.priority,
        {CPU: info.cpu_request, MEMORY: info.memory_request},
        None if created_at is None else round(created_at * SECOND_NS),  # seconds_ns, written out
        info.terminating,
    )


def state_capacity(state: node.NodeStateReported) -> ResourceList | None:
    """The capacity an agent reports (None when it reported none)."""
    if state.cpu_cores <= 0 or state.memory_total <= 0:
        return None
    return {CPU: int(state.cpu_cores * 1000), MEMORY: state.memory_total}


@dataclass(frozen=True)
class Prediction:
    """One report's prediction: the status parts (Koordinator's shape rules applied) and the explanation."""

    reclaimable: node.ResourceMap
    """Empty when the predictor failed (Koordinator then writes prodReclaimableMetric with no data)."""
    peak: node.ResourceMap | None
    """None when the predictor failed (Koordinator then leaves prodPeakMetric out)."""
    explanation: dict[str, Any]


@dataclass
class NodePredictor:
    """One node's models, what was applied of them, and the capacity its agent reported."""

    models: predictor.Models = field(default_factory=predictor.Models)
    trained_until: float | None = None
    """The end of the last round applied."""
    capacity: ResourceList | None = None
    skipped_rounds: int = 0
    """Rounds not applied because their pod list was unknown or named a pod out of range."""

    def train(self, round_: node.TrainingRound, pods: Sequence[PodInfo | None] | None) -> bool:
        """Apply one round (`pods`: the batch's pod list, as the window knows it); False when it was skipped."""
        if self.trained_until is not None and round_.end <= self.trained_until:
            return False
        if pods is None or any(index >= len(pods) for index in round_.pods):
            self.skipped_rounds += 1
            return False
        usages = [
            predictor.PodUsage(info.uid, info.priority, cpu, float(memory))
            for index, cpu, memory in zip(round_.pods, round_.pod_cpu, round_.pod_memory, strict=True)
            if (info := pods[index]) is not None
        ]
        now_ns = seconds_ns(round_.end)
        node_memory = None if round_.node_memory is None else float(round_.node_memory)
        self.models.train(now_ns, usages, round_.node_cpu, node_memory)
        self.models.expire(now_ns)
        self.trained_until = round_.end
        return True

    def predict(self, report_time: float, pods: Sequence[PodInfo], *, explain: bool = True) -> Prediction:
        """The min predictor over the node's pods at `report_time` (spec §1.7); without `explain` the explanation
        lists no pods (a report needs only the numbers)."""
        prod = predictor.prod_predictor(
            "min",
            lookup=self.models.prediction,
            now_ns=seconds_ns(report_time),
            allocatable=self._allocatable,
            explain=explain,
        )
        # only the reclaimable pods: the predictors pass over the others without a trace (no count, note or error)
        reclaimable = predictor.RECLAIMABLE_CLASSES
        outcome = predictor.predict(prod, [pod_facts(info) for info in pods if info.priority in reclaimable])
        explanation = {
            "trainedUntil": self.trained_until,
            "models": len(self.models.models),
            "allocatable": self.capacity,
            "allocatableSource": ALLOCATABLE_SOURCE,
            "predictors": prod.explain(),
            "errors": dict(outcome.errors),
            "podErrors": list(outcome.pod_errors),
        }
        return Prediction(
            reclaimable=node.ResourceMap(resources=dict(outcome.reclaimable or {})),
            peak=None if outcome.peak is None else node.ResourceMap(resources=dict(outcome.peak)),
            explanation=explanation,
        )

    def snapshot(self, node_name: str, taken_at: float) -> ModelsSnapshot:
        """The models as they stand (only after a round was applied: `trained_until` is set)."""
        if self.trained_until is None:
            raise ValueError("no training round applied yet: nothing to snapshot")
        return ModelsSnapshot(
            node=node_name,
            trained_until=self.trained_until,
            taken_at=taken_at,
            models=[
                ModelState(uid, model.last_updated_ns, _histogram_state(model.cpu), _histogram_state(model.memory))
                for uid, model in self.models.models.items()
            ],
            capacity_cpu=None if self.capacity is None else self.capacity[CPU] / 1000,
            capacity_memory=None if self.capacity is None else self.capacity[MEMORY],
        )

    @classmethod
    def restore(cls, snapshot: ModelsSnapshot) -> NodePredictor:
        """The predictor a snapshot saved (ValueError when a histogram in it is inconsistent)."""
        models = predictor.Models()
        for state in snapshot.models:
            models.models[state.uid] = predictor.Model(
                _restored(state.cpu, histogram.CPU_OPTIONS, models.cpu_half_life_ns),
                _restored(state.memory, histogram.MEMORY_OPTIONS, models.memory_half_life_ns),
                state.last_updated_ns,
            )
        capacity = None
        if snapshot.capacity_cpu is not None and snapshot.capacity_memory is not None:
            capacity = {CPU: int(snapshot.capacity_cpu * 1000), MEMORY: snapshot.capacity_memory}
        return cls(models=models, trained_until=snapshot.trained_until, capacity=capacity)

    def view(self, node_name: str, last: Prediction | None) -> PredictionView:
        """What the API shows of this predictor: every model's percentiles, and `last`, the newest prediction (the
        service computes it again for the request rather than keep every node's explanation in memory)."""
        models = [
            ModelView(
                uid=uid,
                last_trained=model.last_updated_ns / SECOND_NS,
                percentiles={name: dict(answer) for name, answer in model.prediction().items()},
            )
            for uid, model in sorted(self.models.models.items())
        ]
        return PredictionView(
            node=node_name,
            trained_until=self.trained_until,
            skipped_rounds=self.skipped_rounds,
            capacity=None if self.capacity is None else dict(self.capacity),
            models=models,
            reclaimable=None if last is None else dict(last.reclaimable.resources),
            peak=None if last is None or last.peak is None else dict(last.peak.resources),
            explanation=None if last is None else last.explanation,
        )

    def _allocatable(self) -> ResourceList:
        if self.capacity is None:
            raise predictor.PredictorError("node is nil: its agent has reported no capacity yet")
        return dict(self.capacity)


def _histogram_state(h: histogram.DecayingHistogram) -> HistogramState:
    # Go times count from year 1, past int64 nanoseconds: the snapshot carries Unix nanoseconds (None: zero time)
    reference = None if h.reference_ns == 0 else h.reference_ns - histogram.UNIX_EPOCH_NS
    return HistogramState.of(reference, h.total, h.min_bucket, h.max_bucket, h.weights)


def _restored(state: HistogramState, options: histogram.Options, half_life_ns: int) -> histogram.DecayingHistogram:
    try:
        return histogram.DecayingHistogram.restored(
            options,
            half_life_ns,
            reference_ns=0 if state.reference_unix_ns is None else state.reference_unix_ns + histogram.UNIX_EPOCH_NS,
            total=state.total,
            min_bucket=state.min_bucket,
            max_bucket=state.max_bucket,
            weights=state.entries(),
        )
    except histogram.HistogramError as e:
        raise ValueError(str(e)) from None
