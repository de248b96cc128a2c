"""Port of moskomule's ewc.pytorch: Elastic Weight Consolidation (Kirkpatrick et al. 2017) on
permuted MNIST, tasks learned one after another by one MLP with plain SGD.

Source: github.com/moskomule/ewc.pytorch, ``utils.py``, ``data.py`` and ``demo.ipynb`` at commit
c846fc6c7929963df241c402e2f3998f7f22b975 (the repository's HEAD; no licence stated: the
repository has no LICENSE file). Written anew from the facts of those files; no code copied.

Kept: ``PermutedMNIST`` (each image flattened, its pixels reordered by the task's
``permute_idx``, divided by 255; ``get_sample`` draws ``sample_size`` training images with
``random.sample``); ``get_permute_mnist``: task 0 the identity order, each later task a
``random.shuffle`` of the previous order, train and test sets of a task permuted alike; the
demo's ``MLP``: ``fc1``..``fc4`` ``nn.Linear`` layers with ``F.relu`` after every one of them,
the class scores included (as published); ``EWC``: ``params`` = the model's trainable
parameters, ``_diag_fisher`` (a zeroed deep copy of each parameter, ``model.eval()``, for each
stored old-task image alone: ``model.zero_grad()``, ``output = model(input).view(1, -1)``, the
label the model predicts, ``F.nll_loss(F.log_softmax(output, dim=1), label)``, backward, each
parameter's squared gradient divided by the sample count added to its precision), the means
taken from a deep copy of the parameters after the Fisher pass, ``penalty`` = sum over
parameters of ``precision * (p - mean) ** 2``; ``normal_train`` / ``ewc_train``
(``model.train()``, per batch ``optimizer.zero_grad()``, ``F.cross_entropy`` plus, for
``ewc_train``, ``importance * ewc.penalty(model)``, backward, step; the mean batch loss);
``test`` (``model.eval()``, argmax of the softmax, the fraction correct); ``ewc_process`` with
``weight=None`` (as the notebook's last call runs it): one ``optim.SGD(model.parameters(),
lr)``, task 0 by ``normal_train`` for ``epochs`` epochs, each later task by ``ewc_train`` with
``EWC(model, old_tasks)`` built anew every epoch (as the notebook does) on ``sample_size``
images drawn from the earlier tasks' training sets; after each epoch ``test`` on every task
seen so far; ``importance=1000``, ``batch_size=128``, ``sample_size=200``, ``hidden_size=200``,
``num_task=3``.
Shrunk: scikit-learn's 8x8 digits resized to 28x28 (784 pixels as the notebook's layers expect;
1,437 training and 360 test images, as 0..255 bytes) instead of MNIST (60,000 / 10,000); 12 epochs per task instead of
50 (12 batches an epoch instead of 469); SGD's ``lr`` 0.05 instead of 1e-3 (about 140 steps a
task instead of 23,450) and, so that the penalty's pull per step (``lr * importance``) stays
the notebook's, ``importance`` 20 instead of 1,000; ``sample_size`` 100 instead of 200 (100
per-image backward passes each epoch); the train loader in the main process
(``num_workers=0`` instead of 4: no worker processes on this machine). No plots, no tqdm.
Changed: the notebook's ``F.relu`` on ``fc4``'s output (the class scores) is dropped: with it
this shrunk run's class scores die (task 0 reached 0.45 and later tasks collapsed to all-zero
scores, loss ln 10); without it task 0 reaches about 0.69 and task 2 about 0.85. At the
notebook's ``importance * lr`` (here 20 at lr 0.05) the EWC penalty is stable; at 80 or more
it diverges to NaN.
Measure only (not in the program): the test accuracy of every task after the last task, as
the notebook's ``acc`` lists end.

nndx, as the author would add it: one optimizer trains all tasks, so one
``nndx.Monitor(model, optimizer)`` around the whole ``ewc_process`` (the Fisher passes run
inside it, as they do inside the loop), each batch's loss (cross entropy plus the penalty)
logged; a preflight ``nndx.probe`` on task 0's first batch with ``F.cross_entropy`` and the
optimizer before training; after the last task ``nndx.probe(..., monitor=mon)`` on the last
task's first batch, ``F.cross_entropy`` again (the penalty needs the EWC object, which a
``loss_fn(output, target)`` does not get), and ``nndx.diagnose``.
"""

from __future__ import annotations

