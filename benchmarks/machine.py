"""The machine a benchmark ran on, for its results file: the CPU's model name."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
