"""UpdateLoopMixin: the one minibatch loop of every rl_speed learner (epochs, shuffling, minibatch rows).

RLlib's ``Learner.update`` wraps every minibatch in ``SampleBatch`` / ``MultiAgentBatch`` objects and logs steps,
counters and timers per minibatch. Here a call whose data is ready for the loss runs as a lean loop instead: the
batch becomes tensors on the learner's device once, each minibatch is a view (contiguous rows) or one gather (shuffled
rows), and RLlib's bookkeeping is done once per call with the same totals. Two kinds of calls take it:

* column batches (:mod:`rl_speed.columns`): ``update(batch=columns)``, ``update(batch=[columns, ...])`` (several
  runners' batches, joined along lanes by the learner) or ``update(batch_refs=[...])`` (references to runners'
  batches, fetched by the learner actor itself): the learner's :meth:`prepare_columns` turns them into loss rows
  (FastPPO: values and GAE, then one row per step or per BPTT chunk);
* a prepared batch (``update(batch=MultiAgentBatch(...), minibatch_size=B)``, FastDQN's replay samples: each
  module's rows, B of them per minibatch).

Multi-agent columns (a ``module`` column) give one set of loss rows per module to train, each run through the loop
in turn (each module has its own optimizer). Several DDP learners step in lockstep (every module's backward is an
all-reduce among them), but their shards hold different numbers of each module's rows: the learners agree on each
module's minibatch count first (one all-reduce of the counts, the largest wins), a learner with fewer rows cycles
through its rows again, and a learner with none of a module's rows runs :meth:`UpdateLoopMixin.placeholder_rows`,
a minibatch whose loss counts zero (so it adds nothing but still takes part in the all-reduce).

Everything else (episodes, data iterators, several modules without columns) takes RLlib's own path. Each minibatch
goes through ``self._update`` (the optimizer step, :mod:`rl_speed.learners.optimizer_step`); ``is_last_minibatch``
tells a loss that it may skip statistics which only the last minibatch's value survives (``window=1``).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import ray
import torch
import torch.distributed as dist
import tree

from ray.rllib.core import ALL_MODULES
from ray.rllib.core.learner.learner import Learner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)

from rl_speed.columns import MODULE, REWARDS, VALID


def is_column_batch(batch: Any) -> bool:
    return isinstance(batch, dict) and VALID in batch and REWARDS in batch


def column_batches(training_data: Any) -> list[dict] | None:
    """The column batches of an update call (see the module docstring), or None if it brings something else.
    References are fetched here, on the learner: zero-copy reads from the object store of its node."""
    if training_data is None:
        return None
    if training_data.batch_refs is not None:
        batches = ray.get(list(training_data.batch_refs))
        if batches and all(is_column_batch(b) for b in batches):
            return batches
        return None  # RLlib's own batches: its path resolves the references again (cached)
    batch = training_data.batch
    if is_column_batch(batch):
        return [batch]
    if isinstance(batch, list) and batch and all(is_column_batch(b) for b in batch):
        return batch
    return None


#: ``learners/__all_modules__/updates_time_s``: one learner's seconds in the minibatch loop of an ``update()`` call
#: (forward, backward, DDP's gradient all-reduce, optimizer steps), kernels included.
UPDATES_TIME_KEY = "updates_time_s"


def minibatch_count(batch: dict, minibatch_rows: int) -> int:
    """Minibatches of ``minibatch_rows`` rows that one pass over ``batch`` makes (the last one may be short)."""
    return -(-len(tree.flatten(batch)[0]) // minibatch_rows)


def keeps_input_statistics(module: Any) -> bool:
    """Whether ``module`` keeps input statistics that its learner updates with each train batch's observations
    (``keeps_input_statistics`` true, e.g. ``normalize_obs``; then it has ``update_input_statistics(obs)``). Learners
    that update them set ``updates_input_statistics = True``, which such modules check at config time."""
    return bool(getattr(module, "keeps_input_statistics", False))


class LossRows(NamedTuple):
    """A batch ready for the loop: tensors on the learner's device whose first axis is the row axis."""

    module_id: str
    batch: dict
    minibatch_rows: int
    module_steps: int  # steps one epoch trains, for RLlib's counters
    env_steps: int


