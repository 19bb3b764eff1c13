"""Where should the Pong GPU preset's runners run their forward? A runner's forward latency and the learner's update
on one shared GPU, for three placements of the forward, side by side.

Why: on the preset (15 runners, each its own CUDA context for its captured forward, beside the learner's) a runner
waits about 2.3 ms a step for a forward the GPU does in a fraction of that, and the learner's update takes 0.345 s
beside the runners against 0.235 s alone; two replays a step per runner (lane groups) made both worse (2.3 -> 6.5 ms,
0.345 -> 0.43 s; docs/studies/pong-and-atari.md, 2026-12-05). Without CUDA's multi-process service the GPU serves one
context at a time, so every runner's forward waits its turn among 16 contexts. One inference step shared by the
runners would leave two contexts (the learner's and the server's) or one (a serving thread in the learner's
process, rl_speed's ``shared_inference``). Which of the two, and what either gives, is what this bench measures.

Rows (each a window of ``seconds``; rows alternate over ``repeats`` rounds; medians over the rounds):

- **learner alone**: the learner updating back to back (the preset's FastPPO learner on one real batch,
  :mod:`benchmarks.throughput.atari_learner`), the runner processes idle.
- **own contexts (the preset)**: ``runners`` processes, each stepping 16 real ale-py emulators of Pong and acting
  through the preset's Nature CNN replayed as one captured CUDA graph in its own context
  (:class:`rl_speed.env_runners.captured_forward.CapturedForward`), the learner updating beside them.
- **one inference process**: the runner processes act through rl_speed's ``shared_inference`` server
  (:class:`rl_speed.env_runners.shared_inference.InferenceServer`) run in one more process of its own, with its own
  copy of the module and its own CUDA context: two contexts on the GPU, the learner's and the server's.
- **shared inference (a thread of the learner's process)**: the runner processes act through rl_speed's
  ``shared_inference`` server (:mod:`rl_speed.env_runners.shared_inference`), started in the learner's process for
  the whole bench: their observations through shared memory to its serving thread, which replays the forward it
  captured on a high-priority stream of the learner's context: one context. In both served rows the latency is the
  runners' whole round trip. (The server sets Python's GIL hand-over interval to 0.5 ms for the learner's process, in
  every row; the learner's update alone is the same with it, 0.732 s against 0.731 s on a 2-core CPU.)

Per row: the learner's seconds per update, a forward's latency from the moment it is due to its answer on the host
(median and 90th percentile), a runner's emulation per step, and the rates these allow: the runners'
(``runners x lanes / (emulation + latency)``) and the learner's (``batch / update``). Not in the figures: the
driver's work beside the update (join, values and GAE, weight push: about 0.1 s an iteration) and Ray. Run:
``rl-speed bench atari-gpu-sharing --device cuda --repeats 3`` (the [atari] extra); ``--device cpu`` runs every row
shrunk, forwards eager on the CPU (a check, not a figure).
"""

from __future__ import annotations

import copy
import multiprocessing
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.common import check_cuda, interleaved, local_ray, machine

LANES = 16  #: emulators per runner, as the preset's
GAME = "pong"
ROWS = ("learner alone", "own contexts (the preset)", "one inference process",
        "shared inference (a thread of the learner's process)")
#: What the runner processes do in each row: idle, act through their own forward, through the inference process, or
#: through the shared inference server in the learner's process.
RUNNER_MODE = {ROWS[0]: "idle", ROWS[1]: "forward", ROWS[2]: "process", ROWS[3]: "shared"}


def preset_module(device: str) -> Any:
    """The preset's policy module (NatureActorCritic with its ``model_config``), inference-only, on ``device``."""
    import gymnasium as gym
    import torch

    import rl_speed
    from benchmarks.throughput.atari import preset

    rl_speed.register()
    _, config = preset("PPO", device=device, cpus=1)
    spaces = {"default_policy": (gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6))}
    module = config.get_rl_module_spec(spaces=spaces, inference_only=True).build().to(torch.device(device))
    module.eval()
    return module


