"""Reads and validates the old RLlib YAML experiment format, entirely on the driver and before Ray starts.

Format (as ``rllib train file x.yaml`` took it before Ray 2.x removed the command)::

    experiment-name:
      run: PPO                # an rl_speed algorithm (FastDQN, ...) or any RLlib built-in
      env: rl_speed/Snake-v0  # or config.env; a Tune-registered name, gymnasium id or "module:EnvId"
      stop: {training_iteration: 10}
      config: {...}           # new-stack AlgorithmConfig keys, applied with update_from_dict()
      checkpoint_config: {checkpoint_at_end: true}
      num_samples: 1

Ray-2.9-era keys (``num_workers``, ``num_sgd_iter``, ``model:``, ``observation_filter``, stop on
``episode_reward_mean``, ...) are translated to their new-stack form with one notice each (:mod:`rl_speed.migrate`),
unless ``strict``. Connectors are named by class: ``env_to_module_connector: [MeanStdFilter]`` or
``[{FrameStackingEnvToModule: {num_frames: 4}}]`` (RLlib's env-to-module pieces), ``learner_connector:
[{FrameStackingLearner: {num_frames: 4}}]``.

Every problem becomes an :class:`ExperimentFileError`: one paragraph naming the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

EXPERIMENT_KEYS = ("run", "env", "stop", "config", "checkpoint_config", "num_samples")
# Keys update_from_dict() handles itself although they are not attributes of AlgorithmConfig.
_SPECIAL_CONFIG_KEYS = {"multiagent", "enable_rl_module_and_learner", "enable_env_runner_and_connector_v2"}
# Read-only properties that we route to their setter method ourselves.
_ROUTED_CONFIG_KEYS = {"model_config", "rl_module", "env_to_module_connector", "learner_connector"}


class ExperimentFileError(ValueError):
    """A problem in an experiment file or a flag, with where it is and how to fix it."""

    def __init__(self, source: str, key: str | None, problem: str, fix: str) -> None:
        where = f"{source}, key `{key}`" if key else source
        super().__init__(f"Error in {where}: {problem} Fix: {fix}")
        self.source, self.key = source, key


@dataclass
class Experiment:
    """One validated experiment, ready for Tune."""

    name: str
    algo_class: type
    config: Any  # an AlgorithmConfig
    stop: dict[str, float] = field(default_factory=dict)
    checkpoint_config: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 1
    notices: list[str] = field(default_factory=list)  # old keys translated (rl_speed.migrate)


def parse_json_flag(flag: str, text: str | None) -> dict:
    """Parses ``--stop`` / ``--config`` JSON; an error names the flag and shows valid syntax."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExperimentFileError(
            f"the {flag} flag", None, f"{text!r} is not valid JSON ({e.msg} at column {e.colno}).",
            f"quote it for the shell and use JSON syntax, e.g. {flag} '{{\"training_iteration\": 5}}'.",
        ) from None
    if not isinstance(value, dict):
        raise ExperimentFileError(f"the {flag} flag", None, f"{text!r} is not a JSON object.",
                                  f"pass an object, e.g. {flag} '{{\"key\": value}}'.")
    return value


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` over ``base``; nested dicts merge key by key (as the old RLlib CLI merged ``--config``)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_experiments(path: str | Path, stop_override: dict | None = None,
                     config_override: dict | None = None, strict: bool = False,
                     only: list[str] | None = None) -> list[Experiment]:
    """Parses and validates every experiment in ``path`` (with ``only``: the experiments of those names, in the
    file's order; the others are not checked); flags' dicts are merged over each experiment's. Old keys are
    translated (each with a notice in ``Experiment.notices``), or refused with ``strict``."""
    from rl_speed import register

    register()
    source = str(path)
    raw = _read_yaml(Path(path))
    if not isinstance(raw, dict) or not raw:
        raise ExperimentFileError(source, None, "the file does not hold a mapping of experiment names to experiments.",
                                  "start the file with `my-experiment:` and indent `run:`, `env:`, `config:` under it.")
    if only is not None:
        unknown = [name for name in only if name not in map(str, raw)]
        if unknown:
            raise ExperimentFileError(source, None, f"there is no experiment {unknown[0]!r}; the file holds "
                                      f"{sorted(map(str, raw))}.", "name one of those (--experiment NAME).")
        raw = {name: spec for name, spec in raw.items() if str(name) in only}
    # Building configs makes RLlib log advice ("You are running PPO on the new API stack!") that would bury our
    # one-paragraph errors; the trial logs it again when it really starts.
    rllib_logger = logging.getLogger("ray.rllib")
    level = rllib_logger.level
    rllib_logger.setLevel(logging.ERROR)
    try:
        return [_experiment(source, str(name), spec, stop_override or {}, config_override or {}, strict)
                for name, spec in raw.items()]
    finally:
        rllib_logger.setLevel(level)


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ExperimentFileError(str(path), None, "the file does not exist.",
                                  "pass the path of a YAML file, e.g. tuned_examples/snake_ppo.yaml.")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ExperimentFileError(str(path), None, f"YAML syntax error{at}: {problem}.",
                                  "check indentation (spaces, not tabs), colons after keys and matching quotes.") from None


def _experiment(source: str, name: str, spec: Any, stop_override: dict, config_override: dict,
                strict: bool = False) -> Experiment:
    from rl_speed import registry
    from rl_speed.migrate import MigrationError, migrate_experiment

    where = f"experiment `{name}`"
    if not isinstance(spec, dict):
        raise ExperimentFileError(source, name, f"{where} is not a mapping.",
                                  "indent `run:`, `env:`, `stop:` and `config:` under the experiment name.")
    try:
        spec, notices = migrate_experiment(spec, strict=strict)
    except MigrationError as e:
        raise ExperimentFileError(source, name, str(e), "change the key as the message says (`rl-speed migrate "
                                  f"{source}` prints the translated file).") from None
    for key in spec:
        if key not in EXPERIMENT_KEYS:
            raise ExperimentFileError(source, f"{name}.{key}", f"`{key}` is not an experiment key{_did_you_mean(key, EXPERIMENT_KEYS)}.",
                                      f"use only {', '.join(EXPERIMENT_KEYS)}; algorithm settings go under `config:`.")
    if "run" not in spec:
        raise ExperimentFileError(source, f"{name}.run", f"{where} has no `run` key.",
                                  "add `run: PPO` (or another algorithm, e.g. DQN, FastDQN).")
    run = spec["run"]
    try:
        algo_class = registry.resolve_algorithm(str(run))
    except KeyError:
        known = registry.known_algorithms()
        raise ExperimentFileError(source, f"{name}.run", f"unknown algorithm {run!r}{_did_you_mean(str(run), known)}.",
                                  f"use one of: {', '.join(known)}.") from None

    config = deep_merge(_mapping(source, name, spec, "config"), config_override)
    env = spec.get("env", config.get("env"))
    if env is None:
        raise ExperimentFileError(source, f"{name}.env", f"{where} names no environment.",
                                  "add `env: rl_speed/Snake-v0` (or any registered or gymnasium env id).")
    if not isinstance(env, str) or not registry.env_is_known(env):
        known = sorted(registry.ENVIRONMENTS)
        raise ExperimentFileError(source, f"{name}.env", f"unknown environment {env!r}{_did_you_mean(str(env), known)}.",
                                  f"use an rl_speed env ({', '.join(known)}), a gymnasium id such as CartPole-v1, "
                                  "a name registered with ray.tune.register_env, or 'module:EnvId'.")
    config["env"] = env
    env_config = config.get("env_config") or {}
    if env in registry.ENVIRONMENTS and isinstance(env_config, dict):  # key names first: a typo is named even
        try:                                                              # before an optional extra is installed
            registry.check_env_keys(env, env_config)
        except ValueError as e:
            raise ExperimentFileError(source, f"{name}.config.env_config", str(e),
                                      f"see the Arguments section of {env}'s docstring.") from None
    try:
        registry.check_env_installed(env)
    except ImportError as e:
        raise ExperimentFileError(source, f"{name}.env", f"{env} cannot start: {e}", "run the command above.") \
            from None
    algo_config = _algorithm_config(source, name, algo_class, config)
    if env in registry.ENVIRONMENTS:
        try:
            vector = registry.runners_build_vector_form(algo_config)
            registry.check_env_config(env, dict(algo_config.env_config),
                                      algo_config.num_envs_per_env_runner if vector else None)
        except (ValueError, TypeError) as e:
            raise ExperimentFileError(source, f"{name}.config.env_config", str(e),
                                      f"see the Arguments section of {env}'s docstring.") from None

    stop = deep_merge(_mapping(source, name, spec, "stop"), stop_override)
    for key, value in stop.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExperimentFileError(source, f"{name}.stop.{key}", f"stop value {value!r} is not a number.",
                                      "give a number, e.g. `training_iteration: 10` or `time_total_s: 60`.")
    return Experiment(name, algo_class, algo_config, stop, _checkpoint_config(source, name, spec),
                      _num_samples(source, name, spec), notices)


