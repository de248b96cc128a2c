"""Port of lucidrains/mlp-mixer-pytorch (MLP-Mixer: per-patch linear embedding, token-mixing and
channel-mixing MLPs, global average pooling, a linear classifier) trained the way the
MLP-Mixer paper trains it.

Source: github.com/lucidrains/mlp-mixer-pytorch, ``mlp_mixer_pytorch/mlp_mixer_pytorch.py`` at
commit b102a9b25cb8bd2360db36cbd252dc4e670fd5e4 (MIT, Copyright (c) 2021 Phil Wang). The
repository ships the model only; the training recipe is the one the paper (Tolstikhin et al.
2021, arXiv:2105.01601, and google-research/vision_transformer's ``train.py``) describes and the
task's brief names: AdamW, a linear warm-up then a cosine decay per step (progress clipped to
[0, 1] as ``create_learning_rate_schedule`` does), label smoothing, gradient clipping at global
norm 1. Written anew from the facts of those files; no code copied.

Kept: ``MLPMixer``: the ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')`` patch cut
(written as ``unfold``/``permute``/``reshape``, einops not needed), ``nn.Linear(p*p*c, dim)``
embedding, ``depth`` blocks of two ``PreNormResidual`` (``fn(LayerNorm(x)) + x``): a token-mixing
``FeedForward(num_patches, expansion_factor * dim)`` built from ``Conv1d(kernel_size=1)`` layers
(they act on the token axis, dim 1, so no transpose is needed) and a channel-mixing
``FeedForward(dim, expansion_factor_token * dim)`` built from ``nn.Linear`` (the last axis); each
FeedForward is dense -> GELU -> Dropout -> dense -> Dropout; then ``LayerNorm(dim)``, a mean over
the tokens (``Reduce('b n c -> b c', 'mean')``) and ``nn.Linear(dim, num_classes)``; the
defaults expansion_factor 4, expansion_factor_token 0.5, dropout 0.
Training: ``CrossEntropyLoss(label_smoothing=0.1)``, ``AdamW(lr, betas (0.9, 0.999),
weight_decay 0.05)``, ``LambdaLR`` warm-up + cosine stepped every batch, ``clip_grad_norm_(1.0)``,
a shuffled train loader, evaluation under ``eval()`` + ``no_grad`` each epoch.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 held out, one channel, pixels / 16) with
2x2 patches (16 tokens) instead of ImageNet at 224 with 16x16 patches; dim 64, depth 4 instead
of 512, 8 (S/16); batch 64, 12 epochs, 2 warm-up epochs, lr 2e-3.

Measure only: held-out accuracy after the last epoch.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with
the criterion, the optimizer and the data splits, ``nndx.Monitor`` around the loop with the
criterion as ``mon.loss_fn``, each step's loss and accuracy logged, each epoch's held-out
loss/accuracy logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mlp_mixer"
SOURCE = Source("lucidrains/mlp-mixer-pytorch", "mlp_mixer_pytorch/mlp_mixer_pytorch.py",
                "b102a9b25cb8bd2360db36cbd252dc4e670fd5e4", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the model as published, trained with the paper's recipe (AdamW, warm-up + cosine)"),
        Variant(
            "schedule_total_in_epochs",
            "the warm-up + cosine schedule is stepped every batch but given its length in epochs "
            "(num_training_steps=epochs, warmup=warmup_epochs): the LR peaks after 2 steps and is clipped to 0 "
            "after 12 steps, so the rest of training runs at LR 0",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/ScrollPrize/villa/pull/1495",
             "https://github.com/galilai-group/stable-worldmodel/issues/280",
             "https://github.com/aimagelab/meshed-memory-transformer/issues/71",
             "https://github.com/pytorch/pytorch/issues/3814"),
            Measure("test_accuracy", "held-out accuracy at least 0.05 below the healthy run's: 0.55 against 0.97 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "unshuffled_sorted",
            "the training set is stored sorted by class (as an ImageFolder lists it) and the DataLoader is built "
            "with shuffle=False: every epoch walks the classes 0..9 in order",
            (C.UNSHUFFLED_DATA,),
            ("https://stackoverflow.com/questions/54354465/impact-of-using-data-shuffling-in-pytorch-dataloader",
             "https://blog.gcc.ac.cn/post/2024/machinelearninghighaccuracyatfirstthendecrease",
             "https://dailydoseofds.beehiiv.com/p/why-is-it-important-to-shuffle-your"),
            Measure("test_accuracy", "held-out accuracy at least 0.05 below the healthy run's: 0.70 against 0.97 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"image_size": 8, "channels": 1, "patch_size": 2, "dim": 64, "depth": 4, "num_classes": 10,
        "expansion_factor": 4, "expansion_factor_token": 0.5, "dropout": 0.0, "batch_size": 64, "epochs": 12,
        "warmup_epochs": 2, "lr": 2e-3, "weight_decay": 0.05, "label_smoothing": 0.1, "clip": 1.0}


# --------------------------------------------------------------------------- mlp_mixer_pytorch.py


class PreNormResidual(nn.Module):
    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.fn, self.norm = fn, nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x)) + x


def feed_forward(dim: int, dim_hidden: int, dropout: float, dense) -> nn.Sequential:
    return nn.Sequential(dense(dim, dim_hidden), nn.GELU(), nn.Dropout(dropout), dense(dim_hidden, dim),
                         nn.Dropout(dropout))  # fmt: skip


class ToPatches(nn.Module):
    """'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'."""

    def __init__(self, p: int) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, _, _ = x.shape
        out = x.unfold(2, self.p, self.p).unfold(3, self.p, self.p)  # b c h w p1 p2
        return out.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, self.p * self.p * c)


class MeanTokens(nn.Module):
    """Reduce('b n c -> b c', 'mean')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def conv1x1(i: int, o: int) -> nn.Conv1d:
    return nn.Conv1d(i, o, kernel_size=1)


