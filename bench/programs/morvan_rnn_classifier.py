"""Port of MorvanZhou/PyTorch-Tutorial's RNN classifier: an LSTM reads an image one row per
time step (``batch_first=True``), a linear layer classifies the last time step's output
(``r_out[:, -1, :]``), Adam, cross-entropy.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/402_RNN_classifier.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from the facts of that file; no code copied.

Kept: ``RNN`` (``nn.LSTM(input_size=INPUT_SIZE, hidden_size=64, num_layers=1,
batch_first=True)`` called with ``None`` as its initial state, ``nn.Linear(64, 10)`` on
``r_out[:, -1, :]``); ``torch.optim.Adam(rnn.parameters(), lr=0.01)``;
``nn.CrossEntropyLoss()``; a shuffling ``DataLoader`` of ``BATCH_SIZE`` 64 over images put
through ``ToTensor`` (pixels / 255, in [0, 1]); the loop per batch: ``b_x.view(-1, TIME_STEP,
INPUT_SIZE)``, ``output = rnn(b_x)``, ``loss_func(output, b_y)``, ``zero_grad``, ``backward``,
``step``; every 50 steps the whole test subset through ``rnn(test_x)`` (in train mode, with
grad, as the original does) and the argmax accuracy; the test subset built the original's way,
``test_data.test_data`` as float divided by 255.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test, pixels rescaled to 0..255 like
MNIST's raw bytes) instead of MNIST, so ``TIME_STEP`` = ``INPUT_SIZE`` = 8 instead of 28; 8
20 epochs (460 steps) instead of 1 epoch of 938 steps; no plots, no printing; CPU.
Measure only (not in the program): the final test accuracy and test cross-entropy (the
original prints the accuracy every 50 steps), and the last epoch's mean training loss.

nndx, as the author would add it after reading the README: a preflight ``nndx.probe`` on the
first training batch (reshaped as the loop reshapes it) with the ``CrossEntropyLoss`` and the
optimizer; ``nndx.Monitor(rnn, optimizer, every=10)`` around the loop, each batch's loss
logged after ``optimizer.step()``; after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_rnn_classifier"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/402_RNN_classifier.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits read as 8 rows of 8 pixels, 20 epochs)"),
        Variant(
            "batch_first_dropped",
            "nn.LSTM built without batch_first=True while the loop still feeds (batch, time_step, input_size): the "
            "LSTM runs along the batch axis, treats the 8 rows as 8 independent sequences, and r_out[:, -1, :] "
            "hands the classifier the last row's state after a pass over the preceding images of the batch",
            (C.WRONG_RESHAPE,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/89",
             "https://github.com/yunjey/pytorch-tutorial/issues/196",
             "https://github.com/pytorch/pytorch/issues/1538"),
            Measure("test_acc", "final test accuracy at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "pixels_not_scaled",
            "the images go in as raw 0..255 pixel values (the uint8 images turned to float without ToTensor's "
            "division by 255, in training and in the test subset alike): the LSTM's gates see pre-activations "
            "in the tens and saturate",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/philipperemy/keras-tcn/issues/27",
             "https://github.com/keras-team/keras/issues/6914",
             "https://github.com/rasbt/python-machine-learning-book-2nd-edition/issues/68"),
            Measure("test_loss", "final test cross-entropy at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

EPOCH, BATCH_SIZE, TIME_STEP, INPUT_SIZE, LR = 20, 64, 8, 8, 0.01


class RNN(nn.Module):
    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=INPUT_SIZE, hidden_size=64, num_layers=1, batch_first=batch_first)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r_out, (h_n, h_c) = self.rnn(x, None)  # None: zero initial hidden state
        out = self.out(r_out[:, -1, :])  # r_out at the last time step
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    scale = 1.0 if variant == "pixels_not_scaled" else 255.0
    # transforms.ToTensor(): (N, 1, H, W) floats in [0, 1] (the bug: the raw pixel values)
    train_x = tr_raw.unsqueeze(1).float() / scale
    train_loader = DataLoader(TensorDataset(train_x, tr_y), batch_size=BATCH_SIZE, shuffle=True)
    test_x = te_raw.float() / scale  # test_data.test_data.type(torch.FloatTensor)[:2000] / 255.
    test_y = te_y.numpy()

    rnn = RNN(batch_first=variant != "batch_first_dropped")
    optimizer = torch.optim.Adam(rnn.parameters(), lr=LR)
    loss_func = nn.CrossEntropyLoss()

    first_x, first_y = next(iter(DataLoader(TensorDataset(train_x, tr_y), batch_size=BATCH_SIZE)))
    probe_batch = (first_x.view(-1, TIME_STEP, INPUT_SIZE), first_y)
    nx.preflight(rnn, probe_batch, loss_func, optimizer=optimizer)
    mon = nx.monitor(rnn, optimizer, every=10)

    accuracy = float("nan")
    last_epoch_losses: list[float] = []
    for epoch in range(EPOCH):
        last_epoch_losses = []
        for step, (b_x, b_y) in enumerate(train_loader):
            b_x = b_x.view(-1, TIME_STEP, INPUT_SIZE)  # (batch, time_step, input_size)

            output = rnn(b_x)
            loss = loss_func(output, b_y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            last_epoch_losses.append(loss.item())

            if step % 50 == 0:
                test_output = rnn(test_x)
                pred_y = torch.max(test_output, 1)[1].data.numpy()
                accuracy = float((pred_y == test_y).astype(int).sum()) / float(test_y.size)

    nx.finish(mon, rnn, probe_batch, loss_func, optimizer=optimizer)

    # measure only
    with torch.no_grad():
        test_output = rnn(test_x)
        test_loss = nn.functional.cross_entropy(test_output, te_y).item()
        test_acc = (test_output.argmax(1) == te_y).float().mean().item()
    return {"test_acc": test_acc, "test_loss": test_loss, "acc_at_last_print": accuracy,
            "train_loss_last_epoch": sum(last_epoch_losses) / len(last_epoch_losses)}  # fmt: skip
