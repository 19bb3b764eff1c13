"""FastPPO's Atari learner alone: seconds per update of one train batch of the Pong GPU preset, with no env runners
beside it, for learner settings side by side.

Why: at 8 epochs per batch the preset's learner fills each iteration (0.49 s of about 0.56 s, with the 15 runners'
forwards on the same GPU; docs/studies/pong-and-atari.md), and with those forwards on the runners' CPUs it took 1.5x
less. This times the same learner on a batch of the same size alone, so the in-run figure splits into the learner's
own cost and what sharing the GPU adds, and tries the settings that change its own cost: other minibatch sizes (256,
the preset's before 2026-12-04, and 1,024: more or fewer steps per batch), bf16 autocast, and the captured step off.

Each row builds FastPPO from ``tuned_examples/atari_ppo_gpu.yaml``'s Pong experiment (:func:`benchmarks.throughput.
atari.preset`) with no remote runners and its learner in this process, plus the row's config keys. One batch is
sampled once by the first row's local runner (``train_batch_size_per_learner`` env steps of real Pong at the initial
weights, as a list of ``[T, N]`` column batches, the form FastPPO hands its learner) and every row updates on a copy of
it, exactly as FastPPO's training step calls ``learner_group.update`` (the preset's epochs, minibatches, shuffle and
lr schedule). Rows alternate round by round; a row's figure is the median of ``repeats`` timed updates after
``WARMUP`` untimed ones (the capture, cuDNN's autotuning). ``--device cpu`` shrinks the batch and leaves out the
GPU-only rows: it checks the bench, it does not time the preset. The rows' learners share one process, so the seeded
row's backend flags are set around each of its updates only (``CUBLAS_WORKSPACE_CONFIG``, which RLlib's seeding sets
too, is read once per process and is not in the row).

``rl-speed bench atari-dqn-learner`` (:func:`run_dqn`) does the same for FastDQN's Pong preset
(``tuned_examples/atari_dqn_gpu.yaml``), whose learner bounds it (79-82% of an iteration, about 3.7 ms an update of
256 with replay apart) and which, unlike FastPPO, runs no faster with its runners off the GPU. Each row builds the
preset with no remote runners (one local runner of 16 emulators; the replay keeps the preset's storage device and
priorities, at :data:`DQN_REPLAY_CAPACITY` slots), fills the row's replay with the same ``fill`` env steps of real
Pong, then times FastDQN's own learning phase of one iteration (``FastDQN._learn``: the replay sample of all the
iteration's updates, the learner's update call over them, the priorities written back) for as many updates as the
preset makes of one iteration's env steps (``min_sample_timesteps_per_iteration`` x ``training_intensity`` / batch),
split as FastDQN's own profile splits it: replay (sample and priorities) and learn.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

from benchmarks.common import check_cuda, interleaved, local_ray, machine

#: Rows: config keys over the preset's; keys starting with ``torch.backends.`` are torch's backend flags the row's
#: updates run under (its warmup, hence its captured step, included). A seeded run (``config.seed``, as every race run
#: is) runs under RLlib's ``set_torch_seed``: cuDNN deterministic, its autotuner off. TF32 matmuls: torch leaves the
#: policy's fully connected layers in full fp32 (its convolutions already use TF32 through cuDNN). Compiled
#: forward_train: RLlib's ``torch_compile_learner`` (inductor; compiled in the warmup, before the capture), which fuses
#: the forward's elementwise ops; the loss, backward and Adam stay as captured. cuDNN's autotuner (torch leaves it off):
#: cuDNN times its convolution algorithms for each new shape in the warmup and the capture keeps the fastest; the
#: minibatch step's cost grows with its rows (1.27 ms at 256, 2.92 ms at 1024), so the convolutions' algorithms count.
CUDA_ROWS = {"preset": {}, "minibatch 256": {"minibatch_size": 256}, "minibatch 1024": {"minibatch_size": 1024},
             "bf16": {"mixed_precision": "bf16"}, "captured step off": {"cuda_graph": False},
             "seeded (cuDNN deterministic)": {"torch.backends.cudnn.deterministic": True,
                                              "torch.backends.cudnn.benchmark": False},
             "TF32 matmuls": {"torch.backends.cuda.matmul.allow_tf32": True},
             "compiled forward_train": {"torch_compile_learner": True},
             "cuDNN autotuner": {"torch.backends.cudnn.benchmark": True}}
FLAG_PREFIX = "torch.backends."
CPU_ROWS = {"preset": {}, "half minibatch": None}  # None: half the preset's (shrunk) minibatch
WARMUP = 3
LIFETIME = 1_000_000  #: env steps sampled so far, as the lr schedule reads it (the preset's lr at 1M steps)


def build(device: str, changes: dict, batch: int | None = None, epochs: int | None = None,
          lanes: int | None = None) -> Any:
    """The algorithm of :func:`learner_config`, built."""
    return learner_config(device, changes, batch, epochs, lanes).build_algo()


def learner_config(device: str, changes: dict, batch: int | None = None, epochs: int | None = None,
                   lanes: int | None = None) -> Any:
    """The preset's FastPPO with no remote runners (its local runner samples), ``changes`` on top; ``batch``,
    ``epochs`` and ``lanes`` (the local runner's emulators) shrink it (tests, the CPU)."""
    from benchmarks.throughput.atari import preset
    from rl_speed.algorithms.config import update_config

    _, config = preset("PPO", device=device, cpus=1)
    # what needs remote runners goes: async sampling, and the runners' captured action step (the local runner's
    # module stays on the CPU)
    config.env_runners(num_env_runners=0).training(async_sampling=False, cuda_graph_env_runners=False)
    if lanes:
        config.env_runners(num_envs_per_env_runner=lanes)
    # The one local runner's fragment covers the whole batch (the preset's batch comes from its 15 runners).
    batch = batch or config.train_batch_size_per_learner
    if batch:
        lanes = config.num_envs_per_env_runner
        config.env_runners(rollout_fragment_length=max(1, batch // lanes)).training(
            train_batch_size_per_learner=batch, minibatch_size=min(config.minibatch_size, batch))
    if epochs:
        config.training(num_epochs=epochs)
    update_config(config, changes)
    return config


def env_steps(batches: list[dict]) -> int:
    """Env steps in a list of ``[T, N]`` column batches."""
    return sum(c["rewards"].size for c in batches)


def sample_batch(algo: Any) -> list[dict]:
    """``train_batch_size_per_learner`` env steps from ``algo``'s local runner, as a list of column batches."""
    batches: list[dict] = []
    while env_steps(batches) < algo.config.train_batch_size_per_learner:
        batches.append(algo.env_runner.sample_columns())
    return batches


def split_flags(changes: dict) -> tuple[dict, dict]:
    """A row's config keys and its backend flags (paths under ``torch.backends``, e.g. ``cudnn.deterministic``)."""
    flags = {k[len(FLAG_PREFIX):]: v for k, v in changes.items() if k.startswith(FLAG_PREFIX)}
    return {k: v for k, v in changes.items() if not k.startswith(FLAG_PREFIX)}, flags


def _flag(path: str) -> tuple[Any, str]:
    """The object under ``torch.backends`` that holds the flag ``path`` names, and the flag's name."""
    import torch

    *parents, name = path.split(".")
    holder = torch.backends
    for parent in parents:
        holder = getattr(holder, parent)
    return holder, name


def update(algo: Any, batches: list[dict], flags: dict | None = None) -> None:
    """One ``learner_group.update`` as FastPPO's training step makes it (the learner may write into ``batches``:
    pass a copy), under ``flags`` (torch's backend flags, restored after)."""
    before = {path: getattr(*_flag(path)) for path in flags or {}}
    for path, value in (flags or {}).items():
        setattr(*_flag(path), value)
    try:
        _update(algo, batches)
    finally:
        for path, value in before.items():
            setattr(*_flag(path), value)


def _update(algo: Any, batches: list[dict]) -> None:
    cfg = algo.config
    algo.learner_group.update(
        batch=batches, minibatch_size=cfg.minibatch_size, num_epochs=cfg.num_epochs,
        shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch,
        timesteps={"num_env_steps_sampled_lifetime": LIFETIME, "num_agent_steps_sampled_lifetime": LIFETIME})


def measure(device: str = "cpu", repeats: int = 3, rows: dict | None = None, batch: int | None = None,
            epochs: int | None = None, lanes: int | None = None, warmup: int = WARMUP) -> dict[str, dict]:
    """Per row: its minibatch size, steps per update, and the median seconds per update over ``repeats`` rounds."""
    import torch

    rows = rows if rows is not None else (CUDA_ROWS if device == "cuda" else CPU_ROWS)
    algos: dict[str, Any] = {}
    flags: dict[str, dict] = {}
    try:
        for name, changes in rows.items():
            if changes is None:  # CPU_ROWS' halved minibatch, relative to the first row's (the shrunk preset's)
                changes = {"minibatch_size": max(1, next(iter(algos.values())).config.minibatch_size // 2)}
            changes, flags[name] = split_flags(changes)
            algos[name] = build(device, changes, batch, epochs, lanes)
        data = sample_batch(next(iter(algos.values())))
        steps = env_steps(data)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        failed: dict[str, str] = {}
        first = next(iter(algos))
        for name, algo in list(algos.items()):  # a row that cannot run (e.g. no compiler for inductor) says why
            try:
                for _ in range(warmup):
                    update(algo, copy.deepcopy(data), flags[name])
            except Exception as e:  # noqa: BLE001 (reported in the row; the other rows still run)
                if name == first:  # the reference row: its failure ends the bench
                    raise
                failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                algos.pop(name).stop()
        times: dict[str, list[float]] = {name: [] for name in algos}
        for name in interleaved(list(algos), repeats):
            copied = copy.deepcopy(data)  # outside the clock
            sync()
            start = time.perf_counter()
            update(algos[name], copied, flags[name])
            sync()
            times[name].append(time.perf_counter() - start)
        out = {}
        for name, algo in algos.items():
            cfg = algo.config
            per_epoch = -(-steps // cfg.minibatch_size)
            out[name] = {"minibatch": cfg.minibatch_size, "steps": cfg.num_epochs * per_epoch, "batch": steps,
                         "seconds": statistics.median(times[name])}
        return {name: out.get(name, {"failed": failed.get(name)}) for name in rows if name in out or name in failed}
    finally:
        for algo in algos.values():
            algo.stop()


def run(repeats: int = 5, device: str = "cpu") -> str:
    """``device``: ``cuda`` times the preset's learner on the GPU; ``cpu`` a shrunk one (a check, not a figure)."""
    check_cuda("atari-learner", device, "check the bench on the CPU (a shrunk batch)")
    with local_ray(num_cpus=1):  # RLlib finds a GPU learner's device through Ray's runtime context
        out = measure(device, repeats, batch=None if device == "cuda" else 256, epochs=None if device == "cuda" else 2)
    first = next(iter(out.values()))["seconds"]
    rows = [f"| {name} | failed: {m['failed']} | | | | | |" if "failed" in m else
            f"| {name} | {m['minibatch']} | {m['steps']} | {m['seconds']:.3f} | "
            f"{1e3 * m['seconds'] / m['steps']:.2f} | {first / m['seconds']:.2f}x | {m['batch'] / m['seconds']:,.0f} |"
            for name, m in out.items()]
    batch = next(iter(out.values()))["batch"]
    return "\n".join([
        "### FastPPO's Pong learner alone: seconds per update of one batch (no env runners)", "",
        f"Command: `rl-speed bench atari-learner --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · `atari_ppo_gpu.yaml`'s Pong experiment, its "
        f"learner in this process on the {'GPU' if device == 'cuda' else 'CPU (batch and epochs shrunk: a check)'}, "
        f"one batch of {batch:,} env steps of real Pong, median of {repeats} updates per row, rows alternating.", "",
        "| row | minibatch | minibatch steps per update | s per update | ms per minibatch step | vs the first row "
        "| env steps/s the learner could take |",
        "|---|---:|---:|---:|---:|---:|---:|", *rows,
    ])


#: The preset's Q-net without its per-pixel standardization: ``atari_dqn_gpu.yaml``'s other ``model_config`` keys
#: (a given ``model_config`` replaces the preset's whole one).
WITHOUT_NORMALIZE_OBS = {"model_config": {"encoder": "nature", "batch_norm": False}}
#: FastDQN rows: config keys over the preset's. A larger batch makes proportionally fewer updates of the same env steps.
DQN_CUDA_ROWS = {"preset": {}, "normalize_obs off": WITHOUT_NORMALIZE_OBS, "bf16": {"mixed_precision": "bf16"},
                 "batch 512": {"train_batch_size_per_learner": 512}, "captured step off": {"cuda_graph": False}}
DQN_CPU_ROWS = {"preset": {}, "batch x2": None}  # None: twice the preset's (shrunk) batch
#: Replay slots per row: the preset's 1M frame stacks take 28 GB of GPU memory, and four rows side by side would not
#: fit one GPU with their samples; the sum tree is then 18 levels deep instead of 20.
DQN_REPLAY_CAPACITY = 200_000


def build_dqn(device: str, changes: dict, batch: int | None = None, iteration_steps: int | None = None,
              lanes: int | None = None) -> Any:
    """FastDQN's Pong preset with no remote runners (its local runner samples), ``changes`` on top; ``batch``,
    ``iteration_steps`` (env steps per iteration, hence updates per learning phase) and ``lanes`` (the local runner's
    emulators) shrink it (tests, the CPU)."""
    from benchmarks.throughput.atari import preset
    from rl_speed.algorithms.config import update_config

    _, config = preset("DQN", device=device, cpus=1)
    config.env_runners(num_env_runners=0).training(async_sampling=False)  # (async needs remote runners)
    replay = config.replay_buffer_config
    config.training(replay_buffer_config={**replay, "capacity": min(DQN_REPLAY_CAPACITY, replay["capacity"])})
    if batch:
        config.training(train_batch_size_per_learner=batch)
    if iteration_steps:
        config.reporting(min_sample_timesteps_per_iteration=iteration_steps)
    if lanes:
        config.env_runners(num_envs_per_env_runner=lanes)
    update_config(config, changes)
    return config.build_algo()


def fill_replay(algo: Any, batches: list[dict]) -> None:
    """``batches`` (a runner's column batches) into ``algo``'s replay, as FastDQN's training step adds them (the
    replay copies them and leaves them as they were, so every row is filled from the same batches)."""
    for columns in batches:
        algo._add(columns, lane_start=0)


def updates_per_iteration(config: Any) -> int:
    """The updates FastDQN makes of one iteration's env steps at the config's replay ratio."""
    return max(1, round(config.min_sample_timesteps_per_iteration / config.env_steps_per_update))


def learn_phase(algo: Any, updates: int) -> dict[str, float]:
    """One iteration's learning phase of FastDQN (``_learn``), timed: its replay and learn seconds."""
    timer = algo._timer
    timer.seconds = dict.fromkeys(timer.phases, 0.0)
    algo._learn(updates, algo.config.total_train_batch_size, LIFETIME)  # ends on the host: the priorities
    return {"replay": timer.seconds["replay"], "learn": timer.seconds["learn"]}


def measure_dqn(device: str = "cpu", repeats: int = 3, rows: dict | None = None, batch: int | None = None,
                iteration_steps: int | None = None, fill: int = 20_000, lanes: int | None = None,
                warmup: int = WARMUP) -> dict[str, dict]:
    """Per row: its batch, updates per iteration and the median replay / learn seconds of one iteration's learning
    over ``repeats`` rounds; every row's replay holds the same ``fill`` env steps (at least one runner batch)."""
    rows = rows if rows is not None else (DQN_CUDA_ROWS if device == "cuda" else DQN_CPU_ROWS)
    algos: dict[str, Any] = {}
    try:
        for name, changes in rows.items():
            if changes is None:  # DQN_CPU_ROWS' doubled batch, relative to the first row's (the shrunk preset's)
                changes = {"train_batch_size_per_learner": 2 * next(iter(algos.values())).config.total_train_batch_size}
            algos[name] = build_dqn(device, changes, batch, iteration_steps, lanes)
        first = next(iter(algos.values()))
        data: list[dict] = []
        while env_steps(data) < fill:
            data.append(first.env_runner.sample_columns())
        for algo in algos.values():
            fill_replay(algo, data)
            for _ in range(warmup):
                learn_phase(algo, updates_per_iteration(algo.config))
        times: dict[str, list[dict]] = {name: [] for name in algos}
        for name in interleaved(list(algos), repeats):
            times[name].append(learn_phase(algos[name], updates_per_iteration(algos[name].config)))
        out = {}
        for name, algo in algos.items():
            out[name] = {"batch": algo.config.total_train_batch_size, "updates": updates_per_iteration(algo.config),
                         "env_steps": algo.config.min_sample_timesteps_per_iteration,
                         "replay": statistics.median(t["replay"] for t in times[name]),
                         "learn": statistics.median(t["learn"] for t in times[name]), "filled": env_steps(data),
                         "capacity": algo.replay_buffer.capacity}
        return out
    finally:
        for algo in algos.values():
            algo.stop()


def run_dqn(repeats: int = 5, device: str = "cpu") -> str:
    """``device``: ``cuda`` times the preset's learning phase on the GPU; ``cpu`` a shrunk one (a check)."""
    check_cuda("atari-dqn-learner", device, "check the bench on the CPU (a shrunk batch)")
    with local_ray(num_cpus=1):  # RLlib finds a GPU learner's device through Ray's runtime context
        cuda = device == "cuda"
        out = measure_dqn(device, repeats, batch=None if cuda else 32, iteration_steps=None if cuda else 64,
                          fill=20_000 if cuda else 512)
    first = next(iter(out.values()))
    total = {name: m["replay"] + m["learn"] for name, m in out.items()}
    rows = [f"| {name} | {m['batch']} | {m['updates']} | {m['replay']:.3f} | {m['learn']:.3f} | "
            f"{1e3 * m['learn'] / m['updates']:.2f} | {total[next(iter(out))] / total[name]:.2f}x | "
            f"{m['env_steps'] / total[name]:,.0f} |" for name, m in out.items()]
    return "\n".join([
        "### FastDQN's Pong learning phase alone: seconds per iteration's updates (no env runners)", "",
        f"Command: `rl-speed bench atari-dqn-learner --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}`"
        f" · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · `atari_dqn_gpu.yaml`'s Pong experiment, its "
        f"learner in this process on the {'GPU' if device == 'cuda' else 'CPU (batch shrunk: a check)'}, replay "
        f"of {first['capacity']:,} slots filled with {first['filled']:,} env steps of real Pong, the updates of "
        f"{first['env_steps']:,} env steps per row (FastDQN's `_learn`), median of {repeats} per row, rows "
        "alternating.", "",
        "| row | batch | updates | replay s (sample + priorities) | learn s | ms per update (learn) | vs the first row "
        "| env steps/s the learner could take |",
        "|---|---:|---:|---:|---:|---:|---:|---:|", *rows,
    ])
