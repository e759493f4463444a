"""A node's prod-predictor models as the nodemetric service snapshots them (issue 22): compact, versioned, exact.

Published on `koord.v1.prediction.<node>.models` (stream KOORD_PREDICTION, the last snapshot per node) by the replica
that owns the node, and read back at start-up and when a replica gains a node's partition: the snapshot, then the
training rounds replayed from KOORD_NODE after `trained_until`, continue the models where the previous owner was.

A histogram travels as its state (reference time, total, the bounds, and its non-empty buckets as two little-endian
binary columns: bucket numbers as uint16, weights as float64), so a restored model is bit for bit the one saved.
Decoding checks what a forged or corrupt snapshot could break: sizes, ranges, finiteness; the reader then checks the
bucket numbers against the histogram's options (`ModelsSnapshot.check`).
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Annotated

import msgspec

from schemas.node import Bytes, Cores, NodeName, UnixSeconds

SNAPSHOT_VERSION = 1
MAX_MODELS = 100_000
"""A node's pods plus a handful of node-level items; far more means a corrupt snapshot."""
MAX_BUCKETS = 65_535

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
UnixNanos = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Weight = Annotated[float, msgspec.Meta(ge=0.0)]


class HistogramState(msgspec.Struct, frozen=True, array_like=True):
    """One decaying histogram: its reference time (Unix nanoseconds; None for Go's zero time, the reference of a
    histogram never added to), total weight, min and max bucket, and each non-empty bucket's number (`buckets`,
    uint16 little-endian) and weight (`weights`, float64 little-endian), in bucket order."""

    reference_unix_ns: Int64 | None
    total: Weight
    min_bucket: Annotated[int, msgspec.Meta(ge=0, le=MAX_BUCKETS)]
    max_bucket: Annotated[int, msgspec.Meta(ge=0, le=MAX_BUCKETS)]
    buckets: bytes
    weights: bytes

    def entries(self) -> list[tuple[int, float]]:
        """(bucket, weight) pairs; ValueError when the columns are inconsistent or a weight is not a finite
        non-negative number."""
        count = len(self.buckets) // 2
        if len(self.buckets) % 2 or len(self.weights) != 8 * count:
            raise ValueError(f"{len(self.buckets)} bytes of buckets and {len(self.weights)} of weights do not pair up")
        buckets = struct.unpack(f"<{count}H", self.buckets)
        weights = struct.unpack(f"<{count}d", self.weights)
        if any(b <= a for a, b in itertools.pairwise(buckets)):
            raise ValueError("buckets must be in increasing order")
        if any(not math.isfinite(w) or w < 0.0 for w in weights):
            raise ValueError("a bucket weight is negative or not finite")
        if not math.isfinite(self.total):
            raise ValueError("the total weight is not finite")
        return list(zip(buckets, weights, strict=True))

    @classmethod
    def of(
        cls, reference_unix_ns: int | None, total: float, min_bucket: int, max_bucket: int, weights: dict[int, float]
    ) -> HistogramState:
        ordered = sorted(weights.items())
        return cls(
            reference_unix_ns,
            total,
            min_bucket,
            max_bucket,
            struct.pack(f"<{len(ordered)}H", *(b for b, _ in ordered)),
            struct.pack(f"<{len(ordered)}d", *(w for _, w in ordered)),
        )


class ModelState(msgspec.Struct, frozen=True, array_like=True):
    """One model: its uid (a pod's uid or a node-level item), when it was last trained, its CPU and memory
    histograms."""

    uid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    last_updated_ns: UnixNanos
    cpu: HistogramState
    memory: HistogramState


class ModelsSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag="prediction.snapshot.v1"):
    """One node's models after the training round that ended at `trained_until` (Unix seconds)."""

    node: NodeName
    trained_until: UnixSeconds
    taken_at: UnixSeconds
    models: Annotated[list[ModelState], msgspec.Meta(max_length=MAX_MODELS)]
    capacity_cpu: Cores | None = None
    """The capacity the node's agent last reported (cores, bytes), None when none was."""
    capacity_memory: Bytes | None = None


_DECODER = msgspec.msgpack.Decoder(ModelsSnapshot)
_ENCODER = msgspec.msgpack.Encoder()


def encode_snapshot(snapshot: ModelsSnapshot) -> bytes:
    return _ENCODER.encode(snapshot)


def decode_snapshot(data: bytes | bytearray | memoryview) -> ModelsSnapshot:
    """msgspec.DecodeError / ValidationError for anything but a well-formed snapshot of this version."""
    return _DECODER.decode(data)


# --- what the API asks the replica that owns a node (koord.v1.rpc.nodemetric.prediction.<partition>)


class PredictionRequest(msgspec.Struct, frozen=True, kw_only=True):
    node: NodeName


class ModelView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One model's percentiles (p60, p90, p95, p98, max → cpu millicores, memory bytes) and when it last trained."""

    uid: str
    last_trained: UnixSeconds
    percentiles: dict[str, dict[str, int]]


class PredictionView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A node's prod predictor as its owner holds it: the models, and the newest report's prediction with the
    predictors' explanation (which pods were predicted, which cold-started, which model was missing)."""

    node: str
    trained_until: UnixSeconds | None
    skipped_rounds: int
    capacity: dict[str, int] | None
    models: list[ModelView]
    reclaimable: dict[str, int] | None = None
    peak: dict[str, int] | None = None
    explanation: dict[str, object] | None = None


class PredictionReply(msgspec.Struct, frozen=True, kw_only=True):
    """`view` None: the replica that owns the node has no models for it; `error`: the request was refused."""

    view: PredictionView | None = None
    error: str = ""


PREDICTION_REPLY_DECODER = msgspec.json.Decoder(PredictionReply)
