"""Ray-2.9-era experiment files on the new API stack: the one table of renamed keys, and the translation.

RLlib's own YAML files of that era (``cartpole-ppo.yaml``, ``pendulum-ppo.yaml``, ...) say ``num_workers``,
``num_sgd_iter``, ``model: {...}``, ``observation_filter: MeanStdFilter`` and stop on ``episode_reward_mean``.
:func:`migrate_experiment` rewrites one experiment to the new keys and returns one notice per key it changed, so
``rl-speed train`` / ``rllib train file`` run such a file (printing the notices), ``rl-speed migrate OLD.yaml`` prints
the translated file, and ``rl-speed train --strict`` refuses old keys instead. A key whose old meaning the new stack
does not have, and which would change what trains (``framework: tf``), is an error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rename:
    new: str | None  # None: the key is dropped (with its notice)
    why: str
    value: Callable[[Any], Any] | None = None  # translates the value, where it changed form


def _filter(value: Any) -> Any:
    if value == "MeanStdFilter":
        return ["MeanStdFilter"]
    if value in ("NoFilter", None):
        return None
    raise MigrationError(f"`observation_filter: {value}` has no new-stack form; use MeanStdFilter or NoFilter.")


def _num_gpus(value: Any) -> Any:
    # The old key gave the local learner that many GPUs (a fraction: a share of one). The new stack gives each
    # learner one; several GPUs mean several learners, which changes the run, so it is the user's call.
    if value > 1:
        raise MigrationError(f"`num_gpus: {value}` trained one learner on {value} GPUs; the new stack runs one "
                             f"learner per GPU: set `num_learners: {int(value)}` and `num_gpus_per_learner: 1`.")
    return 1 if value else 0


#: config key -> its new-stack form (RLlib's migration guide; one row each, each tested).
CONFIG_RENAMES: dict[str, Rename] = {
    "num_workers": Rename("num_env_runners", "env runners replaced rollout workers"),
    "num_rollout_workers": Rename("num_env_runners", "env runners replaced rollout workers"),
    "num_envs_per_worker": Rename("num_envs_per_env_runner", "env runners replaced rollout workers"),
    "num_cpus_per_worker": Rename("num_cpus_per_env_runner", "env runners replaced rollout workers"),
    "num_gpus_per_worker": Rename("num_gpus_per_env_runner", "env runners replaced rollout workers"),
    "evaluation_num_workers": Rename("evaluation_num_env_runners", "env runners replaced rollout workers"),
    "num_sgd_iter": Rename("num_epochs", "renamed in Ray 2.10"),
    "sgd_minibatch_size": Rename("minibatch_size", "renamed in Ray 2.10"),
    "train_batch_size": Rename("train_batch_size_per_learner", "the new stack sizes batches per learner (the same "
                                                               "with 0 or 1 learners)"),
    "lambda": Rename("lambda_", "`lambda` is a Python keyword"),
    "model": Rename("model_config", "RLModules read `model_config` (same sub-keys as `model`)"),
    "observation_filter": Rename("env_to_module_connector", "filters are env-to-module connectors now",
                                 _filter),
    "num_gpus": Rename("num_gpus_per_learner", "the learner holds the GPU on the new stack", _num_gpus),
    "framework": Rename(None, "the new stack is torch only"),
    "enable_connectors": Rename(None, "connectors are always on in the new stack"),
    "_enable_new_api_stack": Rename(None, "the new stack is the only one rl_speed runs"),
}

#: stop key -> its new result key.
STOP_RENAMES: dict[str, str] = {
    "timesteps_total": "env_runners/num_env_steps_sampled_lifetime",
    "episode_reward_mean": "env_runners/episode_return_mean",
    "episode_reward_max": "env_runners/episode_return_max",
    "episode_reward_min": "env_runners/episode_return_min",
    "episodes_total": "env_runners/num_episodes_lifetime",
    "episode_len_mean": "env_runners/episode_len_mean",
}

#: `model` sub-keys of that era that DefaultModelConfig no longer has, and why.
MODEL_REMOVED = {
    "lstm_use_prev_action": "use the PrevActionsPrevRewards connector "
                            "(`env_to_module_connector: [PrevActionsPrevRewards, FlattenObservations]`)",
    "lstm_use_prev_reward": "use the PrevActionsPrevRewards connector "
                            "(`env_to_module_connector: [PrevActionsPrevRewards, FlattenObservations]`)",
    "custom_model": "write an RLModule and name it with `rl_module: package.module:Class`",
    "custom_model_config": "pass the settings in `model_config` to your RLModule",
}


class MigrationError(ValueError):
    """An old key whose meaning the new stack does not have."""


def migrate_experiment(spec: dict, strict: bool = False) -> tuple[dict, list[str]]:
    """One experiment with Ray-2.9-era keys -> (the same experiment in new-stack keys, one notice per change).

    With ``strict`` any old key raises :class:`MigrationError` instead."""
    spec = dict(spec)
    notices: list[str] = []
    config = dict(spec.get("config") or {})
    if config.get("framework") not in (None, "torch"):
        raise MigrationError(f"`framework: {config['framework']}`: rl_speed and RLlib's new stack train with torch "
                             "only; set `framework: torch` or remove the key.")
    for old, rename in CONFIG_RENAMES.items():
        if old not in config:
            continue
        if strict:
            raise MigrationError(f"`{old}` is a Ray-2.9-era key ({rename.why}); use "
                                 f"{'`' + rename.new + '`' if rename.new else 'nothing (remove it)'} "
                                 "(`rl-speed migrate FILE` prints the translated file).")
        value = config.pop(old)
        if rename.value is not None:
            value = rename.value(value)
        if rename.new is None or value is None:
            notices.append(f"`{old}` removed: {rename.why}.")
            continue
        if rename.new in config:
            raise MigrationError(f"both `{old}` and its new form `{rename.new}` are set; keep only `{rename.new}`.")
        config[rename.new] = value
        notices.append(f"`{old}` -> `{rename.new}`" + (f": {value!r}" if rename.value else "") + f" ({rename.why}).")
    model = config.get("model_config")
    if isinstance(model, dict):
        for key, why in MODEL_REMOVED.items():
            if key in model and model[key]:
                raise MigrationError(f"`model.{key}` has no new-stack form: {why}.")
        config["model_config"] = {k: v for k, v in model.items() if k not in MODEL_REMOVED}
    stop = dict(spec.get("stop") or {})
    for old, new in STOP_RENAMES.items():
        if old in stop:
            if strict:
                raise MigrationError(f"stop key `{old}` is a Ray-2.9-era result key; use `{new}`.")
            stop[new] = stop.pop(old)
            notices.append(f"stop `{old}` -> `{new}` (the new stack's result key).")
    if config or "config" in spec:
        spec["config"] = config
    if stop or "stop" in spec:
        spec["stop"] = stop
    return spec, notices
