"""Port of manzilzaheer/DeepSets ``PointClouds``: point-cloud classification with a
permutation-invariant Deep Sets network (equivariant ``x - max(x)`` layers, max pooling, rho).

Source: github.com/manzilzaheer/DeepSets, ``PointClouds/run.py``, ``PointClouds/classifier.py``
and ``PointClouds/modelnet.py`` at commit 8b90fe08af08a5e3bb03b18e0ca162faa48ec4fd (Apache-2.0,
Copyright the DeepSets authors). Written anew from the facts of those files; no code copied.

Kept: ``PermEqui1_max`` (a ``Linear`` ``Gamma`` applied to ``x - max over the set of x``);
``DTanh`` built as ``run.py`` builds it (``pool='max1'``): ``phi`` = three ``PermEqui1_max``
layers each followed by ``Tanh``, the set pooled by ``max`` over its elements, ``ro`` =
``Dropout(0.5)``, ``Linear(d, d)``, ``Tanh``, ``Dropout(0.5)``, ``Linear(d, classes)``;
``nn.CrossEntropyLoss``; ``Adam(lr=1e-3, weight_decay=1e-7, eps=1e-3)``; ``MultiStepLR``
(milestones every 400 epochs of 1000, gamma 0.1) stepped once per epoch; the hand-written
``clip_grad(D, 5)`` (the global L2 norm of every gradient, all scaled by ``5 / (norm +
1e-6)`` when that is below 1) between ``backward`` and ``step``; ``ModelFetcher``: a fixed
random subset of the points chosen once (``permutation(...)[::down_sample]``) for training,
every ``down_sample``-th point from index 1 for testing, the train set reshuffled every epoch
by shuffling the clouds, restoring the NumPy RNG state and shuffling the labels with the same
draw, batches taken ``while end < N`` (so the last batch is always dropped),
``standardize`` (each cloud clipped to 100x its mean absolute coordinate, minus its mean,
divided by its std) on train and test, ``augment`` on train only (a rotation about z by
U(-0.1, 0.1)*pi and a per-axis scale U(0.8, 1.25)); the train loop (``D.train()``, per batch
``zero_grad``, forward, loss, train accuracy counted, ``backward``, ``clip_grad``, ``step``);
``test`` (``D.eval()``, argmax accuracy over the test batches).
Shrunk: synthetic point clouds of five shape classes (sphere, cube surface, cylinder, cone,
torus; random size, aspect, orientation about z and offset, in raw "mesh" units of tens)
with 256 points each instead of ModelNet40's 10,000-point clouds of 40 classes; 640 train /
320 test clouds; ``down_sample`` 4 (64 points) instead of 10; ``network_dim`` 64 instead of
256; 60 epochs with milestones every 24 instead of 1000 with 400; one repeat instead of five;
no tqdm; CPU.
Measure only: the program's own final test accuracy (``test()``) is the metric; also returned:
the test loss and, as a check, the largest change of the trained net's outputs when the points
of a cloud are permuted (``invariance_gap``, 0 for a permutation-invariant net).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(standardized, as the loop sees it) with the optimizer and the data splits,
``nndx.Monitor(D, optimizer, loss_fn=L)`` around the epochs with the loss computed as
``mon.loss_fn``, each batch's loss and accuracy logged, the final ``test`` logged as
``split="val"`` (its loss and accuracy); then ``nndx.probe(..., monitor=mon)`` on that first
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deepsets"
SOURCE = Source("manzilzaheer/DeepSets", "PointClouds/run.py", "8b90fe08af08a5e3bb03b18e0ca162faa48ec4fd",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (DTanh, pool='max1', standardized and augmented clouds)"),
        Variant(
            "labels_shuffled_apart",
            "ModelFetcher.train_data shuffles the clouds and then the labels without restoring the RNG state "
            "in between: each epoch the labels are permuted independently of the clouds",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/caicloud/tensorflow-tutorial/issues/114",
             "https://github.com/udacity/sdc-issue-reports/issues/1326",
             "https://github.com/amanbasu/ECG-Authentication/issues/3"),
            Measure("test_acc", "final test accuracy at least 0.3 below the healthy run's (chance is 0.2): 0.19 "
                    "against 0.87 on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() moved into the batch loop: MultiStepLR's milestones (every 24 epochs) are passed "
            "after 24 and 48 batches, so the LR is 1e-5 from the sixth epoch on",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/pytorch/vision/issues/1261", "https://github.com/pytorch/vision/issues/8629",
             "https://github.com/bshall/Tacotron/issues/3"),
            Measure("test_acc", "final test accuracy at least 0.1 below the healthy run's: 0.55 against 0.87 "
                    "on seed 0 (train loss 1.52 against 0.41)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

NUM_EPOCHS, BATCH_SIZE, DOWN_SAMPLE, NETWORK_DIM = 60, 64, 4, 64
MILESTONE_EVERY, NUM_CLASSES, NUM_POINTS, N_TRAIN, N_TEST = 24, 5, 256, 640, 320


# --------------------------------------------------------------------------- classifier.py


class PermEqui1Max(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.Gamma = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xm, _ = x.max(1, keepdim=True)
        return self.Gamma(x - xm)


class DTanh(nn.Module):
    def __init__(self, d_dim: int, x_dim: int = 3, num_classes: int = 40) -> None:
        super().__init__()
        self.d_dim, self.x_dim = d_dim, x_dim
        self.phi = nn.Sequential(
            PermEqui1Max(x_dim, d_dim), nn.Tanh(),
            PermEqui1Max(d_dim, d_dim), nn.Tanh(),
            PermEqui1Max(d_dim, d_dim), nn.Tanh(),
        )  # fmt: skip
        self.ro = nn.Sequential(
            nn.Dropout(p=0.5), nn.Linear(d_dim, d_dim), nn.Tanh(), nn.Dropout(p=0.5), nn.Linear(d_dim, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phi_output = self.phi(x)
        pooled, _ = phi_output.max(1)
        return self.ro(pooled)


def clip_grad(model: nn.Module, max_norm: float) -> float:
    total_norm = 0.0
    for p in model.parameters():
        total_norm += float(p.grad.data.norm(2)) ** 2
    total_norm = total_norm**0.5
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1:
        for p in model.parameters():
            p.grad.data.mul_(clip_coef)
    return total_norm


# --------------------------------------------------------------------------- the clouds (ModelNet40 stand-in)


def make_clouds(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` clouds of NUM_POINTS points of five shape classes, in raw mesh units."""
    labels = rng.integers(0, NUM_CLASSES, n)
    clouds = np.empty((n, NUM_POINTS, 3), dtype=np.float32)
    m = NUM_POINTS
    for i, c in enumerate(labels):
        u, v = rng.uniform(0, 1, m), rng.uniform(0, 1, m)
        if c == 0:  # sphere
            p = rng.normal(size=(m, 3))
            p /= np.linalg.norm(p, axis=1, keepdims=True)
        elif c == 1:  # cube surface
            p = rng.uniform(-1, 1, (m, 3))
            axis = rng.integers(0, 3, m)
            p[np.arange(m), axis] = rng.choice([-1.0, 1.0], m)
        elif c == 2:  # cylinder
            t = 2 * np.pi * u
            p = np.stack([np.cos(t), np.sin(t), 2 * v - 1], 1)
        elif c == 3:  # cone
            t = 2 * np.pi * u
            p = np.stack([(1 - v) * np.cos(t), (1 - v) * np.sin(t), 2 * v - 1], 1)
        else:  # torus
            t, s = 2 * np.pi * u, 2 * np.pi * v
            p = np.stack([(1 + 0.4 * np.cos(s)) * np.cos(t), (1 + 0.4 * np.cos(s)) * np.sin(t), 0.4 * np.sin(s)], 1)
        p = p * rng.uniform(0.7, 1.3, 3) + rng.normal(0, 0.02, (m, 3))
        theta = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(theta), -np.sin(theta), 0], [np.sin(theta), np.cos(theta), 0], [0, 0, 1]])
        scale, offset = rng.uniform(10, 40), rng.normal(0, 30, 3)
        clouds[i] = (p @ rot.T) * scale + offset
    return clouds, labels.astype(np.int64)


