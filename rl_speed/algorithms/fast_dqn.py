"""FastDQN: RLlib's DQN on the columnar data path.

Same config keys, module and learner (loss) as RLlib's DQN; what changes is the data path of ``training_step``:

    BatchedEnvRunner.sample_columns() -> [T, N] columns -> BatchedReplayBuffer.add_batch (one call per runner)
    -> buffer.sample(k * B) (vectorized n-step, prioritized) -> learner_group.update(batch=..., minibatch_size=B)

``learner_group.update(batch=...)`` skips RLlib's episode-to-batch learner connector pipeline, and one call runs all
``k`` gradient steps the replay ratio asks for this iteration (k minibatches of B). Priorities are updated from the
learner's per-sample TD errors after that call, and the target network follows ``target_network_update_freq`` as in
DQN. Each iteration reports where its time went (``rl_speed_profile``: sample, replay, learn, sync_weights; see
:mod:`rl_speed.algorithms.telemetry`). Evaluation is RLlib's own. Difference from stock DQN (stated, not hidden):
the k minibatches of one iteration are drawn together, so the later ones do not see priority changes from the
earlier ones of the same iteration.

Multi-agent (``config.multi_agent(...)``, envs whose agents act together; see
:class:`rl_speed.env_runners.multi_agent.MultiAgentBatchedEnvRunner`): one replay buffer per module. Every buffer
spans all agent lanes, and a step is a transition in module m's buffer where m acted for that lane (the ``module``
column), so n-step windows never leave an agent's episode. ``capacity`` keeps its meaning per module, in slots over
all lanes: each module's buffer holds the last ``capacity / lanes`` steps of every lane (memory grows with the number
of modules). Each update trains every module to train (``policies_to_train``) on ``train_batch_size`` rows of its own
buffer, in one learner call; the replay ratio counts env steps, as stock DQN does by default.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import tree

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TD_ERROR_KEY,
)

from rl_speed import columns as C
from rl_speed.algorithms.config import ColumnarConfigMixin, make_probe_env, modules_and_model_configs, probe_spaces
from rl_speed.algorithms.sampling import ColumnSampler, sync_connector_states, sync_weights_if_due
from rl_speed.algorithms.telemetry import PhaseTimer, lock_metrics_for_parallel_evaluation
from rl_speed.buffers import BatchedReplayBuffer
from rl_speed.buffers.replay import IMPORTANCE_WEIGHTS
from rl_speed.columns import num_steps
from rl_speed.learners.dqn import FastDQNTorchLearner
from rl_speed.modules.q_net import QNetModule
from rl_speed.ray_start import import_learner_modules_beside_runners

PRIORITIZED_TYPES = ("PrioritizedEpisodeReplayBuffer", "PrioritizedReplayBuffer", "MultiAgentPrioritizedReplayBuffer",
                     "MultiAgentPrioritizedEpisodeReplayBuffer", "BatchedReplayBuffer:prioritized")
UNIFORM_TYPES = ("EpisodeReplayBuffer", "ReplayBuffer", "MultiAgentReplayBuffer", "MultiAgentEpisodeReplayBuffer",
                 "BatchedReplayBuffer")


#: Updates one training step owes with ``rollout_fragment_length: auto`` (FastDQNConfig.get_rollout_fragment_length):
#: the interleaving ``rl-speed bench dqn`` measured as fast, at any replay ratio.
UPDATES_PER_TRAINING_STEP = 16

#: FastDQN's own monitoring fields in the result dict: ``epsilon`` (the exploration rate at the current step) and
#: ``replay_ratio`` (samples trained per env step sampled, over all training steps of this iteration). Loss and TD
#: error are RLlib's learner keys (``learners/<module>/qf_loss``, ``td_error_mean``); buffer size and counts are
#: under ``replay_buffer``.
MONITOR_KEY = "monitor"


def epsilon_at(schedule: Any, t: int) -> float:
    """DQN's ``epsilon`` (a number or ``[[t, value], ...]``, linear between points, flat outside) at step ``t``."""
    if isinstance(schedule, (int, float)):
        return float(schedule)
    ts, values = zip(*schedule)
    return float(np.interp(t, ts, values))


