"""rl_speed.ray_start: which modules a local Ray's workers import in advance, that they do import them before an
actor runs, that `rl-speed train` asks for them unless --no-preload, and Ray started while a script prepares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


# In a fresh process with its own Ray (this session's Ray is another): an actor's first look at sys.modules.
PROBE = """
import json, sys, tempfile
import ray
from rl_speed.ray_start import init_local_ray

preload = json.loads(sys.argv[1])
init_local_ray(preload, num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_start_"))

@ray.remote(num_cpus=1)
class Probe:
    def __init__(self):
        self.seen = "rl_speed.algorithms.fast_ppo" in sys.modules

    def seen_at_init(self):
        return self.seen

try:
    print(json.dumps(ray.get(Probe.remote().seen_at_init.remote(), timeout=120)))
finally:
    ray.shutdown()
"""


def test_a_local_rays_workers_import_the_modules_before_an_actor_runs(cli_env):
    def seen(preload: list[str]) -> bool:
        proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(preload)], capture_output=True, text=True,
                              timeout=300, env=cli_env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert seen(["rl_speed.algorithms.fast_ppo"]) is True
    assert seen([]) is False  # the probe's own module imports nothing of rl_speed's


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


# In a fresh process: Ray started while another thread imports; whether the import happened, Ray is up, and whether
# an import's error comes back with Ray shut down.
BESIDE_PROBE = """
import json, sys, tempfile
import ray
from rl_speed.ray_start import init_local_ray

kwargs = dict(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_start_"))
assert "rl_speed.algorithms.fast_ppo" not in sys.modules
try:
    init_local_ray(["rl_speed.algorithms.fast_ppo"], import_beside=json.loads(sys.argv[1]), **kwargs)
    print(json.dumps({"imported": "rl_speed.algorithms.fast_ppo" in sys.modules, "ray_up": ray.is_initialized(),
                      "cpus": ray.cluster_resources()["CPU"]}))
except ImportError as error:
    print(json.dumps({"error": error.name, "ray_up": ray.is_initialized()}))
finally:
    ray.shutdown()
"""


def test_a_local_ray_starts_while_this_process_imports_and_stops_on_an_import_error(cli_env):
    def probe(modules: list[str]) -> dict:
        proc = subprocess.run([sys.executable, "-c", BESIDE_PROBE, json.dumps(modules)], capture_output=True,
                              text=True, timeout=300, env=cli_env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert probe(["rl_speed.algorithms.fast_ppo"]) == {"imported": True, "ray_up": True, "cpus": 1.0}
    assert probe(["rl_speed.no_such_module"]) == {"error": "rl_speed.no_such_module", "ray_up": False}