# --------------------------------------------------------------------------- modelnet.py


def rotate_z(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    theta = np.expand_dims(theta, 1)
    outz = np.expand_dims(x[:, :, 2], 2)
    sin_t, cos_t = np.sin(theta), np.cos(theta)
    xx, yy = np.expand_dims(x[:, :, 0], 2), np.expand_dims(x[:, :, 1], 2)
    return np.concatenate([cos_t * xx - sin_t * yy, sin_t * xx + cos_t * yy, outz], axis=2)


def augment(x: np.ndarray) -> np.ndarray:
    bs = x.shape[0]
    thetas = np.random.uniform(-0.1, 0.1, [bs, 1]) * np.pi
    rotated = rotate_z(thetas, x)
    scale = np.random.rand(bs, 1, 3) * 0.45 + 0.8
    return rotated * scale


def standardize(x: np.ndarray) -> np.ndarray:
    clipper = np.mean(np.abs(x), (1, 2), keepdims=True)
    z = np.clip(x, -100 * clipper, 100 * clipper)
    mean = np.mean(z, (1, 2), keepdims=True)
    std = np.std(z, (1, 2), keepdims=True)
    return (z - mean) / std


class ModelFetcher:
    def __init__(self, clouds, batch_size: int, down_sample: int = 10, do_standardize: bool = True,
                 do_augmentation: bool = False, restore_rng: bool = True) -> None:  # fmt: skip
        self.batch_size, self.down_sample = batch_size, down_sample
        self._train_data, self._train_label, self._test_data, self._test_label = clouds
        self.num_classes = int(np.max(self._train_label)) + 1
        self.prep1 = standardize if do_standardize else (lambda x: x)
        self.prep2 = (lambda x: augment(self.prep1(x))) if do_augmentation else self.prep1
        self.restore_rng = restore_rng
        assert len(self._train_data) > self.batch_size, "Batch size larger than number of training examples"
        self.perm = np.random.permutation(self._train_data.shape[1])[:: self.down_sample]

    def train_data(self):
        rng_state = np.random.get_state()
        np.random.shuffle(self._train_data)
        if self.restore_rng:
            np.random.set_state(rng_state)
        np.random.shuffle(self._train_label)
        return self.next_train_batch()

    def next_train_batch(self):
        start, end, n = 0, self.batch_size, len(self._train_data)
        while end < n:
            yield self.prep2(self._train_data[start:end, self.perm]), self._train_label[start:end]
            start, end = end, end + self.batch_size

    def next_test_batch(self):
        start, end, n = 0, self.batch_size, len(self._test_data)
        while end < n:
            yield self.prep1(self._test_data[start:end, 1 :: self.down_sample]), self._test_label[start:end]
            start, end = end, end + self.batch_size


# --------------------------------------------------------------------------- run.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    rng = np.random.default_rng(seed)
    x_tr, y_tr = make_clouds(N_TRAIN, rng)
    x_te, y_te = make_clouds(N_TEST, rng)
    fetcher = ModelFetcher((x_tr, y_tr, x_te, y_te), BATCH_SIZE, DOWN_SAMPLE,
                           do_standardize=True, do_augmentation=True,
                           restore_rng=variant != "labels_shuffled_apart")  # fmt: skip

    D = DTanh(NETWORK_DIM, num_classes=NUM_CLASSES)  # noqa: N806
    L = nn.CrossEntropyLoss()  # noqa: N806
    optimizer = optim.Adam([{"params": D.parameters()}], lr=1e-3, weight_decay=1e-7, eps=1e-3)
    milestones = list(range(MILESTONE_EVERY, NUM_EPOCHS, MILESTONE_EVERY))
    scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)

    def as_batch(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)

    prep = fetcher.prep1
    first_batch = as_batch(prep(x_tr[:BATCH_SIZE, fetcher.perm]), y_tr[:BATCH_SIZE])
    splits = (torch.tensor(prep(x_tr[:, fetcher.perm]), dtype=torch.float32), torch.tensor(y_tr),
              torch.tensor(prep(x_te[:, 1::DOWN_SAMPLE]), dtype=torch.float32), torch.tensor(y_te))  # fmt: skip
    nx.preflight(D, first_batch, L, optimizer=optimizer, data=splits)
    mon = nx.monitor(D, optimizer, every=5, loss_fn=L)

    # PointCloudTrainer.train
    D.train()
    train_accs, losses = [], []
    for _epoch in range(NUM_EPOCHS):
        counts, sum_acc = 0, 0.0
        for x, y in fetcher.train_data():
            counts += len(y)
            X, Y = as_batch(x, y)  # noqa: N806
            optimizer.zero_grad()
            f_X = D(X)  # noqa: N806
            loss = mon.loss_fn(f_X, Y)
            batch_acc = (f_X.max(dim=1)[1] == Y).float().sum().item()
            sum_acc += batch_acc
            loss.backward()
            clip_grad(D, 5)
            optimizer.step()
            nx.timed(lambda: mon.log(loss, accuracy=batch_acc / len(y)))  # noqa: B023
            losses.append(loss.item())
            if variant == "scheduler_per_batch":
                scheduler.step()
        train_accs.append(sum_acc / counts)
        if variant != "scheduler_per_batch":
            scheduler.step()

    # PointCloudTrainer.test
    D.eval()
    counts, sum_acc, test_loss = 0, 0.0, 0.0
    with torch.no_grad():
        for x, y in fetcher.next_test_batch():
            counts += len(y)
            X, Y = as_batch(x, y)  # noqa: N806
            f_X = D(X)  # noqa: N806
            sum_acc += (f_X.max(dim=1)[1] == Y).float().sum().item()
            test_loss += L(f_X, Y).item() * len(y)
    test_acc, test_loss = sum_acc / counts, test_loss / counts
    nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))

    # permutation invariance of the trained net (a check, not part of the program)
    X, _ = first_batch
    with torch.no_grad():
        shuffled = X[:, torch.randperm(X.shape[1], generator=torch.Generator().manual_seed(seed))]
        invariance_gap = float((D(X) - D(shuffled)).abs().max())
    nx.finish(mon, D, first_batch, L, optimizer=optimizer, data=splits)
    return {
        "test_acc": test_acc,
        "test_loss": test_loss,
        "train_acc": train_accs[-1],
        "last_train_loss": float(np.mean(losses[-10:])),
        "invariance_gap": invariance_gap,
    }
