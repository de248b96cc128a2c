"""Overhead of the Monitor on a training step, beside the lesson's NetworkDebugger.

Not a test: prints tables of ratios measured in one run. Every configuration trains
its own copy of the same model (same initial weights, same batch); the configurations
take turns step by step (interleaved, rotating the order each round), so load on a
shared machine drifts across all of them alike. Each round gives every configuration's
step time over the bare step's time in that round; a ratio is the median over rounds.
Two clocks: wall time (what the user waits) and process CPU time (the work done, all
threads; less sensitive to other processes on a loaded machine).

    .venv/bin/python bench/overhead.py              # full run (a few minutes on 2 loaded cores)
    .venv/bin/python bench/overhead.py --steps 10   # quicker, noisier
    .venv/bin/python bench/overhead.py --device cuda
    .venv/bin/python bench/overhead.py --tricks     # only: each speed trick of stats.py vs the plain op

Step = forward + loss + backward + Adam step (+ ``mon.log(loss)`` when monitored).
Targets (CPU): every=10 with live alerts <= 1.03x on both workloads, every=1 <= 1.25x.

Memory: a small MLP is trained 1,000 steps under each configuration; "retained" is
what tracemalloc sees still allocated by Python afterwards (the monitor's floats and
report records), plus the bytes of tensors that stayed alive; for the Monitor those are
its workspace (``Monitor.workspace_bytes``: buffers reused every recorded step, the
same size after step 2 as after step 1,000).
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from network_debugger import NetworkDebugger  # noqa: E402

from nndx.integrations.monitor import Monitor  # noqa: E402


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 10),
    )


class Setup:
    """One configuration: its own model copy, optimizer and (maybe) watcher."""

    def __init__(self, name: str, model: nn.Module, attach: Callable | None, device: str) -> None:
        self.name = name
        self.model = model.to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.watcher = attach(self.model, self.optimizer) if attach else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        if isinstance(self.watcher, Monitor):
            self.watcher.log(loss)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()


CONFIGS: dict[str, Callable | None] = {
    "bare": None,
    "monitor every=1": lambda m, o: Monitor(m, o, every=1, alert_every=0),
    "monitor every=10": lambda m, o: Monitor(m, o, every=10, alert_every=0),
    "monitor every=10 + alerts": lambda m, o: Monitor(m, o, every=10),
    "NetworkDebugger (lesson)": lambda m, o: NetworkDebugger(m).register_hooks(),
}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(make_model: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor,
               steps: int, warmup: int, device: str) -> dict[str, dict[str, float]]:
    """Per clock ("wall", "cpu"): the bare step's median seconds under "bare", and for
    every other configuration the median over rounds of its time / the bare time."""
    torch.manual_seed(0)
    base = make_model()
    setups = [Setup(name, copy.deepcopy(base), attach, device) for name, attach in CONFIGS.items()]
    x, y = x.to(device), y.to(device)
    rounds: list[dict[str, tuple[float, float]]] = []
    for round_index in range(warmup + steps):
        shift = round_index % len(setups)
        measured = {}
        for setup in setups[shift:] + setups[:shift]:
            sync(device)
            wall, cpu = time.perf_counter(), time.process_time()
            setup.step(x, y)
            sync(device)
            measured[setup.name] = (time.perf_counter() - wall, time.process_time() - cpu)
        if round_index >= warmup:
            rounds.append(measured)
    for setup in setups:
        setup.close()
    out: dict[str, dict[str, Any]] = {}
    for clock, index in (("wall", 0), ("cpu", 1)):
        out[clock] = {"bare": statistics.median(r["bare"][index] for r in rounds)}
        bare_total = sum(r["bare"][index] for r in rounds)
        for name in CONFIGS:
            if name != "bare":
                typical = statistics.median(r[name][index] / max(r["bare"][index], 1e-9) for r in rounds)
                amortised = sum(r[name][index] for r in rounds) / max(bare_total, 1e-9)
                out[clock][name] = (typical, amortised)
    return out


def live_tensors() -> list[torch.Tensor]:
    with warnings.catch_warnings():  # isinstance on some torch module proxies warns
        warnings.simplefilter("ignore")
        return [t for t in gc.get_objects() if isinstance(t, torch.Tensor)]


def retained_memory(config: str, steps: int = 1000) -> tuple[int, int, str]:
    """Python bytes and tensor bytes still held after ``steps`` steps of a small MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    gc.collect()
    tensors_before = {id(t) for t in live_tensors()}
    tracemalloc.start()
    setup = Setup(config, model, CONFIGS[config], "cpu")
    baseline = tracemalloc.get_traced_memory()[0]
    for _ in range(steps):
        setup.step(x, y)
    setup.optimizer.zero_grad()
    gc.collect()
    python_bytes = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    params = {id(p) for p in model.parameters()} | {id(s) for st in setup.optimizer.state.values() for s in st.values()}
    alive = [t for t in live_tensors() if id(t) not in tensors_before and id(t) not in params]
    tensor_bytes = sum(t.numel() * t.element_size() for t in alive)
    detail = ""
    watcher = setup.watcher
    if isinstance(watcher, Monitor):
        report = watcher.report()
        start = time.perf_counter()
        watcher.check_now()  # one live-alert evaluation on a 1,000-step history
        check_ms = (time.perf_counter() - start) * 1e3
        detail = (f"{len(report.loss_history['train'])} losses, {len(report.loop.lr_history)} LR points, "
                  f"{len({s.step for s in report.layers})} recorded steps kept; of the tensor bytes, "
                  f"{watcher.workspace_bytes:,} are the reused workspace; one live check {check_ms:.1f} ms")
    elif isinstance(watcher, NetworkDebugger):
        detail = f"{sum(len(v) for v in watcher.activation_history.values())} activation records"
    setup.close()
    return python_bytes, tensor_bytes, detail


