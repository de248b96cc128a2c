"""Port of adambielski/siamese-triplet: an embedding CNN trained with online triplet mining.

Source: github.com/adambielski/siamese-triplet, ``networks.py``, ``losses.py``,
``utils.py``, ``trainer.py`` and ``datasets.py`` (``BalancedBatchSampler``) at commit
0c719f9e8f59fa386e8c59d10b2ddde9fac46276, with the settings of the "online triplet"
cells of ``Experiments_MNIST.ipynb`` (BSD-3-Clause, Copyright (c) 2019 Adam Bielski).
Written anew from the facts of those files; no code copied.

Kept: ``EmbeddingNet`` (``Conv2d(1, 32, 5)``, PReLU, 2x2 max-pool, ``Conv2d(32, 64, 5)``,
PReLU, 2x2 max-pool, flatten, ``Linear -> PReLU -> Linear(256, 256) -> PReLU ->
Linear(256, 2)``: a 2-d embedding), used directly as the model; ``pdist`` (the squared
distance matrix ``-2 x x^T + |x|^2 + |x|^2^T``); ``FunctionNegativeTripletSelector`` with
``random_hard_negative`` (``RandomNegativeTripletSelector(margin)``, the notebook's
choice): for each class of the batch with two or more samples, every anchor-positive
pair (``itertools.combinations``), the loss values ``d(a, p) - d(a, n) + margin`` over
the batch's negatives, one negative drawn among those with a positive value (none: the
pair is skipped), one fallback triplet when nothing is found; ``OnlineTripletLoss``
(squared distances, ``relu(ap - an + margin)``, returns ``(mean, n_triplets)``);
``BalancedBatchSampler`` (``n_classes`` classes drawn without replacement per batch,
``n_samples`` of each read from a per-class shuffled index list, reshuffled when it runs
out, batches while ``count + batch_size < n_dataset``); ``trainer.fit``:
``scheduler.step()`` at the top of each epoch (the repository's order), ``train_epoch``
(``model.train()``, ``optimizer.zero_grad()``, forward, ``loss_fn(*outputs, target)``,
the loss the first element of the tuple, ``backward``, ``step``,
``AverageNonzeroTripletsMetric``, the log line every ``log_interval`` batches, kept as a
record), ``test_epoch`` (``model.eval()``, ``no_grad``, the same loss over the test
sampler's batches, divided by their number); margin 1.0, ``Adam(lr=1e-3,
weight_decay=1e-4)``, ``StepLR(8, gamma=0.1)``, 20 epochs; the transforms ``ToTensor``
+ ``Normalize((0.1307,), (0.3081,))``; ``extract_embeddings`` under ``model.eval()``.
Shrunk: scikit-learn's 8x8 digits resized to 28x28 (1,437 train / 360 test) instead of
MNIST; ``n_samples`` 10 instead of 25 (batches of 100: 10 classes x 10); 6 epochs with
``StepLR(3)`` instead of 20 with 8 (a third of them at the full lr, as there); no CUDA, no plots.
Measure only (not in the program, which plots the embeddings): the held-out k-NN (k=1)
accuracy of the test embeddings against the training embeddings (both from
``extract_embeddings``), and the mean pairwise distance of the test embeddings (0 when
they collapse to one point).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first balanced batch
with the online triplet loss (its mean, the first element of the tuple) as the loss
function and the optimizer; ``nndx.Monitor(model, optimizer)`` around ``fit`` with that
loss called as ``mon.loss_fn``, each batch's loss logged and each ``test_epoch``'s loss
logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "triplet_loss"
SOURCE = Source("adambielski/siamese-triplet", "trainer.py", "0c719f9e8f59fa386e8c59d10b2ddde9fac46276",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (online triplet loss, random hard negatives, shrunk)"),
        Variant(
            "lr_too_high",
            "Adam's lr 1e-1 instead of 1e-3: the embedding's scale runs away (squared distances in the millions, "
            "the triplet loss with them) and the classes mix in the 2-d embedding",
            (C.LR_TOO_HIGH,),
            ("https://github.com/adambielski/siamese-triplet/issues/62",
             "https://github.com/omoindrot/tensorflow-triplet-loss/issues/14",
             "https://github.com/omoindrot/tensorflow-triplet-loss/issues/18",
             "https://github.com/omoindrot/tensorflow-triplet-loss/issues/38",
             "https://github.com/VisualComputingInstitute/triplet-reid/issues/30"),
            Measure("knn_acc", "held-out 1-NN accuracy of the embeddings at least 0.1 below the healthy run's: "
                    "0.358 against 0.864 healthy on seed 0 (train loss 1.6e7, embedding spread 7,275 against 3.1)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() dropped from train_epoch: every step applies the sum of all gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://github.com/pytorch/pytorch/issues/13045"),
            Measure("knn_acc", "held-out 1-NN accuracy of the embeddings at least 0.05 below the healthy run's: "
                    "0.544 against 0.864 healthy on seed 0 (train loss 1.57 against 0.85)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIDE, MEAN, STD = 28, 0.1307, 0.3081
ARGS = {"margin": 1.0, "lr": 1e-3, "weight_decay": 1e-4, "step_size": 3, "gamma": 0.1, "n_epochs": 6,
        "n_classes": 10, "n_samples": 10, "log_interval": 5}  # fmt: skip


# --------------------------------------------------------------------------- networks.py


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convnet = nn.Sequential(nn.Conv2d(1, 32, 5), nn.PReLU(), nn.MaxPool2d(2, stride=2),
                                     nn.Conv2d(32, 64, 5), nn.PReLU(), nn.MaxPool2d(2, stride=2))  # fmt: skip
        self.fc = nn.Sequential(nn.Linear(64 * 4 * 4, 256), nn.PReLU(), nn.Linear(256, 256), nn.PReLU(),
                                nn.Linear(256, 2))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.convnet(x)
        return self.fc(out.view(out.size(0), -1))

    def get_embedding(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


# --------------------------------------------------------------------------- utils.py, losses.py


def pdist(vectors: torch.Tensor) -> torch.Tensor:
    sq = vectors.pow(2).sum(dim=1)
    return -2 * vectors.mm(vectors.t()) + sq.view(1, -1) + sq.view(-1, 1)


def random_hard_negative(loss_values: np.ndarray):
    hard = np.where(loss_values > 0)[0]
    return np.random.choice(hard) if len(hard) > 0 else None


class FunctionNegativeTripletSelector:
    def __init__(self, margin: float, negative_selection_fn) -> None:
        self.margin, self.negative_selection_fn = margin, negative_selection_fn

    def get_triplets(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        distance_matrix = pdist(embeddings.detach())
        labels_np = labels.numpy()
        triplets = []
        anchor_positive = negative_indices = None
        for label in sorted(set(labels_np.tolist())):
            mask = labels_np == label
            label_indices = np.where(mask)[0]
            if len(label_indices) < 2:
                continue
            negative_indices = np.where(~mask)[0]
            anchor_positives = np.array(list(combinations(label_indices, 2)))
            ap_distances = distance_matrix[anchor_positives[:, 0], anchor_positives[:, 1]]
            neg = torch.from_numpy(negative_indices)
            all_loss = (ap_distances.view(-1, 1) - distance_matrix[torch.from_numpy(anchor_positives[:, 0])][:, neg]
                        + self.margin).numpy()  # fmt: skip
            for anchor_positive, loss_values in zip(anchor_positives, all_loss):
                hard_negative = self.negative_selection_fn(loss_values)
                if hard_negative is not None:
                    triplets.append([anchor_positive[0], anchor_positive[1], negative_indices[hard_negative]])
        if not triplets:
            triplets.append([anchor_positive[0], anchor_positive[1], negative_indices[0]])
        return torch.LongTensor(np.array(triplets))


def RandomNegativeTripletSelector(margin: float) -> FunctionNegativeTripletSelector:  # noqa: N802 - the source's name
    return FunctionNegativeTripletSelector(margin, random_hard_negative)


class OnlineTripletLoss(nn.Module):
    def __init__(self, margin: float, triplet_selector: FunctionNegativeTripletSelector) -> None:
        super().__init__()
        self.margin, self.triplet_selector = margin, triplet_selector

    def forward(self, embeddings: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
        triplets = self.triplet_selector.get_triplets(embeddings, target)
        ap = (embeddings[triplets[:, 0]] - embeddings[triplets[:, 1]]).pow(2).sum(1)
        an = (embeddings[triplets[:, 0]] - embeddings[triplets[:, 2]]).pow(2).sum(1)
        return F.relu(ap - an + self.margin).mean(), len(triplets)


# --------------------------------------------------------------------------- datasets.py


class BalancedBatchSampler:
    """n_classes classes per batch, n_samples of each."""

    def __init__(self, labels: torch.Tensor, n_classes: int, n_samples: int) -> None:
        self.labels = labels
        self.labels_set = sorted(set(labels.numpy().tolist()))
        self.label_to_indices = {c: np.where(labels.numpy() == c)[0] for c in self.labels_set}
        for c in self.labels_set:
            np.random.shuffle(self.label_to_indices[c])
        self.used = {c: 0 for c in self.labels_set}
        self.n_classes, self.n_samples = n_classes, n_samples
        self.n_dataset, self.batch_size = len(labels), n_classes * n_samples

    def __iter__(self):
        count = 0
        while count + self.batch_size < self.n_dataset:
            classes = np.random.choice(self.labels_set, self.n_classes, replace=False)
            indices: list[int] = []
            for c in classes:
                start = self.used[c]
                indices.extend(self.label_to_indices[c][start : start + self.n_samples].tolist())
                self.used[c] += self.n_samples
                if self.used[c] + self.n_samples > len(self.label_to_indices[c]):
                    np.random.shuffle(self.label_to_indices[c])
                    self.used[c] = 0
            yield indices
            count += self.batch_size

    def __len__(self) -> int:
        return self.n_dataset // self.batch_size


# --------------------------------------------------------------------------- the notebook + trainer.py


def extract_embeddings(images: torch.Tensor, model: nn.Module, batch_size: int = 256) -> np.ndarray:
    with torch.no_grad():
        model.eval()
        return np.concatenate([model.get_embedding(images[i : i + batch_size]).numpy()
                               for i in range(0, len(images), batch_size)])  # fmt: skip


def knn1_accuracy(train_emb: np.ndarray, train_y: np.ndarray, test_emb: np.ndarray, test_y: np.ndarray) -> float:
    d = ((test_emb[:, None, :] - train_emb[None, :, :]) ** 2).sum(-1)
    return float(np.mean(train_y[d.argmin(1)] == test_y))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    if variant == "lr_too_high":
        args["lr"] = 1e-1
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train = (data.upscaled(train_raw, SIDE) - MEAN) / STD  # ToTensor(), Normalize((mean,), (std,))
    x_test = (data.upscaled(test_raw, SIDE) - MEAN) / STD

    train_batch_sampler = BalancedBatchSampler(train_labels, args["n_classes"], args["n_samples"])
    test_batch_sampler = BalancedBatchSampler(test_labels, args["n_classes"], args["n_samples"])

    model = EmbeddingNet()
    loss_fn = OnlineTripletLoss(args["margin"], RandomNegativeTripletSelector(args["margin"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"], weight_decay=args["weight_decay"])
    scheduler = lr_scheduler.StepLR(optimizer, args["step_size"], gamma=args["gamma"], last_epoch=-1)

    last_count: list[int] = [0]

    def triplet_loss(embeddings: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss_outputs = loss_fn(embeddings, target)
        last_count[0] = loss_outputs[1]  # for AverageNonzeroTripletsMetric
        return loss_outputs[0]  # the trainer's loss_outputs[0]

    probe_idx = torch.tensor(next(iter(BalancedBatchSampler(train_labels, args["n_classes"], args["n_samples"]))))
    first_batch = (x_train[probe_idx], train_labels[probe_idx])
    nx.preflight(model, first_batch, triplet_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=triplet_loss)

    log: list[str] = []
    nonzero: list[float] = []

    def train_epoch() -> float:
        model.train()
        losses, total_loss, n_batches = [], 0.0, 0
        for batch_idx, indices in enumerate(train_batch_sampler):
            idx = torch.tensor(indices)
            images, target = x_train[idx], train_labels[idx]
            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            outputs = model(images)
            loss = mon.loss_fn(outputs, target)
            losses.append(loss.item())
            total_loss += loss.item()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            nonzero.append(last_count[0])
            if batch_idx % args["log_interval"] == 0:
                log.append(f"Train: [{batch_idx}]\tLoss: {np.mean(losses):.6f}\tAverage nonzero triplets: "
                           f"{np.mean(nonzero):.1f}")
                losses = []
            n_batches += 1
        return total_loss / max(1, n_batches)

    def test_epoch() -> float:
        with torch.no_grad():
            model.eval()
            val_loss, n_batches = 0.0, 0
            for indices in test_batch_sampler:
                idx = torch.tensor(indices)
                val_loss += loss_fn(model(x_test[idx]), test_labels[idx])[0].item()
                n_batches += 1
        return val_loss / max(1, n_batches)

    train_loss = val_loss = float("nan")
    for _epoch in range(args["n_epochs"]):
        scheduler.step()  # trainer.fit steps it before each epoch (the pre-1.1 order)
        train_loss = train_epoch()
        val_loss = test_epoch()
        nx.timed(lambda: mon.log(val_loss, split="val"))

    nx.finish(mon, model, first_batch, triplet_loss, optimizer=optimizer)
    train_emb = extract_embeddings(x_train, model)
    test_emb = extract_embeddings(x_test, model)
    spread = float(np.sqrt(((test_emb[:, None] - test_emb[None]) ** 2).sum(-1)).mean())
    return {"knn_acc": knn1_accuracy(train_emb, train_labels.numpy(), test_emb, test_labels.numpy()),
            "train_loss": train_loss, "val_loss": val_loss, "embedding_spread": spread,
            "nonzero_triplets": float(np.mean(nonzero[-5:]))}  # fmt: skip