def mlp_mixer(image_size: int, channels: int, patch_size: int, dim: int, depth: int, num_classes: int,
              expansion_factor: float = 4, expansion_factor_token: float = 0.5, dropout: float = 0.0) -> nn.Sequential:
    assert image_size % patch_size == 0, "image must be divisible by patch size"
    num_patches = (image_size // patch_size) ** 2
    return nn.Sequential(
        ToPatches(patch_size),
        nn.Linear(patch_size**2 * channels, dim),
        *[nn.Sequential(
            PreNormResidual(dim, feed_forward(num_patches, int(expansion_factor * dim), dropout, conv1x1)),
            PreNormResidual(dim, feed_forward(dim, int(expansion_factor_token * dim), dropout, nn.Linear)),
        ) for _ in range(depth)],
        nn.LayerNorm(dim),
        MeanTokens(),
        nn.Linear(dim, num_classes),
    )  # fmt: skip


# --------------------------------------------------------------------------- the training recipe


def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR factor at a step: linear warm-up, then a cosine to 0 with the progress clipped to [0, 1]."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(max((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0), 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    x_train, x_test = data.to_tensor(train_raw), data.to_tensor(test_raw)  # (N, 1, 8, 8) in [0, 1]
    shuffle = True
    if variant == "unshuffled_sorted":
        order = torch.argsort(train_labels, stable=True)
        x_train, train_labels = x_train[order], train_labels[order]
        shuffle = False
    train_dl = DataLoader(TensorDataset(x_train, train_labels), batch_size=ARGS["batch_size"], shuffle=shuffle,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip

    model = mlp_mixer(ARGS["image_size"], ARGS["channels"], ARGS["patch_size"], ARGS["dim"], ARGS["depth"],
                      ARGS["num_classes"], ARGS["expansion_factor"], ARGS["expansion_factor_token"], ARGS["dropout"])
    criterion = nn.CrossEntropyLoss(label_smoothing=ARGS["label_smoothing"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=ARGS["lr"], betas=(0.9, 0.999),
                                  weight_decay=ARGS["weight_decay"])  # fmt: skip
    steps_per_epoch = len(train_dl)
    if variant == "schedule_total_in_epochs":
        warmup, total = ARGS["warmup_epochs"], ARGS["epochs"]
    else:
        warmup, total = ARGS["warmup_epochs"] * steps_per_epoch, ARGS["epochs"] * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup, total))

    splits = (x_train, train_labels, x_test, test_labels)
    first_batch = next(iter(DataLoader(TensorDataset(x_train, train_labels), batch_size=ARGS["batch_size"])))
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    train_losses: list[float] = []
    for _epoch in range(ARGS["epochs"]):
        model.train()
        for img, label in train_dl:
            optimizer.zero_grad()
            out = model(img)
            loss = mon.loss_fn(out, label)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), ARGS["clip"])
            optimizer.step()
            scheduler.step()
            mon.log(loss, accuracy=(out.argmax(-1) == label).float().mean())
            train_losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            out = model(x_test)
            val_loss = criterion(out, test_labels).item()
            val_acc = (out.argmax(-1) == test_labels).float().mean().item()
        mon.log(val_loss, split="val", accuracy=val_acc)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    model.eval()
    with torch.no_grad():
        out = model(x_test)
        test_acc = (out.argmax(-1) == test_labels).float().mean().item()
        test_loss = nn.functional.cross_entropy(out, test_labels).item()
    return {"test_accuracy": test_acc, "test_loss": test_loss, "final_train_loss": sum(train_losses[-20:]) / 20}
