"""Port of openai/supervised-reptile: Reptile meta-learning for few-shot classification.

Source: github.com/openai/supervised-reptile, ``supervised_reptile/reptile.py``,
``models.py``, ``train.py``, ``eval.py``, ``variables.py``, ``args.py`` and
``run_omniglot.py`` at commit 8f2b71c67a31c1a605ced0cecb76db876b607a7a (the repository's
HEAD) (MIT, Copyright (c) 2017 OpenAI). The original is TensorFlow 1; this is its
algorithm written anew in PyTorch from the facts of those files (no code copied), the
state handling kept: the model's trainable variables exported and imported by value, the
inner optimizer's state carried across meta-steps, the full state (weights and optimizer
state) saved and restored around every evaluation.

Kept: ``OmniglotModel``: four ``conv2d(64, 3, strides=2, padding='same')`` ->
``batch_normalization(training=True)`` (batch statistics always, train and test; TF's eps
1e-3) -> ``relu``, flatten, ``dense(num_classes)``, the summed
``sparse_softmax_cross_entropy_with_logits`` (``minimize`` of the per-example losses),
Adam with ``beta1=0``; ``Reptile.train_step``: export the weights, for each of
``meta_batch_size`` tasks ``_sample_mini_dataset`` (``num_classes`` classes shuffled, each
labelled by its draw position, ``num_shots`` samples each), ``_mini_batches`` without
replacement (the samples reshuffled every pass), one ``minimize`` per mini-batch, export
the adapted weights, import the old ones; then ``interpolate_vars(old, average(new),
meta_step_size)``; ``Reptile.evaluate``: a task of ``num_shots + 1`` shots split by
``_split_train_test`` (one per class held out), the full state exported, ``inner_iters``
steps on the train part, non-transductive predictions (each test sample predicted in a
batch with the whole train part, its batch statistics), the full state imported back;
``train``: ``cur_meta_step_size = frac_done * meta_step_size_final + (1 - frac_done) *
meta_step_size``, an evaluation on a train and a test task every ``eval_interval`` steps;
``weight_decay_rate`` 1 (a no-op) left out. The 1-shot 5-way Omniglot command of the README:
``--shots 1 --train-shots 10 --inner-batch 10 --inner-iters 5 --learning-rate 0.001 --meta-step 1
--meta-step-final 0 --meta-batch 5 --eval-batch 5 --eval-iters 50``, non-transductive.
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 in [0, 1] instead of Omniglot's 28x28
characters; the "characters" are digit x rotation (``augment_dataset``'s 0/90/180/270),
digits 0-6 (28 classes) for meta-training and 7-9 (12 classes) for testing, each class's
images its own; 24 filters per conv instead of 64; 150 meta-iterations instead of 100,000;
the test classes rotated too (the original augments only the training characters), for 12 of them.
Measure only (not in the program): 5-way 1-shot accuracy on 40 test-class tasks by a correct
evaluation (every task fine-tuned on deep copies of the model and the Adam), with
``eval_iters`` 50; and the size of the last meta-updates (relative to the weights).

nndx, as the author would add it: the model and its one optimizer (the inner Adam; the meta
update is arithmetic on the weights): the preflight ``nndx.probe`` on one training task (50
images with their task labels, the summed cross-entropy, the Adam) before training,
``nndx.Monitor(model, optimizer)`` around the meta-training loop, each inner-loop loss
logged, then ``nndx.probe(..., monitor=mon)`` on the same task and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "reptile"
SOURCE = Source("openai/supervised-reptile", "supervised_reptile/reptile.py",
                "8f2b71c67a31c1a605ced0cecb76db876b607a7a", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the 1-shot 5-way Omniglot recipe (shrunk), meta step annealed from 1 to 0"),
        Variant(
            "meta_step_not_annealed",
            "cur_meta_step_size = frac_done * meta_step_size + (1 - frac_done) * meta_step_size: the final meta "
            "step size never used, so the interpolation stays at 1 to the end instead of annealing to 0",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/learnables/learn2learn/issues/342",
             "https://github.com/learnables/learn2learn/pull/343"),
            Measure("last_meta_update", "relative size of the last meta-updates 5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 5 * healthy),
        ),
        Variant(
            "inner_no_zero_grad",
            "the PyTorch port of minimize_op (a TF op that computes fresh gradients every run) without "
            "optimizer.zero_grad(): .grad is never cleared, and export/import of the weights leaves it alone, so "
            "every inner step (every task, every meta-iteration, every evaluation) follows the sum of all "
            "gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1"),
            Measure("test_accuracy", "5-way 1-shot test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}


class Args:  # run_omniglot.py's 1-shot 5-way command, shrunk
    classes, shots, train_shots, inner_batch, inner_iters = 5, 1, 10, 10, 5
    learning_rate, meta_step, meta_step_final, meta_batch, meta_iters = 1e-3, 1.0, 0.0, 5, 150
    eval_batch, eval_iters, eval_interval = 5, 50, 10


FILTERS, SIDE = 24, 16
MEASURE_TASKS = 40


# --------------------------------------------------------------------------- models.py


class OmniglotModel(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 1
        for _ in range(4):
            layers += [nn.Conv2d(channels, FILTERS, 3, stride=2, padding=1),
                       nn.BatchNorm2d(FILTERS, eps=1e-3, track_running_stats=False),  # training=True, always
                       nn.ReLU()]  # fmt: skip
            channels = FILTERS
        self.features = nn.Sequential(*layers)
        self.logits = nn.Linear(FILTERS * (SIDE // 16) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.reshape(-1, 1, SIDE, SIDE)
        out = self.features(out)
        return self.logits(out.reshape(out.size(0), -1))


def summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``minimize`` of ``sparse_softmax_cross_entropy_with_logits``: the per-example losses' sum."""
    return F.cross_entropy(logits, labels, reduction="sum")


