"""Port of MorvanZhou/PyTorch-Tutorial's ``302_classification.py``: two Gaussian clusters in the
plane, a two-layer ReLU net, full-batch SGD on ``CrossEntropyLoss``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/302_classification.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from the facts of that file; no code copied.

Kept (everything that trains): the data (``n_data = ones(100, 2)``; class 0 ``normal(2 *
n_data, 1)`` with label 0, class 1 ``normal(-2 * n_data, 1)`` with label 1; ``cat`` into a
(200, 2) float tensor and a (200,) ``LongTensor``, class 0 first: the data stay sorted by class,
as in the tutorial); ``Net(n_feature=2, n_hidden=10, n_output=2)``: ``hidden = Linear(2, 10)``,
``F.relu``, ``out = Linear(10, 2)`` returning the logits; ``torch.optim.SGD(net.parameters(),
lr=0.02)``; ``torch.nn.CrossEntropyLoss()`` on the logits and the integer labels; 100 full-batch
steps of ``out = net(x)``, ``loss = loss_func(out, y)``, ``zero_grad``, ``backward``, ``step``;
every 2 steps the training accuracy of ``torch.max(out, 1)[1]`` against ``y`` (what the
tutorial prints on its plot).
Shrunk or replaced: nothing shrunk (the tutorial already runs in a second on a CPU); the
matplotlib animation is dropped (its accuracy is still computed at the same place);
``torch.manual_seed(seed)`` set (the tutorial leaves ``torch.manual_seed(1)`` commented out).
Measure only (not in the program): 2,000 fresh points per class drawn from the same two
clusters (after training, from a separate generator) to score the test accuracy; the training
set's mean probability of the true class under ``softmax(out)`` (what the tutorial's loss
reads the outputs as).

nndx, as the author would add it after reading the README: a preflight ``nndx.probe(net, (x,
y), loss_func, optimizer=optimizer)`` on the full batch; ``nndx.Monitor(net, optimizer,
every=10)`` around the loop, ``mon.log(loss)`` after every step; after the loop
``nndx.probe(net, (x, y), loss_func, optimizer=optimizer, monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_classification"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/302_classification.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (nothing shrunk; no plots)"),
        Variant(
            "softmax_before_cross_entropy",
            "Net.forward ends in F.softmax(self.out(x), dim=1) (the reader's belief that CrossEntropyLoss must be "
            "given a probability distribution), and CrossEntropyLoss applies log_softmax again: the loss sees "
            "logits squeezed into [0, 1], its gradients shrink and the true class can never get a probability "
            "above e/(1+e) = 0.73",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/MorvanZhou/PyTorch-Tutorial/pull/11",
             "https://github.com/MorvanZhou/PyTorch-Tutorial/issues/16",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32",
             "https://github.com/Yard1/ray-skorch/pull/18"),
            Measure("final_loss", "the loop's CrossEntropyLoss after the 100 steps at least 0.15 above the healthy "
                    "run's (it cannot fall below -log(0.73) = 0.31 with the extra softmax)",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
        Variant(
            "relu_on_output_layer",
            "Net.forward applies F.relu to the output layer too (x = F.relu(self.out(x))), so the logits that "
            "CrossEntropyLoss reads are clipped at 0: a class whose logit is negative for every sample gets no "
            "gradient through that output unit",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/pytorch/tutorials/issues/1526",
             "https://github.com/pytorch/tutorials/pull/1644",
             "https://github.com/hunkim/PyTorchZeroToAll/pull/4",
             "https://github.com/NVlabs/GA3C/issues/17"),
            Measure("test_accuracy", "accuracy on 4,000 fresh points of the two clusters at least 0.1 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

N_PER_CLASS, N_HIDDEN, LR, STEPS, N_TEST = 100, 10, 0.02, 100, 2000


class Net(torch.nn.Module):
    def __init__(self, n_feature: int, n_hidden: int, n_output: int, variant: str = "healthy") -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(n_feature, n_hidden)  # hidden layer
        self.out = torch.nn.Linear(n_hidden, n_output)  # output layer
        self.variant = variant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.hidden(x))
        x = self.out(x)
        if self.variant == "softmax_before_cross_entropy":
            x = F.softmax(x, dim=1)
        elif self.variant == "relu_on_output_layer":
            x = F.relu(x)
        return x


def make_data(n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    n_data = torch.ones(n, 2)
    x0 = torch.normal(2 * n_data, 1, generator=generator)  # class0 x data, shape=(n, 2)
    y0 = torch.zeros(n)  # class0 y data
    x1 = torch.normal(-2 * n_data, 1, generator=generator)  # class1 x data
    y1 = torch.ones(n)  # class1 y data
    x = torch.cat((x0, x1), 0).type(torch.FloatTensor)
    y = torch.cat((y0, y1)).type(torch.LongTensor)
    return x, y


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    x, y = make_data(N_PER_CLASS)

    net = Net(n_feature=2, n_hidden=N_HIDDEN, n_output=2, variant=variant)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    loss_func = torch.nn.CrossEntropyLoss()  # the target label is not one-hotted

    nx.preflight(net, (x, y), loss_func, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)
    accuracy = float("nan")
    for t in range(STEPS):
        out = net(x)
        loss = loss_func(out, y)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023

        if t % 2 == 0:  # the tutorial's plot: the training accuracy
            prediction = torch.max(out, 1)[1]
            accuracy = float((prediction == y).sum()) / float(y.numel())

    nx.finish(mon, net, (x, y), loss_func, optimizer=optimizer)

    # measure only
    with torch.no_grad():
        out = net(x)
        final_loss = float(loss_func(out, y))
        true_prob = float(F.softmax(out, dim=1).gather(1, y[:, None]).mean())
        x_test, y_test = make_data(N_TEST, torch.Generator().manual_seed(10_000 + seed))
        test_acc = float((net(x_test).argmax(1) == y_test).float().mean())
    return {"final_loss": final_loss, "train_accuracy": accuracy, "true_class_prob": true_prob,
            "test_accuracy": test_acc}  # fmt: skip
