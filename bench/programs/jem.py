"""Port of wgrathwohl's JEM (Grathwohl et al. 2019, "Your Classifier is Secretly an Energy Based
Model"): a classifier whose ``logsumexp`` of logits is the negative energy, trained on
``p(y|x)`` (cross-entropy) plus ``p(x)`` (``-(f(x_data) - f(x_sample))``) with samples drawn by
SGLD from a persistent replay buffer that is re-initialised from uniform noise 5% of the time.

Source: github.com/wgrathwohl/JEM, ``train_wrn_ebm.py`` and ``wideresnet.py`` at commit
3d01161547109b464eee87304f07b2dac8519d03 (the repository's HEAD; Apache-2.0, Copyright 2019 The
Google Research Authors). Written anew from the facts of those files; no code copied.

Kept: ``F`` (a Wide-ResNet trunk, an ``energy_output`` ``Linear(last_dim, 1)`` and a
``class_output`` ``Linear(last_dim, n_classes)``; ``classify`` = ``class_output(f(x))``) and
``CCF`` (``forward(x)`` = ``classify(x).logsumexp(1)``, ``forward(x, y)`` = the logit of ``y``);
the Wide-ResNet's ``wide_basic`` blocks (``LeakyReLU(0.2)``, ``norm=None`` so the norms are
identities, conv-lrelu-conv with a 1x1 shortcut on a width or stride change, dropout 0 so an
identity), the trunk's ``conv3x3`` stem, three stages of strides 1-2-2, the final LeakyReLU and
average pool; the replay buffer of ``buffer_size`` uniform(-1, 1) images; ``sample_p_0``
(random buffer indices, each replaced by fresh noise with probability ``reinit_freq`` = 0.05);
``sample_q`` (``f.eval()``, ``n_steps`` = 20 SGLD steps ``x += sgld_lr * d f(x)/dx +
sgld_std * N(0, 1)`` with ``sgld_lr`` 1 and ``sgld_std`` 0.01 through ``autograd.grad``,
``f.train()``, the samples detached and written back into the buffer); the data pipeline
(``ToTensor``, ``Normalize(0.5, 0.5)``, Gaussian noise of ``sigma`` = 0.03 added to every
image, the SVHN branch's reflect-pad + random crop, no flip: these are digits); a validation
split carved off the training set; two training loaders over the same images (``dload_train``
for ``p(x)`` and the cycled ``dload_train_labeled`` for ``p(y|x)``; ``labels_per_class`` -1, so
every label is used), both shuffled, ``drop_last=True``; ``main``: Adam(betas .9, .999,
weight decay 0), the per-epoch step decay of every group's lr by ``decay_rate`` 0.3 at
``decay_epochs`` (before the epoch's batches), the linear warm-up ``lr * cur_iter /
warmup_iters`` while ``cur_iter <= warmup_iters``, per batch ``L = p_x_weight * -(fp - fq) +
p_y_given_x_weight * CE(classify(x_lab), y_lab)`` (weights 1 and 1, ``p_x_y_weight`` 0), the
``|L| > 1e8`` divergence stop, ``zero_grad``/``backward``/``step``; after every epoch
``eval_classification`` on the validation and test sets under ``f.eval()`` and ``no_grad``.
Shrunk: scikit-learn's 8x8 digits (one channel) instead of 32x32 CIFAR-10; pad 1 instead of 4;
a depth-10 Wide-ResNet of width 1 (one block per stage, widths 16-16-32-64) instead of
depth 28 width 10; pool over the 2x2 map instead of 8x8; ``buffer_size`` 1,000 instead of
10,000; 200 validation images instead of 5,000; 8 epochs instead of 200, ``decay_epochs``
[6, 7] instead of [160, 180] (the same fractions of the run, rounded); ``warmup_iters`` 60
instead of 1,000 and ``lr`` 1e-3 instead of 1e-4 (a run of ~150 steps instead of ~140,000);
no checkpoints, sample plots or prints.
Measure only (not in the program): the last epoch's test accuracy (the program's
``eval_classification``) and the last ``fp - fq`` energy gap. Seed 0 (without nndx): healthy
test accuracy 0.897; labels_from_other_loader 0.094; clf_only_left_on 0.228.

nndx, as the author would add it: the program trains ``f`` (a ``CCF``) but the loss nndx can
recompute from a batch is the ``p(y|x)`` term, reached through ``f.classify``, so the author
hands nndx's probes a thin ``nn.Module`` whose ``forward`` is ``f.classify`` (the same
parameters) with ``nn.CrossEntropyLoss`` and the first labelled batch; a preflight
``nndx.probe`` with the optimizer; ``nndx.Monitor(f, optim)`` around the epochs, ``L`` logged
every batch with the batch accuracy and each validation as ``split="val"``; after training
``nndx.probe(classifier, ..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch as t
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "jem"
SOURCE = Source("wgrathwohl/JEM", "train_wrn_ebm.py", "3d01161547109b464eee87304f07b2dac8519d03", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, WRN-10-1, 8 epochs)"),
        Variant(
            "labels_from_other_loader",
            "p(y|x) computed on the unlabelled loader's images x_p_d but scored against y_lab, the labels of "
            "the separately shuffled labelled loader's batch (the two loaders hold the same images when "
            "labels_per_class is -1, so the author used one batch for both terms)",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/eriklindernoren/Keras-GAN/issues/105",
             "https://github.com/kmualim/CGAN-Pytorch/issues/1"),
            Measure("test_accuracy", "test accuracy at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "clf_only_left_on",
            "the optimizer built over f.class_output.parameters() (the program's --clf_only switch, left on from "
            "a classifier fine-tuning run): the Wide-ResNet trunk stays at its random initialisation and both "
            "p(y|x) and p(x) move only the last linear layer",
            (C.OPTIMIZER_NOT_CONNECTED, C.FROZEN_PARAMETERS),
            ("https://github.com/ihciah/deep-fashion-retrieval/issues/1",
             "https://github.com/halwai/bird_classification/issues/10",
             "https://github.com/PRIS-CV/PMG-Progressive-Multi-Granularity-Training/issues/11"),
            Measure("test_accuracy", "test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = dict(lr=1e-3, decay_epochs=(6, 7), decay_rate=0.3, batch_size=64, n_epochs=8, warmup_iters=60,
            p_x_weight=1.0, p_y_given_x_weight=1.0, sigma=3e-2, weight_decay=0.0, n_steps=20, width=1, depth=10,
            buffer_size=1000, reinit_freq=0.05, sgld_lr=1.0, sgld_std=1e-2, n_valid=200, n_classes=10)  # fmt: skip
im_sz, n_ch, PAD = 8, 1, 1


# --------------------------------------------------------------------------- wideresnet.py


class Identity(nn.Module):
    def forward(self, x):
        return x


class wide_basic(nn.Module):  # noqa: N801 - the original's name
    def __init__(self, in_planes, planes, stride=1, leak=0.2):
        super().__init__()
        self.lrelu = nn.LeakyReLU(leak)
        self.bn1, self.bn2, self.dropout = Identity(), Identity(), Identity()  # norm=None, dropout_rate=0
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, padding=1, bias=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=True))

    def forward(self, x):
        out = self.dropout(self.conv1(self.lrelu(self.bn1(x))))
        out = self.conv2(self.lrelu(self.bn2(out)))
        return out + self.shortcut(x)


class Wide_ResNet(nn.Module):  # noqa: N801
    def __init__(self, depth, widen_factor, input_channels=1, leak=0.2):
        super().__init__()
        assert (depth - 4) % 6 == 0, "Wide-resnet depth should be 6n+4"
        n, k = (depth - 4) // 6, widen_factor
        stages = [16, 16 * k, 32 * k, 64 * k]
        self.in_planes = 16
        self.lrelu = nn.LeakyReLU(leak)
        self.conv1 = nn.Conv2d(input_channels, stages[0], kernel_size=3, stride=1, padding=1, bias=True)
        self.layer1 = self._wide_layer(stages[1], n, stride=1)
        self.layer2 = self._wide_layer(stages[2], n, stride=2)
        self.layer3 = self._wide_layer(stages[3], n, stride=2)
        self.bn1 = Identity()
        self.last_dim = stages[3]

    def _wide_layer(self, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(wide_basic(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        out = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        out = self.lrelu(self.bn1(out))
        out = nn.functional.avg_pool2d(out, out.shape[-1])  # 8 on 32x32 CIFAR; the whole 2x2 map here
        return out.view(out.size(0), -1)


# --------------------------------------------------------------------------- train_wrn_ebm.py


class F(nn.Module):
    def __init__(self, depth=28, width=2, n_classes=10):
        super().__init__()
        self.f = Wide_ResNet(depth, width)
        self.energy_output = nn.Linear(self.f.last_dim, 1)
        self.class_output = nn.Linear(self.f.last_dim, n_classes)

    def forward(self, x, y=None):
        return self.energy_output(self.f(x)).squeeze()

    def classify(self, x):
        return self.class_output(self.f(x)).squeeze()


class CCF(F):
    def forward(self, x, y=None):
        logits = self.classify(x)
        if y is None:
            return logits.logsumexp(1)
        return t.gather(logits, 1, y[:, None])


class Classifier(nn.Module):
    """nndx's view of the program (not in the program): ``f.classify`` as a forward."""

    def __init__(self, f: CCF) -> None:
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f.classify(x)


