"""The race's tasks and contenders: rl-zoo's hyperparameters mapped to RLlib's keys, rl_speed's own settings, and
the runs of FastPPO / FastDQN, stock RLlib and Stable-Baselines3 through the judge."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

from benchmarks.common import build_with_every_runner
from benchmarks.race.judge import WINDOW, EpisodeJudge, JudgeFiles, judged_id, reached


@dataclass(frozen=True)
class Task:
    env_id: str
    target: float
    max_steps: int
    zoo: dict  # the shared PPO hyperparameters, SB3's names (CartPole: linear lr and clip schedules over n_timesteps)
    ours: dict = field(default_factory=dict)  # rl_speed's own FastPPO settings, over the shared ones (rllib_config)
    source: str = "zoo"  # where ``zoo`` comes from: rl-zoo, or a tuned example for envs rl-zoo does not have
    env_config: dict = field(default_factory=dict)
    model: dict = field(default_factory=lambda: {"hidden": [64, 64], "entropy": 0.0})
    dqn_zoo: dict | None = None  # rl-zoo's DQN hyperparameters (SB3's names), where rl-zoo has them
    dqn_ours: dict | None = None  # a tuned FastDQN example's settings (RLlib's names)
    window: int = WINDOW  # finished episodes in the judge's running mean (one round of every agent for the arena)
    sb3: bool = True  # False where SB3 has no form of the env (multi-agent)
    returns: str = ""  # what one episode's return is, where a table says so (Atari: whole games)


#: rl-zoo's DQN entries for CartPole-v1 ("almost tuned") and Acrobot-v1 ("tuned"): the same settings.
DQN_ZOO = {"learning_rate": 2.5e-4, "batch_size": 512, "buffer_size": 100_000, "learning_starts": 0, "gamma": 0.99,
           "target_update_interval": 5000, "train_freq": 16, "gradient_steps": 4, "exploration_fraction": 0.06,
           "exploration_final_eps": 0.11}
#: FastPPO's own CartPole settings over rl-zoo's, tuned for wall-clock to 475 on this 2-core AMD EPYC (2026-11-27, seeds
#: 5-9, the race uses 0-4): 16 envs (twice the lanes per forward), 6 epochs instead of 20 and twice the learning rate
#: (still decayed linearly to 0 over 100k steps). Median seconds to 475 over seeds 5-9: zoo 8.2, this 6.1; it needs
#: more env steps (57k vs 33k), each cheaper. (tuned_examples/cartpole_fastppo.yaml stops at 450 and is not a 475
#: setting: 1 of 5 seeds reached 475 in the race.)
CARTPOLE_FASTPPO = {"num_envs": 16, "fragment": 32, "epochs": 6, "lr": [[0, 2e-3], [100_000, 0.0]]}
#: FastPPO's own Acrobot settings over rl-zoo's, tuned the same way: 64 envs x 64 steps (the same 4,096-step batch),
#: minibatches of 256 instead of 64 (a quarter of the updates; rl-zoo's 256 updates of 64 rows per batch made the
#: learner 65% of an iteration) and lr 1e-3. Median seconds to -100 over seeds 5-9: zoo 12.3, this 7.7.
ACROBOT_FASTPPO = {"num_envs": 64, "fragment": 64, "minibatch": 256, "lr": 1e-3}
#: FastPPO's own Snake settings, tuned for wall-clock on this 2-core AMD EPYC (2026-11-27, 3 seeds per candidate): the
#: race's network and learning rate with 256 lanes x 32 steps (the same 8,192-step batch), minibatches of 2,048 and
#: bf16 autocast on the learner (rl_speed's ``mixed_precision``; the CPU has AVX512-BF16). The learner is 79% of an
#: iteration at these settings, so its precision is where the time is.
SNAKE_FASTPPO = {"num_envs": 256, "fragment": 32, "minibatch": 2048, "mixed_precision": "bf16"}
#: FastPPO's own grid arena settings: grid_ppo.yaml's with 64-64 hidden layers instead of 128-128 (the learner was 65%
#: of an iteration). Tuned for wall-clock on seeds 5-9 (2026-11-27), median seconds to 0.25: grid_ppo.yaml 11.2, this
#: 7.1 at the same env steps; minibatch 6,144: 10.6; 384 lanes x 32 steps: 13.9, with minibatch 6,144 and lr 2e-3:
#: 10.4; 64-64 with minibatch 6,144: 8.4. Earlier: bf16 autocast made iterations faster but needed more env steps.
GRID_ARENA_FASTPPO = {"hidden": [64, 64]}
#: tuned_examples/cartpole_fastdqn.yaml's settings.
CARTPOLE_FASTDQN = {"num_envs": 8, "fragment": 16, "batch": 64, "training_intensity": 8, "n_step": 3, "lr": 5e-4,
                    "gamma": 0.99, "dueling": False, "double_q": True, "target_update": 500, "learning_starts": 1000,
                    "epsilon": [[0, 1.0], [10_000, 0.02]], "prioritized": True, "capacity": 50_000,
                    "hidden": [64, 64], "grad_clip": 40.0}


TASKS = {
    "CartPole-v1": Task("CartPole-v1", 475.0, 200_000,
                        zoo={"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
                             "n_epochs": 20, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2,
                             "n_timesteps": 100_000},
                        ours=CARTPOLE_FASTPPO, dqn_zoo={**DQN_ZOO, "n_timesteps": 200_000},
                        dqn_ours=CARTPOLE_FASTDQN),
    "Acrobot-v1": Task("Acrobot-v1", -100.0, 300_000,
                       zoo={"n_envs": 16, "n_steps": 256, "batch_size": 64, "gae_lambda": 0.94, "gamma": 0.99,
                            "n_epochs": 4, "ent_coef": 0.0, "learning_rate": 3e-4, "clip_range": 0.2,
                            "n_timesteps": 1_000_000},
                       ours=ACROBOT_FASTPPO, dqn_zoo={**DQN_ZOO, "n_timesteps": 150_000},
                       dqn_ours=CARTPOLE_FASTDQN),  # the CartPole example's settings, not tuned for Acrobot
    # No rl-zoo entry: every contender gets tuned_examples/snake_ppo.yaml's settings (snake_fastppo.yaml: the same).
    "rl_speed/Snake-v0": Task("rl_speed/Snake-v0", 5.0, 1_000_000,
                              zoo={"n_envs": 64, "n_steps": 128, "batch_size": 1024, "gae_lambda": 0.95,
                                   "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.01, "learning_rate": 5e-4,
                                   "clip_range": 0.2, "n_timesteps": 1_000_000},
                              source="snake_ppo.yaml", ours=SNAKE_FASTPPO,
                              env_config={"height": 8, "width": 8, "max_steps_without_food": 64,
                                          "observation": "flat", "flood_fill": True},
                              model={"hidden": [256, 256], "entropy": 0.01}),
    # No rl-zoo entry and no SB3 form (multi-agent): FastPPO and stock PPO at tuned_examples/grid_ppo.yaml's settings,
    # both on the batched form (8 maps x 24 agents as 192 lanes of one vector env; stock RLlib through
    # `vector_entry_point`). Returns are per agent-episode (256 steps); random play earns about 0.1.
    "rl_speed/GridArena-v0": Task("rl_speed/GridArena-v0", 0.25, 10_000_000,
                                  zoo={"n_envs": 192, "n_steps": 64, "batch_size": 3072, "gae_lambda": 0.95,
                                       "gamma": 0.99, "n_epochs": 2, "ent_coef": 0.01, "learning_rate": 1e-3,
                                       "clip_range": 0.2, "n_timesteps": 10_000_000},
                                  source="grid_ppo.yaml", ours=GRID_ARENA_FASTPPO,
                                  env_config={"num_agents": 24, "height": 25, "width": 25, "max_steps": 256},
                                  model={"hidden": [128, 128], "entropy": 0.01}, window=192, sb3=False),
}


#: rl-zoo schedules the CartPole learning rate and clip range linearly to 0 over n_timesteps ("lin_0.001").
LINEAR = ("CartPole-v1",)


def zoo_in_rllib(task: "Task") -> dict:
    """rl-zoo's (SB3) PPO hyperparameters as RLlib settings: same rollout, minibatch, epochs, lr (and its linear
    schedule), gamma, lambda, clip (RLlib has no clip schedule: constant); SB3's loss (value weight 0.5, no KL term,
    grad-norm clip 0.5, no clipping of the value loss: SB3's ``clip_range_vf`` is None where RLlib's
    ``vf_clip_param`` defaults to 10); 64-64 tanh policy and value nets."""
    zoo = task.zoo
    lr = zoo["learning_rate"]
    if task.env_id in LINEAR:
        lr = [[0, lr], [zoo["n_timesteps"], 0.0]]
    return {"num_envs": zoo["n_envs"], "fragment": zoo["n_steps"], "minibatch": zoo["batch_size"],
            "epochs": zoo["n_epochs"], "lr": lr, "gamma": zoo["gamma"], "lambda": zoo["gae_lambda"],
            "clip": zoo["clip_range"], "sb3_loss": task.source == "zoo", "entropy": zoo["ent_coef"],
            "hidden": task.model["hidden"], "env_config": task.env_config}


def dqn_zoo_in_rllib(task: "Task") -> dict:
    """rl-zoo's (SB3) DQN hyperparameters as RLlib DQN settings (see the module docstring)."""
    zoo = task.dqn_zoo
    explore_until = zoo["exploration_fraction"] * zoo["n_timesteps"]
    return {"num_envs": 1, "fragment": zoo["train_freq"], "batch": zoo["batch_size"],
            "training_intensity": zoo["batch_size"] * zoo["gradient_steps"] / zoo["train_freq"], "n_step": 1,
            "lr": zoo["learning_rate"], "gamma": zoo["gamma"], "dueling": False, "double_q": False,
            "target_update": zoo["target_update_interval"],
            "learning_starts": max(zoo["learning_starts"], zoo["batch_size"]),
            "epsilon": [[0, 1.0], [explore_until, zoo["exploration_final_eps"]]], "prioritized": False,
            "capacity": zoo["buffer_size"], "hidden": [64, 64], "grad_clip": 10.0}


