"""rl_speed.ray_start: which modules a local Ray's workers import in advance, that they do import them before an
actor runs, that `rl-speed train` asks for them unless --no-preload, and Ray started while a script prepares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ray.rllib.algorithms.ppo import PPO, PPOConfig

from rl_speed.algorithms.fast_dqn import FastDQN, FastDQNConfig
from rl_speed.algorithms.fast_ppo import FastPPO, FastPPOConfig
from rl_speed.ray_start import preload_modules

ROOT = Path(__file__).parents[1]


def test_preload_modules_are_the_algorithms_and_their_runners():
    multi = PPOConfig().multi_agent(policies={"a"}, policy_mapping_fn=lambda agent, episode, **kw: "a")
    assert preload_modules([(FastPPO, FastPPOConfig())]) == ["rl_speed.algorithms.fast_ppo",
                                                            "rl_speed.env_runners.batched"]
    assert preload_modules([(FastPPO, FastPPOConfig()), (FastDQN, FastDQNConfig())]) == [
        "rl_speed.algorithms.fast_dqn", "rl_speed.algorithms.fast_ppo", "rl_speed.env_runners.batched"]
    assert preload_modules([(PPO, PPOConfig())]) == ["ray.rllib.algorithms.ppo.ppo",
                                                    "ray.rllib.env.single_agent_env_runner"]
    assert preload_modules([(PPO, multi)]) == ["ray.rllib.algorithms.ppo.ppo", "ray.rllib.env.multi_agent_env_runner"]
    script_algo = type("MyPPO", (FastPPO,), {"__module__": "__main__"})  # a subclass defined in the user's script
    assert preload_modules([(script_algo, FastPPOConfig())]) == ["rl_speed.env_runners.batched"]


# In a fresh process with its own Ray (this session's Ray is another), started while another thread imports the
# preloaded module or fails to: what the driver imported, whether Ray is up, and an actor's first look at sys.modules
# (the preloaded module, and a module of rl_speed's that nothing preloads); or the import's error with Ray shut down.
PROBE = """
import json, sys, tempfile
import ray
from rl_speed.ray_start import init_local_ray

@ray.remote(num_cpus=1)
class Probe:
    def __init__(self):
        self.seen = {name: name in sys.modules for name in ("rl_speed.algorithms.fast_ppo", "rl_speed.cli.main")}

    def seen_at_init(self):
        return self.seen