def _mapping(source: str, name: str, spec: dict, key: str) -> dict:
    value = spec.get(key) or {}
    if not isinstance(value, dict):
        raise ExperimentFileError(source, f"{name}.{key}", f"`{key}` must be a mapping, got {value!r}.",
                                  f"indent `{key}`'s entries under it as `name: value` lines.")
    return value


def unknown_config_key(algo_class: type, keys: Any) -> tuple[str, str, str] | None:
    """The first of ``keys`` that is no config key of ``algo_class`` (RLlib's ``update_from_dict`` would set it as a
    stray attribute that nothing reads), what is wrong and how to fix it; None where all are config keys."""
    default = algo_class.get_default_config()
    known = {k for k in vars(default) if not k.startswith("_")}
    for cls in type(default).__mro__:  # settable properties (read-only ones would crash update_from_dict)
        known |= {k for k, v in vars(cls).items() if isinstance(v, property) and v.fset is not None}
    known |= _ROUTED_CONFIG_KEYS
    for key in keys:
        translated = default._translate_special_keys(key, warn_deprecated=False)
        if translated in known or translated in _SPECIAL_CONFIG_KEYS or translated.startswith("evaluation_"):
            continue
        return (key, f"`{key}` is not a config key of {algo_class.__name__}{_did_you_mean(key, sorted(known))}.",
                f"use new-API-stack AlgorithmConfig keys (see {type(default).__name__}'s methods, "
                "e.g. `num_env_runners`, `train_batch_size_per_learner`, `lr`).")
    return None


