"""`koordbus calc histogram` and `koordbus calc prod-reclaimable` (../shared/design/CALC-CONTRACT.md, spec §1.7).

Registered in koordbus.calc.CALCULATORS, with the summaries and examples `--help` shows (kept here). `histogram`
replays samples (and then the `subtract` entries) into one of services.nodemetric.histogram's histograms, plain or
decaying, and answers the asked percentiles, whether it is empty, and its state under `explain`. `prod-reclaimable`
runs services.nodemetric.predictor's prod predictor ("min", or its "pod" or "priority" part) over the pods in input
order, with `predictions` playing koordlet's predict server, and answers the reclaimable resources and the peak, with
what each part counted under `explain`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
from typing import Any, Final, Literal

import msgspec

from koordbus.calc_errors import InputError
from schemas import kube, quantity
from services.nodemetric import histogram
from services.nodemetric import predictor as predictors

# --- histogram

HISTOGRAM_HELP: Final = (
    "percentiles of koordlet's plain or decaying histogram after [unixSeconds, value, weight] samples (spec §1.7)",
    '{"options": {"type": "linear", "maxValue": 10, "bucketSize": 1, "epsilon": 1e-15}, "halfLifeSeconds": 3600,\n'
    '     "samples": [[1767268800, 2, 1], [1767272400, 4, 3]], "percentiles": [0.5, 0.95]}',
)
"""The kind's summary and example for `koordbus calc --help`."""


class HistogramOptionsInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    type: Literal["linear", "exponential"]
    max_value: float
    epsilon: float
    bucket_size: float | None = None
    first_bucket_size: float | None = None
    ratio: float | None = None


Sample = tuple[decimal.Decimal, float, float]
"""[unixSeconds, value, weight]; the time is read exactly, to the nanosecond."""


class HistogramInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    options: HistogramOptionsInput
    half_life_seconds: decimal.Decimal | None = None
    samples: list[Sample] = []
    subtract: list[Sample] = []
    percentiles: list[float] = []


