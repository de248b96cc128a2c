"""Port of dragen1860/MAML-Pytorch: MAML (few-shot classification) with a functional learner.

Source: github.com/dragen1860/MAML-Pytorch, ``meta.py``, ``learner.py``,
``omniglot_train.py`` and ``omniglotNShot.py`` at commit
98a00d41724c133bd29619a2fb2cc46dd128a368 (the repository's HEAD; ``meta.py`` last changed
at d55ffb8c58338a20b92cc030c432799a00b5fc30) (MIT, Copyright (c) 2019 Jackie Loong).
Written anew from the facts of those files; no code copied.

Kept: ``Learner``: a config list of ``(name, param)`` entries turned into one
``nn.ParameterList`` ``vars`` (conv/linear weights ``kaiming_normal_``, biases zero, bn
weight 1 / bias 0) and a second list ``vars_bn`` of running mean/var as
``nn.Parameter(requires_grad=False)``; ``forward(x, vars=None, bn_training=True)`` walks
the config with ``F.conv2d``, ``F.relu(inplace=True)``, ``F.batch_norm(..., training=
bn_training)``, ``view`` to flatten, ``F.linear``, and asserts every var was used;
``parameters()`` overridden to return ``vars``; its own ``zero_grad``. The omniglot
config: four ``conv2d`` (3x3 stride 2 three times, then 2x2 stride 1), each followed by
``relu`` and ``bn``, ``flatten``, ``linear(n_way)``. ``Meta``: ``meta_optim =
Adam(net.parameters(), meta_lr)``; ``forward(x_spt, y_spt, x_qry, y_qry)``: per task the
support loss, ``torch.autograd.grad`` (no ``create_graph``, as published), fast weights
``w - update_lr * g`` through ``map``/``lambda``, the query loss and accuracy before
and after the first update under ``torch.no_grad()``, then ``update_step - 1`` more
inner steps on the fast weights, each followed by the query loss (with graph) summed in
``losses_q[k + 1]``; the meta loss ``losses_q[-1] / task_num``,
``meta_optim.zero_grad()``, ``backward``, ``meta_optim.step()``; the accuracies
returned per step. ``finetunning`` on a ``deepcopy`` of the net with
``update_step_test`` steps. ``OmniglotNShot.load_data_cache``: per task ``n_way``
classes drawn without replacement, labelled 0..n_way-1 in draw order, ``k_shot +
k_query`` images of each drawn without replacement, support and query each shuffled
with its own ``np.random.permutation``; caches of 10 meta-batches refilled when used
up; ``omniglot_train.py``'s arguments (n_way 5, k_spt 1, imgsz 28, imgc 1, update_lr 0.4,
update_step 5, update_step_test 10), ``torch.manual_seed`` / ``np.random.seed(222)``, the
loop ``accs = maml(...)``, a test every 100 steps by ``finetunning`` one task at a time.
Shrunk: scikit-learn's 8x8 digits (10 classes, upscaled bilinearly to 28x28 pixels in
[0, 1], the ``x / 255.`` of omniglotNShot) instead of Omniglot's 1,623 characters, so
train and test share the classes and differ in their images (the 1,437 / 360 split of
``data.digit_images``): with a fresh label assignment in every task, each task is still
new to the learner; 16 filters per conv instead of 64; k_qry 5 instead of 15; task_num 4
instead of 32; 100 meta steps instead of 40,000, at meta_lr 1e-2 instead of 1e-3 (at 1e-3
the shrunk run's test accuracy after fine-tuning is about 0.67, barely above the 0.63 of an
untrained learner, on seed 0); the test at step 0 on 4 tasks instead of every 100 steps
on 1,000 / task_num batches.
Measure only (not in the program): the query accuracy after ``update_step_test``
fine-tuning steps on 40 test tasks drawn by a correct sampler, averaged.

nndx, as the author would add it: the learner maps images to logits, so nndx watches
``maml.net`` with ``maml.meta_optim``; the preflight ``nndx.probe`` gets one task of the
first meta-batch as a batch (its support and query images with their task labels,
``F.cross_entropy`` as the loss), ``nndx.Monitor(maml.net, maml.meta_optim)`` is around
the meta-training loop, each meta (query) loss is logged (``Meta.forward`` returns the
accuracies only, so the port keeps the meta loss on ``maml.last_loss``); then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "maml"
SOURCE = Source("dragen1860/MAML-Pytorch", "meta.py", "98a00d41724c133bd29619a2fb2cc46dd128a368", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (first-order in effect: no create_graph)"),
        Variant(
            "no_meta_zero_grad",
            "self.meta_optim.zero_grad() left out of Meta.forward (the inner loop uses autograd.grad, which never "
            "fills .grad, so it looks unneeded): every meta step's gradient is the sum of all meta gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/AntreasAntoniou/HowToTrainYourMAMLPytorch/issues/37",
             "https://github.com/facebookresearch/higher/issues/30",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_accuracy", "fine-tuned query accuracy on 40 clean test tasks at least 0.1 below the "
                    "healthy run's: 0.65/0.67 against 0.84/0.85 healthy on seeds 0/1",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "query_labels_unshuffled",
            "load_data_cache shuffles the query images with perm but leaves y_qry in class order: the query "
            "labels (the meta loss's targets) no longer belong to their images",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/tristandeleu/pytorch-meta/issues/14",
             "https://github.com/amanbasu/ECG-Authentication/issues/3",
             "https://github.com/Luvata/CS330-Stanford-Deep-Multi-Task-and-Meta-Learning/issues/3"),
            Measure("test_accuracy", "fine-tuned query accuracy on 40 clean test tasks at least 0.1 below the "
                    "healthy run's: 0.55/0.52 against 0.84/0.85 healthy on seeds 0/1 (train query accuracy at "
                    "chance, 0.21/0.20)", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}


class Args:
    n_way, k_spt, k_qry, imgsz, imgc = 5, 1, 5, 28, 1
    task_num, meta_lr, update_lr, update_step, update_step_test = 4, 1e-2, 0.4, 5, 10


STEPS = 100
WIDTH = 16  # 64 in omniglot_train.py
TEST_EVERY, TEST_TASKS, MEASURE_TASKS = 100, 4, 40


# --------------------------------------------------------------------------- learner.py


class Learner(nn.Module):
    def __init__(self, config: list, imgc: int, imgsz: int) -> None:
        super().__init__()
        self.config = config
        self.vars = nn.ParameterList()  # everything meta-learned
        self.vars_bn = nn.ParameterList()  # running statistics, never trained
        for name, param in self.config:
            if name in ("conv2d", "linear"):
                shape = param[:4] if name == "conv2d" else param
                weight = nn.Parameter(torch.ones(*shape))
                torch.nn.init.kaiming_normal_(weight)
                self.vars.append(weight)
                self.vars.append(nn.Parameter(torch.zeros(param[0])))
            elif name == "bn":
                self.vars.append(nn.Parameter(torch.ones(param[0])))
                self.vars.append(nn.Parameter(torch.zeros(param[0])))
                self.vars_bn.extend([nn.Parameter(torch.zeros(param[0]), requires_grad=False),
                                     nn.Parameter(torch.ones(param[0]), requires_grad=False)])  # fmt: skip
            elif name not in ("relu", "flatten"):
                raise NotImplementedError(name)

    def forward(self, x: torch.Tensor, vars=None, bn_training: bool = True) -> torch.Tensor:
        if vars is None:
            vars = self.vars
        idx = bn_idx = 0
        for name, param in self.config:
            if name == "conv2d":
                x = F.conv2d(x, vars[idx], vars[idx + 1], stride=param[4], padding=param[5])
                idx += 2
            elif name == "linear":
                x = F.linear(x, vars[idx], vars[idx + 1])
                idx += 2
            elif name == "bn":
                running_mean, running_var = self.vars_bn[bn_idx], self.vars_bn[bn_idx + 1]
                x = F.batch_norm(x, running_mean, running_var, weight=vars[idx], bias=vars[idx + 1],
                                 training=bn_training)  # fmt: skip
                idx += 2
                bn_idx += 2
            elif name == "flatten":
                x = x.view(x.size(0), -1)
            elif name == "relu":
                x = F.relu(x, inplace=param[0])
        assert idx == len(vars)
        assert bn_idx == len(self.vars_bn)
        return x

    def zero_grad(self, vars=None) -> None:
        with torch.no_grad():
            for p in self.vars if vars is None else vars:
                if p.grad is not None:
                    p.grad.zero_()

    def parameters(self):  # the list itself, not a generator: Meta indexes and re-walks it
        return self.vars


# --------------------------------------------------------------------------- meta.py


class Meta(nn.Module):
    def __init__(self, args, config: list, zero_grad: bool = True) -> None:
        super().__init__()
        self.update_lr, self.meta_lr = args.update_lr, args.meta_lr
        self.n_way, self.k_spt, self.k_qry, self.task_num = args.n_way, args.k_spt, args.k_qry, args.task_num
        self.update_step, self.update_step_test = args.update_step, args.update_step_test
        self.net = Learner(config, args.imgc, args.imgsz)
        self.meta_optim = optim.Adam(self.net.parameters(), lr=self.meta_lr)
        self.with_zero_grad = zero_grad
        self.last_loss: torch.Tensor | None = None

    def forward(self, x_spt, y_spt, x_qry, y_qry) -> np.ndarray:
        task_num = x_spt.size(0)
        querysz = x_qry.size(1)
        losses_q = [0 for _ in range(self.update_step + 1)]
        corrects = [0 for _ in range(self.update_step + 1)]

        def step(grads, weights):
            return list(map(lambda p: p[1] - self.update_lr * p[0], zip(grads, weights)))

        def correct(logits_q, y):
            return torch.eq(F.softmax(logits_q, dim=1).argmax(dim=1), y).sum().item()

        for i in range(task_num):
            loss = F.cross_entropy(self.net(x_spt[i], vars=None, bn_training=True), y_spt[i])
            grad = torch.autograd.grad(loss, self.net.parameters())
            fast_weights = step(grad, self.net.parameters())

            with torch.no_grad():  # before the first update
                logits_q = self.net(x_qry[i], self.net.parameters(), bn_training=True)
                losses_q[0] += F.cross_entropy(logits_q, y_qry[i])
                corrects[0] += correct(logits_q, y_qry[i])
            with torch.no_grad():  # after it
                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
                losses_q[1] += F.cross_entropy(logits_q, y_qry[i])
                corrects[1] += correct(logits_q, y_qry[i])

            for k in range(1, self.update_step):
                loss = F.cross_entropy(self.net(x_spt[i], fast_weights, bn_training=True), y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights)
                fast_weights = step(grad, fast_weights)
                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
                losses_q[k + 1] += F.cross_entropy(logits_q, y_qry[i])
                with torch.no_grad():
                    corrects[k + 1] += correct(logits_q, y_qry[i])

        loss_q = losses_q[-1] / task_num
        if self.with_zero_grad:
            self.meta_optim.zero_grad()
        loss_q.backward()
        self.meta_optim.step()
        self.last_loss = loss_q.detach()
        return np.array(corrects) / (querysz * task_num)

    def finetunning(self, x_spt, y_spt, x_qry, y_qry) -> np.ndarray:
        querysz = x_qry.size(0)
        corrects = [0 for _ in range(self.update_step_test + 1)]
        net = deepcopy(self.net)  # keeps the meta-learned weights and running statistics untouched

        def correct(weights):
            return torch.eq(F.softmax(net(x_qry, weights, bn_training=True), dim=1).argmax(dim=1), y_qry).sum().item()

        loss = F.cross_entropy(net(x_spt), y_spt)
        grad = torch.autograd.grad(loss, net.parameters())
        fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, net.parameters())))
        with torch.no_grad():
            corrects[0] += correct(net.parameters())
        with torch.no_grad():
            corrects[1] += correct(fast_weights)
        for k in range(1, self.update_step_test):
            loss = F.cross_entropy(net(x_spt, fast_weights, bn_training=True), y_spt)
            grad = torch.autograd.grad(loss, fast_weights)
            fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, fast_weights)))
            with torch.no_grad():
                corrects[k + 1] += correct(fast_weights)
        del net
        return np.array(corrects) / querysz


# --------------------------------------------------------------------------- omniglotNShot.py, on digits


class DigitsNShot:
    """``OmniglotNShot`` over the digits: ``x[cls]`` holds a class's images."""

    def __init__(self, batchsz: int, n_way: int, k_shot: int, k_query: int, imgsz: int, seed: int,
                 shuffle_query_labels: bool = True, cache_size: int = 10) -> None:  # fmt: skip
        train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
        self.resize = imgsz
        self.datasets = {"train": self.by_class(train_images, train_labels), "test": self.by_class(test_images, test_labels)}
        self.batchsz, self.n_way, self.k_shot, self.k_query = batchsz, n_way, k_shot, k_query
        self.shuffle_query_labels, self.cache_size = shuffle_query_labels, cache_size
        self.indexes = {"train": 0, "test": 0}
        self.datasets_cache = {mode: self.load_data_cache(pack) for mode, pack in self.datasets.items()}

    def by_class(self, images: torch.Tensor, labels: torch.Tensor) -> list[np.ndarray]:
        x = data.upscaled(images, self.resize).numpy()  # (N, 1, 28, 28) in [0, 1]: the x / 255. of the original
        return [x[labels.numpy() == c] for c in range(10)]

    def load_data_cache(self, data_pack: list[np.ndarray]) -> list[list[np.ndarray]]:
        setsz, querysz = self.k_shot * self.n_way, self.k_query * self.n_way
        data_cache = []
        for _sample in range(self.cache_size):  # meta-batches per cache (10)
            x_spts, y_spts, x_qrys, y_qrys = [], [], [], []
            for _i in range(self.batchsz):  # one task
                x_spt, y_spt, x_qry, y_qry = [], [], [], []
                selected_cls = np.random.choice(len(data_pack), self.n_way, False)
                for j, cur_class in enumerate(selected_cls):
                    selected_img = np.random.choice(len(data_pack[cur_class]), self.k_shot + self.k_query, False)
                    x_spt.append(data_pack[cur_class][selected_img[: self.k_shot]])
                    x_qry.append(data_pack[cur_class][selected_img[self.k_shot :]])
                    y_spt.append([j for _ in range(self.k_shot)])
                    y_qry.append([j for _ in range(self.k_query)])
                perm = np.random.permutation(setsz)
                x_spt = np.array(x_spt).reshape(setsz, 1, self.resize, self.resize)[perm]
                y_spt = np.array(y_spt).reshape(setsz)[perm]
                perm = np.random.permutation(querysz)
                x_qry = np.array(x_qry).reshape(querysz, 1, self.resize, self.resize)[perm]
                y_qry = np.array(y_qry).reshape(querysz)
                if self.shuffle_query_labels:
                    y_qry = y_qry[perm]
                x_spts.append(x_spt)
                y_spts.append(y_spt)
                x_qrys.append(x_qry)
                y_qrys.append(y_qry)
            data_cache.append([
                np.array(x_spts).astype(np.float32).reshape(self.batchsz, setsz, 1, self.resize, self.resize),
                np.array(y_spts).astype(np.int64).reshape(self.batchsz, setsz),
                np.array(x_qrys).astype(np.float32).reshape(self.batchsz, querysz, 1, self.resize, self.resize),
                np.array(y_qrys).astype(np.int64).reshape(self.batchsz, querysz),
            ])  # fmt: skip
        return data_cache

    def next(self, mode: str = "train") -> list[np.ndarray]:
        if self.indexes[mode] >= len(self.datasets_cache[mode]):
            self.indexes[mode] = 0
            self.datasets_cache[mode] = self.load_data_cache(self.datasets[mode])
        next_batch = self.datasets_cache[mode][self.indexes[mode]]
        self.indexes[mode] += 1
        return next_batch


