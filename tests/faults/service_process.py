"""A `koordbus service <name>` subprocess for the dependency-fault tests: started, probed over HTTP, stopped.

Output goes to a log file (a pipe nobody reads would fill and block the process); failures quote its tail.
Used by tests/faults/test_postgres_outage.py and tests/faults/test_slow_kube_api.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx

from bus.cluster import free_port

STOP_TIMEOUT_SECONDS = 20.0
LOG_TAIL_CHARS = 4000


class ServiceProcess:
    """One service process with its HTTP port (/healthz, /readyz, /metrics)."""

    def __init__(self, name: str, *args: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = log_dir / f"{name}.log"
        self._command = [sys.executable, "-m", "koordbus.cli", "service", name, *args, "--port", str(self.port)]
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.STDOUT, env=self._env)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]

    def describe(self) -> str:
        """For assertion messages: whether it runs (or its exit code) and the end of its log."""
        state = "running" if self.running else f"exited with {self._process.returncode if self._process else None}"
        return f"koordbus service {self.name} ({state}); log tail:\n{self.log_tail()}"

    async def readyz(self, client: httpx.AsyncClient) -> tuple[int, dict[str, object]]:
        """(status code, JSON body) of /readyz; (0, {}) when nothing answers on the port."""
        try:
            response = await client.get(f"{self.base_url}/readyz", timeout=5.0)
        except httpx.TransportError:
            return 0, {}
        return response.status_code, dict(response.json())

    async def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL after STOP_TIMEOUT_SECONDS); returns the exit code, None if never started."""
        process = self._process
        if process is None:
            return None
        try:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(process.wait, STOP_TIMEOUT_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
                    await asyncio.to_thread(process.wait)
            return process.returncode
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
