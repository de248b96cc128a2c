"""Port of omihub777's ViT-CIFAR: a small Vision Transformer trained from scratch on CIFAR-10.

Source: github.com/omihub777/ViT-CIFAR, ``main.py``, ``vit.py``, ``layers.py``,
``criterions.py`` and ``utils.py`` at commit ab9043ea44cfe8311d30295fc0e0467d676187f1
(MIT, Copyright (c) 2021 Omiita). Written anew from the facts of those files; no code
copied.

Kept: ``ViT._to_words`` cutting the image into ``patch`` x ``patch`` square patches with
two ``unfold``s, a ``permute`` that puts the channels last and a ``reshape`` to (b, n,
f); a ``Linear`` patch embedding, a learnt ``cls_token`` (``torch.randn``) concatenated
in front, a learnt ``pos_emb`` (``torch.randn``) added; ``TransformerEncoder`` blocks
(pre-norm: ``LayerNorm`` -> ``MultiHeadSelfAttention`` + input, ``LayerNorm`` -> MLP of
``Linear``/``GELU``/``Dropout``/``Linear``/``GELU``/``Dropout`` + input); the attention
with separate q/k/v ``Linear``s, heads by ``view``/``transpose``, ``einsum`` scores
divided by sqrt(feats) (the full width, as the author wrote it), ``F.softmax``, an
``einsum`` back to (b, n, h, f/h), ``flatten(2)``, the output ``Linear``; the cls token's
output through ``LayerNorm`` + ``Linear`` (the ``fc`` Sequential); mlp_hidden = hidden
(the README's setting); dropout 0; ``LabelSmoothingCrossEntropyLoss`` (smoothing 0.1 spread
over the classes - 1 wrong classes, ``log_softmax`` inside) as the README's command
``--label-smoothing`` asks; Adam(lr 1e-3, betas (0.9, 0.999), weight_decay 5e-5);
``GradualWarmupScheduler(multiplier=1, total_epoch=warmup_epoch)`` over
``CosineAnnealingLR(T_max=max_epochs, eta_min=1e-5)``, stepped once per epoch as
Lightning does (multiplier 1 makes the first epoch's LR 0: the warm-up is base_lr *
epoch / warmup_epoch); the training transform ``RandomCrop(size, padding)`` +
``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize`` with the CIFAR-10 mean/std the
author lists, the test transform without the augmentation; a shuffled train loader
and a test loader of 1,024 (``eval_batch_size``); per epoch the Lightning loop (``training_step``:
loss, ``acc``; ``zero_grad``/``backward``/``step``), then ``validation_step`` under
``eval()`` + ``no_grad`` logging ``val_loss``/``val_acc``, then the scheduler step.
Lightning itself is written out as that plain loop (no Lightning in this environment).
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 (3 equal channels) instead of 32x32
CIFAR-10; patch 4 (4x4 patches of 4x4 pixels: f = 48, as in the original's 8x8 patches
of 4x4) instead of 8; hidden 32, 4 heads, 2 layers instead of 384, 12, 7; padding 2
instead of 4; 20 epochs with a 2-epoch warm-up instead of 200 with 5; batches of 32 instead of
128 (1,437 training and 360 test images instead of 50,000 / 10,000); no AutoAugment (the README's ``--autoaugment``: PIL policies).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training
batch with the criterion and the data splits, ``nndx.Monitor`` around the loop, each
step's loss and accuracy logged, each epoch's ``val_loss``/``val_acc`` logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "vit"
SOURCE = Source("omihub777/ViT-CIFAR", "vit.py", "ab9043ea44cfe8311d30295fc0e0467d676187f1", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (README command: --label-smoothing)"),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() left out when Lightning's training_step is written as a plain loop: each Adam step "
            "sees the sum of every gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175", "https://github.com/IKMLab/course_material/issues/3",
             "https://github.com/IBM/aihwkit/issues/446"),
            Measure("test_accuracy", "test accuracy at least 0.03 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
        Variant(
            "softmax_head",
            "nn.Softmax(dim=-1) appended to the fc head (the model returns probabilities) while the label-smoothing "
            "loss applies its own log_softmax",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/jeonsworld/ViT-pytorch/issues/41",
             "https://github.com/Lightning-Universe/lightning-bolts/issues/654",
             "https://github.com/NaJaeMin92/pytorch-DANN/issues/7"),
            Measure("test_accuracy", "test accuracy at least 0.03 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
    )
}

ARGS = {"lr": 1e-3, "min_lr": 1e-5, "beta1": 0.9, "beta2": 0.999, "weight_decay": 5e-5, "batch_size": 32,
        "eval_batch_size": 1024, "max_epochs": 20, "warmup_epoch": 2, "smoothing": 0.1, "patch": 4, "hidden": 32,
        "mlp_hidden": 32, "head": 4, "num_layers": 2, "dropout": 0.0, "size": 16, "padding": 2, "num_classes": 10}
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # utils.get_dataset, CIFAR-10


# --------------------------------------------------------------------------- layers.py


class TransformerEncoder(nn.Module):
    def __init__(self, feats: int, mlp_hidden: int, head: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.la1 = nn.LayerNorm(feats)
        self.msa = MultiHeadSelfAttention(feats, head=head, dropout=dropout)
        self.la2 = nn.LayerNorm(feats)
        self.mlp = nn.Sequential(nn.Linear(feats, mlp_hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(mlp_hidden, feats), nn.GELU(), nn.Dropout(dropout))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.msa(self.la1(x)) + x
        return self.mlp(self.la2(out)) + out


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, feats: int, head: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.head, self.feats = head, feats
        self.sqrt_d = feats**0.5
        self.q, self.k, self.v = nn.Linear(feats, feats), nn.Linear(feats, feats), nn.Linear(feats, feats)
        self.o = nn.Linear(feats, feats)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.size()
        heads = lambda t: t.view(b, n, self.head, self.feats // self.head).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        score = F.softmax(torch.einsum("bhif,bhjf->bhij", q, k) / self.sqrt_d, dim=-1)
        attn = torch.einsum("bhij,bhjf->bihf", score, v)
        return self.dropout(self.o(attn.flatten(2)))


# --------------------------------------------------------------------------- vit.py


class ViT(nn.Module):
    def __init__(self, in_c: int = 3, num_classes: int = 10, img_size: int = 32, patch: int = 8, dropout: float = 0.0,
                 num_layers: int = 7, hidden: int = 384, mlp_hidden: int = 384 * 4, head: int = 8,
                 is_cls_token: bool = True, softmax_head: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.patch = patch  # patches per row (or column)
        self.is_cls_token = is_cls_token
        self.patch_size = img_size // patch
        f = (img_size // patch) ** 2 * 3  # one patch as a vector
        num_tokens = patch**2 + 1 if is_cls_token else patch**2
        self.emb = nn.Linear(f, hidden)
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden)) if is_cls_token else None
        self.pos_emb = nn.Parameter(torch.randn(1, num_tokens, hidden))
        self.enc = nn.Sequential(*[TransformerEncoder(hidden, mlp_hidden=mlp_hidden, dropout=dropout, head=head)
                                   for _ in range(num_layers)])  # fmt: skip
        head_layers = [nn.LayerNorm(hidden), nn.Linear(hidden, num_classes)]
        self.fc = nn.Sequential(*head_layers, *([nn.Softmax(dim=-1)] if softmax_head else []))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.emb(self._to_words(x))
        if self.is_cls_token:
            out = torch.cat([self.cls_token.repeat(out.size(0), 1, 1), out], dim=1)
        out = self.enc(out + self.pos_emb)
        out = out[:, 0] if self.is_cls_token else out.mean(1)
        return self.fc(out)

    def _to_words(self, x: torch.Tensor) -> torch.Tensor:
        """(b, c, h, w) -> (b, n, f)"""
        p = self.patch_size
        out = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 4, 5, 1)
        return out.reshape(x.size(0), self.patch**2, -1)


# --------------------------------------------------------------------------- criterions.py, utils.py


class LabelSmoothingCrossEntropyLoss(nn.Module):
    def __init__(self, classes: int, smoothing: float = 0.0, dim: int = -1) -> None:
        super().__init__()
        self.confidence, self.smoothing, self.cls, self.dim = 1.0 - smoothing, smoothing, classes, dim

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pred = pred.log_softmax(dim=self.dim)
        with torch.no_grad():
            true_dist = torch.zeros_like(pred)
            true_dist.fill_(self.smoothing / (self.cls - 1))
            true_dist.scatter_(1, target.data.unsqueeze(1), self.confidence)
        return torch.mean(torch.sum(-true_dist * pred, dim=self.dim))


class DigitsCIFAR(Dataset):
    """The digits as a torchvision dataset with the author's transforms: ``RandomCrop(size,
    padding)`` (zero fill) + ``RandomHorizontalFlip`` for training, then ``ToTensor`` +
    ``Normalize(mean, std)``. The augmentation draws from its own generator."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, train: bool, generator=None) -> None:
        self.images, self.labels, self.train, self.generator = images, labels, train, generator
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = self.images[i]  # (3, size, size) in [0, 1]
        if self.train:
            pad, size = ARGS["padding"], ARGS["size"]
            padded = F.pad(img, (pad, pad, pad, pad))
            top, left = torch.randint(0, 2 * pad + 1, (2,), generator=self.generator).tolist()
            img = padded[:, top : top + size, left : left + size]
            if torch.rand(1, generator=self.generator).item() < 0.5:
                img = img.flip(-1)
        return (img - self.mean) / self.std, self.labels[i]


