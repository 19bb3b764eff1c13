"""Time to a score, judged the same way for every contender, and FastPPO's learning-level equivalence with stock PPO.

The judge (:class:`EpisodeJudge`, or :class:`VectorEpisodeJudge` around a native vector env) is one wrapper that every
contender's envs go through: it logs every
finished episode's return with the wall-clock time since the contender started (before its algorithm or model is
built) and the process-wide count of env steps. A contender has reached the target when the mean return of the last
20 finished episodes reaches it (the grid arena: the last 192, one round of every agent lane). Everything runs in
this process with local sampling, one contender at a time, so each log holds one contender's episodes only. (The
Pong race, :mod:`benchmarks.race.race_atari`, samples on Ray actors: its judges log through :class:`JudgeFiles`.)

Contenders on CartPole-v1 (target 475), Acrobot-v1 (target -100), the 8 x 8 Snake (target 5.0; no rl-zoo entry,
so every contender gets ``tuned_examples/snake_ppo.yaml``'s settings, and SB3 steps the scalar env, one per lane) and
the grid arena (target 0.25 per agent-episode; ``tuned_examples/grid_ppo.yaml``'s settings, both RLlib contenders on
its batched form, env steps = agent steps; no SB3 row, SB3 has no multi-agent form):

* ``FastPPO (ours)``: FastPPO with rl_speed's own settings for the task, over the task's shared ones
  (:data:`CARTPOLE_FASTPPO`, :data:`ACROBOT_FASTPPO`, :data:`SNAKE_FASTPPO`, :data:`GRID_ARENA_FASTPPO`);
* ``FastPPO (zoo)``, ``PPO (zoo)``: FastPPO and stock RLlib PPO at rl-zoo's PPO hyperparameters for the task,
  mapped to RLlib's keys (identical on both; "(snake_ppo.yaml)" for Snake);
* ``SB3 PPO (zoo)``: Stable-Baselines3 (the ``[bench]`` extra) with the same hyperparameters; skipped when not
  installed. rl-zoo's Acrobot entry also normalizes observations (VecNormalize); no contender does that here.

DQN contenders, on the tasks with rl-zoo DQN hyperparameters (CartPole-v1, Acrobot-v1; rl-zoo gives both the same
settings: lr 2.5e-4, batch 512, buffer 100k, target update every 5,000 steps, 4 gradient steps per 16 env steps,
epsilon 1 -> 0.11 over 6% of n_timesteps, 64-64 ReLU, one env):

* ``FastDQN (ours)``: ``tuned_examples/cartpole_fastdqn.yaml``'s settings (on Acrobot too, untuned there);
* ``FastDQN (zoo)``, ``DQN (zoo)``: FastDQN and stock RLlib DQN at rl-zoo's settings mapped to RLlib's keys
  (:func:`dqn_zoo_in_rllib`: no double Q, no dueling, 1-step, uniform replay, grad-norm clip 10; learning starts
  once a batch is stored, where SB3 samples with replacement from fewer);
* ``SB3 DQN (zoo)``: Stable-Baselines3's DQN with rl-zoo's settings.

Every contender is judged on its training episodes, exploration included (rl-zoo's final epsilon is 0.11).

Each row also gives the best running mean of 20 returns a contender reached, so a row that missed the target says by
how much.

``equivalence``: FastPPO vs stock PPO (and FastDQN vs stock DQN) at identical hyperparameters and seeds; env steps to
the target per seed and a two-sided exact permutation test on the mean of log(env steps).
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any


from benchmarks.common import machine
from benchmarks.race.contenders import TASKS, _contenders, env_steps_to_target, zoo_in_rllib
from benchmarks.race.judge import WINDOW
from benchmarks.race.report import _steps_table, race_chart, task_section
from benchmarks.race.stats import permutation_p


def value_clip_ablation(repeats: int = 5, task_name: str = "CartPole-v1", max_seconds: float = 150.0) -> str:
    """FastPPO at the task's rl-zoo settings with RLlib's default value-loss clip (``vf_clip_param`` 10) and without
    it (SB3's loss): env steps to the target per seed and the permutation test (docs/studies/time-to-a-score.md)."""
    import ray
    import torch

    task = TASKS[task_name]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    steps: dict[str, list[float]] = {"RLlib's value-loss clip (10)": [], "no value-loss clip, as SB3": []}
    try:
        for seed in range(repeats):
            for name, clip in zip(steps, (10.0, float("inf"))):
                settings = {**zoo_in_rllib(task), "vf_clip": clip}
                steps[name].append(env_steps_to_target("fast", task, settings, seed, max_seconds))
    finally:
        ray.shutdown()
    (a, b) = steps.values()
    p = permutation_p([math.log(x) for x in a], [math.log(x) for x in b])
    return "\n".join([
        f"FastPPO on {task.env_id}, rl-zoo settings: env steps to {task.target:g} (missed = {task.max_steps:,})",
        "", *_steps_table("value loss", steps),
        "", f"Two-sided exact permutation test on mean log(env steps): p = {p:.3f}.",
    ])


def real_steps_ppo_learner() -> type:
    """Stock PPO's learner whose GAE connector standardizes advantages over the loss mask's rows only (FastPPO's
    rule; see :func:`standardization_ablation`). RLlib's ``GeneralAdvantageEstimation`` standardizes over every row
    of the module batch, including the bootstrap row it appends to each episode chunk (loss mask False), whose
    advantage is a reward-less step's: below the real steps' in tasks with positive rewards, so the real steps'
    advantages come out shifted up."""
    import torch
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing
    from ray.rllib.utils.annotations import override

    from rl_speed.gae import standardize
    from rl_speed.learners.ppo import replace_gae_connector

    class RealStepsGAE(GeneralAdvantageEstimation):
        @override(GeneralAdvantageEstimation)
        def __call__(self, **kwargs: Any) -> Any:
            batch = super().__call__(**kwargs)
            for module_batch in batch.values():
                if Postprocessing.ADVANTAGES in module_batch and Columns.LOSS_MASK in module_batch:
                    advantages = module_batch[Postprocessing.ADVANTAGES]
                    mask = torch.as_tensor(module_batch[Columns.LOSS_MASK], device=advantages.device).bool()
                    # an affine map of RLlib's standardized values: re-standardizing over the real rows gives the
                    # raw advantages standardized over the real rows
                    module_batch[Postprocessing.ADVANTAGES] = standardize(advantages, mask, min_std=1e-4)
            return batch

    class RealStepsPPOTorchLearner(PPOTorchLearner):
        @override(PPOTorchLearner)
        def build(self) -> None:
            super().build()
            replace_gae_connector(self, RealStepsGAE)

    return RealStepsPPOTorchLearner


def standardization_ablation(repeats: int = 10, task_name: str = "CartPole-v1", max_seconds: float = 150.0) -> str:
    """FastPPO, stock PPO, and stock PPO with FastPPO's advantage standardization (:func:`real_steps_ppo_learner`), at
    the task's rl-zoo settings, seeds interleaved: env steps to the target per seed and pairwise permutation tests."""
    import ray
    import torch

    task = TASKS[task_name]
    zoo = zoo_in_rllib(task)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    names = ("FastPPO", "stock PPO", "stock PPO, advantages standardized over real steps")
    steps: dict[str, list[float]] = {name: [] for name in names}
    try:
        learner = real_steps_ppo_learner()
        for seed in range(repeats):
            steps[names[0]].append(env_steps_to_target("fast", task, zoo, seed, max_seconds))
            steps[names[1]].append(env_steps_to_target("stock", task, zoo, seed, max_seconds))
            steps[names[2]].append(env_steps_to_target("stock", task, {**zoo, "learner_class": learner}, seed,
                                                       max_seconds))
    finally:
        ray.shutdown()

    def p(a: str, b: str) -> float:
        return permutation_p([math.log(x) for x in steps[a]], [math.log(x) for x in steps[b]])

    return "\n".join([
        f"PPO on {task.env_id}, rl-zoo settings (SB3's loss): env steps to {task.target:g} (missed = "
        f"{task.max_steps:,}), seeds 0-{repeats - 1}",
        "", *_steps_table("contender", steps),
        "", "Two-sided exact permutation tests on mean log(env steps): "
        f"FastPPO vs stock p = {p(names[0], names[1]):.3f}; stock vs stock with real-step standardization "
        f"p = {p(names[1], names[2]):.3f}; FastPPO vs stock with real-step standardization "
        f"p = {p(names[0], names[2]):.3f}.",
    ])


def run(repeats: int = 5, tasks: tuple[str, ...] = ("CartPole-v1", "Acrobot-v1", "rl_speed/Snake-v0"),
        max_seconds: float = 150.0, families: tuple[str, ...] = ("ppo", "dqn"), charts: str | None = "runs") -> str:
    import ray
    import torch

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    sections = []
    try:
        for name, family in itertools.product(tasks, families):
            task = TASKS[name]
            if family == "dqn" and task.dqn_zoo is None:
                continue  # rl-zoo has no DQN settings for this task
            contenders = _contenders(task, family, max_seconds)
            results: dict[str, list] = {c: [] for c in contenders}
            for seed in range(repeats):  # interleaved, so drift on this shared machine hits every contender alike
                for contender, fn in contenders.items():
                    log = fn(seed)
                    if log is not None:
                        results[contender].append(log)
            sections.append(task_section(task, results, family))
            if charts:
                sections.append(f"Chart: `{race_chart(task, family, results, charts)}`")
    finally:
        ray.shutdown()
    return "\n\n".join([
        "### Time to a score: FastPPO / FastDQN vs stock RLlib PPO / DQN vs Stable-Baselines3 (one judge for all)",
        "",
        f"Command: `rl-speed bench race --repeats {repeats}` · machine: {machine()} · date: "
        f"{time.strftime('%Y-%m-%d')} · torch threads 1, local sampling; time counts from before the algorithm or "
        f"model is built; reached = the mean of the last {WINDOW} finished episodes (judge wrapper; on the grid arena "
        f"the last {TASKS['rl_speed/GridArena-v0'].window}, one round of every agent) >= the target; "
        "median (min-max) over the seeds that reached it, and where some did not, the median over all seeds (a miss "
        "counting as the slowest).",
        *sections,
    ])
