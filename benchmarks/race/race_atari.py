"""Time to a Pong (or Breakout) score on a GPU box: FastPPO and FastDQN (their GPU presets) vs stock RLlib PPO / DQN vs
Stable-Baselines3 PPO / DQN, one judge for all (:mod:`benchmarks.race.race`'s, logging through :class:`JudgeFiles`, since
the RLlib contenders' env runners are Ray actors).

Contenders, on ``rl_speed/Atari-v0`` with ``game: pong`` (ale-py's preprocessing: frame skip 4 with max-pooling,
84 x 84 grayscale, 4 stacked frames, up to 30 no-op starts, FIRE on reset, sticky actions off; Pong has no lives):

* ``FastPPO (ours)``: ``tuned_examples/atari_ppo_gpu.yaml``'s Pong experiment (15 runners x 16 emulators, CleanRL's
  loss settings); ``FastDQN (ours)``: ``atari_dqn_gpu.yaml``'s;
* ``PPO (ours)``: stock RLlib PPO with FastPPO's settings, module and runners on the scalar form
  (:func:`benchmarks.throughput.atari.stock_config`): the row at identical hyperparameters;
* ``SB3 PPO (zoo)``: Stable-Baselines3's PPO with rl-zoo's Atari settings (:data:`ATARI_ZOO`: 8 envs x 128 steps,
  4 epochs of minibatches of 256, lr 2.5e-4 and clip 0.1 both decayed linearly over 10M steps, entropy 0.01, the
  Nature CNN policy), stepping :class:`AtariEnv` (the same preprocessing) in its DummyVecEnv;
* ``DQN (ours)``: stock RLlib DQN with FastDQN's settings, module and runners on the scalar form (the DQN row at
  identical hyperparameters);
* ``SB3 DQN (zoo)``: Stable-Baselines3's DQN with rl-zoo's Atari settings (:data:`ATARI_DQN_ZOO`: one env, a
  1M-transition buffer, learning from 100k steps, a gradient step every 4 env steps on batches of 32, lr 1e-4, target
  copy every 10k steps, epsilon 1 -> 0.1 over the first 1M steps, the Nature CNN Q-network).

Every episode is a whole Pong game scored -21 to 21; a contender has reached the target when the mean of the last 20
games reaches 18. ``--game breakout`` races the same contenders on Breakout (:data:`GAMES`): the presets' Breakout
experiments, target 300 (a strong policy's score: CleanRL's PPO reaches about 400 after 10M env steps), the same
rl-zoo settings for SB3 (rl-zoo's ``atari`` entry covers every game). Every Breakout contender trains with an episode
per life (``life_episodes``: the game plays on, as rl-zoo's and CleanRL's wrappers end an episode at a lost life); the
judge scores whole games of five lives. A directory holds one game's runs. Each contender runs in its own
process (``python -m benchmarks.race.race_atari contender ...``) for at most ``max_seconds``. :func:`run` queues
every (seed, contender) run and starts each on a free slot: on a host with several GPUs a slot is one GPU and an
equal share of the CPUs (hyperthread siblings together), so runs go side by side and the next starts when one ends (a
contender that reaches the target frees its slot early); elsewhere one slot, one run after another. Every run has a
slot of the same size, whichever contender or seed it is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.common import build_with_every_runner, checkpoint_module_dir, machine, usable_cpus
from benchmarks.scaling.core_pinning import physical_cores
from benchmarks.race.contenders import Task, sb3_learn
from benchmarks.race.judge import EpisodeJudge, JudgeFiles, judged_id, process_start, reached
from benchmarks.race.report import race_chart, task_section
from rl_speed.cuda_mps import CudaMpsError, cuda_mps, running_daemon

#: rl-zoo's PPO entry for Atari games (hyperparams/ppo.yml, ``atari``), SB3's names; gamma 0.99 and lambda 0.95 are
#: SB3's defaults.
ATARI_ZOO = {"n_envs": 8, "n_steps": 128, "n_epochs": 4, "batch_size": 256, "learning_rate": 2.5e-4,
             "clip_range": 0.1, "vf_coef": 0.5, "ent_coef": 0.01, "n_timesteps": 10_000_000}
#: rl-zoo's DQN entry for Atari games (hyperparams/dqn.yml, ``atari``; rl-baselines3-zoo commit 019107e), SB3's names.
ATARI_DQN_ZOO = {"buffer_size": 1_000_000, "learning_rate": 1e-4, "batch_size": 32, "learning_starts": 100_000,
                 "target_update_interval": 10_000, "train_freq": 4, "gradient_steps": 1, "exploration_fraction": 0.1,
                 "exploration_final_eps": 0.1, "n_timesteps": 10_000_000}
PONG = Task("rl_speed/Atari-v0", 18.0, 10_000_000, zoo=ATARI_ZOO, env_config={"game": "pong"},
            dqn_zoo=ATARI_DQN_ZOO, returns="returns are whole games (-21 to 21)")
BREAKOUT = Task("rl_speed/Atari-v0", 300.0, 10_000_000, zoo=ATARI_ZOO,
                env_config={"game": "breakout", "life_episodes": True},
                dqn_zoo=ATARI_DQN_ZOO, returns="returns are whole games (five lives, one point or more per brick)")
#: The games raced.
GAMES = {"pong": PONG, "breakout": BREAKOUT}
#: Per game, the last-20 means whose first crossing ``section`` reports per run in env steps: where a run's env steps
#: go on the way to the target (Pong's first phase, leaving random play at about -15, varies little between seeds,
#: so one seed of a variant already says whether it shortens that phase).
MILESTONES = {"pong": (-15.0, -10.0, 0.0, 10.0, 15.0, 18.0), "breakout": (10.0, 30.0, 100.0, 200.0, 300.0)}
CONTENDERS = ("FastPPO (ours)", "PPO (ours)", "SB3 PPO (zoo)", "FastDQN (ours)", "DQN (ours)", "SB3 DQN (zoo)")
SB3_CONTENDERS = ("SB3 PPO (zoo)", "SB3 DQN (zoo)")
#: An RLlib contender's algorithm module and its env runners', named before anything is imported so that Ray's
#: workers can import them while this process does (:func:`rl_speed.ray_start.preload_modules` of the built config
#: names the same; a test checks).
CONTENDER_MODULES = {
    "FastPPO (ours)": ("rl_speed.algorithms.fast_ppo", "rl_speed.env_runners.batched"),
    "FastDQN (ours)": ("rl_speed.algorithms.fast_dqn", "rl_speed.env_runners.batched"),
    "PPO (ours)": ("ray.rllib.algorithms.ppo.ppo", "ray.rllib.env.single_agent_env_runner"),
    "DQN (ours)": ("ray.rllib.algorithms.dqn.dqn", "ray.rllib.env.single_agent_env_runner"),
}


def slug(contender: str) -> str:
    return contender.lower().replace(" ", "-").replace("(", "").replace(")", "")


def env_config(game: str, overrides: dict | None) -> dict:
    """The game's env config with the overrides' ``env_config`` keys (e.g. ``repeat_action_probability: 0.25``,
    ALE v5's sticky actions) on top."""
    return {**GAMES[game].env_config, **(overrides or {}).get("env_config", {})}


def rllib_contender_config(contender: str, files: JudgeFiles, seed: int, device: str, game: str = "pong",
                           overrides: dict | None = None) -> Any:
    """The RLlib contenders: the presets of :mod:`benchmarks.throughput.atari` for ``game``, their env wrapped in the
    judge, with ``overrides`` (config keys, as ``rl-speed train --config``) applied to the preset before the stock
    contenders copy its settings."""
    from benchmarks.throughput.atari import preset, stock_config
    from rl_speed.algorithms.config import check_model_config_keys, update_config
    from rl_speed.experiments import unknown_config_key

    task = GAMES[game]
    _, config = preset("DQN" if "DQN" in contender else "PPO", device, game=game)
    config.environment(judged_id(task.env_id, files), env_config={**config.env_config, **env_config(game, overrides)})
    config.debugging(seed=seed)
    rest = {k: v for k, v in (overrides or {}).items() if k != "env_config"}
    if rest:
        unknown = unknown_config_key(config.algo_class, rest)
        if unknown is not None:  # RLlib would keep it as an attribute nothing reads
            _, problem, fix = unknown
            raise ValueError(f"race_atari: --config: {problem} Fix: {fix}")
        update_config(config, rest).validate()  # a bad key or value stops here, before Ray starts any runner
    if contender in ("PPO (ours)", "DQN (ours)"):  # the scalar form: sync vectorization
        config = stock_config(contender[:3], config).debugging(seed=seed)
        check_model_config_keys(config, contender)  # e.g. a key only FastPPO's learner honours
        return config
    return config.env_runners(gym_env_vectorize_mode="vector_entry_point")


def run_sb3(contender: str, files: JudgeFiles, seed: int, max_seconds: float, device: str,
            game: str = "pong", overrides: dict | None = None) -> str | None:
    """SB3's PPO with :data:`ATARI_ZOO` or DQN with :data:`ATARI_DQN_ZOO` until the judge's target or
    ``max_seconds``; or why it did not run (SB3 not installed; the DQN's replay buffer, 2 x 26 GiB at rl-zoo's 1M
    transitions, refused by this machine's memory)."""
    try:
        from stable_baselines3 import DQN, PPO
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return "Stable-Baselines3 is not installed (the [bench] extra: python -m pip install 'rl_speed[bench]')"
    from rl_speed_envs.atari import AtariEnv

    zoo = dict(ATARI_ZOO if contender == "SB3 PPO (zoo)" else ATARI_DQN_ZOO)
    timesteps, n_envs = zoo.pop("n_timesteps"), zoo.pop("n_envs", 1)
    EpisodeJudge.begin()
    task = GAMES[game]
    game_config = env_config(game, overrides)
    env = make_vec_env(lambda: EpisodeJudge(AtariEnv(**game_config), files), n_envs=n_envs, seed=seed)
    if contender == "SB3 PPO (zoo)":
        lr, clip = zoo.pop("learning_rate"), zoo.pop("clip_range")
        model = PPO("CnnPolicy", env, seed=seed, device=device, verbose=0, learning_rate=lambda p: p * lr,
                    clip_range=lambda p: p * clip, **zoo)
    else:
        try:
            model = DQN("CnnPolicy", env, seed=seed, device=device, verbose=0, **zoo)
        except MemoryError as e:  # SB3 allocates the whole buffer up front
            env.close()
            return f"its replay buffer of {zoo['buffer_size']:,} transitions does not fit this machine's memory ({e})"
    sb3_learn(model, env, timesteps, task, max_seconds, files)
    return None


def check_overrides(contender: str, overrides: dict | None) -> None:
    """SB3's contenders take only ``env_config`` overrides (their settings are rl-zoo's)."""
    if contender in SB3_CONTENDERS and set(overrides or {}) - {"env_config"}:
        raise ValueError(f"race_atari: {contender} runs rl-zoo's settings; only `env_config` overrides apply to it, "
                         f"not {sorted(set(overrides) - {'env_config'})}.")
    if not isinstance((overrides or {}).get("env_config", {}), dict):
        raise ValueError("race_atari: `env_config` in --config must be a mapping, e.g. "
                         '\'{"env_config": {"repeat_action_probability": 0.25}}\'.')


def evaluate_final_policy(algo: Any, env_config: dict, games: int, device: str = "cpu") -> dict:
    """The trained module's final policy, ``games`` full games per policy (greedy, sampled, random) under each
    protocol of :func:`benchmarks.evaluate.atari_policy.protocols` (sticky actions as trained, and 0.25): the game
    scores by sticky-action probability and policy. The module plays on ``device`` (the driver's copy lives on the
    CPU, where one forward per step made a Breakout evaluation of stalling games outlast 8 minutes)."""
    return evaluate_policy(algo.get_module(), env_config, games, device)


def evaluate_policy(module: Any, env_config: dict, games: int, device: str = "cpu") -> dict:
    """:func:`evaluate_final_policy` of a module: its scores by sticky-action probability and policy."""
    from benchmarks.evaluate.atari_policy import evaluate_protocols, protocols

    module = module.to(device)
    return {str(sticky): {name: returns.tolist() for name, returns in by_policy.items()}
            for sticky, by_policy in evaluate_protocols(module, protocols(env_config), games).items()}


def evaluate_saved_runs(directory: str, games: int, device: str = "cpu") -> list[Path]:
    """``--evaluate GAMES`` after the runs and on another machine: each run of ``directory`` with a saved module
    (``--checkpoint``; at least the module's folder, :func:`~benchmarks.common.checkpoint_module_dir`) and no
    ``evaluation.json`` has that module played as ``--evaluate`` plays the final policy, under its ``meta.json``'s
    game and overrides, into ``evaluation.json``;
    ``meta.json`` gains the evaluation's seconds and machine. A GPU box's time then goes to training alone (a Pong
    evaluation of 16 games took about 41 s of it a seed). The saved module is the learner's last one; ``--evaluate``
    plays the driver's copy, which is the same weights where the last iteration synced them. Returns the folders
    evaluated."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    evaluated = []
    for folder, meta in directory_runs(directory):
        module_dir = checkpoint_module_dir(folder / "checkpoint")
        if (folder / "evaluation.json").exists() or not module_dir.is_dir():
            continue
        game_config = env_config(meta.get("game", "pong"), meta.get("overrides"))
        meta["evaluated_on"] = machine()
        record_evaluation(folder, meta,
                          lambda: evaluate_policy(RLModule.from_checkpoint(module_dir), game_config, games, device))
        evaluated.append(folder)
    return evaluated


def run_contender(contender: str, seed: int, max_seconds: float, directory: str, device: str = "cuda",
                  game: str = "pong", overrides: dict | None = None, checkpoint: bool = False,
                  evaluate_games: int = 0, start: float | None = None, full_time: bool = False) -> None:
    """One contender, one seed, one game: the judge's files and ``meta.json`` in
    ``directory/<contender>-seed<seed>``; with ``overrides`` (recorded in ``meta.json``) on the contender's settings,
    with ``checkpoint`` the final RLlib algorithm saved in ``checkpoint/`` there (for ``rl-speed bench
    atari-policy``), and with ``evaluate_games`` the final policy of an RLlib contender played that many full games
    per protocol (:func:`evaluate_final_policy`, into ``evaluation.json``; after the clock: it counts in no time).
    An RLlib contender's ``meta.json`` also says when, on the judge's clock, Ray was up, the algorithm built (every env
    runner started) and its first iteration done (``startup``): the share of the time to the target that is start.
    ``start``: the judge's clock's zero on the monotonic clock; the ``contender`` command passes its process's start
    (:func:`~benchmarks.race.judge.process_start`), so the interpreter's start and the imports count; by default the
    call's moment (a caller in a longer-lived process, such as a test). ``full_time``: an RLlib contender trains
    the whole ``max_seconds`` past the target (the judge still logs when it was reached), so the evaluated policy is
    the one a time budget buys, not the one at the target."""
    check_overrides(contender, overrides)
    if full_time and contender in SB3_CONTENDERS:
        raise ValueError(f"race_atari: --full-time applies to the RLlib contenders; {contender} stops at the target.")
    if evaluate_games and contender in SB3_CONTENDERS:
        raise ValueError(f"race_atari: --evaluate plays an RLlib module; {contender} has none.")
    if checkpoint and contender in SB3_CONTENDERS:
        raise ValueError(f"race_atari: --checkpoint saves an RLlib algorithm; {contender} has none.")
    out = Path(directory) / f"{slug(contender)}-seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.csv"), *out.glob("*.json")]:  # a rerun replaces the previous run's log and results
        stale.unlink()
    files = JudgeFiles(str(out), time.monotonic() if start is None else start)
    meta: dict[str, Any] = {"contender": contender, "game": game, "seed": seed, "max_seconds": max_seconds,
                            "device": device,
                            "machine": machine(), "cpus": usable_cpus(), "date": time.strftime("%Y-%m-%d"),
                            "clock": "call" if start is None else "process start"}  # older runs: no "clock"
    if overrides:
        meta["overrides"] = overrides
    if full_time:
        meta["full_time"] = True  # trained past the target to the cap
    if running_daemon() is not None:
        meta["cuda_mps"] = True  # the run's CUDA contexts under an MPS daemon (--cuda-mps, or one already up)
    if contender in SB3_CONTENDERS:
        why = run_sb3(contender, files, seed, max_seconds, device, game, overrides)
        meta["ran"] = why is None
        if why:
            meta["why"] = why
        write_meta(out, meta, files.start)
    else:
        import ray

        from rl_speed.ray_start import init_local_ray

        # Ray starts while this process imports RLlib, torch and rl_speed (the preset's modules), its workers
        # importing the algorithm's and the runners' modules in advance (as `rl-speed train`'s do).
        meta["ray_preload"] = list(CONTENDER_MODULES[contender])  # older runs: none
        init_local_ray(meta["ray_preload"], import_beside=[*meta["ray_preload"], "benchmarks.throughput.atari"],
                       num_cpus=usable_cpus(), num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
                       log_to_driver=False)
        meta["ray_beside_imports"] = True  # older runs: Ray started after the imports and the config's build
        try:
            config = rllib_contender_config(contender, files, seed, device, game, overrides)  # refuses bad overrides
            meta["startup"] = {"ray_started_s": time.monotonic() - files.start}  # Ray up, the config built
            algo = build_with_every_runner(config)
            meta["startup"]["built_s"] = time.monotonic() - files.start
            result = train_until(algo, files, GAMES[game], max_seconds, meta["startup"], full_time)
            finish_rllib_run(algo, result, out, meta, files.start, checkpoint, evaluate_games,
                             env_config(game, overrides), device)
            algo.stop()
        finally:
            ray.shutdown()


def train_until(algo: Any, files: JudgeFiles, task: Task, max_seconds: float, startup: dict,
                full_time: bool = False) -> dict:
    """``algo.train()`` until the judge's games reach ``task``'s target (unless ``full_time``) or ``max_seconds``
    have passed since the judge's clock started; records when the first iteration ended in
    ``startup["first_iteration_s"]`` (the clock's seconds). Returns the last result."""
    result: dict = {}
    while time.monotonic() - files.start < max_seconds:
        result = algo.train()
        startup.setdefault("first_iteration_s", time.monotonic() - files.start)
        if not full_time and reached(files.read(), task.target, task.window):
            break
    return result


def write_meta(out: Path, meta: dict, start: float | None = None) -> None:
    """``meta`` into ``out/meta.json``; with ``start`` (the judge's clock's zero) first the run's ``seconds``."""
    if start is not None:
        meta["seconds"] = time.monotonic() - start
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def finish_rllib_run(algo: Any, result: dict, out: Path, meta: dict, start: float, checkpoint: bool = False,
                     evaluate_games: int = 0, game_config: dict | None = None, device: str = "cpu") -> None:
    """After the clock: the run's figures into ``meta.json``, the checkpoint, then the evaluation. ``meta.json``
    comes first: an evaluation can take minutes (a policy that stalls plays each game to the 108,000-frame cap) and
    may be cut short, and the race's result must not go with it."""
    meta["ran"] = True
    meta["env_steps_sampled"] = int(result.get("num_env_steps_sampled_lifetime", 0))
    meta["seconds_trained"] = time.monotonic() - start
    meta["last_iteration_profile"] = result.get("rl_speed_profile")  # where the last iteration's time went
    if checkpoint:
        meta["checkpoint"] = algo.save_to_path(str((out / "checkpoint").resolve()))
    write_meta(out, meta, start)
    if evaluate_games:
        record_evaluation(out, meta, lambda: evaluate_final_policy(algo, game_config or {}, evaluate_games, device))


def record_evaluation(out: Path, meta: dict, evaluate: Callable[[], dict]) -> None:
    """``evaluate()``'s scores into ``out/evaluation.json`` and its seconds into ``meta.json``'s ``evaluation_s``:
    what the evaluation costs a run after the clock (meta's ``seconds`` stays the run's)."""
    began = time.monotonic()
    (out / "evaluation.json").write_text(json.dumps(evaluate()))
    meta["evaluation_s"] = time.monotonic() - began
    write_meta(out, meta)


def directory_runs(directory: str) -> list[tuple[Path, dict]]:
    """Every contender run in ``directory``: its folder and its ``meta.json``, in folder order."""
    return [(path.parent, json.loads(path.read_text())) for path in sorted(Path(directory).glob("*/meta.json"))]


def runs_game(runs: list[tuple[Path, dict]], directory: str) -> str | None:
    """The game of ``runs`` (runs from before the game was recorded are Pong's); None if there are none. Refuses a
    directory that mixes games: one table has one target."""
    games = {meta.get("game", "pong") for _, meta in runs}
    if len(games) > 1:
        raise ValueError(f"race_atari: {directory} holds runs of several games {sorted(games)}; give each game its own "
                         "directory.")
    return games.pop() if games else None


def section(directory: str, charts: str | None = None) -> str:
    """The race table (and chart) from every contender run found in ``directory`` (one game's)."""
    runs = directory_runs(directory)
    game = runs_game(runs, directory) or "pong"
    task = GAMES[game]
    results: dict[str, list] = {c: [] for c in CONTENDERS}
    metas = [meta for _, meta in runs]
    run_logs: dict[Path, list] = {}  # each finished run's judge log, for the race table and the per-run rows
    for folder, meta in runs:
        if meta.get("ran"):
            run_logs[folder] = JudgeFiles(str(folder), 0.0).read()
            results[meta["contender"]].append(run_logs[folder])
    # a contender with no run logged still gets its row, unless each of its runs says why it did not run (below)
    results = {c: logs for c, logs in results.items()
               if logs or any(m["contender"] == c and not m.get("why") for m in metas)}
    lines = [f"{game.capitalize()} (`{task.env_id}`, `game: {game}`); {task.returns}.",
             task_section(task, results, "ppo / dqn")]
    lines += [f"- {m['contender']}, seed {m['seed']}: not run: {m['why']}" for m in metas if m.get("why")]
    lines += evaluation_lines(runs)
    lines += startup_lines(runs)
    lines += run_table(runs, run_logs, task)
    lines += milestone_table(runs, run_logs, MILESTONES[game], task.window)
    unfinished = sorted(path.name for path in Path(directory).iterdir() if path.is_dir()
                        and any(path.glob("*.csv")) and not (path / "meta.json").exists())
    if unfinished:  # stopped, or refused after it started (e.g. an env runner failed to start): not in the table
        lines.append(f"Started but not finished (no `meta.json`), not counted: {', '.join(unfinished)}; "
                     "`--missing-only` makes them again.")
    if charts:
        family = "ppo-dqn" if game == "pong" else f"{game}-ppo-dqn"  # Pong's chart keeps its name
        lines.append(f"Chart: `{race_chart(task, family, results, charts)}`")
    ran = [m for m in metas if m.get("ran")]
    late = [m for m in ran if "clock" not in m]
    if late:  # recorded before the clock started at the process's start
        lines.append(f"Clock: {len(late)} of {len(ran)} runs counted from after their driver's imports (RLlib's and "
                     "torch's), not from process start: their times leave those seconds out.")
    caps = sorted({m["max_seconds"] for m in metas})
    lines.append(f"Runs: {len(metas)}; time cap {', '.join(f'{c:.0f} s' for c in caps)} per run; machines: "
                 + "; ".join(sorted({f"{m['machine']}, {m['cpus']} CPUs, {m['device']}" for m in metas})))
    return "\n\n".join(lines)


def run_table(runs: list[tuple[Path, dict]], logs: dict[Path, list], task: Task) -> list[str]:
    """Each finished run's own row, so a study's per-seed table comes from the committed files: its time and env
    steps to the target, its first iteration, its env steps/s over the whole run, its final greedy policy's mean."""
    rows = []
    for folder, meta in sorted(runs, key=lambda run: (run[1]["contender"], run[1]["seed"])):
        if folder not in logs:
            continue
        hit = reached(logs[folder], task.target, task.window)
        first = (meta.get("startup") or {}).get("first_iteration_s")
        rate = meta["env_steps_sampled"] / meta["seconds"] if meta.get("env_steps_sampled") and meta.get("seconds") \
            else None
        path = folder / "evaluation.json"
        evaluation = sorted(json.loads(path.read_text()).items()) if path.exists() else []
        greedy, sampled = (" / ".join(f"{np.mean(policies[policy]):.2f}" for _, policies in evaluation
                                      if policy in policies) for policy in ("greedy", "sampled"))
        rows.append(f"| {meta['contender']} | {meta['seed']} | {f'{hit[0]:.1f} s' if hit else 'not reached'} | "
                    f"{f'{hit[1]:,}' if hit else ''} | {f'{first:.1f} s' if first is not None else ''} | "
                    f"{f'{rate / 1000:.1f}k' if rate else ''} | {greedy} | {sampled} |")
    if not rows:
        return []
    return ["\n".join(["| contender | seed | time to target | env steps to target | first iteration done | env steps/s "
                       "over the run | final greedy policy, mean per sticky-action probability (low to high) | "
                       "final sampled policy, the same |",
                       "|---|---:|---:|---:|---:|---:|---:|---:|", *rows])]


def milestone_table(runs: list[tuple[Path, dict]], logs: dict[Path, list], levels: tuple[float, ...],
                    window: int) -> list[str]:
    """Each finished run's env steps (millions) at which its last-``window`` mean first reached each of ``levels``;
    a run's ``--config`` overrides name the variant it ran."""
    rows = []
    for folder, meta in sorted(runs, key=lambda run: (run[1]["contender"], run[1]["seed"])):
        if folder not in logs:
            continue
        hits = [reached(logs[folder], level, window) for level in levels]
        overrides = json.dumps(meta["overrides"]) if meta.get("overrides") else "preset"
        mps = " under CUDA MPS" if meta.get("cuda_mps") else ""
        rows.append(f"| {meta['contender']} | {meta['seed']} | `{overrides}`{mps} | "
                    + " | ".join(f"{hit[1] / 1e6:.2f}M" if hit else "" for hit in hits) + " |")
    if not rows:
        return []
    head = "".join(f" {level:g} |" for level in levels)
    return [f"Env steps at which each run's last-{window} mean first reached a level:",
            "\n".join([f"| contender | seed | variant |{head}", "|---|---:|---|" + "---:|" * len(levels), *rows])]


def evaluation_lines(runs: list[tuple[Path, dict]]) -> list[str]:
    """Per contender with evaluated runs (``evaluation.json``): the median over its seeds of the final policy's mean
    score under each sticky-action probability, played greedy and sampled (PPO's own policy samples its actions)."""
    scores: dict[str, dict[str, dict[str, list[float]]]] = {}
    for folder, meta in runs:
        path = folder / "evaluation.json"
        if path.exists():
            for sticky, policies in json.loads(path.read_text()).items():
                for policy in ("greedy", "sampled"):
                    if policy in policies:
                        scores.setdefault(meta["contender"], {}).setdefault(policy, {}).setdefault(sticky, []).append(
                            float(np.mean(policies[policy])))
    lines = []
    for contender, by_policy in scores.items():
        for policy, by_sticky in by_policy.items():
            n = len(next(iter(by_sticky.values())))
            seeds = f"{n} seed" + ("s" if n != 1 else "")
            lines.append(f"- {contender}, final {policy} policy (full games; median over {seeds}): "
                         + "; ".join(f"sticky actions {sticky}: {np.median(means):.2f}"
                                           for sticky, means in sorted(by_sticky.items())))
    return lines


def startup_lines(runs: list[tuple[Path, dict]]) -> list[str]:
    """Per RLlib contender whose runs recorded their start (``meta.json``'s ``startup``): the median over its seeds of
    the judge's clock when Ray was up, the algorithm built (every env runner started) and the first iteration done."""
    phases = {"ray_started_s": "Ray up", "built_s": "algorithm built", "first_iteration_s": "first iteration done"}
    by_contender: dict[str, list[dict]] = {}
    for _, meta in runs:
        if meta.get("startup"):
            by_contender.setdefault(meta["contender"], []).append(meta["startup"])
    lines = []
    for contender, startups in by_contender.items():
        found = [(label, [s[key] for s in startups if key in s]) for key, label in phases.items()]
        lines.append(f"- {contender}, start (seconds on the judge's clock; median over {len(startups)} seed"
                     f"{'s' if len(startups) != 1 else ''}): "
                     + ", ".join(f"{label} {np.median(values):.1f}" for label, values in found if values))
    return lines


def cpu_groups(k: int) -> list[list[int]]:
    """This process's CPUs split into ``k`` equal groups, hyperthread siblings kept together."""
    ordered = [cpu for core in physical_cores() for cpu in core]
    size = len(ordered) // k
    return [ordered[i * size:(i + 1) * size] for i in range(k)]


def run_pool(commands: list[list[str]], slots: list[tuple[dict, list[int]]], poll_seconds: float = 1.0) -> None:
    """Runs ``commands``, each on a free slot (its extra environment variables and its CPUs, through ``taskset``),
    at most one per slot at a time, in order, until all are done."""
    queue = list(commands)
    running: dict[int, subprocess.Popen] = {}
    while queue or running:
        for slot, proc in list(running.items()):
            if proc.poll() is not None:
                del running[slot]
        for slot, (env, cpus) in enumerate(slots):
            if queue and slot not in running:
                running[slot] = subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus)), *queue.pop(0)],
                                                 env=dict(os.environ, **env))
        if running:
            time.sleep(poll_seconds)


