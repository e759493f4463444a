"""Processes the benchmarks share: a `koordbus service …` pinned to one CPU, keeping the rest off that CPU, and
the tail of a log for error messages. Used by bench/nodemetric_ingest.py, bench/noderesource.py and
bench/compare_prometheus.py (which pins Prometheus the same way)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

log = logging.getLogger("bench.processes")

SERVICE_STOP_TIMEOUT_SECONDS = 30.0


def pin_away_from(cpu: int) -> None:
    """Keep this process and every child it starts from now on (nats-server, load generators) off `cpu`."""
    others = os.sched_getaffinity(0) - {cpu}
    if others:
        os.sched_setaffinity(0, others)
    else:
        log.warning("only one CPU: the service shares it with nats-server and the load generators")


@contextlib.contextmanager
def pinned_service(arguments: Sequence[str], *, cpu: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`koordbus service <arguments>` pinned to `cpu`, output to `log_path`; SIGTERM (then SIGKILL) on the way out."""
    command = [sys.executable, "-m", "koordbus.cli", "service", *arguments]
    with pinned_process(command, cpu=cpu, log_path=log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}) as process:
        yield process


@contextlib.contextmanager
def pinned_process(
    command: Sequence[str], *, cpu: int, log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Any `command` pinned to `cpu`, output to `log_path`; SIGTERM (then SIGKILL) on the way out."""
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops the process after its load
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=SERVICE_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: killing it", command[0], SERVICE_STOP_TIMEOUT_SECONDS)
                process.kill()
                process.wait()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
