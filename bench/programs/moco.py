"""Port of facebookresearch/moco: MoCo (v1 defaults) pre-training, a momentum key encoder and a queue of negatives.

Source: github.com/facebookresearch/moco, ``main_moco.py``, ``moco/builder.py`` and
``moco/loader.py`` at commit 132aea9da9bb995a411c915c0420be3db62052f3 (MIT, Copyright (c)
Meta Platforms, Inc. and affiliates; the repository's last commit with files, its newest
commit 8976944 deletes them all). The kNN monitor follows the repository's Colab CIFAR demo
(``colab/moco_cifar10_demo.ipynb`` on its ``colab-notebook`` branch, linked from the README).
Written anew from the facts of those files; no code copied.

Kept: ``MoCo``: ``encoder_q`` and ``encoder_k`` built by ``base_encoder(num_classes=dim)``
(``mlp=False``, the v1 default), the key encoder's parameters copied from the query encoder's
and set ``requires_grad=False``; the queue a ``(dim, K)`` buffer of normalised Gaussian noise
with a ``queue_ptr`` buffer; ``forward(im_q, im_k)``: ``q`` = normalised query features; under
``no_grad`` the momentum update ``k = k * m + q * (1 - m)`` of every key-encoder parameter, the
key batch shuffled, encoded, normalised and unshuffled; ``l_pos`` (N x 1) and ``l_neg``
(N x K, against ``queue.clone().detach()``) concatenated positive first, divided by ``T``,
all-zero labels, then ``_dequeue_and_enqueue`` (keys written at ``ptr``, ``ptr`` advanced mod
K); returns ``(logits, labels)``. ``main_moco.py``: ``nn.CrossEntropyLoss``,
``SGD(lr=0.03, momentum=0.9, weight_decay=1e-4)``, the step schedule of
``adjust_learning_rate`` (x0.1 at each milestone epoch, set at the start of every epoch), the
shuffled ``drop_last`` loader of ``TwoCropsTransform`` (two independent draws of the MoCo v1
augmentation: ``RandomResizedCrop(scale=(0.2, 1))``, ``RandomGrayscale(p=0.2)``,
``ColorJitter(0.4, 0.4, 0.4, 0.4)``, ``RandomHorizontalFlip()``, ``ToTensor``, ``Normalize``);
``train``: ``model.train()``, ``output, target = model(im_q=images[0], im_k=images[1])``,
the criterion, top-1/top-5 of the (K+1)-way logits into ``AverageMeter``s, ``zero_grad``,
``backward``, ``step``. The Colab demo's kNN monitor after every epoch: ``net.eval()``,
features of the query encoder (normalised) for the training images, a weighted kNN vote
(weights ``exp(sim / 0.1)``) for the held-out images.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out), upscaled to 16x16,
grey in 3 channels, instead of ImageNet at 224 (colour jitter acts through brightness and
contrast only); the normalisation uses these images' own mean and std; ``RandomResizedCrop``
scale (0.5, 1) instead of (0.2, 1) (a 20% crop of a 16x16 digit is unreadable);
torchvision's ResNet-18 with stage widths 8/16/32/64 instead of ResNet-50; ``dim`` 128 kept,
``K`` 256 instead of 65,536, ``m`` 0.99 instead of 0.999 (a few hundred steps instead of 1.2
million: at 0.999 the key encoder would stay at its initialisation), ``T`` 0.07 kept; batch
32 instead of 256 (lr kept); 4 epochs (176 steps) with the milestone at epoch 3 instead of 200
with 120 and 160; single process (the original runs only under DistributedDataParallel:
``_batch_shuffle_ddp`` / ``concat_all_gather`` become a shuffle and unshuffle within the one
batch); kNN ``k`` 20 instead of 200. At this size the run is MoCo's first few hundred steps:
the (K+1)-way top-1 reaches about 4% (chance 0.4%) and the kNN accuracy about 0.59. The
measures (not part of the program) are the last kNN monitor's accuracy and, on held-out
images with two fixed augmentations (eval mode), ``heldout_gap``: the mean cosine of a query
with its own key minus its mean cosine with the other images' keys (``heldout_match``, the
share whose own key is the nearest, is reported too: near chance at this size).

nndx, as the author would add it: a preflight ``nndx.probe`` on the MoCo module itself with
the first batch of views ``((im_q, im_k), zeros)`` (the zeros being the targets ``forward``
returns) and ``criterion(logits, targets)`` as the loss function, ``nndx.Monitor`` around the
epochs with the criterion called through ``mon.loss_fn``, each step's loss and (K+1)-way top-1
logged, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.simclr import ResNet18, _grey, accuracy, color_jitter, random_resized_crop
from nndx.report import CauseCode as C

NAME = "moco"
SOURCE = Source("facebookresearch/moco", "main_moco.py", "132aea9da9bb995a411c915c0420be3db62052f3", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (MoCo v1 defaults)"),
        Variant(
            "positive_not_first",
            "MoCo.forward concatenates the logits as [l_neg, l_pos] while the labels stay all zeros: the "
            "'positive' the criterion rewards is the first queue entry, the real positive is the last column",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/facebookresearch/moco/issues/24",
             "https://github.com/amazon-science/video-contrastive-learning/issues/5",
             "https://github.com/sthalles/SimCLR/issues/16",
             "https://github.com/Xtra-Computing/MOON/issues/8"),
            Measure("heldout_gap", "held-out alignment gap (a query's cosine with its own key minus its mean cosine "
                    "with the other keys) at most 0.5x the healthy run's (0.0009/0.0004/0.0039 against "
                    "0.0113/0.0393/0.0124 on seeds 0-2; kNN accuracy 0.511/0.531/0.525 against 0.586/0.578/0.542)",
                    lambda healthy, buggy: not buggy > 0.5 * healthy),
        ),
        Variant(
            "train_mode_not_restored",
            "model.train() left out of train(): after the first epoch's kNN monitor calls model.eval(), every "
            "later epoch trains in eval mode (BatchNorm on frozen running statistics)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/princeton-vl/CER-MVS/issues/2",
             "https://github.com/ShengcaiLiao/QAConv/issues/16",
             "https://github.com/backseason/PoolNet/issues/30"),
            Measure("knn_acc", "the last kNN monitor's held-out accuracy at least 0.04 below the healthy run's "
                    "(0.503/0.492/0.406 against 0.586/0.578/0.542 on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.04),
        ),
    )
}

SIZE = 16
CROP_SCALE = (0.5, 1.0)
ARGS = {"batch_size": 32, "epochs": 4, "schedule": (3,), "lr": 0.03, "momentum": 0.9, "weight_decay": 1e-4,
        "moco_dim": 128, "moco_k": 256, "moco_m": 0.99, "moco_t": 0.07, "print_freq": 10, "knn_k": 20,
        "knn_t": 0.1}  # fmt: skip


# --------------------------------------------------------------------------- data (moco/loader.py + main_moco's aug)


def grey(images: torch.Tensor) -> torch.Tensor:
    """The digits as (N, 3, 16, 16) grey images in [0, 1]."""
    return data.upscaled(images, SIZE).repeat(1, 3, 1, 1)


def moco_v1_augmentation(mean: torch.Tensor, std: torch.Tensor):
    """MoCo v1's Compose (the InstDisc augmentation), as one function of a (3, H, W) image in [0, 1]."""

    def transform(img: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        img = random_resized_crop(img, SIZE, generator, scale=CROP_SCALE)
        if torch.rand(1, generator=generator).item() < 0.2:  # RandomGrayscale(p=0.2)
            img = _grey(img).repeat(3, 1, 1)
        img = color_jitter(img, 0.4, 0.4, generator)  # ColorJitter(0.4, 0.4, 0.4, 0.4)
        if torch.rand(1, generator=generator).item() < 0.5:  # RandomHorizontalFlip
            img = img.flip(-1)
        return (img - mean) / std  # ToTensor (already a tensor), normalize

    return transform


class TwoCropsTransform:
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform) -> None:
        self.base_transform = base_transform

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.base_transform(x), self.base_transform(x)]


