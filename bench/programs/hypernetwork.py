"""Port of g1910/HyperNetworks: a static hypernetwork (Ha et al. 2016) generating the 3x3
kernels of a residual CNN from learned per-kernel embeddings z; Adam with a MultiStepLR.

Source: github.com/g1910/HyperNetworks, ``primary_net.py``, ``hypernetwork_modules.py``,
``resnet_blocks.py`` and ``train.py`` at commit 5b75f2b959141ece82a47c3b0e6246b91fea4246
(GPL-3.0). Written anew from the facts of those files; no code copied.

Kept: ``HyperNetwork(f_size=3, z_dim=64, out_size=16, in_size=16)`` with its two linear
maps as raw parameters (``w2``/``b2``: z to ``in_size`` vectors of ``z_dim``; ``w1``/``b1``:
each of those to ``out_size * 3 * 3``), all initialised ``fmod(randn, 2)``; ``forward(z)``:
``matmul(z, w2) + b2`` viewed as ``(in_size, z_dim)``, ``matmul(., w1) + b1`` viewed as the
kernel ``(out_size, in_size, 3, 3)``; ``Embedding(z_num, z_dim)``: an ``h x k`` grid of
``z`` parameters (``fmod(randn(z_dim), 2)``) in a ``ParameterList``, whose 16x16 kernels are
concatenated along the input channels (``dim=1``) and then the output channels (``dim=0``)
into the layer's kernel; ``ResNetBlock(in, out, downsample)``: ``F.conv2d`` with the
generated kernels (stride 2 and a 1x1 stride-2 ``Conv2d`` shortcut when downsampling, the
identity otherwise), BN + ReLU, conv, BN, ``out += residual``, ReLU; ``PrimaryNetwork``:
``conv1`` 3x3 + ``bn1`` + ReLU, the blocks fed ``zs[2i](hope)`` and ``zs[2i+1](hope)`` from
the one shared hypernetwork ``hope``, ``AvgPool2d`` over the last map, ``final`` =
``Linear(64, 10)``; ``train.py``: ``CrossEntropyLoss``, ``optim.Adam(net.parameters(),
lr=0.002, weight_decay=0.0005)``, ``MultiStepLR(milestones, gamma=0.5)`` with milestones in
iterations and ``lr_scheduler.step()`` after every ``optimizer.step()``; per batch
``zero_grad``, forward, loss, ``backward``, ``step``; the running loss printed every
``print_freq`` iterations (kept as a record); after each epoch the test accuracy (the
network left in train mode, as ``train.py`` leaves it: its BatchNorms use the test batch's
statistics) and the best accuracy kept (a checkpoint in memory, not ``torch.save``); the
train transform ``RandomCrop`` with padding + ``Normalize``, the test transform
``Normalize``; a shuffled train loader and an unshuffled test loader of batch 128.
Shrunk: scikit-learn's 8x8 digits (1 channel, 1,437 train / 360 test) instead of CIFAR-10
(3 x 32 x 32), so ``conv1`` takes 1 channel; 3 residual blocks (16->16, 16->32 and
32->64, the last two downsampling: 8x8 -> 4x4 -> 2x2, ``AvgPool2d(2)``) instead of 18
(6 per stage), hence 6 embeddings of 1x1, 1x1, 2x1, 2x2, 4x2, 4x4 z's instead of 36;
``RandomCrop(8, padding=1)`` instead of ``RandomCrop(32, padding=4)`` and no horizontal flip
(a flipped digit is another digit); the normalisation by the training pixels' mean and std;
``max_iter`` 270 instead of 1,000,000 (the loop, as in ``train.py``, checks it between epochs:
23 epochs of 12 batches, 276 iterations), the milestones scaled with it (168k, 336k, 400k,
450k, 550k, 600k of 1M -> 45, 91, 108, 122, 148, 162 of 270).
Measure only (not in the program): the last epoch's test accuracy (the program's own
printout), and the best.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(normalised, not cropped) with the data splits and the optimizer, ``nndx.Monitor`` around
the loop with ``criterion`` called as ``mon.loss_fn``, every batch's loss and accuracy
logged, each epoch's test loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.parameter import Parameter
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "hypernetwork"
SOURCE = Source("g1910/HyperNetworks", "primary_net.py", "5b75f2b959141ece82a47c3b0e6246b91fea4246", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: digits, 3 residual blocks, 276 iterations)"),
        Variant(
            "kernel_wrapped_in_parameter",
            "each generated kernel is wrapped as nn.Parameter(self.zs[i](self.hope)) before F.conv2d: a new leaf "
            "tensor, so no gradient reaches the hypernetwork or the z embeddings and the kernels stay at their "
            "random initial values (only conv1, the BatchNorms, the shortcuts and final learn)",
            (C.DETACHED_GRAPH,),
            ("https://discuss.pytorch.org/t/what-is-the-most-convenient-way-to-make-model-weights-dependent-on-some-parameter/47645",
             "https://github.com/AUTOMATIC1111/stable-diffusion-webui/issues/3518",
             "https://github.com/chr5tphr/zennit/pull/185"),
            Measure("test_acc", "last epoch's test accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "milestones_in_epochs",
            "the MultiStepLR milestones given in epochs (4, 8, 9, 10, 13, 14 of 23) while train.py steps the "
            "scheduler every iteration: the learning rate is halved six times within the first 14 iterations "
            "(0.002 -> 3.1e-5) and stays there for the remaining 262",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/bshall/Tacotron/issues/3",
             "https://github.com/cszn/KAIR/issues/101",
             "https://github.com/facebookresearch/detectron2/issues/2058"),
            Measure("test_acc", "last epoch's test accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

Z_DIM, BATCH_SIZE, MAX_ITER, PRINT_FREQ = 64, 128, 270, 5
LEARNING_RATE, WEIGHT_DECAY = 0.002, 0.0005
MILESTONES = [45, 91, 108, 122, 148, 162]  # 168k, 336k, 400k, 450k, 550k, 600k of 1M iterations, scaled to 270
MILESTONES_IN_EPOCHS = [4, 8, 9, 10, 13, 14]  # the same fractions of the 23 epochs, rounded


# --------------------------------------------------------------------------- hypernetwork_modules.py


class HyperNetwork(nn.Module):
    def __init__(self, f_size: int = 3, z_dim: int = 64, out_size: int = 16, in_size: int = 16) -> None:
        super().__init__()
        self.z_dim, self.f_size, self.out_size, self.in_size = z_dim, f_size, out_size, in_size
        self.w1 = Parameter(torch.fmod(torch.randn(z_dim, out_size * f_size * f_size), 2))
        self.b1 = Parameter(torch.fmod(torch.randn(out_size * f_size * f_size), 2))
        self.w2 = Parameter(torch.fmod(torch.randn(z_dim, in_size * z_dim), 2))
        self.b2 = Parameter(torch.fmod(torch.randn(in_size * z_dim), 2))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h_in = (torch.matmul(z, self.w2) + self.b2).view(self.in_size, self.z_dim)
        h_final = torch.matmul(h_in, self.w1) + self.b1
        return h_final.view(self.out_size, self.in_size, self.f_size, self.f_size)


# --------------------------------------------------------------------------- resnet_blocks.py


class IdentityLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ResNetBlock(nn.Module):
    def __init__(self, in_size: int = 16, out_size: int = 16, downsample: bool = False) -> None:
        super().__init__()
        self.in_size, self.out_size = in_size, out_size
        if downsample:
            self.stride1 = 2
            self.reslayer: nn.Module = nn.Conv2d(in_size, out_size, kernel_size=1, stride=2)
        else:
            self.stride1 = 1
            self.reslayer = IdentityLayer()
        self.bn1 = nn.BatchNorm2d(out_size)
        self.bn2 = nn.BatchNorm2d(out_size)

    def forward(self, x: torch.Tensor, conv1_w: torch.Tensor, conv2_w: torch.Tensor) -> torch.Tensor:
        residual = self.reslayer(x)
        out = F.relu(self.bn1(F.conv2d(x, conv1_w, stride=self.stride1, padding=1)), inplace=True)
        out = self.bn2(F.conv2d(out, conv2_w, padding=1))
        out += residual
        return F.relu(out)


# --------------------------------------------------------------------------- primary_net.py


class Embedding(nn.Module):
    def __init__(self, z_num: tuple[int, int], z_dim: int) -> None:
        super().__init__()
        self.z_list = nn.ParameterList()
        self.z_num, self.z_dim = z_num, z_dim
        h, k = z_num
        for _ in range(h * k):
            self.z_list.append(Parameter(torch.fmod(torch.randn(z_dim), 2)))

    def forward(self, hyper_net: HyperNetwork) -> torch.Tensor:
        h, k = self.z_num
        rows = [torch.cat([hyper_net(self.z_list[i * k + j]) for j in range(k)], dim=1) for i in range(h)]
        return torch.cat(rows, dim=0)


class PrimaryNetwork(nn.Module):
    def __init__(self, z_dim: int = 64, wrap_kernels: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.z_dim = z_dim
        self.hope = HyperNetwork(z_dim=z_dim)
        self.zs_size = [(1, 1), (1, 1), (2, 1), (2, 2), (4, 2), (4, 4)]
        self.filter_size = [(16, 16), (16, 32), (32, 64)]
        self.res_net = nn.ModuleList(
            ResNetBlock(self.filter_size[i][0], self.filter_size[i][1], downsample=i > 0) for i in range(3)
        )
        self.zs = nn.ModuleList(Embedding(self.zs_size[i], z_dim) for i in range(6))
        self.global_avg = nn.AvgPool2d(2)
        self.final = nn.Linear(64, 10)
        self.wrap_kernels = wrap_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        for i in range(3):
            w1 = self.zs[2 * i](self.hope)
            w2 = self.zs[2 * i + 1](self.hope)
            if self.wrap_kernels:
                w1, w2 = Parameter(w1), Parameter(w2)
            x = self.res_net[i](x, w1, w2)
        x = self.global_avg(x)
        return self.final(x.view(-1, 64))


# --------------------------------------------------------------------------- train.py


class Digits(Dataset):
    """The digits through train.py's transforms: RandomCrop with padding (train) + Normalize."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float, train: bool,
                 generator: torch.Generator | None = None) -> None:  # fmt: skip
        self.images, self.labels = (images - mean) / std, labels
        self.train, self.generator = train, generator
        self.pad_value = -mean / std  # a zero pixel, normalised

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if self.train:  # RandomCrop(8, padding=1): zero padding of the ToTensor image, then Normalize
            padded = F.pad(image, (1, 1, 1, 1), value=self.pad_value)
            top, left = (int(v) for v in torch.randint(0, 3, (2,), generator=self.generator))
            image = padded[:, top:top + 8, left:left + 8]
        return image, self.labels[i]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_raw), data.to_tensor(test_raw)
    mean, std = float(train_x.mean()), float(train_x.std())
    trainset = Digits(train_x, train_labels, mean, std, train=True, generator=torch.Generator().manual_seed(seed))
    testset = Digits(test_x, test_labels, mean, std, train=False)
    trainloader = DataLoader(trainset, batch_size=BATCH_SIZE, shuffle=True,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testloader = DataLoader(testset, batch_size=BATCH_SIZE, shuffle=False)

    net = PrimaryNetwork(z_dim=Z_DIM, wrap_kernels=variant == "kernel_wrapped_in_parameter")
    optimizer = optim.Adam(net.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    milestones = MILESTONES_IN_EPOCHS if variant == "milestones_in_epochs" else MILESTONES
    lr_scheduler = optim.lr_scheduler.MultiStepLR(optimizer=optimizer, milestones=milestones, gamma=0.5)
    criterion = nn.CrossEntropyLoss()

    splits = (trainset.images, train_labels, testset.images, test_labels)
    first_batch = (trainset.images[:BATCH_SIZE], train_labels[:BATCH_SIZE])
    nx.preflight(net, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(net, optimizer, every=5, loss_fn=criterion)

    printed: list[str] = []
    best_accuracy, best = 0.0, {}
    accuracy = test_loss = float("nan")
    total_iter, epochs = 0, 0
    while total_iter < MAX_ITER:
        running_loss = 0.0
        for i, (inputs, labels) in enumerate(trainloader):
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = mon.loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            running_loss += loss.item()
            mon.log(loss, accuracy=(outputs.argmax(1) == labels).float().mean().item())
            if i % PRINT_FREQ == PRINT_FREQ - 1:
                printed.append(f"[Epoch {epochs + 1}, Total Iterations {total_iter + 1:6d}] "
                               f"Loss: {running_loss / PRINT_FREQ:.4f}")  # fmt: skip
                running_loss = 0.0
            total_iter += 1
        epochs += 1

        correct, total, loss_sum = 0, 0, 0.0
        with torch.no_grad():  # train.py leaves the network in train mode here
            for timages, tlabels in testloader:
                toutputs = net(timages)
                loss_sum += criterion(toutputs, tlabels).item() * tlabels.size(0)
                correct += int((toutputs.argmax(1) == tlabels).sum())
                total += tlabels.size(0)
        accuracy, test_loss = correct / total, loss_sum / total
        mon.log(test_loss, split="val", accuracy=accuracy)
        printed.append(f"After epoch {epochs}, accuracy: {100 * accuracy:.4f} %")
        if accuracy > best_accuracy:  # 'Saving model...': kept in memory
            best = {"net": copy.deepcopy(net.state_dict()), "acc": accuracy}
            best_accuracy = accuracy

    nx.finish(mon, net, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_acc": accuracy, "best_acc": best_accuracy, "test_loss": test_loss,
            "final_lr": optimizer.param_groups[0]["lr"], "epochs": float(epochs)}  # fmt: skip