kwargs = dict(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_start_"))
assert "rl_speed.algorithms.fast_ppo" not in sys.modules
try:
    init_local_ray(["rl_speed.algorithms.fast_ppo"], import_beside=json.loads(sys.argv[1]), **kwargs)
    print(json.dumps({"imported": "rl_speed.algorithms.fast_ppo" in sys.modules, "ray_up": ray.is_initialized(),
                      "cpus": ray.cluster_resources()["CPU"],
                      "actor_saw": ray.get(Probe.remote().seen_at_init.remote(), timeout=120)}))
except ImportError as error:
    print(json.dumps({"error": error.name, "ray_up": ray.is_initialized()}))
finally:
    ray.shutdown()
"""


def test_a_local_ray_starts_while_this_process_imports_its_workers_preload_and_an_import_error_stops_it(cli_env):
    def probe(modules: list[str]) -> dict:
        proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(modules)], capture_output=True, text=True,
                              timeout=300, env=cli_env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert probe(["rl_speed.algorithms.fast_ppo"]) == {
        "imported": True, "ray_up": True, "cpus": 1.0,
        "actor_saw": {"rl_speed.algorithms.fast_ppo": True, "rl_speed.cli.main": False}}
    assert probe(["rl_speed.no_such_module"]) == {"error": "rl_speed.no_such_module", "ray_up": False}


def test_rl_speed_train_preloads_its_experiments_modules_unless_told_not_to(tmp_path, monkeypatch):
    import ray

    from rl_speed.cli import train as train_module
    from rl_speed.cli.main import main

    path = tmp_path / "x.yaml"
    path.write_text("x:\n  run: FastPPO\n  env: CartPole-v1\n  stop: {training_iteration: 1}\n")
    asked = []
    monkeypatch.setattr(train_module, "init_ray", lambda *args: asked.append(args[-1]))
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # (no Ray was started)
    monkeypatch.setattr(train_module, "run_experiments", lambda *a, **k: 0)
    assert main(["train", str(path)]) == 0
    assert main(["train", str(path), "--no-preload"]) == 0
    assert asked == [["rl_speed.algorithms.fast_ppo", "rl_speed.env_runners.batched"], []]


def test_tune_makes_a_trial_actor_class_without_a_runtime_env_that_would_change_nothing(monkeypatch):
    from ray.tune.execution.class_cache import DEFAULT_ENV_VARS, _ActorClassCache

    from rl_speed.ray_start import tune_trials_on_prestarted_workers

    class Trial:
        pass

    def runtime_env(worker_environ: dict | None) -> dict | None:
        with tune_trials_on_prestarted_workers(worker_environ):
            return _ActorClassCache().get(Trial)._default_options.get("runtime_env")

    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    assert not runtime_env(dict(DEFAULT_ENV_VARS))  # the workers have Tune's env vars already
    assert runtime_env({})["env_vars"] == DEFAULT_ENV_VARS  # they lack them: Tune's runtime env stays
    assert runtime_env({name: "0" for name in DEFAULT_ENV_VARS})["env_vars"] == DEFAULT_ENV_VARS  # another value
    assert runtime_env(None)["env_vars"] == DEFAULT_ENV_VARS  # a cluster's workers: Tune left as it is
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")  # one that Tune passes on from the driver's environment
    assert runtime_env(dict(DEFAULT_ENV_VARS))["env_vars"] == {**DEFAULT_ENV_VARS, "AWS_ACCESS_KEY_ID": "key"}
    assert not runtime_env({**DEFAULT_ENV_VARS, "AWS_ACCESS_KEY_ID": "key"})
    # outside the block, Tune's own
    assert _ActorClassCache().get(Trial)._default_options["runtime_env"]["env_vars"] == {
        **DEFAULT_ENV_VARS, "AWS_ACCESS_KEY_ID": "key"}


# In a fresh process with `rl-speed train`'s local Ray (3 CPUs, a light module preloaded so that the prestarted workers
# are ready when the trial comes: 2 cores import torch slowly): a Tune trial that creates one actor; whether the
# trial's and the actor's processes were running before `fit()` began (Ray's prestarted workers) and whether the trial
# saw the preloaded module, with Tune's runtime env dropped and kept.
TRIAL_PROBE = """
import json, os, sys, tempfile, time
import ray
from ray import tune
from rl_speed.cli.train import init_ray
from rl_speed.ray_start import tune_trials_on_prestarted_workers

def age():
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks since boot
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started / os.sysconf("SC_CLK_TCK")

@ray.remote(num_cpus=1)
class Child:
    def age(self):
        return age()

class Probe(tune.Trainable):
    def setup(self, config):
        self.seen = "rl_speed.columns" in sys.modules
        self.child_age = ray.get(Child.remote().age.remote())

    def step(self):
        return {"trial_age": age(), "child_age": self.child_age, "seen": self.seen, "done": True}

def trial(keep_tunes_env):
    # the trial's bundle and its actor's, as an RLlib algorithm asks for its runners (Tune places both in the trial's
    # placement group)
    resources = tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}])
    tuner = tune.Tuner(tune.with_resources(Probe, resources),
                       run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0))
    start = time.monotonic()
    if keep_tunes_env:
        result = tuner.fit()[0].metrics
    else:
        with tune_trials_on_prestarted_workers(environ):
            result = tuner.fit()[0].metrics
    since = time.monotonic() - start
    return {"trial_prestarted": result["trial_age"] > since, "child_prestarted": result["child_age"] > since,
            "seen": result["seen"]}

def idle_workers(raylet):  # the raylet's worker processes registered and waiting for work (titled ray::IDLE)
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline") as f:
                title = f.read()
        except OSError:
            continue
        count += parent == raylet and title.startswith("ray::IDLE")
    return count

