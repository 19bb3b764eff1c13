"""`rl-speed bench NAME` refuses a flag that benchmark has no use for (exit 2, naming it) before anything runs."""

from __future__ import annotations

from rl_speed.cli.main import USAGE_ERROR, main


def test_device_on_a_cpu_only_benchmark_is_refused(tmp_path, capsys):
    assert main(["bench", "gae", "--device", "cuda", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --device" in capsys.readouterr().err


def test_checkpoint_on_a_benchmark_without_one_is_refused(tmp_path, capsys):
    assert main(["bench", "gae", "--checkpoint", str(tmp_path), "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --checkpoint" in capsys.readouterr().err


def test_output_receives_the_charts_and_run_logs_of_benchmarks_that_write_them(tmp_path, monkeypatch, capsys):
    from rl_speed.bench import race_atari

    seen = {}

    def fake_run(repeats, device="cpu", charts=None, directory=None):
        seen.update(repeats=repeats, charts=charts, directory=directory)
        return "| a | b |\n|---|---|\n| 1 | 2 |"

    monkeypatch.setattr(race_atari, "run", fake_run)
    assert main(["bench", "race-atari", "--repeats", "1", "--output", str(tmp_path)]) == 0
    assert seen == {"repeats": 1, "charts": str(tmp_path), "directory": str(tmp_path / "race-atari")}