class DigitImages(Dataset):
    def __init__(self, pictures: torch.Tensor, labels: torch.Tensor, transform) -> None:
        self.pictures, self.labels, self.transform = pictures, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(self.pictures[index]), self.labels[index]


# --------------------------------------------------------------------------- moco/builder.py


class MoCo(nn.Module):
    """A query encoder, a momentum key encoder and a queue of keys (https://arxiv.org/abs/1911.05722)."""

    def __init__(self, base_encoder, dim: int = 128, K: int = 65536, m: float = 0.999, T: float = 0.07,
                 positive_first: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.positive_first = positive_first
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self) -> None:
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys: torch.Tensor) -> None:
        batch_size = keys.shape[0]  # concat_all_gather over one process: the keys themselves
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr : ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    @torch.no_grad()
    def _batch_shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx_shuffle = torch.randperm(x.shape[0])
        return x[idx_shuffle], torch.argsort(idx_shuffle)

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, idx_unshuffle = self._batch_shuffle(im_k)
            k = F.normalize(self.encoder_k(im_k), dim=1)
            k = k[idx_unshuffle]
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        # the bug: the positive column last while the labels still say column 0
        logits = torch.cat([l_pos, l_neg] if self.positive_first else [l_neg, l_pos], dim=1)
        logits = logits / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


# --------------------------------------------------------------------------- main_moco.py


