"""Learning runs (slow): the tuned examples reach the results their YAML files promise."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from rl_speed_envs import SnakeVectorEnv

ROOT = Path(__file__).parents[1]


def mean_return(env, sample_actions, episodes: int, seed: int = 0) -> float:
    """Mean return of the first ``episodes`` episodes of a NEXT_STEP vector env driven by ``sample_actions()``."""
    env.reset(seed=seed)
    returns, running, resetting = [], np.zeros(env.num_envs), np.zeros(env.num_envs, dtype=bool)
    while len(returns) < episodes:
        _, rewards, terminated, truncated, _ = env.step(sample_actions())
        running += np.where(resetting, 0.0, rewards)  # NEXT_STEP autoreset: reset steps carry no reward
        done = terminated | truncated
        returns.extend(running[done])
        running[done] = 0.0
        resetting = done
    return float(np.mean(returns))


def random_policy_return(env_config: dict, episodes: int = 2000, seed: int = 0) -> float:
    """Mean episode return of a uniformly random policy on the vectorized Snake."""
    rng = np.random.default_rng(seed)
    return mean_return(SnakeVectorEnv(num_envs=256, **env_config), lambda: rng.integers(0, 4, 256), episodes, seed)


def best_return(rows: list[dict]) -> float:
    """Best mean return over a run's progress.csv rows (rows before the first finished episode hold NaN)."""
    return max(float(r["env_runners/episode_return_mean"]) for r in rows
               if r["env_runners/episode_return_mean"] not in ("", "nan"))


def train_tuned_example(name: str, stop: dict, tmp_path: Path, env: dict, timeout: int = 900) -> list[dict]:
    """Runs ``rl-speed train tuned_examples/NAME.yaml`` and returns the trial's progress.csv rows."""
    return train_file(ROOT / "tuned_examples" / f"{name}.yaml", stop, tmp_path, env, timeout)


def train_experiment(name: str, experiment: dict, stop: dict, tmp_path: Path, env: dict) -> list[dict]:
    """Writes ``experiment`` (a tuned example's entry, changed by the test) as a one-experiment file and trains it."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({name: experiment}))
    return train_file(path, stop, tmp_path, env)


def train_file(path: Path, stop: dict, tmp_path: Path, env: dict, timeout: int = 900) -> list[dict]:
    """Runs ``rl-speed train PATH`` (one experiment) and returns the trial's progress.csv rows."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "rl-speed"), "train", str(path), "--stop", json.dumps(stop),
         "--storage-path", str(tmp_path), "--num-cpus", "2"],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (experiment,) = yaml.safe_load(open(path))
    (trial,) = [p for p in (tmp_path / experiment).iterdir() if p.is_dir()]
    return list(csv.DictReader(open(trial / "progress.csv")))


@pytest.mark.slow
@pytest.mark.ci
def test_snake_ppo_beats_random_within_90_seconds(tmp_path, cli_env):
    experiment = yaml.safe_load(open(ROOT / "tuned_examples" / "snake_ppo.yaml"))["snake-ppo"]
    baseline = random_policy_return(experiment["config"]["env_config"])
    rows = train_tuned_example("snake_ppo", {"time_total_s": 90}, tmp_path, cli_env)
    final = float(rows[-1]["env_runners/episode_return_mean"])
    print(f"random policy {baseline:.3f}, PPO after 90 s {final:.3f}")
    assert baseline < -0.5
    assert final > 2.0, f"mean return {final:.3f} after 90 s (random policy: {baseline:.3f})"


@pytest.mark.slow
@pytest.mark.ci
def test_cartpole_fastdqn_reaches_400_within_120_seconds(tmp_path, cli_env):
    rows = train_tuned_example("cartpole_fastdqn", {"time_total_s": 120}, tmp_path, cli_env)
    best = best_return(rows)
    print(f"FastDQN CartPole best mean return {best:.1f} in {rows[-1]['time_total_s']} s")
    assert best >= 400


@pytest.mark.slow
def test_snake_fastdqn_beats_random_within_90_seconds(tmp_path, cli_env):
    rows = train_tuned_example("snake_dqn", {"time_total_s": 90}, tmp_path, cli_env)
    final = float(rows[-1]["env_runners/episode_return_mean"])
    print(f"FastDQN Snake after 90 s {final:.3f}")
    assert final > 5.0


@pytest.mark.slow
@pytest.mark.ci
def test_cartpole_fastppo_reaches_450(tmp_path, cli_env):
    rows = train_tuned_example("cartpole_fastppo", {"time_total_s": 120}, tmp_path, cli_env)
    best = best_return(rows)
    print(f"FastPPO CartPole best mean return {best:.1f} in {rows[-1]['time_total_s']} s")
    assert best >= 450