class FastDQNConfig(ColumnarConfigMixin, DQNConfig):
    """DQNConfig plus ``train_every_env_steps`` and the columnar keys (``sync_weights_every``, ``async_sampling``: see
    :class:`ColumnarConfigMixin`); every DQN key keeps its meaning. Defaults that differ: the env runner
    (BatchedEnvRunner), the module (rl_speed's QNetModule, built from the same ``model_config`` keys) and the learner
    (RLlib's DQN loss with one fused gradient clip + finiteness check per update).

    * ``train_every_env_steps``: one update of ``train_batch_size`` per this many sampled env steps (the seeds'
      "train every k steps"); an alternative to ``training_intensity`` (= batch size / k). Default: neither, which
      means one update per ``training_step``, like RLlib's native ratio.

    ``replay_buffer_config``: ``capacity``, ``alpha``, ``beta`` are honoured, and rl_speed's ``importance_weights``:
    prioritized samples' importance weights are divided by the largest weight in their batch (``"batch"``, the
    default) or, as in RLlib's buffer, by the largest any stored transition would get (``"buffer"``: one pass over the
    buffer's priorities per sample; docs/studies/time-to-a-score.md compares both against stock DQN); a ``type`` naming one of RLlib's
    prioritized (episode) buffers selects prioritized sampling, a uniform one uniform sampling; ``storage_device``
    (e.g. "cuda") keeps observations and actions as torch tensors on that device.
    """

    supports_cuda_graph = True  # the DQN loss has no host syncs (see rl_speed.learners.cuda_graph)

    @override(DQNConfig)
    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or FastDQN)
        self.train_every_env_steps: int | None = None
        # Checkpoints include the replay buffer (RLlib's key; its default is False).
        self.store_buffer_in_checkpoints = True

    @override(DQNConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=QNetModule)

    @override(DQNConfig)
    def get_default_learner_class(self) -> type:
        return FastDQNTorchLearner

    @override(DQNConfig)
    def training(self, *, train_every_env_steps: int | None = NotProvided, **kwargs: Any) -> "FastDQNConfig":
        """DQN's ``training()`` plus ``train_every_env_steps`` (and the columnar keys, through the mixin)."""
        super().training(**kwargs)
        if train_every_env_steps is not NotProvided:
            self.train_every_env_steps = train_every_env_steps
        return self

    @override(DQNConfig)
    def validate(self) -> None:
        self.validate_columnar("FastDQN")
        rb = self.replay_buffer_config
        kind = _buffer_type_name(rb)
        if kind not in PRIORITIZED_TYPES + UNIFORM_TYPES:
            self._value_error(f"FastDQN: `replay_buffer_config.type`={kind!r} is not supported; use one of "
                              f"{', '.join(PRIORITIZED_TYPES + UNIFORM_TYPES)} (all map to rl_speed's BatchedReplayBuffer).")
        if isinstance(self.n_step, (tuple, list)) or not isinstance(self.n_step, int) or self.n_step < 1:
            self._value_error(f"FastDQN: `n_step`={self.n_step!r} must be an integer >= 1 (ranges are not supported).")
        # Stock DQN's validate() insists on episode buffers by class; check ours, then let it check the rest.
        saved = dict(rb)
        self.replay_buffer_config = {**rb, "type": "PrioritizedEpisodeReplayBuffer" if kind in PRIORITIZED_TYPES
                                     else "EpisodeReplayBuffer"}
        try:
            super().validate()
        finally:
            self.replay_buffer_config = saved
        batch = self.total_train_batch_size
        capacity = rb.get("capacity", 0)
        if not isinstance(capacity, int) or capacity < batch:
            self._value_error(f"FastDQN: `replay_buffer_config.capacity`={capacity!r} must be an integer >= the train "
                              f"batch size ({batch}); raise the capacity or lower `train_batch_size_per_learner`.")
        if isinstance(self.grad_accumulation_steps, int) and batch % self.grad_accumulation_steps:
            # RLlib's metrics stack the per-micro-batch TD errors (the replay priorities): parts must be equal.
            self._value_error(f"FastDQN: the train batch of {batch} does not split into {self.grad_accumulation_steps} "
                              "equal micro-batches; make `train_batch_size_per_learner` a multiple of "
                              "`grad_accumulation_steps`.")
        if rb.get("alpha", 0.6) < 0:
            self._value_error(f"FastDQN: `replay_buffer_config.alpha`={rb['alpha']!r} must be >= 0.")
        if not 0 <= rb.get("beta", 0.4) <= 1:
            self._value_error(f"FastDQN: `replay_buffer_config.beta`={rb['beta']!r} must be in [0, 1].")
        unknown = sorted(set(rb) - REPLAY_BUFFER_KEYS)
        if unknown:
            self._value_error(f"FastDQN: `replay_buffer_config` keys {unknown} are not supported by rl_speed's "
                              f"replay buffer (it takes {', '.join(sorted(REPLAY_BUFFER_KEYS))}); remove them.")
        if rb.get("importance_weights", "batch") not in IMPORTANCE_WEIGHTS:
            self._value_error(f"FastDQN: `replay_buffer_config.importance_weights`={rb['importance_weights']!r} must "
                              f"be one of {', '.join(map(repr, IMPORTANCE_WEIGHTS))} ('batch', the default: divide by "
                              "the largest weight in the sampled batch; 'buffer': by the largest over the whole "
                              "buffer, as RLlib's prioritized buffer does).")
        q_nets = [cls.__name__ for cls, _ in modules_and_model_configs(self) if issubclass(cls, QNetModule)]
        if q_nets and self.num_atoms > 1:
            self._value_error(f"FastDQN: `num_atoms`={self.num_atoms} asks for distributional Q-learning, but "
                              f"{q_nets[0]} has one Q-value per action, no distribution; set `num_atoms: 1`, or "
                              "use stock DQN (C51) or an RLModule of yours with a distributional head.")
        if q_nets and self.noisy:
            self._value_error(f"FastDQN: `noisy: true` asks for noisy layers, which {q_nets[0]} does not have (it "
                              "explores epsilon-greedily under `epsilon`); set `noisy: false`.")
        if self.training_intensity is not None and self.training_intensity <= 0:
            self._value_error(f"FastDQN: `training_intensity`={self.training_intensity!r} must be > 0.")
        k = self.train_every_env_steps
        if k is not None and (not isinstance(k, int) or k < 1):
            self._value_error(f"FastDQN: `train_every_env_steps`={k!r} must be an integer >= 1.")
        if k is not None and self.training_intensity is not None:
            self._value_error("FastDQN: set either `training_intensity` or `train_every_env_steps`, not both.")

    @override(DQNConfig)
    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """With ``rollout_fragment_length: auto``, enough steps per env for ``UPDATES_PER_TRAINING_STEP`` updates at
        the configured replay ratio (RLlib's DQN samples ``n_step`` steps per env per training step, which on the
        columnar path leaves a training step's fixed costs, a sampling round trip and an update call, to a handful of
        env steps). The ratio of replayed to sampled steps stays what the config says."""
        rllib_fragment = super().get_rollout_fragment_length(worker_index)  # the value given, or n_step for auto
        if self.rollout_fragment_length != "auto":
            return rllib_fragment
        return max(rllib_fragment, round(UPDATES_PER_TRAINING_STEP * self.env_steps_per_update / self._lanes))

    @property
    def env_steps_per_update(self) -> float:
        """Env steps sampled per gradient update: ``train_every_env_steps``, or batch / ``training_intensity``, or
        RLlib's native ratio (one update per training step of RLlib's fragment on every lane)."""
        if self.train_every_env_steps is not None:
            return float(self.train_every_env_steps)
        if self.training_intensity is not None:
            return self.total_train_batch_size / self.training_intensity
        return float(DQNConfig.get_rollout_fragment_length(self) * self._lanes)

    @property
    def _lanes(self) -> int:
        return self.num_envs_per_env_runner * max(1, self.num_env_runners or 0)

    @property
    def prioritized(self) -> bool:
        return _buffer_type_name(self.replay_buffer_config) in PRIORITIZED_TYPES