environ = init_ray(None, 3, None, False, ["rl_speed.columns"])
# the prestarted workers registered before the trials come (on a busy machine they take seconds; a trial that came
# sooner would get a fresh process and the probe would measure the machine's load, not Tune's runtime env)
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
deadline = time.monotonic() + 120
while idle_workers(raylet) < 2 and time.monotonic() < deadline:  # the trial's and its actor's
    time.sleep(0.2)
try:
    print(json.dumps({"dropped": trial(False), "kept": trial(True),
                      "env_vars_set": all(environ.get(k) == v for k, v in {"PL_DISABLE_FORK": "1"}.items())}))
finally:
    ray.shutdown()
"""


def test_rl_speed_trains_tune_trials_and_their_runners_on_rays_prestarted_workers(cli_env):
    cli_env.pop("PL_DISABLE_FORK", None)
    proc = subprocess.run([sys.executable, "-c", TRIAL_PROBE], capture_output=True, text=True, timeout=300,
                          env=cli_env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # The trial lands on a prestarted worker; its actor may (on an idle machine it does, probed 2026-12-05) but under
    # load Ray has started a fresh process for it although idle workers were registered, so only the trial is checked
    # there. With Tune's runtime env kept, neither can use a prestarted worker.
    seen["dropped"].pop("child_prestarted")
    assert seen == {"dropped": {"trial_prestarted": True, "seen": True},
                    "kept": {"trial_prestarted": False, "child_prestarted": False, "seen": True},
                    "env_vars_set": True}


def test_rl_speed_train_gives_tune_the_environment_of_the_local_rays_workers(tmp_path, monkeypatch):
    import ray

    from rl_speed.cli import train as train_module
    from rl_speed.cli.main import main

    path = tmp_path / "x.yaml"
    path.write_text("x:\n  run: FastPPO\n  env: CartPole-v1\n  stop: {training_iteration: 1}\n")
    given = []
    monkeypatch.setattr(train_module, "init_ray", lambda *args: {"PL_DISABLE_FORK": "1"})
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # (no Ray was started)
    monkeypatch.setattr(train_module, "run_experiments", lambda *a, **k: given.append(k["worker_environ"]) or 0)
    assert main(["train", str(path)]) == 0
    assert given == [{"PL_DISABLE_FORK": "1"}]


# In a fresh process (nothing has imported the compiler yet): which configs start the learner's imports beside the
# runners' start, and that the thread imports them.
LEARNER_IMPORTS_PROBE = """
import json, sys
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.ray_start import import_learner_modules_beside_runners as beside

assert "torch._dynamo" not in sys.modules
out = {"cpu_learner": beside(FastPPOConfig()), "remote_learners": beside(FastPPOConfig().learners(num_learners=2,
       num_gpus_per_learner=1))}
thread = beside(FastPPOConfig().learners(num_learners=0, num_gpus_per_learner=1))
thread.join()
out["imported"] = "torch._dynamo" in sys.modules and thread.error is None
out["again"] = beside(FastPPOConfig().learners(num_gpus_per_learner=1))
print(json.dumps(out))
"""


def test_a_local_gpu_learners_imports_start_beside_the_runners_and_nothing_else_does():
    proc = subprocess.run([sys.executable, "-c", LEARNER_IMPORTS_PROBE], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "cpu_learner": None, "remote_learners": None, "imported": True, "again": None}


class _Stop(Exception):
    pass


@pytest.mark.parametrize("algo", ["FastPPO", "FastDQN"])
def test_the_learners_imports_start_before_the_algorithm_starts_its_runners(algo, monkeypatch):
    from ray.rllib.algorithms.dqn import DQN

    from rl_speed.algorithms import fast_dqn, fast_ppo

    module, config, parent = {"FastPPO": (fast_ppo, FastPPOConfig, PPO),
                              "FastDQN": (fast_dqn, FastDQNConfig, DQN)}[algo]
    calls = []
    monkeypatch.setattr(module, "import_learner_modules_beside_runners", lambda config: calls.append("imports"))

    def runners_and_learner(self, config):  # RLlib's setup: the runners, their wait, then the learner
        calls.append("runners and learner")
        raise _Stop

    monkeypatch.setattr(parent, "setup", runners_and_learner)
    with pytest.raises(_Stop):
        config().environment("CartPole-v1").build_algo()
    assert calls == ["imports", "runners and learner"]
