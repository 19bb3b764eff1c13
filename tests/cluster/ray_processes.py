"""Helpers for tests that start their own Ray processes: free ports, and ending exactly those processes by PID."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def our_pids(marker: str) -> list[int]:
    """PIDs of live processes whose command line contains ``marker`` (our private temp dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def stop_by_pid(marker: str) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in our_pids(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while our_pids(marker) and time.time() < deadline:
            time.sleep(0.2)
        if not our_pids(marker):
            return