#: What ``replay_buffer_config`` may hold for FastDQN (each key honoured; anything else is refused at config time).
REPLAY_BUFFER_KEYS = frozenset({"type", "capacity", "alpha", "beta", "importance_weights", "storage_device"})


def _buffer_type_name(replay_buffer_config: dict) -> str:
    """``replay_buffer_config["type"]`` as a name, whether given as a string or as a class."""
    kind = replay_buffer_config.get("type")
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


class FastDQN(DQN):
    """DQN whose training step moves ``[T, N]`` columns, never episode objects (see the module docstring)."""

    @classmethod
    @override(DQN)
    def get_default_config(cls) -> FastDQNConfig:
        return FastDQNConfig()

    @override(DQN)
    def _create_local_replay_buffer_if_necessary(self, config: Any) -> None:
        return None  # RLlib's episode buffer is replaced by ours, built in setup() once the spaces are known

    @override(DQN)
    def setup(self, config: Any) -> None:
        if config.is_multi_agent:
            env = make_probe_env(config)
            try:
                agents, spaces = len(env.possible_agents), env.get_action_space(env.possible_agents[0])
            finally:
                env.close()
            action_space = config.action_space or spaces
        else:
            agents, (_, action_space) = 1, probe_spaces(config)
        # checked before RLlib builds modules that would fail obscurely
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"FastDQN needs a Discrete action space; {config.env!r} has {action_space}. "
                             "Use PPO/FastPPO or SAC for continuous actions.")
        import_learner_modules_beside_runners(config)  # (while super().setup waits for the runners)
        super().setup(config)
        cfg = self.config
        self._agents = agents
        self._lanes_per_runner = cfg.num_envs_per_env_runner * agents
        rb = cfg.replay_buffer_config
        module_ids = sorted(cfg.policies) if cfg.is_multi_agent else [DEFAULT_MODULE_ID]
        self._module_ids = module_ids  # the multi-agent runner's `module` column indexes this order
        self._buffers = {module_id: BatchedReplayBuffer(
            capacity=rb["capacity"], num_lanes=max(1, cfg.num_env_runners) * self._lanes_per_runner,
            prioritized=cfg.prioritized, alpha=rb.get("alpha", 0.6), beta=rb.get("beta", 0.4),
            importance_weights=rb.get("importance_weights", "batch"),
            seed=None if cfg.seed is None else cfg.seed + k, device=rb.get("storage_device"))
            for k, module_id in enumerate(module_ids)}
        self._update_credit = 0.0  # fractional updates owed by the replay ratio, carried across iterations
        self._sampler = ColumnSampler(self, streaming=True)  # replay takes batches as they come
        self._ratio_iteration, self._ratio_counts = -1, [0, 0]  # samples trained / env steps, this iteration
        self._timer = PhaseTimer(self, ("sample", "replay", "learn", "sync_weights"))
        lock_metrics_for_parallel_evaluation(self)
        self._obs_structure: Any = None  # the leaves of Dict / Tuple observations (None: plain arrays)

    @property
    def replay_buffer(self) -> BatchedReplayBuffer:
        """The replay buffer (single-agent; multi-agent configs have one per module: :attr:`replay_buffers`)."""
        if len(self._buffers) != 1:
            raise AttributeError("FastDQN: a multi-agent config has one replay buffer per module; use "
                                 "`replay_buffers[module_id]`.")
        return next(iter(self._buffers.values()))

    @property
    def replay_buffers(self) -> dict[str, BatchedReplayBuffer]:
        return self._buffers

    @override(DQN)
    def training_step(self) -> None:
        cfg = self.config
        timer = self._timer
        timer.begin_step()
        with timer.phase("sample", ENV_RUNNER_SAMPLING_TIMER):
            samples = self._sampler.sample()
        self.metrics.aggregate([s.metrics for s in samples], key=ENV_RUNNER_RESULTS)
        sync_connector_states(self, samples)
        sampled = 0
        with timer.phase("replay", REPLAY_BUFFER_ADD_DATA_TIMER):
            for worker_index, columns, *_ in samples:
                self._add(columns, lane_start=max(0, worker_index - 1) * self._lanes_per_runner)
                sampled += self._env_steps(columns)

        lifetime = self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        batch_size = cfg.total_train_batch_size
        self._update_credit += self._updates_owed(sampled, batch_size)
        num_updates = int(self._update_credit)
        self._update_credit -= num_updates
        learning = lifetime >= cfg.num_steps_sampled_before_learning_starts and num_updates > 0
        if learning:
            self._learn(num_updates, batch_size, lifetime)
        if len(self._buffers) == 1:
            self.metrics.log_dict(self.replay_buffer.get_metrics(), key="replay_buffer", window=1)
        else:
            for module_id, buffer in self._buffers.items():
                self.metrics.log_dict(buffer.get_metrics(), key=("replay_buffer", module_id), window=1)
        if self._ratio_iteration != self.iteration:  # a train() call runs several training steps: sum over all
            self._ratio_iteration, self._ratio_counts = self.iteration, [0, 0]
        self._ratio_counts[0] += num_updates * batch_size if learning else 0
        self._ratio_counts[1] += sampled
        self.metrics.log_dict({"epsilon": epsilon_at(cfg.epsilon, lifetime),
                               "replay_ratio": self._ratio_counts[0] / max(1, self._ratio_counts[1])},
                              key=MONITOR_KEY, window=1)

        with timer.phase("sync_weights", SYNCH_WORKER_WEIGHTS_TIMER):
            sync_weights_if_due(self)
        timer.report(sampled, num_updates if learning else 0, replay_size=sum(map(len, self._buffers.values())))

    def _add(self, columns: dict, lane_start: int) -> None:
        """One runner's columns into the replay buffer(s): obs with T + 1 rows and no next_obs (the buffer shares
        each frame between a step and the one before); multi-agent columns go to every module's buffer, valid where
        that module acted."""
        batch = {**{key: columns[key] for key in C.REQUIRED}, C.OBS: self._buffer_obs(columns[C.OBS])}
        if len(self._buffers) == 1 and C.MODULE not in columns:
            self.replay_buffer.add_batch(batch, lane_start=lane_start)
            return
        acted = columns[C.MODULE][:-1]
        for index, module_id in enumerate(self._module_ids):
            self._buffers[module_id].add_batch({**batch, C.VALID: columns[C.VALID] & (acted == index)},
                                               lane_start=lane_start)

    def _env_steps(self, columns: dict) -> int:
        """Env steps in a runner's columns: valid steps, or for multi-agent columns the steps in which any agent of
        a copy acted."""
        if self._agents == 1:
            return num_steps(columns)
        valid = columns[C.VALID]
        return int(valid.reshape(valid.shape[0], -1, self._agents).any(axis=2).sum())

    def _buffer_obs(self, obs: Any) -> np.ndarray:
        """Dict / Tuple observations are stored as one structured array (a field per leaf, each in its own dtype:
        uint8 stays uint8) and unpacked after sampling; arrays are stored as they are."""
        if isinstance(obs, np.ndarray):
            return obs
        if next(iter(self._buffers.values())).device is not None:
            raise ValueError("FastDQN: `replay_buffer_config.storage_device` keeps observations as torch tensors, "
                             "which cannot hold Dict / Tuple observations; drop `storage_device` or flatten the "
                             "observations (env_to_module_connector=lambda env, spaces, device: "
                             "FlattenObservations()).")
        if self._obs_structure is None:
            self._obs_structure = tree.map_structure(lambda _: None, obs)
        return C.pack_struct(obs)

    def _unpack_obs(self, obs: Any) -> Any:
        return obs if self._obs_structure is None else C.unpack_struct(obs, self._obs_structure)

    def _updates_owed(self, sampled: int, batch_size: int) -> float:
        cfg = self.config
        if cfg.train_every_env_steps is not None:
            return sampled / cfg.train_every_env_steps
        if cfg.training_intensity is not None:
            return sampled * cfg.training_intensity / batch_size
        if cfg.rollout_fragment_length == "auto":  # RLlib's native ratio, over the larger auto fragment
            return sampled / cfg.env_steps_per_update
        return 1.0  # RLlib's native ratio: one update per training step

    def _learn(self, num_updates: int, batch_size: int, lifetime: int) -> None:
        cfg = self.config
        timer = self._timer
        samples, trains = {}, {}
        with timer.phase("replay", REPLAY_BUFFER_SAMPLE_TIMER):
            for module_id, buffer in self._buffers.items():
                if not len(buffer) or not self._trains(module_id):
                    continue
                sample = buffer.sample(num_updates * batch_size, n_step=cfg.n_step, gamma=cfg.gamma,
                                       beta=cfg.replay_buffer_config.get("beta"))
                samples[module_id] = sample
                trains[module_id] = SampleBatch({
                    "obs": self._unpack_obs(sample["obs"]), "new_obs": self._unpack_obs(sample["next_obs"]),
                    "actions": sample["actions"],
                    "rewards": sample["rewards"], "terminateds": sample["terminateds"],
                    "n_step": sample["n_step"].astype(np.float32), "weights": sample["weights"],
                })
        if not trains:
            return
        with timer.phase("learn", LEARNER_UPDATE_TIMER):
            results = self.learner_group.update(
                # Each minibatch inherits the batch's env_steps for RLlib's "trained" counters: give it one
                # minibatch's worth, so k minibatches count k * B replayed steps, not k * k * B.
                batch=MultiAgentBatch(trains, env_steps=batch_size),
                minibatch_size=batch_size, num_epochs=1, shuffle_batch_per_epoch=False,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime, NUM_AGENT_STEPS_SAMPLED_LIFETIME: lifetime},
            )
            td_errors = {module_id: [np.asarray(r[module_id].pop(TD_ERROR_KEY).peek()).reshape(-1)
                                     for r in results if TD_ERROR_KEY in r.get(module_id, {})]
                         for module_id in trains}
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self.metrics.log_value("num_learner_updates_lifetime", num_updates, reduce="lifetime_sum",
                               with_throughput=True)
        if cfg.prioritized:
            with timer.phase("replay", REPLAY_BUFFER_UPDATE_PRIOS_TIMER):
                for module_id, errors in td_errors.items():
                    if not errors:
                        continue
                    td, indices = np.concatenate(errors), samples[module_id]["indices"]
                    if len(td) != len(indices):
                        raise RuntimeError(f"FastDQN: got {len(td)} TD errors for {len(indices)} samples of "
                                           f"module {module_id!r}.")
                    self._buffers[module_id].update_priorities(indices, np.abs(td))

    def _trains(self, module_id: str) -> bool:
        """``policies_to_train``: whether the learners update this module."""
        should = self.config.policies_to_train
        if should is None:
            return True
        return should(module_id, None) if callable(should) else module_id in should

    @override(DQN)
    def get_state(self, *args: Any, **kwargs: Any) -> dict:
        state = super().get_state(*args, **kwargs)
        if self.config.store_buffer_in_checkpoints and len(self._buffers) == 1:
            state["rl_speed_replay_buffer"] = self.replay_buffer.get_state()
        elif self.config.store_buffer_in_checkpoints:
            state["rl_speed_replay_buffers"] = {m: b.get_state() for m, b in self._buffers.items()}
        state["rl_speed_update_credit"] = self._update_credit
        return state

    @override(DQN)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        if "rl_speed_replay_buffer" in state:
            self.replay_buffer.set_state(state["rl_speed_replay_buffer"])
        for module_id, buffer_state in state.get("rl_speed_replay_buffers", {}).items():
            self._buffers[module_id].set_state(buffer_state)
        self._update_credit = state.get("rl_speed_update_credit", self._update_credit)

