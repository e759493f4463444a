"""What services.nodemetric.histogram does to save time gives Koordinator's answers still: the percentile a histogram
keeps is never stale (after any sequence of adds, subtracts, merges, scalings, reference shifts and restores, each
read equals what a histogram built afresh from the same operations, never asked before, answers), and the bucket of
a value found with the C library's log is the one Go's log gives."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from services.nodemetric import histogram as hist

HOUR_NS = 3600 * hist.SECOND_NS
START = hist.unix_to_go_ns(1_800_000_000 * hist.SECOND_NS)
PS = (0.0, 0.6, 0.9, 0.95, 0.98, 1.0)
OPTIONS = hist.exponential_options(1024, 0.025, 1.05, hist.EPSILON)

Op = Callable[[hist.DecayingHistogram], None]


def _fresh(ops: list[Op]) -> hist.DecayingHistogram:
    h = hist.DecayingHistogram(OPTIONS, HOUR_NS)
    for op in ops:
        op(h)
    return h


def _add(value: float, weight: float, hours: float) -> Op:
    return lambda h: h.add(value, weight, START + int(hours * HOUR_NS))


def _subtract(value: float, weight: float, hours: float) -> Op:
    return lambda h: h.subtract(value, weight, START + int(hours * HOUR_NS))


def _scale(factor: float) -> Op:
    return lambda h: h.scale(factor)


def _shift(hours: float) -> Op:
    return lambda h: h.shift_reference(START + int(hours * HOUR_NS))


def _merge(value: float, hours: float) -> Op:
    def merge(h: hist.DecayingHistogram) -> None:
        other = hist.DecayingHistogram(OPTIONS, HOUR_NS)
        other.add(value, 1.0, START + int(hours * HOUR_NS))
        other.percentile(0.95)  # a kept answer on the other side must not leak into this one either
        h.merge(other)

    return merge


values = st.floats(0.0, 50.0)
hours = st.floats(0.0, 300.0)  # past 100 half-lives: the reference moves and rescales every weight
operations = st.one_of(
    st.builds(_add, values, st.floats(0.0, 5.0), hours),
    st.builds(_subtract, values, st.floats(0.0, 5.0), hours),
    st.builds(_scale, st.sampled_from([0.0, 0.5, 2.0**-40, 3.0])),
    st.builds(_shift, hours),
    st.builds(_merge, values, hours),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(operations, min_size=1, max_size=12), st.lists(st.sampled_from(PS), min_size=1, max_size=3))
def test_every_read_equals_a_fresh_histograms(ops: list[Op], reads: list[float]) -> None:
    h = hist.DecayingHistogram(OPTIONS, HOUR_NS)
    for done, op in enumerate(ops, start=1):
        op(h)
        fresh = _fresh(ops[:done])
        for p in reads:  # twice: the second read is the kept one
            assert h.percentile(p) == fresh.percentile(p)
            assert h.percentile(p) == fresh.percentile(p)


def test_train_read_train_more_read() -> None:
    h = hist.cpu_histogram()
    h.add(1.0, 1.0, START)
    assert h.percentile(0.95) == OPTIONS.bucket_start(23)
    for minute in range(1, 30):  # heavier usage later: the p95 moves up
        h.add(2.0, 1.0, START + minute * 60 * hist.SECOND_NS)
    fresh = hist.cpu_histogram()
    fresh.add(1.0, 1.0, START)
    for minute in range(1, 30):
        fresh.add(2.0, 1.0, START + minute * 60 * hist.SECOND_NS)
    assert h.percentile(0.95) == fresh.percentile(0.95) > OPTIONS.bucket_start(23)


def test_a_reference_shift_that_drops_old_weight_changes_the_answer() -> None:
    h = hist.DecayingHistogram(OPTIONS, HOUR_NS)
    h.add(40.0, 1.0, START)
    h.add(1.0, 1.0, START)
    assert h.percentile(1.0) == OPTIONS.bucket_start(OPTIONS.find_bucket(40.0) + 1)
    # 101 half-lives on, the first two samples fall below epsilon: only the new one counts
    h.add(1.0, 1.0, START + 101 * HOUR_NS)
    assert h.percentile(1.0) == OPTIONS.bucket_start(OPTIONS.find_bucket(1.0) + 1)


def test_a_restored_histogram_answers_its_own_state() -> None:
    h = hist.DecayingHistogram(OPTIONS, HOUR_NS)
    h.add(3.0, 1.0, START)
    restored = hist.DecayingHistogram.restored(
        OPTIONS,
        HOUR_NS,
        reference_ns=h.reference_ns,
        total=h.total,
        min_bucket=h.min_bucket,
        max_bucket=h.max_bucket,
        weights=h.weights.items(),
    )
    assert restored.percentile(0.9) == h.percentile(0.9) == OPTIONS.bucket_start(OPTIONS.find_bucket(3.0) + 1)


def _go_bucket(options: hist.ExponentialOptions, value: float) -> int:
    """find_bucket as Koordinator computes it, Go's log for every value."""
    if value < options.first_bucket_size:
        return 0
    scaled = hist.go_log(value * (options.ratio - 1) / options.first_bucket_size + 1) / hist.go_log(options.ratio)
    return options.num_buckets - 1 if scaled >= options.num_buckets else int(scaled)


def _ulps(x: float, n: int) -> float:
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


def test_the_bucket_of_a_value_is_the_one_gos_log_gives_even_at_a_boundary() -> None:
    """find_bucket takes the C library's log unless the quotient lies near a whole number: around every boundary
    (where the quotient crosses one, ulps apart and at the slack's distance either side) and at random values
    it agrees with Go's log alone."""
    rng = random.Random(3)
    fine = hist.exponential_options(100, 0.5, 1.001, hist.EPSILON)  # ratio < 1.01: Go's log throughout
    for options in (hist.CPU_OPTIONS, hist.MEMORY_OPTIONS, OPTIONS, fine):
        values = [rng.uniform(0, options.bucket_start(options.num_buckets - 1) * 1.1) for _ in range(2000)]
        for b in range(1, options.num_buckets + 1, max(1, options.num_buckets // 200)):
            # the value whose quotient is exactly b, as far as float64 goes
            edge = (math.exp(b * hist.go_log(options.ratio)) - 1) * options.first_bucket_size / (options.ratio - 1)
            values += [_ulps(edge, n) for n in range(-4, 5)]
            values += [edge * (1 + d) for d in (-1e-9, -3e-11, -1e-11, 1e-11, 3e-11, 1e-9)]
        values += [options.first_bucket_size, math.inf, 1e308]
        assert [options.find_bucket(v) for v in values] == [_go_bucket(options, v) for v in values]
