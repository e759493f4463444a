"""agent.kidled and its use in agent.core: the `memory.idle_page_stats` parser, the cold-page sum, the hot-page
formula (spec §1.4), and the hot-page samples the Sampler and BatchBuilder carry into NodeMetricsReported."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import core, kidled
from agent.batch import BatchBuilder
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported, encode_node_event

# The sample file of the brief, as kidled prints it for the root memory cgroup (values in bytes).
SAMPLE = """\
# version: 1.0
# page_scans: 24
# slab_scans: 0
# scan_period_in_seconds: 120
# use_hierarchy: 1
# buckets: 1,2,5,15,30,60,120,240
#
#   _-----=> clean/dirty
#  / _----=> swap/file
# | / _---=> evict/unevict
# || / _--=> inactive/active
# ||| / _-=> slab
# |||| /
# |||||             [1,2)          [2,5)         [5,15)        [15,30)        [30,60)       [60,120)      [120,240)     [240,+inf)
  csei                  0              0              0              0              0              0              0              0
  dsei                  0              0              0              0              0              0              0              0
  cfei            2244608        1703936        1687552        1179648         864256         462848        1142784       14069760
  dfei                  0              0              0              0              0              0              0              0
  csui                  0              0              0              0              0              0              0              0
  dsui                  0              0              0              0              0              0              0              0
  cfui                  0              0              0              0              0              0              0              0
  dfui                  0              0              0              0              0              0              0              0
  csea             765952        1536000         804864         548864         483328         274432         487424       8359936
  dsea                  0              0              0              0              0              0              0              0
  cfea            6676480       11595776        2068480        1417216        1220608         594944        2039808       35016704
  dfea                  0              0              0              0              0              0              0              0
  csua                  0              0              0              0              0              0              0              0
  dsua                  0              0              0              0              0              0              0              0
  cfua                  0              0              0              0              0              0              0              0
  dfua                  0              0              0              0              0              0              0              0
  slab                  0              0              0              0              0              0              0              0
