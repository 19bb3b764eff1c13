"""Shared inference: the remote env runners' action step served by one thread of the learner's process
(``shared_inference: true``, FastPPO with a local learner), instead of a forward in every runner.

Why: on a GPU box each runner with its module on the GPU is a CUDA context of its own, and without CUDA's
multi-process service the GPU serves one context at a time: on the Pong preset (15 runners) a runner waits about
2.3 ms a step for a forward the GPU does in a fraction of that, and the learner's update takes 0.345 s beside the
runners against 0.235 s alone (docs/studies/pong-and-atari.md, 2026-12-05). Served from the learner's process, every
forward shares the learner's context: no turns between contexts, and the runners hold no GPU at all. The Pong preset
does not use it: it ran at 0.96x the runners' own captured forward on an H100 box (0.87x answering a request at a
time; results/preset-variants/2026-12-07-pong-h100-batched-shared-inference.md); CUDA's multi-process service on the
box lets the runners' own contexts share the GPU instead (1.08x; docs/guides/fastppo.md).

How:

* Transport (one machine): a shared-memory block with one slot per remote runner (the observations of its lanes, the
  exploration noise it drew, the weights version it acts with, then the answer: actions, log-probabilities, logits);
  a named pipe carries each request's slot number to the server, and one pipe per runner carries the answer's signal
  back. A round trip without the forward takes 0.047 ms on a 2-core EPYC (``rl-speed bench atari-gpu-sharing``).
* The same actions as the runner's own forward would draw, whatever order the requests arrive in: a runner draws
  the noise of its categorical draw itself (``q ~ Exp(1)``; the action is ``argmax(log p - log q)``, the exponential
  race :mod:`rl_speed.env_runners.captured_forward` draws too) from its own seeded generator, and names the weights
  version it holds (the ``WEIGHTS_SEQ_NO`` of its last weight sync). The server keeps the weights of the last
  :data:`KEEP_VERSIONS` versions the learner published and answers each request with the one it names.
* The server: its own copy of the learner's module on the learner's device, a high-priority CUDA stream there, and
  Python's GIL hand-over at :data:`SWITCH_INTERVAL_S` while it runs, so a request does not wait out 5 ms of the
  learner's Python. It answers every request pending when it looks with one forward (those naming one weights version
  and exploring alike), on a GPU one captured graph for each number of runners served together: answered one at a
  time, 15 runners waited 5.6-6.1 ms for their action step on the Pong GPU preset against 2.4 ms with their own
  forward (2026-12-05), each answer paying a copy in, a replay, a copy out, a wait and the GIL's hand-overs; answered
  together, 3.6 ms against 2.5 ms (2026-12-07).

Only for what the runner's own forward would do the same way (checked when a runner connects): a stateless module,
observations that are one array, RLlib's categorical action distribution, a module that leaves the draw to the
runner. RLlib's own ``sample()`` (evaluation) acts through the runner's module as always.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import select
import shutil
import struct
import sys
import tempfile
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import torch

from rl_speed import columns as C
from rl_speed.env_runners.captured_forward import WARMUP_STEPS, act, categorical_step_problem

logger = logging.getLogger(__name__)

#: Weights versions the server keeps: a runner acts with the version of its last weight sync, which lags the
#: learner's newest by one or two under async sampling.
KEEP_VERSIONS = 8
#: Python's GIL hand-over interval while the server runs (its default is 5 ms).
SWITCH_INTERVAL_S = 0.0005
#: A runner's wait for an answer before it gives up and says why.
ANSWER_TIMEOUT_S = 120.0
_STOP = 0xFFFF  # the request that ends the serving thread
_HEADER = 4  # int64s: version, explore, lanes used, error code
OUTPUTS = ("actions", "logp", "logits")  # act()'s outputs, in order, as the slot's arrays name them
_ERRORS = {1: "the forward failed (the traceback is in the learner's log)", 2: "its weights version is not held"}


@dataclass(frozen=True)
class Layout:
    """What one runner's slot holds: ``lanes`` observations of ``obs_shape`` / ``obs_dtype`` and ``num_actions``
    logits each."""

    lanes: int
    obs_shape: tuple
    obs_dtype: str
    num_actions: int

    def arrays(self) -> list[tuple[str, tuple, np.dtype]]:
        return [("header", (_HEADER,), np.dtype(np.int64)),
                ("obs", (self.lanes, *self.obs_shape), np.dtype(self.obs_dtype)),
                ("noise", (self.lanes, self.num_actions), np.dtype(np.float32)),
                ("actions", (self.lanes,), np.dtype(np.int64)),
                ("logp", (self.lanes,), np.dtype(np.float32)),
                ("logits", (self.lanes, self.num_actions), np.dtype(np.float32))]

    @property
    def slot_bytes(self) -> int:
        return sum(_aligned(int(np.prod(shape)) * dtype.itemsize) for _, shape, dtype in self.arrays())

    def views(self, buffer: Any, slot: int) -> dict[str, np.ndarray]:
        """The slot's arrays, as numpy views of ``buffer``."""
        out, offset = {}, slot * self.slot_bytes
        for name, shape, dtype in self.arrays():
            out[name] = np.ndarray(shape, dtype, buffer, offset)
            offset += _aligned(int(np.prod(shape)) * dtype.itemsize)
        return out


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def serving_problem(module: Any, observation_space: Any) -> str | None:
    """Why ``module``'s action step (a runner's copy) cannot be served, or None."""
    return categorical_step_problem(module, observation_space, next(module.parameters()).device, "served")


