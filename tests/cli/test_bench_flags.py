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


def test_config_and_learners_on_a_benchmark_without_them_are_refused(tmp_path, capsys):
    assert main(["bench", "gae", "--config", '{"lr": 0.001}', "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --config" in capsys.readouterr().err
    assert main(["bench", "gae", "--learners", "1,2", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --learners" in capsys.readouterr().err


def test_learner_scaling_gets_config_keys_and_learner_counts(tmp_path, monkeypatch, capsys):
    from rl_speed.bench import learner_scaling

    seen = {}

    def fake_run(repeats, device="cpu", learners=None, overrides=None):
        seen.update(device=device, learners=learners, overrides=overrides)
        return "| a | b |\n|---|---|\n| 1 | 2 |"

    monkeypatch.setattr(learner_scaling, "run", fake_run)
    assert main(["bench", "learner-scaling", "--device", "cuda", "--config", '{"cuda_graph": false}',
                 "--learners", "1,4", "--output", str(tmp_path)]) == 0
    assert seen == {"device": "cuda", "learners": (1, 4), "overrides": {"cuda_graph": False}}


def test_bad_config_json_or_learner_counts_are_refused_naming_the_flag(tmp_path, capsys):
    assert main(["bench", "learner-scaling", "--config", "{cuda_graph: false}", "--output", str(tmp_path)]) \
        == USAGE_ERROR
    assert "--config" in capsys.readouterr().err
    assert main(["bench", "learner-scaling", "--learners", "1,four", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "--learners '1,four': give learner counts separated by commas" in capsys.readouterr().err
    assert main(["bench", "learner-scaling", "--learners", "0,2", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "must be counts from 1" in capsys.readouterr().err