@pytest.mark.slow
def test_snake_fastppo_beats_random_within_90_seconds(tmp_path, cli_env):
    rows = train_tuned_example("snake_fastppo", {"time_total_s": 90}, tmp_path, cli_env)
    final = float(rows[-1]["env_runners/episode_return_mean"])
    print(f"FastPPO Snake after 90 s {final:.3f}")
    assert final > 4.0


def grid_random_return(seed: int = 0) -> float:
    """Mean return per agent-episode of a random policy on the grid arena (default map, 256 steps)."""
    from rl_speed_envs.grid_arena import GridArenaVectorEnv

    env = GridArenaVectorEnv(num_envs=24 * 16, max_steps=256)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    total = np.zeros(env.num_envs)
    for _ in range(256):
        total += env.step(rng.integers(0, 7, env.num_envs))[1]
    return float(total.mean())


@pytest.mark.slow
def test_grid_arena_fastppo_well_above_random_within_150_seconds(tmp_path, cli_env):
    baseline = grid_random_return()
    rows = train_tuned_example("grid_ppo", {"time_total_s": 150}, tmp_path, cli_env)
    final = float(rows[-1]["env_runners/episode_return_mean"])
    print(f"grid arena: random policy {baseline:.3f}, FastPPO after 150 s {final:.3f}")
    assert baseline < 0.15
    assert final > 2 * baseline and final > 0.2


def mettagrid_random_return(env_config: dict) -> float:
    """Mean return per agent-episode of uniformly random actions in the MettaGrid arena of ``env_config``."""
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    rng = np.random.default_rng(0)
    return mean_return(MettaGridVectorEnv(num_envs=128, **env_config), lambda: rng.integers(0, 5, 128), 500)


@pytest.mark.slow
def test_mettagrid_fastppo_well_above_random_within_90_seconds(tmp_path, cli_env):
    """The laptop MettaGrid example (real mettagrid, token module) against random play in the same arena."""
    pytest.importorskip("mettagrid", reason="the [mettagrid] extra is not installed")
    config = yaml.safe_load(open(ROOT / "tuned_examples" / "mettagrid_ppo.yaml"))["mettagrid-ppo"]["config"]
    baseline = mettagrid_random_return(config["env_config"])
    rows = train_tuned_example("mettagrid_ppo", {"time_total_s": 90}, tmp_path, cli_env)
    final = best_return(rows[-5:])
    print(f"MettaGrid: random policy {baseline:.2f} per agent-episode, FastPPO after 90 s {final:.2f}")
    assert final > 2 * baseline


@pytest.mark.slow
def test_mettagrid_recurrent_token_module_well_above_random_within_90_seconds(tmp_path, cli_env):
    """The laptop MettaGrid example with the LSTM token module (``rl_module: recurrent_tokens``) trained by
    truncated BPTT over 16-step chunks, against random play in the same arena."""
    pytest.importorskip("mettagrid", reason="the [mettagrid] extra is not installed")
    experiment = yaml.safe_load(open(ROOT / "tuned_examples" / "mettagrid_ppo.yaml"))["mettagrid-ppo"]
    experiment["config"].update(rl_module="recurrent_tokens", bptt_horizon=16)
    experiment["config"]["model_config"]["lstm_cell_size"] = 64
    baseline = mettagrid_random_return(experiment["config"]["env_config"])
    rows = train_experiment("mettagrid-lstm", experiment, {"time_total_s": 90}, tmp_path, cli_env)
    final = best_return(rows[-5:])
    print(f"MettaGrid, LSTM token module: random policy {baseline:.2f} per agent-episode, FastPPO after 90 s "
          f"{final:.2f}")
    assert final > 2 * baseline


def durotaxis_random_return(env_config: dict, seed: int = 0) -> float:
    """Mean episode return of uniformly random actions (spawn flags, parameters, delete ratio) on durotaxis."""
    from rl_speed_envs.durotaxis import DurotaxisVectorEnv

    env = DurotaxisVectorEnv(num_envs=128, **env_config)
    env.action_space.seed(seed)
    return mean_return(env, env.action_space.sample, 500, seed)


def _durotaxis_run(seconds: int, tmp_path: Path, env: dict) -> tuple[float, float]:
    experiment = yaml.safe_load(open(ROOT / "tuned_examples" / "durotaxis_ppo.yaml"))["durotaxis-fastppo"]
    baseline = durotaxis_random_return(experiment["config"]["env_config"])
    rows = train_tuned_example("durotaxis_ppo", {"time_total_s": seconds}, tmp_path, env)
    # The mean of the last three iterations: one iteration's episodes are few and noisy.
    final = float(np.mean([float(r["env_runners/episode_return_mean"]) for r in rows[-3:]]))
    print(f"durotaxis: random policy {baseline:.3f}, FastPPO after {seconds} s {final:.3f}")
    return baseline, final


