"""Port of fungtion/DANN (domain-adversarial training, Ganin & Lempitsky: a shared feature
extractor, a label classifier, and a domain classifier behind a gradient reversal layer).

Source: github.com/fungtion/DANN, ``train/main.py``, ``models/model.py``,
``models/functions.py`` and ``train/test.py`` at commit
476147f70bb818a63bb3461a6ecc12f97f7ab15e (MIT, Copyright (c) 2019 fungtion). Written anew
from the facts of those files; no code copied.

Kept: ``CNNModel`` (``feature``: conv5x5 -> BatchNorm2d -> MaxPool2d(2) -> ReLU -> conv5x5
-> BatchNorm2d -> Dropout2d -> MaxPool2d(2) -> ReLU, flattened to ``width * 4 * 4``;
``class_classifier``: Linear -> BatchNorm1d -> ReLU -> Dropout2d -> Linear -> BatchNorm1d ->
ReLU -> Linear(10) -> LogSoftmax; ``domain_classifier``: Linear -> BatchNorm1d -> ReLU ->
Linear(2) -> LogSoftmax, fed through ``ReverseLayerF``); ``forward(input_data, alpha)``
expanding a one-channel input to three channels; ``ReverseLayerF`` (forward ``view_as``,
backward ``-alpha * grad``); ``Adam(lr=1e-3)``; two ``NLLLoss``es (class and domain);
the epoch loop over ``min(len(source), len(target))`` batches with ``p = (i + epoch *
len) / n_epoch / len`` and ``alpha = 2 / (1 + exp(-10 p)) - 1``; per step
``my_net.zero_grad()``, the source batch's class and domain (0) losses, the target
batch's domain (1) loss, ``err = err_t_domain + err_s_domain + err_s_label``,
``backward``, ``step``; the per-epoch ``test`` of both domains (``eval()``, ``alpha = 0``,
argmax accuracy); the source transform ``Normalize(0.1307, 0.3081)`` and the target's
``Normalize(0.5, 0.5)`` per channel.
Shrunk: scikit-learn's 8x8 digits upscaled to 28x28 stand in for MNIST (the source); the
target, standing in for MNIST-M, is the same kind of digit (a disjoint half of the train
split, unlabelled for training) blended as ``|background - digit|`` with a random smooth
colour background per image, channels uniform in [0, 0.6] (MNIST-M blends MNIST with BSDS500
patches the same way);
the target test set is the 360 test digits blended the same way. Convolution widths
16/20 instead of 64/50, hidden width 64 instead of 100, batch 64 instead of 128, 12 epochs
instead of 100; ``c_drop1`` as ``nn.Dropout`` (what ``Dropout2d`` did on a 2-D input in the
torch of 2019; today's treats the batch as channels); no checkpoint files.
Measure only (not in the program): the last epoch's target-domain test accuracy (what
``test(target_dataset_name, epoch)`` prints) and the source one.

nndx, as the author would add it: a preflight ``nndx.probe`` of ``my_net`` on the first
source images, inputs ``(img, alpha=0)`` and the class labels, scored by ``loss_class`` on
the class output (the domain head has no labels in a batch of one domain); ``nndx.Monitor``
around the epochs, each step's total ``err`` logged; after training ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dann"
SOURCE = Source("fungtion/DANN", "train/main.py", "476147f70bb818a63bb3461a6ecc12f97f7ab15e", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: widths 16/20/64, batch 64, 12 epochs)"),
        Variant(
            "grl_missing",
            "domain_output = self.domain_classifier(feature): the gradient reversal layer left out, so the feature "
            "extractor descends the domain loss and learns features that tell the domains apart instead of hiding them",
            (C.WRONG_LOSS, C.BROKEN_BACKWARD),
            ("https://github.com/zou-longkun/GAST/issues/3", "https://github.com/VisionLearningGroup/DAL/issues/1",
             "https://github.com/CuthbertCai/pytorch_DANN/issues/13"),
            Measure("target_acc", "target-domain test accuracy (the last test(target)) at least 0.02 below the healthy "
                    "run's: 0.511 against 0.544 healthy on seed 0 (a small effect: at this size DANN's gain over no "
                    "adaptation is itself small)", lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
        Variant(
            "softmax_with_nllloss",
            "c_softmax = nn.Softmax(dim=1) instead of nn.LogSoftmax: NLLLoss gets probabilities, the class loss is "
            "-p(y) (negative, flat once p(y) nears 1) and the label classifier learns weakly",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/clvrai/ACGAN-PyTorch/issues/3",
             "https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9",
             "https://github.com/midas-research/man-sf-emnlp/issues/2"),
            Measure("source_acc", "source-domain test accuracy (the last test(source)) at least 0.05 below the healthy "
                    "run's: 0.806 against 0.956 healthy on seed 0 (target accuracy 0.531 against 0.544: barely moved)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

lr, batch_size, image_size, n_epoch = 1e-3, 64, 28, 12
F1, F2, HID = 16, 20, 64  # 64, 50, 100 in the original


# --------------------------------------------------------------------------- models/functions.py


class ReverseLayerF(Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output.neg() * ctx.alpha, None


# --------------------------------------------------------------------------- models/model.py


class CNNModel(nn.Module):
    def __init__(self, variant: str = "healthy") -> None:
        super().__init__()
        self.variant = variant
        self.feature = nn.Sequential()
        self.feature.add_module("f_conv1", nn.Conv2d(3, F1, kernel_size=5))
        self.feature.add_module("f_bn1", nn.BatchNorm2d(F1))
        self.feature.add_module("f_pool1", nn.MaxPool2d(2))
        self.feature.add_module("f_relu1", nn.ReLU(True))
        self.feature.add_module("f_conv2", nn.Conv2d(F1, F2, kernel_size=5))
        self.feature.add_module("f_bn2", nn.BatchNorm2d(F2))
        self.feature.add_module("f_drop1", nn.Dropout2d())
        self.feature.add_module("f_pool2", nn.MaxPool2d(2))
        self.feature.add_module("f_relu2", nn.ReLU(True))

        self.class_classifier = nn.Sequential()
        self.class_classifier.add_module("c_fc1", nn.Linear(F2 * 4 * 4, HID))
        self.class_classifier.add_module("c_bn1", nn.BatchNorm1d(HID))
        self.class_classifier.add_module("c_relu1", nn.ReLU(True))
        self.class_classifier.add_module("c_drop1", nn.Dropout())  # Dropout2d on (N, C): element-wise in 2019 torch
        self.class_classifier.add_module("c_fc2", nn.Linear(HID, HID))
        self.class_classifier.add_module("c_bn2", nn.BatchNorm1d(HID))
        self.class_classifier.add_module("c_relu2", nn.ReLU(True))
        self.class_classifier.add_module("c_fc3", nn.Linear(HID, 10))
        self.class_classifier.add_module(
            "c_softmax", nn.Softmax(dim=1) if variant == "softmax_with_nllloss" else nn.LogSoftmax(dim=1))

        self.domain_classifier = nn.Sequential()
        self.domain_classifier.add_module("d_fc1", nn.Linear(F2 * 4 * 4, HID))
        self.domain_classifier.add_module("d_bn1", nn.BatchNorm1d(HID))
        self.domain_classifier.add_module("d_relu1", nn.ReLU(True))
        self.domain_classifier.add_module("d_fc2", nn.Linear(HID, 2))
        self.domain_classifier.add_module("d_softmax", nn.LogSoftmax(dim=1))

    def forward(self, input_data: torch.Tensor, alpha: float):
        input_data = input_data.expand(input_data.data.shape[0], 3, image_size, image_size)
        feature = self.feature(input_data)
        feature = feature.view(-1, F2 * 4 * 4)
        reverse_feature = feature if self.variant == "grl_missing" else ReverseLayerF.apply(feature, alpha)
        class_output = self.class_classifier(feature)
        domain_output = self.domain_classifier(reverse_feature)
        return class_output, domain_output


# --------------------------------------------------------------------------- the data (MNIST, MNIST-M stand-ins)


def _backgrounds(n: int, rng: np.random.Generator) -> torch.Tensor:
    """Smooth random colour patches, (n, 3, 28, 28) in [0, 1]: a 4x4 colour grid per image, upsampled."""
    coarse = torch.from_numpy(rng.uniform(0.0, 0.6, size=(n, 3, 4, 4))).float()
    return F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False).clamp(0, 1)


def domains(seed: int):
    """(source x, source y, target x (unlabelled), source test x, y, target test x, y), normalised
    as the program's transforms do."""
    train_raw, train_y, test_raw, test_y = data.digit_images(seed=seed)
    rng = np.random.default_rng(1000 + seed)
    half = len(train_y) // 2
    digits = data.upscaled(train_raw, image_size)
    test_digits = data.upscaled(test_raw, image_size)

    def source(x: torch.Tensor) -> torch.Tensor:
        return (x - 0.1307) / 0.3081

    def mnist_m(x: torch.Tensor) -> torch.Tensor:
        blended = (_backgrounds(len(x), rng) - x).abs()  # |patch - digit|, 3 channels
        return (blended - 0.5) / 0.5

    return (source(digits[:half]), train_y[:half], mnist_m(digits[half:]), source(test_digits), test_y,
            mnist_m(test_digits), test_y)


