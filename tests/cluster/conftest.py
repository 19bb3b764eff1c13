"""A real Ray head with the dashboard, started with `ray start` for the cluster tests, and stopped by PID.

Every port is picked free and the temp dir is private, so the head never collides with another Ray on this machine.
At the end only the processes whose command line names our temp dir are ended: `ray stop` would end every Ray
process on the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray_processes import BIN, free_port, stop_by_pid, token_auth_env


@dataclass
class RayHead:
    address: str  # GCS address for ray.init / workers
    dashboard: str  # http://127.0.0.1:PORT for `ray job submit`
    metrics: str  # http://127.0.0.1:PORT/metrics (Prometheus)
    temp_dir: Path
    env: dict

    def ray(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env)


@pytest.fixture(scope="session")
def ray_head():
    # Short path: Ray's Unix sockets live under the temp dir and must stay under ~107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="rsh", dir="/tmp"))
    ports = {name: free_port() for name in ("port", "dashboard-port", "metrics-export-port", "ray-client-server-port",
                                             "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                             "runtime-env-agent-port", "node-manager-port", "object-manager-port")}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Token authentication on, for the head and for every client (`ray job ...`), with the cluster's own token (so a
    # fresh home directory works too). Clients without RAY_AUTH_MODE=token send none and get 401.
    env.update(token_auth_env(temp_dir))
    env["RL_SPEED_TEST_CLUSTER"] = str(temp_dir)  # how stop_by_pid finds every process of this cluster
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `rl-speed` on the job drivers' PATH
    args = [str(BIN / "ray"), "start", "--head", f"--temp-dir={temp_dir}", "--num-cpus=2", "--num-gpus=0",
            "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--disable-usage-stats",
            "--min-worker-port=0", "--max-worker-port=0", *[f"--{k}={v}" for k, v in ports.items()]]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env)
    if proc.returncode != 0:
        stop_by_pid(str(temp_dir))
        pytest.fail(f"ray start failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    head = RayHead(address=f"127.0.0.1:{ports['port']}", dashboard=f"http://127.0.0.1:{ports['dashboard-port']}",
                   metrics=f"http://127.0.0.1:{ports['metrics-export-port']}/metrics", temp_dir=temp_dir, env=env)
    try:
        deadline = time.time() + 120
        while True:  # the dashboard's job API comes up a little after `ray start` returns
            try:
                urllib.request.urlopen(head.dashboard + "/api/version", timeout=5)
                break
            except urllib.error.HTTPError:  # answered (e.g. 401 without a token): it is up
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        yield head
    finally:
        stop_by_pid(str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
