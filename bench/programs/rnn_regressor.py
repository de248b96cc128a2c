"""Port of MorvanZhou/PyTorch-Tutorial's RNN regressor: a one-layer ``nn.RNN`` reads a window of
sin(t) and predicts cos(t) at every time step, its hidden state carried from one window to the
next (``h_state = h_state.data``).

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/403_RNN_regressor.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from that file; no code copied beyond its idioms.

Kept: everything that trains: ``TIME_STEP`` 10, ``INPUT_SIZE`` 1, ``LR`` 0.02; ``RNN``:
``nn.RNN(input_size=1, hidden_size=32, num_layers=1, batch_first=True)`` and ``nn.Linear(32, 1)``
applied to each time step of ``r_out`` in a Python loop, the outputs ``torch.stack``-ed on dim 1;
``forward(x, h_state)`` returning ``(outs, h_state)``; ``torch.optim.Adam(rnn.parameters(),
lr=LR)``, ``nn.MSELoss()``; ``h_state = None`` at first; 100 steps, step ``s`` reading the window
``np.linspace(s*pi, (s+1)*pi, TIME_STEP, endpoint=False)`` as float32, ``x = sin``, ``y = cos``,
shaped ``[np.newaxis, :, np.newaxis]`` (batch, time_step, input_size); per step ``prediction,
h_state = rnn(x, h_state)``, ``h_state = h_state.data`` (the author's repacking), the loss,
``zero_grad``, ``backward``, ``step``. ``torch.manual_seed(seed)`` (the original's seed line is
commented out).
Changed: ``forward``'s ``h_state`` gets the default ``None`` (the program always passes it; the
default lets nndx's probes call ``model(x)`` on a batch, as its README's ``probe(model, (x, y),
loss_fn)`` does); no matplotlib (the plots were its only output); nothing shrunk (it already runs
in well under a second on a CPU).
Measure only (not in the program): the true mean squared error between each step's prediction and
its window's cos, flattened (so it is the same number whatever shape the loss was given),
averaged over the last 20 steps.

nndx, as the author would add it: the model returns ``(prediction, h_state)``, so nndx's loss is
``loss_fn(out, y) = loss_func(out[0], y)``; a preflight ``nndx.probe(rnn, (x, y), loss_fn,
optimizer=optimizer)`` on the first window; ``nndx.Monitor(rnn, optimizer, every=10)`` around the
loop, each step's loss logged; after the loop ``nndx.probe(..., monitor=mon)`` on the last window
(the ``x, y`` still in scope), then ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rnn_regressor"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/403_RNN_regressor.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (100 steps of one 10-point window each)"),
        Variant(
            "target_missing_last_axis",
            "y built as torch.from_numpy(y_np[np.newaxis, :]) (1, 10) instead of y_np[np.newaxis, :, np.newaxis] "
            "(1, 10, 1): nn.MSELoss broadcasts the (1, 10, 1) prediction against it to (1, 10, 10) (a UserWarning "
            "only), so each time step is fitted to every cos value of the window, i.e. to their mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/MorvanZhou/PyTorch-Tutorial/issues/23",
             "https://github.com/MorvanZhou/PyTorch-Tutorial/issues/46",
             "https://github.com/yuji-roh/fairbatch/pull/2"),
            Measure("late_mse", "true MSE of the last 20 steps' predictions at least 0.2 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
        Variant(
            "batch_first_dropped",
            "nn.RNN built without batch_first=True while x stays (batch, time_step, input_size): the RNN reads the "
            "window as 10 sequences of length 1, so no step sees the one before it (only the same position of the "
            "previous window, through h_state), and cos cannot be told from sin",
            (C.WRONG_RESHAPE,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/89",
             "https://github.com/yunjey/pytorch-tutorial/issues/196",
             "https://github.com/Cadene/vqa.pytorch/issues/40",
             "https://github.com/facebookresearch/fairseq/issues/2449"),
            Measure("late_mse", "true MSE of the last 20 steps' predictions at least 0.2 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
    )
}

TIME_STEP, INPUT_SIZE, LR, STEPS = 10, 1, 0.02, 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    batch_first = variant != "batch_first_dropped"

    class RNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.RNN(
                input_size=INPUT_SIZE,
                hidden_size=32,  # rnn hidden unit
                num_layers=1,  # number of rnn layer
                batch_first=batch_first,  # (batch, time_step, input_size)
            )
            self.out = nn.Linear(32, 1)

        def forward(self, x, h_state=None):
            r_out, h_state = self.rnn(x, h_state)
            outs = []  # save all predictions
            for time_step in range(r_out.size(1)):  # calculate output for each time step
                outs.append(self.out(r_out[:, time_step, :]))
            return torch.stack(outs, dim=1), h_state

    def window(step):
        start, end = step * np.pi, (step + 1) * np.pi  # time range
        steps = np.linspace(start, end, TIME_STEP, dtype=np.float32, endpoint=False)
        x_np = np.sin(steps)
        y_np = np.cos(steps)
        x = torch.from_numpy(x_np[np.newaxis, :, np.newaxis])  # shape (batch, time_step, input_size)
        if variant == "target_missing_last_axis":
            y = torch.from_numpy(y_np[np.newaxis, :])
        else:
            y = torch.from_numpy(y_np[np.newaxis, :, np.newaxis])
        return x, y, y_np

    rnn = RNN()
    optimizer = torch.optim.Adam(rnn.parameters(), lr=LR)  # optimize all cnn parameters
    loss_func = nn.MSELoss()

    def loss_fn(out, y):
        prediction, _ = out
        return loss_func(prediction, y)

    x0, y0, _ = window(0)
    nx.preflight(rnn, (x0, y0), loss_fn, optimizer=optimizer)
    mon = nx.monitor(rnn, optimizer, every=10)

    h_state = None  # for initial hidden state
    true_mse: list[float] = []
    losses: list[float] = []
    x = y = None
    for step in range(STEPS):
        x, y, y_np = window(step)  # use sin predicts cos
        prediction, h_state = rnn(x, h_state)  # rnn output
        # !! next step is important !!
        h_state = h_state.data  # repack the hidden state, break the connection from last iteration

        loss = loss_func(prediction, y)  # calculate loss
        optimizer.zero_grad()  # clear gradients for this training step
        loss.backward()  # backpropagation, compute gradients
        optimizer.step()  # apply gradients
        nx.timed(lambda: mon.log(loss))  # noqa: B023

        losses.append(loss.item())
        true_mse.append(float(((prediction.detach().reshape(-1).numpy() - y_np) ** 2).mean()))

    nx.finish(mon, rnn, (x, y), loss_fn, optimizer=optimizer)

    return {"late_mse": float(np.mean(true_mse[-20:])), "late_loss": float(np.mean(losses[-20:])),
            "first_loss": losses[0]}  # fmt: skip
