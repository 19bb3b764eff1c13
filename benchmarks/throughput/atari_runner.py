"""Where one Atari env runner's time goes: the Pong GPU preset's runner, or with ``--game breakout`` the Breakout
one (``tuned_examples/atari_ppo_gpu.yaml``: 16 ale-py emulators, 32-step rollouts, the Nature CNN acting on one CPU
thread, as a remote runner with its one CPU gets it), built in this process and timed alone; with the env's lanes
in one group (the plain loop: emulators, then the forward) and in two lane groups (``env_config: {lane_groups: 2}``:
one group's emulators step while the other's actions are computed, :mod:`rl_speed.env_runners.overlapped`).

Per runner step of all lanes, in milliseconds: the time blocked in the emulators (``env.step``, or waiting for a lane
group), the module's forward and action sampling (RLlib's ``rlmodule_inference_timer`` as the runner logs it), and
the rest of ``sample_columns()`` (column writes, episode bookkeeping, metrics), plus the runner's env steps/s and the
rate its emulators and its inference alone would allow one after the other. Beside them, ale-py's own vector env with
the same settings stepped alone with random actions, in rounds between the runners': what rl_speed's env adds to the
emulators is the difference from the one-group runner's time in them. ``--repeats`` rounds of ``CALLS`` calls
after one warm-up call, the two runners' rounds alternating; medians. A cProfile of the plain runner's last round
lists the biggest costs outside the emulators and the forward.

Run: ``rl-speed bench atari-runner`` (the [atari] extra): the forward on the CPU; ``--device cuda``: on the GPU, as
the GPU preset's runners have it (``num_gpus_per_env_runner``). The overlap needs a second core for the emulators'
thread, as a runner with one CPU of its own does not have.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import time

from benchmarks.common import check_cuda, local_ray, machine

CALLS = 10


def _runner(lanes: int, game: str = "pong", lane_groups: int = 1, device: str = "cpu"):
    import torch

    from benchmarks.throughput.atari import preset
    from rl_speed.env_runners.batched import BatchedEnvRunner

    torch.set_num_threads(1)  # a remote runner with its one CPU (rl_speed.env_runners.stepping.set_runner_threads)
    _, config = preset("PPO", device="cpu", cpus=2, game=game)
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=lanes).learners(num_gpus_per_learner=0)
    config.environment(env_config={**config.env_config, "lane_groups": lane_groups})
    if device == "cuda":  # the preset's GPU share; RLlib gives a runner of index > 0 its GPU (index 0 is the driver's)
        # RLlib picks that GPU through Ray's runtime context, which starts a default Ray if none runs: the caller
        # starts one (run(), or a test's session Ray)
        _, gpu_preset = preset("PPO", device="cuda", game=game)
        config.env_runners(num_gpus_per_env_runner=gpu_preset.num_gpus_per_env_runner)
        config.training(cuda_graph_env_runners=gpu_preset.cuda_graph_env_runners)  # its action step as the preset's
        return BatchedEnvRunner(config=config, worker_index=1)
    return BatchedEnvRunner(config=config)


def _ale_alone(runner):
    """ale-py's own vector env with the runner's settings (the lane group rl_speed's env wraps), a second one, to be
    stepped alone: the emulators' cost without rl_speed's env, runner or module."""
    from rl_speed_envs.atari import AtariVectorEnv

    return AtariVectorEnv(runner.num_envs, **{**runner.config.env_config, "lane_groups": 1})._groups[0]


def _ms_per_step(env, steps: int, rng) -> float:
    """``steps`` steps of ``env`` with random actions, in ms per step."""
    actions = rng.integers(0, env.single_action_space.n, (steps, env.num_envs))
    start = time.perf_counter()
    for a in actions:
        env.step(a)
    return 1e3 * (time.perf_counter() - start) / steps


def measure(lanes: int = 16, repeats: int = 3, groups: tuple[int, ...] = (1, 2), device: str = "cpu",
            game: str = "pong") -> dict[int, dict]:
    """Per lane-group count: medians over ``repeats`` rounds of ``CALLS`` ``sample_columns()`` calls (the runners'
    rounds alternating): ms per runner step (all lanes) blocked in the emulators, in inference and in the rest; env
    steps/s; the game the runners' emulators played; and for one group, a cProfile of its last round."""
    import numpy as np

    from rl_speed.env_runners import stepping

    runners = {k: _runner(lanes, game=game, lane_groups=k, device=device) for k in groups}
    ale, rng = _ale_alone(runners[groups[0]]), np.random.default_rng(0)
    seconds = []  # (env, inference) seconds of each call, as the runner times them for RLlib's step timers
    logged = stepping.log_step_timers

    def record(metrics, steps, env_seconds, inference_seconds):
        seconds.append((env_seconds, inference_seconds or 0.0))
        logged(metrics, steps, env_seconds, inference_seconds)

    stepping.log_step_timers = record  # every runner calls it through the module
    try:
        for runner in runners.values():
            runner.sample_columns()  # warm-up: resets, first forward
        ale.reset(seed=0)
        rounds: dict[int, list[dict]] = {k: [] for k in groups}
        ale_rounds: list[float] = []
        profile = cProfile.Profile()
        for r in range(repeats):
            for k, runner in runners.items():
                seconds.clear()
                steps = 0
                profiled = k == 1 and r == repeats - 1
                if profiled:
                    profile.enable()
                start = time.perf_counter()
                for _ in range(CALLS):
                    steps += len(runner.sample_columns()["rewards"])
                total = time.perf_counter() - start
                if profiled:
                    profile.disable()
                env_s, infer_s = (sum(x) for x in zip(*seconds))
                rounds[k].append({"total_ms": 1e3 * total / steps, "env_ms": 1e3 * env_s / steps,
                                  "inference_ms": 1e3 * infer_s / steps, "rate": steps * lanes / total})
            ale_rounds.append(_ms_per_step(ale, steps, rng))  # as many steps as each runner's round
        out = {}
        for k in groups:
            out[k] = {key: statistics.median(r[key] for r in rounds[k]) for key in rounds[k][0]}
            out[k]["rest_ms"] = out[k]["total_ms"] - out[k]["env_ms"] - out[k]["inference_ms"]
            out[k]["ale_ms"] = statistics.median(ale_rounds)  # one figure for every row: the same lanes, alone
            out[k]["game"] = runners[k].config.env_config["game"]
        if 1 in out:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
            out[1]["profile"] = text.getvalue()
        return out
    finally:
        stepping.log_step_timers = logged
        ale.close()
        for runner in runners.values():
            runner.stop()


def run(repeats: int = 3, lanes: tuple[int, ...] = (16,), device: str = "cpu", game: str = "pong") -> str:
    """``device``: where the runners' forward runs (``cuda``: the GPU preset's runner, its forward on the GPU);
    ``game``: the GPU preset's experiment whose runner is timed (``pong`` or ``breakout``)."""
    check_cuda("atari-runner", device, "time the runner with its forward on the CPU")
    # see _runner: a GPU runner needs a Ray; a private local one, not the default one RLlib would start
    with local_ray(num_cpus=1) if device == "cuda" else contextlib.nullcontext():
        results = {n: measure(n, repeats, device=device, game=game) for n in lanes}
    rows, profiles = [], []
    for n, by_groups in results.items():
        plain = by_groups[1]["rate"]
        for k, m in by_groups.items():
            alone = 1e3 * n / (m["env_ms"] + m["inference_ms"])
            rows.append(f"| {k} | {n} | {m['total_ms']:.2f} | {m['env_ms']:.2f} | {m['ale_ms']:.2f} | "
                        f"{m['inference_ms']:.2f} | {m['rest_ms']:.2f} | {m['rate']:,.0f} | {m['rate'] / plain:.2f}x | "
                        f"{alone:,.0f} |")
        profiles.append(f"cProfile, {n} lanes, one group (top 12 by own time):\n\n```\n"
                        f"{by_groups[1]['profile'].strip()}\n```")
    played = {m["game"] for by_groups in results.values() for m in by_groups.values()}
    flags = (" --device cuda" if device == "cuda" else "") + (f" --game {game}" if game != "pong" else "")
    return "\n".join([
        f"### One Atari env runner: where its time goes ({', '.join(sorted(played)).title()}, the GPU preset's runner)",
        "",
        f"Command: `rl-speed bench atari-runner --repeats {repeats}{flags}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · one BatchedEnvRunner per row in this process, "
        "torch threads 1, ale-py threads 1 per lane group, Nature CNN on the "
        f"{'GPU' if device == 'cuda' else 'CPU'}, 32-step rollouts, {CALLS} calls per round, median of {repeats} "
        "rounds, the rows' rounds alternating.", "",
        "| lane groups | lanes | ms per runner step | emulators (blocked) | ale-py's vector env alone | inference | rest "
        "| env steps/s | vs one group | emulators + inference one after the other |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows, "", *profiles,
    ])
