"""One tuned example against variants of itself, side by side: each variant is the YAML experiment's config with
some keys changed; variants run interleaved (``A,B,A,B``), each built fresh and timed over ``seconds`` after the
warm-up iterations (:func:`benchmarks.common.timed_run`), so a change is measured against its baseline on the
same machine in one run rather than against a figure from another box.

    python -m benchmarks.race.preset_variants tuned_examples/mettagrid_ppo_gpu.yaml \\
        --variant A '{"max_requests_in_flight_per_env_runner": 1}' \\
        --variant B '{"max_requests_in_flight_per_env_runner": 2}' --order A,B,A,B --seconds 55 --num-gpus 1

Per run: agent steps/s; the driver's median wait for batches and learner time (``rl_speed_profile``); the runners'
fastest and slowest batch (``sampler/sample_s_min`` / ``_max``), the milliseconds a runner's step of all its lanes
spends in the env and in the module's forward (RLlib's ``env_step_timer`` / ``rlmodule_inference_timer``, the
runners' mean), requests in flight and weights lag (medians); the cores busy on average per process group over the
timed iterations (:mod:`benchmarks.process_cpu`: on a box whose cores are all busy, which processes use them).

``--forward-free NAME`` (repeatable): that variant's runners act without a forward (uniform random actions,
:class:`benchmarks.race.forward_free.ForwardFreeEnvRunner`) and hold no GPU share and no captured step: the rate its
runners and learner reach when a runner's action step costs nothing, the ceiling of any placement of the forward.

``--profile-iterations K``: after each run's timed window, K more iterations under cProfile in the driver (its local
learner included), and the functions with the most cumulative and own time per iteration below the table: where the
driver's part of an iteration goes (the join, the values and GAE, the weight push). cProfile slows Python-heavy code,
so these seconds are for sharing out an iteration, not for rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import learner_seconds, local_ray, machine, median_of, timed_run, usable_cpus
from benchmarks.process_cpu import GROUPS


def variant_config(path: str | Path, changes: dict, experiment: str | None = None) -> Any:
    """The config of the file's experiment named ``experiment`` (may be left out where the file holds one) with
    ``changes`` applied as RLlib config keys; an unknown key is refused by the experiment loader, and a missing or
    unknown experiment name here, before anything starts."""
    from rl_speed.experiments import load_experiments

    experiments = load_experiments(Path(path), config_override=changes,
                                   only=None if experiment is None else [experiment])
    if len(experiments) > 1:
        raise ValueError(f"preset_variants: {path} holds the experiments {sorted(e.name for e in experiments)}; "
                         "name one with --experiment NAME.")
    return experiments[0].config


def forward_free(config: Any) -> Any:
    """``config`` with runners that act without a forward (:mod:`benchmarks.race.forward_free`), no GPU share and no
    captured step for them."""
    from benchmarks.race.forward_free import ForwardFreeEnvRunner

    config = config.copy(copy_frozen=False)
    config.env_runners(env_runner_cls=ForwardFreeEnvRunner, num_gpus_per_env_runner=0)
    if getattr(config, "cuda_graph_env_runners", False):
        config.training(cuda_graph_env_runners=False)
    return config


def run(path: str | Path, variants: dict[str, dict], order: list[str], seconds: float = 55.0, warmup: int = 2,
        num_cpus: int | None = None, num_gpus: int = 0, experiment: str | None = None,
        profile_iterations: int = 0, forward_free_variants: tuple[str, ...] = ()) -> str:
    """The table of every run in ``order`` (names of ``variants``), one row each; with ``profile_iterations``, each
    run's driver profile below it; ``forward_free_variants``: variants whose runners act without a forward (see the
    module docstring)."""
    import rl_speed

    for what, names in (("the order", order), ("--forward-free", forward_free_variants)):
        unknown = [name for name in names if name not in variants]
        if unknown:
            raise ValueError(f"preset_variants: {unknown} in {what} are not among the variants {sorted(variants)}.")
    rl_speed.register()
    # bad keys and experiment names fail here, before Ray starts
    configs = {name: variant_config(path, changes, experiment) for name, changes in variants.items()}
    configs |= {name: forward_free(configs[name]) for name in forward_free_variants}
    rows, profiles_text = [], []
    after = profiled(profile_iterations) if profile_iterations else None
    with local_ray(num_cpus or usable_cpus(), num_gpus):  # a caller's Ray (a test session's) is used and left running
        for name in order:
            result = timed_run(configs[name].copy(copy_frozen=False), seconds, warmup, after=after)
            if after is not None:
                profiles_text.append(f"Driver profile, run {len(rows) + 1} ({name}), {result['after']}")
            profiles, samplers = result["profiles"], result["samplers"]
            rows.append(
                f"| {name} | {result['rate']:,.0f} | {median_of(profiles, 'sample_s'):.3f} s | "
                f"{learner_seconds(result):.3f} s | "
                f"{median_of(samplers, 'sample_s_min'):.2f}-{median_of(samplers, 'sample_s_max'):.2f} s | "
                f"{1e3 * median_of(samplers, 'env_step_timer'):.2f} / "
                f"{1e3 * median_of(samplers, 'rlmodule_inference_timer'):.2f} ms | "
                f"{median_of(samplers, 'requests_in_flight'):.0f} | {median_of(samplers, 'weights_lag_max'):.0f} | "
                f"{_cores(result['cores'])} | {result['iterations']} |")
            print(rows[-1], file=sys.stderr, flush=True)  # each row as it ends: a run cut short keeps the rows made
    return "\n".join([
        f"`{Path(path).name}`{f' ({experiment})' if experiment else ''} variants, interleaved · machine: {machine()} "
        f"· each run over {seconds:.0f} s after {warmup} warm-up iterations",
        "",
        *[f"- {name}: `{json.dumps(changes)}`{' (forward-free runners)' if name in forward_free_variants else ''}"
          for name, changes in variants.items()],
        "",
        "| variant | agent steps/s | driver waits for batches | learner time | runner batch (fastest-slowest) | "
        "runner step: env / inference | requests in flight | weights lag | cores busy: "
        f"{' / '.join(GROUPS)} (all) | iterations |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        *rows,
        *[f"\n{text}" for text in profiles_text],
    ])


#: Driver functions whose callees the profile lists: the weight push and the learner's join + values + GAE.
PROFILED_CALLEES = ("sync_weights_if_due", "prepare_columns")


def profiled(iterations: int, top: int = 25) -> Callable[[Any], str]:
    """An ``after`` hook for :func:`benchmarks.common.timed_run`: ``iterations`` more ``algo.train()`` calls under
    cProfile; returns the ``top`` functions by cumulative and by own time, in seconds per iteration, and the callees
    of :data:`PROFILED_CALLEES` (totals over all the iterations)."""
    import cProfile
    import io
    import pstats

    def after(algo: Any) -> str:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(iterations):
            algo.train()
        profile.disable()
        out = [f"{iterations} iterations; seconds per iteration, calls over all {iterations}:"]
        for key, label in (("cumulative", "cumulative"), ("tottime", "own")):
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            stats.total_tt /= iterations
            for func, (cc, nc, tt, ct, callers) in list(stats.stats.items()):
                stats.stats[func] = (cc, nc, tt / iterations, ct / iterations, callers)
            stats.sort_stats(key).print_stats(top)
            body = text.getvalue()
            out.append(f"\nby {label} time:\n\n```\n{body[body.find('ncalls'):].rstrip()}\n```")
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        for name in PROFILED_CALLEES:  # one call each: several restrictions would narrow one list
            stats.print_callees(rf"\({name}\)")
        body = text.getvalue()
        out.append(f"\ncallees (seconds over all {iterations} iterations):\n\n```\n"
                   f"{body[body.find('Function'):].rstrip()}\n```")
        return "\n".join(out)

    return after


def _cores(busy: dict[str, float]) -> str:
    if not busy:
        return "n/a"  # no /proc (not Linux)
    parts = " / ".join(f"{busy[group]:.1f}" for group in GROUPS)
    return f"{parts} ({busy['all']:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.race.preset_variants",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a tuned example YAML")
    parser.add_argument("--experiment", help="the experiment to vary, where the file holds several")
    parser.add_argument("--variant", nargs=2, action="append", metavar=("NAME", "JSON"), required=True,
                        help="a variant: its name and the config keys it changes, as JSON ('{}' for none)")
    parser.add_argument("--order", required=True, help="variant names in run order, comma-separated (A,B,A,B)")
    parser.add_argument("--seconds", type=float, default=55.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=None)
    parser.add_argument("--num-gpus", type=int, default=0)
    parser.add_argument("--forward-free", action="append", default=[], metavar="NAME",
                        help="a variant whose runners act without a forward (uniform random actions): the ceiling")
    parser.add_argument("--profile-iterations", type=int, default=0,
                        help="after each run, this many iterations under cProfile in the driver (see above)")
    args = parser.parse_args(argv)
    try:
        variants = {name: json.loads(changes) for name, changes in args.variant}
    except json.JSONDecodeError as e:
        parser.error(f"--variant: the changes must be a JSON object: {e}")
    if not all(isinstance(changes, dict) for changes in variants.values()):
        parser.error("--variant: the changes must be a JSON object, e.g. '{\"lr\": 0.001}'")
    print(run(args.file, variants, args.order.split(","), args.seconds, args.warmup, args.num_cpus, args.num_gpus,
              args.experiment, args.profile_iterations, tuple(args.forward_free)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
