"""Koordinator's prediction histograms (spec §1.7, CALC-CONTRACT `histogram`): bucket math, percentiles, subtraction,
merging, decay and the Go float64 arithmetic they rest on, against hand-computed numbers."""

from __future__ import annotations

import math
import random

import pytest

from services.nodemetric import histogram as hist

WEIGHT_EPSILON = 1e-15
LINEAR = hist.linear_options(10.0, 1.0, WEIGHT_EPSILON)
"""Buckets [0,1), [1,2) … [9,10) and the open-ended [10, ∞): 11 of them."""
HOUR_NS = 3600 * hist.SECOND_NS
START = hist.unix_to_go_ns(1_234_567_890 * hist.SECOND_NS)
"""2009-02-13T23:31:30Z as Go time."""


def _filled(h: hist.Histogram, samples: list[tuple[float, float]], t: int = 0) -> hist.Histogram:
    for value, weight in samples:
        h.add(value, weight, t)
    return h


# --- bucket schemes


def test_linear_buckets() -> None:
    o = hist.linear_options(5.0, 0.3, 0.001)
    assert o.num_buckets == 18  # ceil(5 / 0.3) + 1
    assert o.bucket_start(0) == 0.0
    assert o.bucket_start(17) == 5.1
    assert [o.find_bucket(v) for v in (-1.0, 0.0, 1.3, 100.0, 1e300)] == [0, 0, 4, 17, 17]
    # 10^10 buckets (stored sparsely); ±1e300 / 1e-300 overflows to ±Inf, which is clamped, not an error.
    tiny = hist.linear_options(1e-290, 1e-300, 0.001)
    assert [tiny.find_bucket(v) for v in (-1e300, 1e300)] == [0, tiny.num_buckets - 1]


def test_exponential_buckets() -> None:
    o = hist.exponential_options(500.0, 40.0, 1.5, 0.001)
    assert o.num_buckets == 6  # ceil(log1.5(500 × 0.5 / 40 + 1)) + 1 = ceil(4.77) + 1
    # 40 × (1.5^b − 1) / 0.5
    assert [o.bucket_start(b) for b in range(6)] == [0.0, 40.0, 100.0, 190.0, 325.0, 527.5]
    assert [o.find_bucket(v) for v in (-1.0, 39.99, 40.0, 100.0, 900.0)] == [0, 0, 1, 2, 5]


def test_koordlet_model_options() -> None:
    # CPU: ceil(ln(1024 × 0.05 / 0.025 + 1) / ln 1.05) + 1 = ceil(156.3) + 1
    assert hist.ExponentialOptions(158, 0.025, 1.05, 0.0001) == hist.CPU_OPTIONS
    # memory: ceil(ln(2^41 × 0.05 / 5 MiB + 1) / ln 1.05) + 1 = ceil(203.95) + 1
    assert hist.ExponentialOptions(205, 5 * 2**20, 1.05, 0.0001) == hist.MEMORY_OPTIONS
    assert hist.EPSILON == 0.001 * 0.1
    assert (hist.CPU_HALF_LIFE_NS, hist.MEMORY_HALF_LIFE_NS) == (12 * HOUR_NS, 24 * HOUR_NS)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: hist.linear_options(0.0, 1.0, 1e-3), "maxValue and bucketSize"),
        (lambda: hist.linear_options(1.0, -1.0, 1e-3), "maxValue and bucketSize"),
        (lambda: hist.linear_options(1.0, 1.0, 0.0), "maxValue and bucketSize"),
        (lambda: hist.exponential_options(1.0, 1.0, 1.0, 1e-3), "ratio must be > 1.0"),
        (lambda: hist.exponential_options(1.0, 0.0, 2.0, 1e-3), "ratio must be > 1.0"),
        (lambda: hist.exponential_options(1.0, 1.0, 2.0, -1.0), "ratio must be > 1.0"),
        (lambda: hist.DecayingHistogram(LINEAR, 0), "halfLife must be positive"),
    ],
)
def test_rejected_options(make: object, message: str) -> None:
    with pytest.raises(hist.HistogramError, match=message):
        make()  # type: ignore[operator]