def runner_forward(device: str) -> Any:
    """A runner's action step, called as ``forward(obs, explore) -> (actions, extra)``: the captured graph on a GPU
    (as the preset's runners act), the eager forward on the CPU."""
    from rl_speed.env_runners.captured_forward import CapturedForward
    from rl_speed.env_runners.stepping import module_actions

    module = preset_module(device)
    if device == "cuda":
        return CapturedForward(module, device)
    return lambda obs, explore: module_actions(module, obs, explore, 0)[:2]


def runner_process(conn: Any, index: int, lanes: int, device: str, seed: int, servers: dict[str, dict]) -> None:
    """One runner (no RLlib): ``lanes`` emulators of Pong and its own forward, built before the first window; for each
    window the parent asks for, it steps its emulators acting through that forward (``forward``), through one of the
    inference servers ``servers`` describes by mode (``process``, ``shared``; as slot ``index``) or not at all
    (``idle``), and sends back each step's emulation and forward seconds (a served forward: the whole round trip)."""
    from rl_speed.env_runners.shared_inference import InferenceClient

    import torch

    from rl_speed_envs.atari import AtariVectorEnv

    torch.set_num_threads(1)
    env = AtariVectorEnv(lanes, game=GAME)
    obs, _ = env.reset(seed=seed + index * lanes)
    forward = runner_forward(device)  # (built once: the preset's runners hold their context in every row, idle or not)
    for _ in range(3):  # the capture and cuDNN's choices, before any window
        forward(obs, True)
    clients = {mode: InferenceClient(spec, slot=index, seed=seed + index) for mode, spec in servers.items()}
    conn.send("ready")
    while (message := conn.recv()) is not None:
        mode, seconds = message
        emulation, latency = [], []
        end = time.perf_counter() + seconds
        if mode == "idle":
            time.sleep(seconds)
        while mode != "idle" and time.perf_counter() < end:
            start = time.perf_counter()
            actions, _ = forward(obs, True) if mode == "forward" else clients[mode](obs, True, 0)
            latency.append(time.perf_counter() - start)
            start = time.perf_counter()
            obs, *_ = env.step(actions)
            emulation.append(time.perf_counter() - start)
        conn.send({"emulation": emulation, "latency": latency})
    for client in clients.values():
        client.close()
    env.close()


def server_process(conn: Any, device: str, runners: int) -> None:
    """The one inference process: rl_speed's ``shared_inference`` server (:class:`InferenceServer`) with its own copy
    of the preset's module, in a process of its own (its own CUDA context); sends its spec, serves until told to
    stop."""
    import torch

    from rl_speed.env_runners.shared_inference import InferenceServer

    torch.set_num_threads(1)
    module = preset_module(device)
    server = InferenceServer(module, device, layout(), runners)
    try:
        server.publish(0, module.state_dict())
        conn.send(server.spec())
        conn.recv()
    finally:
        server.stop()


def layout() -> Any:
    """A runner's slot: its lanes' Pong frame stacks and the game's 6 actions."""
    from rl_speed.env_runners.shared_inference import Layout

    return Layout(LANES, (84, 84, 4), np.dtype(np.uint8).str, 6)


STOP = b"\xff\xff"  #: the transport probe's last request


def transport_server(name: str, requests: str, answers: str, lanes: int) -> None:
    """The transport probe's server: for each request, the runner's frame stacks copied out of shared memory, then a
    wake-up back; no forward."""
    import os
    from multiprocessing import shared_memory

    memory = shared_memory.SharedMemory(name=name)
    stacks = np.ndarray((lanes, 84, 84, 4), np.uint8, memory.buf)
    received = np.empty_like(stacks)
    request, answer = os.open(requests, os.O_RDONLY), os.open(answers, os.O_WRONLY)
    while os.read(request, 2) != STOP:
        received[...] = stacks
        os.write(answer, b"\x00")
    os.close(request)
    os.close(answer)
    del stacks
    memory.close()


