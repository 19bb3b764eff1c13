"""`rl-speed plot`: one PNG with a line per run found under a results directory; clear errors otherwise."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from PIL import Image

from rl_speed.cli.plot import read_runs

RL_SPEED = str(Path(sys.executable).parent / "rl-speed")


def _trial(root: Path, name: str, rate: float) -> None:
    trial = root / name
    trial.mkdir(parents=True)
    with open(trial / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["training_iteration", "time_total_s", "env_runners/num_env_steps_sampled_lifetime",
                                    "env_runners/episode_return_mean"])
        writer.writeheader()
        for i in range(1, 6):
            writer.writerow({"training_iteration": i, "time_total_s": i, "env_runners/num_env_steps_sampled_lifetime":
                             i * rate, "env_runners/episode_return_mean": "" if i == 1 else i * 10})


def test_plot_writes_one_png_with_every_run(tmp_path):
    _trial(tmp_path, "snake-ppo/PPO_snake_00000", 5000)
    _trial(tmp_path, "snake-fastppo/FastPPO_snake_00000", 9000)
    runs = read_runs(tmp_path)
    assert sorted(runs) == ["snake-fastppo/FastPPO_snake_00000", "snake-ppo/PPO_snake_00000"]
    proc = subprocess.run([RL_SPEED, "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    png = Path(proc.stdout.strip())
    assert png == tmp_path / "rl_speed_plot.png"
    with Image.open(png) as image:
        assert image.size[0] > 1000 and image.size[1] > 300


def test_plot_errors_name_the_fix(tmp_path):
    proc = subprocess.run([RL_SPEED, "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no result.json / progress.csv under" in proc.stderr and "Fix:" in proc.stderr
    proc = subprocess.run([RL_SPEED, "plot", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
