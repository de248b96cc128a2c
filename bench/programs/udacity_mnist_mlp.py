"""Port of udacity/deep-learning-v2-pytorch's MNIST MLP with validation: a 784-512-512-10 MLP
with ReLU and dropout, ``CrossEntropyLoss``, SGD at lr 0.01, a train/validation loop that saves
the model whenever the validation loss reaches a new minimum, and a test of the best model.

Source: github.com/udacity/deep-learning-v2-pytorch,
``convolutional-neural-networks/mnist-mlp/mnist_mlp_solution_with_validation.ipynb`` at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). The brief named
``mnist_mlp_solution.ipynb``, whose loop has no validation; the train/validation loop that
saves the best model on the validation loss, which the brief describes, is this sibling
notebook's (same ``Net``, same loss and optimizer). Written anew from the facts of that file;
no code copied.

Kept: ``transforms.ToTensor()`` images (pixels in [0, 1]); ``batch_size = 20``, ``valid_size =
0.2``: the train indices shuffled with ``np.random.shuffle``, the first fifth for validation,
``SubsetRandomSampler``s for the train and validation ``DataLoader``s over the same train set, a
plain test ``DataLoader``; ``Net``: ``fc1 = Linear(784, 512)``, ``fc2 = Linear(512, 512)``,
``fc3 = Linear(512, 10)``, one ``Dropout(0.2)`` module; forward ``x.view(-1, 28 * 28)``, relu
fc1, dropout, relu fc2, dropout, fc3; ``nn.CrossEntropyLoss()``;
``torch.optim.SGD(model.parameters(), lr=0.01)``; per epoch ``model.train()``, per batch
``zero_grad``, forward, loss, ``backward``, ``step``, ``train_loss += loss.item()``; then
``model.eval()`` and the validation loss summed over the validation batches; both averaged over
the loader lengths; ``torch.save(model.state_dict(), 'model.pt')`` when ``valid_loss <=
valid_loss_min``; after training ``model.load_state_dict(torch.load('model.pt'))`` and the test
loop (``model.eval()``, ``loss.item() * data.size(0)`` summed and divided by the test set's
size, ``torch.max`` predictions, per-class counts over ``range(batch_size)``, overall accuracy).
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 instead of MNIST (1,437 train
images of which 287 for validation, 360 test); 30 epochs instead of 50; ``model.pt`` written to
an in-memory buffer instead of a file; ``np.inf`` for ``np.Inf`` (gone in NumPy 2); no plots;
CPU.
Measure only (not in the program): nothing; the variants are measured by the test loop's loss
and accuracy and by the lowest validation loss.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, batch,
criterion, optimizer=optimizer, data=(x_train, y_train, x_valid, y_valid))`` on the first train
batch; ``nndx.Monitor(model, optimizer, every=10)`` around the epoch loop, every batch's loss
logged where ``train_loss`` is summed and each epoch's validation loss logged as ``split="val"``
where it is printed; after the loop ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import io

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.sampler import SubsetRandomSampler

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_mnist_mlp"
SOURCE = Source(
    "udacity/deep-learning-v2-pytorch",
    "convolutional-neural-networks/mnist-mlp/mnist_mlp_solution_with_validation.ipynb",
    "c9404fc86181fc3f0906b368697268257f348535",
    "MIT",
)

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 digits, 1,150 train / 287 valid / 360 test, "
                "30 epochs)"),
        Variant(
            "no_eval_mode",
            "model.eval() left out before the validation loop and before the test loop (the notebook's first "
            "version): dropout stays on while the validation loss that picks the saved model and the test loss "
            "are computed",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/udacity/deep-learning-v2-pytorch/issues/399",
             "https://github.com/as791/ZOO_Attack_PyTorch/issues/7"),
            Measure("test_loss", "test loss at least 1.1x the healthy run's", lambda healthy, buggy: buggy >= 1.1 * healthy),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "forward returns F.softmax(self.fc3(x), dim=1) while the criterion stays nn.CrossEntropyLoss, which "
            "applies log-softmax itself: the loss sees probabilities as logits (softmax applied twice)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/nishnik/Deep-Semantic-Similarity-Model-PyTorch/issues/2",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32",
             "https://github.com/GiorgiaD/PEPITA/issues/1",
             "https://github.com/IBM/dstc-noesis/issues/18"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 10.0),
        ),
    )
}

N_EPOCHS = 30
BATCH_SIZE = 20
VALID_SIZE = 0.2


class Net(nn.Module):
    def __init__(self, softmax_out: bool = False) -> None:
        super().__init__()
        hidden_1 = 512
        hidden_2 = 512
        self.fc1 = nn.Linear(28 * 28, hidden_1)
        self.fc2 = nn.Linear(hidden_1, hidden_2)
        self.fc3 = nn.Linear(hidden_2, 10)
        self.dropout = nn.Dropout(0.2)
        self.softmax_out = softmax_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 28 * 28)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        x = F.relu(self.fc2(x))
        x = self.dropout(x)
        x = self.fc3(x)
        if self.softmax_out:  # the bug: probabilities handed to CrossEntropyLoss
            x = F.softmax(x, dim=1)
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    use_eval = variant != "no_eval_mode"

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_x = digits.upscaled(tr_raw, 28)  # transforms.ToTensor(): [0, 1]
    test_x = digits.upscaled(te_raw, 28)
    train_data, test_data = TensorDataset(train_x, tr_y), TensorDataset(test_x, te_y)

    num_train = len(train_data)
    indices = list(range(num_train))
    np.random.shuffle(indices)
    split = int(np.floor(VALID_SIZE * num_train))
    train_idx, valid_idx = indices[split:], indices[:split]
    train_sampler = SubsetRandomSampler(train_idx)
    valid_sampler = SubsetRandomSampler(valid_idx)
    train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=train_sampler)
    valid_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=valid_sampler)
    test_loader = DataLoader(test_data, batch_size=BATCH_SIZE)

    model = Net(softmax_out=variant == "softmax_before_cross_entropy")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_batch = next(iter(train_loader))
    splits = (train_x[train_idx], tr_y[train_idx], train_x[valid_idx], tr_y[valid_idx])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    n_epochs = N_EPOCHS
    valid_loss_min = np.inf
    saved = None
    first_train_loss = None
    for _epoch in range(n_epochs):
        train_loss = 0.0
        valid_loss = 0.0

        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()
            train_loss += loss.item()
            nx.timed(lambda: mon.log(loss))  # noqa: B023

        if use_eval:
            model.eval()
        for data, target in valid_loader:
            output = model(data)
            loss = criterion(output, target)
            valid_loss += loss.item()

        train_loss = train_loss / len(train_loader)
        valid_loss = valid_loss / len(valid_loader)
        nx.timed(lambda: mon.log(valid_loss, split="val"))  # noqa: B023
        if first_train_loss is None:
            first_train_loss = train_loss

        if valid_loss <= valid_loss_min:
            saved = io.BytesIO()
            torch.save(model.state_dict(), saved)
            valid_loss_min = valid_loss

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    saved.seek(0)
    model.load_state_dict(torch.load(saved))

    test_loss = 0.0
    class_correct = list(0.0 for i in range(10))
    class_total = list(0.0 for i in range(10))
    if use_eval:
        model.eval()
    for data, target in test_loader:
        output = model(data)
        loss = criterion(output, target)
        test_loss += loss.item() * data.size(0)
        _, pred = torch.max(output, 1)
        correct = np.squeeze(pred.eq(target.data.view_as(pred)))
        for i in range(BATCH_SIZE):
            label = target.data[i]
            class_correct[label] += correct[i].item()
            class_total[label] += 1
    test_loss = test_loss / len(test_loader.dataset)
    test_acc = 100.0 * np.sum(class_correct) / np.sum(class_total)
    return {"test_loss": test_loss, "test_acc": float(test_acc), "valid_loss_min": float(valid_loss_min),
            "last_train_loss": train_loss, "first_train_loss": float(first_train_loss)}  # fmt: skip