# --------------------------------------------------------------------------- train/test.py


def test(my_net: CNNModel, images: torch.Tensor, labels: torch.Tensor) -> float:
    my_net = my_net.eval()
    n_correct, n_total, alpha = 0, 0, 0
    with torch.no_grad():
        for start in range(0, len(labels), 128):
            t_img, t_label = images[start : start + 128], labels[start : start + 128]
            class_output, _ = my_net(input_data=t_img, alpha=alpha)
            pred = class_output.data.max(1, keepdim=True)[1]
            n_correct += int(pred.eq(t_label.view_as(pred)).sum())
            n_total += len(t_label)
    return n_correct / n_total


# --------------------------------------------------------------------------- train/main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    s_x, s_y, t_x, s_test_x, s_test_y, t_test_x, t_test_y = domains(seed)
    gen = torch.Generator().manual_seed(seed)

    my_net = CNNModel(variant)
    optimizer = torch.optim.Adam(my_net.parameters(), lr=lr)
    loss_class = torch.nn.NLLLoss()
    loss_domain = torch.nn.NLLLoss()
    for p in my_net.parameters():
        p.requires_grad = True

    def class_loss(output, target):  # the program's class loss, on the class head of the (class, domain) pair
        return loss_class(output[0], target)

    probe_batch = ((s_x[:batch_size], 0.0), s_y[:batch_size])
    nx.preflight(my_net, probe_batch, class_loss, optimizer=optimizer)
    mon = nx.monitor(my_net, optimizer, every=10)

    len_source, len_target = len(s_y) // batch_size, len(t_x) // batch_size  # drop_last-like, full batches
    errs: list[tuple[float, float, float]] = []
    source_acc = target_acc = float("nan")
    for epoch in range(n_epoch):
        my_net.train()
        len_dataloader = min(len_source, len_target)
        s_order = torch.randperm(len(s_y), generator=gen)
        t_order = torch.randperm(len(t_x), generator=gen)
        i = 0
        while i < len_dataloader:
            p = float(i + epoch * len_dataloader) / n_epoch / len_dataloader
            alpha = 2.0 / (1.0 + np.exp(-10 * p)) - 1

            idx = s_order[i * batch_size : (i + 1) * batch_size]
            s_img, s_label = s_x[idx], s_y[idx]
            my_net.zero_grad()
            domain_label = torch.zeros(len(s_label)).long()
            class_output, domain_output = my_net(input_data=s_img, alpha=alpha)
            err_s_label = loss_class(class_output, s_label)
            err_s_domain = loss_domain(domain_output, domain_label)

            t_img = t_x[t_order[i * batch_size : (i + 1) * batch_size]]
            domain_label = torch.ones(len(t_img)).long()
            _, domain_output = my_net(input_data=t_img, alpha=alpha)
            err_t_domain = loss_domain(domain_output, domain_label)
            err = err_t_domain + err_s_domain + err_s_label
            err.backward()
            optimizer.step()
            mon.log(err)
            i += 1
            errs.append((err_s_label.item(), err_s_domain.item(), err_t_domain.item()))

        source_acc = test(my_net, s_test_x, s_test_y)
        target_acc = test(my_net, t_test_x, t_test_y)

    nx.finish(mon, my_net, probe_batch, class_loss, optimizer=optimizer)
    last = np.array(errs[-len_dataloader:])
    return {
        "target_acc": target_acc,
        "source_acc": source_acc,
        "err_s_label": float(last[:, 0].mean()),
        "err_s_domain": float(last[:, 1].mean()),
        "err_t_domain": float(last[:, 2].mean()),
    }
