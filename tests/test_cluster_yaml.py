"""cluster.yaml is a valid Ray autoscaler file (Ray's own schema check, offline) that installs rl_speed everywhere."""

from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]


def test_cluster_yaml_passes_rays_schema_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(open(ROOT / "cluster.yaml"))
    validate_config(prepare_config(config))


def test_cluster_yaml_installs_rl_speed_on_every_node_and_keeps_the_dashboard_private():
    config = yaml.safe_load(open(ROOT / "cluster.yaml"))
    assert "~/rl_speed" in config["file_mounts"]
    # Every node type installs torch (CPU or CUDA wheel) and then rl_speed with pinned Ray.
    per_type = {"head": config["head_setup_commands"]}
    for name, node_type in config["available_node_types"].items():
        if name != config["head_node_type"]:
            per_type[name] = node_type.get("worker_setup_commands", config["worker_setup_commands"])
    assert set(per_type) == {"head", "cpu_worker", "gpu_worker"}
    for name, commands in per_type.items():
        text = " ".join(commands)
        assert "torch==2.13.0" in text and "~/rl_speed[cluster]" in text, name
        assert text.index("torch==2.13.0") < text.index("~/rl_speed[cluster]"), name
    assert "whl/cpu" not in " ".join(per_type["gpu_worker"]) and "whl/cpu" in " ".join(per_type["cpu_worker"])
    assert config["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