# --------------------------------------------------------------------------- omniglot.py, on digits


class Character:
    """A class of the dataset: one digit at one rotation; ``sample(n)`` draws n of its images."""

    def __init__(self, images: np.ndarray, rotation: int) -> None:
        self.images = np.rot90(images, k=rotation // 90, axes=(1, 2)).copy()

    def sample(self, num_images: int) -> list[np.ndarray]:
        return [self.images[i] for i in random.sample(range(len(self.images)), num_images)]


def read_dataset(seed: int) -> tuple[list[Character], list[Character]]:
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    images = torch.cat([train_images, test_images])
    labels = torch.cat([train_labels, test_labels]).numpy()
    pixels = data.upscaled(images, SIDE).squeeze(1).numpy()  # (N, 16, 16) in [0, 1]
    by_digit = {d: pixels[labels == d] for d in range(10)}
    train_set = [Character(by_digit[d], r) for d in range(7) for r in (0, 90, 180, 270)]
    test_set = [Character(by_digit[d], r) for d in range(7, 10) for r in (0, 90, 180, 270)]
    return train_set, test_set


# --------------------------------------------------------------------------- reptile.py


def _sample_mini_dataset(dataset, num_classes: int, num_shots: int):
    shuffled = list(dataset)
    random.shuffle(shuffled)
    for class_idx, class_obj in enumerate(shuffled[:num_classes]):
        for sample in class_obj.sample(num_shots):
            yield (sample, class_idx)


def _mini_batches(samples, batch_size: int, num_batches: int, replacement: bool):
    samples = list(samples)
    if replacement:
        for _ in range(num_batches):
            yield random.sample(samples, batch_size)
        return
    cur_batch = []
    batch_count = 0
    while True:
        random.shuffle(samples)
        for sample in samples:
            cur_batch.append(sample)
            if len(cur_batch) < batch_size:
                continue
            yield cur_batch
            cur_batch = []
            batch_count += 1
            if batch_count == num_batches:
                return


def _split_train_test(samples, test_shots: int = 1):
    train_set = list(samples)
    test_set = []
    labels = set(item[1] for item in train_set)
    for _ in range(test_shots):
        for label in labels:
            for i, item in enumerate(train_set):
                if item[1] == label:
                    del train_set[i]
                    test_set.append(item)
                    break
    if len(test_set) < len(labels) * test_shots:
        raise IndexError("not enough examples of each class for test set")
    return train_set, test_set


def as_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*batch)
    return torch.from_numpy(np.stack(inputs)).float(), torch.tensor(labels, dtype=torch.long)


