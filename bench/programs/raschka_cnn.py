"""Port of rasbt/deeplearning-models' LeNet-5 MNIST notebook: the classic LeNet-5 (two 5x5
convolutions with Tanh and max-pooling, a Tanh classifier 400-120-84-10) on 32x32 grayscale digits,
``F.cross_entropy`` on the logits of a model that returns ``(logits, probas)``, Adam at 1e-3,
``compute_accuracy`` on the probas.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/cnn/cnn-lenet5-mnist.ipynb`` at commit
18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian Raschka). Written
anew from the facts of that notebook; no code copied. (Chosen over ``cnn-vgg16.ipynb``: LeNet-5
trains in seconds on a CPU unshrunk.)

Kept: ``LeNet5(num_classes, grayscale=True)`` as published (``features``: ``Conv2d(1, 6, 5)``,
Tanh, ``MaxPool2d(2)``, ``Conv2d(6, 16, 5)``, Tanh, ``MaxPool2d(2)``; ``torch.flatten(x, 1)``;
``classifier``: ``Linear(400, 120)``, Tanh, ``Linear(120, 84)``, Tanh, ``Linear(84, 10)``;
``forward`` returns ``logits, F.softmax(logits, dim=1)``), PyTorch's default init (the notebook
sets none), ``torch.manual_seed(RANDOM_SEED)`` before building it; images through
``Resize((32, 32))`` + ``ToTensor`` (pixels in [0, 1]); ``DataLoader(batch_size=128,
shuffle=True)`` for train, ``shuffle=False`` for test; ``torch.optim.Adam(model.parameters(),
lr=0.001)``; the training loop (``model.train()``; ``logits, probas = model(features)``;
``cost = F.cross_entropy(logits, targets)``; ``optimizer.zero_grad()``; ``cost.backward()``;
``optimizer.step()``; logging every 50 batches; after each epoch ``model.eval()`` and
``compute_accuracy`` on the train loader under ``torch.set_grad_enabled(False)``);
``compute_accuracy`` (``torch.max(probas, 1)``, percent correct); the test accuracy at the end.
Shrunk: scikit-learn's 8x8 digits resized (bilinear) to 32x32 (1,437 train / 360 test) instead of
MNIST; 15 epochs of 12 batches instead of 10 epochs of 469; CPU; no plot.
Measure only (not in the program): the mean train cost of the last epoch and the test cost on the logits.

nndx, as the author would add it: the model returns a tuple, so nndx gets the loss the loop
computes as a function of the whole output (``F.cross_entropy`` on ``out[0]``, the logits; in the
``cross_entropy_on_probas`` variant on ``out[1]``, as that loop does); a preflight ``nndx.probe``
on the first training batch with that loss, the Adam and the train/test tensors as ``data``;
``nndx.Monitor(model, optimizer)`` around the epoch loop, ``mon.log(cost)`` after every step
(where the notebook logs the cost; the notebook computes no validation loss to log); after
training ``nndx.probe(..., monitor=mon)`` on the same batch, then ``nndx.diagnose``.
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

NAME = "raschka_cnn"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/cnn/cnn-lenet5-mnist.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 32x32 digits, 15 epochs of 12 batches)"),
        Variant(
            "cross_entropy_on_probas",
            "the loop unpacks logits, probas = model(features) and computes F.cross_entropy(probas, targets): "
            "the softmaxed output goes into a loss that applies log_softmax itself (softmax twice), so the "
            "loss is squashed into [~1.46, 2.30] and its gradients shrink",
            (C.DOUBLE_SOFTMAX,),
            ("https://twitter.com/karpathy/status/1013244313327681536 (common mistake 4: softmaxed outputs to a "
             "loss that expects raw logits)",
             "https://github.com/gitabcworld/MatchingNetworks/issues/5",
             "https://github.com/jaehong31/CGES/issues/1"),
            Measure("epoch3_train_acc", "the train accuracy compute_accuracy prints after epoch 3 at least 10 points "
                    "below the healthy run's: 70.2 against 85.0 on seed 0 (epoch 1: 50.0 against 61.5; after "
                    "15 epochs the test accuracy catches up, 96.7 against 96.9)",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
        Variant(
            "labels_shuffled_separately",
            "before building the training set the images and the labels are shuffled each by its own "
            "np.random.shuffle call (no shared permutation): every training image is paired with the label of "
            "some other image; the test set is left as it was",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/udacity/sdc-issue-reports/issues/1326 (features and labels shuffled separately)",
             "https://github.com/caicloud/tensorflow-tutorial/issues/114",
             "https://github.com/amanbasu/ECG-Authentication/issues/3"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's: 5.6 against 96.9 on "
                    "seed 0", lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

RANDOM_SEED = 1
LEARNING_RATE = 0.001
BATCH_SIZE = 128
NUM_EPOCHS = 15
NUM_CLASSES = 10
GRAYSCALE = True
SIDE = 32


class LeNet5(nn.Module):
    def __init__(self, num_classes: int, grayscale: bool = False) -> None:
        super().__init__()
        self.grayscale = grayscale
        self.num_classes = num_classes
        in_channels = 1 if self.grayscale else 3

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5),
            nn.Tanh(),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.Tanh(),
            nn.MaxPool2d(kernel_size=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120),
            nn.Tanh(),
            nn.Linear(120, 84),
            nn.Tanh(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.features(x)
        x = torch.flatten(x, 1)
        logits = self.classifier(x)
        probas = F.softmax(logits, dim=1)
        return logits, probas


def compute_accuracy(model: nn.Module, data_loader: DataLoader) -> float:
    correct_pred, num_examples = 0, 0
    for features, targets in data_loader:
        logits, probas = model(features)
        _, predicted_labels = torch.max(probas, 1)
        num_examples += targets.size(0)
        correct_pred += (predicted_labels == targets).sum()
    return float(correct_pred.float() / num_examples * 100)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    on_probas = variant == "cross_entropy_on_probas"
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # Resize + ToTensor
    if variant == "labels_shuffled_separately":  # "shuffle the data": two shuffles, two orders
        rng = np.random.default_rng(seed)
        x_np, y_np = x_train.numpy().copy(), tr_y.numpy().copy()
        rng.shuffle(x_np)
        rng.shuffle(y_np)
        x_train, tr_y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    torch.manual_seed(seed)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=BATCH_SIZE, shuffle=False)

    torch.manual_seed(RANDOM_SEED + seed)
    model = LeNet5(NUM_CLASSES, GRAYSCALE)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def cost_fn(outputs: tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        logits, probas = outputs
        return F.cross_entropy(probas if on_probas else logits, targets)

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's random stream alone
        first_batch = next(iter(train_loader))
    data = (x_train, tr_y, x_test, te_y)
    nx.preflight(model, first_batch, cost_fn, optimizer=optimizer, data=data)
    mon = nx.monitor(model, optimizer)

    costs: list[float] = []
    train_accs: list[float] = []
    for _epoch in range(NUM_EPOCHS):
        model.train()
        for _batch_idx, (features, targets) in enumerate(train_loader):
            ### FORWARD AND BACK PROP
            logits, probas = model(features)
            cost = F.cross_entropy(probas if on_probas else logits, targets)
            optimizer.zero_grad()
            cost.backward()
            ### UPDATE MODEL PARAMETERS
            optimizer.step()
            ### LOGGING
            nx.timed(lambda: mon.log(cost))  # noqa: B023
            costs.append(cost.item())

        model.eval()
        with torch.set_grad_enabled(False):
            train_accs.append(compute_accuracy(model, train_loader))  # the notebook prints it per epoch

    nx.finish(mon, model, first_batch, cost_fn, optimizer=optimizer, data=data)

    model.eval()
    with torch.set_grad_enabled(False):
        test_acc = compute_accuracy(model, test_loader)
        test_cost = float(F.cross_entropy(model(x_test)[0], te_y))  # measure only: on the logits
    n_batches = len(train_loader)
    return {"test_acc": test_acc, "train_acc": train_accs[-1], "epoch1_train_acc": train_accs[0],
            "epoch3_train_acc": train_accs[2], "test_logit_cost": test_cost,
            "last_epoch_cost": sum(costs[-n_batches:]) / n_batches}  # fmt: skip
