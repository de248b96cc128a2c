"""Port of Dive into Deep Learning's "Convolutional Neural Networks (LeNet)" section, PyTorch
tab, as release branch r0.17 writes it: an ``nn.Sequential`` LeNet-5 with sigmoid activations
and average pooling, trained by ``train_ch6`` (Xavier init, SGD at lr 0.9, cross-entropy) and
scored each epoch by ``evaluate_accuracy_gpu``.

Source: github.com/d2l-ai/d2l-en, ``chapter_convolutional-neural-networks/lenet.md`` (the
``#@tab pytorch`` cells) and the ``d2l/torch.py`` helpers it calls (``accuracy``,
``Accumulator``, ``load_data_fashion_mnist``) on branch r0.17, commit
d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a (sample code under the MIT-0 licence of
LICENSE-SAMPLECODE, Copyright Amazon.com, Inc.; prose CC BY-SA 4.0). Written anew from the
facts of those files; no code copied. The r0.17 ``train_ch6`` API is not in the shared
:mod:`bench.programs.d2l` (which follows the later ``Trainer`` API), so its pieces live here.

Kept: ``net = nn.Sequential(Conv2d(1, 6, 5, padding=2), Sigmoid, AvgPool2d(2, 2), Conv2d(6,
16, 5), Sigmoid, AvgPool2d(2, 2), Flatten, Linear(400, 120), Sigmoid, Linear(120, 84), Sigmoid,
Linear(84, 10))``; ``train_ch6``: ``init_weights`` (``xavier_uniform_`` on the weight of every
module whose type is exactly ``nn.Linear`` or ``nn.Conv2d``) applied by ``net.apply``,
``torch.optim.SGD(net.parameters(), lr=lr)``, ``nn.CrossEntropyLoss()``; per epoch an
``Accumulator(3)`` and ``net.train()``; per batch ``optimizer.zero_grad()``, ``y_hat = net(X)``,
``l = loss(y_hat, y)``, ``l.backward()``, ``optimizer.step()``, then under ``torch.no_grad()``
``metric.add(l * X.shape[0], accuracy(y_hat, y), X.shape[0])`` and the running ``train_l`` /
``train_acc``; per epoch ``evaluate_accuracy_gpu(net, test_iter)`` (``net.eval()``, no grad,
``Accumulator(2)`` of correct predictions and counts); ``accuracy`` (argmax over the classes,
count of matches as a float); ``lr = 0.9``, ``batch_size = 256``; the loaders of
``load_data_fashion_mnist`` (train shuffled, test not) over ``ToTensor`` images (1 x 28 x 28,
pixels in [0, 1], no normalisation).
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 instead of
Fashion-MNIST: 1,437 train / 360 test images instead of 60,000 / 10,000, so 6 batches an
epoch instead of 235; 100 epochs instead of 10 (600 SGD steps against the book's 2,350, enough
for the sigmoid net to leave its ln(10) plateau); no ``Animator``/``Timer``; CPU.
Measure only (not in the program): the test loss over the whole test set after the last epoch
(the program prints the test accuracy, which is measured too).

nndx, as the author would add it inside ``train_ch6``: a preflight ``nndx.probe(net,
first_batch, loss, optimizer=optimizer, data=...)`` once the optimizer and loss exist;
``nndx.Monitor(net, optimizer, every=10)`` around the epochs, each batch's loss ``l`` logged
after ``optimizer.step()`` (where d2l feeds its animator); after the last epoch
``nndx.probe(..., monitor=mon)`` on the same first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.d2l_v017 import Accumulator, accuracy, evaluate_accuracy_gpu
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_lenet"
SOURCE = Source("d2l-ai/d2l-en", "chapter_convolutional-neural-networks/lenet.md",
                "d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a", "MIT-0 (sample code)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 28x28 digits, 100 epochs of 6 batches)"),
        Variant(
            "softmax_before_ce",
            "an nn.Softmax(dim=1) appended after the last Linear(84, 10) of the Sequential while the loss stays "
            "nn.CrossEntropyLoss, which applies log-softmax itself: the loss sees probabilities as logits",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/NaJaeMin92/pytorch-DANN/issues/7",
             "https://github.com/MicrosoftDocs/ml-basics/issues/48",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32"),
            Measure("test_acc", "test accuracy at least 0.2 below the healthy run's: 0.089 against 0.903 healthy "
                    "on seed 0 (the net stays on the ln(10) plateau: test loss 2.31)",
                    lambda healthy, buggy: buggy < healthy - 0.2),
        ),
        Variant(
            "missing_zero_grad",
            "optimizer.zero_grad() left out of train_ch6's batch loop: every backward adds to the gradients of "
            "all the steps before, so SGD at lr 0.9 steps along the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1"),
            Measure("test_acc", "test accuracy at least 0.2 below the healthy run's: 0.092 against 0.903 healthy "
                    "on seed 0 (test loss 2.71 against 0.29)",
                    lambda healthy, buggy: buggy < healthy - 0.2),
        ),
    )
}

BATCH_SIZE, LR, NUM_EPOCHS, SIDE = 256, 0.9, 100, 28


# --------------------------------------------------------------------------- the data


def load_data_digits(batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    """``load_data_fashion_mnist``'s loaders (ToTensor images, train shuffled, test not) over the
    upsampled digits."""
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train = TensorDataset(digits.upscaled(tr_raw, SIDE), tr_y)
    test = TensorDataset(digits.upscaled(te_raw, SIDE), te_y)
    return DataLoader(train, batch_size, shuffle=True), DataLoader(test, batch_size, shuffle=False)


# --------------------------------------------------------------------------- lenet.md (pytorch tab)


def train_ch6(net, train_iter, test_iter, num_epochs, lr, device, nx: Nndx, zero_grad: bool = True):
    def init_weights(m):
        if type(m) == nn.Linear or type(m) == nn.Conv2d:  # noqa: E721 - the book's test
            nn.init.xavier_uniform_(m.weight)

    net.apply(init_weights)
    net.to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first_batch = next(iter(train_iter))
    tr, te = train_iter.dataset.tensors, test_iter.dataset.tensors
    nx.preflight(net, first_batch, loss, optimizer=optimizer, data=(tr[0], tr[1], te[0], te[1]))
    mon = nx.monitor(net, optimizer, every=10)

    num_batches = len(train_iter)
    for epoch in range(num_epochs):
        metric = Accumulator(3)
        net.train()
        for i, (X, y) in enumerate(train_iter):
            if zero_grad:
                optimizer.zero_grad()
            X, y = X.to(device), y.to(device)
            y_hat = net(X)
            l = loss(y_hat, y)  # noqa: E741
            l.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(l))  # noqa: B023
            with torch.no_grad():
                metric.add(l * X.shape[0], accuracy(y_hat, y), X.shape[0])
            train_l = metric[0] / metric[2]
            train_acc = metric[1] / metric[2]
            _ = (i + 1) % max(num_batches // 5, 1)  # where the animator would draw
        test_acc = evaluate_accuracy_gpu(net, test_iter)

    nx.finish(mon, net, first_batch, loss, optimizer=optimizer, data=(tr[0], tr[1], te[0], te[1]))
    return train_l, train_acc, test_acc


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    layers = [
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(),
        nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10),
    ]  # fmt: skip
    if variant == "softmax_before_ce":
        layers.append(nn.Softmax(dim=1))
    net = nn.Sequential(*layers)

    train_iter, test_iter = load_data_digits(BATCH_SIZE, seed)
    train_l, train_acc, test_acc = train_ch6(net, train_iter, test_iter, NUM_EPOCHS, LR, torch.device("cpu"), nx,
                                             zero_grad=variant != "missing_zero_grad")  # fmt: skip

    net.eval()
    x_test, y_test = test_iter.dataset.tensors
    with torch.no_grad():
        test_loss = nn.functional.cross_entropy(net(x_test), y_test).item()
    return {"test_acc": test_acc, "test_loss": test_loss, "train_loss": train_l, "train_acc": train_acc}
