"""``rl-speed train FILE.yaml`` and its muscle-memory twin ``rllib train file FILE.yaml``.

The file is parsed and validated completely before Ray starts, so a bad file costs a second, not a cluster start,
and ends with exit status 2 and a one-paragraph message.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

from rl_speed.cli.experiment_file import ExperimentFileError, load_experiments, parse_json_flag

USAGE_ERROR = 2
#: benchmark name -> "module" with a run(repeats) -> markdown function, or "module:function"
BENCHMARKS = {"snake-env": "rl_speed.bench.snake_env", "dqn": "rl_speed.bench.dqn", "buffer": "rl_speed.bench.buffer",
              "gae": "rl_speed.bench.gae", "ppo": "rl_speed.bench.ppo", "grid-preset": "rl_speed.bench.grid_preset",
              "scaling": "rl_speed.bench.scaling", "durotaxis": "rl_speed.bench.durotaxis",
              "mario-env": "rl_speed.bench.mario_env", "mario-learner": "rl_speed.bench.mario_learner",
              "mario-scaling": "rl_speed.bench.mario_scaling", "mario-policy": "rl_speed.bench.mario_policy",
              "replay-memory": "rl_speed.bench.replay_memory", "lstm": "rl_speed.bench.lstm",
              "ppo-defaults": "rl_speed.bench.ppo:run_defaults", "dqn-defaults": "rl_speed.bench.dqn:run_defaults",
              "cli": "rl_speed.bench.cli_overhead", "multi-agent": "rl_speed.bench.multi_agent",
              "mettagrid": "rl_speed.bench.mettagrid", "race": "rl_speed.bench.race",
              "learner-scaling": "rl_speed.bench.learner_scaling", "atari": "rl_speed.bench.atari",
              "atari-policy": "rl_speed.bench.atari_policy", "race-atari": "rl_speed.bench.race_atari",
              "allreduce": "rl_speed.bench.allreduce", "batch-copy": "rl_speed.bench.batch_copy",
              "callbacks": "rl_speed.bench.callbacks"}


def build_parser(prog: str = "rl-speed") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Fast RLlib training from YAML experiment files.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run the experiments of a YAML file through Ray Tune")
    train.add_argument("file", help="YAML file: {name: {run, env, stop, config, checkpoint_config}}")
    train.add_argument("--stop", help="JSON dict merged over each experiment's `stop`, e.g. '{\"time_total_s\": 60}'")
    train.add_argument("--config", help="JSON dict deep-merged over each experiment's `config`")
    train.add_argument("--storage-path", help="where Tune writes results and checkpoints (default ~/ray_results)")
    train.add_argument("--num-cpus", type=int, help="CPUs of the local Ray this command starts")
    train.add_argument("--num-gpus", type=int, help="GPUs of the local Ray this command starts")
    train.add_argument("--address", help="join a running Ray cluster (inside `ray job submit` this is automatic)")
    train.add_argument("-v", "--verbose", action="store_true", help="show Tune's table and the workers' logs")
    train.add_argument("--resume", action="store_true",
                       help="continue the stopped or crashed run of each experiment (same --storage-path) from its "
                            "last checkpoint")
    train.add_argument("--strict", action="store_true",
                       help="refuse Ray-2.9-era keys (num_workers, num_sgd_iter, model, ...) instead of translating "
                            "them")
    migrate = commands.add_parser("migrate", help="print a Ray-2.9-era YAML file in new-stack keys")
    migrate.add_argument("file", help="the old YAML experiment file")
    plot = commands.add_parser("plot", help="PNG of return and throughput vs env steps and wall time, one line per run")
    plot.add_argument("results", help="a results directory (an experiment, or a storage path holding several)")
    plot.add_argument("-o", "--output", help="PNG path (default RESULTS/rl_speed_plot.png)")
    bench = commands.add_parser("bench", help="run a benchmark and print its markdown table (see BENCHMARKS.md)")
    bench.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    bench.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is reported")
    bench.add_argument("--output", default="results/bench",
                       help="directory for NAME.md (the table) and NAME.png (bar chart); default results/bench")
    bench.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="learner device (dqn, grid-preset, scaling, durotaxis, mario-learner, mario-scaling, mettagrid, learner-scaling, atari, atari-policy, race-atari, allreduce, batch-copy)")
    bench.add_argument("--checkpoint", help="mario-policy, atari-policy: the checkpoint folder of a trained run to evaluate")
    bench.add_argument("--config", help="learner-scaling: JSON dict of config keys set on every row, e.g. "
                                        "'{\"cuda_graph\": false}'")
    bench.add_argument("--learners", help="learner-scaling: the learner counts to run, e.g. 1,4 (default 1, 2, 4, 8 up "
                                          "to the host's GPUs)")
    return parser


def train(args: argparse.Namespace) -> int:
    try:
        experiments = load_experiments(args.file, parse_json_flag("--stop", args.stop),
                                       parse_json_flag("--config", args.config), strict=args.strict)
    except ExperimentFileError as e:
        print(str(e), file=sys.stderr)
        return USAGE_ERROR
    for experiment in experiments:
        for notice in experiment.notices:
            print(f"{args.file}, experiment `{experiment.name}`: {notice}", file=sys.stderr)
    from rl_speed.cli.train import init_ray, run_experiments

    if args.resume:
        from rl_speed.cli.train import check_resumable

        problem = check_resumable(experiments, args.storage_path)
        if problem:
            print(problem, file=sys.stderr)
            return USAGE_ERROR
    import ray

    init_ray(args.address, args.num_cpus, args.num_gpus, args.verbose)
    try:
        return run_experiments(experiments, args.storage_path, verbose=args.verbose, resume=args.resume)
    finally:
        ray.shutdown()


def migrate(args: argparse.Namespace) -> int:
    """Prints ``args.file`` translated to new-stack keys (notices to stderr); the file is checked as for ``train``."""
    import yaml

    from rl_speed.cli.migrate import MigrationError, migrate_experiment

    try:
        experiments = load_experiments(args.file)  # everything train would refuse, refused here too
        raw = yaml.safe_load(open(args.file))
        translated = {}
        for name, spec in raw.items():
            translated[name], notices = migrate_experiment(spec)
            for notice in notices:
                print(f"{args.file}, experiment `{name}`: {notice}", file=sys.stderr)
    except (ExperimentFileError, MigrationError) as e:
        print(str(e), file=sys.stderr)
        return USAGE_ERROR
    assert len(experiments) == len(translated)
    print(yaml.safe_dump(translated, sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return train(args)
    if args.command == "migrate":
        return migrate(args)
    if args.command == "plot":
        from rl_speed.cli.plot import PlotError, plot_results

        try:
            print(plot_results(args.results, args.output))
        except PlotError as e:
            print(str(e), file=sys.stderr)
            return USAGE_ERROR
        return 0
    if args.command == "bench":
        import importlib

        module, _, function = BENCHMARKS[args.name].partition(":")
        run = getattr(importlib.import_module(module), function or "run")
        kwargs = {"device": args.device} if args.device != "cpu" else {}
        flags = {"device": "--device", "checkpoint": "--checkpoint", "overrides": "--config", "learners": "--learners"}
        if args.checkpoint:
            kwargs["checkpoint"] = args.checkpoint
        try:
            if args.config:
                kwargs["overrides"] = parse_json_flag("--config", args.config)
            if args.learners:
                kwargs["learners"] = learner_counts_flag(args.learners)
        except (ExperimentFileError, ValueError) as e:
            print(str(e), file=sys.stderr)
            return USAGE_ERROR
        accepted = inspect.signature(run).parameters
        # --output is where everything a benchmark writes goes: its charts and (the Pong race) its per-run logs
        if "charts" in accepted:
            kwargs["charts"] = args.output
        if "directory" in accepted:
            kwargs["directory"] = os.path.join(args.output, args.name)
        for name in kwargs:
            if name not in accepted:  # a flag this benchmark has no use for: refuse it rather than crash or ignore
                print(f"rl-speed bench {args.name} takes no {flags[name]}; leave it out.", file=sys.stderr)
                return USAGE_ERROR
        try:
            markdown = run(args.repeats, **kwargs)
        except (ValueError, FileNotFoundError, ImportError) as e:  # a bad argument (e.g. no --checkpoint) or a
            # missing extra (its install command): say so, exit 2
            print(str(e), file=sys.stderr)
            return USAGE_ERROR
        print(markdown)
        from rl_speed.bench.chart import write_outputs

        table, chart = write_outputs(args.name, markdown, args.output)
        print(f"\nwritten: {table}" + (f", {chart}" if chart else ""))
        return 0
    return USAGE_ERROR


def learner_counts_flag(text: str) -> tuple[int, ...]:
    """``--learners 1,2,4`` as a tuple of counts; anything else is refused with the syntax."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--learners {text!r}: give learner counts separated by commas, e.g. --learners 1,4.") \
            from None


def rllib_main(argv: list[str] | None = None) -> int:
    """``rllib train file FILE.yaml [flags]``: the command Ray removed, for users' muscle memory."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] != ["train", "file"]:
        print("rl_speed's `rllib` runs YAML experiments only: rllib train file FILE.yaml [--stop JSON] [--config JSON] "
              "[--storage-path DIR] [--num-cpus N] [--num-gpus N] [--address ADDR]. See `rl-speed train --help`.",
              file=sys.stderr)
        return USAGE_ERROR
    args = build_parser("rllib train file").parse_args(["train", *argv[2:]])
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