def _algorithm_config(source: str, name: str, algo_class: type, config: dict) -> Any:
    unknown = unknown_config_key(algo_class, config)
    if unknown is not None:
        key, problem, fix = unknown
        raise ExperimentFileError(source, f"{name}.config.{key}", problem, fix)
    default = algo_class.get_default_config()
    for key, value in config.items():  # RLlib does not type-check these; a string would fail deep inside a trial
        default_value = getattr(default, default._translate_special_keys(key, warn_deprecated=False), None)
        if isinstance(default_value, (int, float)) and not isinstance(default_value, bool) and isinstance(value, str):
            raise ExperimentFileError(source, f"{name}.config.{key}", f"`{key}` must be a number, got {value!r}.",
                                      f"write a number, e.g. `{key}: {default_value}`.")
    config = dict(config)
    connectors = {key: _connector_factory(source, name, key, config.pop(key))
                  for key in ("env_to_module_connector", "learner_connector") if key in config}
    module_class = None
    if "rl_module" in config:
        from rl_speed.registry import MODULES, resolve_module

        try:
            module_class = resolve_module(config.pop("rl_module"))
        except (KeyError, ImportError, AttributeError, ValueError) as e:
            raise ExperimentFileError(source, f"{name}.config.rl_module", f"unknown RLModule {e}.",
                                      f"use one of {', '.join(sorted(MODULES))} or a 'package.module:Class' path.") \
                from None
    from rl_speed.algorithms.config import ColumnarConfigMixin, check_model_config_keys, update_config

    try:
        algo_config = update_config(default, config)
        if "env_to_module_connector" in connectors:
            algo_config.env_runners(env_to_module_connector=connectors["env_to_module_connector"])
        if "learner_connector" in connectors:
            algo_config.training(learner_connector=connectors["learner_connector"])
        if module_class is not None:
            from ray.rllib.core.rl_module.rl_module import RLModuleSpec

            algo_config.rl_module(rl_module_spec=RLModuleSpec(module_class=module_class))
        algo_config.validate()  # RLlib's own checks (e.g. minibatch_size <= train_batch_size_per_learner)
        if not isinstance(algo_config, ColumnarConfigMixin):  # (a columnar config's validate() checked them)
            check_model_config_keys(algo_config, algo_class.__name__)  # stock PPO on one of rl_speed's modules
    except Exception as e:
        problem = str(e).split("\nTo suppress all validation errors")[0].strip()
        raise ExperimentFileError(source, f"{name}.config", f"{algo_class.__name__} rejected the config: {problem}",
                                  "correct the value named in that message.") from None
    return algo_config


