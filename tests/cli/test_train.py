"""`rl-speed train` and `rllib train file` run a real (tiny) training, show progress and write results."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = {"train_batch_size_per_learner": 1024, "minibatch_size": 256, "num_epochs": 1,
        "num_envs_per_env_runner": 16, "rollout_fragment_length": 64}


def _run(cmd: list[str], storage: Path, env: dict) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    args = [str(bin_dir / cmd[0]), *cmd[1:], str(ROOT / "tuned_examples" / "snake_ppo.yaml"),
            "--stop", json.dumps({"training_iteration": 3}), "--config", json.dumps(TINY),
            "--storage-path", str(storage), "--num-cpus", "2"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.mark.parametrize("cmd", [["rl-speed", "train"], ["rllib", "train", "file"]])
def test_train_shows_progress_and_writes_results_and_checkpoint(cmd, tmp_path, cli_env):
    proc = _run(cmd, tmp_path, cli_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    progress = [line for line in lines if line.startswith("snake-ppo | iter")]
    assert [p.split("|")[1].strip() for p in progress] == ["iter 1", "iter 2", "iter 3"], proc.stdout
    assert all("env steps/s" in p and "return" in p for p in progress)
    assert any("env steps/s on average" in line for line in lines)
    trial_dirs = list((tmp_path / "snake-ppo").glob("PPO_*"))
    assert len(trial_dirs) == 1
    rows = list(csv.DictReader(open(trial_dirs[0] / "progress.csv")))
    assert len(rows) == 3 and int(float(rows[-1]["env_runners/num_env_steps_sampled_lifetime"])) >= 3 * 1024
    assert list(trial_dirs[0].glob("events.out.tfevents.*")), "TensorBoard event file missing"
    checkpoint = [line.split("checkpoint:")[1].strip() for line in lines if "checkpoint:" in line]
    assert checkpoint and Path(checkpoint[0]).is_dir() and any(Path(checkpoint[0]).iterdir())


def test_progress_line_shows_where_fastppo_time_goes():
    from rl_speed.cli.train import format_progress, progress_fields

    result = {"training_iteration": 3, "time_this_iter_s": 2.0, "time_total_s": 6.0,
              "env_runners": {"num_env_steps_sampled": 1000, "num_env_steps_sampled_lifetime": 3000,
                              "episode_return_mean": 1.5},
              "rl_speed_profile": {"sample_share": 0.5, "advantages_share": 0.1, "learn_share": 0.38,
                                   "sync_weights_share": 0.02}}
    line = format_progress("x", progress_fields(result))
    assert "500 env steps/s" in line and "time: sample 50%, gae 10%, learn 38%, sync 2%" in line
    assert "game" not in line  # an env that reports no whole games
    del result["rl_speed_profile"]
    assert "time:" not in format_progress("x", progress_fields(result))  # stock algorithms: no profile
    result["env_runners"]["game_return_mean"] = 12.25  # Atari's whole games (an episode may be one life)
    assert "| return 1.500 | game 12.25 | 6 s" in format_progress("x", progress_fields(result))


def test_progress_line_shows_where_fastdqn_time_goes():
    from rl_speed.cli.train import format_progress, progress_fields

    result = {"training_iteration": 3, "time_this_iter_s": 2.0, "time_total_s": 6.0,
              "env_runners": {"num_env_steps_sampled": 1000, "num_env_steps_sampled_lifetime": 3000},
              "rl_speed_profile": {"sample_share": 0.3, "replay_share": 0.2, "learn_share": 0.49,
                                   "sync_weights_share": 0.01}}
    assert "time: sample 30%, replay 20%, learn 49%, sync 1%" in format_progress("x", progress_fields(result))


def test_progress_line_shows_collector_and_replay_monitoring():
    from rl_speed.cli.train import format_progress, progress_fields

    result = {"training_iteration": 3, "time_this_iter_s": 2.0, "time_total_s": 6.0,
              "env_runners": {"num_env_steps_sampled": 1000, "num_env_steps_sampled_lifetime": 3000},
              "learners": {"__all_modules__": {}, "default_policy": {"qf_loss": 0.25, "td_error_mean": 0.5}},
              "replay_buffer": {"size": 45200}, "monitor": {"epsilon": 0.31, "replay_ratio": 2.0},
              "sampler": {"batches_dropped_lifetime": 1, "batches_stale_lifetime": 12, "requests_in_flight": 4}}
    line = format_progress("x", progress_fields(result))
    assert "replay 45,200 | loss 0.25 | td 0.5 | eps 0.31 | ratio 2.0" in line
    assert "batches dropped 1, stale 12, in flight 4" in line
    del result["replay_buffer"], result["sampler"]
    assert "replay" not in format_progress("x", progress_fields(result))
