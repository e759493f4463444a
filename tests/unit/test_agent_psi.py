"""PSI parsing and stall ratios (agent.psi, issue 23 point 6): the kernel's pressure files, good, truncated and
garbage; ratios from the `total` counters (none on the first reading, none after a counter reset)."""

from __future__ import annotations

import pytest

from agent import psi
from agent.psi import PsiReading, PsiSampler, PsiTotals, parse_pressure, stall_ratio

NODE_CPU = "some avg10=0.88 avg60=3.83 avg300=12.07 total=413343227\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_a_pressure_file_gives_its_some_and_full_totals() -> None:
    assert parse_pressure(NODE_CPU) == PsiTotals(some=413343227, full=0)


def test_a_file_without_a_full_line_has_no_full_total() -> None:
    # the node's cpu file before Linux 5.13
    assert parse_pressure("some avg10=1.00 avg60=0.50 avg300=0.10 total=12\n") == PsiTotals(some=12, full=None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no some line"),
        ("full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n", "no some line"),
        ("some avg10=0.88 avg60=3.83 avg300=12.07 tot", "not key=value"),
        ("some avg10=0.88 avg60=3.83 avg300=12.07\n", "no total="),
        ("some avg10=0.88 avg60=3.83 total=5\n", "no avg300="),
        ("some avg10=0.88 avg60=3.83 avg300=12.07 total=-5\n", "not a count"),
        ("some avg10=0.88 avg60=3.83 avg300=12.07 total=1e9\n", "not a count"),
        ("some avg10=0.88 avg60=3.83 avg300=12.07 total=99999999999999999999999\n", "not a count"),
        (NODE_CPU + NODE_CPU, "two some lines"),
        ("\x00\x01garbage\n", "no some line"),
    ],
)
def test_truncated_or_garbage_text_is_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(psi.PsiParseError, match=reason):
        parse_pressure(text)


def test_a_stall_ratio_is_the_counter_delta_over_the_wall_time() -> None:
    assert stall_ratio(1_000_000, 1_250_000, wall_seconds=1.0) == pytest.approx(0.25)
    assert stall_ratio(0, 500_000, wall_seconds=2.0) == pytest.approx(0.25)
    assert stall_ratio(0, 3_000_000, wall_seconds=2.0) == 1.0  # clamped: read at slightly different instants
    assert stall_ratio(None, 5, wall_seconds=1.0) is None  # first reading
    assert stall_ratio(5, None, wall_seconds=1.0) is None
    assert stall_ratio(10, 5, wall_seconds=1.0) is None  # counter reset (cgroup recreated)
    assert stall_ratio(5, 10, wall_seconds=0.0) is None


def reading(cpu: tuple[int, int | None] | None, memory: tuple[int, int | None] | None = None) -> PsiReading:
    def totals(pair: tuple[int, int | None] | None) -> PsiTotals | None:
        return None if pair is None else PsiTotals(some=pair[0], full=pair[1])

    return PsiReading(cpu=totals(cpu), memory=totals(memory))


def test_the_sampler_gives_nothing_on_the_first_reading_then_ratios() -> None:
    sampler = PsiSampler()
    assert sampler.observe_node(reading((0, 0), (0, 0)), at=10.0, wall_seconds=0.0) is None
    sample = sampler.observe_node(reading((500_000, None), (100_000, 50_000)), at=11.0, wall_seconds=1.0)
    assert sample is not None
    assert sample.t == 11.0
    assert sample.values() == pytest.approx((0.5, None, 0.1, 0.05, None, None))


def test_a_counter_that_went_back_gives_no_ratio_and_a_new_baseline() -> None:
    sampler = PsiSampler()
    sampler.observe_node(reading((1_000_000, 0)), at=1.0, wall_seconds=0.0)
    assert sampler.observe_node(reading((10, 0)), at=2.0, wall_seconds=1.0) is not None  # full still advances (0)
    after = sampler.observe_node(reading((20, 0)), at=3.0, wall_seconds=1.0)
    assert after is not None and after.cpu_some == pytest.approx(10 / 1e6)
    only_some = PsiSampler()
    only_some.observe_node(reading((1_000_000, None)), at=1.0, wall_seconds=0.0)
    assert only_some.observe_node(reading((10, None)), at=2.0, wall_seconds=1.0) is None  # nothing to say: no zeros


def test_absent_files_give_no_sample_never_zeros() -> None:
    sampler = PsiSampler()
    assert sampler.observe_node(None, at=1.0, wall_seconds=0.0) is None
    assert sampler.observe_node(None, at=2.0, wall_seconds=1.0) is None
    assert sampler.observe_node(PsiReading(), at=3.0, wall_seconds=1.0) is None
    assert sampler.observe_node(PsiReading(), at=4.0, wall_seconds=1.0) is None


def test_pods_are_sampled_by_uid_and_forgotten_when_gone() -> None:
    sampler = PsiSampler()
    assert sampler.observe_pods([("a", reading((0, 0))), ("b", None)], at=1.0, wall_seconds=0.0) == {}
    got = sampler.observe_pods([("a", reading((200_000, 0))), ("b", reading((0, 0)))], at=2.0, wall_seconds=1.0)
    assert set(got) == {"a"}
    assert got["a"].cpu_some == pytest.approx(0.2)
    assert sampler.observe_pods([("b", reading((100_000, 0)))], at=3.0, wall_seconds=1.0)["b"].cpu_some == (
        pytest.approx(0.1)
    )
    # "a" was missing from the last reading: it starts again without a ratio
    assert "a" not in sampler.observe_pods([("a", reading((900_000, 0)))], at=4.0, wall_seconds=1.0)