class DataSubset(Dataset):
    def __init__(self, images, labels, inds, train: bool, sigma: float):
        self.images, self.labels, self.inds, self.train, self.sigma = images, labels, inds, train, sigma

    def __getitem__(self, index):
        i = self.inds[index]
        x = (self.images[i] - 0.5) / 0.5  # ToTensor + Normalize(.5, .5)
        if self.train:  # Pad(reflect) + RandomCrop
            x = nn.functional.pad(x[None], (PAD, PAD, PAD, PAD), mode="reflect")[0]
            dy, dx = (int(v) for v in t.randint(0, 2 * PAD + 1, (2,)))
            x = x[:, dy : dy + im_sz, dx : dx + im_sz]
        return x + self.sigma * t.randn_like(x), self.labels[i]

    def __len__(self):
        return len(self.inds)


def cycle(loader):
    while True:
        yield from loader


def init_random(bs):
    return t.FloatTensor(bs, n_ch, im_sz, im_sz).uniform_(-1, 1)


def get_data(args, seed):
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
    tr_x, te_x = digits.to_tensor(tr_x), digits.to_tensor(te_x)
    all_inds = list(range(len(tr_y)))
    np.random.seed(1234)
    np.random.shuffle(all_inds)
    valid_inds, train_inds = all_inds[: args["n_valid"]], all_inds[args["n_valid"] :]
    sigma, bs = args["sigma"], args["batch_size"]
    gen = t.Generator().manual_seed(seed)
    dset_train = DataSubset(tr_x, tr_y, train_inds, True, sigma)
    dset_train_labeled = DataSubset(tr_x, tr_y, train_inds, True, sigma)  # labels_per_class -1: every one
    dset_valid = DataSubset(tr_x, tr_y, valid_inds, False, sigma)
    dset_test = DataSubset(te_x, te_y, list(range(len(te_y))), False, sigma)
    dload_train = DataLoader(dset_train, batch_size=bs, shuffle=True, drop_last=True, generator=gen)
    dload_train_labeled = cycle(DataLoader(dset_train_labeled, batch_size=bs, shuffle=True, drop_last=True,
                                           generator=gen))  # fmt: skip
    dload_valid = DataLoader(dset_valid, batch_size=100, shuffle=False, drop_last=False)
    dload_test = DataLoader(dset_test, batch_size=100, shuffle=False, drop_last=False)
    return dload_train, dload_train_labeled, dload_valid, dload_test


