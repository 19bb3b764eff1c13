"""The CLI bench pins a direct run's torch threads to what Ray gives Tune's trainable: check that figure against
RLlib's own resource request for the algorithm's main process."""

import pytest

from rl_speed.algorithms.fast_ppo import FastPPO, FastPPOConfig
from benchmarks.throughput.cli_overhead import main_process_cpus


@pytest.mark.parametrize("settings", [
    {},
    {"num_cpus_for_main_process": 2},
    {"num_cpus_per_learner": 3},
    {"num_learners": 2, "num_cpus_for_main_process": 1},
])
def test_main_process_cpus_matches_rllibs_resource_request(settings):
    config = FastPPOConfig().environment("CartPole-v1")
    resources = {k: v for k, v in settings.items() if k != "num_learners"}
    config = config.learners(num_learners=settings.get("num_learners", 0),
                             **{k: v for k, v in resources.items() if k == "num_cpus_per_learner"})
    if "num_cpus_for_main_process" in resources:
        config = config.resources(num_cpus_for_main_process=resources["num_cpus_for_main_process"])
    bundle = FastPPO.default_resource_request(config).bundles[0]
    assert main_process_cpus(config) == int(bundle["CPU"])
