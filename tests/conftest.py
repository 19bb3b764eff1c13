"""One private local Ray per test session, started only by tests that ask for it, and shut down at the end; the probe
for ops that make a CUDA device wait for the host (``syncing_ops``)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class SyncingOps(TorchDispatchMode):
    """Records the ops that make a CUDA device wait for the host: boolean indexing (a ``nonzero``), ``item()``, and
    a tensor built from a host list (``torch.tensor([...])``: a blocking copy to a GPU, which a CUDA graph cannot
    hold). A Python number becomes a 0-dim CPU tensor that CUDA kernels take as an argument, so it is not counted."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        bool_index = name == "aten.index.Tensor" and any(
            getattr(i, "dtype", None) == torch.bool for i in (args[1] or []) if i is not None)
        host_list = name == "aten.lift_fresh.default" and args[0].dim() > 0
        if bool_index or host_list or name in ("aten.nonzero.default", "aten._local_scalar_dense.default",
                                               "aten.masked_select.default"):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def syncing_ops():
    """The probe class (:class:`SyncingOps`): ``with syncing_ops() as ops: ...`` then ``ops.seen``."""
    return SyncingOps
