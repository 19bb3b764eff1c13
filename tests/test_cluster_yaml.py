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
    setup = " ".join(config["setup_commands"])  # setup_commands run on head and workers
    assert "~/rl_speed" in config["file_mounts"] and "pip install" in setup and "~/rl_speed[cluster]" in setup
    assert "torch==2.13.0" in setup
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
