"""Port of cs231n assignment 2's ``PyTorch.ipynb``, Part II "Barebones PyTorch": a three-layer
ConvNet written as a plain function over a list of weight tensors (``F.conv2d``, ``F.relu``,
``flatten``, ``mm``), weights made by hand (``random_weight``: Kaiming normal, ``sqrt(2 /
fan_in)``; ``zero_weight`` for the biases), trained by ``train_part2``: ``F.cross_entropy``,
``loss.backward()`` and a hand-written SGD update ``w -= learning_rate * w.grad`` followed by
``w.grad.zero_()`` under ``torch.no_grad()``, the validation accuracy checked by
``check_accuracy_part2`` every ``print_every`` iterations.

Source: github.com/cs231n/cs231n.github.io, ``assignments/2023/assignment2_colab.zip`` ->
``assignment2/PyTorch.ipynb`` at commit 3d84654b14608fbccdff2393485631aaacfc9dab (MIT, Copyright
(c) 2015 Andrej Karpathy). The notebook leaves ``three_layer_convnet`` and the ConvNet's
initialisation as TODOs; they are filled in as the notebook's text specifies (conv with bias,
``channel_1`` 5x5 filters, zero-padding 2 -> ReLU -> conv with bias, ``channel_2`` 3x3 filters,
zero-padding 1 -> ReLU -> fully-connected with bias; weights by ``random_weight``, biases by
``zero_weight``). Written anew from the facts of the notebook; no code copied.

Kept: ``flatten`` (``x.view(N, -1)``); ``three_layer_convnet(x, params)`` with ``params = [conv_w1,
conv_b1, conv_w2, conv_b2, fc_w, fc_b]``, ``fc_w`` of shape ``(channel_2 * H * W, C)`` used as
``flatten(x).mm(fc_w) + fc_b``; ``random_weight`` (``fan_in = shape[0]`` for a 2-D weight,
``prod(shape[1:])`` for a conv weight; ``torch.randn(shape) * np.sqrt(2. / fan_in)``, then
``w.requires_grad = True``), ``zero_weight``; ``channel_1`` 32, ``channel_2`` 16,
``learning_rate`` 3e-3; the data pipeline's shape: ``ToTensor`` + ``Normalize`` with hardcoded
per-channel mean and std, a train loader of batch 64 drawing from the first ``NUM_TRAIN``
training images through ``SubsetRandomSampler``, a val loader over the rest of the training
set, a test loader; ``train_part2``'s loop exactly (no momentum, no weight decay, no schedule;
the per-tensor in-place update and gradient reset under ``torch.no_grad()``); ``print_every``
100 with ``check_accuracy_part2`` on the val loader; ``check_accuracy_part2`` (argmax of the
scores under ``torch.no_grad()``).
Shrunk / replaced: scikit-learn's 8x8 digits (1 channel, 10 classes; 1,437 train / 360 test)
instead of CIFAR-10 (3 x 32 x 32): the first conv takes 1 channel and ``fc_w`` is ``(16 * 8 *
8, 10)``; ``NUM_TRAIN`` 1,200 of the 1,437 training images (the notebook's 49,000 of 50,000
proportionally), the other 237 are the val split; the Normalize constants are the digits'
(0.3049, 0.3757) instead of CIFAR's; ``train_part2`` is called for 40 epochs of 19 iterations (760
iterations, about the notebook's single CIFAR-10 epoch of 766) -- the cell run 40 times; CPU; the prints kept as a list of lines instead of stdout.
Measure only (not in the program): the test accuracy (``check_accuracy_part2`` on the test
loader, which the notebook runs only on the best model of Part V) and the last val accuracy.

nndx, as the author would add it: nndx takes an ``nn.Module``, and the barebones model is a
function and a list of tensors, so the author holds the list in a small module
(``BarebonesNet``: an ``nn.ParameterList`` of the weights made by ``random_weight`` /
``zero_weight``, whose forward is ``three_layer_convnet(x, params)``) and trains that module's
parameters with the notebook's own loop; training is unchanged (same values, same updates).
There is no optimizer object: ``nndx.Monitor(net)`` with no optimizer (the Monitor's documented
case for hand-written updates), every=10, each iteration's loss logged; a preflight
``nndx.probe(net, (x, y), F.cross_entropy, data=...)`` on the first 64 training images before
the first call of ``train_part2``, and ``nndx.probe(..., monitor=mon)`` + ``nndx.diagnose``
after the last, with the train and val splits as ``data``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, sampler

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cs231n_barebones"
SOURCE = Source("cs231n/cs231n.github.io", "assignments/2023/assignment2_colab.zip:assignment2/PyTorch.ipynb",
                "3d84654b14608fbccdff2393485631aaacfc9dab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "Part II's three-layer ConvNet trained by train_part2 as published "
                "(shrunk: 8x8 digits, 40 passes of 19 iterations)"),
        Variant(
            "no_grad_zero",
            "the manual update loop leaves out w.grad.zero_() after w -= learning_rate * w.grad: every backward "
            "adds to the gradients of all earlier iterations, so each step applies the running sum of the "
            "gradients seen so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/greebear/pytorch-learning/issues/1",
             "https://github.com/cvxpy/cvxpylayers/pull/102",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293"),
            Measure("final_train_loss", "mean train loss of the last epoch at least 5x the healthy run's and 1.0 "
                    "above it (the accumulated gradients make the loss oscillate): 10.6 against 0.13 healthy on "
                    "seed 0, 43.6 against 0.12 on seed 1 (test accuracy 95.8/96.9 against 96.4/96.7: the last "
                    "weights happen to classify well)",
                    lambda healthy, buggy: not buggy < max(5.0 * healthy, healthy + 1.0)),
        ),
        Variant(
            "softmax_in_model",
            "three_layer_convnet returns F.softmax(scores, dim=1) instead of the raw scores (the notebook warns "
            "'no softmax activation here'); F.cross_entropy then applies its own log-softmax to probabilities",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/mlelarge/graph_neural_net/pull/37",
             "https://github.com/ariecattan/SciCo/issues/2",
             "https://github.com/nocotan/pytorch-lightning-gans/issues/9"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's: 74.7 against 96.4 "
                    "healthy on seed 0, 65.6 against 96.7 on seed 1 (last-epoch train loss 1.80/1.83 against "
                    "0.13/0.12)", lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

NUM_TRAIN, BATCH_SIZE, PRINT_EVERY, EPOCHS = 1200, 64, 100, 40
LEARNING_RATE, CHANNEL_1, CHANNEL_2 = 3e-3, 32, 16
MEAN, STD = 0.3049, 0.3757  # T.Normalize's hardcoded constants, the digits' instead of CIFAR-10's
dtype = torch.float32
device = torch.device("cpu")


# --------------------------------------------------------------------------- the notebook, Part II


def flatten(x: torch.Tensor) -> torch.Tensor:
    N = x.shape[0]  # read in N, C, H, W
    return x.view(N, -1)  # "flatten" the C * H * W values into a single vector per image


def random_weight(shape) -> torch.Tensor:
    """Kaiming normalization: sqrt(2 / fan_in)."""
    if len(shape) == 2:  # FC weight
        fan_in = shape[0]
    else:
        fan_in = np.prod(shape[1:])  # conv weight [out_channel, in_channel, kH, kW]
    w = torch.randn(shape, device=device, dtype=dtype) * np.sqrt(2.0 / fan_in)
    w.requires_grad = True
    return w


def zero_weight(shape) -> torch.Tensor:
    return torch.zeros(shape, device=device, dtype=dtype, requires_grad=True)


def make_convnet(softmax_in_model: bool):
    def three_layer_convnet(x: torch.Tensor, params) -> torch.Tensor:
        conv_w1, conv_b1, conv_w2, conv_b2, fc_w, fc_b = params
        x = F.relu(F.conv2d(x, conv_w1, conv_b1, padding=2))
        x = F.relu(F.conv2d(x, conv_w2, conv_b2, padding=1))
        scores = flatten(x).mm(fc_w) + fc_b
        if softmax_in_model:
            scores = F.softmax(scores, dim=1)
        return scores

    return three_layer_convnet


class BarebonesNet(nn.Module):
    """The author's wrapper for nndx: the weight list held as a module; forward is the notebook's
    model function over those weights (or over the list the training loop passes, the same ones)."""

    def __init__(self, model_fn, params) -> None:
        super().__init__()
        self.model_fn = model_fn
        self.params = nn.ParameterList(params)

    def forward(self, x: torch.Tensor, params=None) -> torch.Tensor:
        return self.model_fn(x, list(self.params) if params is None else params)


def check_accuracy_part2(loader: DataLoader, model_fn, params, log: list[str], split: str) -> float:
    log.append("Checking accuracy on the %s set" % split)
    num_correct, num_samples = 0, 0
    with torch.no_grad():
        for x, y in loader:
            x = x.to(device=device, dtype=dtype)
            y = y.to(device=device, dtype=torch.int64)
            scores = model_fn(x, params)
            _, preds = scores.max(1)
            num_correct += (preds == y).sum()
            num_samples += preds.size(0)
        acc = float(num_correct) / num_samples
        log.append("Got %d / %d correct (%.2f%%)" % (num_correct, num_samples, 100 * acc))
    return acc


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    no_grad_zero = variant == "no_grad_zero"
    three_layer_convnet = make_convnet(variant == "softmax_in_model")

    # Part I: the data (ToTensor + Normalize), the three loaders
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_all = (digits.to_tensor(tr_raw) - MEAN) / STD
    x_test = (digits.to_tensor(te_raw) - MEAN) / STD
    train_set, test_set = TensorDataset(x_all, tr_y), TensorDataset(x_test, te_y)
    sample_gen = torch.Generator().manual_seed(seed)
    loader_train = DataLoader(train_set, batch_size=BATCH_SIZE,
                              sampler=sampler.SubsetRandomSampler(range(NUM_TRAIN), generator=sample_gen))
    loader_val = DataLoader(train_set, batch_size=BATCH_SIZE,
                            sampler=sampler.SubsetRandomSampler(range(NUM_TRAIN, len(train_set)), generator=sample_gen))
    loader_test = DataLoader(test_set, batch_size=BATCH_SIZE)

    log: list[str] = []
    val_accs: list[float] = []
    epoch_losses: list[float] = []

    def train_part2(model_fn, params, learning_rate: float, mon) -> None:
        losses = []
        for t, (x, y) in enumerate(loader_train):
            x = x.to(device=device, dtype=dtype)
            y = y.to(device=device, dtype=torch.long)

            scores = model_fn(x, params)
            loss = F.cross_entropy(scores, y)

            loss.backward()

            with torch.no_grad():
                for w in params:
                    w -= learning_rate * w.grad

                    if not no_grad_zero:
                        w.grad.zero_()

            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())
            if t % PRINT_EVERY == 0:
                log.append("Iteration %d, loss = %.4f" % (t, loss.item()))
                val_accs.append(check_accuracy_part2(loader_val, model_fn, params, log, "val"))
        epoch_losses.append(float(np.mean(losses)))

    # Part II: training a ConvNet
    conv_w1 = random_weight((CHANNEL_1, 1, 5, 5))
    conv_b1 = zero_weight((CHANNEL_1,))
    conv_w2 = random_weight((CHANNEL_2, CHANNEL_1, 3, 3))
    conv_b2 = zero_weight((CHANNEL_2,))
    fc_w = random_weight((CHANNEL_2 * 8 * 8, 10))
    fc_b = zero_weight((10,))

    net = BarebonesNet(three_layer_convnet, [conv_w1, conv_b1, conv_w2, conv_b2, fc_w, fc_b])
    params = list(net.params)

    x_train, y_train = x_all[:NUM_TRAIN], tr_y[:NUM_TRAIN]
    x_val, y_val = x_all[NUM_TRAIN:], tr_y[NUM_TRAIN:]
    probe_batch = (x_train[:BATCH_SIZE], y_train[:BATCH_SIZE])
    splits = (x_train, y_train, x_val, y_val)
    nx.preflight(net, probe_batch, F.cross_entropy, data=splits)
    mon = nx.monitor(net, None, every=10)

    for _ in range(EPOCHS):
        train_part2(net, params, LEARNING_RATE, mon)

    nx.finish(mon, net, probe_batch, F.cross_entropy, data=splits)

    val_acc = check_accuracy_part2(loader_val, net, params, log, "val")
    test_acc = check_accuracy_part2(loader_test, net, params, log, "test")
    return {"test_acc": 100.0 * test_acc, "val_acc": 100.0 * val_acc, "final_train_loss": epoch_losses[-1],
            "first_epoch_loss": epoch_losses[0], "first_val_acc": 100.0 * val_accs[0]}  # fmt: skip
