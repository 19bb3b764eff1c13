"""Autoscaling on a real (fake multi-node) Ray cluster started from cluster_local.yaml: a FastPPO job that asks for
more env runners than the head has CPUs makes the autoscaler add worker nodes, the run completes, and the nodes
leave after the idle timeout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from ray_processes import BIN, free_port, stop_by_pid, token_auth_env

ROOT = Path(__file__).parents[2]


def _workers(status: str) -> int:
    """Number of active `cpu_worker` nodes in `ray status` output."""
    active = status.split("Active:")[1].split("Pending:")[0] if "Active:" in status else ""
    return sum(int(m.group(1)) for m in re.finditer(r"(\d+)\s+cpu_worker", active))


@pytest.mark.slow
def test_job_scales_the_cluster_out_and_idle_nodes_leave(tmp_path):
    temp_dir = Path(tempfile.mkdtemp(prefix="rsa", dir="/tmp"))
    port, dashboard = free_port(), free_port()
    config = yaml.safe_load(open(ROOT / "cluster_local.yaml"))
    config["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    config_path = tmp_path / "cluster_local.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(token_auth_env(temp_dir))  # its own token: a fresh home directory has none
    env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "RL_SPEED_TEST_CLUSTER": str(temp_dir)})
    ports = [f"--{k}={free_port()}" for k in ("metrics-export-port", "ray-client-server-port",
                                               "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                               "runtime-env-agent-port", "node-manager-port", "object-manager-port")]
    start = subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--num-cpus=1",
         f"--autoscaling-config={config_path}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         "--disable-usage-stats", *ports], capture_output=True, text=True, timeout=180, env=env)
    try:
        assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-2000:]

        def status() -> str:
            return subprocess.run([str(BIN / "ray"), "status", f"--address=127.0.0.1:{port}"], capture_output=True,
                                  text=True, timeout=60, env=env).stdout

        assert _workers(status()) == 0
        job = subprocess.Popen(
            # No --working-dir: the fake nodes share this machine's runtime-env directory, and a node leaving
            # deletes the unpacked working dir under the running driver. Absolute paths do the same job here.
            [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--", "rl-speed",
             "train", str(ROOT / "tuned_examples" / "cartpole_fastppo.yaml"), "--storage-path", str(tmp_path),
             "--stop",
             '{"training_iteration": 4}', "--config",
             '{"num_env_runners": 3, "num_envs_per_env_runner": 16, "train_batch_size_per_learner": 3072}'],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        most = 0
        deadline = time.time() + 400
        while job.poll() is None and time.time() < deadline:
            most = max(most, _workers(status()))
            time.sleep(2)
        out = job.communicate(timeout=60)[0]
        assert "cartpole-fastppo: finished" in out and "FAILED" not in out, out[-3000:]
        assert most >= 2, f"the autoscaler added {most} worker nodes; 4 CPUs needed, the head has 1"
        deadline = time.time() + 180
        while _workers(status()) and time.time() < deadline:
            time.sleep(3)
        assert _workers(status()) == 0, "idle worker nodes did not leave after idle_timeout_minutes"
    finally:
        stop_by_pid(str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