def transport_round_trips(seconds: float = 3.0, lanes: int = LANES) -> list[float]:
    """A runner's request to a server in another process and the answer, with no forward (seconds, each round trip):
    its frame stacks into shared memory, a wake-up through a named pipe, the server's copy of them, a wake-up back
    through another. Every other request follows a 1 ms pause, so the server also wakes from sleep, as it would
    between runners' steps. The figure a shared inference step adds to a forward's latency at the least."""
    import os
    import tempfile
    from multiprocessing import shared_memory

    stacks_in = np.random.default_rng(0).integers(0, 256, (lanes, 84, 84, 4), dtype=np.uint8)
    memory = shared_memory.SharedMemory(create=True, size=stacks_in.nbytes)
    with tempfile.TemporaryDirectory(prefix="rl_speed_transport_") as directory:
        requests, answers = os.path.join(directory, "requests"), os.path.join(directory, "answers")
        os.mkfifo(requests)
        os.mkfifo(answers)
        server = multiprocessing.get_context("spawn").Process(
            target=transport_server, args=(memory.name, requests, answers, lanes), daemon=True)
        server.start()
        request, answer = os.open(requests, os.O_WRONLY), os.open(answers, os.O_RDONLY)  # (each waits for the other)
        stacks = np.ndarray(stacks_in.shape, np.uint8, memory.buf)
        trips: list[float] = []
        try:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                if len(trips) % 2:
                    time.sleep(0.001)
                start = time.perf_counter()
                stacks[...] = stacks_in
                os.write(request, b"\x00\x00")
                os.read(answer, 1)
                trips.append(time.perf_counter() - start)
        finally:
            os.write(request, STOP)
            server.join(timeout=30)
            os.close(request)
            os.close(answer)
            del stacks
            memory.close()
            memory.unlink()
    return trips


@dataclass
class Rounds:
    """Every window's figures of one row."""

    update_s: list[float] = field(default_factory=list)  # the learner's updates, every one of every window
    latency_s: list[float] = field(default_factory=list)  # every forward's
    emulation_s: list[float] = field(default_factory=list)  # every runner step's


def learner_updates(algo: Any, data: list[dict], seconds: float, device: str) -> list[float]:
    """Updates back to back for ``seconds`` (each on a fresh copy of ``data``, copied outside its time)."""
    import torch

    from benchmarks.throughput.atari_learner import update

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        batch = copy.deepcopy(data)
        sync()
        start = time.perf_counter()
        update(algo, batch)
        sync()
        times.append(time.perf_counter() - start)
    return times