def pending_jobs(runs: list[tuple[Path, dict]], contenders: tuple[str, ...], seeds: range, max_seconds: float,
                 missing_only: bool, overrides: dict | None = None, full_time: bool = False) -> list[tuple[int, str]]:
    """The (seed, contender) runs to make, seed by seed; with ``missing_only``, less those ``runs`` finished (a
    ``meta.json`` with ``ran``) under the same time cap, ``--config`` overrides and ``--full-time``, so seeds
    accumulate over several sessions without rerunning any. A run stopped before its ``meta.json`` was written, one
    whose extra was missing, or one made otherwise is made again (and replaced)."""
    done = {(meta["seed"], meta["contender"]) for _, meta in runs
            if meta.get("ran") and meta["max_seconds"] == max_seconds
            and (meta.get("overrides") or None) == (overrides or None)
            and bool(meta.get("full_time")) == (full_time and meta["contender"] not in SB3_CONTENDERS)
            } if missing_only else set()
    return [(seed, contender) for seed in seeds for contender in contenders if (seed, contender) not in done]


def run(repeats: int = 1, device: str = "cpu", max_seconds: float = 600.0,
        directory: str = "runs/race_atari", charts: str | None = "runs",
        contenders: tuple[str, ...] = CONTENDERS, first_seed: int = 0, game: str = "pong",
        missing_only: bool = False, evaluate_games: int = 0, full_time: bool = False,
        checkpoint: bool = False, overrides: dict | None = None) -> str:
    """Each of ``contenders`` for seeds ``first_seed .. first_seed + repeats - 1`` on ``game`` (``rl-speed bench
    race-atari --device cuda --repeats N``), on slots of one GPU each where the box has several, else one after
    another; then the table of every run in ``directory`` (earlier seeds included). ``evaluate_games``,
    ``full_time`` and ``checkpoint`` go to the RLlib contenders (:func:`run_contender`'s); SB3's stop at the target
    and keep no algorithm, as they do without them. ``overrides`` (``--config``) go to every contender, each refused
    before anything starts where it cannot take them (:func:`check_overrides`). On a CPU the presets shrink to
    its cores (:func:`benchmarks.throughput.atari.preset`), which says nothing about scores. Refuses, before anything starts,
    an unknown game or contender and a directory holding another game's runs."""
    import torch

    from rl_speed.registry import check_env_installed

    if game not in GAMES:
        raise ValueError(f"race_atari: unknown game {game!r}; choose from {list(GAMES)}.")
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown:
        raise ValueError(f"race_atari: unknown contenders {unknown}; choose from {list(CONTENDERS)}.")
    for contender in contenders:
        check_overrides(contender, overrides)
    runs = directory_runs(directory)
    held = runs_game(runs, directory)
    if held not in (None, game):
        raise ValueError(f"race_atari: {directory} holds {held} runs; race {game} in another directory (one table "
                         "has one target).")
    check_env_installed(GAMES[game].env_id)  # without the [atari] extra: its install command, before anything starts
    for contender in contenders:  # a key or value an RLlib contender cannot take stops the race before any run
        if overrides and contender not in SB3_CONTENDERS:
            rllib_contender_config(contender, JudgeFiles(directory, 0.0), first_seed, device, game, overrides)
    jobs = pending_jobs(runs, contenders, range(first_seed, first_seed + repeats), max_seconds, missing_only,
                        overrides, full_time)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    count = max(1, min(gpus, len(jobs)))
    if count > 1:
        slots = [({"CUDA_VISIBLE_DEVICES": str(gpu)}, cpus) for gpu, cpus in enumerate(cpu_groups(count))]
    else:
        slots = [({}, sorted(os.sched_getaffinity(0)))]
    run_pool([contender_command(contender, seed, max_seconds, directory, device, game, evaluate_games, full_time,
                                checkpoint, overrides) for seed, contender in jobs], slots)
    return section(directory, charts)


