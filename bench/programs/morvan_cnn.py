"""Port of MorvanZhou/PyTorch-Tutorial's 401_CNN.py: a two-convolution CNN classifies handwritten
digits, trained with Adam on ``CrossEntropyLoss``, the test accuracy printed every 50 steps.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/401_CNN.py`` at commit
dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (last change to the file
4e5122c3734dcdc9ace164c2a87fbd412ca1d431; MIT, Copyright (c) 2017 MorvanZhou). Written anew
from the facts of that file; no code copied.

Kept: the ``CNN`` (``conv1``: ``Conv2d(1, 16, 5, stride 1, padding 2)`` -> ReLU ->
``MaxPool2d(2)``; ``conv2``: ``Conv2d(16, 32, 5, 1, 2)`` -> ReLU -> ``MaxPool2d(2)``; flattened
with ``x.view(x.size(0), -1)`` to 32*7*7; ``out = Linear(32*7*7, 10)``; ``forward`` returns
``(output, x)``, the flattened features kept "for visualization"); ``BATCH_SIZE = 50``,
``LR = 0.001``; train images through ``ToTensor`` (pixels / 255 in [0, 1], shape (1, 28, 28)) in a
shuffled ``DataLoader``; ``test_x = unsqueeze(test images, 1) / 255.`` as one float tensor and
``test_y`` its labels; ``torch.optim.Adam(cnn.parameters(), lr=LR)``; ``nn.CrossEntropyLoss()``;
the loop ``for epoch in range(EPOCH): for step, (b_x, b_y) in enumerate(train_loader):``
``output = cnn(b_x)[0]``, ``loss = loss_func(output, b_y)``, ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``; ``if step % 50 == 0``: ``cnn(test_x)`` (with autograd
on, as the script does), ``torch.max(test_output, 1)[1]`` against ``test_y``, the accuracy printed
(here recorded).
Shrunk / replaced: MNIST replaced by scikit-learn's 8x8 digits upscaled (bilinear) to 28x28
(1,437 train / 360 test, all 360 as ``test_x`` instead of the first 2,000 of MNIST's test set);
``EPOCH = 8`` instead of 1 (one MNIST epoch is 1,200 steps, one digits epoch 29, so 8 epochs
give 232 steps; ``step`` still restarts every epoch as in the script, so the every-50-steps print
falls on each epoch's first step); no t-SNE plot, no ``plt``; no ``torch.manual_seed`` in the
script (commented out there), seeded here for a repeatable benchmark.
Measure only (not in the program): after the loop the test accuracy by the script's own rule
(the script only prints 10 predictions there) and the mean train loss of the last 20 steps.

nndx, as the author would add it (README quick start): the model returns ``(output, x)``, so
nndx gets ``loss_fn(out, y) = loss_func(out[0], y)`` (the script's ``cnn(b_x)[0]``) and the first
training batch; a preflight ``nndx.probe(cnn, batch, loss_fn, optimizer=optimizer, data=(train
images, labels, test_x, test_y))``; ``nndx.Monitor(cnn, optimizer, every=10)`` around the loop,
every step's loss logged, and at each print the test loss of ``test_output`` logged as
``split="val"`` with the printed accuracy; after the loop ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.data as Data
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_cnn"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/401_CNN.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "401_CNN.py as published (shrunk: 28x28 upscaled digits, 8 epochs of 29 steps)"),
        Variant(
            "softmax_output",
            "CNN.forward returns F.softmax(self.out(x), dim=1) as its output (probabilities 'for the "
            "prediction') while the loss stays nn.CrossEntropyLoss, which applies log_softmax itself: the loss "
            "is taken on a softmax of probabilities, its gradients shrink and its floor is ln(1 + 9/e) = 1.46",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://discuss.pytorch.org/t/cross-entropy-loss-is-not-decreasing/43814/16",
             "https://github.com/jaehong31/CGES/issues/1"),
            Measure("final_train_loss", "mean train loss of the last 20 steps at least 0.5 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the steps "
            "before, so Adam steps along the running sum of every past batch's gradient",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Miraclelucy/dive_into_deep_learning/issues/6",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_acc", "test accuracy after the loop at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.10),
        ),
    )
}

EPOCH, BATCH_SIZE, LR, SIDE = 8, 50, 0.001, 28


class CNN(nn.Module):
    def __init__(self, softmax_output: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_channels=1, out_channels=16, kernel_size=5, stride=1, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2),
        )
        self.conv2 = nn.Sequential(
            nn.Conv2d(16, 32, 5, 1, 2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.out = nn.Linear(32 * 7 * 7, 10)
        self.softmax_output = softmax_output

    def forward(self, x: torch.Tensor):
        x = self.conv1(x)
        x = self.conv2(x)
        x = x.view(x.size(0), -1)
        output = self.out(x)
        if self.softmax_output:
            output = F.softmax(output, dim=1)
        return output, x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_x = digits.upscaled(tr_raw, SIDE)  # ToTensor: (N, 1, 28, 28) in [0, 1]
    train_data = Data.TensorDataset(train_x, tr_y)
    train_loader = Data.DataLoader(dataset=train_data, batch_size=BATCH_SIZE, shuffle=True)
    test_x = digits.upscaled(te_raw, SIDE)  # torch.unsqueeze(test_data, dim=1).float() / 255.
    test_y = te_y

    cnn = CNN(softmax_output=variant == "softmax_output")
    optimizer = torch.optim.Adam(cnn.parameters(), lr=LR)
    loss_func = nn.CrossEntropyLoss()

    def loss_fn(out, y: torch.Tensor) -> torch.Tensor:
        return loss_func(out[0], y)

    probe_batch = (train_x[:BATCH_SIZE], tr_y[:BATCH_SIZE])
    splits = (train_x, tr_y, test_x, test_y)
    nx.preflight(cnn, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(cnn, optimizer, every=10)

    printed: list[float] = []
    losses: list[float] = []
    for epoch in range(EPOCH):
        for step, (b_x, b_y) in enumerate(train_loader):
            output = cnn(b_x)[0]
            loss = loss_func(output, b_y)
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())

            if step % 50 == 0:
                test_output, last_layer = cnn(test_x)
                pred_y = torch.max(test_output, 1)[1].data.numpy()
                accuracy = float((pred_y == test_y.data.numpy()).astype(int).sum()) / float(test_y.size(0))
                printed.append(accuracy)
                test_loss = loss_func(test_output, test_y).item()
                nx.timed(lambda: mon.log(test_loss, split="val", accuracy=accuracy))  # noqa: B023

    nx.finish(mon, cnn, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    with torch.no_grad():
        test_output, _ = cnn(test_x)
    pred_y = torch.max(test_output, 1)[1]
    test_acc = float((pred_y == test_y).float().mean())
    return {"test_acc": test_acc, "last_printed_acc": printed[-1],
            "final_train_loss": sum(losses[-20:]) / 20}  # fmt: skip