def rllib_dqn_config(algo: str, env_id: str, settings: dict, seed: int) -> Any:
    weights = settings.get("importance_weights")  # FastDQN's normalization of prioritized replay's weights
    replay = {"capacity": settings["capacity"]}
    if algo == "stock":
        from ray.rllib.algorithms.dqn import DQNConfig as Config
        if weights not in (None, "buffer"):
            raise ValueError(f"stock DQN normalizes importance weights over the whole buffer only; got {weights!r}.")
        replay["type"] = "PrioritizedEpisodeReplayBuffer" if settings["prioritized"] else "EpisodeReplayBuffer"
    else:
        from rl_speed.algorithms.fast_dqn import FastDQNConfig as Config
        replay["type"] = "BatchedReplayBuffer:prioritized" if settings["prioritized"] else "BatchedReplayBuffer"
        if weights is not None:
            replay["importance_weights"] = weights
    return (Config().environment(judged_id(env_id))
            .env_runners(num_env_runners=0, num_envs_per_env_runner=settings["num_envs"],
                         rollout_fragment_length=settings["fragment"])
            .training(train_batch_size_per_learner=settings["batch"], training_intensity=settings["training_intensity"],
                      n_step=settings["n_step"], lr=settings["lr"], gamma=settings["gamma"],
                      dueling=settings["dueling"], double_q=settings["double_q"],
                      target_network_update_freq=settings["target_update"],
                      num_steps_sampled_before_learning_starts=settings["learning_starts"],
                      epsilon=settings["epsilon"], grad_clip=settings["grad_clip"],
                      replay_buffer_config=replay)
            .rl_module(model_config={"fcnet_hiddens": settings["hidden"], "fcnet_activation": "relu",
                                     "head_fcnet_hiddens": []})
            .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=256)
            .debugging(seed=seed))