class Reptile:
    """A meta-learning session: ``variables.py``'s export/import of the model state by value."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, zero_grad: bool = True,
                 log=None) -> None:  # fmt: skip
        self.model, self.optimizer = model, optimizer
        self.with_zero_grad = zero_grad
        self.log = log or (lambda loss: None)

    def export_variables(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def import_variables(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.model.parameters(), values):
                p.copy_(v)

    def export_full_state(self):
        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())

    def import_full_state(self, state) -> None:
        self.model.load_state_dict(state[0])
        self.optimizer.load_state_dict(state[1])

    def minimize(self, batch) -> torch.Tensor:
        inputs, labels = as_batch(batch)
        if self.with_zero_grad:
            self.optimizer.zero_grad()
        loss = summed_cross_entropy(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()
        return loss

    def train_step(self, dataset, num_classes, num_shots, inner_batch_size, inner_iters, replacement,
                   meta_step_size, meta_batch_size) -> None:  # fmt: skip
        old_vars = self.export_variables()
        new_vars = []
        for _ in range(meta_batch_size):
            mini_dataset = _sample_mini_dataset(dataset, num_classes, num_shots)
            for batch in _mini_batches(mini_dataset, inner_batch_size, inner_iters, replacement):
                self.log(self.minimize(batch))
            new_vars.append(self.export_variables())
            self.import_variables(old_vars)
        new_vars = [torch.stack(vs).mean(dim=0) for vs in zip(*new_vars)]  # average_vars
        self.import_variables([old + (new - old) * meta_step_size for old, new in zip(old_vars, new_vars)])

    def evaluate(self, dataset, num_classes, num_shots, inner_batch_size, inner_iters, replacement) -> int:
        train_set, test_set = _split_train_test(_sample_mini_dataset(dataset, num_classes, num_shots + 1))
        old_state = self.export_full_state()
        for batch in _mini_batches(train_set, inner_batch_size, inner_iters, replacement):
            self.minimize(batch)
        test_preds = self._test_predictions(train_set, test_set)
        num_correct = sum(int(pred == sample[1]) for pred, sample in zip(test_preds, test_set))
        self.import_full_state(old_state)
        return num_correct

    def _test_predictions(self, train_set, test_set) -> list[int]:
        res = []
        with torch.no_grad():
            for test_sample in test_set:
                inputs, _ = as_batch(list(train_set) + [test_sample])
                res.append(int(self.model(inputs).argmax(dim=-1)[-1]))
        return res


# --------------------------------------------------------------------------- train.py / run_omniglot.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    # read before seeding: its first call in a process imports scikit-learn, which draws from `random`
    train_set, test_set = read_dataset(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    args = Args()
    model = OmniglotModel(args.classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate, betas=(0.0, 0.999))

    state = random.getstate()
    probe_batch = as_batch(list(_sample_mini_dataset(train_set, args.classes, args.train_shots)))
    random.setstate(state)  # the probe's task is drawn off the program's random stream
    nx.preflight(model, probe_batch, summed_cross_entropy, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    reptile = Reptile(model, optimizer, zero_grad=variant != "inner_no_zero_grad", log=mon.log)
    accuracies, updates = [], []
    for i in range(args.meta_iters):
        frac_done = i / args.meta_iters
        if variant == "meta_step_not_annealed":
            cur_meta_step_size = frac_done * args.meta_step + (1 - frac_done) * args.meta_step
        else:
            cur_meta_step_size = frac_done * args.meta_step_final + (1 - frac_done) * args.meta_step
        before = torch.cat([p.detach().flatten() for p in model.parameters()])
        reptile.train_step(train_set, num_classes=args.classes, num_shots=args.train_shots,
                           inner_batch_size=args.inner_batch, inner_iters=args.inner_iters, replacement=False,
                           meta_step_size=cur_meta_step_size, meta_batch_size=args.meta_batch)  # fmt: skip
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        updates.append(float((after - before).norm() / before.norm()))
        if i % args.eval_interval == 0:
            accuracies.append([
                reptile.evaluate(dataset, num_classes=args.classes, num_shots=args.shots,
                                 inner_batch_size=args.eval_batch, inner_iters=args.eval_iters,
                                 replacement=False) / args.classes
                for dataset in (train_set, test_set)
            ])  # fmt: skip

    nx.finish(mon, model, probe_batch, summed_cross_entropy, optimizer=optimizer)

    # measure only: a correct evaluation on copies, with its own random stream
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    random.seed(10_000 + seed)
    correct = 0
    for _ in range(MEASURE_TASKS):
        judge = Reptile(copy.deepcopy(model), copy.deepcopy(optimizer))
        judge.optimizer = type(optimizer)(judge.model.parameters(), lr=args.learning_rate, betas=(0.0, 0.999))
        judge.optimizer.load_state_dict(optimizer.state_dict())
        correct += judge.evaluate(test_set, num_classes=args.classes, num_shots=args.shots,
                                  inner_batch_size=args.eval_batch, inner_iters=args.eval_iters,
                                  replacement=False)  # fmt: skip
    random.setstate(py_state)
    torch.set_rng_state(torch_state)
    last = np.array(accuracies[-2:]).mean(axis=0)
    return {
        "test_accuracy": correct / (MEASURE_TASKS * args.classes),
        "last_meta_update": float(np.mean(updates[-10:])),
        "printed_train_accuracy": float(last[0]),
        "printed_test_accuracy": float(last[1]),
    }