@pytest.mark.slow
@pytest.mark.ci
def test_durotaxis_fastppo_moves_the_cell_within_75_seconds(tmp_path, cli_env):
    baseline, final = _durotaxis_run(75, tmp_path, cli_env)
    assert baseline < 0.0
    assert final > 3.0, f"mean return {final:.3f} after 75 s (random policy: {baseline:.3f})"


@pytest.mark.slow
def test_durotaxis_fastppo_reaches_the_goal_regularly_within_120_seconds(tmp_path, cli_env):
    baseline, final = _durotaxis_run(120, tmp_path, cli_env)
    assert final > 6.0, f"mean return {final:.3f} after 120 s (random policy: {baseline:.3f})"


@pytest.mark.slow
def test_mario_cpu_preset_gets_clearly_further_than_random_on_1_1(tmp_path, cli_env):
    """The CPU tuned example, for the time its YAML states, then its final checkpoint against random actions on the
    real emulator (epsilon-greedy with the preset's final epsilon, 32 episodes each)."""
    pytest.importorskip("gym_super_mario_bros", reason="needs the [mario] extra: python3 tasks.py mario-setup")
    from benchmarks.evaluate.mario_policy import compare

    seconds = yaml.safe_load(open(ROOT / "tuned_examples" / "mario_dqn.yaml"))["mario-dqn"]["stop"]["time_total_s"]
    train_tuned_example("mario_dqn", {}, tmp_path, cli_env, timeout=seconds + 600)
    (checkpoint,) = sorted(tmp_path.glob("mario-dqn/*/checkpoint_*"))[-1:]
    results = compare(str(checkpoint), episodes=32, workers=2)
    random_x, trained_x = results["random"]["x_pos"].mean(), results["trained"]["x_pos"].mean()
    random_return, trained_return = results["random"]["returns"].mean(), results["trained"]["returns"].mean()
    print(f"Mario 1-1 after {seconds} s: mean final x {trained_x:.0f} (random {random_x:.0f}), mean return "
          f"{trained_return:.0f} (random {random_return:.0f})")
    assert trained_x > MARIO_X_FACTOR * random_x and trained_return > MARIO_X_FACTOR * random_return


#: "clearly above random": the trained policy's mean final x-position and mean return must both beat random's by this
#: factor (see docs/studies/mario.md, "Mario learning", for the measured values)
MARIO_X_FACTOR = 1.3


def atari_random_return(env_config: dict, episodes: int = 100, seed: int = 0) -> float:
    """Mean episode return of uniformly random actions on the Atari env of ``env_config`` (8 emulators)."""
    from rl_speed_envs.atari import AtariVectorEnv

    env = AtariVectorEnv(8, **env_config)
    rng = np.random.default_rng(seed)
    try:
        return mean_return(env, lambda: rng.integers(0, env.single_action_space.n, 8), episodes, seed)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("model_config", [
    pytest.param({}, marks=pytest.mark.ci, id="preset"),
    # the value head on standardized returns (rl_games' normalize_value): learns as well here (not in CI)
    pytest.param({"normalize_value": True}, id="normalize_value"),
])
def test_breakout_fastppo_cpu_beats_random_within_150_seconds(tmp_path, cli_env, model_config):
    """The pixel path learns on this CPU: FastPPO with atari_ppo.yaml's Breakout settings (Nature CNN, uint8 frames
    from ale-py's vector env to the module), with one change: a lost life ends the episode and starts a new game
    (ale-py's ``episodic_life``), so a return is the bricks of a game's first life and there are many episodes in a
    short run. Judged against random actions on the same env; the mean of the last 5 iterations' returns."""
    pytest.importorskip("ale_py", reason="needs the [atari] extra: pip install -e '.[atari]'")
    experiment = yaml.safe_load(open(ROOT / "tuned_examples" / "atari_ppo.yaml"))["breakout-fastppo"]
    experiment["config"]["env_config"]["episodic_life"] = True
    if model_config:  # the preset sets none
        experiment["config"]["model_config"] = model_config
    baseline = atari_random_return(experiment["config"]["env_config"])
    rows = train_experiment("breakout", experiment, {"time_total_s": 150}, tmp_path, cli_env)
    returns = [float(r["env_runners/episode_return_mean"]) for r in rows
               if r["env_runners/episode_return_mean"] not in ("", "nan")]
    final = float(np.mean(returns[-5:]))
    print(f"Breakout (a life per episode): random actions {baseline:.3f}, FastPPO after 150 s {final:.3f} "
          f"({rows[-1]['num_env_steps_sampled_lifetime']} env steps)")
    assert baseline < 0.25
    assert final > 3 * baseline and final > 0.4
