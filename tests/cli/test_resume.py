"""`rl-speed train --resume`: a FastDQN run stopped with Ctrl-C (SIGINT) continues from its last checkpoint, with the
replay buffer and the lifetime counters restored: no env step counted twice or lost; a wrong path is a clear error."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
RL_SPEED = str(Path(sys.executable).parent / "rl-speed")


def _experiment_file(tmp_path: Path) -> Path:
    spec = yaml.safe_load(open(ROOT / "tuned_examples" / "cartpole_fastdqn.yaml"))
    spec["cartpole-fastdqn"]["stop"] = {"training_iteration": 12}
    spec["cartpole-fastdqn"]["checkpoint_config"] = {"checkpoint_frequency": 2, "checkpoint_at_end": True}
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _rows(trial: Path) -> list[dict]:
    """Tune's result.json lines. (Not progress.csv: after a restore Tune appends rows to it under the first run's
    header although the key order differs, so its columns no longer line up.)"""
    return [json.loads(line) for line in open(trial / "result.json") if line.strip()]


@pytest.mark.slow  # two CLI starts and 12 iterations: about 55 s, in CI's slow selection
@pytest.mark.ci
def test_stopped_run_resumes_from_its_last_checkpoint(tmp_path, cli_env):
    path, storage = _experiment_file(tmp_path), tmp_path / "results"
    first = subprocess.Popen([RL_SPEED, "train", str(path), "--storage-path", str(storage), "--num-cpus", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env, cwd=ROOT)
    experiment = storage / "cartpole-fastdqn"
    deadline = time.time() + 300
    while time.time() < deadline and not list(experiment.glob("*/checkpoint_000001")):
        time.sleep(0.5)  # wait for the second checkpoint (iteration 4)
    assert list(experiment.glob("*/checkpoint_000001")), "no checkpoint appeared"
    first.send_signal(signal.SIGINT)  # what Ctrl-C does
    out, _ = first.communicate(timeout=120)
    (trial,) = [p for p in experiment.iterdir() if p.is_dir()]
    stopped = _rows(trial)
    assert stopped[-1]["training_iteration"] < 12, out[-2000:]

    resumed = subprocess.run([RL_SPEED, "train", str(path), "--storage-path", str(storage), "--num-cpus", "2",
                              "--resume"], capture_output=True, text=True, timeout=600, env=cli_env, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = _rows(trial)
    assert rows[-1]["training_iteration"] == 12
    by_iteration = {r["training_iteration"]: r for r in rows}  # resumed rows replace the lost ones
    steps = [by_iteration[i]["env_runners"]["num_env_steps_sampled_lifetime"] for i in range(1, 13)]
    per_iteration = [b - a for a, b in zip([0.0] + steps, steps)]
    # Each iteration samples the same amount (min_sample_timesteps_per_iteration / fragment): a resume that
    # double-counted or lost steps would show a jump or a dip in this sequence.
    assert min(per_iteration) > 0 and max(per_iteration) <= 1.5 * min(per_iteration), per_iteration
    # 12 x ~1,000 steps stay below the buffer's capacity, so its size only grows, unless the resume lost it.
    sizes = [by_iteration[i]["replay_buffer"]["size"] for i in range(1, 13)]
    assert all(b > a for a, b in zip(sizes, sizes[1:])), sizes


def test_resume_without_a_run_is_a_clear_error(tmp_path, cli_env):
    proc = subprocess.run([RL_SPEED, "train", str(_experiment_file(tmp_path)), "--storage-path",
                           str(tmp_path / "nothing"), "--resume"], capture_output=True, text=True, timeout=120,
                          env=cli_env, cwd=ROOT)
    assert proc.returncode == 2
    assert "no run of experiment `cartpole-fastdqn` to resume" in proc.stderr and "Fix:" in proc.stderr
