"""agent.cgroup_watch on a real inotify: a pod directory created under a watched besteffort directory wakes the
waiter, and is watched in turn for its containers' directories; files do not count; a directory that is not there
cannot be watched, and says why."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.cgroup_watch import CgroupWatch


async def _woken(watch: CgroupWatch) -> bool:
    try:
        await asyncio.wait_for(watch.created.wait(), 2)
    except TimeoutError:
        return False
    watch.created.clear()
    return True


async def test_pod_and_container_directories_wake_the_waiter(tmp_path: Path) -> None:
    be = tmp_path / "cpu/kubepods/besteffort"
    be.mkdir(parents=True)
    watch = CgroupWatch([str(be)])
    assert watch.available and watch.watched == 1
    watch.start(asyncio.get_running_loop())
    try:
        (be / "cpu.shares").write_text("2\n")  # a file: no wake-up
        (be / "pod1").mkdir()
        assert await _woken(watch)
        assert watch.watched == 2  # the pod directory, for its containers
        (be / "pod1" / "container1").mkdir()
        assert await _woken(watch)
        assert watch.watched == 2  # containers' directories are not watched further
        (tmp_path / "staged").mkdir()
        (tmp_path / "staged").rename(be / "pod2")  # moved in whole counts as made there
        assert await _woken(watch)
        assert watch.watched == 3
    finally:
        watch.close()
    assert not watch.available


def test_a_missing_directory_cannot_be_watched_and_says_why(tmp_path: Path) -> None:
    watch = CgroupWatch([str(tmp_path / "nope")])
    assert not watch.available and "nope" in watch.reason