def stats_tricks(reps: int = 200) -> None:
    """Each speed trick of nndx.collector.stats beside the plain op it replaces, on the
    bench MLP's and CNN's recorded tensors (batches of same-shaped layers, sampled to
    max_elements=65,536), one thread as in the hooks; median microseconds, interleaved."""
    def median_us(fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for k, f in fns.items():
                start = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - start)
        return {k: statistics.median(v) * 1e6 for k, v in times.items()}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print("\nSpeed tricks of nndx/collector/stats.py (median us, one thread; the trick first):\n")
    print("| tensors | statistic | trick | plain | plain / trick |")
    print("|---|---|---|---|---|")
    for label, shape in (("3 Linear outputs 64x1024", (3, 64, 1024)), ("2 conv outputs 2x32x32x32", (2, 2, 32, 32, 32))):
        flat = torch.relu(torch.randn(shape)).reshape(shape[0], -1)
        mean = flat.mean(dim=1)
        scratch = torch.empty_like(flat)
        cases = {
            "nonzero count": ("sign().abs_().sum()", lambda: torch.sign(flat).abs_().sum(dim=1),
                              "count_nonzero", lambda: torch.count_nonzero(flat, dim=1)),
            "skip the non-finite count": ("read min/max", lambda: torch.cat([flat.amin(1), flat.amax(1)]).tolist(),
                                          "count it", lambda: (~torch.isfinite(flat)).sum(dim=1)),
            "std": ("norm of centred", lambda: torch.linalg.vector_norm(flat - mean[:, None], dim=1),
                    "torch.std", lambda: flat.std(dim=1)),
            "min and max": ("amin + amax", lambda: (flat.amin(1), flat.amax(1)),
                            "aminmax", lambda: torch.aminmax(flat, dim=1)),
            "abs sum": ("abs().sum()", lambda: flat.abs().sum(dim=1),
                        "vector_norm(ord=1)", lambda: torch.linalg.vector_norm(flat, ord=1, dim=1)),
            "(removed) scratch buffer": ("abs(out=scratch)", lambda: torch.abs(flat, out=scratch).sum(dim=1),
                                         "fresh abs()", lambda: flat.abs().sum(dim=1)),
        }
        for statistic, (trick_name, trick, plain_name, plain) in cases.items():
            times = median_us({"trick": trick, "plain": plain})
            print(f"| {label} | {statistic} | {trick_name} {times['trick']:.0f} | {plain_name} {times['plain']:.0f} | "
                  f"{times['plain'] / times['trick']:.2f}x |")
    torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="timed steps per configuration and model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-memory", action="store_true", help="skip the 1,000-step memory measurement")
    parser.add_argument("--tricks", action="store_true", help="only time stats.py's speed tricks against plain ops")
    args = parser.parse_args()
    if args.tricks:
        stats_tricks()
        return
    generator = torch.Generator().manual_seed(0)
    workloads = {
        "MLP 784-1024x3-10, batch 256": (mlp, torch.randn(256, 784, generator=generator), torch.randint(0, 10, (256,), generator=generator)),
        "3-conv CNN 3x32x32, batch 128": (cnn, torch.randn(128, 3, 32, 32, generator=generator), torch.randint(0, 10, (128,), generator=generator)),
    }
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
          f"{args.steps} timed steps per configuration, interleaved")
    results = {}
    for label, (make, x, y) in workloads.items():
        print(f"timing {label} ...", file=sys.stderr, flush=True)
        results[label] = time_steps(make, x, y, args.steps, args.warmup, args.device)
    names = list(CONFIGS)
    for clock, title in (("wall", "wall-clock time"), ("cpu", "process CPU time")):
        print()
        print(f"Step {title}, ratio to the bare step: median of per-round ratios "
              "(in brackets: total time over the bare total, which spreads recorded steps' cost):")
        print()
        print("| workload | bare step (ms) | " + " | ".join(names[1:]) + " |")
        print("|---|---|" + "---|" * (len(names) - 1))
        for label, by_clock in results.items():
            medians = by_clock[clock]
            ratios = " | ".join(f"{medians[n][0]:.3f}x ({medians[n][1]:.3f}x)" for n in names[1:])
            print(f"| {label} | {medians['bare'] * 1e3:.1f} | {ratios} |")
    if args.no_memory:
        return
    print()
    print("Retained after 1,000 steps of an MLP 64-128-128-10 (batch 32):")
    print()
    print("| configuration | python bytes | tensor bytes | kept |")
    print("|---|---|---|---|")
    for name in names:
        print(f"memory: {name} ...", file=sys.stderr, flush=True)
        python_bytes, tensor_bytes, detail = retained_memory(name)
        print(f"| {name} | {python_bytes:,} | {tensor_bytes:,} | {detail} |")


if __name__ == "__main__":
    main()
