"""FastPPO: RLlib's PPO on the columnar data path.

Same config keys, module and loss as RLlib's PPO; what changes is the data path of ``training_step``:

    BatchedEnvRunner.sample_columns() on every runner -> [T, N] columns per runner
    -> learner_group.update(): the local learner gets the runners' batches and joins them along N on its device;
       learner actors each get references to an equal share of the runners' batches and fetch them themselves
       (the driver never copies the data; where the runners do not divide evenly over the learners, the driver
       joins the batches and splits them along N instead)
    -> FastPPOTorchLearner: values over [T + 1, N], GAE over [T, N] on the learner's device, num_epochs x minibatches

No episode objects and no learner connector pipeline. Each iteration reports where its time went
(``rl_speed_profile``: sampling, advantages, learning, weight sync, as seconds and shares of the iteration; see
:mod:`rl_speed.algorithms.telemetry`). Evaluation is RLlib's own (its ``sample()`` on the evaluation runners).
Env-to-module connectors run in their columnar forms (:mod:`rl_speed.connectors.env_to_module`); RLlib's LSTM
(``use_lstm``) trains on RLlib's padded sequences (:mod:`rl_speed.learners.sequences`). Differences from stock PPO
(stated, not hidden): ``batch_mode`` must be ``truncate_episodes`` for training; advantages are standardized over
real steps only (NEXT_STEP reset steps are masked), where RLlib's GAE connector also counts the bootstrap row it
appends to each episode chunk; and an epoch is one pass over the ``[T, N]`` rows, where RLlib's cyclic minibatch
iterator counts those appended rows too (about 10% more minibatches on CartPole at rl-zoo's settings). On CartPole
the two together made stock need 1.30x fewer env steps (docs/studies/time-to-a-score.md, "The CartPole sample gap").
"""

from __future__ import annotations

from typing import Any

import ray
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.core import ALL_MODULES
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
)

from rl_speed.algorithms.config import ColumnarConfigMixin
from rl_speed.algorithms.sampling import ColumnSampler, sync_connector_states, sync_weights_if_due
from rl_speed.algorithms.telemetry import PROFILE_KEY, PhaseTimer, lock_metrics_for_parallel_evaluation
from rl_speed.columns import concat_lanes, split_lanes
from rl_speed.env_runners.batched import bptt_horizon
from rl_speed.env_runners.shared_inference import connect_runners, publish_learner_weights, serve_runners
from rl_speed.learners.ppo import ADVANTAGES_TIME_KEY, JOIN_TIME_KEY, FastPPOTorchLearner
from rl_speed.learners.ppo_loss import PPO_LOSS_KEY, PPO_LOSSES
from rl_speed.learners.update_loop import UPDATES_TIME_KEY
from rl_speed.modules.recurrent import RecurrentActorCritic
from rl_speed.ray_start import import_learner_modules_beside_runners

__all__ = ["PROFILE_KEY", "FastPPO", "FastPPOConfig"]


