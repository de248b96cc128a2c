"""Port of Co-teaching (Han et al., NeurIPS 2018): two networks trained together on noisily
labelled data, each choosing the small-loss share of every batch on which the *other* one is
updated, with the share forgotten ramped up over the first epochs and Adam driven by a
hand-written linear decay of its learning rate and beta1.

Source: github.com/bhanML/Co-teaching, ``main.py``, ``loss.py``, ``model.py`` (and
``data/utils.py`` for the noise) at commit 7c7fbe23e15e517db76a0882b6d108e4508e09d6 (no
licence file in the repository). Written anew from the facts of those files; no code copied.

Kept: ``CNN``: nine 3x3 convolutions in three groups, each followed by ``BatchNorm2d`` and
``leaky_relu(0.01)``; after the first two groups ``max_pool2d(2, 2)`` and
``F.dropout2d(p=0.25)`` (called without ``training=``, so it is active in evaluation too, as
in the original); a global ``avg_pool2d``, a ``Linear`` to the classes, ``top_bn`` off;
symmetric label noise drawn as ``noisify_multiclass_symmetric`` draws it (a transition
matrix with ``1 - r`` on the diagonal and ``r / (C - 1)`` elsewhere, one multinomial draw per
training label), the test labels clean, ``noise_or_not`` kept for the label precision;
``forget_rate = noise_rate``; ``rate_schedule``: ``linspace(0, forget_rate ** exponent,
num_gradual)`` over the first ``num_gradual`` epochs, then ``forget_rate``;
``alpha_plan``/``beta1_plan``: ``lr`` and beta1 0.9 until ``epoch_decay_start``, then the
learning rate falling linearly towards zero and beta1 0.1, written into each
``param_group`` by ``adjust_learning_rate`` at the start of every epoch (betas ``(beta1,
0.999)``); two ``CNN``s, each with its own ``Adam(lr=0.001)``; batches of 128, shuffled,
``drop_last=True`` (the test loader too); ``loss_coteaching``: per-sample
cross-entropy of both networks, each one's samples sorted by loss, the ``1 -
forget_rate`` smallest kept, network 1 updated on network 2's choice and vice versa, each
``F.cross_entropy`` (a mean) divided again by ``num_remember`` as the original does; per
batch ``optimizer1.zero_grad()``, ``loss_1.backward()``, ``optimizer1.step()``, then the same
for network 2; an evaluation of the random networks before epoch 1, then per epoch
``train()`` on both, ``adjust_learning_rate`` on both optimizers, the training pass,
``evaluate`` (``eval()``, softmax, argmax over the test loader) for both.
Shrunk: scikit-learn's 8x8 digits (1,297 training, 500 test images; the ``ToTensor``
scaling) instead of 28x28 MNIST; symmetric noise at rate 0.5 (the paper's "Symmetry-50%");
convolution widths 16-16-16 / 32-32-32 / 64-32-16 instead of 128-128-128 / 256-256-256 /
512-256-128, and the last three convolutions padded (padding 1 instead of 0: an 8x8 image
is 2x2 after the two poolings); 40 epochs instead of 200, ``num_gradual`` 5 instead of 10,
``epoch_decay_start`` 16 instead of 80.
Measure only (not in the program): each network's clean test accuracy after the last epoch
and the label precision (the share of clean labels among the samples each network chose).

nndx, as the author would add it (one Monitor per model/optimizer pair, as in the GAN
ports): a preflight ``nndx.probe`` of network 1 on the first training batch (noisy labels)
with ``F.cross_entropy``, the loss each network is updated by; ``nndx.Monitor(cnn1,
optimizer1)`` and ``nndx.Monitor(cnn2, optimizer2)`` around the loop, ``loss_1``/``loss_2``
logged to them; after training ``nndx.probe(cnn1, ..., monitor=mon1)`` and the second
Monitor's report, each diagnosed; the author reads both, ranked together.
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

NAME = "coteaching"
SOURCE = Source("bhanML/Co-teaching", "main.py", "7c7fbe23e15e517db76a0882b6d108e4508e09d6",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, narrow CNNs, 40 epochs)"),
        Variant(
            "softmax_into_coteaching_loss",
            "the networks' softmax probabilities, not their logits, passed to loss_coteaching, whose "
            "F.cross_entropy applies log-softmax again",
            (C.DOUBLE_SOFTMAX, C.WRONG_LOSS),
            ("https://github.com/xingruiyu/coteaching_plus/issues/1",
             "https://github.com/bhanML/Co-teaching/issues/4"),
            Measure("test_acc1", "network 1's clean test accuracy at least 5 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 5.0),
        ),
        Variant(
            "optimizer2_over_cnn1",
            "optimizer2 built over cnn1.parameters() (a copy-paste slip): network 2 is never updated and "
            "network 1 is stepped by both optimizers",
            (C.OPTIMIZER_NOT_CONNECTED, C.FROZEN_PARAMETERS),
            ("https://github.com/namisan/mt-dnn/issues/5",
             "https://github.com/VIPL-SLP/VAC_CSLR/issues/42",
             "https://github.com/pytorch/pytorch/issues/14467"),
            Measure("test_acc2", "network 2's clean test accuracy at least 20 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 20.0),
        ),
    )
}

batch_size = 128
learning_rate = 0.001
noise_rate = 0.5
forget_rate = noise_rate
num_gradual = 5
exponent = 1
n_epoch = 40
epoch_decay_start = 16
num_iter_per_epoch = 400
num_classes = 10
TEST_SIZE = 500


# --------------------------------------------------------------------------- model.py


class CNN(nn.Module):
    def __init__(self, input_channel: int = 1, n_outputs: int = 10, dropout_rate: float = 0.25) -> None:
        super().__init__()
        self.dropout_rate = dropout_rate
        self.c1 = nn.Conv2d(input_channel, 16, kernel_size=3, stride=1, padding=1)
        self.c2 = nn.Conv2d(16, 16, kernel_size=3, stride=1, padding=1)
        self.c3 = nn.Conv2d(16, 16, kernel_size=3, stride=1, padding=1)
        self.c4 = nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1)
        self.c5 = nn.Conv2d(32, 32, kernel_size=3, stride=1, padding=1)
        self.c6 = nn.Conv2d(32, 32, kernel_size=3, stride=1, padding=1)
        self.c7 = nn.Conv2d(32, 64, kernel_size=3, stride=1, padding=1)
        self.c8 = nn.Conv2d(64, 32, kernel_size=3, stride=1, padding=1)
        self.c9 = nn.Conv2d(32, 16, kernel_size=3, stride=1, padding=1)
        self.l_c1 = nn.Linear(16, n_outputs)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm2d(16), nn.BatchNorm2d(16), nn.BatchNorm2d(16)
        self.bn4, self.bn5, self.bn6 = nn.BatchNorm2d(32), nn.BatchNorm2d(32), nn.BatchNorm2d(32)
        self.bn7, self.bn8, self.bn9 = nn.BatchNorm2d(64), nn.BatchNorm2d(32), nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        h = F.leaky_relu(self.bn1(self.c1(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn2(self.c2(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn3(self.c3(h)), negative_slope=0.01)
        h = F.max_pool2d(h, kernel_size=2, stride=2)
        h = F.dropout2d(h, p=self.dropout_rate)

        h = F.leaky_relu(self.bn4(self.c4(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn5(self.c5(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn6(self.c6(h)), negative_slope=0.01)
        h = F.max_pool2d(h, kernel_size=2, stride=2)
        h = F.dropout2d(h, p=self.dropout_rate)

        h = F.leaky_relu(self.bn7(self.c7(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn8(self.c8(h)), negative_slope=0.01)
        h = F.leaky_relu(self.bn9(self.c9(h)), negative_slope=0.01)
        h = F.avg_pool2d(h, kernel_size=h.shape[2])
        h = h.view(h.size(0), h.size(1))
        return self.l_c1(h)


# --------------------------------------------------------------------------- data/utils.py


def noisify_multiclass_symmetric(y_train: np.ndarray, noise: float, random_state: int, nb_classes: int = 10):
    P = np.full((nb_classes, nb_classes), noise / (nb_classes - 1))
    np.fill_diagonal(P, 1.0 - noise)
    flipper = np.random.RandomState(random_state)
    new_y = y_train.copy()
    for idx in np.arange(len(y_train)):
        flipped = flipper.multinomial(1, P[y_train[idx], :], 1)[0]
        new_y[idx] = np.where(flipped == 1)[0][0]
    return new_y, float((new_y != y_train).mean())


# --------------------------------------------------------------------------- loss.py


def loss_coteaching(y_1, y_2, t, forget_rate, ind, noise_or_not):
    loss_1 = F.cross_entropy(y_1, t, reduction="none")
    ind_1_sorted = torch.argsort(loss_1.data)
    loss_1_sorted = loss_1[ind_1_sorted]

    loss_2 = F.cross_entropy(y_2, t, reduction="none")
    ind_2_sorted = torch.argsort(loss_2.data)

    remember_rate = 1 - forget_rate
    num_remember = int(remember_rate * len(loss_1_sorted))

    pure_ratio_1 = np.sum(noise_or_not[ind[ind_1_sorted[:num_remember].numpy()]]) / float(num_remember)
    pure_ratio_2 = np.sum(noise_or_not[ind[ind_2_sorted[:num_remember].numpy()]]) / float(num_remember)

    ind_1_update = ind_1_sorted[:num_remember]
    ind_2_update = ind_2_sorted[:num_remember]
    # exchange
    loss_1_update = F.cross_entropy(y_1[ind_2_update], t[ind_2_update])
    loss_2_update = F.cross_entropy(y_2[ind_1_update], t[ind_1_update])

    return (torch.sum(loss_1_update) / num_remember, torch.sum(loss_2_update) / num_remember,
            pure_ratio_1, pure_ratio_2)  # fmt: skip


# --------------------------------------------------------------------------- main.py


def accuracy(logit: torch.Tensor, target: torch.Tensor) -> float:
    output = F.softmax(logit, dim=1)
    pred = output.argmax(1)
    return 100.0 * (pred == target).float().mean().item()


def evaluate(test_loader, model1, model2) -> tuple[float, float]:
    accs = []
    for model in (model1, model2):
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels, _ in test_loader:
                outputs = F.softmax(model(images), dim=1)
                pred = outputs.argmax(1)
                total += labels.size(0)
                correct += (pred == labels).sum().item()
        accs.append(100 * float(correct) / float(total))
    return accs[0], accs[1]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed, test_size=TEST_SIZE)
    clean = tr_y.numpy()
    noisy, actual_noise = noisify_multiclass_symmetric(clean, noise_rate, random_state=seed, nb_classes=num_classes)
    noise_or_not = noisy == clean
    train_dataset = TensorDataset(digits.to_tensor(tr_x), torch.from_numpy(noisy), torch.arange(len(noisy)))
    test_dataset = TensorDataset(digits.to_tensor(te_x), te_y, torch.arange(len(te_y)))

    # Adam's learning rate and beta1 plans, and the forget-rate schedule
    mom1, mom2 = 0.9, 0.1
    alpha_plan = [learning_rate] * n_epoch
    beta1_plan = [mom1] * n_epoch
    for i in range(epoch_decay_start, n_epoch):
        alpha_plan[i] = float(n_epoch - i) / (n_epoch - epoch_decay_start) * learning_rate
        beta1_plan[i] = mom2

    def adjust_learning_rate(optimizer, epoch):
        for param_group in optimizer.param_groups:
            param_group["lr"] = alpha_plan[epoch]
            param_group["betas"] = (beta1_plan[epoch], 0.999)  # only change beta1

    rate_schedule = np.ones(n_epoch) * forget_rate
    rate_schedule[:num_gradual] = np.linspace(0, forget_rate**exponent, num_gradual)

    gen = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train_dataset, batch_size=batch_size, drop_last=True, shuffle=True, generator=gen)
    test_loader = DataLoader(test_dataset, batch_size=batch_size, drop_last=True, shuffle=False)

    cnn1 = CNN(input_channel=1, n_outputs=num_classes)
    optimizer1 = torch.optim.Adam(cnn1.parameters(), lr=learning_rate)
    cnn2 = CNN(input_channel=1, n_outputs=num_classes)
    params2 = cnn1.parameters() if variant == "optimizer2_over_cnn1" else cnn2.parameters()
    optimizer2 = torch.optim.Adam(params2, lr=learning_rate)
    softmax_in = variant == "softmax_into_coteaching_loss"

    first = (train_dataset.tensors[0][:batch_size], train_dataset.tensors[1][:batch_size])
    nx.preflight(cnn1, first, F.cross_entropy, optimizer=optimizer1)
    mon1 = nx.monitor(cnn1, optimizer1, every=10)
    mon2 = nx.monitor(cnn2, optimizer2, every=10)

    test_acc1, test_acc2 = evaluate(test_loader, cnn1, cnn2)  # the random networks
    pure_1: list[float] = []
    pure_2: list[float] = []
    for epoch in range(1, n_epoch):
        cnn1.train()
        adjust_learning_rate(optimizer1, epoch)
        cnn2.train()
        adjust_learning_rate(optimizer2, epoch)
        pure_1, pure_2 = [], []
        for i, (images, labels, indexes) in enumerate(train_loader):
            ind = indexes.numpy()
            if i > num_iter_per_epoch:
                break
            logits1 = cnn1(images)
            logits2 = cnn2(images)
            y_1, y_2 = (F.softmax(logits1, dim=1), F.softmax(logits2, dim=1)) if softmax_in else (logits1, logits2)
            loss_1, loss_2, pure_ratio_1, pure_ratio_2 = loss_coteaching(
                y_1, y_2, labels, rate_schedule[epoch], ind, noise_or_not)
            pure_1.append(100 * pure_ratio_1)
            pure_2.append(100 * pure_ratio_2)

            optimizer1.zero_grad()
            loss_1.backward()
            optimizer1.step()
            optimizer2.zero_grad()
            loss_2.backward()
            optimizer2.step()
            nx.timed(lambda: mon1.log(loss_1))
            nx.timed(lambda: mon2.log(loss_2))
        test_acc1, test_acc2 = evaluate(test_loader, cnn1, cnn2)

    nx.finish(mon1, cnn1, first, F.cross_entropy, optimizer=optimizer1)
    nx.finish(mon2)
    return {
        "test_acc1": test_acc1,
        "test_acc2": test_acc2,
        "label_precision1": float(np.mean(pure_1)),
        "label_precision2": float(np.mean(pure_2)),
        "actual_noise": actual_noise,
    }
