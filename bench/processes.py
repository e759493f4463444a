"""Processes the benchmarks share: a `koordbus service …` pinned to one CPU, keeping the rest off that CPU, the
tail of a log for error messages, the CPUs and instance names of a service's replicas, `run_bench` and
`run_pinned_bench`, the entry points of the benchmarks (Ctrl-C and SIGTERM stop them), and `pause`, the wait of their
long phases.
Used by bench/nodemetric_ingest.py, bench/noderesource.py and bench/compare_prometheus.py (which pins Prometheus
the same way)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.processes")

SERVICE_STOP_TIMEOUT_SECONDS = 30.0

_interrupted = False
"""Ctrl-C or SIGTERM arrived (run_bench): checked by `pause`, since one cancellation of the benchmark's task can be
lost — Python 3.11's asyncio.wait_for returns its inner result when that completes as the cancellation arrives, and
nats-py waits for every request so; CI once saw a Ctrl-C during a warm-up answered by a measured minute."""


async def pause(seconds: float) -> None:
    """asyncio.sleep, which also raises CancelledError when the benchmark was interrupted, before or during it."""
    if _interrupted:
        raise asyncio.CancelledError("interrupted")
    await asyncio.sleep(seconds)
    if _interrupted:
        raise asyncio.CancelledError("interrupted")


def pin_away_from(cpu: int) -> None:
    """Keep this process and every child it starts from now on (nats-server, load generators) off `cpu`."""
    others = os.sched_getaffinity(0) - {cpu}
    if others:
        os.sched_setaffinity(0, others)
    else:
        log.warning("only one CPU: the service shares it with nats-server and the load generators")


@contextlib.contextmanager
def pinned_service(
    arguments: Sequence[str], *, cpu: int, log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`koordbus service <arguments>` pinned to `cpu`, output to `log_path`, with `env` added to this process's
    environment (e.g. KOORDBUS_INSTANCE for a replica); SIGTERM (then SIGKILL) on the way out."""
    command = [sys.executable, "-m", "koordbus.cli", "service", *arguments]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with pinned_process(command, cpu=cpu, log_path=log_path, env=environment) as process:
        yield process


@contextlib.contextmanager
def pinned_process(
    command: Sequence[str], *, cpu: int | None, log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Any `command` pinned to `cpu` (None: not pinned), output to `log_path`; SIGTERM (then SIGKILL) on the way
    out."""
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops the process after its load
            preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}),
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


def replica_cpus(service_cpu: int, cpus: Sequence[int], replicas: int) -> list[int]:
    """The CPU of each of `replicas` service processes: `service_cpu`, then the other `cpus` from the highest down."""
    return [service_cpu, *sorted(set(cpus) - {service_cpu}, reverse=True)][:replicas]


def replica_instances(replicas: int) -> list[str]:
    """Each service process's KOORDBUS_INSTANCE: none when it runs alone, else a name per replica."""
    return [""] if replicas == 1 else [f"bench-{i}" for i in range(replicas)]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _interruptible(main: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`main`, cancelled on Ctrl-C and SIGTERM (the flag `pause` reads set too)."""
    task = asyncio.current_task()
    assert task is not None

    def interrupt() -> None:
        global _interrupted
        _interrupted = True
        task.cancel()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    return await main


def run_pinned_bench(
    args: argparse.Namespace, run: Callable[[argparse.Namespace, Path], Awaitable[dict[str, Any]]]
) -> int:
    """Keep this process off `args.service_cpu`, then `run_bench`."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    pin_away_from(args.service_cpu)
    return run_bench(args, run)


def run_bench(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, Path], Awaitable[dict[str, Any]]],
    *,
    prefix: str = "koordbus-bench-",
) -> int:
    """Run `run(args, workdir)` in a temporary directory (kept with `args.keep`) and print its one JSON line; 130 on
    Ctrl-C or SIGTERM turned into a cancellation (everything started has been stopped by then)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        line = asyncio.run(_interruptible(run(args, workdir)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log.warning("interrupted; everything started has been stopped")
        return 130
    finally:
        if args.keep:
            log.info("kept %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(line), flush=True)
    return 0
