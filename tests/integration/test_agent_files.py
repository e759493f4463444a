"""agent.files.RootedFiles on a real directory tree: paths confined to the root, and reads that keep descriptors open
between rounds without ever reading through a path that stopped passing the checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.files import PathRejected, RootedFiles


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for pod in ("pod-a", "pod-b"):
        (root / "cpu" / pod).mkdir(parents=True)
        (root / "cpu" / pod / "cpu.shares").write_text("1024\n")
    return root


def test_reads_keep_descriptors_see_rewrites_and_sweep_what_was_not_read(tmp_path: Path) -> None:
    root = tree(tmp_path)
    files = RootedFiles(str(root), max_open=1)
    assert files.read("cpu/pod-a/cpu.shares") == "1024\n"
    assert files.read("cpu/pod-b/cpu.shares") == "1024\n"  # past max_open: read, not kept
    assert set(files._fds) == {"cpu/pod-a/cpu.shares"}
    files.write("cpu/pod-a/cpu.shares", "2\n")  # written through its own descriptor, read through the kept one
    assert files.read("cpu/pod-a/cpu.shares") == "2\n"
    files.sweep()  # read since the last sweep: kept
    assert set(files._fds) == {"cpu/pod-a/cpu.shares"}
    files.sweep()  # not read since: closed
    assert files._fds == {}
    assert files.read("cpu/pod-a/missing") is None


def test_a_kept_descriptor_that_fails_is_opened_again_and_a_gone_file_reads_as_none(tmp_path: Path) -> None:
    root = tree(tmp_path)
    files = RootedFiles(str(root), max_open=8)
    assert files.read("cpu/pod-a/cpu.shares") == "1024\n"
    os.close(files._fds["cpu/pod-a/cpu.shares"])  # as a removed cgroup's descriptor fails (ENODEV)
    assert files.read("cpu/pod-a/cpu.shares") == "1024\n"
    os.close(files._fds["cpu/pod-a/cpu.shares"])
    (root / "cpu/pod-a/cpu.shares").unlink()
    assert files.read("cpu/pod-a/cpu.shares") is None
    assert files._fds == {}
    files.close()


def test_a_directory_swapped_for_a_symlink_is_refused_even_with_a_kept_descriptor(tmp_path: Path) -> None:
    root = tree(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("secret\n")
    files = RootedFiles(str(root), max_open=8)
    assert files.read("cpu/pod-a/cpu.shares") == "1024\n"
    (root / "cpu/pod-a/cpu.shares").unlink()
    (root / "cpu/pod-a").rmdir()
    (root / "cpu/pod-a").symlink_to(outside)
    files.new_round()
    with pytest.raises(PathRejected):
        files.read("cpu/pod-a/cpu.shares")
    with pytest.raises(PathRejected):
        files.write("cpu/pod-a/cpu.shares", "1\n")
    assert (outside / "cpu.shares").read_text() == "secret\n"
    files.close()


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "cpu/../../x", "cpu//x", "cpu/./x", "cpu/x/"])
def test_paths_that_are_not_plain_relative_paths_are_refused(tmp_path: Path, rel: str) -> None:
    files = RootedFiles(str(tree(tmp_path)))
    with pytest.raises(PathRejected):
        files.path(rel)
