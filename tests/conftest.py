"""One private local Ray per test session, started only by tests that ask for it, and shut down at the end."""

from __future__ import annotations

import os

import pytest

NUM_CPUS = 2


@pytest.fixture(scope="session")
def ray_session():
    import ray

    import rl_speed

    rl_speed.register()
    # address="local" always starts a private Ray; it never attaches to another cluster on this machine.
    ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}})
    yield ray
    ray.shutdown()


@pytest.fixture
def cli_env():
    """Environment for CLI subprocesses: no inherited RAY_ADDRESS, so they start their own private Ray."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env