def measure(device: str = "cpu", repeats: int = 3, seconds: float = 10.0, runners: int = 15,
            batch: int | None = None, epochs: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Every row ``repeats`` times, rows alternating; the learner and the shared inference server in this process
    (the learner built as ``rl-speed bench atari-learner`` builds it; ``batch`` and ``epochs`` shrink it), the runners
    and the one inference process in processes of their own."""
    from benchmarks.throughput.atari_learner import WARMUP, build, env_steps, sample_batch, update
    from rl_speed.env_runners.shared_inference import InferenceServer

    context = multiprocessing.get_context("spawn")  # CUDA in the children; fork would share this process's
    pipes, processes = [], []
    inference_process = None
    rounds = {row: Rounds() for row in ROWS}
    algo = None
    module = preset_module(device)
    shared = InferenceServer(module, device, layout(), runners)
    try:
        shared.publish(0, module.state_dict())
        inference_process, child = context.Pipe()
        process = context.Process(target=server_process, args=(child, device, runners), daemon=True)
        process.start()
        child.close()  # (so that a child that dies is an EOFError here, not a wait)
        processes.append(process)
        servers = {"process": inference_process.recv(), "shared": shared.spec()}
        for index in range(runners):
            parent, child = context.Pipe()
            process = context.Process(target=runner_process, args=(child, index, LANES, device, seed, servers),
                                      daemon=True)
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        algo = build(device, {}, batch, epochs)
        data = sample_batch(algo)
        for _ in range(WARMUP):  # the capture of the learner's step and cuDNN's choices, before every window
            update(algo, copy.deepcopy(data))
        for pipe in pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("atari-gpu-sharing: a runner process did not start")
        for row in interleaved(list(ROWS), repeats):
            for pipe in pipes:
                pipe.send((RUNNER_MODE[row], seconds))
            rounds[row].update_s += learner_updates(algo, data, seconds, device)
            for pipe in pipes:
                out = pipe.recv()
                rounds[row].emulation_s += out["emulation"]
                rounds[row].latency_s += out["latency"]
        return {"rounds": rounds, "batch": env_steps(data), "runners": runners}
    finally:
        for pipe in pipes:
            pipe.send(None)
        if inference_process is not None:
            inference_process.send(None)
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        shared.stop()
        if algo is not None:
            algo.stop()


def summary(rounds: Rounds, runners: int, batch: int) -> dict[str, float | None]:
    """A row's medians and the rates they allow (None where the row has no such figure)."""
    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    update, latency, emulation = median(rounds.update_s), median(rounds.latency_s), median(rounds.emulation_s)
    p90 = float(np.percentile(rounds.latency_s, 90)) if rounds.latency_s else None
    return {"update_s": update, "latency_ms": None if latency is None else 1e3 * latency,
            "latency_p90_ms": None if p90 is None else 1e3 * p90,
            "emulation_ms": None if emulation is None else 1e3 * emulation,
            "runners_rate": (runners * LANES / (emulation + latency)
                             if emulation is not None and latency is not None else None),
            "learner_rate": batch / update if update else None}


def run(repeats: int = 3, device: str = "cpu") -> str:
    """``device``: ``cuda`` the preset on the box's GPU; ``cpu`` every row shrunk (a check, not a figure)."""
    check_cuda("atari-gpu-sharing", device, "check the bench on the CPU (every row shrunk)")
    cuda = device == "cuda"
    trips = transport_round_trips(3.0)  # (first: nothing else runs on the machine yet)
    with local_ray(num_cpus=1):  # RLlib finds a GPU learner's device through Ray's runtime context
        out = measure(device, repeats, seconds=10.0 if cuda else 1.0, runners=15 if cuda else 1,
                      batch=None if cuda else 64, epochs=None if cuda else 1)
    rows = []
    for row in ROWS:
        s = summary(out["rounds"][row], out["runners"], out["batch"])

        def cell(key: str, fmt: str) -> str:
            return "" if s[key] is None else format(s[key], fmt)

        rows.append(f"| {row} | {cell('update_s', '.3f')} | {cell('latency_ms', '.2f')} | "
                    f"{cell('latency_p90_ms', '.2f')} | {cell('emulation_ms', '.2f')} | {cell('runners_rate', ',.0f')} "
                    f"| {cell('learner_rate', ',.0f')} |")
    return "\n".join([
        "### The runners' forward on one shared GPU: own contexts, one inference process, a thread of the learner's",
        "",
        f"Command: `rl-speed bench atari-gpu-sharing --repeats {repeats}{' --device cuda' if cuda else ''}` · machine: "
        f"{machine()} · date: {time.strftime('%Y-%m-%d')} · {out['runners']} runner processes x {LANES} Pong "
        f"emulators, `atari_ppo_gpu.yaml`'s learner on one batch of {out['batch']:,} env steps"
        f"{'' if cuda else ' (shrunk, forwards eager on the CPU: a check, not a figure)'}; rows alternating, "
        f"{'10' if cuda else '1'} s windows, medians over every update, forward and step of a row's {repeats} "
        "windows.", "",
        "| row | learner s per update | forward latency, median ms | 90th percentile ms | emulation per step ms "
        "| env steps/s the runners could sample | env steps/s the learner could take |",
        "|---|---:|---:|---:|---:|---:|---:|", *rows, "",
        f"The transport a shared inference step would add, alone (a runner's {LANES} frame stacks into shared memory, "
        "a named pipe each way, the server's copy of them; no forward; every other request after a 1 ms pause): "
        f"median {1e3 * statistics.median(trips):.3f} ms, 90th percentile {1e3 * np.percentile(trips, 90):.3f} ms "
        f"over {len(trips):,} round trips.",
    ])