import random
from copy import deepcopy

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ewc"
SOURCE = Source("moskomule/ewc.pytorch", "utils.py", "c846fc6c7929963df241c402e2f3998f7f22b975",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the demo's ewc_process as published (shrunk: 8x8 digits, 12 epochs a task, lr 0.05)"),
        Variant(
            "means_not_copied",
            "EWC stores its means as the live parameters' .data (no deepcopy/clone): the anchors move with the "
            "weights, p - mean is always 0, the penalty is 0 and EWC silently does nothing (plain fine-tuning)",
            (C.WRONG_LOSS,),
            ("https://github.com/ContinualAI/avalanche/issues/1099",
             "https://github.com/ContinualAI/avalanche/issues/728",
             "https://github.com/ContinualAI/avalanche/issues/697"),
            Measure("ewc_penalty", "the mean importance * penalty over the EWC batches is 0 (below 1e-6) while the "
                    "healthy run's is above 1e-4 (in this shrunk run the published EWC, re-anchored every epoch, "
                    "does not measurably protect task 0 either, so task 0's accuracy is no measure)",
                    lambda healthy, buggy: healthy > 1e-4 and buggy < 1e-6),
        ),
        Variant(
            "permutation_per_worker",
            "the pixel permutation drawn at run time by each of the train loader's 4 workers (and again by every "
            "epoch's new workers, and by the test loader) instead of once per task: the same task's batches come "
            "in 4 different pixel orders, none the test set's",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED),
            ("https://github.com/aimagelab/mammoth/issues/38",),
            Measure("mean_accuracy", "mean test accuracy over the tasks after the last task at least 0.2 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

EPOCHS, LR, BATCH_SIZE, SAMPLE_SIZE, HIDDEN_SIZE, NUM_TASK, IMPORTANCE = 12, 0.05, 128, 100, 200, 3, 20.0
PENALTIES: list[float] = []  # measure only: importance * penalty of every EWC batch
WORKERS = 4  # the notebook's train loaders' num_workers (simulated by the permutation_per_worker bug)


# --------------------------------------------------------------------------- data.py


def to_28x28(images: torch.Tensor) -> torch.Tensor:
    """The 8x8 digits resized to MNIST's 28x28, back as 0..255 bytes (what MNIST's files hold)."""
    return (digits.upscaled(images, 28).squeeze(1) * 255).round().to(torch.uint8)


class PermutedMNIST(Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, train: bool = True,
                 permute_idx: list[int] | None = None) -> None:  # fmt: skip
        assert len(permute_idx) == images[0].numel()
        self.train = train
        self.data = torch.stack([img.float().view(-1)[permute_idx] / 255 for img in images])
        self.targets = labels

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.data[index], self.targets[index]

    def get_sample(self, sample_size: int) -> list[torch.Tensor]:
        sample_idx = random.sample(range(len(self)), sample_size)
        return [img for img in self.data[sample_idx]]


class RuntimePermutedMNIST(PermutedMNIST):
    """The bug: a permutation transform whose order is drawn when a loader process first
    uses it, not when the task is made (each worker, every epoch, draws its own)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, train: bool = True,
                 permute_idx: list[int] | None = None) -> None:  # fmt: skip
        super().__init__(images, labels, train, list(range(images[0].numel())))
        self.raw = self.data  # unpermuted pixels in 0..1; permuted per "worker" below

    def permuted(self, index, perm: torch.Tensor):
        return self.raw[index][:, perm], self.targets[index]


def load_loader(dataset: PermutedMNIST, batch_size: int, shuffle: bool, workers: int, bug: bool,
                generator: torch.Generator):  # fmt: skip
    """A DataLoader's batches; with the runtime-permutation bug each of ``workers`` worker
    processes (round-robin over the batches, as DataLoader hands them out) draws its own order."""
    n = len(dataset)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if not bug:
        return [dataset[idx] for idx in batches]
    pixels = dataset.raw.shape[1]
    perms = [torch.randperm(pixels, generator=generator) for _ in range(max(workers, 1))]
    return [dataset.permuted(idx, perms[i % len(perms)]) for i, idx in enumerate(batches)]


# --------------------------------------------------------------------------- demo.ipynb: the model


class MLP(nn.Module):
    def __init__(self, input_size: int = 64, hidden_size: int = 400) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.fc3 = nn.Linear(hidden_size, hidden_size)
        self.fc4 = nn.Linear(hidden_size, 10)

    def forward(self, input):
        x = F.relu(self.fc1(input))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        x = self.fc4(x)  # the notebook has F.relu here too: dropped, see the docstring
        return x


# --------------------------------------------------------------------------- utils.py


class EWC:
    def __init__(self, model: nn.Module, dataset: list, means_copied: bool = True) -> None:
        self.model = model
        self.dataset = dataset
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self._means = {}
        self._precision_matrices = self._diag_fisher()
        if means_copied:
            for n, p in deepcopy(self.params).items():
                self._means[n] = p.data
        else:  # the bug: the live parameters' storage, not a copy
            for n, p in self.params.items():
                self._means[n] = p.data

    def _diag_fisher(self) -> dict[str, torch.Tensor]:
        precision_matrices = {}
        for n, p in deepcopy(self.params).items():
            p.data.zero_()
            precision_matrices[n] = p.data
        self.model.eval()
        for input in self.dataset:
            self.model.zero_grad()
            output = self.model(input).view(1, -1)
            label = output.max(1)[1].view(-1)
            loss = F.nll_loss(F.log_softmax(output, dim=1), label)
            loss.backward()
            for n, p in self.model.named_parameters():
                precision_matrices[n].data += p.grad.data ** 2 / len(self.dataset)
        return {n: p for n, p in precision_matrices.items()}

    def penalty(self, model: nn.Module):
        loss = 0
        for n, p in model.named_parameters():
            _loss = self._precision_matrices[n] * (p - self._means[n]) ** 2
            loss += _loss.sum()
        return loss


def normal_train(model, optimizer, data_loader, mon, nx: Nndx) -> float:
    model.train()
    epoch_loss = 0.0
    for input, target in data_loader:
        optimizer.zero_grad()
        output = model(input)
        loss = F.cross_entropy(output, target)
        epoch_loss += loss.item()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
    return epoch_loss / len(data_loader)


def ewc_train(model, optimizer, data_loader, ewc: EWC, importance: float, mon, nx: Nndx) -> float:
    model.train()
    epoch_loss = 0.0
    for input, target in data_loader:
        optimizer.zero_grad()
        output = model(input)
        penalty = importance * ewc.penalty(model)
        loss = F.cross_entropy(output, target) + penalty
        epoch_loss += loss.item()
        PENALTIES.append(float(penalty))  # measure only
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
    return epoch_loss / len(data_loader)


@torch.no_grad()
def test(model, data_loader, n: int) -> float:
    model.eval()
    correct = 0
    for input, target in data_loader:
        output = model(input)
        correct += (F.softmax(output, dim=1).max(dim=1)[1] == target).sum().item()
    return correct / n


# --------------------------------------------------------------------------- demo.ipynb: ewc_process


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    torch.manual_seed(seed)
    PENALTIES.clear()
    loader_gen = torch.Generator().manual_seed(seed + 1)
    bug_perm = variant == "permutation_per_worker"
    x_train, y_train, x_test, y_test = digits.digit_images(seed)
    x_train, x_test = to_28x28(x_train), to_28x28(x_test)

    # get_permute_mnist
    dataset_cls = RuntimePermutedMNIST if bug_perm else PermutedMNIST
    train_sets, test_sets = {}, {}
    idx = list(range(x_train[0].numel()))
    for i in range(NUM_TASK):
        train_sets[i] = dataset_cls(x_train, y_train, train=True, permute_idx=idx)
        test_sets[i] = dataset_cls(x_test, y_test, train=False, permute_idx=idx)
        random.shuffle(idx)

    def train_loader(task: int):
        return load_loader(train_sets[task], BATCH_SIZE, False, WORKERS, bug_perm, loader_gen)

    def test_loader(task: int):  # num_workers=0: the main process draws its order once and keeps it
        return load_loader(test_sets[task], BATCH_SIZE, False, 1, bug_perm,
                           torch.Generator().manual_seed(seed * 100 + 50 + task))  # fmt: skip

    model = MLP(x_train[0].numel(), HIDDEN_SIZE)
    optimizer = optim.SGD(params=model.parameters(), lr=LR)

    first = train_loader(0)[0]
    nx.preflight(model, first, F.cross_entropy, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    loss, acc = {}, {}
    for task in range(NUM_TASK):
        loss[task] = []
        acc[task] = []
        if task == 0:
            for _ in range(EPOCHS):
                loss[task].append(normal_train(model, optimizer, train_loader(task), mon, nx))
                acc[task].append(test(model, test_loader(task), len(test_sets[task])))
        else:
            old_tasks = []
            for sub_task in range(task):
                old_tasks = old_tasks + train_sets[sub_task].get_sample(SAMPLE_SIZE)
            old_tasks = random.sample(old_tasks, k=SAMPLE_SIZE)
            for _ in range(EPOCHS):
                ewc = EWC(model, old_tasks, means_copied=variant != "means_not_copied")
                loss[task].append(ewc_train(model, optimizer, train_loader(task), ewc, IMPORTANCE, mon, nx))
                for sub_task in range(task + 1):
                    acc[sub_task].append(test(model, test_loader(sub_task), len(test_sets[sub_task])))

    last = train_loader(NUM_TASK - 1)[0]
    nx.finish(mon, model, last, F.cross_entropy, optimizer=optimizer)
    final = [acc[t][-1] for t in range(NUM_TASK)]
    out = {f"task{t}_accuracy": final[t] for t in range(NUM_TASK)}
    out.update(mean_accuracy=float(np.mean(final)), ewc_penalty=float(np.mean(PENALTIES)), task0_accuracy_before=acc[0][EPOCHS - 1],
               final_loss=loss[NUM_TASK - 1][-1])  # fmt: skip
    return out