#: Connector pieces a YAML file may name, per config key: RLlib's env-to-module pieces and its frame-stacking learner
#: piece (name -> "module:attribute").
CONNECTORS = {
    "env_to_module_connector": {
        "MeanStdFilter": "ray.rllib.connectors.env_to_module:MeanStdFilter",
        "FlattenObservations": "ray.rllib.connectors.env_to_module:FlattenObservations",
        "PrevActionsPrevRewards": "ray.rllib.connectors.env_to_module:PrevActionsPrevRewards",
        "FrameStackingEnvToModule": "ray.rllib.connectors.env_to_module.frame_stacking:FrameStackingEnvToModule",
    },
    "learner_connector": {
        "FrameStackingLearner": "ray.rllib.connectors.learner.frame_stacking:FrameStackingLearner",
    },
}


def _connector_factory(source: str, name: str, key: str, value: Any) -> Callable:
    """``[Name, {Name: {kwargs}}, ...]`` (or one name) -> the factory RLlib's config takes for ``key``."""
    known = CONNECTORS[key]
    pieces = []
    for item in value if isinstance(value, list) else [value]:
        piece, kwargs = next(iter(item.items())) if isinstance(item, dict) and len(item) == 1 else (item, {})
        if piece not in known or not isinstance(kwargs, dict):
            first = next(iter(known))
            raise ExperimentFileError(source, f"{name}.config.{key}", f"{item!r} is not a connector piece this file "
                                      f"can name{_did_you_mean(str(piece), known)}.",
                                      f"list pieces by class name, e.g. `{key}: [{first}]`, with arguments as "
                                      f"`{{{first}: {{...}}}}`; pieces: {', '.join(known)}.")
        pieces.append((known[piece], kwargs))

    def build(*_: Any) -> list:  # (env, spaces, device) or (obs space, action space): RLlib passes both forms
        import importlib

        def make(path: str, kwargs: dict) -> Any:
            module, _, attribute = path.partition(":")
            return getattr(importlib.import_module(module), attribute)(**kwargs)

        return [make(path, kwargs) for path, kwargs in pieces]

    return build


def _checkpoint_config(source: str, name: str, spec: dict) -> dict:
    from ray.tune import CheckpointConfig

    value = {"checkpoint_at_end": True} | _mapping(source, name, spec, "checkpoint_config")
    allowed = [f.name for f in dataclasses.fields(CheckpointConfig) if not f.name.startswith("_")]
    for key in value:
        if key not in allowed:
            raise ExperimentFileError(source, f"{name}.checkpoint_config.{key}",
                                      f"`{key}` is not a checkpoint setting{_did_you_mean(key, allowed)}.",
                                      f"use {', '.join(allowed)}.")
    return value


def _num_samples(source: str, name: str, spec: dict) -> int:
    value = spec.get("num_samples", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExperimentFileError(source, f"{name}.num_samples", f"num_samples {value!r} is not a positive integer.",
                                  "use 1 or more.")
    return value


def _did_you_mean(word: str, candidates: Any) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