# --------------------------------------------------------------------------- omniglot_train.py


def config_for(args) -> list:
    return [
        ("conv2d", [WIDTH, args.imgc, 3, 3, 2, 0]), ("relu", [True]), ("bn", [WIDTH]),
        ("conv2d", [WIDTH, WIDTH, 3, 3, 2, 0]), ("relu", [True]), ("bn", [WIDTH]),
        ("conv2d", [WIDTH, WIDTH, 3, 3, 2, 0]), ("relu", [True]), ("bn", [WIDTH]),
        ("conv2d", [WIDTH, WIDTH, 2, 2, 1, 0]), ("relu", [True]), ("bn", [WIDTH]),
        ("flatten", []),
        ("linear", [args.n_way, WIDTH]),
    ]  # fmt: skip


def tensors(batch: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(b) for b in batch]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(222 + seed)
    np.random.seed(222 + seed)
    args = Args()
    maml = Meta(args, config_for(args), zero_grad=variant != "no_meta_zero_grad")
    db_train = DigitsNShot(args.task_num, args.n_way, args.k_spt, args.k_qry, args.imgsz, seed=seed,
                           shuffle_query_labels=variant != "query_labels_unshuffled")  # fmt: skip

    first = tensors(db_train.datasets_cache["train"][0])  # the meta-batch step 0 will get
    probe_batch = (torch.cat([first[0][0], first[2][0]]), torch.cat([first[1][0], first[3][0]]))
    nx.preflight(maml.net, probe_batch, F.cross_entropy, optimizer=maml.meta_optim)
    mon = nx.monitor(maml.net, maml.meta_optim, every=10)

    train_accs, test_accs = [], []
    for step in range(STEPS):
        x_spt, y_spt, x_qry, y_qry = tensors(db_train.next())
        accs = maml(x_spt, y_spt, x_qry, y_qry)
        mon.log(maml.last_loss)
        train_accs.append(accs)
        if step % TEST_EVERY == 0:
            accs_test = []
            for _ in range(TEST_TASKS // args.task_num):
                x_spt, y_spt, x_qry, y_qry = tensors(db_train.next("test"))
                for one in zip(x_spt, y_spt, x_qry, y_qry):
                    accs_test.append(maml.finetunning(*one))
            test_accs.append(np.array(accs_test).mean(axis=0))

    nx.finish(mon, maml.net, probe_batch, F.cross_entropy, optimizer=maml.meta_optim)

    # measure only: fine-tuning on test tasks drawn by a correct sampler, with its own random state
    state = np.random.get_state()
    np.random.seed(10_000 + seed)
    clean = DigitsNShot(MEASURE_TASKS, args.n_way, args.k_spt, args.k_qry, args.imgsz, seed=seed, cache_size=1)
    x_spt, y_spt, x_qry, y_qry = tensors(clean.next("test"))
    measured = np.array([maml.finetunning(*one) for one in zip(x_spt, y_spt, x_qry, y_qry)]).mean(axis=0)
    np.random.set_state(state)
    late = np.array(train_accs[-20:] or [[float("nan")]]).mean(axis=0)
    return {
        "test_accuracy": float(measured[-1]),
        "test_accuracy_after_one_step": float(measured[1]),
        "test_accuracy_before_finetuning": float(measured[0]),
        "train_query_accuracy": float(late[-1]),
        "meta_loss": float("nan") if maml.last_loss is None else float(maml.last_loss),
    }