class InferenceServer:
    """Serves the action step of ``slots`` runners from a copy of ``module`` on ``device`` (see the module
    docstring). :meth:`publish` each weights version before a runner may act with it; :meth:`stop` at the end."""

    def __init__(self, module: Any, device: Any, layout: Layout, slots: int, node_id: str | None = None) -> None:
        self.layout, self.slots, self.device = layout, slots, torch.device(device)
        self.module = copy.deepcopy(module).to(self.device).eval()
        self.requests_served = 0
        self.forwards = 0  # requests_served / forwards: how many requests a forward served on average
        self._versions: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self._loaded: int | None = None
        self._lock = threading.Lock()
        size = max(1, slots * layout.slot_bytes)
        try:
            self._memory = shared_memory.SharedMemory(create=True, size=size)
        except OSError as e:
            raise OSError(f"shared inference: could not make {size / 2**20:.1f} MiB of shared memory for "
                          f"{slots} runners' slots ({e}); give /dev/shm room (e.g. docker's --shm-size) or leave "
                          "`shared_inference` off.") from e
        self._views = [layout.views(self._memory.buf, slot) for slot in range(slots)]
        self._directory = tempfile.mkdtemp(prefix="rl_speed_inference_")
        self._requests, self._answers = -1, []
        self._node_id = node_id
        try:
            os.mkfifo(os.path.join(self._directory, "requests"))
            for slot in range(slots):
                os.mkfifo(os.path.join(self._directory, f"answers_{slot}"))
            # O_RDWR: the opens wait for no other end, reads block, and the server's writes never lack a reader
            self._requests = os.open(os.path.join(self._directory, "requests"), os.O_RDWR)
            self._answers = [os.open(os.path.join(self._directory, f"answers_{slot}"), os.O_RDWR)
                             for slot in range(slots)]
            self._stream = torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
            self._graphs: dict[tuple[int, bool], _Step] = {}  # (lanes, explore) -> its captured forward (a GPU)
            self._done = torch.cuda.Event(blocking=True) if self._stream is not None else None
            if self._stream is not None:
                # Captured here, before the serving thread starts and before the learner's first update: a capture
                # beside another thread's GPU work could fail (see rl_speed.learners.cuda_graph's capture mode).
                # One graph for each number of whole slots served together, each way of acting; all read their
                # inputs from the leading rows of one buffer and keep their intermediates in one memory pool.
                self._pool = torch.cuda.graph_pool_handle()
                dtype = getattr(torch, np.dtype(layout.obs_dtype).name)
                with torch.inference_mode():
                    self._obs = torch.zeros((slots * layout.lanes, *layout.obs_shape), dtype=dtype,
                                            device=self.device)
                    self._noise = torch.ones((slots * layout.lanes, layout.num_actions), device=self.device)
                for explore in (True, False):
                    for served in range(1, slots + 1):
                        self._capture(served * layout.lanes, explore)
        except BaseException:
            self._release()
            raise
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._serve, name="rl_speed-shared-inference", daemon=True)
        self._thread.start()

    def spec(self) -> dict:
        """What a runner needs to connect (:class:`InferenceClient`)."""
        return {"memory": self._memory.name, "directory": self._directory, "layout": asdict(self.layout),
                "slots": self.slots, "node_id": self._node_id, "pid": os.getpid()}

    def publish(self, version: int, state: dict[str, Any]) -> None:
        """Keeps a copy of ``state`` (the module's ``state_dict``) as weights version ``version``."""
        snapshot = {key: torch.as_tensor(value).detach().to(self.device, copy=True) for key, value in state.items()}
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # (copied on this thread's stream; served on another)
        with self._lock:
            self._versions[int(version)] = snapshot
            self._versions.move_to_end(int(version))
            while len(self._versions) > KEEP_VERSIONS:
                self._versions.popitem(last=False)

    def stop(self) -> None:
        """Ends the serving thread and removes the shared memory and the pipes."""
        if self._thread.is_alive():
            os.write(self._requests, struct.pack("<H", _STOP))
            self._thread.join(timeout=30)
        sys.setswitchinterval(self._switch_interval)
        self._release()

    def _release(self) -> None:
        for fd in [self._requests, *self._answers]:
            if fd >= 0:
                os.close(fd)
        self._requests, self._answers, self._views = -1, [], []
        self._memory.close()
        self._memory.unlink()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _on_stream(self) -> Any:
        return torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

    def _serve(self) -> None:
        while True:
            data = os.read(self._requests, 2 * (self.slots + 1))  # blocks for one request; takes all pending
            if len(data) % 2:  # (writes of 2 bytes are atomic; a read returns whole requests)
                data += os.read(self._requests, 1)
            slots = struct.unpack(f"<{len(data) // 2}H", data)
            self._answer([slot for slot in slots if slot != _STOP])
            if _STOP in slots:
                return

    def _answer(self, slots: list[int]) -> None:
        """Answers the pending requests of ``slots``: one forward for all those that name one weights version and
        explore alike (the requests that came while the last forward ran are served together)."""
        groups: dict[tuple[int, bool], list[int]] = {}
        for slot in slots:
            version, explore = (int(x) for x in self._views[slot]["header"][:2])
            groups.setdefault((version, bool(explore)), []).append(slot)
        for (version, explore), group in groups.items():
            errors = 0
            try:
                with self._lock:
                    weights = self._versions.get(version)
                    held = list(self._versions)
                if weights is None:
                    errors = 2
                    logger.error("shared inference: runner slots %s asked for weights version %d; held: %s", group,
                                 version, held)
                else:
                    self._forward(group, weights, version, explore)
            except Exception:  # noqa: BLE001 (the runners raise; the server goes on serving the others)
                errors = 1
                logger.exception("shared inference: the forward of runner slots %s failed", group)
            self.requests_served += len(group)  # (counted before the answers, which a runner may act on at once)
            self.forwards += 1
            for slot in group:
                self._views[slot]["header"][3] = errors
                os.write(self._answers[slot], b"\x00")

    def _forward(self, group: list[int], weights: dict, version: int, explore: bool) -> None:
        views = [self._views[slot] for slot in group]
        lanes = [int(view["header"][2]) for view in views]
        with self._on_stream():
            if self._loaded != version:  # in place into the parameters a captured step reads
                self.module.load_state_dict(weights)  # (outside inference mode, which would refuse that)
                self._loaded = version
        whole = all(n == self.layout.lanes for n in lanes)
        step = self._graphs.get((len(group) * self.layout.lanes, explore)) if whole else None
        if step is None:  # the CPU, or lane counts other than a runner's (its lane groups): eager
            with torch.inference_mode(), self._on_stream():
                obs = np.concatenate([view["obs"][:n] for view, n in zip(views, lanes)])
                noise = np.concatenate([view["noise"][:n] for view, n in zip(views, lanes)]) if explore else None
                out = act(self.module, torch.from_numpy(obs).to(self.device), explore,
                          None if noise is None else torch.from_numpy(noise).to(self.device))
                names = [name for name, value in zip(OUTPUTS, out) if value is not None]
                host = [value.cpu().numpy() for value in out if value is not None]  # (no logp where not exploring)
        else:
            with torch.inference_mode(), self._on_stream():
                for row, view in zip(range(0, len(step.obs), self.layout.lanes), views):
                    step.obs[row:row + self.layout.lanes].copy_(torch.from_numpy(view["obs"]), non_blocking=True)
                    if explore:
                        step.noise[row:row + self.layout.lanes].copy_(torch.from_numpy(view["noise"]),
                                                                      non_blocking=True)
                step.graph.replay()
                for device, pinned in zip(step.outputs, step.host):
                    pinned.copy_(device, non_blocking=True)
                self._done.record(self._stream)
                self._done.synchronize()  # (a sleeping wait: a default CUDA wait spins, holding a core)
            names, host = step.names, [pinned.numpy() for pinned in step.host]
        row = 0
        for view, n in zip(views, lanes):
            for name, value in zip(names, host):
                view[name][:n] = value[row:row + n]
            row += n

    def _capture(self, lanes: int, explore: bool) -> "_Step":
        """The forward and draw of ``lanes`` observations as one CUDA graph on static inputs (as
        :class:`rl_speed.env_runners.captured_forward.CapturedForward` captures a runner's); the weights a replay
        reads are the module's parameters, which :meth:`_forward` loads each version into in place. Every graph
        shares the input buffers and one memory pool: they replay one at a time on one stream, and each replay's
        outputs are copied out before the next."""
        with torch.inference_mode(), self._on_stream():
            obs, noise = self._obs[:lanes], self._noise[:lanes] if explore else None
            for _ in range(WARMUP_STEPS):  # cuDNN picks its algorithms, lazy buffers are made
                act(self.module, obs, explore, noise)
            self._stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                named = [(name, t) for name, t in zip(OUTPUTS, act(self.module, obs, explore, noise)) if t is not None]
            names, outputs = [name for name, _ in named], [t for _, t in named]
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in outputs]
        step = self._graphs[(lanes, explore)] = _Step(obs, noise, graph, names, outputs, host)
        return step


