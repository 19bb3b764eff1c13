"""Where one Atari env runner's time goes: the Pong GPU preset's runner (``tuned_examples/atari_ppo_gpu.yaml``: 16
ale-py emulators, 32-step rollouts, the Nature CNN acting on one CPU thread, as a remote runner with its one CPU
gets it), built in this process and timed alone.

Per runner step of all lanes, in milliseconds: the emulators (``env.step``), the module's forward and action
sampling (RLlib's ``rlmodule_inference_timer`` as the runner logs it), and the rest of ``sample_columns()`` (column
writes, episode bookkeeping, metrics), plus the runner's env steps/s and the rate its emulators and its inference
alone would allow. ``--repeats`` rounds of ``CALLS`` calls after one warm-up call; medians. A cProfile of one round
lists the biggest costs outside the emulators and the forward.

Run: ``rl-speed bench atari-runner`` (the [atari] extra); on a GPU box as on a laptop: the runner is CPU-only.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time

from benchmarks.common import machine

CALLS = 10


def _runner(lanes: int, game: str = "pong"):
    import torch

    from benchmarks.throughput.atari import preset
    from rl_speed.env_runners.batched import BatchedEnvRunner

    torch.set_num_threads(1)  # a remote runner with its one CPU (rl_speed.env_runners.batched._set_runner_threads)
    _, config = preset("PPO", device="cpu", cpus=2, game=game)
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=lanes).learners(num_gpus_per_learner=0)
    return BatchedEnvRunner(config=config)


def measure(lanes: int = 16, repeats: int = 3) -> dict:
    """Medians over ``repeats`` rounds of ``CALLS`` ``sample_columns()`` calls: ms per runner step (all lanes) in
    the emulators, in inference and in the rest; env steps/s; and a cProfile of the last round."""
    from rl_speed.env_runners import batched

    runner = _runner(lanes)
    seconds = []  # (env, inference) seconds of each call, as the runner times them for RLlib's step timers
    logged = batched.log_step_timers

    def record(metrics, steps, env_seconds, inference_seconds):
        seconds.append((env_seconds, inference_seconds or 0.0))
        logged(metrics, steps, env_seconds, inference_seconds)

    batched.log_step_timers = record
    try:
        runner.sample_columns()  # warm-up: resets, first forward
        rounds = []
        profile = cProfile.Profile()
        for r in range(repeats):
            seconds.clear()
            steps = 0
            if r == repeats - 1:
                profile.enable()
            start = time.perf_counter()
            for _ in range(CALLS):
                steps += len(runner.sample_columns()["rewards"])
            total = time.perf_counter() - start
            env_s, infer_s = (sum(x) for x in zip(*seconds))
            if r == repeats - 1:
                profile.disable()
            rounds.append({"total_ms": 1e3 * total / steps, "env_ms": 1e3 * env_s / steps,
                           "inference_ms": 1e3 * infer_s / steps, "rate": steps * lanes / total})
        out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        out["rest_ms"] = out["total_ms"] - out["env_ms"] - out["inference_ms"]
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
        out["profile"] = text.getvalue()
        return out
    finally:
        batched.log_step_timers = logged
        runner.stop()


def run(repeats: int = 3, lanes: tuple[int, ...] = (16,)) -> str:
    rows, profiles = [], []
    for n in lanes:
        m = measure(n, repeats)
        alone = 1e3 * n / (m["env_ms"] + m["inference_ms"])
        rows.append(f"| {n} | {m['total_ms']:.2f} | {m['env_ms']:.2f} | {m['inference_ms']:.2f} | {m['rest_ms']:.2f} "
                    f"| {m['rate']:,.0f} | {alone:,.0f} |")
        profiles.append(f"cProfile, {n} lanes (top 12 by own time):\n\n```\n{m['profile'].strip()}\n```")
    return "\n".join([
        "### One Atari env runner: where its time goes (Pong, the GPU preset's runner)", "",
        f"Command: `rl-speed bench atari-runner --repeats {repeats}` · machine: {machine()} · date: "
        f"{time.strftime('%Y-%m-%d')} · one BatchedEnvRunner in this process, torch threads 1, ale-py threads 1, "
        f"Nature CNN on the CPU, 32-step rollouts, {CALLS} calls per round, median of {repeats} rounds.", "",
        "| lanes | ms per runner step | emulators | inference | rest | env steps/s | emulators + inference alone |",
        "|---:|---:|---:|---:|---:|---:|---:|", *rows, "", *profiles,
    ])