# --- Go's float64 arithmetic


def test_go_pow_squares_the_mantissa_instead_of_rounding_once() -> None:
    x = 1.05
    assert hist.go_pow_int(x, 4) == (x * x) * (x * x) == 1.21550625
    assert hist.go_pow_int(x, 4) != x**4  # the correctly rounded power is one ulp off
    assert hist.go_pow_int(x, 5) == ((x * x) * (x * x)) * x
    assert [hist.go_pow_int(1.5, n) for n in range(5)] == [1.0, 1.5, 2.25, 3.375, 5.0625]


def test_go_exp2_and_log_stay_within_an_ulp_and_are_exact_where_they_must_be() -> None:
    assert [hist.go_exp2(float(k)) for k in range(-60, 61)] == [2.0**k for k in range(-60, 61)]
    assert hist.go_exp2(-2000.0) == 0.0 and hist.go_exp2(1024.0) == math.inf
    assert hist.go_log(1.0) == 0.0 and hist.go_log(0.0) == -math.inf and math.isnan(hist.go_log(-1.0))
    rng = random.Random(7)
    for _ in range(2000):
        x = rng.uniform(1e-3, 1e9)
        assert abs(hist.go_log(x) - math.log(x)) <= math.ulp(math.log(x))
        y = rng.uniform(-100, 100)
        assert abs(hist.go_exp2(y) - 2.0**y) <= math.ulp(2.0**y)


def test_go_time_round_and_duration() -> None:
    assert hist.go_round_time(START, HOUR_NS) == hist.unix_to_go_ns(1_234_569_600 * hist.SECOND_NS)  # 00:00 next
    half = hist.unix_to_go_ns(1_234_567_800 * hist.SECOND_NS)  # 23:30:00 exactly: halves round up
    assert hist.go_round_time(half, HOUR_NS) == hist.unix_to_go_ns(1_234_569_600 * hist.SECOND_NS)
    assert hist.go_round_time(half - 1, HOUR_NS) == hist.unix_to_go_ns(1_234_566_000 * hist.SECOND_NS)
    assert hist.go_duration(-START) == -(2**63)  # 2009 back to year 1 does not fit in a Go duration
    assert hist.go_duration(2**64) == 2**63 - 1


# --- plain histograms


@pytest.mark.parametrize("p", [-0.5, 0.0, 0.5, 1.0, 1.5])
def test_empty_histogram_answers_zero(p: float) -> None:
    assert hist.Histogram(LINEAR).percentile(p) == 0.0
    assert hist.DecayingHistogram(LINEAR, HOUR_NS).percentile(p) == 0.0


def test_percentile_is_the_end_of_the_bucket_reaching_p_of_the_weight() -> None:
    # {1: 1, 2: 2, 3: 3, 4: 4}: total 10, running sums 1, 3, 6, 10 at buckets 1..4 (ending at 2..5).
    h = _filled(hist.Histogram(LINEAR), [(1, 1), (2, 2), (3, 3), (4, 4)])
    ps = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert [h.percentile(p) for p in ps] == [2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5]
    assert (h.total, h.min_bucket, h.max_bucket) == (10.0, 1, 4)


def test_percentile_out_of_range_gives_the_lowest_and_highest_bucket() -> None:
    o = hist.linear_options(1.0, 0.1, WEIGHT_EPSILON)  # 11 buckets of 0.1, the last one [1.0, ∞)
    h = _filled(hist.Histogram(o), [(0.1, 0.1), (0.2, 0.2)])
    assert h.percentile(-0.1) == pytest.approx(0.2, rel=1e-15)
    assert h.percentile(1.1) == pytest.approx(0.3, rel=1e-15)
    h.add(0.0, 0.1)
    h.add(1.0, 0.2)  # the last bucket: its start, not its end
    assert h.percentile(-0.1) == pytest.approx(0.1, rel=1e-15)
    assert h.percentile(1.1) == 1.0


