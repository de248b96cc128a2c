"""What only a GPU can show: host synchronisations per step, mixed precision, the probes on CUDA.

Not a test: prints tables, measured in one run on one CUDA device.

    python bench/gpu.py            # about a minute on one GPU; refuses to run without one

1. **Host synchronisations per step.** ``torch.cuda.set_sync_debug_mode("warn")``
   makes every synchronising CUDA call (``.item()``, ``.tolist()``, a blocking copy to
   the host) warn; the warnings are counted per training step, split into the steps the
   Monitor records and the others. The loop itself never synchronises (no
   ``loss.item()``), so what is counted is the Monitor's. The target is one per recorded
   step, none on the others (DESIGN.md: on a GPU every ``.item()`` stalls the stream).
2. **Mixed precision.** Healthy runs under bf16 autocast and fp16 autocast with a
   GradScaler (with ``unscale_`` + ``clip_grad_norm_``), and planted bugs under the same
   precision, each watched by the Monitor and probed with ``device="cuda"`` and ``amp=``;
   the table shows the findings of severity warning and above.
3. **The probe suite on CUDA beside the CPU**: wall time of ``nndx.probe`` on the same
   model and batch.
"""

from __future__ import annotations

import collections
import copy
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import nndx
from nndx.integrations.monitor import Monitor

DEVICE = "cuda"


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def data(n: int = 2048, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class is the brightest of 10 fixed patterns: learnable, synthetic."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = patterns[y] * 0.5 + torch.randn(n, 3, 32, 32, generator=g)
    return x, y


# --------------------------------------------------------------------------- 1. syncs


def count_syncs(every: int | None, alerts: bool = False, wrapped_loss: bool = False,
                steps: int = 60) -> tuple[float, float, int, str]:
    """(mean syncs per recorded step, mean syncs per other step, syncs in close + report,
    where the syncs were called from), over steps 1.. (step 0 warms up). ``every=None``:
    the bare loop, no Monitor (all its steps count as recorded)."""
    torch.manual_seed(0)
    model = cnn().to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = data(256)
    batches = [(x[i:i + 64].to(DEVICE), y[i:i + 64].to(DEVICE)) for i in range(0, 256, 64)]
    loss_fn = nn.CrossEntropyLoss()
    per_step: list[int] = []
    torch.set_warn_always(True)
    mon = None if every is None else Monitor(model, optimizer, every=every, alert_every=None if alerts else 0,
                                             loss_fn=loss_fn if wrapped_loss else None)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                before = len(caught)
                xb, yb = batches[len(per_step) % len(batches)]
                optimizer.zero_grad()
                loss = (mon.loss_fn if wrapped_loss else loss_fn)(model(xb), yb)
                loss.backward()
                optimizer.step()
                if mon is not None:
                    mon.log(loss)
                per_step.append(sum(_is_sync(w) for w in caught[before:]))
            before = len(caught)
            if mon is not None:
                mon.close()
                mon.report()
            at_end = sum(_is_sync(w) for w in caught[before:])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if _is_sync(w))
    # the Monitor's step k is the loop's k-th optimizer step; recorded: k % every == 0
    recorded = [n for k, n in enumerate(per_step) if k and k % (every or 1) == 0]
    other = [n for k, n in enumerate(per_step) if k and k % (every or 1)]
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    return mean(recorded), mean(other), at_end, ", ".join(f"{site} ×{n}" for site, n in sites.most_common(4))


def _is_sync(w: warnings.WarningMessage) -> bool:
    return "synchroniz" in str(w.message)


# --------------------------------------------------------------------------- 2. AMP


