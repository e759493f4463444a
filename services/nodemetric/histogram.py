"""Koordinator's prediction histograms (spec §1.7; VPA-style, as in its pkg/util/histogram). Pure.

A histogram is a weight per bucket over linear or exponential buckets, a total weight, and the lowest and highest
bucket holding at least `epsilon` (`min_bucket` / `max_bucket`). `percentile(p)` walks the buckets from the lowest
until the running weight reaches p × total and answers the END of that bucket (the start of the last bucket when it
is the last one); an empty histogram answers 0. A decaying histogram gives a sample at time t the weight
w × 2^((t − ref) / halfLife) against a reference time that moves forward (rescaling every weight) once a sample
lies more than 100 half-lives past it, so old samples fade without weights overflowing.

Used by services.nodemetric.predictor (the per-pod, per-priority-class, system and node models that the predictors
read) and by `koordbus calc histogram`. Everything follows ../shared/design/CALC-CONTRACT.md (`histogram`) to the
bit: times are Go times (integer nanoseconds counted from 0001-01-01T00:00:00Z, differences saturating at ±2^63 ns),
and the logarithm, integer power and base-2 exponential are computed the way Go's math package computes them on
amd64, because bucket boundaries and decay factors must come out as the same float64 as Koordinator's.

Weights are stored sparsely (bucket → weight, zero buckets absent): the arithmetic is the dense one's, since an
absent bucket adds 0.0 and is never scaled, but a model costs only the buckets it uses.

A histogram keeps the last percentile it answered. The answer depends on the weights, the total and the bounds
only, never on the time it is asked at (decay is applied when a sample is added: `shift_reference` rescales the
weights then, through `scale`), so every method that changes any of them forgets it.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec

MIN_SAMPLE_WEIGHT: Final = 0.1
EPSILON: Final = 0.001 * MIN_SAMPLE_WEIGHT
"""Koordinator's bucket weight below which a bucket counts as empty (computed in float64, as Go does)."""
BUCKET_SIZE_GROWTH: Final = 0.05

SECOND_NS: Final = 1_000_000_000
UNIX_EPOCH_NS: Final = 62_135_596_800 * SECOND_NS
"""1970-01-01T00:00:00Z in Go time: nanoseconds after 0001-01-01T00:00:00Z, Go's zero time."""
CPU_HALF_LIFE_NS: Final = 12 * 3600 * SECOND_NS
MEMORY_HALF_LIFE_NS: Final = 24 * 3600 * SECOND_NS
MAX_DECAY_EXPONENT: Final = 100

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class HistogramError(ValueError):
    """Options or a sample Koordinator rejects (non-positive sizes, ratio ≤ 1, a negative weight)."""


# --- Go's float64 math (amd64), where it differs from the C library's last bit

_LN2_HI: Final = 6.93147180369123816490e-01
_LN2_LO: Final = 1.90821492927058770002e-10
_HALF_SQRT2: Final = 7.07106781186547524401e-01
_LOG_POLY: Final = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
    1.818357216161805012e-01,
    1.531383769920937332e-01,
    1.479819860511658591e-01,
)
_EXP_POLY: Final = (
    1.66666666666666657415e-01,
    -2.77777777770155933842e-03,
    6.61375632143793436117e-05,
    -1.65339022054652515390e-06,
    4.13813679705723846039e-08,
)


def go_log(x: float) -> float:
    """Natural logarithm as Go's math.Log computes it (the FreeBSD msun method: x = 2^k·(1+f) with
    √2/2 < 1+f < √2, log(1+f) from s = f/(2+f) and a degree-14 polynomial, ln 2 split in a high and a low part)."""
    if math.isnan(x) or x == math.inf:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    mantissa, exponent = math.frexp(x)
    if mantissa < _HALF_SQRT2:
        mantissa *= 2
        exponent -= 1
    f = mantissa - 1
    k = float(exponent)
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    l1, l2, l3, l4, l5, l6, l7 = _LOG_POLY
    odd = s2 * (l1 + s4 * (l3 + s4 * (l5 + s4 * l7)))
    even = s4 * (l2 + s4 * (l4 + s4 * l6))
    r = odd + even
    half_f_squared = 0.5 * f * f
    return k * _LN2_HI - ((half_f_squared - (s * (half_f_squared + r) + k * _LN2_LO)) - f)