"""  # noqa: E501
ZEROS = "0              0              0              0              0              0              0              0"


def with_row(text: str, name: str, values: str) -> str:
    """SAMPLE with row `name` replaced by `values` (the text after the name)."""
    lines = [f"  {name}   {values}" if line.split()[:1] == [name] else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def without_row(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.split()[:1] != [name]) + "\n"


# --- parser


def test_parses_the_sample() -> None:
    stats = kidled.parse_idle_page_stats(SAMPLE)
    assert stats.buckets == (1, 2, 5, 15, 30, 60, 120, 240)
    assert len(stats.rows) == 17 and all(len(v) == 8 for v in stats.rows.values())
    assert stats.rows["cfei"] == (2244608, 1703936, 1687552, 1179648, 864256, 462848, 1142784, 14069760)
    assert stats.rows["cfea"][-1] == 35016704
    assert stats.header["version"] == "1.0"
    assert stats.header["scan_period_in_seconds"] == "120"
    assert "buckets" not in stats.header


def test_whitespace_tabs_crlf_and_blank_lines_do_not_matter() -> None:
    messy = "\r\n".join("\t " + line.replace("  ", " \t ") + "   " for line in SAMPLE.splitlines()) + "\r\n\r\n\n"
    assert kidled.parse_idle_page_stats(messy) == kidled.parse_idle_page_stats(SAMPLE)


def test_rows_other_than_the_file_pages_may_be_missing_or_new() -> None:
    text = without_row(without_row(SAMPLE, "slab"), "csei") + f"  zzzz {ZEROS}\n"
    stats = kidled.parse_idle_page_stats(text)
    assert "slab" not in stats.rows and stats.rows["zzzz"] == (0,) * 8
    assert kidled.cold_page_bytes(stats) == kidled.cold_page_bytes(kidled.parse_idle_page_stats(SAMPLE))


@pytest.mark.parametrize("row", kidled.FILE_PAGE_ROWS)
def test_a_missing_file_page_row_is_an_error_naming_it(row: str) -> None:
    with pytest.raises(kidled.IdlePageStatsError, match=f"file-page rows missing: {row}"):
        kidled.parse_idle_page_stats(without_row(SAMPLE, row))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no '# buckets:' header"),
        ("# version: 1.0\n", "no '# buckets:' header"),
        (with_row(SAMPLE, "cfei", "1 2 3 4 5 6 7 x"), r"line 17: expected a page-type name and byte counts"),
        (with_row(SAMPLE, "dfei", "1 2 3 4 5 6 7 -8"), r"line 18: expected a page-type name"),
        (with_row(SAMPLE, "cfui", "1 2 3 4 5 6 7"), r"line 21: row 'cfui' has 7 buckets, expected 8"),
        (with_row(SAMPLE, "slab", "1 2 3 4 5 6 7 8 9"), r"line 31: row 'slab' has 9 buckets, expected 8"),
        (SAMPLE + "Segmentation fault\n", r"line 32: expected a page-type name and byte counts"),
        (SAMPLE + f"  cfei {ZEROS}\n", r"line 32: row 'cfei' appears twice"),
        (f"  cfei {ZEROS}\n" + SAMPLE, r"line 1: page-type row before the '# buckets:' header"),
        (SAMPLE.replace("# buckets: 1,2,5,15", "# buckets: 1,2,two,15"), r"line 6: buckets must be comma-separated"),
        (SAMPLE.replace("# buckets: 1,2,5,15", "# buckets: 1,5,2,15"), r"line 6: buckets must be strictly increasing"),
        (SAMPLE.replace("# buckets: 1,2,5,15,30,60,120,240", "# buckets:"), r"line 6: buckets must be comma"),
    ],
)
def test_malformed_files_are_value_errors_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kidled.parse_idle_page_stats(text)


# --- cold page bytes


def test_cold_bytes_of_the_sample_at_the_default_boundary() -> None:
    stats = kidled.parse_idle_page_stats(SAMPLE)
    # Buckets 5, 6 and 7 ([60,120), [120,240), [240,+inf)) of cfei; dfei, cfui and dfui are all zero there.
    # csea and cfea hold far more old bytes but are anonymous resp. active pages: not cold page cache.
    assert kidled.cold_page_bytes(stats) == 462848 + 1142784 + 14069760 == 15675392
    assert kidled.cold_page_bytes(stats, cold_boundary=5) == 15675392


@pytest.mark.parametrize(
    ("boundary", "expected"),
    [
        (0, 2244608 + 1703936 + 1687552 + 1179648 + 864256 + 462848 + 1142784 + 14069760),
        (4, 864256 + 462848 + 1142784 + 14069760),
        (7, 14069760),
        (8, 0),
        (100, 0),
    ],
)
def test_cold_bytes_at_other_boundaries(boundary: int, expected: int) -> None:
    assert kidled.cold_page_bytes(kidled.parse_idle_page_stats(SAMPLE), cold_boundary=boundary) == expected


def test_negative_boundary_is_rejected() -> None:
    with pytest.raises(ValueError, match="cold_boundary"):
        kidled.cold_page_bytes(kidled.parse_idle_page_stats(SAMPLE), cold_boundary=-1)


def test_all_four_file_page_rows_count_and_nothing_else_does() -> None:
    text = SAMPLE
    for name, value in (("dfei", 1000), ("cfui", 20_000), ("dfui", 300_000)):
        text = with_row(text, name, f"9 9 9 9 9 {value} 0 0")
    for name in ("csei", "dsei", "csui", "dsui", "dsea", "dfea", "csua", "dsua", "cfua", "dfua", "slab"):
        text = with_row(text, name, "7 7 7 7 7 7 7 7777777")
    stats = kidled.parse_idle_page_stats(text)
    assert kidled.cold_page_bytes(stats) == 15675392 + 1000 + 20_000 + 300_000
    assert kidled.cold_page_bytes(stats, cold_boundary=4) == 15675392 + 864256 + 1000 + 20_000 + 300_000 + 3 * 9


# --- hot page formula


def test_hot_page_memory_is_used_memory_minus_cold_page_cache() -> None:
    mem = core.MemInfo(total_kb=16 * 1024 * 1024, free_kb=6 * 1024 * 1024, available_kb=9 * 1024 * 1024)
    used_with_cache = 10 * 1024 * 1024 * 1024
    assert kidled.node_memory_with_hot_page(mem, 0) == used_with_cache == core.node_memory_with_page_cache(mem)
    assert kidled.node_memory_with_hot_page(mem, 15675392) == used_with_cache - 15675392


def test_hot_page_memory_is_clamped_at_zero() -> None:
    mem = core.MemInfo(total_kb=1000, free_kb=900, available_kb=950)
    assert kidled.node_memory_with_hot_page(mem, 100 * 1024) == 0
    assert kidled.node_memory_with_hot_page(mem, 100 * 1024 + 1) == 0
    assert kidled.node_memory_with_hot_page(mem, 100 * 1024 - 1) == 1


@given(
    total=st.integers(0, 2**40),
    free=st.integers(0, 2**40),
    cold=st.integers(0, 2**50),
)
def test_hot_page_memory_lies_between_zero_and_the_page_cache_variant(total: int, free: int, cold: int) -> None:
    mem = core.MemInfo(total_kb=total, free_kb=free, available_kb=free)
    hot = kidled.node_memory_with_hot_page(mem, cold)
    assert 0 <= hot <= core.node_memory_with_page_cache(mem)
    if cold <= (total - free) * 1024:
        assert hot == (total - free) * 1024 - cold


# --- Sampler and BatchBuilder


def reading(at: float, *, busy: int, cold: int | None, free_kb: int = 4 * 1024 * 1024) -> core.NodeReading:
    return core.NodeReading(
        at=at,
        clock_ticks_per_second=100,
        cpu_count=4,
        cpu=core.CpuTicks(user=busy, nice=0, system=0, idle=10_000),
        memory=core.MemInfo(total_kb=8 * 1024 * 1024, free_kb=free_kb, available_kb=5 * 1024 * 1024),
        cold_page_bytes=cold,
    )


def test_sampler_derives_hot_page_memory_only_from_readings_with_a_cold_count() -> None:
    sampler = core.Sampler()
    first = sampler.observe(reading(100.0, busy=0, cold=1024))
    assert first.node is None and first.node_memory_with_hot_page == 4 * 1024**3 - 1024
    assert sampler.observe(reading(101.0, busy=100, cold=None)).node_memory_with_hot_page is None
    tick = sampler.observe(reading(102.0, busy=200, cold=5 * 1024**3))  # more cold than used: clamped
    assert tick.node is not None and tick.node_memory_with_hot_page == 0


def test_batch_carries_one_hot_page_sample_beside_each_node_sample() -> None:
    sampler, builder = core.Sampler(), BatchBuilder("node-a", interval=10.0)
    colds = {100.0: 111, 101.0: 222, 102.0: None, 103.0: 333}
    for i, (at, cold) in enumerate(colds.items()):
        free_kb = 4 * 1024 * 1024 - i
        assert builder.add(sampler.observe(reading(at, busy=100 * i, cold=cold, free_kb=free_kb))) is None
    batch = builder.close(sent_at=110.0)
    assert batch is not None
    # t=100 has no node sample (no CPU baseline); t=102 had no readable idle_page_stats.
    assert [s[0] for s in batch.node_samples] == [101.0, 102.0, 103.0]
    used = [(4 * 1024 * 1024 + i) * 1024 for i in range(4)]
    assert batch.memory_with_hot_page == [(101.0, used[1] - 222), (103.0, used[3] - 333)]
    decoded = NODE_EVENT_DECODER.decode(encode_node_event(batch))
    assert isinstance(decoded, NodeMetricsReported) and decoded.memory_with_hot_page == batch.memory_with_hot_page
    # The builder starts empty: the next window must not inherit this one's hot-page samples.
    builder.add(sampler.observe(reading(111.0, busy=500, cold=None)))
    next_batch = builder.close(sent_at=120.0)
    assert next_batch is not None and next_batch.memory_with_hot_page == []


def test_without_kidled_batches_have_no_hot_page_samples() -> None:
    sampler, builder = core.Sampler(), BatchBuilder("node-a", interval=10.0)
    for i in range(5):
        builder.add(sampler.observe(reading(100.0 + i, busy=50 * i, cold=None)))
    batch = builder.close(sent_at=110.0)
    assert batch is not None and len(batch.node_samples) == 4 and batch.memory_with_hot_page == []
    assert b"memory_with_hot_page" not in encode_node_event(batch)  # omitted on the wire, as before