def rllib_config(algo: str, env_id: str, settings: dict, seed: int) -> Any:
    if algo == "stock":
        from ray.rllib.algorithms.ppo import PPOConfig as Config
    else:
        from rl_speed.algorithms.fast_ppo import FastPPOConfig as Config
    from rl_speed.registry import ENVIRONMENTS

    n, fragment = settings["num_envs"], settings["fragment"]
    config = (Config().environment(judged_id(env_id), env_config=settings.get("env_config", {}))
              .env_runners(num_env_runners=0, num_envs_per_env_runner=n, rollout_fragment_length=fragment,
                           gym_env_vectorize_mode="vector_entry_point" if env_id in ENVIRONMENTS else "sync")
              .training(train_batch_size_per_learner=n * fragment, minibatch_size=settings["minibatch"],
                        num_epochs=settings["epochs"], lr=settings["lr"], gamma=settings["gamma"],
                        lambda_=settings["lambda"], clip_param=settings.get("clip", 0.2),
                        entropy_coeff=settings.get("entropy", 0.0))
              .rl_module(model_config={"fcnet_hiddens": settings.get("hidden", [64, 64]), "fcnet_activation": "tanh",
                                       "head_fcnet_hiddens": []})
              .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=0)
              .debugging(seed=seed))
    if settings.get("sb3_loss"):
        config = config.training(vf_loss_coeff=0.5, use_kl_loss=False, grad_clip=0.5,
                                 vf_clip_param=settings.get("vf_clip", float("inf")))
    if "mixed_precision" in settings:  # rl_speed's key: FastPPO only
        config = config.training(mixed_precision=settings["mixed_precision"])
    if "vf_loss_coeff" in settings:
        config = config.training(vf_loss_coeff=settings["vf_loss_coeff"])
    if settings.get("learner_class"):  # an ablation's learner (standardization_ablation)
        config = config.learners(learner_class=settings["learner_class"])
    return config


