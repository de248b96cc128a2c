"""Port of aladdinpersson/Machine-Learning-Collection's simple CNN: two 3x3 convolutions (8 and
16 channels), each followed by ReLU and a 2x2 max-pool, flattened into one Linear; Adam,
cross-entropy, ``check_accuracy`` on the train and the test set in ``model.eval()``.

Source: github.com/aladdinpersson/Machine-Learning-Collection,
``ML/Pytorch/Basics/pytorch_simple_CNN.py`` at commit e6c7f42c46a6414f12b2d8820e00e4474be7bbd8
(MIT, Copyright (c) 2020 Aladdin Persson). Written anew from the facts of that file; no code
copied.

Kept: ``CNN(in_channels=1, num_classes=10)``: ``Conv2d(in_channels, 8, 3, stride 1, padding
1)``, ``MaxPool2d(2, 2)``, ``Conv2d(8, 16, 3, stride 1, padding 1)``, the same pool, forward
``relu(conv1) -> pool -> relu(conv2) -> pool -> x.reshape(x.shape[0], -1) -> fc1``;
``nn.CrossEntropyLoss()``; ``optim.Adam(model.parameters(), lr=0.001)``; batch size 64;
images through ``transforms.ToTensor()`` (pixels / 255, no normalisation); train and test
loaders both with ``shuffle=True``; the loop ``scores = model(data)``, ``loss =
criterion(scores, targets)``, ``optimizer.zero_grad()``, ``loss.backward()``,
``optimizer.step()``; ``check_accuracy(loader, model)``: ``model.eval()``, ``torch.no_grad()``,
``scores.max(1)`` predictions, ``num_correct / num_samples``, ``model.train()``.
Shrunk / replaced: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST, so the
feature map after the two pools is 16x2x2 and ``fc1`` is ``Linear(16 * 2 * 2, 10)`` instead of
``Linear(16 * 7 * 7, 10)``; 15 epochs (345 steps) instead of 3 epochs of 938 steps; CPU; no
tqdm.
Measure only (not in the program): the mean batch loss of the last epoch.

nndx, as the author would add it (README): a preflight ``nndx.probe`` on the first training
batch with the criterion, the optimizer and the train/test tensors as ``data``;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each batch's loss logged after
``optimizer.step()``; after the loop ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``, before ``check_accuracy``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_cnn"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/Basics/pytorch_simple_CNN.py",
                "e6c7f42c46a6414f12b2d8820e00e4474be7bbd8", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, fc1 on 16x2x2, 15 epochs)"),
        Variant(
            "softmax_before_cross_entropy",
            "forward returns F.softmax(self.fc1(x), dim=1): the probabilities go into nn.CrossEntropyLoss, "
            "which applies log-softmax again, so the loss cannot fall below log(1 + 9/e) = 1.46 and the "
            "gradients shrink as the net grows confident",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://discuss.pytorch.org/t/do-i-need-to-use-softmax-before-nn-crossentropyloss/5323",
             "https://stackoverflow.com/questions/55675345/should-i-use-softmax-as-output-when-using-cross-entropy-loss-in-pytorch"),
            Measure("last_epoch_loss", "mean batch loss of the last epoch at least 3x the healthy run's: 1.65 against 0.31 healthy on "
                    "seed 0 (test accuracy 82.5 against 93.1)",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
        Variant(
            "zero_grad_dropped",
            "the optimizer.zero_grad() line is left out of the loop: every backward adds into .grad, so each "
            "Adam step follows the sum of all gradients since the start",
            (C.MISSING_ZERO_GRAD,),
            ("https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's: 81.1 against 93.1 healthy on seed 0 "
                    "(last-epoch loss 0.83 against 0.31)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

IN_CHANNELS, NUM_CLASSES, LEARNING_RATE, BATCH_SIZE, NUM_EPOCHS = 1, 10, 0.001, 64, 15


class CNN(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, softmax_out: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=in_channels, out_channels=8, kernel_size=(3, 3), stride=(1, 1),
                               padding=(1, 1))  # fmt: skip
        self.pool = nn.MaxPool2d(kernel_size=(2, 2), stride=(2, 2))
        self.conv2 = nn.Conv2d(in_channels=8, out_channels=16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
        self.fc1 = nn.Linear(16 * 2 * 2, num_classes)
        self.softmax_out = softmax_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = self.pool(x)
        x = F.relu(self.conv2(x))
        x = self.pool(x)
        x = x.reshape(x.shape[0], -1)
        x = self.fc1(x)
        if self.softmax_out:
            x = F.softmax(x, dim=1)
        return x


def check_accuracy(loader: DataLoader, model: nn.Module) -> float:
    num_correct = 0
    num_samples = 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            scores = model(x)
            _, predictions = scores.max(1)
            num_correct += (predictions == y).sum()
            num_samples += predictions.size(0)
    model.train()
    return float(num_correct) / float(num_samples)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)  # transforms.ToTensor()
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=BATCH_SIZE, shuffle=True)

    model = CNN(in_channels=IN_CHANNELS, num_classes=NUM_CLASSES, softmax_out=variant == "softmax_before_cross_entropy")
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=LEARNING_RATE)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_batch = next(iter(train_loader))
    splits = (x_train, tr_y, x_test, te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    for _ in range(NUM_EPOCHS):
        batch_losses = []
        for _batch_idx, (data, targets) in enumerate(train_loader):
            scores = model(data)
            loss = criterion(scores, targets)
            if variant != "zero_grad_dropped":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            batch_losses.append(loss.item())
        epoch_losses.append(sum(batch_losses) / len(batch_losses))

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    return {"train_acc": check_accuracy(train_loader, model), "test_acc": check_accuracy(test_loader, model),
            "last_epoch_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0]}  # fmt: skip
