"""Port of d2l-ai/d2l-en's ResNet chapter (PyTorch tab): ``Residual`` blocks, the ``ResNet``
classifier assembled from ``b1`` and ``block``, ``ResNet18``, initialised with ``apply_init``
/ ``init_cnn`` and trained with d2l's ``Trainer`` on its ``FashionMNIST`` data module.

Source: github.com/d2l-ai/d2l-en, ``chapter_convolutional-modern/resnet.md`` and
``d2l/torch.py`` (``Module.apply_init``, ``init_cnn``, ``FashionMNIST``) at commit
23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0). Written anew from the facts of
those files; no code copied. d2l's ``Module``, ``Classifier``, ``DataModule`` and ``Trainer``
come from :mod:`bench.programs.d2l` (nndx wired into ``Trainer.fit`` there).

Kept: ``Residual`` (LazyConv2d 3x3 -> LazyBatchNorm2d -> ReLU -> LazyConv2d 3x3 ->
LazyBatchNorm2d, an optional 1x1 LazyConv2d on the shortcut with the block's stride, ``Y +=
X``, ReLU); ``ResNet(d2l.Classifier)``: ``b1`` (LazyConv2d 7x7 stride 2 padding 3 ->
LazyBatchNorm2d -> ReLU -> MaxPool2d(3, 2, 1)), ``block`` (the first residual of every stage but
the first halves the side with a 1x1 shortcut), ``AdaptiveAvgPool2d`` -> ``Flatten`` ->
``LazyLinear``; ``self.net.apply(d2l.init_cnn)`` in ``__init__`` (a no-op on lazy modules, as
in the book) and ``model.apply_init([first batch], d2l.init_cnn)`` (Xavier-uniform conv and
linear weights after the lazy shapes are known); ``ResNet18(lr=0.01)`` with its four stages of
two residuals; d2l's ``Classifier`` loss (cross-entropy) and SGD at ``lr``; ``Trainer.fit``
(per batch: loss, ``zero_grad``, ``backward``, ``step``; per epoch a validation pass in eval
mode); ``FashionMNIST``'s ``Resize`` + ``ToTensor`` with no normalisation, batch 128.
Shrunk / replaced: scikit-learn's 8x8 digits (``DigitsData``) resized to 32x32 (bilinear) in
place of Fashion-MNIST at 96x96; ResNet18's channels 64/64/128/256/512 -> 16/16/32/64/128
(the same four stages of two residuals); 6 epochs instead of 10; CPU.

nndx, as the author would add it: through d2l's ``Trainer.fit`` (preflight probe on the
first batch with the optimizer, a Monitor around the epochs logging each batch's loss and
each epoch's validation loss and accuracy, the final probe with the Monitor).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from bench.programs import d2l
from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_resnet"
SOURCE = Source("d2l-ai/d2l-en", "chapter_convolutional-modern/resnet.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's ResNet18 as published (shrunk: 32x32 digits, channels / 4, 6 epochs)"),
        Variant(
            "lr_too_high",
            "ResNet18(lr=3.0) instead of lr=0.01 (a learning rate copied from a setup with another batch size / "
            "schedule): plain SGD with steps 300x larger, the loss jumps and the validation accuracy collapses",
            (C.LR_TOO_HIGH,),
            ("https://arxiv.org/abs/1910.11015 (Humbatova et al., Taxonomy of Real Faults in Deep Learning Systems, "
             "ICSE 2020: 'suboptimal learning rate')",
             "https://doi.org/10.1145/3213846.3213866 (Zhang et al., An Empirical Study on TensorFlow Program Bugs, "
             "ISSTA 2018)",
             "https://arxiv.org/abs/1906.01388 (Islam et al., A Comprehensive Study on Deep Learning Bug "
             "Characteristics, FSE 2019)"),
            Measure("val_acc", "final validation accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "train_mode_not_restored",
            "the Trainer's fit_epoch leaves out self.model.train(): after the first epoch's validation pass "
            "(model.eval()) every later epoch trains with the BatchNorm layers in eval mode, normalising with "
            "running statistics frozen at the end of epoch 1 while the weights move on",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://techqa.club/v/q/why-does-the-accuracy-fluctuate-widely-after-using-batch-normalization-74946623 "
             "(d2l's Residual/ResNet18, train/eval switching of BatchNorm)",
             "https://discuss.pytorch.org/t/what-does-model-eval-do-for-batchnorm-layer/7146",
             "https://arxiv.org/abs/1910.11015 (Humbatova et al., ICSE 2020: 'missing/wrong mode switch "
             "(train/eval)')"),
            Measure("val_acc", "final validation accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

SIDE, BATCH_SIZE, EPOCHS = 32, 128, 6
CHANNELS = (16, 16, 32, 64, 128)  # ResNet18's 64, 64, 128, 256, 512 divided by 4


def init_cnn(module: nn.Module) -> None:  # d2l.init_cnn
    if type(module) == nn.Linear or type(module) == nn.Conv2d:  # noqa: E721 - the book's test
        nn.init.xavier_uniform_(module.weight)


class Residual(nn.Module):
    """The Residual block of ResNet models."""

    def __init__(self, num_channels: int, use_1x1conv: bool = False, strides: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.LazyConv2d(num_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.LazyBatchNorm2d()
        self.bn2 = nn.LazyBatchNorm2d()

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


class ResNet(d2l.Classifier):
    def b1(self):
        return nn.Sequential(
            nn.LazyConv2d(CHANNELS[0], kernel_size=7, stride=2, padding=3),
            nn.LazyBatchNorm2d(), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1))  # fmt: skip

    def block(self, num_residuals, num_channels, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(num_channels))
        return nn.Sequential(*blk)

    def __init__(self, arch, lr=0.1, num_classes=10):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(self.b1())
        for i, b in enumerate(arch):
            self.net.add_module(f"b{i + 2}", self.block(*b, first_block=(i == 0)))
        self.net.add_module("last", nn.Sequential(
            nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
            nn.LazyLinear(num_classes)))  # fmt: skip
        self.net.apply(init_cnn)

    def apply_init(self, inputs, init=None):  # d2l.Module.apply_init
        self.forward(*inputs)
        if init is not None:
            self.net.apply(init)


class ResNet18(ResNet):
    def __init__(self, lr=0.1, num_classes=10):
        super().__init__(((2, CHANNELS[1]), (2, CHANNELS[2]), (2, CHANNELS[3]), (2, CHANNELS[4])),
                         lr, num_classes)  # fmt: skip


class ResizedDigits(d2l.DigitsData):
    """d2l.FashionMNIST(batch_size, resize=(side, side)): Resize + ToTensor on the digits."""

    def __init__(self, batch_size: int = 64, resize=(SIDE, SIDE), seed: int = 0) -> None:
        d2l.DataModule.__init__(self)
        self.batch_size, self.resize = batch_size, resize
        tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
        self.train = (digits.upscaled(tr_x, resize[0]), tr_y)
        self.val = (digits.upscaled(te_x, resize[0]), te_y)


class TrainModeNotRestored(d2l.Trainer):
    """The bug: d2l's fit_epoch with its first line, ``self.model.train()``, left out."""

    def fit_epoch(self):
        # self.model.train()  <- left out
        for batch in self.train_dataloader:
            loss = self.model.training_step(self.prepare_batch(batch))
            self.optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                self.optim.step()
            self.nx.timed(lambda: self.mon.log(loss))  # noqa: B023
            self.train_batch_idx += 1
        if self.val_dataloader is None:
            return
        self.model.eval()
        for batch in self.val_dataloader:
            with torch.no_grad():
                self.model.validation_step(self.prepare_batch(batch))
            self.val_batch_idx += 1
        val_loss, val_acc = self.model.board.data["val_loss"][-1], self.model.board.data["val_acc"][-1]
        self.nx.timed(lambda: self.mon.log(val_loss, split="val", accuracy=val_acc))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    model = ResNet18(lr=3.0 if variant == "lr_too_high" else 0.01)
    trainer_cls = TrainModeNotRestored if variant == "train_mode_not_restored" else d2l.Trainer
    trainer = trainer_cls(max_epochs=EPOCHS, nx=nx, num_gpus=1)
    data = ResizedDigits(batch_size=BATCH_SIZE, resize=(SIDE, SIDE), seed=seed)
    model.apply_init([next(iter(data.get_dataloader(True)))[0]], init_cnn)
    trainer.fit(model, data)
    board = model.board.data
    return {"val_acc": board["val_acc"][-1], "val_loss": board["val_loss"][-1],
            "train_loss": board["train_loss"][-1], "best_val_acc": max(board["val_acc"])}  # fmt: skip