def _nanoseconds(seconds: decimal.Decimal, path: str) -> int:
    if not seconds.is_finite():
        raise InputError(f"{path}: Expected a finite number, got {seconds}")
    return int((seconds * histogram.SECOND_NS).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def _options(inp: HistogramOptionsInput) -> histogram.Options:
    def required(value: float | None, name: str) -> float:
        if value is None:
            raise InputError(f"$.options.{name}: required for {inp.type} options")
        return value

    if inp.type == "linear":
        return histogram.linear_options(inp.max_value, required(inp.bucket_size, "bucketSize"), inp.epsilon)
    return histogram.exponential_options(
        inp.max_value, required(inp.first_bucket_size, "firstBucketSize"), required(inp.ratio, "ratio"), inp.epsilon
    )


def _number(value: float) -> float | str:
    """A float for JSON; Go's spelling for the infinities and NaN that JSON cannot carry."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def histogram_percentiles(inp: HistogramInput) -> dict[str, Any]:
    half_life_ns = None
    if inp.half_life_seconds is not None:
        half_life_ns = _nanoseconds(inp.half_life_seconds, "$.halfLifeSeconds")
        if half_life_ns > histogram.go_duration(half_life_ns):
            raise InputError("$.halfLifeSeconds: longer than a Go duration can hold")
    rows = [("samples", i, s) for i, s in enumerate(inp.samples)] + [
        ("subtract", i, s) for i, s in enumerate(inp.subtract)
    ]
    times = [histogram.unix_to_go_ns(_nanoseconds(s[0], f"$.{where}[{i}][0]")) for where, i, s in rows]
    for where, i, (_, value, weight) in rows:
        for j, number in ((1, value), (2, weight)):
            if not math.isfinite(number):
                raise InputError(f"$.{where}[{i}][{j}]: Expected a finite number, got {number!r}")
    try:
        options = _options(inp.options)
        if half_life_ns is None:
            h = histogram.Histogram(options)
        elif half_life_ns <= 0:
            return {"error": "halfLifeSeconds must be positive"}
        else:
            h = histogram.DecayingHistogram(options, half_life_ns)
        for (where, _, (_, value, weight)), t in zip(rows, times, strict=True):
            (h.add if where == "samples" else h.subtract)(value, weight, t)
    except histogram.HistogramError as err:
        return {"error": str(err)}
    explain: dict[str, Any] = {
        "numBuckets": options.num_buckets,
        "minBucket": h.min_bucket,
        "maxBucket": h.max_bucket,
        "totalWeight": _number(h.total),
        "bucketWeights": {str(b): _number(w) for b, w in sorted(h.weights.items())},
    }
    if isinstance(h, histogram.DecayingHistogram):
        explain["referenceTime"] = _go_time_text(h.reference_ns)
    return {
        "percentiles": [_number(h.percentile(p)) for p in inp.percentiles],
        "empty": h.is_empty(),
        "explain": explain,
    }


def _go_time_text(go_ns: int) -> str:
    """A Go time as RFC 3339 (nanoseconds when there are any), or as nanoseconds after the zero time when it lies
    outside the years 1–9999."""
    seconds, nanos = divmod(go_ns, histogram.SECOND_NS)
    try:
        when = dt.datetime(1, 1, 1) + dt.timedelta(seconds=seconds)
    except OverflowError:
        return f"{go_ns}ns after 0001-01-01T00:00:00Z"
    return when.isoformat(timespec="seconds") + (f".{nanos:09d}".rstrip("0") if nanos else "") + "Z"


# --- prod-reclaimable

PROD_RECLAIMABLE_HELP: Final = (
    "koordlet's prod reclaimable resources and peak from pods and model predictions (spec §1.7)",
    '{"now": "2026-01-01T12:00:00Z", "node": {"status": {"allocatable": {"cpu": "8", "memory": "16Gi"}}},\n'
    '     "pods": [], "predictions": {"__node-sys__": {"p95": {"cpu": "1"}, "p98": {"memory": "2Gi"}},\n'
    '       "__node-koord-prod__": {}, "__node-__": {}}}',
)


class ProdReclaimableInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    now: dt.datetime | float
    node: kube.Node | None = None
    pods: list[kube.Pod] = []
    predictor: Literal["min", "pod", "priority"] = "min"
    cold_start_seconds: decimal.Decimal = decimal.Decimal(86400)
    safety_margin_percent: int = predictors.SAFETY_MARGIN_PERCENT
    predictions: dict[str, dict[str, dict[str, quantity.RawQuantity]]] = {}


def _predictions(raw: dict[str, dict[str, dict[str, quantity.RawQuantity]]]) -> dict[str, predictors.Prediction]:
    out: dict[str, predictors.Prediction] = {}
    for uid, by_percentile in raw.items():
        model: dict[str, dict[str, int]] = {}
        for percentile, resource_list in by_percentile.items():
            try:
                model[percentile] = quantity.resource_list(resource_list)
            except quantity.QuantityError as err:
                raise InputError(f"$.predictions{_key(uid)}{_key(percentile)}.{err}") from None
        out[uid] = model
    return out


def _key(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f"[{json.dumps(key)}]"


def prod_reclaimable(inp: ProdReclaimableInput) -> dict[str, Any]:
    if isinstance(inp.now, dt.datetime):
        now_ns = predictors.unix_ns(inp.now)
    elif math.isfinite(inp.now):
        now_ns = _nanoseconds(decimal.Decimal(inp.now), "$.now")
    else:
        raise InputError(f"$.now: Expected a finite number, got {inp.now!r}")
    predictions = _predictions(inp.predictions)
    chosen = predictors.prod_predictor(
        inp.predictor,
        lookup=predictions.get,
        node=inp.node,
        now_ns=now_ns,
        cold_start_ns=histogram.go_duration(_nanoseconds(inp.cold_start_seconds, "$.coldStartSeconds")),
        safety_margin_percent=inp.safety_margin_percent,
    )
    outcome = predictors.predict(chosen, [predictors.pod_facts(pod) for pod in inp.pods])
    out: dict[str, Any] = {"reclaimable": outcome.reclaimable, "peak": outcome.peak}
    if outcome.errors:
        out["error"] = "; ".join(f"{part}: {why}" for part, why in outcome.errors.items())
    out["explain"] = {"predictor": chosen.name, **chosen.explain(), "podErrors": list(outcome.pod_errors)}
    return out
