"""rl_speed's benchmarks: measurements, not library (never installed; they run from a checkout).

``python -m benchmarks NAME`` (or ``rl-speed bench NAME`` from a checkout) runs one and writes its table, chart and
``result.json`` under ``results/NAME/`` (see :mod:`benchmarks.__main__`). Grouped by what they answer:
``throughput/`` (env steps/s of one setup against stock RLlib and bare loops), ``scaling/`` (runners, learners,
GPUs), ``race/`` (time to a score, a common judge of episode returns) and ``evaluate/`` (a trained policy's score).
"""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (the benchmarks read its tuned_examples/ and write its results/).
ROOT = Path(__file__).resolve().parents[1]
TUNED_EXAMPLES = ROOT / "tuned_examples"

#: benchmark name -> "module" with a run(repeats, ...) -> markdown function, or "module:function"
REGISTRY = {
    "snake-env": "benchmarks.throughput.snake_env", "dqn": "benchmarks.throughput.dqn",
    "dqn-defaults": "benchmarks.throughput.dqn:run_defaults", "buffer": "benchmarks.throughput.buffer",
    "gae": "benchmarks.throughput.gae", "ppo": "benchmarks.throughput.ppo",
    "ppo-defaults": "benchmarks.throughput.ppo:run_defaults", "durotaxis": "benchmarks.throughput.durotaxis",
    "mario-env": "benchmarks.throughput.mario_env", "replay-memory": "benchmarks.throughput.replay_memory",
    "lstm": "benchmarks.throughput.lstm", "cli": "benchmarks.throughput.cli_overhead",
    "multi-agent": "benchmarks.throughput.multi_agent_columns", "mettagrid": "benchmarks.throughput.mettagrid",
    "atari": "benchmarks.throughput.atari", "atari-runner": "benchmarks.throughput.atari_runner",
    "atari-emulators": "benchmarks.throughput.atari_emulators",
    "atari-learner": "benchmarks.throughput.atari_learner",
    "atari-dqn-learner": "benchmarks.throughput.atari_learner:run_dqn",
    "batch-copy": "benchmarks.throughput.batch_copy",
    "frame-norm": "benchmarks.throughput.frame_norm",
    "callbacks": "benchmarks.throughput.callbacks",
    "scaling": "benchmarks.scaling.scaling", "learner-scaling": "benchmarks.scaling.learner_scaling",
    "mario-learner": "benchmarks.scaling.mario_learner", "mario-scaling": "benchmarks.scaling.mario_scaling",
    "allreduce": "benchmarks.scaling.allreduce", "runner-starts": "benchmarks.scaling.runner_starts",
    "atari-startup": "benchmarks.scaling.atari_startup", "cli-start": "benchmarks.scaling.cli_start",
    "atari-gpu-sharing": "benchmarks.scaling.gpu_sharing",
    "race": "benchmarks.race.race", "race-atari": "benchmarks.race.race_atari",
    "grid-preset": "benchmarks.race.grid_preset",
    "atari-policy": "benchmarks.evaluate.atari_policy", "mario-policy": "benchmarks.evaluate.mario_policy",
}