def adjust_learning_rate(optimizer, epoch: int, args: dict) -> None:
    lr = args["lr"]
    for milestone in args["schedule"]:
        lr *= 0.1 if epoch >= milestone else 1.0
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def train_one_epoch(train_loader, model, criterion, optimizer, epoch, args, mon, restore_train_mode: bool,
                    record: list) -> None:  # fmt: skip
    losses, top1 = AverageMeter(), AverageMeter()
    if restore_train_mode:
        model.train()  # the bug: this line left out
    for i, (images, _) in enumerate(train_loader):
        output, target = model(im_q=images[0], im_k=images[1])
        loss = mon.loss_fn(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images[0].size(0))
        top1.update(acc1, images[0].size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log(loss, accuracy=acc1 / 100.0)
        if i % args["print_freq"] == 0:
            record.append((epoch, i, losses.avg, top1.avg))


@torch.no_grad()
def knn_monitor(net: nn.Module, memory: torch.Tensor, memory_labels: torch.Tensor, test: torch.Tensor,
                test_labels: torch.Tensor, k: int, t: float, classes: int = 10) -> float:  # fmt: skip
    """The Colab demo's ``test``: ``net.eval()``, weighted kNN on normalised features."""
    net.eval()
    feature_bank = F.normalize(net(memory), dim=1)
    feature = F.normalize(net(test), dim=1)
    sim = feature @ feature_bank.T
    sim_weight, sim_indices = sim.topk(k=k, dim=-1)
    sim_labels = memory_labels[sim_indices]
    sim_weight = (sim_weight / t).exp()
    one_hot = torch.zeros(len(test), k, classes).scatter_(-1, sim_labels.unsqueeze(-1), 1.0)
    scores = (one_hot * sim_weight.unsqueeze(-1)).sum(dim=1)
    return float((scores.argmax(1) == test_labels).float().mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    args = dict(ARGS)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_pictures, test_pictures = grey(train_images), grey(test_images)
    mean = train_pictures.mean(dim=(0, 2, 3)).view(3, 1, 1)
    std = train_pictures.std(dim=(0, 2, 3)).view(3, 1, 1)
    augmentation = moco_v1_augmentation(mean, std)
    train_dataset = DigitImages(train_pictures, train_labels, TwoCropsTransform(augmentation))
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True, drop_last=True)

    def base_encoder(num_classes: int) -> nn.Module:
        return ResNet18(num_classes=num_classes)

    model = MoCo(base_encoder, args["moco_dim"], args["moco_k"], args["moco_m"], args["moco_t"],
                 positive_first=variant != "positive_not_first")  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args["lr"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"])  # fmt: skip

    def moco_loss(output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return criterion(output[0], target)

    gen = torch.Generator().manual_seed(5_000 + seed)
    first = [train_dataset.pictures[i] for i in range(args["batch_size"])]
    probe_views = [torch.stack([augmentation(p, gen) for p in first]) for _ in range(2)]
    probe_batch = ((probe_views[0], probe_views[1]), torch.zeros(args["batch_size"], dtype=torch.long))
    nx.preflight(model, probe_batch, moco_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    memory = (train_pictures - mean) / std
    test_inputs = (test_pictures - mean) / std
    record: list = []
    knn_accs: list[float] = []
    for epoch in range(args["epochs"]):
        adjust_learning_rate(optimizer, epoch, args)
        train_one_epoch(train_loader, model, criterion, optimizer, epoch, args, mon,
                        restore_train_mode=variant != "train_mode_not_restored", record=record)  # fmt: skip
        knn_accs.append(knn_monitor(model.encoder_q, memory, train_labels, test_inputs, test_labels,
                                    args["knn_k"], args["knn_t"]))  # fmt: skip
    nx.finish(mon, model, probe_batch, moco_loss, optimizer=optimizer)

    return {
        "first_loss": float(record[0][2]),
        "final_loss": float(record[-1][2]),
        "final_top1": float(record[-1][3]),
        "knn_acc": knn_accs[-1],
        **heldout_pairs(model, test_pictures, augmentation, seed),
    }


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def heldout_pairs(model: MoCo, pictures: torch.Tensor, augmentation, seed: int) -> dict[str, float]:
    """Held-out images, two augmentations each (fixed views), queries from the query encoder and
    keys from the key encoder, eval mode: ``heldout_gap``, the mean cosine of each query with its
    own key minus its mean cosine with the other images' keys; ``heldout_match``, the share whose
    own key is the nearest."""
    model.eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    views = [torch.stack([augmentation(p, gen) for p in pictures]) for _ in range(2)]
    q = F.normalize(model.encoder_q(views[0]), dim=1)
    k = F.normalize(model.encoder_k(views[1]), dim=1)
    sim = q @ k.T
    n = len(pictures)
    own = sim.diagonal()
    others = (sim.sum(1) - own) / (n - 1)
    return {"heldout_gap": float((own - others).mean()),
            "heldout_match": float((sim.argmax(1) == torch.arange(n)).float().mean())}
