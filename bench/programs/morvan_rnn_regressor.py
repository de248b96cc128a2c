"""Port of MorvanZhou/PyTorch-Tutorial's RNN regressor: an ``nn.RNN`` reads a window of sin
and a linear layer maps each time step's output to cos; the hidden state is carried from one
window to the next (``h_state = h_state.data``), MSE, Adam.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/403_RNN_regressor.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from the facts of that file; no code copied.

Kept, all of it at its own size: ``RNN`` (``nn.RNN(input_size=1, hidden_size=32,
num_layers=1, batch_first=True)``, ``nn.Linear(32, 1)`` applied to ``r_out[:, time_step, :]``
for each time step in a Python loop, the outputs stacked on dim 1; ``forward(x, h_state)``
returns the predictions and the new state); ``torch.optim.Adam(rnn.parameters(), lr=0.02)``;
``nn.MSELoss()``; ``h_state = None`` before the loop; 100 steps, step ``k`` a window of
``TIME_STEP`` = 10 points ``np.linspace(k*pi, (k+1)*pi, 10, endpoint=False)`` as float32,
``x = sin`` and ``y = cos`` shaped ``(1, 10, 1)`` by ``[np.newaxis, :, np.newaxis]``;
``prediction, h_state = rnn(x, h_state)``, ``h_state = h_state.data``, ``loss_func(prediction,
y)``, ``zero_grad``, ``backward``, ``step``.
Shrunk: nothing but the plots (no matplotlib); CPU. ``torch.manual_seed`` is set (the
original leaves it commented out).
Measure only (not in the program): the model then runs on, without grad, over the next 20
windows (steps 100-119) carrying its state, and the MSE of its predictions against cos is the
test MSE; the training MSE of the last 20 windows is taken on the prediction and cos in the
same (1, 10, 1) shape whatever shape the loop's target had.

nndx, as the author would add it after reading the README: the forward takes the hidden
state as a second argument, so the batch is ``((x, h_state), y)`` (``nndx.probe``'s message
for several inputs) with the first window and its initial ``None`` state; a preflight
``nndx.probe`` with the ``MSELoss`` and the optimizer; ``nndx.Monitor(rnn, optimizer,
every=10)`` around the loop, each step's loss logged after ``optimizer.step()``; after the
loop ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_rnn_regressor"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/403_RNN_regressor.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (100 windows of 10 points, sin -> cos, state carried)"),
        Variant(
            "target_shape_broadcast",
            "the target is built as y_np[np.newaxis, :] (shape (1, 10)) while the prediction is (1, 10, 1): "
            "MSELoss broadcasts them to (1, 10, 10) and compares every prediction of the window with every "
            "target (only a UserWarning), so the net learns the window's mean of cos instead of cos",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/MorvanZhou/PyTorch-Tutorial/issues/23",
             "https://github.com/pytorch/pytorch/issues/4938",
             "https://github.com/andrewgcodes/xlstm/issues/4"),
            Measure("test_mse", "test MSE against cos at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
        Variant(
            "zero_grad_dropped",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the earlier "
            "windows, so Adam steps along the running sum of the gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/wenet-e2e/wekws/issues/72",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7"),
            Measure("test_mse", "test MSE against cos at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
    )
}

TIME_STEP, INPUT_SIZE, LR, STEPS, TEST_STEPS = 10, 1, 0.02, 100, 20


class RNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(input_size=INPUT_SIZE, hidden_size=32, num_layers=1, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, h_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # x (batch, time_step, input_size); h_state (n_layers, batch, hidden_size)
        r_out, h_state = self.rnn(x, h_state)
        outs = []  # one prediction per time step
        for time_step in range(r_out.size(1)):
            outs.append(self.out(r_out[:, time_step, :]))
        return torch.stack(outs, dim=1), h_state


def window(step: int, broadcast_target: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    start, end = step * np.pi, (step + 1) * np.pi
    steps = np.linspace(start, end, TIME_STEP, dtype=np.float32, endpoint=False)
    x_np, y_np = np.sin(steps), np.cos(steps)
    x = torch.from_numpy(x_np[np.newaxis, :, np.newaxis])  # (batch, time_step, input_size)
    y_true = torch.from_numpy(y_np[np.newaxis, :, np.newaxis])
    y = torch.from_numpy(y_np[np.newaxis, :]) if broadcast_target else y_true
    return x, y, y_true


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    broadcast_target = variant == "target_shape_broadcast"
    zero_grad = variant != "zero_grad_dropped"

    rnn = RNN()
    optimizer = torch.optim.Adam(rnn.parameters(), lr=LR)
    loss_func = nn.MSELoss()

    h_state = None  # initial hidden state
    x0, y0, _ = window(0, broadcast_target)
    probe_batch = ((x0, h_state), y0)
    nx.preflight(rnn, probe_batch, loss_func, optimizer=optimizer)
    mon = nx.monitor(rnn, optimizer, every=10)

    train_sq: list[float] = []
    for step in range(STEPS):
        x, y, y_true = window(step, broadcast_target)

        prediction, h_state = rnn(x, h_state)
        h_state = h_state.data  # repack the hidden state, break the connection from the last window

        loss = loss_func(prediction, y)
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        if step >= STEPS - 20:
            train_sq.append(float(((prediction.detach() - y_true) ** 2).mean()))

    nx.finish(mon, rnn, probe_batch, loss_func, optimizer=optimizer)

    # measure only: run on over the next windows, carrying the state
    test_sq = []
    with torch.no_grad():
        for step in range(STEPS, STEPS + TEST_STEPS):
            x, _, y_true = window(step, False)
            prediction, h_state = rnn(x, h_state)
            test_sq.append(float(((prediction - y_true) ** 2).mean()))
    return {"test_mse": float(np.mean(test_sq)), "train_mse_last20": float(np.mean(train_sq))}