class FastPPOConfig(ColumnarConfigMixin, PPOConfig):
    """PPOConfig plus the columnar keys (``sync_weights_every``, ``async_sampling``: see
    :class:`ColumnarConfigMixin`) and ``bptt_horizon`` (chunk length for recurrent modules); every PPO key keeps its
    meaning. Defaults that differ: the env runner (BatchedEnvRunner) and the learner (FastPPOTorchLearner: PPO's loss
    on column batches, fused gradient clip + finiteness check)."""

    multi_agent_learners = True  # the learners agree on each module's minibatch count (rl_speed.learners.update_loop)
    supports_cuda_graph = True  # the loss has no host syncs (rl_speed.learners.ppo_loss, rl_speed.learners.cuda_graph)
    cuda_graph_learners = True  # the batch splits evenly over the learners (checked in validate below)
    supports_cuda_graph_env_runners = True  # the runners sample the module's categorical policy
    supports_shared_inference = True  # likewise, so the learner's process can draw it for them
    supports_turn_based_envs = True  # GAE follows the `next_row` column (rl_speed.env_runners.multi_agent)
    supports_mixed_spaces = True  # the learner reads the per-module columns (rl_speed.columns.BY_MODULE)

    @override(PPOConfig)
    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or FastPPO)
        self.bptt_horizon: int | None = None

    @override(PPOConfig)
    def get_default_learner_class(self) -> type:
        return FastPPOTorchLearner

    @override(PPOConfig)
    def training(self, *, bptt_horizon: int | None = NotProvided, **kwargs: Any) -> "FastPPOConfig":
        super().training(**kwargs)
        if bptt_horizon is not NotProvided:
            self.bptt_horizon = bptt_horizon
        return self

    @override(PPOConfig)
    def validate(self) -> None:
        self.validate_columnar("FastPPO")
        super().validate()
        if self.in_evaluation:
            return
        lanes = self.num_lanes
        learners = max(1, self.num_learners)
        if lanes % learners:
            self._value_error(
                f"FastPPO: the {lanes} env lanes (num_envs_per_env_runner={self.num_envs_per_env_runner} x "
                f"num_env_runners={max(1, self.num_env_runners)}) must split evenly over num_learners={learners}; "
                "change num_envs_per_env_runner or num_learners.")
        loss = (self.learner_config_dict or {}).get(PPO_LOSS_KEY, "sync_free")
        if loss not in PPO_LOSSES:
            self._value_error(f"FastPPO: `learner_config_dict['{PPO_LOSS_KEY}']`={loss!r} must be one of "
                              f"{', '.join(map(repr, PPO_LOSSES))} (rl_speed/learners/ppo_loss.py).")
        if not self.use_gae or not self.use_critic:
            self._value_error("FastPPO: `use_gae` and `use_critic` must be True (advantages come from GAE on the "
                              "learner); use stock PPO for the critic-free variants.")
        if self.uses_padded_sequences and learners > 1:
            self._value_error("FastPPO: RLlib-style stateful modules (`model_config.use_lstm`, or your own module "
                              "with a recurrent state) train on padded sequences whose number differs between "
                              "learners, which DDP cannot step in lockstep; use `num_learners` 0 or 1, or rl_speed's "
                              "recurrent module (`rl_module: recurrent`).")
        fragment = self.get_rollout_fragment_length()
        if self.is_recurrent:
            horizon = self.bptt_horizon if self.bptt_horizon is not None else bptt_horizon(self)
            if not isinstance(horizon, int) or horizon < 1:
                self._value_error(f"FastPPO: `bptt_horizon`={horizon!r} must be an integer >= 1.")
            if fragment % horizon:
                # The runner records the recurrent state at every chunk start, so a rollout is whole chunks.
                fitting = -(-fragment // horizon) * horizon
                source = ("`max_seq_len` in the module's model_config" if self.bptt_horizon is None
                          else "`bptt_horizon`")
                self._value_error(
                    f"FastPPO: `rollout_fragment_length`={fragment} is not a multiple of the recurrent chunk length "
                    f"{horizon} ({source}); the columnar runner samples whole chunks. Set rollout_fragment_length="
                    f"{fitting}, or 'auto' (which rounds up to whole chunks), or a chunk length that divides "
                    f"{fragment}.")
            # RLlib-style stateful modules: minibatches of whole padded sequences, as many as fit in minibatch_size
            # steps (as in stock PPO); rl_speed's module: an explicit bptt_horizon must divide the minibatch.
            if (isinstance(self.minibatch_size, int) and self.minibatch_size % horizon
                    and not self.uses_padded_sequences):
                self._value_error(f"FastPPO: `minibatch_size`={self.minibatch_size} must be a multiple of "
                                  f"`bptt_horizon`={horizon} (minibatches are whole chunks).")
        per_learner = fragment * lanes // learners
        # (Multi-agent: a copy holds several agent lanes and each module's rows vary per iteration, so a learner's
        # steps are not known here; a minibatch beyond a module's rows is all of them, as in RLlib.)
        if isinstance(self.minibatch_size, int) and self.minibatch_size > per_learner and not self.is_multi_agent:
            self._value_error(
                f"FastPPO: `minibatch_size`={self.minibatch_size} is larger than the {per_learner} steps each "
                f"learner gets per iteration (rollout_fragment_length {fragment} x {lanes} lanes / {learners} "
                "learners); lower `minibatch_size` or raise `train_batch_size_per_learner`.")

    @override(PPOConfig)
    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """RLlib's ``auto`` rollout, but one length for every runner: ``ceil(train batch / env lanes)``. Where the batch
        does not divide by the lanes, RLlib gives the first runners one step more than the others, and columns from
        runners of different lengths cannot join; so the batch rounds up to a multiple of the lanes (512 over 40
        lanes: 13 steps each, 520), as it already does for a single runner. With a recurrent module the rollout also
        rounds up to whole chunks of ``bptt_horizon`` (or ``max_seq_len``) steps, because the runner records the state
        at every chunk start where RLlib pads its sequences: 1,024 over 2 lanes with ``max_seq_len`` 20 gives 520
        steps each. A number given is used as it is (and refused at validation if it is not whole chunks)."""
        if self.rollout_fragment_length != "auto":
            return self.rollout_fragment_length
        steps = max(1, -(-self.total_train_batch_size // self.num_lanes))
        if self.is_recurrent:
            horizon = self.bptt_horizon if self.bptt_horizon is not None else bptt_horizon(self)
            if isinstance(horizon, int) and horizon >= 1:
                steps = -(-steps // horizon) * horizon
        return steps

    @property
    def num_lanes(self) -> int:
        """Env lanes over all runners: ``num_envs_per_env_runner`` x ``num_env_runners`` (1 for the local runner)."""
        return self.num_envs_per_env_runner * max(1, self.num_env_runners or 0)

    @property
    def is_recurrent(self) -> bool:
        """rl_speed's recurrent module, RLlib's LSTM (``model_config.use_lstm``), or a user's stateful module."""
        module_class = self._module_class
        return ((isinstance(module_class, type) and issubclass(module_class, RecurrentActorCritic))
                or self.uses_padded_sequences)

    @property
    def uses_padded_sequences(self) -> bool:
        """Stateful modules that act on ``[B, 1, ...]`` and train on RLlib's padded sequences: RLlib's LSTM, and a
        user's module class that defines its own ``get_initial_state`` (RLlib calls a module stateful when its
        initial state is not empty, which needs a built module; a class that defines the method is taken at its
        word, as RLlib's own example LSTM module does)."""
        from ray.rllib.algorithms.ppo.default_ppo_rl_module import DefaultPPORLModule
        from ray.rllib.core.rl_module.rl_module import RLModule
        from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

        if (self.model_config or {}).get("use_lstm"):
            return True
        module_class = self._module_class
        if not isinstance(module_class, type) or issubclass(module_class, RecurrentActorCritic):
            return False
        stateless = (RLModule.get_initial_state, TorchRLModule.get_initial_state, DefaultPPORLModule.get_initial_state)
        return module_class.get_initial_state not in stateless

    @property
    def _module_class(self) -> Any:
        return getattr(self._rl_module_spec, "module_class", None) if self._rl_module_spec else None


class FastPPO(PPO):
    """PPO whose training step moves ``[T, N]`` columns, never episode objects (see the module docstring)."""

    @classmethod
    @override(PPO)
    def get_default_config(cls) -> FastPPOConfig:
        return FastPPOConfig()

    @override(PPO)
    def setup(self, config: Any) -> None:
        import_learner_modules_beside_runners(config)  # (while super().setup waits for the runners)
        super().setup(config)
        self._sampler = ColumnSampler(self, by_reference=not self.learner_group.is_local)
        self._timer = PhaseTimer(self, ("sample", "advantages", "learn", "sync_weights"))
        lock_metrics_for_parallel_evaluation(self)
        # shared_inference: the remote runners' action step served from this process (the local learner's)
        self._inference = serve_runners(self) if self.config.shared_inference else None

    @override(PPO)
    def restore_env_runners(self, env_runner_group: Any) -> list[int]:
        restored = super().restore_env_runners(env_runner_group)
        if restored and self._inference is not None and env_runner_group is self.env_runner_group:
            connect_runners(self, self._inference, restored)  # (a restarted runner is a new process)
        return restored

    @override(PPO)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        if getattr(self, "_inference", None) is not None:  # the restored weights, as the version the runners got
            publish_learner_weights(self, self._inference)

    @override(PPO)
    def cleanup(self) -> None:
        super().cleanup()  # (the runners first: they close their ends)
        if getattr(self, "_inference", None) is not None:
            self._inference.stop()
            self._inference = None

    @override(PPO)
    def training_step(self) -> None:
        cfg = self.config
        timer = self._timer
        timer.begin_step()
        with timer.phase("sample", ENV_RUNNER_SAMPLING_TIMER):
            samples = self._sampler.sample()
        if not samples:  # every runner failed this iteration; with restart_failed_env_runners RLlib restarts them
            return
        self.metrics.aggregate([s.metrics for s in samples], key=ENV_RUNNER_RESULTS)
        sync_connector_states(self, samples)
        lifetime = self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        with timer.phase("learn", LEARNER_UPDATE_TIMER):
            data = self._training_data([s.columns for s in sorted(samples, key=lambda s: s.worker_index)])
            results = self.learner_group.update(
                **data, minibatch_size=cfg.minibatch_size, num_epochs=cfg.num_epochs,
                shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime, NUM_AGENT_STEPS_SAMPLED_LIFETIME: lifetime})
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
        spread = log_learner_spread(self, results)
        timer.move(spread.get("learner_advantages_s_max", 0.0), "learn", "advantages")

        with timer.phase("sync_weights", SYNCH_WORKER_WEIGHTS_TIMER):
            sync_weights_if_due(self)
        sampled = sum(s.num_steps for s in samples)
        timer.report(sampled, cfg.num_epochs * max(1, -(-sampled // (cfg.minibatch_size or sampled))))

    def _training_data(self, batches: list) -> dict:
        """The runners' column batches (or references to them) as ``learner_group.update`` arguments (see the
        module docstring)."""
        group = self.learner_group
        by_reference = isinstance(batches[0], ray.ObjectRef)
        if by_reference and not group.is_local and len(batches) % len(group) == 0:
            return {"batch_refs": batches}  # RLlib hands each learner an equal, contiguous share of the references
        batches = ray.get(batches) if by_reference else batches
        if group.is_local:
            return {"batch": batches}  # the learner joins them on its device
        return {"batches": split_lanes(concat_lanes(batches), len(group))}


def log_learner_spread(algo: Any, results: list[dict]) -> dict[str, float]:
    """``rl_speed_profile/learner_{advantages,join,updates}_s_{min,max}``: the fastest and the slowest learner's
    seconds for its batch fetch, join and advantages (``join``: the fetch and join alone), and for its minibatch
    loop, in this update (several DDP learners wait for the slowest at every all-reduce; with one learner min = max).
    Returns what it logged."""
    spread = {}
    for name, key in (("advantages", ADVANTAGES_TIME_KEY), ("join", JOIN_TIME_KEY), ("updates", UPDATES_TIME_KEY)):
        seconds = [_peek(r[ALL_MODULES][key]) for r in results if key in r.get(ALL_MODULES, {})]
        if seconds:
            spread |= {f"learner_{name}_s_min": min(seconds), f"learner_{name}_s_max": max(seconds)}
    algo.metrics.log_dict(spread, key=PROFILE_KEY, window=1)
    return spread


def _peek(value: Any) -> float:
    """A learner result value (an RLlib ``Stats`` object from a local learner, or a plain number) as a float."""
    return float(value.peek() if hasattr(value, "peek") else value)
