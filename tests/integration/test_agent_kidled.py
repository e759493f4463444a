"""The agent's hot-page memory (spec §1.4) on generated trees: a cgroup v1 node whose root memory cgroup has a
kidled `memory.idle_page_stats` publishes memory_with_hot_page samples with the right value; without the file,
with a broken one, and on cgroup v2 (which is never asked for it) there are none and collection carries on."""

from __future__ import annotations

import gc
import logging
import os
import warnings
from pathlib import Path

import msgspec
import pytest

from agent import collect, core
from agent.service import AgentService
from schemas.node import NodeMetricsReported
from tests.cgroup_tree import FakeCgroupTree, render_idle_page_stats
from tests.integration.test_agent_collect import FakeTime, FlakyPublisher, build_tree, settings_for

START = 1_700_000_000.0
# Cold = buckets 5.. of the four inactive file-page rows; the active (cfea) and anonymous (csei) rows never count.
ROWS = {
    "cfei": [4096, 0, 0, 0, 0, 1_000_000, 2_000_000, 30_000_000],
    "dfei": [0, 0, 0, 0, 0, 0, 0, 8192],
    "cfui": [0, 0, 0, 0, 777, 0, 40_960, 0],
    "dfui": [0, 0, 0, 0, 0, 12_288, 0, 0],
    "cfea": [0, 0, 0, 0, 0, 0, 0, 999_999_999],
    "csei": [0, 0, 0, 0, 0, 0, 0, 888_888_888],
}
COLD = 1_000_000 + 2_000_000 + 30_000_000 + 8192 + 40_960 + 12_288


def used_with_page_cache(tree: FakeCgroupTree) -> int:
    return (tree.proc.mem_total_kb - tree.proc.mem_free_kb) * 1024


async def run_service(tree: FakeCgroupTree, seconds: int) -> list[NodeMetricsReported]:
    fake = FakeTime(tree, start=START)
    publisher = FlakyPublisher()
    service = AgentService(settings_for(tree), publisher, clock=fake.clock, sleep=fake.sleep)
    for _ in range(seconds):
        await service.collect_once()
        await fake.sleep(1.0)
    assert service.stats.collect_errors == 0
    return [msgspec.msgpack.decode(d, type=NodeMetricsReported) for s, d, _ in publisher.sent if s.endswith(".metrics")]


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
async def test_v1_node_with_kidled_publishes_hot_page_samples(tmp_path: Path, driver: str) -> None:
    tree = build_tree(tmp_path, 1, driver)
    tree.idle_page_stats = render_idle_page_stats(ROWS)
    tree.write()
    assert (tree.cgroup_root / "memory" / "memory.idle_page_stats").is_file()
    assert collect.Collector(settings_for(tree))(START).cold_page_bytes == COLD

    batches = await run_service(tree, 21)
    assert [b.window_start for b in batches] == [START, START + 10]
    for batch in batches:
        assert batch.memory_with_hot_page, "every window of a kidled node has hot-page samples"
        assert [t for t, _ in batch.memory_with_hot_page] == [s[0] for s in batch.node_samples]
        assert {mem for _, mem in batch.memory_with_hot_page} == {used_with_page_cache(tree) - COLD}
        assert [m for _, m in batch.memory_with_page_cache] == [used_with_page_cache(tree)] * len(batch.node_samples)


async def test_hot_page_follows_the_file_as_kidled_rescans(tmp_path: Path) -> None:
    tree = build_tree(tmp_path, 1, "cgroupfs")
    tree.idle_page_stats = render_idle_page_stats(ROWS)
    tree.write()
    collector, sampler = collect.Collector(settings_for(tree)), core.Sampler()
    assert sampler.observe(collector(START)).node_memory_with_hot_page == used_with_page_cache(tree) - COLD
    tree.idle_page_stats = render_idle_page_stats({**ROWS, "cfei": [0] * 7 + [123 * 4096]})
    tree.proc.mem_free_kb -= 1024
    tree.write()
    tick = sampler.observe(collector(START + 1))
    assert tick.node_memory_with_hot_page == used_with_page_cache(tree) - (COLD - 33_000_000 + 123 * 4096)


@pytest.mark.parametrize("version", [1, 2])
async def test_without_the_file_there_are_no_hot_page_samples(tmp_path: Path, version: int) -> None:
    tree = build_tree(tmp_path, version, "cgroupfs")
    assert collect.Collector(settings_for(tree))(START).cold_page_bytes is None
    batches = await run_service(tree, 12)
    assert batches and all(b.node_samples and b.memory_with_hot_page == [] for b in batches)


async def test_v2_trees_never_read_idle_page_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = build_tree(tmp_path, 2, "systemd")
    tree.idle_page_stats = render_idle_page_stats(ROWS)  # where a v2 root memory cgroup would have it …
    tree.write()
    (tree.cgroup_root / "memory").mkdir()  # … and where a v1 one would
    (tree.cgroup_root / "memory" / "memory.idle_page_stats").write_text(tree.idle_page_stats)
    opened: list[str] = []
    real_read = collect._read_text

    def recording_read(path: str) -> str:
        opened.append(path)
        return real_read(path)

    monkeypatch.setattr(collect, "_read_text", recording_read)
    reading = collect.Collector(settings_for(tree))(START)
    assert reading.cgroup_version == 2 and reading.pods and reading.cold_page_bytes is None
    assert opened and not [p for p in opened if p.endswith("idle_page_stats")]
    batches = await run_service(tree, 12)
    assert batches and all(b.memory_with_hot_page == [] for b in batches)


def break_as_garbage(path: Path) -> None:
    path.write_text("kidled: scan in progress\n")


def break_as_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def break_as_symlink(path: Path) -> None:
    # A file planted as a symlink is refused (O_NOFOLLOW), even when it points at a well-formed copy.
    target = path.parent.parent / "elsewhere"
    target.write_text(path.read_text())
    path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize("breakage", [break_as_garbage, break_as_directory, break_as_symlink])
def test_an_unreadable_file_costs_the_hot_page_sample_of_that_tick_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, breakage: object
) -> None:
    tree = build_tree(tmp_path, 1, "cgroupfs")
    tree.idle_page_stats = render_idle_page_stats(ROWS)
    tree.write()
    path = tree.cgroup_root / "memory" / "memory.idle_page_stats"
    collector, sampler = collect.Collector(settings_for(tree)), core.Sampler()
    assert sampler.observe(collector(START)).node_memory_with_hot_page is not None

    assert callable(breakage)
    breakage(path)
    with warnings.catch_warnings():  # what other tests left to the collector is not this test's business
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()  # collectors of earlier tests close their kept cgroup files when collected: not during the count
    open_fds = len(os.listdir("/proc/self/fd"))
    with caplog.at_level(logging.WARNING, logger="agent.collect"):
        broken = [collector(START + i) for i in (1, 2, 3)]
    assert len(os.listdir("/proc/self/fd")) == open_fds, "a failed read must not leak its descriptor"
    assert all(r.cold_page_bytes is None and len(r.pods) == 3 for r in broken)
    ticks = [sampler.observe(r) for r in broken]
    assert all(t.node is not None and t.node_memory_with_hot_page is None for t in ticks)
    logged = [r for r in caplog.records if "no hot-page memory" in r.getMessage()]
    assert len(logged) == 1, "the same error is logged once, not every tick"

    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    tree.write()  # kidled output is back
    assert collector(START + 4).cold_page_bytes == COLD