def run_rllib(algo: str, task: Task, settings: dict, seed: int, max_seconds: float, family: str = "ppo") -> list:
    EpisodeJudge.begin()
    make = rllib_dqn_config if family == "dqn" else rllib_config
    built = build_with_every_runner(make(algo, task.env_id, settings, seed))
    try:
        while EpisodeJudge.steps < task.max_steps and time.perf_counter() - EpisodeJudge.start < max_seconds:
            built.train()
            if reached(EpisodeJudge.log, task.target, task.window):
                break
    finally:
        built.stop()
    return list(EpisodeJudge.log)


def env_steps_to_target(algo: str, task: Task, settings: dict, seed: int, max_seconds: float,
                        family: str = "ppo") -> float:
    """One :func:`run_rllib` run's env steps until the judge's target; ``task.max_steps`` if it missed (censored,
    which favours neither side of a comparison)."""
    hit = reached(run_rllib(algo, task, settings, seed, max_seconds, family), task.target, task.window)
    return float(hit[1] if hit is not None else task.max_steps)


def sb3_learn(model: Any, env: Any, timesteps: int, task: Task, max_seconds: float,
               files: JudgeFiles | None = None) -> list:
    """Trains an SB3 model until the judge's target, ``max_seconds`` or ``timesteps``; returns the judge's log (in
    ``files`` instead where the judge writes there: then read every 64 vector steps, not at each)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            if files is None:
                elapsed, log = time.perf_counter() - EpisodeJudge.start, EpisodeJudge.log
            elif self.n_calls % 64:
                return True
            else:
                elapsed, log = time.monotonic() - files.start, files.read()
            return elapsed < max_seconds and not reached(log, task.target, task.window)

    model.learn(total_timesteps=min(timesteps, task.max_steps), callback=Stop())
    env.close()
    return list(EpisodeJudge.log)


def run_sb3(task: Task, seed: int, max_seconds: float) -> list | None:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None
    import torch

    zoo = dict(task.zoo)
    timesteps = zoo.pop("n_timesteps")
    if task.env_id in LINEAR:
        lr, clip = zoo["learning_rate"], zoo["clip_range"]
        zoo["learning_rate"] = lambda progress: progress * lr  # progress_remaining: 1 -> 0 over n_timesteps
        zoo["clip_range"] = lambda progress: progress * clip
    from rl_speed.registry import ENVIRONMENTS, make_env_creator

    EpisodeJudge.begin()
    if task.env_id in ENVIRONMENTS:  # SB3 steps the scalar env, one per lane (its DummyVecEnv)
        creator = make_env_creator(task.env_id)
        env = make_vec_env(lambda: EpisodeJudge(creator(dict(task.env_config))), n_envs=zoo.pop("n_envs"), seed=seed)
    else:
        env = make_vec_env(judged_id(task.env_id), n_envs=zoo.pop("n_envs"), seed=seed)
    hidden = task.model["hidden"]
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **zoo,
                policy_kwargs={"net_arch": {"pi": hidden, "vf": hidden}, "activation_fn": torch.nn.Tanh})
    return sb3_learn(model, env, timesteps, task, max_seconds)


def run_sb3_dqn(task: Task, seed: int, max_seconds: float) -> list | None:
    try:
        from stable_baselines3 import DQN
    except ImportError:
        return None

    zoo = dict(task.dqn_zoo)
    timesteps = zoo.pop("n_timesteps")
    EpisodeJudge.begin()
    env = gym.make(judged_id(task.env_id))
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **zoo)
    return sb3_learn(model, env, timesteps, task, max_seconds)


def _contenders(task: Task, family: str, max_seconds: float) -> dict[str, Callable[[int], list | None]]:
    if family == "dqn":
        zoo = dqn_zoo_in_rllib(task)
        return {
            **({"FastDQN (ours)": lambda s: run_rllib("fast", task, task.dqn_ours, s, max_seconds, "dqn")}
               if task.dqn_ours else {}),
            "FastDQN (zoo)": lambda s: run_rllib("fast", task, zoo, s, max_seconds, "dqn"),
            "DQN (zoo)": lambda s: run_rllib("stock", task, zoo, s, max_seconds, "dqn"),
            "SB3 DQN (zoo)": lambda s: run_sb3_dqn(task, s, max_seconds),
        }
    zoo = zoo_in_rllib(task)
    return {
        **({"FastPPO (ours)": lambda s: run_rllib("fast", task, {**zoo, **task.ours}, s, max_seconds)}
           if task.ours else {}),
        f"FastPPO ({task.source})": lambda s: run_rllib("fast", task, zoo, s, max_seconds),
        f"PPO ({task.source})": lambda s: run_rllib("stock", task, zoo, s, max_seconds),
        **({f"SB3 PPO ({task.source})": lambda s: run_sb3(task, s, max_seconds)} if task.sb3 else {}),
    }
