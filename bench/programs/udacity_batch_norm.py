"""Port of udacity/deep-learning-v2-pytorch's batch-normalization notebook: a three-layer MLP
on MNIST whose two hidden ``Linear`` layers (no bias) are followed by ``BatchNorm1d`` and
ReLU when ``use_batch_norm`` is set, trained with plain SGD and tested in eval mode.

Source: github.com/udacity/deep-learning-v2-pytorch, ``batch-norm/Batch_Normalization.ipynb``
at commit c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written
anew from the facts of that notebook; no code copied.

Kept: ``NeuralNet(use_batch_norm, input_size=784, hidden_dim=256, output_size=10)``
(``fc1`` 784 -> 512 and ``fc2`` 512 -> 256 with ``bias=False`` and ``BatchNorm1d`` after each
when batch norm is on, ReLU, ``fc3`` 256 -> 10 with no norm or activation; ``x.view(-1,
28*28)`` in ``forward``); ``transforms.ToTensor()`` only (pixels in [0, 1], no
normalisation); ``DataLoader(batch_size=64)`` for train and test with no ``shuffle`` (as in
the notebook); the notebook's ``train(model, n_epochs=10)`` (``nn.CrossEntropyLoss``,
``SGD(model.parameters(), lr=0.01)``, ``model.train()`` once, per batch ``zero_grad``,
forward, loss, ``backward``, ``step``, the epoch's mean batch loss); its ``test(model,
train)`` (``model.train()`` if ``train`` else ``model.eval()``, the summed per-sample test
loss over the set, per-class and overall accuracy from ``torch.max``), called as
``test(net_batchnorm, train=False)``.
Replaced: MNIST by scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train /
360 test). Shrunk: only ``net_batchnorm`` is trained (the ``net_no_norm`` comparison net and
the loss plot are left out); CPU.
Measure only (not in the program): nothing; the variants are measured by ``test``'s test
loss and overall accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` of ``net_batchnorm`` on the
first train batch with the ``CrossEntropyLoss``, the SGD and the train/test sets as
``data``; ``nndx.Monitor(model, optimizer, every=10)`` around ``train``'s epochs, each batch
loss logged where ``train_loss`` accumulates it; the test loss ``test`` prints logged as
``split="val"``; after that ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_batch_norm"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "batch-norm/Batch_Normalization.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 digits, the batch-norm net only)"),
        Variant(
            "test_without_eval",
            "test() leaves the model in train mode (the notebook's test(net_batchnorm, train=True), the user's "
            "test loop without model.eval()): BatchNorm1d normalises each test batch by its own statistics "
            "instead of the running ones learned in training",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/fxia22/pointnet.pytorch/pull/19",
             "https://github.com/yunjey/pytorch-tutorial/issues/62",
             "https://github.com/microsoft/robustdg/issues/30"),
            Measure("test_loss", "test loss at least 1.1x the healthy run's: 0.153 against 0.129 healthy on seed 0 "
                    "(accuracy 98.3 in both)", lambda healthy, buggy: buggy > 1.1 * healthy),
        ),
        Variant(
            "sorted_unshuffled",
            "the training set arrives sorted by label (as Fashion-MNIST's files once did) and the notebook's "
            "train DataLoader has no shuffle=True: every batch holds one or two classes, so the batch statistics "
            "and each SGD step follow one class at a time",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/zalandoresearch/fashion-mnist/pull/5",
             "https://github.com/openpifpaf/openpifpaf/pull/308",
             "https://github.com/happynear/NormFace/issues/4"),
            Measure("test_loss", "test loss at least 1.5x the healthy run's: 1.37 against 0.129 healthy on seed 0 "
                    "(accuracy 63.9 against 98.3)", lambda healthy, buggy: buggy > 1.5 * healthy),
        ),
    )
}

BATCH_SIZE = 64
N_EPOCHS = 10


class NeuralNet(nn.Module):
    def __init__(self, use_batch_norm, input_size=784, hidden_dim=256, output_size=10):
        super(NeuralNet, self).__init__()
        self.input_size = input_size
        self.hidden_dim = hidden_dim
        self.output_size = output_size
        self.use_batch_norm = use_batch_norm
        if use_batch_norm:
            self.fc1 = nn.Linear(input_size, hidden_dim * 2, bias=False)
            self.batch_norm1 = nn.BatchNorm1d(hidden_dim * 2)
        else:
            self.fc1 = nn.Linear(input_size, hidden_dim * 2)
        if use_batch_norm:
            self.fc2 = nn.Linear(hidden_dim * 2, hidden_dim, bias=False)
            self.batch_norm2 = nn.BatchNorm1d(hidden_dim)
        else:
            self.fc2 = nn.Linear(hidden_dim * 2, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, output_size)

    def forward(self, x):
        x = x.view(-1, 28 * 28)
        x = self.fc1(x)
        if self.use_batch_norm:
            x = self.batch_norm1(x)
        x = F.relu(x)
        x = self.fc2(x)
        if self.use_batch_norm:
            x = self.batch_norm2(x)
        x = F.relu(x)
        x = self.fc3(x)
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    if variant == "sorted_unshuffled":  # the files come sorted by label
        order = torch.argsort(tr_y, stable=True)
        tr_raw, tr_y = tr_raw[order], tr_y[order]
    train_x = digits.upscaled(tr_raw, 28)  # transforms.ToTensor()
    test_x = digits.upscaled(te_raw, 28)
    train_data, test_data = TensorDataset(train_x, tr_y), TensorDataset(test_x, te_y)
    train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, num_workers=0)
    test_loader = DataLoader(test_data, batch_size=BATCH_SIZE, num_workers=0)

    net_batchnorm = NeuralNet(use_batch_norm=True)
    splits = (train_x, tr_y, test_x, te_y)
    probe_batch = next(iter(train_loader))

    def train_fn(model, n_epochs=10):
        losses = []
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
        mon = nx.monitor(model, optimizer, every=10)
        model.train()
        for epoch in range(1, n_epochs + 1):
            train_loss = 0.0
            batch_count = 0
            for batch_idx, (data, target) in enumerate(train_loader):
                optimizer.zero_grad()
                output = model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
                train_loss += loss.item()
                nx.timed(lambda: mon.log(loss))  # noqa: B023
                batch_count += 1
            losses.append(train_loss / batch_count)
        return losses, mon, criterion, optimizer

    def test(model, train):
        class_correct = list(0.0 for i in range(10))
        class_total = list(0.0 for i in range(10))
        test_loss = 0.0
        if train == True:  # noqa: E712
            model.train()
        if train == False:  # noqa: E712
            model.eval()
        criterion = nn.CrossEntropyLoss()
        for batch_idx, (data, target) in enumerate(test_loader):
            batch_size = data.size(0)
            output = model(data)
            loss = criterion(output, target)
            test_loss += loss.item() * batch_size
            _, pred = torch.max(output, 1)
            correct = np.squeeze(pred.eq(target.data.view_as(pred)))
            for i in range(batch_size):
                label = target.data[i]
                class_correct[label] += correct[i].item()
                class_total[label] += 1
        test_loss = test_loss / len(test_loader.dataset)
        return test_loss, 100.0 * np.sum(class_correct) / np.sum(class_total)

    losses, mon, criterion, optimizer = train_fn(net_batchnorm, N_EPOCHS)
    test_loss, test_acc = test(net_batchnorm, train=variant == "test_without_eval")
    nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc / 100.0))
    nx.finish(mon, net_batchnorm, probe_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_loss": test_loss, "test_acc": test_acc, "first_epoch_loss": losses[0], "last_epoch_loss": losses[-1]}
