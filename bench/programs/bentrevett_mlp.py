"""Port of bentrevett/pytorch-image-classification ``1_mlp.ipynb``: a three-layer MLP
(input -> 250 -> 100 -> classes) on MNIST, trained with Adam and cross-entropy, the best
validation loss kept, the test set scored with the kept weights.

Source: github.com/bentrevett/pytorch-image-classification, ``1_mlp.ipynb`` at commit
33c9cfdb9097bc65b5800c1996f199f0ba520888 (MIT, Copyright (c) 2018 Ben Trevett). Written anew
from the facts of that notebook; no code copied.

Kept: ``SEED = 1234`` for ``random``, ``np.random`` and ``torch``; the normalisation statistics
computed from the raw uint8 training pixels as ``data.float().mean() / 255`` and
``data.float().std() / 255``; the train transforms (``RandomRotation(5, fill=0)``,
``RandomCrop(28, padding=2)``, ``ToTensor``, ``Normalize(mean, std)``) and the test transforms
(``ToTensor``, ``Normalize``), applied per item by the dataset; ``VALID_RATIO = 0.9`` and
``data.random_split`` into train/valid, then ``valid_data = copy.deepcopy(valid_data)`` with
``valid_data.dataset.transform = test_transforms``; ``BATCH_SIZE = 64``, a shuffling train
``DataLoader`` and unshuffled valid/test loaders; ``MLP(input_dim, output_dim)`` with
``input_fc`` (-> 250), ``hidden_fc`` (-> 100), ``output_fc``, ``x.view(batch_size, -1)``, ReLUs,
returning ``(y_pred, h_2)``; ``count_parameters`` (trainable ``numel``);
``optim.Adam(model.parameters())`` (default lr 1e-3); ``nn.CrossEntropyLoss``;
``calculate_accuracy`` (argmax with ``keepdim``, ``eq(y.view_as(top_pred))``, divided by the
batch size); ``train`` (``model.train()``, per batch ``zero_grad``, forward, loss, accuracy,
``backward``, ``step``, epoch means of ``loss.item()``/``acc.item()``); ``evaluate``
(``model.eval()``, ``torch.no_grad()``, the same means); the epoch loop that keeps the
state dict with the best validation loss (``torch.save`` to a file; here an in-memory
``copy.deepcopy`` of the ``state_dict``), reloaded before the test evaluation.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train, 360 test)
instead of MNIST, so ``INPUT_DIM = 28 * 28`` is kept; the rotation and the padded crop done
with torch ops on the [0, 1] tensor instead of PIL; 10 epochs as the notebook; CPU; no
progress bars, plots, confusion matrix, PCA/t-SNE, or imagined digits.
Measure only (not in the program): nothing; the variants are measured by the notebook's own
test loss and test accuracy.

nndx, as the author would add it (README): the model returns ``(y_pred, h_2)``, so nndx
gets ``loss_fn = lambda out, y: criterion(out[0], y)``; a preflight ``nndx.probe`` with the
optimizer and the train/valid tensors as ``data`` on the first training batch;
``nndx.Monitor(model, optimizer, every=10)`` around the epoch loop, each batch's loss logged
in ``train`` and each epoch's validation loss and accuracy logged with ``split="val"``;
after training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data as data

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bentrevett_mlp"
SOURCE = Source("bentrevett/pytorch-image-classification", "1_mlp.ipynb",
                "33c9cfdb9097bc65b5800c1996f199f0ba520888", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 upsampled digits, 10 epochs)"),
        Variant(
            "stats_not_scaled",
            "the normalisation statistics are computed on the raw 0..255 pixels without the '/ 255' "
            "(mean ~ 33, std ~ 78) while ToTensor scales the images to [0, 1]: every input becomes "
            "about -0.42 with a spread of ~0.01, so the MLP sees nearly constant inputs",
            (C.UNNORMALIZED_INPUTS,),
            ("https://discuss.pytorch.org/t/normalization-in-the-mnist-example/457",
             "https://stackoverflow.com/questions/63746182/correct-way-of-normalizing-and-scaling-the-mnist-dataset"),
            Measure("test_loss", "test loss (the notebook's evaluate) at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of train(): every backward adds to the gradients of all "
            "earlier batches, and Adam steps along their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch"),
            Measure("test_loss", "test loss (the notebook's evaluate) at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

SEED = 1234
VALID_RATIO = 0.9
BATCH_SIZE = 64
EPOCHS = 10
SIDE = 28


# --------------------------------------------------------------------------- transforms (torch stand-ins)


def random_rotation(img: torch.Tensor, degrees: float) -> torch.Tensor:
    """``transforms.RandomRotation(degrees, fill=(0,))`` on a (1, H, W) tensor."""
    angle = math.radians(random.uniform(-degrees, degrees))
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]])
    grid = F.affine_grid(theta, [1, *img.shape], align_corners=False)
    return F.grid_sample(img.unsqueeze(0), grid, align_corners=False, padding_mode="zeros").squeeze(0)


def random_crop(img: torch.Tensor, size: int, padding: int) -> torch.Tensor:
    """``transforms.RandomCrop(size, padding=padding)`` on a (1, H, W) tensor."""
    padded = F.pad(img, (padding, padding, padding, padding))
    i = random.randint(0, padded.shape[1] - size)
    j = random.randint(0, padded.shape[2] - size)
    return padded[:, i:i + size, j:j + size]


class Compose:
    def __init__(self, fns) -> None:
        self.fns = fns

    def __call__(self, x):
        for fn in self.fns:
            x = fn(x)
        return x


def normalize(mean: float, std: float):
    return lambda x: (x - mean) / std


class DigitImages(data.Dataset):
    """MNIST's shape: ``.data`` holds uint8 pixels; ``transform`` is applied per item to the
    image as ToTensor would see it (here the upsampled [0, 1] image)."""

    def __init__(self, raw: torch.Tensor, targets: torch.Tensor, transform=None) -> None:
        self.data = digits.upscaled(raw, SIDE).mul(255).round().to(torch.uint8).squeeze(1)
        self.targets = targets
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        img = self.data[i].float().div(255).unsqueeze(0)  # ToTensor
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[i])


# --------------------------------------------------------------------------- the notebook


class MLP(nn.Module):
    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.input_fc = nn.Linear(input_dim, 250)
        self.hidden_fc = nn.Linear(250, 100)
        self.output_fc = nn.Linear(100, output_dim)

    def forward(self, x):
        batch_size = x.shape[0]
        x = x.view(batch_size, -1)
        h_1 = F.relu(self.input_fc(x))
        h_2 = F.relu(self.hidden_fc(h_1))
        y_pred = self.output_fc(h_2)
        return y_pred, h_2


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def calculate_accuracy(y_pred, y):
    top_pred = y_pred.argmax(1, keepdim=True)
    correct = top_pred.eq(y.view_as(top_pred)).sum()
    acc = correct.float() / y.shape[0]
    return acc


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(SEED + seed)
    np.random.seed(SEED + seed)
    torch.manual_seed(SEED + seed)

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_data = DigitImages(tr_raw, tr_y)
    if variant == "stats_not_scaled":
        mean = train_data.data.float().mean()
        std = train_data.data.float().std()
    else:
        mean = train_data.data.float().mean() / 255
        std = train_data.data.float().std() / 255
    mean, std = float(mean), float(std)

    train_transforms = Compose([lambda x: random_rotation(x, 5), lambda x: random_crop(x, SIDE, 2),
                                normalize(mean, std)])  # fmt: skip
    test_transforms = Compose([normalize(mean, std)])
    train_data = DigitImages(tr_raw, tr_y, transform=train_transforms)
    test_data = DigitImages(te_raw, te_y, transform=test_transforms)

    n_train_examples = int(len(train_data) * VALID_RATIO)
    n_valid_examples = len(train_data) - n_train_examples
    train_data, valid_data = data.random_split(train_data, [n_train_examples, n_valid_examples])
    valid_data = copy.deepcopy(valid_data)
    valid_data.dataset.transform = test_transforms

    train_iterator = data.DataLoader(train_data, shuffle=True, batch_size=BATCH_SIZE)
    valid_iterator = data.DataLoader(valid_data, batch_size=BATCH_SIZE)
    test_iterator = data.DataLoader(test_data, batch_size=BATCH_SIZE)

    INPUT_DIM = SIDE * SIDE
    OUTPUT_DIM = 10
    model = MLP(INPUT_DIM, OUTPUT_DIM)
    n_params = count_parameters(model)
    optimizer = optim.Adam(model.parameters())
    criterion = nn.CrossEntropyLoss()

    # nndx, as the author adds it
    def nndx_loss(out, y):
        return criterion(out[0], y)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        rstate = random.getstate()
        probe_batch = next(iter(data.DataLoader(train_data, shuffle=True, batch_size=BATCH_SIZE)))
        random.setstate(rstate)

    def stack(ds):
        xs, ys = zip(*[ds[i] for i in range(len(ds))])
        return torch.stack(xs), torch.tensor(ys)

    if nx.enabled:
        with torch.random.fork_rng():
            rstate = random.getstate()
            x_tr, y_tr = stack(train_data)
            x_va, y_va = stack(valid_data)
            random.setstate(rstate)
        splits = (x_tr, y_tr, x_va, y_va)
    else:
        splits = None
    nx.preflight(model, probe_batch, nndx_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    def train_epoch(model, iterator, optimizer, criterion):
        epoch_loss = 0
        epoch_acc = 0
        model.train()
        for (x, y) in iterator:
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            y_pred, _ = model(x)
            loss = criterion(y_pred, y)
            acc = calculate_accuracy(y_pred, y)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            epoch_loss += loss.item()
            epoch_acc += acc.item()
        return epoch_loss / len(iterator), epoch_acc / len(iterator)

    def evaluate(model, iterator, criterion):
        epoch_loss = 0
        epoch_acc = 0
        model.eval()
        with torch.no_grad():
            for (x, y) in iterator:
                y_pred, _ = model(x)
                loss = criterion(y_pred, y)
                acc = calculate_accuracy(y_pred, y)
                epoch_loss += loss.item()
                epoch_acc += acc.item()
        return epoch_loss / len(iterator), epoch_acc / len(iterator)

    best_valid_loss = float("inf")
    best_state = None
    train_loss = valid_loss = valid_acc = float("nan")
    for _epoch in range(EPOCHS):
        train_loss, train_acc = train_epoch(model, train_iterator, optimizer, criterion)
        valid_loss, valid_acc = evaluate(model, valid_iterator, criterion)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), 'tut1-model.pt')

    nx.finish(mon, model, probe_batch, nndx_loss, optimizer=optimizer, data=splits)

    model.load_state_dict(best_state)
    test_loss, test_acc = evaluate(model, test_iterator, criterion)
    return {"test_loss": test_loss, "test_acc": test_acc * 100, "best_valid_loss": best_valid_loss,
            "last_train_loss": train_loss, "last_valid_acc": valid_acc * 100, "n_params": n_params}  # fmt: skip
