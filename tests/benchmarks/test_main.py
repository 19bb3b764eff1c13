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
    from benchmarks.race import race_atari

    seen = {}

    def fake_run(repeats, device="cpu", charts=None, directory=None):
        seen.update(repeats=repeats, charts=charts, directory=directory)
        return "| a | b |\n|---|---|\n| 1 | 2 |"

    monkeypatch.setattr(race_atari, "run", fake_run)
    assert main(["bench", "race-atari", "--repeats", "1", "--output", str(tmp_path)]) == 0
    assert seen == {"repeats": 1, "charts": str(tmp_path / "race-atari"), "directory": str(tmp_path / "race-atari")}
    assert (tmp_path / "race-atari" / "result.json").is_file()


def test_config_and_learners_on_a_benchmark_without_them_are_refused(tmp_path, capsys):
    assert main(["bench", "gae", "--config", '{"lr": 0.001}', "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --config" in capsys.readouterr().err
    assert main(["bench", "gae", "--learners", "1,2", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --learners" in capsys.readouterr().err


def test_game_reaches_atari_runner_and_is_refused_elsewhere(tmp_path, monkeypatch, capsys):
    from benchmarks.throughput import atari_runner

    seen = {}

    def fake_run(repeats, lanes=(16,), device="cpu", game="pong"):
        seen.update(game=game)
        return "| a |\n|---|\n| 1 |"

    monkeypatch.setattr(atari_runner, "run", fake_run)
    assert main(["bench", "atari-runner", "--game", "breakout", "--repeats", "1", "--output", str(tmp_path)]) == 0
    assert seen == {"game": "breakout"}
    assert main(["bench", "gae", "--game", "breakout", "--output", str(tmp_path)]) == USAGE_ERROR
    assert "rl-speed bench gae takes no --game" in capsys.readouterr().err


def test_learner_scaling_gets_config_keys_and_learner_counts(tmp_path, monkeypatch, capsys):
    from benchmarks.scaling import learner_scaling

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


def test_outside_a_checkout_bench_says_what_to_do(monkeypatch, capsys):
    import rl_speed.cli.main as cli

    monkeypatch.setattr(cli, "find_checkout", lambda: None)
    assert cli.main(["bench", "gae"]) == USAGE_ERROR
    assert "not installed with the library: clone the repository" in capsys.readouterr().err


def test_python_m_benchmarks_runs_one_and_writes_its_result_as_data(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # gae: among the quickest benchmarks (about 7 s on 2 cores; buffer took 18 s)
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "gae", "--repeats", "1", "--output", str(tmp_path)],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "gae" / "result.json").read_text())
    assert data["benchmark"] == "gae" and data["command"].startswith("python -m benchmarks gae")
    assert data["tables"] and data["tables"][0]["rows"] and data["machine"] and data["date"] and data["commit"]
    assert (tmp_path / "gae" / "gae.md").is_file()


def test_every_benchmark_command_in_the_docs_resolves():
    """Each `rl-speed bench NAME` / `python -m benchmarks NAME` written in a document names a registered benchmark,
    and each `python -m benchmarks.X` / `from benchmarks.X import Y` names a module (and name) that exists."""
    import importlib
    import re
    from pathlib import Path

    from benchmarks import REGISTRY

    root = Path(__file__).resolve().parents[2]
    documents = [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "benchmarks").rglob("*.py"))]
    seen = 0
    for doc in documents:
        text = doc.read_text()
        for name in re.findall(r"(?:rl-speed bench|python -m benchmarks)\s+([a-z][a-z0-9-]*)", text):
            assert name in REGISTRY, f"{doc.name}: `{name}` is not a benchmark ({', '.join(sorted(REGISTRY))})"
            seen += 1
        for module in re.findall(r"python -m (benchmarks\.[a-z_.]+)", text):
            assert importlib.util.find_spec(module) is not None, f"{doc.name}: no module {module}"
        for module, names in re.findall(r"from (benchmarks(?:\.[a-z_]+)*) import ([a-z_, ]+?(?: as [a-z_]+)?)[;\"`\n]",
                                        text):
            loaded = importlib.import_module(module)
            for name in (n.split(" as ")[0].strip() for n in names.split(",")):
                assert hasattr(loaded, name) or importlib.util.find_spec(f"{module}.{name}"), \
                    f"{doc.name}: {module} has no {name}"
    assert seen > 10


def test_the_results_page_is_what_the_committed_claims_and_result_files_give():
    """docs/results.md regenerates from results/claims.yaml (and the result.json files it names): edit the claims,
    then run `python -m benchmarks.results`."""
    from benchmarks.results import PAGE, load_claims, render_page

    assert PAGE.read_text() == render_page(load_claims())


def test_a_claim_with_a_source_reads_its_figure_from_the_result_file(tmp_path, monkeypatch):
    import json

    import benchmarks.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    (tmp_path / "r.json").write_text(json.dumps({"tables": [{"header": ["env", "FastPPO"], "rows": [["CartPole", "9"]]}]}))
    claim = {"claim": "c", "source": "r.json", "row": "CartPole", "column": "FastPPO", "machine": "m", "date": "d",
             "command": "x", "study": "s.md"}
    assert results.figure_from(claim) == "9"
    assert "| c | 9 |" in results.render_page([claim])


def test_the_recorded_commit_is_dirty_for_changed_code_not_for_rewritten_results(tmp_path, monkeypatch):
    import subprocess

    from benchmarks import results

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "results" / "bench").mkdir(parents=True)
    (tmp_path / "results" / "bench" / "result.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(results, "ROOT", tmp_path)
    results.write_result("bench", "| a | b |\n|---|---:|\n| x | 1 |\n", tmp_path / "results" / "bench", "cmd")
    assert not results._commit().endswith("+dirty")  # only the result it rewrote differs
    (tmp_path / "code.py").write_text("x = 2\n")
    assert results._commit().endswith("+dirty")