class UpdateLoopMixin:
    """See the module docstring. Mix in before the Torch learner class."""

    #: False while an update() call has more minibatches to go: losses may skip window-1 statistics then.
    is_last_minibatch: bool = True
    #: Log :data:`UPDATES_TIME_KEY` (one device sync per ``update()`` call): FastPPO's learners, whose update is a
    #: whole train batch; FastDQN's update calls are single minibatches, which a sync each would slow.
    time_updates: bool = False

    @override(Learner)
    def update(self, *args: Any, training_data: Any = None, timesteps: dict | None = None, num_epochs: int = 1,
               minibatch_size: int | None = None, shuffle_batch_per_epoch: bool = False,
               num_total_minibatches: int = 0, **kwargs: Any) -> Any:
        columns = column_batches(training_data)
        if columns is None and (args or num_total_minibatches or kwargs.get("_no_metrics_reduce")
                            or not self._is_prepared_batch(training_data, minibatch_size)):
            return super().update(  # type: ignore[misc]
                *args, training_data=training_data, timesteps=timesteps, num_epochs=num_epochs,
                minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch,
                num_total_minibatches=num_total_minibatches, **kwargs)
        self._check_is_built()
        if columns and len(self.module) != 1 and MODULE not in columns[0]:
            raise ValueError(f"{type(self).__name__}: these columns have no `module` column, but the learner has "
                             f"{len(self.module)} modules; sample multi-agent envs with MultiAgentBatchedEnvRunner.")
        timesteps = timesteps or {}
        self.before_gradient_based_update(timesteps=timesteps)
        self._weights_seq_no += 1
        if columns:
            per_module = self.prepare_columns(columns, minibatch_size)
        else:
            per_module = self._prepared_rows(training_data, minibatch_size)
        start = time.perf_counter()
        for rows, count in self._in_lockstep(per_module):  # modules have their own optimizers and losses: in turn
            losses = self.run_minibatches(rows.module_id, rows.batch, rows.minibatch_rows, num_epochs=num_epochs,
                                          shuffle=shuffle_batch_per_epoch, num_minibatches=count)
            if rows.module_steps:  # a placeholder trains nothing and reports nothing
                self._log_module_totals(rows.module_id, rows.module_steps * num_epochs, losses)
        if self.time_updates:
            if self._device.type == "cuda":
                torch.cuda.synchronize(self._device)  # the loop's kernels are done, so the time below is theirs
            self.metrics.log_value((ALL_MODULES, UPDATES_TIME_KEY), time.perf_counter() - start, window=1)
        self._log_update_totals(sum(r.module_steps for r in per_module) * num_epochs,
                                max((r.env_steps for r in per_module), default=0) * num_epochs)
        self.after_gradient_based_update(timesteps=timesteps)
        return self.metrics.reduce()

    def _is_prepared_batch(self, training_data: Any, minibatch_size: int | None) -> bool:
        return (training_data is not None and training_data.batch is not None and training_data.episodes is None
                and not training_data.data_iterators and bool(minibatch_size))

    def prepare_columns(self, batches: list[dict], minibatch_size: int | None) -> list[LossRows]:
        """Column batches (joined along lanes) -> loss rows, one entry per module to train; learners that train on
        columns implement it."""
        raise ValueError(f"{type(self).__name__} does not train on column batches; pass a prepared batch or "
                         "episodes.")

    def _prepared_rows(self, training_data: Any, minibatch_size: int) -> list[LossRows]:
        training_data.validate()
        training_data.solve_refs()
        batch = self._make_batch_if_necessary(training_data=training_data)  # tensors on the learner's device
        out = []
        for module_id, module_batch in batch.policy_batches.items():
            if module_id not in self.module or not self.should_module_be_updated(module_id):
                continue
            rows = len(module_batch)
            out.append(LossRows(module_id, dict(module_batch), minibatch_size, rows,
                                -(-rows // minibatch_size) * batch.env_steps()))
        return out

    def _in_lockstep(self, per_module: list[LossRows]) -> list[tuple[LossRows, int]]:
        """Each module's loss rows with its minibatch count per epoch. One learner: its own. Several (DDP): the
        same on every learner, the largest of theirs, for every module any learner trains, in one order (see the
        module docstring)."""
        own = {rows.module_id: minibatch_count(rows.batch, rows.minibatch_rows) for rows in per_module}
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return [(rows, own[rows.module_id]) for rows in per_module]
        trainable = sorted(m for m in self.module.keys() if self.should_module_be_updated(m))
        counts = torch.tensor([own.get(m, 0) for m in trainable], dtype=torch.int64, device=self._device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        by_module = {rows.module_id: rows for rows in per_module}
        return [(by_module[m] if m in by_module else self.placeholder_rows(m), int(count))
                for m, count in zip(trainable, counts.tolist()) if count]

    def placeholder_rows(self, module_id: str) -> LossRows:
        """One minibatch of ``module_id`` whose loss counts zero, for a DDP learner whose shard has none of the
        module's rows (``module_steps`` 0); learners whose shards can differ that way implement it."""
        raise ValueError(f"{type(self).__name__}: this learner's shard has no rows of module {module_id!r}, which "
                         "other DDP learners train on; use num_learners 0 or 1.")

    def run_minibatches(self, module_id: str, batch: dict, minibatch_rows: int, *, num_epochs: int = 1,
                        shuffle: bool = False, num_minibatches: int | None = None) -> dict:
        """``num_epochs`` passes over the rows of ``batch`` in minibatches of ``minibatch_rows`` (the last one may
        be short), shuffled per epoch if asked; returns the last minibatch's losses per module. ``num_minibatches``
        beyond what the rows fill (DDP learners in lockstep) cycle through the rows again."""
        size = len(tree.flatten(batch)[0])
        own = minibatch_count(batch, minibatch_rows)
        num_minibatches = num_minibatches or own
        loss_per_module: dict = {}
        try:
            for epoch in range(num_epochs):
                order = torch.randperm(size, device=self._device) if shuffle else None
                for i in range(num_minibatches):
                    self.is_last_minibatch = epoch == num_epochs - 1 and i == num_minibatches - 1
                    if i < own:
                        rows = slice(i * minibatch_rows, (i + 1) * minibatch_rows)
                    else:  # another learner has more of this module's rows: go round this learner's again
                        rows = torch.arange(i * minibatch_rows, (i + 1) * minibatch_rows, device=self._device) % size
                    index = order[rows] if order is not None else rows
                    minibatch = tree.map_structure(lambda x: x[index], batch)
                    _, loss_per_module, _ = self._update({module_id: minibatch})
        finally:
            self.is_last_minibatch = True
        return loss_per_module

    def _log_module_totals(self, module_id: str, module_steps: int, loss_per_module: dict) -> None:
        """What RLlib's update() logs per module and minibatch, logged once with the call's totals."""
        self.metrics.log_value((module_id, WEIGHTS_SEQ_NO), self._weights_seq_no, window=1)
        self.metrics.log_value((module_id, NUM_MODULE_STEPS_TRAINED), module_steps, reduce="sum")
        self.metrics.log_value((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), module_steps, reduce="lifetime_sum",
                               with_throughput=True)
        for mid, loss in loss_per_module.items():
            self.metrics.log_value(key=(mid, self.TOTAL_LOSS_KEY), value=loss, window=1)

    def _log_update_totals(self, module_steps: int, env_steps: int) -> None:
        """RLlib's all-modules counters for the call."""
        self.metrics.log_value((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), module_steps, reduce="sum",
                               with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), module_steps,
                               reduce="lifetime_sum", with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_ENV_STEPS_TRAINED), env_steps, reduce="sum", with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), env_steps, reduce="lifetime_sum",
                               with_throughput=True)