def get_sample_q(args):
    def sample_p_0(replay_buffer, bs):
        inds = t.randint(0, len(replay_buffer), (bs,))
        buffer_samples = replay_buffer[inds]
        random_samples = init_random(bs)
        choose_random = (t.rand(bs) < args["reinit_freq"]).float()[:, None, None, None]
        return choose_random * random_samples + (1 - choose_random) * buffer_samples, inds

    def sample_q(f, replay_buffer, n_steps=args["n_steps"]):
        f.eval()
        init_sample, buffer_inds = sample_p_0(replay_buffer, bs=args["batch_size"])
        x_k = init_sample.clone().requires_grad_(True)
        for _ in range(n_steps):
            f_prime = t.autograd.grad(f(x_k).sum(), [x_k], retain_graph=True)[0]
            x_k.data += args["sgld_lr"] * f_prime + args["sgld_std"] * t.randn_like(x_k)
        f.train()
        final_samples = x_k.detach()
        replay_buffer[buffer_inds] = final_samples
        return final_samples

    return sample_q


def eval_classification(f, dload):
    corrects, losses = [], []
    for x_p_d, y_p_d in dload:
        logits = f.classify(x_p_d)
        losses.extend(nn.CrossEntropyLoss(reduction="none")(logits, y_p_d).numpy())
        corrects.extend((logits.max(1)[1] == y_p_d).float().numpy())
    return float(np.mean(corrects)), float(np.mean(losses))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    t.manual_seed(seed)
    dload_train, dload_train_labeled, dload_valid, dload_test = get_data(args, seed)
    sample_q = get_sample_q(args)
    f = CCF(args["depth"], args["width"], n_classes=args["n_classes"])
    replay_buffer = init_random(args["buffer_size"])
    params = f.class_output.parameters() if variant == "clf_only_left_on" else f.parameters()
    optim = t.optim.Adam(params, lr=args["lr"], betas=[0.9, 0.999], weight_decay=args["weight_decay"])

    classifier = Classifier(f)
    criterion = nn.CrossEntropyLoss()
    with t.random.fork_rng():
        probe_batch = next(iter(DataLoader(dload_train.dataset, batch_size=args["batch_size"])))
    probe_batch = (probe_batch[0], probe_batch[1])
    nx.preflight(classifier, probe_batch, criterion, optimizer=optim)
    mon = nx.monitor(f, optim, every=5)

    cur_iter, best_valid_acc = 0, 0.0
    gap = valid_acc = test_acc = float("nan")
    for epoch in range(args["n_epochs"]):
        if epoch in args["decay_epochs"]:
            for param_group in optim.param_groups:
                param_group["lr"] = param_group["lr"] * args["decay_rate"]
        for _i, (x_p_d, _) in enumerate(dload_train):
            if cur_iter <= args["warmup_iters"]:
                lr = args["lr"] * cur_iter / float(args["warmup_iters"])
                for param_group in optim.param_groups:
                    param_group["lr"] = lr
            x_lab, y_lab = next(dload_train_labeled)

            L = 0.0
            if args["p_x_weight"] > 0:  # maximize log p(x)
                x_q = sample_q(f, replay_buffer)
                fp, fq = f(x_p_d).mean(), f(x_q).mean()
                l_p_x = -(fp - fq)
                gap = (fp - fq).item()
                L += args["p_x_weight"] * l_p_x
            if args["p_y_given_x_weight"] > 0:  # maximize log p(y | x)
                x_clf = x_p_d if variant == "labels_from_other_loader" else x_lab
                logits = f.classify(x_clf)
                l_p_y_given_x = nn.CrossEntropyLoss()(logits, y_lab)
                acc = (logits.max(1)[1] == y_lab).float().mean().item()
                L += args["p_y_given_x_weight"] * l_p_y_given_x

            if L.abs().item() > 1e8:  # the program's divergence stop
                raise ZeroDivisionError("BAD BOIIIIIIIIII")

            optim.zero_grad()
            L.backward()
            optim.step()
            cur_iter += 1
            nx.timed(lambda: mon.log(L, accuracy=acc))  # noqa: B023

        f.eval()
        with t.no_grad():
            valid_acc, valid_loss = eval_classification(f, dload_valid)
            best_valid_acc = max(best_valid_acc, valid_acc)
            test_acc, _ = eval_classification(f, dload_test)
        f.train()
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))  # noqa: B023

    nx.finish(mon, classifier, probe_batch, criterion, optimizer=optim)
    return {"test_accuracy": test_acc, "valid_accuracy": valid_acc, "best_valid_accuracy": best_valid_acc,
            "energy_gap": gap, "final_lr": optim.param_groups[0]["lr"]}  # fmt: skip
