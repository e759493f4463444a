"""The agent's small state files under --state-dir (its last good NodeSLO, the sysctls' original values): written
whole or not at all (a temporary file in the same directory, then a rename), so a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def save_json(path: str, value: Any, *, prefix: str) -> None:
    """Write `value` as JSON to `path` atomically, making its directory if needed; OSError when it cannot."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
