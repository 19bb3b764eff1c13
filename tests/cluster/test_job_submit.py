"""`ray job submit` on a real local Ray head (dashboard on, token authentication on): a short FastPPO training job
succeeds and its logs carry the CLI's readout; a bad YAML submitted the same way ends FAILED with the clear error;
while a job trains, rl_speed's Ray metrics appear on the cluster's Prometheus endpoint."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _working_dir(tmp_path: Path) -> Path:
    """What a user ships with --working-dir: the tuned examples (rl_speed itself is installed on the cluster)."""
    work = tmp_path / "job"
    shutil.copytree(ROOT / "tuned_examples", work / "tuned_examples")
    return work


def _submit(head, work: Path, entrypoint: list[str], job_id: str, wait: bool = True):
    args = ["job", "submit", "--address", head.dashboard, "--working-dir", str(work), "--submission-id", job_id]
    if not wait:
        args.append("--no-wait")
    return head.ray(*args, "--", *entrypoint)


def _status(head, job_id: str) -> str:
    proc = head.ray("job", "status", "--address", head.dashboard, job_id)
    out = proc.stdout + proc.stderr  # the CLI reports "Job 'ID' succeeded" through its logger (stderr)
    match = re.search(rf"Job '{job_id}' (pending|running|stopped|succeeded|failed)", out, re.IGNORECASE)
    return match.group(1).upper() if match else out


@pytest.mark.ci
def test_training_job_succeeds_and_bad_yaml_fails_clearly(ray_head, tmp_path):
    assert Path(ray_head.env["RAY_AUTH_TOKEN_PATH"]).read_text()  # token auth is on, with the cluster's own token
    work = _working_dir(tmp_path)
    (work / "bad.yaml").write_text("oops:\n  run: FastPPO\n  env: CartPole-v1\n  config: {num_epoch: 2}\n")
    proc = _submit(ray_head, work, ["rl-speed", "train", "tuned_examples/cartpole_fastppo.yaml",
                                    "--stop", '{"training_iteration": 3}', "--storage-path", "results"], "rl_speed_ok")
    assert _status(ray_head, "rl_speed_ok") == "SUCCEEDED", proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = ray_head.ray("job", "logs", "--address", ray_head.dashboard, "rl_speed_ok").stdout
    assert "cartpole-fastppo: finished" in logs and "env steps/s on average" in logs, logs[-3000:]

    _submit(ray_head, work, ["rl-speed", "train", "bad.yaml"], "rl_speed_bad")
    assert _status(ray_head, "rl_speed_bad") == "FAILED"
    logs = ray_head.ray("job", "logs", "--address", ray_head.dashboard, "rl_speed_bad").stdout
    assert "Error in" in logs and "bad.yaml" in logs and "Fix:" in logs, logs[-3000:]


@pytest.mark.ci
def test_fastppo_metrics_reach_the_prometheus_endpoint(ray_head, tmp_path):
    work = _working_dir(tmp_path)
    _submit(ray_head, work, ["rl-speed", "train", "tuned_examples/cartpole_fastppo.yaml",
                             "--stop", '{"time_total_s": 60}', "--storage-path", "results", "--config",
                             '{"train_batch_size_per_learner": 16384, "minibatch_size": 4096, "num_epochs": 1}'],
            "rl_speed_metrics", wait=False)
    found: dict[str, float] = {}
    deadline = time.time() + 150
    try:
        while time.time() < deadline and len(found) < 3:
            try:
                text = urllib.request.urlopen(ray_head.metrics, timeout=5).read().decode()
            except Exception:
                text = ""
            for name in ("rl_speed_env_steps_per_s", "rl_speed_learner_updates_per_s", "rl_speed_time_share"):
                match = re.search(rf"^\S*{name}\{{[^}}]*algorithm=\"FastPPO\"[^}}]*\}} (\S+)$", text, re.M)
                if match:
                    found[name] = float(match.group(1))
            time.sleep(3)
    finally:
        ray_head.ray("job", "stop", "--address", ray_head.dashboard, "rl_speed_metrics")
    assert set(found) == {"rl_speed_env_steps_per_s", "rl_speed_learner_updates_per_s", "rl_speed_time_share"}, found
    assert found["rl_speed_env_steps_per_s"] > 1000
