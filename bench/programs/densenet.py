"""Port of bamos/densenet.pytorch: a DenseNet-BC (bottleneck layers, compression 0.5) trained
on CIFAR-10 with SGD, momentum and a step learning-rate schedule.

Source: github.com/bamos/densenet.pytorch, ``train.py`` and ``densenet.py`` at commit
d1cd5e1957975628286e516512c6d1c14430f810 (Apache-2.0, Copyright Brandon Amos). Written anew
from the facts of those files; no code copied.

Kept: ``Bottleneck`` (``bn1`` -> ``F.relu`` -> 1x1 ``conv1`` to ``4 * growthRate`` channels,
no bias -> ``bn2`` -> ``F.relu`` -> 3x3 ``conv2`` (padding 1, no bias) to ``growthRate``
channels, then ``torch.cat((x, out), 1)``); ``Transition`` (``bn1`` -> ``F.relu`` -> 1x1 conv
to ``floor(nChannels * reduction)`` channels -> ``F.avg_pool2d(out, 2)``); ``DenseNet(growthRate,
depth, reduction=0.5, nClasses=10, bottleneck=True)``: ``nDenseBlocks = (depth - 4) // 3``
halved for bottlenecks, a 3x3 stem conv to ``2 * growthRate`` channels, three dense blocks
with two transitions between them, a final ``BatchNorm2d``, ``F.relu``, ``F.avg_pool2d(.., 8)``,
``torch.squeeze``, ``Linear`` and ``F.log_softmax`` (the original's implicit dim, which is 1
for a 2-d input); the init (convs ``normal_(0, sqrt(2 / (k * k * out_channels)))``, BN
weights 1 and biases 0, linear biases 0); ``train.py``'s ``F.nll_loss`` on the model's
log-probabilities, ``optim.SGD(lr=1e-1, momentum=0.9, weight_decay=1e-4)``, ``adjust_opt``
(lr 1e-1 before the half-way epoch, set to 1e-2 at it and to 1e-3 at three quarters (integer
epochs), else left alone) called at the start of every epoch (1-based); ``train`` (``net.train()``, per
batch ``zero_grad`` / forward / ``nll_loss`` / ``backward`` / ``step``, the error from
``output.data.max(1)[1]``) and ``test`` (``net.eval()``, no gradient, the per-batch
``nll_loss`` averaged over the batches, the error over the whole test set); the training
transform ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip`` + ``ToTensor`` +
``Normalize`` with the training set's per-channel mean/std (what ``compute-cifar10-mean.py``
computes), the test transform without the augmentation; a shuffled train loader and an
unshuffled test loader, both of batch 64.
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 test) upsampled to 16x16, 3
equal channels, instead of 32x32 CIFAR-10 (so ``RandomCrop(16, padding=2)`` and the last map
4x4 under ``F.avg_pool2d(.., 4)``, still a global average, instead of 8x8 under 8); depth 22
(3 bottlenecks per block: 24 -> 60 -> 30 -> 66 -> 33 -> 69 channels) instead of 100 (16 per
block); 10 epochs with the steps at epochs 5 and 7 (1-based) instead of 300 with the steps at
150 and 225; no checkpoints, CSV files or plots.
The bug of PyTorch before pytorch/pytorch#708 (variant ``conv_grad_noncontiguous``) is
reproduced on the CPU by a ``Conv2d`` whose backward reads a non-contiguous ``grad_output`` as
a dense block from its first element, as the cuDNN path then did; that variant builds the
network with it in place of every ``nn.Conv2d``.
Measure only (not in the program): the test set's cross-entropy recomputed from the
model's outputs (``F.cross_entropy``, which equals ``test``'s ``nll_loss`` when the outputs
are log-probabilities).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with ``F.nll_loss``, the optimizer and the data splits; ``nndx.Monitor(net, optimizer)``
around the epochs with ``F.nll_loss`` called as ``mon.loss_fn``, each batch's loss and
accuracy logged, each ``test``'s loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "densenet"
SOURCE = Source("bamos/densenet.pytorch", "train.py", "d1cd5e1957975628286e516512c6d1c14430f810", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (DenseNet-BC, growth 12, SGD lr 0.1 with the step schedule)"),
        Variant(
            "logits_into_nll_loss",
            "DenseNet.forward returns self.fc(out) without the final F.log_softmax (the form torchvision's "
            "DenseNet has) while train and test keep F.nll_loss: the loss is minus the raw target logit, "
            "unbounded below, so training pushes the target logit up without ever pushing the others down",
            (C.WRONG_LOSS, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/pytorch/pytorch/pull/12703", "https://codestudyblog.com/8ten8/80409021901.html"),
            Measure("test_ce", "final test cross-entropy 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "conv_grad_noncontiguous",
            "the convolutions' backward of a PyTorch build before pytorch/pytorch#708 with cuDNN, the bug this "
            "repository's README tells of: the grad_output a conv receives from torch.cat's backward is a "
            "non-contiguous slice, and the kernel read it as if it were dense from its first element, so each "
            "Bottleneck's conv2 (and everything below it on that path) gets a scrambled gradient; the forward "
            "is exact",
            (C.BROKEN_BACKWARD,),
            ("https://github.com/pytorch/pytorch/pull/708",
             "https://discuss.pytorch.org/t/help-debugging-densenet-model-on-cifar-10/412",
             "https://github.com/bamos/densenet.pytorch/issues/1"),
            Measure("test_error", "final test error 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

SIDE, PAD, POOL = 16, 2, 4
ARGS = {"batchSz": 64, "nEpochs": 10, "growthRate": 12, "depth": 22, "reduction": 0.5}


# --------------------------------------------------------------------------- the bug in PyTorch before #708


class _ConvBefore708(torch.autograd.Function):
    """conv2d (stride 1, no bias) whose backward reads a non-contiguous grad_output as if it were
    laid out densely from its first element, as the cuDNN path did before pytorch/pytorch#708."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor, padding: int) -> torch.Tensor:  # noqa: A002
        ctx.save_for_backward(input, weight)
        ctx.padding = padding
        return F.conv2d(input, weight, None, 1, padding)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        input, weight = ctx.saved_tensors  # noqa: A001
        if not grad_output.is_contiguous():
            n, c, h, w = grad_output.shape
            grad_output = torch.as_strided(grad_output, grad_output.shape, (c * h * w, h * w, w, 1),
                                           grad_output.storage_offset())  # fmt: skip
        grad_input = torch.nn.grad.conv2d_input(input.shape, weight, grad_output, padding=ctx.padding)
        grad_weight = torch.nn.grad.conv2d_weight(input, weight.shape, grad_output, padding=ctx.padding)
        return grad_input, grad_weight, None