def test_buckets_lighter_than_epsilon_do_not_count_until_they_add_up() -> None:
    o = hist.linear_options(1.0, 0.1, WEIGHT_EPSILON)
    h = hist.Histogram(o)
    assert h.is_empty()
    h.add(0.1, WEIGHT_EPSILON * 2.5)
    assert not h.is_empty()
    h.subtract(0.1, WEIGHT_EPSILON)  # 1.5 ε left
    assert not h.is_empty()
    h.subtract(0.1, WEIGHT_EPSILON)  # 0.5 ε < ε: cut to 0
    assert h.is_empty() and h.weights == {} and h.total == 0.0
    light = hist.Histogram(o)
    light.add(0.5, WEIGHT_EPSILON * 0.6)
    assert light.is_empty() and (light.min_bucket, light.max_bucket) == (10, 0)
    light.add(0.5, WEIGHT_EPSILON * 0.6)  # 1.2 ε: now bucket 5 counts
    assert not light.is_empty() and (light.min_bucket, light.max_bucket) == (5, 5)


def test_subtract_moves_the_bounds_past_emptied_buckets() -> None:
    h = _filled(hist.Histogram(LINEAR), [(1, 1), (2, 1), (7, 1)])
    h.subtract(1, 1)
    assert (h.min_bucket, h.max_bucket, h.total) == (2, 7, 2.0)
    assert h.percentile(0.0) == 3.0
    h.subtract(7, 0.5)
    assert h.weights == {2: 1.0, 7: 0.5} and h.percentile(1.0) == 8.0
    h.subtract(7, 1.0)  # more than is there: 0
    assert (h.min_bucket, h.max_bucket) == (2, 2) and h.percentile(1.0) == 3.0
    h.subtract(2, 1.0)
    assert h.is_empty() and (h.min_bucket, h.max_bucket) == (10, 0)


def test_negative_weights_are_refused() -> None:
    with pytest.raises(hist.HistogramError, match="non-negative"):
        hist.Histogram(LINEAR).add(1, -1)
    with pytest.raises(hist.HistogramError, match="non-negative"):
        hist.Histogram(LINEAR).subtract(1, -1)


def test_merge_adds_weights_and_widens_the_bounds() -> None:
    h1 = _filled(hist.Histogram(LINEAR), [(1, 1), (2, 1)])
    h2 = _filled(hist.Histogram(LINEAR), [(2, 1), (3, 1)])
    h1.merge(h2)
    expected = _filled(hist.Histogram(LINEAR), [(1, 1), (2, 1), (2, 1), (3, 1)])
    assert (h1.weights, h1.total, h1.min_bucket, h1.max_bucket) == (
        expected.weights,
        expected.total,
        expected.min_bucket,
        expected.max_bucket,
    )
    with pytest.raises(hist.HistogramError):
        h1.merge(hist.Histogram(hist.linear_options(10.0, 2.0, WEIGHT_EPSILON)))


# --- decaying histograms


def test_decay_halves_a_sample_per_half_life() -> None:
    # Weights = values 1..4, one hour apart: relative weights 1/8, 2/4, 3/2, 4 (total 6.125):
    # cumulative shares 2.0 %, 10.2 %, 34.7 %, 100 %.
    h = hist.DecayingHistogram(LINEAR, HOUR_NS)
    for i in range(4):
        h.add(i + 1, i + 1, START + i * HOUR_NS)
    ps = [0.0, 0.02, 0.03, 0.10, 0.11, 0.34, 0.35, 1.0]
    assert [h.percentile(p) for p in ps] == [2, 2, 3, 3, 4, 4, 5, 5]
    # The first sample moved the reference from the zero time to 2009-02-14T00:00:00Z (rounded up from 23:31:30).
    assert h.reference_ns == hist.unix_to_go_ns(1_234_569_600 * hist.SECOND_NS)
    ratios = [h.weights[b] / h.weights[4] for b in (1, 2, 3)]
    assert ratios == pytest.approx([1 / 32, 2 / 16, 3 / 8], rel=1e-15)


