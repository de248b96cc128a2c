"""Port of udacity/deep-learning-v2-pytorch: weight initialization (solution notebook). The
3-layer MLP (784 -> 256 -> 128 -> 10, ReLU, dropout 0.2) is built twice, once initialised
with ``weights_init_uniform_rule`` (uniform in [-1/sqrt(n), 1/sqrt(n)), bias 0) and once
with ``weights_init_normal`` (normal, std 1/sqrt(n), bias 0); ``helpers.compare_init_weights``
trains each with ``_get_loss_acc`` (``CrossEntropyLoss``, ``Adam(model.parameters(), 0.001)``,
``zero_grad``/forward/loss/backward/step per batch, the batch losses recorded) and prints the
validation accuracy and the last batch loss of each.

Source: github.com/udacity/deep-learning-v2-pytorch,
``weight-initialization/weight_initialization_solution.ipynb`` (the ``Net`` class, the
``weights_init_uniform_rule`` / ``weights_init_normal`` cells, the data cell, the "Uniform vs
Normal" comparison cell) and ``weight-initialization/helpers.py`` (``_get_loss_acc``,
``compare_init_weights``) at commit c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c)
2018 Udacity). Written anew from the facts of those files; no code copied.

Kept: ``Net`` as published (``fc1``/``fc2``/``fc3``, ``x.view(-1, 28 * 28)``, ``F.relu``, one
``nn.Dropout(0.2)`` after each hidden layer, the ``constant_weight`` constructor argument);
the two init functions applied with ``model.apply`` (class-name test ``find('Linear') != -1``,
``m.weight.data.uniform_`` / ``normal_`` in place, ``m.bias.data.fill_(0)``); the data cell's
split (indices of the training set shuffled with ``np.random.shuffle``, 20% to validation,
two ``SubsetRandomSampler`` loaders of ``batch_size`` 100 over the same training set);
``_get_loss_acc`` (Adam at 0.001, ``model.train()`` for the epochs, then ``model.eval()`` and
argmax accuracy over the validation loader, ``correct.item() / total``); the comparison of the
two models in order.
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 in [0, 1] (what
``ToTensor`` gives) instead of FashionMNIST (1,437 images: 1,150 train / 287 validation);
``n_epochs`` 20 instead of 2 (the notebook's note: raise the epochs when there are few
batches; 240 steps instead of ~960); no plot (the batch losses are returned instead).
Note: the brief named SGD; the published helper uses Adam at 0.001, which is what is kept.
Measure only (not in the program): the mean validation accuracy (percent) of the two models and
the mean of their last-epoch batch losses.

nndx, as the author would add it: in ``_get_loss_acc``, a preflight ``nndx.probe`` of the
model on the first training batch with the ``CrossEntropyLoss``, the Adam and the train /
validation tensors as ``data``; ``nndx.Monitor(model, optimizer)`` around the training epochs,
each batch loss logged where the helper records it; after validation ``nndx.probe(...,
monitor=mon)`` on the same batch. The two models' diagnoses are read together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.sampler import SubsetRandomSampler

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_weight_init"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "weight-initialization/weight_initialization_solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the 'Uniform vs Normal' comparison as published (shrunk: 28x28 digits, 20 epochs)"),
        Variant(
            "all_zero_init",
            "both models are built as Net(constant_weight=0) (every Linear weight and bias set to 0) instead of "
            "being initialised by weights_init_uniform_rule / weights_init_normal: every hidden unit is the same "
            "(zero) and no weight gets a gradient, only fc3's bias learns",
            (C.BAD_INIT,),
            ("https://stats.stackexchange.com/questions/27112/danger-of-setting-all-initial-weights-to-zero-in-backpropagation",
             "https://github.com/udacity/deep-learning-v2-pytorch/blob/master/weight-initialization/weight_initialization_solution.ipynb",
             "https://stackoverflow.com/questions/20027598/why-should-weights-of-neural-networks-be-initialized-to-random-numbers"),
            Measure("valid_acc", "mean validation accuracy of the two models at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "no_zero_grad",
            "_get_loss_acc never calls optimizer.zero_grad(): each backward adds to the gradients of every earlier "
            "batch, so Adam steps along the running sum of all gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/6134",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("last_loss", "mean last-epoch batch loss of the two models at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

BATCH_SIZE = 100
VALID_SIZE = 0.2
N_EPOCHS = 20
LEARNING_RATE = 0.001


class Net(nn.Module):
    def __init__(self, hidden_1=256, hidden_2=128, constant_weight=None):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(28 * 28, hidden_1)
        self.fc2 = nn.Linear(hidden_1, hidden_2)
        self.fc3 = nn.Linear(hidden_2, 10)
        self.dropout = nn.Dropout(0.2)
        if constant_weight is not None:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.constant_(m.weight, constant_weight)
                    nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = x.view(-1, 28 * 28)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        x = F.relu(self.fc2(x))
        x = self.dropout(x)
        x = self.fc3(x)
        return x


def weights_init_uniform_rule(m):
    classname = m.__class__.__name__
    if classname.find("Linear") != -1:
        n = m.in_features
        y = 1.0 / np.sqrt(n)
        m.weight.data.uniform_(-y, y)
        m.bias.data.fill_(0)


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find("Linear") != -1:
        n = m.in_features
        y = 1.0 / np.sqrt(n)
        m.weight.data.normal_(0, y)
        m.bias.data.fill_(0)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    zero_grad = variant != "no_zero_grad"

    # the data cell (FashionMNIST -> 28x28 digits in [0, 1])
    tr_raw, tr_y, _, _ = digits.digit_images(seed=seed)
    train_data = TensorDataset(digits.upscaled(tr_raw, 28), tr_y)
    num_train = len(train_data)
    indices = list(range(num_train))
    np.random.shuffle(indices)
    split = int(np.floor(VALID_SIZE * num_train))
    train_idx, valid_idx = indices[split:], indices[:split]
    train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=SubsetRandomSampler(train_idx))
    valid_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=SubsetRandomSampler(valid_idx))
    x_all, y_all = train_data.tensors
    splits = (x_all[train_idx], y_all[train_idx], x_all[valid_idx], y_all[valid_idx])

    # helpers._get_loss_acc
    def _get_loss_acc(model, train_loader, valid_loader):
        n_epochs = N_EPOCHS
        learning_rate = LEARNING_RATE
        criterion = nn.CrossEntropyLoss()
        optimizer = optimizer = torch.optim.Adam(model.parameters(), learning_rate)
        loss_batch = []

        with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
            probe_batch = next(iter(train_loader))
        nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
        mon = nx.monitor(model, optimizer, every=5)

        for epoch in range(1, n_epochs + 1):
            train_loss = 0.0
            model.train()
            for data, target in train_loader:
                if zero_grad:
                    optimizer.zero_grad()
                output = model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
                loss_batch.append(loss.item())
                nx.timed(lambda: mon.log(loss))  # noqa: B023

        correct = 0
        total = 0
        model.eval()
        for data, target in valid_loader:
            output = model(data)
            _, predicted = torch.max(output.data, 1)
            total += target.size(0)
            correct += (predicted == target).sum()
        valid_acc = correct.item() / total

        nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)
        return loss_batch, valid_acc

    # the "Uniform vs Normal" cells
    if variant == "all_zero_init":
        model_uniform_rule = Net(constant_weight=0)
        model_normal_rule = Net(constant_weight=0)
    else:
        model_uniform_rule = Net()
        model_uniform_rule.apply(weights_init_uniform_rule)
        model_normal_rule = Net()
        model_normal_rule.apply(weights_init_normal)
    model_list = [(model_uniform_rule, "Uniform Rule [-y, y)"), (model_normal_rule, "Normal Distribution")]

    # helpers.compare_init_weights (no plot)
    label_accs, label_loss, last_epoch = [], [], []
    batches_per_epoch = len(train_loader)
    for model, label in model_list:
        loss, val_acc = _get_loss_acc(model, train_loader, valid_loader)
        label_accs.append((label, val_acc))
        label_loss.append((label, loss[-1]))
        last_epoch.append(float(np.mean(loss[-batches_per_epoch:])))

    accs = [100.0 * a for _, a in label_accs]
    return {"valid_acc": float(np.mean(accs)), "valid_acc_uniform": accs[0], "valid_acc_normal": accs[1],
            "last_loss": float(np.mean(last_epoch)), "final_batch_loss": float(np.mean([l for _, l in label_loss]))}
