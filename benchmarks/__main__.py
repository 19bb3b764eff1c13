"""``python -m benchmarks NAME [--repeats N] [--output DIR] [...]``: run one benchmark from a checkout.

Prints its markdown and writes, under ``DIR/NAME/`` (default ``results/NAME/``): ``table.md``, ``chart.png`` (when a
table has measured numeric columns) and ``result.json`` (the tables as data, with the command, machine, date and
commit; :mod:`benchmarks.results`). ``rl-speed bench NAME ...`` is the same command from a checkout.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys

from benchmarks import REGISTRY, ROOT

USAGE_ERROR = 2


def build_parser(prog: str = "python -m benchmarks") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run one of rl_speed's benchmarks (from a checkout).")
    parser.add_argument("name", choices=sorted(REGISTRY), help="which benchmark")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is reported")
    parser.add_argument("--output", default=str(ROOT / "results"),
                        help="results directory: NAME/table.md, NAME/chart.png, NAME/result.json (default: the "
                             "checkout's results/)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="learner device (dqn, grid-preset, scaling, durotaxis, mario-learner, mario-scaling, mettagrid, learner-scaling, atari, atari-runner, atari-learner, atari-dqn-learner, atari-startup, atari-gpu-sharing, cli-start, atari-policy, race-atari, allreduce, batch-copy, frame-norm)")
    parser.add_argument("--checkpoint", help="mario-policy, atari-policy: the checkpoint folder of a trained run to evaluate")
    parser.add_argument("--config", help="learner-scaling: JSON dict of config keys set on every row, e.g. "
                                         "'{\"cuda_graph\": false}'")
    parser.add_argument("--learners", help="learner-scaling: the learner counts to run, e.g. 1,4 (default 1, 2, 4, 8 "
                                           "up to the host's GPUs)")
    parser.add_argument("--game", choices=["pong", "breakout"], help="atari-runner: the game its runner plays "
                                                                     "(default pong)")
    return parser


def learner_counts_flag(text: str) -> tuple[int, ...]:
    """``--learners 1,2,4`` as a tuple of counts; anything else is refused with the syntax."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--learners {text!r}: give learner counts separated by commas, e.g. --learners 1,4.") \
            from None


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> int:
    import os

    from rl_speed.experiments import ExperimentFileError, parse_json_flag

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    module, _, function = REGISTRY[args.name].partition(":")
    run = getattr(importlib.import_module(module), function or "run")
    kwargs = {"device": args.device} if args.device != "cpu" else {}
    flags = {"device": "--device", "checkpoint": "--checkpoint", "overrides": "--config", "learners": "--learners",
             "game": "--game"}
    if args.checkpoint:
        kwargs["checkpoint"] = args.checkpoint
    if args.game:
        kwargs["game"] = args.game
    try:
        if args.config:
            kwargs["overrides"] = parse_json_flag("--config", args.config)
        if args.learners:
            kwargs["learners"] = learner_counts_flag(args.learners)
    except (ExperimentFileError, ValueError) as e:
        print(str(e), file=sys.stderr)
        return USAGE_ERROR
    accepted = inspect.signature(run).parameters
    for name in kwargs:
        if name not in accepted:  # a flag this benchmark has no use for: refuse it rather than crash or ignore
            print(f"{prog} {args.name} takes no {flags[name]}; leave it out.", file=sys.stderr)
            return USAGE_ERROR
    # --output is where everything a benchmark writes goes: its charts and (the Pong race) its per-run logs
    directory = os.path.join(args.output, args.name)
    if "charts" in accepted:
        kwargs["charts"] = directory
    if "directory" in accepted:
        kwargs["directory"] = directory
    try:
        markdown = run(args.repeats, **kwargs)
    except (ValueError, FileNotFoundError, ImportError) as e:  # a bad argument (e.g. no --checkpoint) or a missing
        # extra (its install command): say so, exit 2
        print(str(e), file=sys.stderr)
        return USAGE_ERROR
    print(markdown)
    from benchmarks.results import write_result

    written = write_result(args.name, markdown, directory, command=f"{prog} {' '.join(argv)}")
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