def warmup_cosine(epoch: int) -> float:
    """GradualWarmupScheduler(multiplier=1, total_epoch=W, after_scheduler=CosineAnnealingLR(T_max, eta_min)),
    as a factor of the base LR at ``epoch``: base * epoch / W up to W, then the cosine from its start."""
    w, t, base, low = ARGS["warmup_epoch"], ARGS["max_epochs"], ARGS["lr"], ARGS["min_lr"]
    if epoch <= w:
        return epoch / w
    return (low + (base - low) * (1 + math.cos(math.pi * (epoch - w - 1) / t)) / 2) / base


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(42 + seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train = data.upscaled(train_raw, ARGS["size"]).repeat(1, 3, 1, 1)
    x_test = data.upscaled(test_raw, ARGS["size"]).repeat(1, 3, 1, 1)
    train_ds = DigitsCIFAR(x_train, train_labels, train=True, generator=torch.Generator().manual_seed(seed))
    test_ds = DigitsCIFAR(x_test, test_labels, train=False)
    train_dl = DataLoader(train_ds, batch_size=ARGS["batch_size"], shuffle=True,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_dl = DataLoader(test_ds, batch_size=ARGS["eval_batch_size"])

    model = ViT(3, ARGS["num_classes"], img_size=ARGS["size"], patch=ARGS["patch"], dropout=ARGS["dropout"],
                mlp_hidden=ARGS["mlp_hidden"], num_layers=ARGS["num_layers"], hidden=ARGS["hidden"], head=ARGS["head"],
                is_cls_token=True, softmax_head=variant == "softmax_head")  # fmt: skip
    criterion = LabelSmoothingCrossEntropyLoss(ARGS["num_classes"], smoothing=ARGS["smoothing"])
    optimizer = torch.optim.Adam(model.parameters(), lr=ARGS["lr"], betas=(ARGS["beta1"], ARGS["beta2"]),
                                 weight_decay=ARGS["weight_decay"])  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)

    normalise = lambda x: (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)  # noqa: E731
    splits = (normalise(x_train), train_labels, normalise(x_test), test_labels)
    first_batch = (splits[0][: ARGS["batch_size"]], train_labels[: ARGS["batch_size"]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    val_losses: list[float] = []
    train_losses: list[float] = []
    for _epoch in range(ARGS["max_epochs"]):
        model.train()
        for img, label in train_dl:  # training_step
            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            out = model(img)
            loss = mon.loss_fn(out, label)
            loss.backward()
            optimizer.step()
            acc = torch.eq(out.argmax(-1), label).float().mean()
            mon.log(loss, accuracy=acc)
            train_losses.append(loss.item())
        model.eval()
        with torch.no_grad():  # validation_step, averaged over the epoch as Lightning logs it
            batch_losses, batch_accs = [], []
            for img, label in test_dl:
                out = model(img)
                batch_losses.append(criterion(out, label).item())
                batch_accs.append(torch.eq(out.argmax(-1), label).float().mean().item())
        val_loss, val_acc = sum(batch_losses) / len(batch_losses), sum(batch_accs) / len(batch_accs)
        val_losses.append(val_loss)
        mon.log(val_loss, split="val", accuracy=val_acc)
        scheduler.step()

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    model.eval()
    correct, total, test_ce = 0, 0, 0.0
    with torch.no_grad():
        for img, label in test_dl:
            out = model(img)
            correct += torch.eq(out.argmax(-1), label).sum().item()
            total += label.numel()
            test_ce += F.cross_entropy(out, label, reduction="sum").item()
    return {"test_accuracy": correct / total, "test_loss": test_ce / total, "val_loss": val_losses[-1],
            "final_train_loss": sum(train_losses[-40:]) / 40}  # fmt: skip