@dataclass
class _Step:
    """One captured signature of the server's forward: static inputs, the graph, its outputs and their pinned
    copies."""

    obs: torch.Tensor
    noise: torch.Tensor | None
    graph: Any
    names: list[str]  # the slot's arrays the outputs go to
    outputs: list
    host: list


class InferenceClient:
    """A runner's end (see the module docstring): call it like the runner's own action step,
    ``client(obs, explore, version) -> (actions, extra)``."""

    def __init__(self, spec: dict, slot: int, seed: int | None = None) -> None:
        if not 0 <= slot < spec["slots"]:
            raise ValueError(f"shared inference: slot {slot} is not among the server's {spec['slots']} runners.")
        self.layout = Layout(**{**spec["layout"], "obs_shape": tuple(spec["layout"]["obs_shape"])})
        self.slot = slot
        self._memory = shared_memory.SharedMemory(name=spec["memory"])
        if spec["pid"] != os.getpid():
            # Python < 3.13 registers an attached block with this process's resource tracker, which would remove it
            # when the runner's process ends, under the server and every other runner; the server owns it.
            resource_tracker.unregister(self._memory._name, "shared_memory")
        self._view = self.layout.views(self._memory.buf, slot)
        self._requests = os.open(os.path.join(spec["directory"], "requests"), os.O_WRONLY)
        self._answer = os.open(os.path.join(spec["directory"], f"answers_{slot}"), os.O_RDONLY)
        self._noise = np.random.default_rng(seed)

    def __call__(self, obs: np.ndarray, explore: bool, version: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self._fill(obs, explore, version)
        try:
            os.write(self._requests, struct.pack("<H", self.slot))
        except BrokenPipeError:
            raise RuntimeError("shared inference: the server in the learner's process is gone (its algorithm stopped "
                               "or its process ended); see the driver's log.") from None
        self._wait()
        return self._read(len(obs), explore, version)

    def _fill(self, obs: np.ndarray, explore: bool, version: int) -> None:
        """Writes the request into this runner's slot: the observations, the noise of the draw, the header."""
        view, lanes = self._view, len(obs)
        if lanes > self.layout.lanes or obs.shape[1:] != self.layout.obs_shape:
            raise ValueError(f"shared inference: {obs.shape} observations do not fit the server's slots of "
                             f"{self.layout.lanes} x {self.layout.obs_shape}.")
        view["obs"][:lanes] = obs
        if explore:
            view["noise"][:lanes] = self._noise.standard_exponential((lanes, self.layout.num_actions),
                                                                     dtype=np.float32)
        view["header"][:3] = (version, int(explore), lanes)

    def _wait(self) -> None:
        ready, _, _ = select.select([self._answer], [], [], ANSWER_TIMEOUT_S)
        if not ready:
            raise TimeoutError(f"shared inference: no answer in {ANSWER_TIMEOUT_S:.0f} s from the server in the "
                               "learner's process (stopped, or its process gone); see the driver's log.")
        os.read(self._answer, 1)

    def _read(self, lanes: int, explore: bool, version: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        view = self._view
        error = int(view["header"][3])
        if error:
            raise RuntimeError(f"shared inference: the server could not answer runner slot {self.slot} at weights "
                               f"version {version}: {_ERRORS.get(error, error)}.")
        actions = view["actions"][:lanes].copy()
        if not explore:
            return actions, {}
        return actions, {C.ACTION_LOGP: view["logp"][:lanes].copy(),
                         C.ACTION_DIST_INPUTS: view["logits"][:lanes].copy()}

    def close(self) -> None:
        for fd in (self._requests, self._answer):
            os.close(fd)
        self._view = {}
        self._memory.close()


def local_learner(algo: Any) -> Any:
    """The algorithm's local learner (``num_learners: 0``, in this process), through RLlib's public call."""
    return algo.learner_group.foreach_learner(lambda learner: learner).result_or_errors[0].get()


def serve_runners(algo: Any) -> InferenceServer:
    """Starts the server for ``algo``'s remote runners in this (the local learner's) process, publishes the learner's
    weights as the version the runners hold, and connects every runner."""
    import ray

    from ray.rllib.core import DEFAULT_MODULE_ID

    learner = local_learner(algo)
    module = learner.module[DEFAULT_MODULE_ID]
    space = module.observation_space
    layout = Layout(lanes=algo.config.num_envs_per_env_runner, obs_shape=tuple(space.shape),
                    obs_dtype=np.dtype(space.dtype).str, num_actions=int(module.action_space.n))
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    server = InferenceServer(module, learner._device, layout, algo.config.num_env_runners, node_id=node)
    try:
        publish_learner_weights(algo, server)
        connect_runners(algo, server)
    except BaseException:
        server.stop()
        raise
    return server


def publish_learner_weights(algo: Any, server: InferenceServer) -> None:
    """The local learner's current weights as the version its next weight sync hands the runners."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    learner = local_learner(algo)
    version = learner.get_state(components=[])[WEIGHTS_SEQ_NO]  # (no component: the counter alone, no weights)
    server.publish(version, learner.module[DEFAULT_MODULE_ID].state_dict())


def connect_runners(algo: Any, server: InferenceServer, runner_ids: list[int] | None = None) -> None:
    """Connects ``algo``'s remote runners (those of ``runner_ids``, or all) to ``server``; a runner that cannot act
    through it (another machine, a module it cannot serve) raises here, while the algorithm is built."""
    spec = server.spec()
    algo.env_runner_group.foreach_env_runner(lambda runner: runner.connect_shared_inference(spec),
                                             local_env_runner=False, remote_worker_ids=runner_ids)
