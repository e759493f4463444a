"""bus.api.Distribution keeps a histogram's data with Prometheus's `le` semantics; services.common.observe turns it
into cumulative buckets ending with +Inf."""

from __future__ import annotations

import pytest

from bus.api import Distribution
from services.common.observe import add_distributions, histogram_buckets


def test_a_value_on_a_bound_lands_in_that_bucket_and_values_above_every_bound_overflow() -> None:
    d = Distribution(bounds=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        d.observe(value)
    assert d.counts == [2, 2, 1] and d.count == 5 and d.total == pytest.approx(8.65)
    assert histogram_buckets(d) == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]


def test_adding_keeps_both_sides_and_never_shares_the_live_object() -> None:
    live = Distribution(bounds=(1.0,))
    live.observe(0.5)
    carried = add_distributions({}, {"h": live})
    live.observe(2.0)  # the running consumer keeps observing
    assert carried["h"].counts == [1, 0]
    both = add_distributions(carried, {"h": live})
    assert both["h"].counts == [2, 1] and both["h"].total == pytest.approx(3.0)
    with pytest.raises(ValueError, match="different buckets"):
        live.plus(Distribution(bounds=(2.0,)))
