"""Every private RLlib name rl_speed relies on, in one list, checked against the installed Ray: a Ray upgrade that
renames or drops one fails here, naming all of them at once (and ``@override`` fails at import for public hooks).

Methods are checked with ``hasattr`` on the class; instance attributes, which only exist after ``__init__`` /
``build``, by an assignment ``self.<name> =`` in the source of the class or one of its RLlib bases.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re

import pytest

pytest.importorskip("ray.rllib")

#: (module, class or "" for a module attribute, name, "method" | "attribute" | "module") -> where rl_speed uses it.
PRIVATE = [
    ("ray.rllib.utils.metrics.metrics_logger", "MetricsLogger", "_threading_lock", "attribute",
     "telemetry.lock_metrics_for_parallel_evaluation"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_value_error", "method",
     "every config check (algorithms/config.py, fast_ppo.py, fast_dqn.py)"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_rl_module_spec", "attribute",
     "FastPPOConfig.is_recurrent"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_dont_auto_sync_env_runner_states", "attribute",
     "ColumnarConfigMixin: the training step merges connector states itself (sampling.sync_connector_states)"),
    ("ray.rllib.algorithms.dqn", "DQN", "_create_local_replay_buffer_if_necessary", "method",
     "FastDQN replaces RLlib's episode buffer"),
    ("ray.rllib.core.learner.learner", "Learner", "_update", "method", "UpdateLoopMixin.run_minibatches"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_uncompiled_update", "method",
     "OptimizerStepMixin (precision, accumulation, CUDA graph)"),
    ("ray.rllib.core.learner.learner", "Learner", "_make_batch_if_necessary", "method", "UpdateLoopMixin"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_set_optimizer_lr", "method",
     "OptimizerStepMixin: a capturable optimizer's lr is a device tensor written in place"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_make_modules_ddp_if_necessary", "method",
     "OptimizerStepMixin: no DDP wrapper when a captured step averages the gradients itself"),
    ("ray.rllib.core.learner.learner", "Learner", "_check_is_built", "method", "UpdateLoopMixin.update"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_compute_off_policyness", "method",
     "OptimizerStepMixin"),
    ("ray.rllib.core.learner.learner", "Learner", "_check_component", "method", "OptimizerStepMixin.get_state"),
    ("ray.rllib.core.learner.learner", "Learner", "_weights_seq_no", "attribute", "UpdateLoopMixin.update"),
    ("ray.rllib.core.learner.learner", "Learner", "_learner_connector", "attribute",
     "learners.ppo.replace_gae_connector"),
    ("ray.rllib.core.learner.learner", "Learner", "_module", "attribute", "configure_optimizers_for_module"),
    ("ray.rllib.core.learner.learner", "Learner", "_module_optimizers", "attribute", "OptimizerStepMixin"),
    ("ray.rllib.core.learner.learner", "Learner", "_optimizer_parameters", "attribute",
     "OptimizerStepMixin, cuda_graph"),
    ("ray.rllib.core.learner.learner", "Learner", "_device", "attribute", "every learner mixin"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_callbacks", "attribute",
     "env_runners.episode_callbacks: the callback objects RLlib's runner built from callbacks_class"),
    ("ray.rllib.env.multi_agent_env_runner", "MultiAgentEnvRunner", "_callbacks", "attribute",
     "env_runners.episode_callbacks (multi-agent)"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_learner_class", "attribute",
     "algorithms.config.check_learner_class"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_device", "attribute",
     "BatchedEnvRunner: where num_gpus_per_env_runner put the module"),
    ("ray.rllib.env.multi_agent_env_runner", "MultiAgentEnvRunner", "_device", "attribute",
     "MultiAgentBatchedEnvRunner: where num_gpus_per_env_runner put the modules"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_params", "attribute",
     "OptimizerStepMixin._train_step"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_grad_scalers", "attribute",
     "OptimizerStepMixin: RLlib's own scaler falls back to RLlib's apply_gradients"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_lr_scheduler_classes", "attribute",
     "OptimizerStepMixin: torch LR schedulers fall back to RLlib's apply_gradients"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_increase_sampled_metrics", "method",
     "BatchedEnvRunner.sample_columns"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_needs_initial_reset", "attribute",
     "BatchedEnvRunner.sample (the two paths share the env)"),
    ("ray.rllib.env.multi_agent_env_runner", "MultiAgentEnvRunner", "_log_episode_metrics", "method",
     "MultiAgentBatchedEnvRunner.get_metrics (stock's own episode logging, so the keys mean the same)"),
    ("ray.rllib.env.multi_agent_env_runner", "MultiAgentEnvRunner", "_needs_initial_reset", "attribute",
     "MultiAgentBatchedEnvRunner.sample (the two paths share the envs)"),
    ("ray.rllib.env.env_runner", "EnvRunner", "_seed", "attribute",
     "BatchedEnvRunner.sample_columns (the first reset is seeded as RLlib's)"),
    ("ray.rllib.env.env_runner", "EnvRunner", "_try_env_step", "method",
     "BatchedEnvRunner: whole games counted on RLlib's sample() path (evaluation)"),
    ("ray.rllib.env.env_runner", "EnvRunner", "_try_env_reset", "method",
     "BatchedEnvRunner: a reset of RLlib's sample() path starts every lane's game anew"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_env_to_module", "attribute",
     "BatchedEnvRunner: the columnar forms of the pipeline RLlib built"),
    ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner", "_weights_seq_no", "attribute",
     "ColumnSampler (weights lag)"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward_exploration", "method",
     "BatchedEnvRunner._compute_actions"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward_inference", "method",
     "BatchedEnvRunner._compute_actions"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward_train", "method", "rl_speed's modules"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward", "method", "FastPPOTorchLearner (recurrent)"),
    ("ray.tune.registry", "", "_global_registry", "module", "registry.check_env_installed, config.probe_spaces"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_env_to_module_connector", "attribute",
     "config.check_connectors"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_module_to_env_connector", "attribute",
     "config.check_connectors"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_learner_connector", "attribute",
     "config.check_connectors"),
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter", "_filters", "attribute",
     "ColumnarMeanStdFilter (the piece's RunningStats)"),
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter", "_init_new_filters", "method",
     "ColumnarMeanStdFilter"),
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter", "_update_stats", "attribute",
     "ColumnarMeanStdFilter (frozen filters)"),
    ("ray.rllib.connectors.env_to_module.mean_std_filter", "MeanStdFilter", "_multi_agent", "attribute",
     "columnar forms refuse multi_agent=True"),
    ("ray.rllib.connectors.common.flatten_observations", "FlattenObservations", "_input_obs_base_struct",
     "attribute", "ColumnarFlattenObservations"),
    ("ray.rllib.connectors.common.flatten_observations", "FlattenObservations", "_keys_to_remove", "attribute",
     "ColumnarFlattenObservations"),
    ("ray.rllib.connectors.common.flatten_observations", "FlattenObservations", "_as_learner_connector",
     "attribute", "columnar_pipeline (RLlib exports the class as partials)"),
    ("ray.rllib.connectors.common.frame_stacking", "FrameStacking", "_as_learner_connector", "attribute",
     "columnar_pipeline, config.check_connectors (FrameStackingLearner)"),
    ("ray.rllib.connectors.env_to_module.prev_actions_prev_rewards", "PrevActionsPrevRewards", "_multi_agent",
     "attribute", "columnar forms refuse multi_agent=True"),
]


def _assigned(cls: type, name: str) -> bool:
    pattern = re.compile(rf"self\.{re.escape(name)}\s*(:[^=]*)?=")
    return any(pattern.search(_source(base)) for base in cls.__mro__
               if base.__module__.startswith("ray.") and base is not object)


@functools.cache
def _source(cls: type) -> str:
    """A class's source, read once: ``inspect.getsource`` parses the class's whole module on every call."""
    return inspect.getsource(cls)


def _missing(module_name: str, class_name: str, name: str, kind: str) -> bool:
    module = importlib.import_module(module_name)
    if kind == "module":
        return not hasattr(module, name)
    cls = getattr(module, class_name)
    return not (hasattr(cls, name) if kind == "method" else _assigned(cls, name))


def test_every_private_rllib_name_rl_speed_uses_still_exists():
    missing = [f"{module}.{cls}.{name} ({kind}; used by {where})"
               for module, cls, name, kind, where in PRIVATE if _missing(module, cls, name, kind)]
    assert not missing, "RLlib no longer has:\n" + "\n".join(missing)


def test_the_list_covers_every_private_rllib_name_in_the_learners_and_the_runner():
    """A private RLlib name newly used (or shadowed) in rl_speed's learners or runner must join the list above."""
    from pathlib import Path

    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    root = Path(__file__).parents[1] / "rl_speed"
    text = "".join(p.read_text() for p in [*root.glob("learners/*.py"), root / "env_runners" / "batched.py"])
    # names read or written on self, and private methods overridden (a base that drops one stops calling it)
    used = set(re.findall(r"\bself\.(_[a-z][a-z_]*)", text)) | set(re.findall(r"\bdef (_[a-z][a-z_]*)\(", text))
    bases = (PPOTorchLearner, DQNTorchLearner, SingleAgentEnvRunner)
    from_rllib = {name for name in used if any(hasattr(b, name) or _assigned(b, name) for b in bases)}
    unlisted = sorted(from_rllib - {name for _, _, name, _, _ in PRIVATE})
    assert not unlisted, f"private RLlib names used but not listed in PRIVATE: {unlisted}"


def test_every_rllib_method_rl_speed_overrides_carries_override():
    """``@override(Base)`` fails at import when a Ray release drops or renames the method; an undecorated override
    would silently stop being called."""
    import pkgutil

    import rl_speed

    undecorated = []
    for info in pkgutil.walk_packages(rl_speed.__path__, "rl_speed."):
        if info.name.startswith("rl_speed.cli"):
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            rllib_bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("ray.")]
            for name, value in vars(cls).items():
                if (name.startswith("__") and name != "__init__") or not any(name in vars(b) for b in rllib_bases):
                    continue
                function = getattr(value, "__func__", value)
                if callable(function) and not any("@override" in line
                                                  for line in inspect.getsourcelines(function)[0][:4]):
                    undecorated.append(f"{cls.__module__}.{cls.__name__}.{name}")
    assert not undecorated, f"RLlib methods overridden without @override: {undecorated}"