def test_without_time_passing_a_decaying_histogram_is_a_plain_one() -> None:
    h = hist.DecayingHistogram(LINEAR, HOUR_NS)
    for i in range(1, 5):
        h.add(i, i, START)
    plain = _filled(hist.Histogram(LINEAR), [(1, 1), (2, 2), (3, 3), (4, 4)])
    ps = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert [h.percentile(p) for p in ps] == [plain.percentile(p) for p in ps]


def test_a_heavy_old_sample_is_outweighed_after_twenty_half_lives() -> None:
    h = hist.DecayingHistogram(LINEAR, HOUR_NS)
    h.add(2, 1000, START)
    h.add(1, 1, START + 20 * HOUR_NS)  # 2^20 × 1 > 1000: the new sample holds 99.9 %
    assert h.percentile(0.999) == 2.0
    assert h.percentile(1.0) == 3.0


def test_more_than_a_hundred_half_lives_later_the_reference_moves_and_old_weight_vanishes() -> None:
    h = hist.DecayingHistogram(LINEAR, HOUR_NS)
    h.add(2, 1, START)
    first_reference = h.reference_ns
    later = START + 101 * HOUR_NS
    h.add(1, 1, later)
    assert h.reference_ns == hist.go_round_time(later, HOUR_NS) == first_reference + 101 * HOUR_NS
    # The old bucket was scaled by 2^-101 (below epsilon, so outside the bounds); the new sample sits 28.5 min
    # before the new reference: weight 2^(-1710/3600).
    assert (h.min_bucket, h.max_bucket) == (1, 1)
    assert h.weights[1] == pytest.approx(2 ** (-1710 / 3600), rel=1e-15)
    assert h.weights[2] < WEIGHT_EPSILON
    assert h.percentile(1.0) == 2.0


def test_subtracting_a_sample_at_its_own_time_removes_it() -> None:
    h = hist.DecayingHistogram(LINEAR, HOUR_NS)
    h.add(3, 1, START)
    h.add(5, 1, START + HOUR_NS)
    h.subtract(5, 1, START + HOUR_NS)
    assert (h.min_bucket, h.max_bucket) == (3, 3)
    assert h.percentile(1.0) == 4.0


def test_decaying_merge_brings_both_to_the_later_reference() -> None:
    h1 = hist.DecayingHistogram(LINEAR, HOUR_NS)
    h1.add(1, 1, START)
    h1.add(2, 1, START + HOUR_NS)
    h2 = hist.DecayingHistogram(LINEAR, HOUR_NS)
    h2.add(2, 1, START + 2 * HOUR_NS)
    h2.add(3, 1, START + HOUR_NS)
    h1.merge(h2)
    expected = hist.DecayingHistogram(LINEAR, HOUR_NS)
    for value, t in ((2, 2), (2, 1), (3, 1), (1, 0)):
        expected.add(value, 1, START + t * HOUR_NS)
    assert h1.reference_ns == expected.reference_ns
    assert h1.weights == pytest.approx(expected.weights, rel=1e-15)
    assert (h1.min_bucket, h1.max_bucket) == (expected.min_bucket, expected.max_bucket)
    with pytest.raises(hist.HistogramError, match="half life"):
        h1.merge(hist.DecayingHistogram(LINEAR, 2 * HOUR_NS))


def test_koordlet_cpu_model_answers_bucket_ends() -> None:
    h = hist.cpu_histogram()
    h.add(1.0, 1.0, START)
    # 1 core: bucket trunc(ln(1 × 0.05 / 0.025 + 1) / ln 1.05) = trunc(22.5) = 22, which ends at
    # 0.025 × (1.05^23 − 1) / 0.05 ≈ 1.0358 cores.
    assert hist.CPU_OPTIONS.find_bucket(1.0) == 22
    assert h.percentile(0.95) == pytest.approx(0.025 * (1.05**23 - 1) / 0.05, rel=1e-14)
    h.add(0.01, 1.0, START)  # below the first bucket size: bucket 0, ending at 0.025
    assert h.percentile(0.5) == 0.025
