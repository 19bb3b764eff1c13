"""``rl-speed train FILE.yaml`` and its muscle-memory twin ``rllib train file FILE.yaml``.

The file is parsed and validated completely before Ray starts, so a bad file costs a second, not a cluster start,
and ends with exit status 2 and a one-paragraph message.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from rl_speed.experiments import ExperimentFileError, load_experiments, parse_json_flag

USAGE_ERROR = 2


def build_parser(prog: str = "rl-speed") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Fast RLlib training from YAML experiment files.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run the experiments of a YAML file through Ray Tune")
    train.add_argument("file", help="YAML file: {name: {run, env, stop, config, checkpoint_config}}")
    train.add_argument("--experiment", action="append", metavar="NAME",
                       help="run only the file's experiment NAME (repeat for several; default: all of them)")
    train.add_argument("--stop", help="JSON dict merged over each experiment's `stop`, e.g. '{\"time_total_s\": 60}'")
    train.add_argument("--config", help="JSON dict deep-merged over each experiment's `config`")
    train.add_argument("--storage-path", help="where Tune writes results and checkpoints (default ~/ray_results)")
    train.add_argument("--num-cpus", type=int, help="CPUs of the local Ray this command starts")
    train.add_argument("--num-gpus", type=int, help="GPUs of the local Ray this command starts")
    train.add_argument("--address", help="join a running Ray cluster (inside `ray job submit` this is automatic)")
    train.add_argument("-v", "--verbose", action="store_true", help="show Tune's table and the workers' logs")
    train.add_argument("--no-preload", action="store_true",
                       help="the local Ray's idle workers do not import the experiments' algorithm and runner "
                            "modules in advance (saves about 215 MiB per idle worker; the runners start slower)")
    train.add_argument("--resume", action="store_true",
                       help="continue the stopped or crashed run of each experiment (same --storage-path) from its "
                            "last checkpoint")
    train.add_argument("--cuda-mps", action="store_true",
                       help="run the local Ray's workers under an MPS daemon of this run's own (NVIDIA's "
                            "multi-process service: GPU runners' and the learner's kernels side by side; 1.08x env "
                            "steps/s on Pong's GPU preset); not with --address")
    train.add_argument("--strict", action="store_true",
                       help="refuse Ray-2.9-era keys (num_workers, num_sgd_iter, model, ...) instead of translating "
                            "them")
    migrate = commands.add_parser("migrate", help="print a Ray-2.9-era YAML file in new-stack keys")
    migrate.add_argument("file", help="the old YAML experiment file")
    plot = commands.add_parser("plot", help="PNG of return and throughput vs env steps and wall time, one line per run")
    plot.add_argument("results", help="a results directory (an experiment, or a storage path holding several)")
    plot.add_argument("-o", "--output", help="PNG path (default RESULTS/rl_speed_plot.png)")
    bench = commands.add_parser("bench", help="run a benchmark from a checkout (python -m benchmarks NAME; see "
                                              "docs/results.md)", add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER, help="NAME [--repeats N] [--output DIR] ...")
    return parser


def train(args: argparse.Namespace) -> int:
    try:
        experiments = load_experiments(args.file, parse_json_flag("--stop", args.stop),
                                       parse_json_flag("--config", args.config), strict=args.strict,
                                       only=args.experiment)
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
    if args.cuda_mps and (args.address or os.environ.get("RAY_ADDRESS")):
        print("--cuda-mps starts a daemon for the local Ray this command starts; a cluster's workers (--address, "
              "RAY_ADDRESS) do not inherit it. Fix: start `nvidia-cuda-mps-control -d` on each node before `ray start` "
              "(docs/guides/fastppo.md), and drop --cuda-mps.", file=sys.stderr)
        return USAGE_ERROR
    import ray

    from rl_speed.cuda_mps import CudaMpsError, cuda_mps
    from rl_speed.ray_start import preload_modules

    preload = [] if args.no_preload else preload_modules((e.algo_class, e.config) for e in experiments)
    with contextlib.ExitStack() as stack:
        if args.cuda_mps:
            try:
                stack.enter_context(cuda_mps())  # before Ray starts: its workers inherit the daemon's variables
            except CudaMpsError as e:
                print(str(e), file=sys.stderr)
                return USAGE_ERROR
        worker_environ = init_ray(args.address, args.num_cpus, args.num_gpus, args.verbose, preload)
        try:
            return run_experiments(experiments, args.storage_path, verbose=args.verbose, resume=args.resume,
                                   worker_environ=worker_environ)
        finally:
            ray.shutdown()


def migrate(args: argparse.Namespace) -> int:
    """Prints ``args.file`` translated to new-stack keys (notices to stderr); the file is checked as for ``train``."""
    import yaml

    from rl_speed.migrate import MigrationError, migrate_experiment

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
        return bench(args.args)
    return USAGE_ERROR


def bench(argv: list[str]) -> int:
    """``rl-speed bench NAME ...``: the checkout's ``python -m benchmarks NAME ...`` (the benchmarks are not installed
    with the library: they measure it, and read the checkout's tuned_examples/)."""
    checkout = find_checkout()
    if checkout is None:
        print("rl-speed bench runs the benchmarks of a checkout of rl_speed, which are not installed with the "
              "library: clone the repository, install it with `pip install -e .` (or `python3 tasks.py setup`), and "
              "run `rl-speed bench NAME` or `python -m benchmarks NAME` from there.", file=sys.stderr)
        return USAGE_ERROR
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from benchmarks.__main__ import main as run_benchmark

    return run_benchmark(argv, prog="rl-speed bench")


def find_checkout() -> "Path | None":
    """The rl_speed checkout holding ``benchmarks/``: the one this package was installed from (editable), else the
    current directory or one above it."""
    from pathlib import Path

    import rl_speed

    candidates = [Path(rl_speed.__file__).resolve().parents[1], *Path.cwd().resolve().parents]
    candidates.insert(1, Path.cwd().resolve())
    for folder in candidates:
        if (folder / "benchmarks" / "__main__.py").is_file() and (folder / "rl_speed").is_dir():
            return folder
    return None


def rllib_main(argv: list[str] | None = None) -> int:
    """``rllib train file FILE.yaml [flags]``: the command Ray removed, for users' muscle memory."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] != ["train", "file"]:
        print("rl_speed's `rllib` runs YAML experiments only: rllib train file FILE.yaml [--experiment NAME] "
              "[--stop JSON] [--config JSON] "
              "[--storage-path DIR] [--num-cpus N] [--num-gpus N] [--address ADDR]. See `rl-speed train --help`.",
              file=sys.stderr)
        return USAGE_ERROR
    args = build_parser("rllib train file").parse_args(["train", *argv[2:]])
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