def _ldexp(fraction: float, exponent: int) -> float:
    """fraction × 2^exponent, overflowing to ±Inf like Go's math.Ldexp instead of raising."""
    try:
        return math.ldexp(fraction, exponent)
    except OverflowError:
        return math.copysign(math.inf, fraction)


def go_pow_int(x: float, n: int) -> float:
    """x^n for a whole n ≥ 0 as Go's math.Pow computes it: successive squarings of x's mantissa, the powers of two
    kept aside, so the result can differ from a correctly rounded power in the last bits."""
    if n == 0 or x == 1:
        return 1.0
    if n == 1:
        return x
    product, product_exp = 1.0, 0
    square, square_exp = math.frexp(x)
    while n:
        if abs(square_exp) > (1 << 12):
            product_exp += square_exp
            break
        if n & 1:
            product *= square
            product_exp += square_exp
        square *= square
        square_exp <<= 1
        if square < 0.5:
            square += square
            square_exp -= 1
        n >>= 1
    return _ldexp(product, product_exp)


def go_exp2(x: float) -> float:
    """2^x as Go's math.Exp2 computes it on amd64 (x = k + t with |t| ≤ 1/2, e^(t·ln 2) from a rational
    approximation, then scaled by 2^k)."""
    if math.isnan(x) or x == math.inf:
        return x
    if x == -math.inf or x < -1074.0:
        return 0.0
    if x > 1.0239999999999999e03:
        return math.inf
    k = int(x + 0.5) if x > 0 else int(x - 0.5) if x < 0 else 0
    t = x - float(k)
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    r = hi - lo
    rr = r * r
    p1, p2, p3, p4, p5 = _EXP_POLY
    c = r - rr * (p1 + rr * (p2 + rr * (p3 + rr * (p4 + rr * p5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    return _ldexp(y, k)


def _go_round(x: float) -> int:
    """The VPA helper's round: floor(x + 0.5)."""
    return math.floor(x + 0.5)


def go_duration(ns: int) -> int:
    """A time difference as Go's Time.Sub returns it: saturated to the int64 range of nanoseconds."""
    return min(max(ns, _INT64_MIN), _INT64_MAX)


def _wrap_int64(n: int) -> int:
    """An int64 product as Go computes it (two's complement wrap-around)."""
    return (n + 2**63) % 2**64 - 2**63


def go_round_time(t_ns: int, d_ns: int) -> int:
    """Go's Time.Round(d): the nearest multiple of d counted from the zero time, halves rounding up."""
    if d_ns <= 0:
        return t_ns
    remainder = t_ns % d_ns
    return t_ns - remainder if remainder + remainder < d_ns else t_ns + (d_ns - remainder)


def unix_to_go_ns(unix_ns: int) -> int:
    return unix_ns + UNIX_EPOCH_NS


# --- bucket schemes


class Options(Protocol):
    @property
    def num_buckets(self) -> int: ...
    @property
    def epsilon(self) -> float: ...
    def find_bucket(self, value: float) -> int: ...
    def bucket_start(self, bucket: int) -> float: ...


def _bucket_count(buckets: float) -> int:
    if not math.isfinite(buckets) or buckets + 1 > _INT64_MAX:
        raise HistogramError(f"the options give {buckets} buckets, more than a histogram can hold")
    return math.ceil(buckets) + 1


@dataclass(frozen=True)
class LinearOptions:
    """`num_buckets` buckets of `bucket_size`: bucket b starts at b × bucket_size; the last one is open-ended."""

    num_buckets: int
    bucket_size: float
    epsilon: float

    def find_bucket(self, value: float) -> int:
        scaled = value / self.bucket_size
        if scaled >= self.num_buckets:
            return self.num_buckets - 1
        return int(scaled) if scaled > 0 else 0

    def bucket_start(self, bucket: int) -> float:
        return float(bucket) * self.bucket_size


def linear_options(max_value: float, bucket_size: float, epsilon: float) -> LinearOptions:
    if max_value <= 0.0 or bucket_size <= 0.0 or epsilon <= 0.0:
        raise HistogramError("maxValue and bucketSize must both be positive")
    return LinearOptions(_bucket_count(max_value / bucket_size), bucket_size, epsilon)


_LOG_SLACK: Final = 1e-9
"""How close to a whole number a bucket index computed with the C library's log must be for Go's log to decide it.
Both logs come within an ulp of the true logarithm (below 710, so within 2^-43 of each other); over a log(ratio) of
at least _C_LOG_MIN_LOG_RATIO the quotients then differ by under 3e-11 (the quotient's own rounding included, at
most 7.1e4 / 2^52 more), a thirtieth of the slack."""
_C_LOG_MIN_LOG_RATIO: Final = 0.01
"""Options whose log(ratio) is smaller (ratio < 1.01) always use Go's log: the bound above does not cover them."""
_TABLED_BUCKETS: Final = 4096
"""Options with at most this many buckets keep a table of their bucket starts (the predictors' models ask for one
on every percentile; an integer power each time was a fifth of the nodemetric service's prediction time)."""


@dataclass(frozen=True)
class ExponentialOptions:
    """Bucket 0 is [0, first); bucket b ≥ 1 starts at first × (ratio^b − 1)/(ratio − 1), so each bucket is `ratio`
    times as wide as the one before; the last one is open-ended."""

    num_buckets: int
    first_bucket_size: float
    ratio: float
    epsilon: float
    _starts: tuple[float, ...] = field(init=False, repr=False, compare=False)
    """Every bucket's start, made with the options (empty above _TABLED_BUCKETS buckets): read, not hashed for."""
    _log_ratio: float = field(init=False, repr=False, compare=False)
    _c_log: bool = field(init=False, repr=False, compare=False)
    """Whether find_bucket may take the C library's log first (see _LOG_SLACK)."""

    def __post_init__(self) -> None:
        tabled = self.num_buckets <= _TABLED_BUCKETS
        object.__setattr__(self, "_starts", (0.0, *map(self._start, range(1, self.num_buckets))) if tabled else ())
        object.__setattr__(self, "_log_ratio", go_log(self.ratio))
        object.__setattr__(self, "_c_log", self._log_ratio >= _C_LOG_MIN_LOG_RATIO)

    def find_bucket(self, value: float) -> int:
        if value < self.first_bucket_size:
            return 0
        x = value * (self.ratio - 1) / self.first_bucket_size + 1
        # Go's log in Python is most of a training sample's cost; the C library's differs from it so little that only
        # a quotient within _LOG_SLACK of a whole number (a bucket boundary, the bucket count) could truncate or
        # compare differently: only then is Go's computed (an infinite or NaN quotient fails the test too).
        scaled = math.log(x) / self._log_ratio if self._c_log else math.nan
        if not _LOG_SLACK < scaled % 1.0 < 1.0 - _LOG_SLACK:
            scaled = go_log(x) / self._log_ratio
        if scaled >= self.num_buckets:
            return self.num_buckets - 1
        return int(scaled)

    def bucket_start(self, bucket: int) -> float:
        if self._starts:
            return self._starts[bucket]
        return 0.0 if bucket == 0 else self._start(bucket)

    def _start(self, bucket: int) -> float:
        return self.first_bucket_size * (go_pow_int(self.ratio, bucket) - 1) / (self.ratio - 1)


def exponential_options(max_value: float, first_bucket_size: float, ratio: float, epsilon: float) -> ExponentialOptions:
    if max_value <= 0.0 or first_bucket_size <= 0.0 or ratio <= 1.0 or epsilon <= 0.0:
        raise HistogramError("maxValue, firstBucketSize and epsilon must be > 0.0, ratio must be > 1.0")
    buckets = go_log(max_value * (ratio - 1) / first_bucket_size + 1) / go_log(ratio)
    return ExponentialOptions(_bucket_count(buckets), first_bucket_size, ratio, epsilon)


CPU_OPTIONS: Final = exponential_options(1024, 0.025, 1.0 + BUCKET_SIZE_GROWTH, EPSILON)
"""koordlet's CPU models, in cores: 0.025-core first bucket growing 5 % a bucket up to 1024 cores."""
MEMORY_OPTIONS: Final = exponential_options(1 << 41, 5 << 20, 1.0 + BUCKET_SIZE_GROWTH, EPSILON)
"""koordlet's memory models, in bytes: 5 MiB first bucket growing 5 % a bucket up to 2 TiB."""


# --- histograms


def _safe_subtract(value: float, sub: float, epsilon: float) -> float:
    value -= sub
    return 0.0 if value < epsilon else value


class _Options(msgspec.Struct, gc=False):
    """The histogram's options, its one positional field (the state's fields are keyword-only)."""

    options: Options


_F64: Final = struct.Struct("d")


def _floats(buffer: bytearray) -> memoryview[float]:
    """The weights in `buffer` as float64 items (a view: `buffer` cannot be resized while one is alive)."""
    return memoryview(buffer).cast("d")


class Histogram(_Options, kw_only=True, gc=False):
    """A plain histogram: sample times are ignored.

    The weights are stored densely over the range of buckets used so far (`_lo` is the first), unboxed as native
    float64s in a bytearray: a model's samples fall in a narrow band of buckets, so this is a fraction of a dict's
    memory (the nodemetric service holds two histograms per pod of every node). A bucket outside the range weighs
    0.0, as do the zeros inside it; adding 0.0 or scaling it changes nothing, so the arithmetic is the sparse one's.

    Nothing in it is tracked by Python's cycle collector (gc=False, and a bytearray is never tracked, unlike an
    `array.array`; it holds no cycles): the nodemetric service holds two per pod, over two million at 10,000 nodes ×
    100 pods, and every full collection scanned each of them."""

    _lo: int = 0
    _w: bytearray = msgspec.field(default_factory=bytearray)
    """Native float64s (read and written through `_floats`)."""
    total: float = 0.0
    min_bucket: int = -1
    """-1 until made: the last bucket of the options."""
    max_bucket: int = 0

    def __post_init__(self) -> None:
        if self.min_bucket == -1:
            self.min_bucket = self.options.num_buckets - 1

    @property
    def weights(self) -> dict[int, float]:
        """The non-zero buckets' weights, by bucket."""
        return {self._lo + i: w for i, w in enumerate(_floats(self._w)) if w != 0.0}

    def weight(self, bucket: int) -> float:
        i = bucket - self._lo
        return _F64.unpack_from(self._w, 8 * i)[0] if 0 <= 8 * i < len(self._w) else 0.0

    def add(self, value: float, weight: float, t_ns: int = 0) -> None:
        """Add a sample; `t_ns` (Go time) matters only to a decaying histogram."""
        self._add(value, weight)

    def subtract(self, value: float, weight: float, t_ns: int = 0) -> None:
        self._subtract(value, weight)

    def _add(self, value: float, weight: float) -> None:
        if weight < 0.0:
            raise HistogramError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        # weight() and min()/max() written out, for the same reason
        w, offset = self._w, 8 * (bucket - self._lo)
        if w and 0 <= offset < len(w):
            bucket_weight = _F64.unpack_from(w, offset)[0] + weight
            _F64.pack_into(w, offset, bucket_weight)
        else:
            bucket_weight = weight
            self._set(bucket, bucket_weight)
        self.total += weight
        if bucket_weight >= self.options.epsilon:
            if bucket < self.min_bucket:
                self.min_bucket = bucket
            if bucket > self.max_bucket:
                self.max_bucket = bucket

    def _subtract(self, value: float, weight: float) -> None:
        if weight < 0.0:
            raise HistogramError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        epsilon = self.options.epsilon
        self.total = _safe_subtract(self.total, weight, epsilon)
        self._set(bucket, _safe_subtract(self.weight(bucket), weight, epsilon))
        self._settle_bounds()

    def merge(self, other: Histogram) -> None:
        """Add another histogram's buckets (those between its bounds) and total."""
        if other.options != self.options:
            raise HistogramError("can't merge histograms with different options")
        for bucket, weight in sorted(other.weights.items()):
            if other.min_bucket <= bucket <= other.max_bucket:
                self._set(bucket, self.weight(bucket) + weight)
        self.total += other.total
        self.min_bucket = min(self.min_bucket, other.min_bucket)
        self.max_bucket = max(self.max_bucket, other.max_bucket)

    def is_empty(self) -> bool:
        return self.weight(self.min_bucket) < self.options.epsilon

    def percentile(self, p: float) -> float:
        """The end of the first bucket (from `min_bucket`, before `max_bucket`) where the running weight reaches
        p × total, else of `max_bucket`; the start of the bucket instead when it is the last. 0.0 when empty."""
        # is_empty() and weight(), written out: once per model read by a report
        w, lo, min_bucket, max_bucket, options = self._w, self._lo, self.min_bucket, self.max_bucket, self.options
        first, size = min_bucket - lo, len(w) // 8
        if not 0 <= first < size or _F64.unpack_from(w, 8 * first)[0] < options.epsilon:
            return 0.0
        threshold = p * self.total
        bucket = max(min_bucket, max_bucket)
        stop = min(max_bucket - lo, size)
        if first < stop:
            # the walk from min_bucket to before max_bucket: the running sum, left to right, until it reaches p
            running = 0.0
            for i, weight in enumerate(_floats(w)[first:stop], first):
                running += weight
                if running >= threshold:
                    bucket = lo + i
                    break
        if bucket < options.num_buckets - 1:
            return options.bucket_start(bucket + 1)
        return options.bucket_start(bucket)

    def scale(self, factor: float) -> None:
        """Multiply the weights between the bounds, and the total, by `factor`."""
        if factor < 0.0:
            raise HistogramError("scale factor must be non-negative")
        first = max(self.min_bucket - self._lo, 0)
        stop = min(self.max_bucket - self._lo + 1, len(self._w) // 8)
        if first < stop:
            weights = _floats(self._w)
            for i in range(first, stop):
                weights[i] *= factor
            weights.release()
        self.total *= factor
        self._settle_bounds()

    def _set(self, bucket: int, weight: float) -> None:
        w = self._w
        if not w:
            if weight != 0.0:
                self._lo, self._w = bucket, bytearray(_F64.pack(weight))
            return
        offset = 8 * (bucket - self._lo)
        if 0 <= offset < len(w):
            _F64.pack_into(w, offset, weight)
        elif weight != 0.0:
            if offset < 0:
                self._w = bytearray(_F64.pack(weight)) + bytes(-offset - 8) + w
                self._lo = bucket
            else:  # a new object of the exact size: growing in place would keep an eighth more for further growth
                self._w = w + bytes(offset - len(w)) + _F64.pack(weight)

    def _settle_bounds(self) -> None:
        """Move `min_bucket` up and `max_bucket` down past buckets lighter than epsilon (not beyond the ends)."""
        epsilon = self.options.epsilon
        heavy = [self._lo + i for i, w in enumerate(_floats(self._w)) if w >= epsilon]
        self.min_bucket = next((b for b in heavy if b >= self.min_bucket), self.options.num_buckets - 1)
        self.max_bucket = next((b for b in reversed(heavy) if b <= self.max_bucket), 0)


class DecayingHistogram(Histogram, gc=False):
    """A histogram whose samples lose half their weight every `half_life_ns`, relative to later ones."""

    half_life_ns: int
    reference_ns: int = 0
    """Go time of weight 1 (the zero time until the first sample moves it)."""

    def __post_init__(self) -> None:
        if self.half_life_ns <= 0:
            raise HistogramError("halfLife must be positive")
        super().__post_init__()

    @classmethod
    def restored(
        cls,
        options: Options,
        half_life_ns: int,
        *,
        reference_ns: int,
        total: float,
        min_bucket: int,
        max_bucket: int,
        weights: Iterable[tuple[int, float]],
    ) -> DecayingHistogram:
        """A histogram in a saved state, bit for bit (HistogramError when a bucket lies outside the options)."""
        histogram = cls(options, half_life_ns)
        last = options.num_buckets - 1
        if not (0 <= min_bucket <= last and 0 <= max_bucket <= last):
            raise HistogramError(f"bounds {min_bucket}..{max_bucket} outside the {options.num_buckets} buckets")
        for bucket, weight in weights:
            if not 0 <= bucket <= last:
                raise HistogramError(f"bucket {bucket} outside the {options.num_buckets} buckets")
            histogram._set(bucket, weight)
        histogram.total, histogram.min_bucket, histogram.max_bucket = total, min_bucket, max_bucket
        histogram.reference_ns = _shared_time(reference_ns)
        return histogram

    def add(self, value: float, weight: float, t_ns: int = 0) -> None:
        self._add(value, weight * self._decay_factor(t_ns))

    def subtract(self, value: float, weight: float, t_ns: int = 0) -> None:
        self._subtract(value, weight * self._decay_factor(t_ns))

    def merge(self, other: Histogram) -> None:
        """Bring both to the later reference time (rescaling the other one too, as Go does), then add."""
        if not isinstance(other, DecayingHistogram) or other.half_life_ns != self.half_life_ns:
            raise HistogramError("can't merge decaying histograms with different half life periods")
        if self.reference_ns < other.reference_ns:
            self.shift_reference(other.reference_ns)
        elif other.reference_ns < self.reference_ns:
            other.shift_reference(self.reference_ns)
        super().merge(other)

    def shift_reference(self, t_ns: int) -> None:
        """Move the reference to `t_ns` rounded to a whole number of half-lives, rescaling every weight by
        2^(whole half-lives between the old and the new reference)."""
        new_reference = go_round_time(t_ns, self.half_life_ns)
        exponent = _go_round(float(go_duration(self.reference_ns - new_reference)) / float(self.half_life_ns))
        self.scale(_ldexp(1.0, exponent))
        self.reference_ns = _shared_time(new_reference)

    def _decay_factor(self, t_ns: int) -> float:
        half_life_ns = self.half_life_ns
        if t_ns > self.reference_ns + _horizon(half_life_ns):
            self.shift_reference(t_ns)
        elapsed = t_ns - self.reference_ns
        if not _INT64_MIN <= elapsed <= _INT64_MAX:  # go_duration, its common case written out (twice per model)
            elapsed = go_duration(elapsed)
        return _decay(elapsed, half_life_ns)


@functools.lru_cache(maxsize=16)
def _horizon(half_life_ns: int) -> int:
    """How far past the reference a sample may lie before the reference moves: 100 half-lives, as Go's int64
    product (wrapping around)."""
    return _wrap_int64(half_life_ns * MAX_DECAY_EXPONENT)


@functools.lru_cache(maxsize=64)
def _shared_time(t_ns: int) -> int:
    """One int object for each reference time in use: a Go time is a 40-byte int, and the histograms trained
    together (a node's, every node's in the same half-life) share a handful of references; two of their own cost the
    nodemetric service 80 bytes per model, over a tenth of a model's memory."""
    return t_ns


@functools.lru_cache(maxsize=256)
def _decay(elapsed_ns: int, half_life_ns: int) -> float:
    """2^(elapsed / half-life): the same few per training round (one reference time, one sample time), so kept."""
    return go_exp2(float(elapsed_ns) / float(half_life_ns))


def cpu_histogram(half_life_ns: int = CPU_HALF_LIFE_NS) -> DecayingHistogram:
    return DecayingHistogram(CPU_OPTIONS, half_life_ns)


def memory_histogram(half_life_ns: int = MEMORY_HALF_LIFE_NS) -> DecayingHistogram:
    return DecayingHistogram(MEMORY_OPTIONS, half_life_ns)