class Conv2dBefore708(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ConvBefore708.apply(x, self.weight, self.padding[0])


# --------------------------------------------------------------------------- densenet.py


class Bottleneck(nn.Module):
    def __init__(self, nChannels: int, growthRate: int, conv=nn.Conv2d) -> None:
        super().__init__()
        interChannels = 4 * growthRate
        self.bn1 = nn.BatchNorm2d(nChannels)
        self.conv1 = conv(nChannels, interChannels, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(interChannels)
        self.conv2 = conv(interChannels, growthRate, kernel_size=3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat((x, out), 1)


class Transition(nn.Module):
    def __init__(self, nChannels: int, nOutChannels: int, conv=nn.Conv2d) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(nChannels)
        self.conv1 = conv(nChannels, nOutChannels, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        return F.avg_pool2d(out, 2)


class DenseNet(nn.Module):
    def __init__(self, growthRate: int, depth: int, reduction: float, nClasses: int, bottleneck: bool,
                 log_softmax: bool = True, conv=nn.Conv2d) -> None:  # fmt: skip
        super().__init__()
        nDenseBlocks = (depth - 4) // 3
        if bottleneck:
            nDenseBlocks //= 2
        self.log_softmax = log_softmax

        nChannels = 2 * growthRate
        self.conv1 = conv(3, nChannels, kernel_size=3, padding=1, bias=False)
        self.dense1 = self._make_dense(nChannels, growthRate, nDenseBlocks, conv)
        nChannels += nDenseBlocks * growthRate
        nOutChannels = int(math.floor(nChannels * reduction))
        self.trans1 = Transition(nChannels, nOutChannels, conv)

        nChannels = nOutChannels
        self.dense2 = self._make_dense(nChannels, growthRate, nDenseBlocks, conv)
        nChannels += nDenseBlocks * growthRate
        nOutChannels = int(math.floor(nChannels * reduction))
        self.trans2 = Transition(nChannels, nOutChannels, conv)

        nChannels = nOutChannels
        self.dense3 = self._make_dense(nChannels, growthRate, nDenseBlocks, conv)
        nChannels += nDenseBlocks * growthRate

        self.bn1 = nn.BatchNorm2d(nChannels)
        self.fc = nn.Linear(nChannels, nClasses)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.bias.data.zero_()

    @staticmethod
    def _make_dense(nChannels: int, growthRate: int, nDenseBlocks: int, conv) -> nn.Sequential:
        layers = []
        for _ in range(int(nDenseBlocks)):
            layers.append(Bottleneck(nChannels, growthRate, conv))
            nChannels += growthRate
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        out = self.trans1(self.dense1(out))
        out = self.trans2(self.dense2(out))
        out = self.dense3(out)
        out = torch.squeeze(F.avg_pool2d(F.relu(self.bn1(out)), POOL))
        out = self.fc(out)
        if self.log_softmax:
            out = F.log_softmax(out, dim=1)  # the original's implicit dim: 1 for a 2-d input
        return out


# --------------------------------------------------------------------------- train.py


class DigitsCIFAR(Dataset):
    """The digits as torchvision's CIFAR10 with train.py's transforms; the random crop and flip
    draw from the dataset's own generator."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std, train: bool, generator=None) -> None:
        self.images, self.labels, self.train, self.generator = images, labels, train, generator
        self.mean, self.std = mean.view(3, 1, 1), std.view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.images[i]
        if self.train:  # RandomCrop(32, padding=4), RandomHorizontalFlip(), at this size
            padded = F.pad(img, (PAD, PAD, PAD, PAD))
            top, left = torch.randint(0, 2 * PAD + 1, (2,), generator=self.generator).tolist()
            img = padded[:, top : top + SIDE, left : left + SIDE]
            if torch.rand(1, generator=self.generator).item() < 0.5:
                img = img.flip(-1)
        return (img - self.mean) / self.std, self.labels[i]  # ToTensor(), Normalize(normMean, normStd)


def adjust_opt(optimizer: optim.Optimizer, epoch: int, n_epochs: int) -> None:
    """``adjust_opt('sgd', ...)``: 150 and 225 of 300 epochs, here the same fractions of ``n_epochs``."""
    if epoch < n_epochs // 2:
        lr = 1e-1
    elif epoch == n_epochs // 2:
        lr = 1e-2
    elif epoch == 3 * n_epochs // 4:
        lr = 1e-3
    else:
        return
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train = data.upscaled(train_raw, SIDE).repeat(1, 3, 1, 1)
    x_test = data.upscaled(test_raw, SIDE).repeat(1, 3, 1, 1)
    norm_mean, norm_std = x_train.mean(dim=(0, 2, 3)), x_train.std(dim=(0, 2, 3))  # compute-cifar10-mean.py

    trainLoader = DataLoader(
        DigitsCIFAR(x_train, train_labels, norm_mean, norm_std, train=True, generator=torch.Generator().manual_seed(seed)),
        batch_size=args["batchSz"], shuffle=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testLoader = DataLoader(DigitsCIFAR(x_test, test_labels, norm_mean, norm_std, train=False),
                            batch_size=args["batchSz"], shuffle=False)  # fmt: skip

    net = DenseNet(growthRate=args["growthRate"], depth=args["depth"], reduction=args["reduction"], bottleneck=True,
                   nClasses=10, log_softmax=variant != "logits_into_nll_loss",
                   conv=Conv2dBefore708 if variant == "conv_grad_noncontiguous" else nn.Conv2d)  # fmt: skip
    optimizer = optim.SGD(net.parameters(), lr=1e-1, momentum=0.9, weight_decay=1e-4)

    normalise = lambda x: (x - norm_mean.view(1, 3, 1, 1)) / norm_std.view(1, 3, 1, 1)  # noqa: E731
    splits = (normalise(x_train), train_labels, normalise(x_test), test_labels)
    first_batch = (splits[0][: args["batchSz"]], train_labels[: args["batchSz"]])
    nx.preflight(net, first_batch, F.nll_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(net, optimizer, every=5, loss_fn=F.nll_loss)

    history: dict[str, list[float]] = {"train_loss": [], "test_loss": [], "test_error": [], "test_ce": []}

    def train_epoch(epoch: int) -> None:
        net.train()
        losses = []
        for batch_idx, (batch, target) in enumerate(trainLoader):
            optimizer.zero_grad()
            output = net(batch)
            loss = mon.loss_fn(output, target)
            loss.backward()
            optimizer.step()
            pred = output.data.max(1)[1]  # get the index of the max log-probability
            incorrect = pred.ne(target.data).sum().item()
            mon.log(loss, accuracy=1.0 - incorrect / len(batch))
            losses.append(loss.item())
        history["train_loss"].append(sum(losses) / len(losses))

    def test(epoch: int) -> None:
        net.eval()
        test_loss, test_ce, incorrect = 0.0, 0.0, 0
        with torch.no_grad():
            for batch, target in testLoader:
                output = net(batch)
                test_loss += F.nll_loss(output, target).item()
                test_ce += F.cross_entropy(output, target, reduction="sum").item()  # measure only
                pred = output.data.max(1)[1]
                incorrect += pred.ne(target.data).sum().item()
        test_loss /= len(testLoader)  # loss function already averages over batch size
        n_total = len(testLoader.dataset)
        err = 100.0 * incorrect / n_total
        history["test_loss"].append(test_loss)
        history["test_error"].append(err)
        history["test_ce"].append(test_ce / n_total)
        mon.log(test_loss, split="val", accuracy=1.0 - err / 100.0)

    for epoch in range(1, args["nEpochs"] + 1):
        adjust_opt(optimizer, epoch, args["nEpochs"])
        train_epoch(epoch)
        test(epoch)

    nx.finish(mon, net, first_batch, F.nll_loss, optimizer=optimizer, data=splits)
    return {"test_error": history["test_error"][-1], "test_loss": history["test_loss"][-1],
            "test_ce": history["test_ce"][-1], "final_train_loss": history["train_loss"][-1],
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