def contender_command(contender: str, seed: int, max_seconds: float, directory: str, device: str, game: str,
                      evaluate_games: int = 0, full_time: bool = False, checkpoint: bool = False,
                      overrides: dict | None = None) -> list[str]:
    """The ``contender`` command of one of :func:`run`'s runs; the RLlib-only flags for the RLlib contenders."""
    command = [sys.executable, "-m", "benchmarks.race.race_atari", "contender", contender, "--seed", str(seed),
               "--seconds", str(max_seconds), "--dir", directory, "--device", device, "--game", game,
               *(["--config", json.dumps(overrides)] if overrides else [])]
    if contender not in SB3_CONTENDERS:
        command += [*(["--evaluate", str(evaluate_games)] if evaluate_games else []),
                    *(["--full-time"] if full_time else []), *(["--checkpoint"] if checkpoint else [])]
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.race.race_atari", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("contender", help="run one contender for one seed")
    one.add_argument("contender", choices=CONTENDERS)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--seconds", type=float, default=600.0)
    one.add_argument("--dir", default="runs/race_atari")
    one.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    one.add_argument("--game", choices=list(GAMES), default="pong")
    one.add_argument("--config", type=json.loads, default=None,
                     help="JSON of config keys over the contender's preset, e.g. '{\"lr_kl_target\": 0.01}' or "
                          "'{\"env_config\": {\"repeat_action_probability\": 0.25}}' (recorded in meta.json)")
    one.add_argument("--checkpoint", action="store_true", help="save the final algorithm in the run's checkpoint/")
    one.add_argument("--evaluate", type=int, default=0, metavar="GAMES",
                     help="play the final policy GAMES full games per protocol (sticky actions as trained and 0.25)")
    one.add_argument("--full-time", action="store_true",
                     help="RLlib contenders: train all --seconds, past the target (the evaluated policy is the cap's)")
    one.add_argument("--cuda-mps", action="store_true",
                     help="under an MPS daemon of the run's own (rl_speed.cuda_mps; recorded in meta.json)")
    race = commands.add_parser("race", help="run contenders for seeds (queued over the host's GPUs), then the table")
    race.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    race.add_argument("--first-seed", type=int, default=0)
    race.add_argument("--repeats", type=int, default=1, help="seeds first-seed .. first-seed + repeats - 1")
    race.add_argument("--seconds", type=float, default=600.0)
    race.add_argument("--dir", default="runs/race_atari")
    race.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    race.add_argument("--charts", default=None)
    race.add_argument("--game", choices=list(GAMES), default="pong")
    race.add_argument("--evaluate", type=int, default=0, metavar="GAMES",
                      help="RLlib contenders: play each final policy GAMES full games per protocol")
    race.add_argument("--missing-only", action="store_true",
                      help="skip the (seed, contender) runs the directory already holds finished")
    race.add_argument("--full-time", action="store_true",
                      help="RLlib contenders: train all --seconds, past the target (the evaluated policy is the cap's)")
    race.add_argument("--checkpoint", action="store_true",
                      help="RLlib contenders: save each final algorithm in its run's checkpoint/ (for `evaluate`)")
    race.add_argument("--config", type=json.loads, default=None,
                      help="JSON of config keys over every contender's preset (as the contender command's)")
    race.add_argument("--cuda-mps", action="store_true",
                      help="every run under one MPS daemon of the race's own (recorded in each run's meta.json)")
    later = commands.add_parser("evaluate", help="play the saved final policy of each run in a directory not yet "
                                "evaluated (runs made with --checkpoint)")
    later.add_argument("dir")
    later.add_argument("--games", type=int, default=16, help="full games per policy and protocol")
    later.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    table = commands.add_parser("section", help="print the table of the runs in a directory")
    table.add_argument("dir")
    table.add_argument("--charts", default=None)
    args = parser.parse_args(argv)
    import rl_speed

    rl_speed.register()
    if args.command in ("contender", "race"):
        with contextlib.ExitStack() as stack:
            if args.cuda_mps:
                try:
                    stack.enter_context(cuda_mps())  # before anything starts or a run's files are replaced
                except CudaMpsError as e:
                    print(e, file=sys.stderr)
                    return 2
            if args.command == "contender":
                run_contender(args.contender, args.seed, args.seconds, args.dir, args.device, args.game, args.config,
                              args.checkpoint, args.evaluate, start=process_start(), full_time=args.full_time)
            else:  # the contenders' processes inherit the daemon's variables (rl_speed.cuda_mps)
                print(run(args.repeats, args.device, args.seconds, args.dir, args.charts, tuple(args.contenders),
                          args.first_seed, args.game, args.missing_only, args.evaluate, args.full_time,
                          args.checkpoint, args.config))
    elif args.command == "evaluate":
        evaluated = evaluate_saved_runs(args.dir, args.games, args.device)
        print("\n".join(str(folder) for folder in evaluated) or f"race_atari: no run in {args.dir} has a saved module "
              "(--checkpoint) and no evaluation.json")
    else:
        print(section(args.dir, args.charts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
