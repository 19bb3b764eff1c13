"""Helpers for tests that start their own Ray processes: free ports, and ending exactly those processes by PID."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def token_auth_env(temp_dir: Path) -> dict[str, str]:
    """Token authentication for a test cluster and its clients, with a token of its own: Ray 2.60's `ray start` with
    RAY_AUTH_MODE=token reads a token but never writes one, so on a home directory that has never held
    ~/.ray/auth_token it fails (AuthenticationError). The token is written into the cluster's temp dir and named by
    RAY_AUTH_TOKEN_PATH, which the head, its workers and the `ray job` clients all read."""
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes: 256 random bits
    token.chmod(0o600)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def our_pids(marker: str) -> list[int]:
    """PIDs of live processes whose command line or environment contains ``marker``, plus all their descendants.

    Start Ray with ``RL_SPEED_TEST_CLUSTER=<marker>`` in its environment. Ray renames some processes
    (``ray::DashboardAgent``), which overwrites their command line and environment block, so those are found as
    children of the raylet instead; collect the tree before ending any of it."""
    needle = marker.encode()
    parents: dict[int, int] = {}
    matched = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            if needle in (entry / "cmdline").read_bytes() or needle in (entry / "environ").read_bytes():
                matched.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    found = set(matched)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        grew = bool(children)
        found |= children
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def stop_by_pid(marker: str) -> None:
    """Ends our cluster's processes (found once, tree included): SIGTERM, then SIGKILL for those still alive."""
    pids = our_pids(marker)
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while any(_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.2)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return