def train(precision: str, *, lr: float = 1e-3, clip_before_unscale: bool = False, zero_grad: bool = True,
          steps: int = 120) -> tuple[list[str], list[str], float, float, str]:
    """Train the CNN under ``precision`` ("bf16" or "fp16+scaler") with the Monitor, then
    probe with device="cuda" and amp=. Returns (warning+ findings, all finding codes,
    first loss, last loss, "optimizer steps / backward passes / gradient resets" seen)."""
    torch.manual_seed(0)
    model = cnn().to(DEVICE)
    initial = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(DEVICE) if precision == "fp16+scaler" else None
    losses = []
    with Monitor(model, optimizer, every=10) as mon:
        step = 0
        while step < steps:
            for xb, yb in loader:
                xb, yb = xb.to(DEVICE, non_blocking=True), yb.to(DEVICE, non_blocking=True)
                if zero_grad:
                    optimizer.zero_grad(set_to_none=True)
                with torch.autocast(DEVICE, dtype=dtype):
                    loss = loss_fn(model(xb), yb)
                if scaler is None:
                    loss.backward()
                    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                else:
                    scaler.scale(loss).backward()
                    if not clip_before_unscale:
                        scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(optimizer)
                    scaler.update()
                mon.log(loss)
                losses.append(loss.detach())
                step += 1
                if step >= steps:
                    break
    report = nndx.probe(initial, (x[:64], y[:64]), loss_fn, optimizer=torch.optim.Adam(initial.parameters(), lr=lr),
                        monitor=mon, device=DEVICE, amp=dtype, progress=False)
    findings = nndx.diagnose(report).findings
    loud = [f"{f.severity} {f.code.value} ({f.rule_id})" for f in findings if f.severity != "info"]
    first, last = float(torch.stack(losses[:10]).float().mean()), float(torch.stack(losses[-10:]).float().mean())
    loop = mon.report().loop
    return loud, [f.code.value for f in findings], first, last, f"{loop.steps}/{loop.backward_calls}/{loop.zero_grad_calls}"


# --------------------------------------------------------------------------- 3. probe time


def probe_seconds(device: str, reps: int = 3) -> float:
    x, y = data(64)
    times = []
    for _ in range(reps):
        torch.manual_seed(0)
        model = cnn().to(device)
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                   device=device, progress=False)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, nndx on {DEVICE}\n")

    print("Host synchronisations per training step (CNN with BatchNorm, batch 64, Adam, 60 steps):\n")
    print("| loop | recorded step | other step | at close + report | called from |")
    print("|---|---|---|---|---|")
    configs: list[tuple[str, Callable[[], tuple[float, float, int, str]]]] = [
        ("bare (no Monitor)", lambda: count_syncs(None)),
        ("Monitor every=1, no alerts", lambda: count_syncs(1)),
        ("Monitor every=10, no alerts", lambda: count_syncs(10)),
        ("Monitor every=10 + live alerts", lambda: count_syncs(10, alerts=True)),
        ("Monitor every=10 + alerts + wrapped loss", lambda: count_syncs(10, alerts=True, wrapped_loss=True)),
    ]
    for label, measure in configs:
        recorded, other, at_end, sites = measure()
        print(f"| {label} | {recorded:.2f} | {other:.2f} | {at_end} | {sites} |")

    print("\nMixed precision on CUDA: Monitor in the loop + nndx.probe(device='cuda', amp=...) "
          "(findings of severity warning and above; top-3 codes):\n")
    print("| run | expected | loss first → last | steps/backward/resets | warning+ findings | top-3 |")
    print("|---|---|---|---|---|---|")
    runs = [
        ("bf16 autocast, healthy", "none", lambda: train("bf16")),
        ("fp16 + GradScaler, unscale_ + clip, healthy", "none", lambda: train("fp16+scaler")),
        ("fp16 + GradScaler, clip before unscale_", "GRAD_CLIP_TOO_SMALL", lambda: train("fp16+scaler", clip_before_unscale=True)),
        ("bf16, lr=1.0", "LR_TOO_HIGH", lambda: train("bf16", lr=1.0)),
        ("fp16 + GradScaler, zero_grad missing", "MISSING_ZERO_GRAD", lambda: train("fp16+scaler", zero_grad=False)),
    ]
    for label, expected, run in runs:
        try:
            loud, codes, first, last, loop = run()
            print(f"| {label} | {expected} | {first:.3f} → {last:.3f} | {loop} | {'; '.join(loud) or 'none'} | {', '.join(codes[:3]) or '-'} |")
        except Exception as error:  # a crash is a result here too
            print(f"| {label} | {expected} | - | - | raised {type(error).__name__}: {error} | - |")

    cpu, gpu = probe_seconds("cpu"), probe_seconds(DEVICE)
    print("\nnndx.probe, every default probe, the same CNN and batch of 64 (best of 3):\n")
    print("| device | seconds | ratio to CPU |")
    print("|---|---|---|")
    print(f"| cpu ({torch.get_num_threads()} threads) | {cpu:.2f} | 1.00 |")
    print(f"| {DEVICE} | {gpu:.2f} | {gpu / cpu:.2f} |")


if __name__ == "__main__":
    main()
