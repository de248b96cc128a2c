"""Port of lucidrains/perceiver-pytorch (the Perceiver: a learned latent array that cross-attends
to a Fourier-position-encoded input array, latent self-attention blocks, GEGLU feed-forwards,
PreNorm, mean-pooled latents to logits) with its ``train_cifar10.py`` (cross-entropy, AdamW,
OneCycleLR stepped per batch, gradient clipping at 1.0).

Source: github.com/lucidrains/perceiver-pytorch, ``perceiver_pytorch/perceiver_pytorch.py`` and
``train_cifar10.py`` at commit 96097c6a27cc64fc1f196d3a58d32b8a82f573e1 (MIT, Copyright (c) 2021
Phil Wang). Written anew from the facts of those files; no code copied. einops is not
installed: its ``rearrange``/``repeat``/``Reduce`` are written as the equivalent
``permute``/``reshape``/``expand``/``mean``.

Kept: ``fourier_encode`` (the coordinate times ``linspace(1, max_freq / 2, num_bands)`` times
pi, sin and cos, the raw coordinate appended); ``PreNorm`` (a LayerNorm of the query and,
for cross-attention, of the context); ``GEGLU`` and ``FeedForward`` (``Linear(dim, dim * mult
* 2)``, GEGLU, ``Linear(dim * mult, dim)``, dropout; mult 4); ``Attention`` (``to_q``,
``to_kv`` without bias, heads folded into the batch, scaled dot product, softmax over the
keys, attention dropout, ``to_out``); ``Perceiver`` with ``latents`` ``randn(num_latents,
latent_dim)``, the input's positions ``linspace(-1, 1)`` per axis, meshgrid, Fourier
encoded and concatenated to the data's channels, the axes flattened; per depth a cross
attention + cross feed-forward and ``self_per_cross_attn`` latent attention + feed-forward
blocks, each residual; ``cache_fn`` weight tying (``weight_tie_layers``: every layer after
the first reuses the first's modules); ``to_logits`` = mean over latents, LayerNorm,
Linear. ``train_cifar10.py``: ``rearrange('b c h w -> b h w c')`` of each batch,
``input_axis`` 2, ``num_freq_bands`` 6, ``max_freq`` 10, cross heads 1, attention and
feed-forward dropout 0.1; ``CrossEntropyLoss``; ``AdamW(lr=1e-3, weight_decay=1e-4)``;
``OneCycleLR(max_lr=lr, steps_per_epoch=len(trainloader), epochs=epochs)`` stepped after
every ``optimizer.step()``; ``zero_grad``, ``backward``, ``clip_grad_norm_(max_norm=1.0)``,
``step``; per-batch loss/accuracy records, ``eval_model`` (``model.eval()``, no grad, mean
loss and accuracy, back to ``model.train()``) every ``eval_every`` steps; the train
transform ``RandomCrop(padding=4)`` + ``ToTensor`` + ``Normalize``, the test one ``ToTensor`` +
``Normalize``; shuffled train loader.
Shrunk: scikit-learn's 8x8 digits (1 channel, 1,437 train / 360 test) instead of CIFAR-10
(3 channels, 32x32), normalised with the digits' own mean/std; ``RandomCrop(8,
padding=1)``, no horizontal flip (a flipped digit is another glyph); ``depth`` 2 instead of 3,
``num_latents`` 16 instead of 128, ``latent_dim`` 48 instead of 128, ``latent_heads`` 2 instead
of 4, ``cross_dim_head`` and ``latent_dim_head`` 16 instead of 64, ``self_per_cross_attn`` 1
instead of 2, ``weight_tie_layers=True`` (the option the Perceiver paper trains with; the
script's default is False); batch 64 instead of 128, 20 epochs of 23 batches instead of 391, ``lr`` 3e-3
instead of 1e-3 (the shrunk run is 17x shorter), ``eval_every`` 40; no Accelerator (single
process, CPU), no wandb.
Measure only (not in the program): the last ``eval_model`` accuracy and loss (the
program's own evaluation, run once more after the last epoch).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(through the test transform) with the optimizer and the data splits; ``nndx.Monitor``
around the epochs with ``criterion`` called as ``mon.loss_fn``, each batch's loss and accuracy
logged, each ``eval_model``'s loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from functools import wraps
from math import pi

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "perceiver"
SOURCE = Source("lucidrains/perceiver-pytorch", "perceiver_pytorch/perceiver_pytorch.py",
                "96097c6a27cc64fc1f196d3a58d32b8a82f573e1", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (train_cifar10.py's loop, weight-tied Perceiver)"),
        Variant(
            "onecycle_stepped_per_epoch",
            "scheduler.step() moved out of the batch loop to the end of each epoch: OneCycleLR, built with "
            "steps_per_epoch=len(trainloader), advances 20 of its 460 steps, so the LR stays near its starting "
            "max_lr / 25 for the whole run",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/pytorch/pytorch/issues/65417", "https://github.com/ageron/handson-mlp/issues/28",
             "https://github.com/ultralytics/yolov5/issues/7485",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/5631"),
            Measure("val_acc", "last eval accuracy at least 0.2 below the healthy run's: 0.33 against 0.91 "
                    "on seed 0 (the LR never rises above 3e-4)", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "inputs_not_normalized",
            "ToTensor() and Normalize() left out of the transforms: the raw 0..255 pixel values are "
            "concatenated with the [-1, 1] Fourier position features",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/leeyeehoo/CSRNet-pytorch/issues/25",
             "https://github.com/huochaitiantang/pytorch-deep-image-matting/issues/12",
             "https://github.com/Nikronic/EdgeNet/issues/1"),
            Measure("val_acc", "last eval accuracy at least 0.05 below the healthy run's: 0.81 against 0.91 "
                    "on seed 0 (eval loss 0.61 against 0.35)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"epochs": 20, "batch_size": 64, "lr": 3e-3, "weight_decay": 1e-4, "eval_every": 40, "depth": 2,
        "num_latents": 16, "latent_dim": 48, "cross_heads": 1, "latent_heads": 2, "cross_dim_head": 16,
        "latent_dim_head": 16, "attn_dropout": 0.1, "ff_dropout": 0.1, "self_per_cross_attn": 1,
        "weight_tie_layers": True}  # fmt: skip


# --------------------------------------------------------------------------- perceiver_pytorch.py


def exists(val) -> bool:
    return val is not None


def default(val, d):
    return val if exists(val) else d


def cache_fn(f):
    cache: dict = {}

    @wraps(f)
    def cached_fn(*args, _cache: bool = True, key=None, **kwargs):
        if not _cache:
            return f(*args, **kwargs)
        if key in cache:
            return cache[key]
        result = f(*args, **kwargs)
        cache[key] = result
        return result

    return cached_fn


def fourier_encode(x: torch.Tensor, max_freq: float, num_bands: int = 4) -> torch.Tensor:
    x = x.unsqueeze(-1)
    orig_x = x
    scales = torch.linspace(1.0, max_freq / 2, num_bands, device=x.device, dtype=x.dtype)
    scales = scales[(*((None,) * (len(x.shape) - 1)), Ellipsis)]
    x = x * scales * pi
    x = torch.cat([x.sin(), x.cos()], dim=-1)
    return torch.cat((x, orig_x), dim=-1)


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module, context_dim: int | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if exists(context_dim) else None

    def forward(self, x, **kwargs):
        x = self.norm(x)
        if exists(self.norm_context):
            kwargs.update(context=self.norm_context(kwargs["context"]))
        return self.fn(x, **kwargs)


class GEGLU(nn.Module):
    def forward(self, x):
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * mult * 2), GEGLU(), nn.Linear(dim * mult, dim),
                                 nn.Dropout(dropout))  # fmt: skip

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, query_dim: int, context_dim: int | None = None, heads: int = 8, dim_head: int = 64,
                 dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)
        self.scale = dim_head**-0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(context_dim, inner_dim * 2, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Linear(inner_dim, query_dim)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:  # 'b n (h d) -> (b h) n d'
        b, n, hd = t.shape
        return t.reshape(b, n, self.heads, hd // self.heads).permute(0, 2, 1, 3).reshape(b * self.heads, n, -1)

    def forward(self, x, context=None, mask=None):
        h = self.heads
        q = self.to_q(x)
        context = default(context, x)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        q, k, v = (self._split_heads(t) for t in (q, k, v))
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        if exists(mask):
            mask = mask.reshape(mask.shape[0], -1).repeat_interleave(h, dim=0)[:, None, :]
            sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)
        attn = self.dropout(sim.softmax(dim=-1))
        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        bh, n, d = out.shape  # '(b h) n d -> b n (h d)'
        out = out.reshape(bh // h, h, n, d).permute(0, 2, 1, 3).reshape(bh // h, n, h * d)
        return self.to_out(out)


class Perceiver(nn.Module):
    def __init__(self, *, num_freq_bands: int, depth: int, max_freq: float, input_channels: int = 3,
                 input_axis: int = 2, num_latents: int = 512, latent_dim: int = 512, cross_heads: int = 1,
                 latent_heads: int = 8, cross_dim_head: int = 64, latent_dim_head: int = 64,
                 num_classes: int = 1000, attn_dropout: float = 0.0, ff_dropout: float = 0.0,
                 weight_tie_layers: bool = False, fourier_encode_data: bool = True, self_per_cross_attn: int = 1,
                 final_classifier_head: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.input_axis, self.max_freq, self.num_freq_bands = input_axis, max_freq, num_freq_bands
        self.fourier_encode_data = fourier_encode_data
        fourier_channels = (input_axis * ((num_freq_bands * 2) + 1)) if fourier_encode_data else 0
        input_dim = fourier_channels + input_channels
        self.latents = nn.Parameter(torch.randn(num_latents, latent_dim))

        def get_cross_attn():
            return PreNorm(latent_dim, Attention(latent_dim, input_dim, heads=cross_heads, dim_head=cross_dim_head,
                                                 dropout=attn_dropout), context_dim=input_dim)  # fmt: skip

        def get_cross_ff():
            return PreNorm(latent_dim, FeedForward(latent_dim, dropout=ff_dropout))

        def get_latent_attn():
            return PreNorm(latent_dim, Attention(latent_dim, heads=latent_heads, dim_head=latent_dim_head,
                                                 dropout=attn_dropout))  # fmt: skip

        def get_latent_ff():
            return PreNorm(latent_dim, FeedForward(latent_dim, dropout=ff_dropout))

        get_cross_attn, get_cross_ff, get_latent_attn, get_latent_ff = (
            cache_fn(fn) for fn in (get_cross_attn, get_cross_ff, get_latent_attn, get_latent_ff))  # fmt: skip

        self.layers = nn.ModuleList([])
        for i in range(depth):
            cache_args = {"_cache": i > 0 and weight_tie_layers}
            self_attns = nn.ModuleList([])
            for block_ind in range(self_per_cross_attn):
                self_attns.append(nn.ModuleList([get_latent_attn(**cache_args, key=block_ind),
                                                 get_latent_ff(**cache_args, key=block_ind)]))  # fmt: skip
            self.layers.append(nn.ModuleList([get_cross_attn(**cache_args), get_cross_ff(**cache_args), self_attns]))

        self.to_logits = (nn.Sequential(nn.LayerNorm(latent_dim), nn.Linear(latent_dim, num_classes))
                          if final_classifier_head else nn.Identity())  # fmt: skip

    def forward(self, data: torch.Tensor, mask=None, return_embeddings: bool = False) -> torch.Tensor:
        b, *axis, _ = data.shape
        assert len(axis) == self.input_axis, "input data must have the right number of axis"
        if self.fourier_encode_data:
            axis_pos = [torch.linspace(-1.0, 1.0, steps=size, device=data.device, dtype=data.dtype) for size in axis]
            pos = torch.stack(torch.meshgrid(*axis_pos, indexing="ij"), dim=-1)
            enc_pos = fourier_encode(pos, self.max_freq, self.num_freq_bands)
            enc_pos = enc_pos.reshape(*enc_pos.shape[:-2], -1)  # '... n d -> ... (n d)'
            enc_pos = enc_pos.unsqueeze(0).expand(b, *enc_pos.shape)
            data = torch.cat((data, enc_pos), dim=-1)
        data = data.reshape(b, -1, data.shape[-1])  # 'b ... d -> b (...) d'
        x = self.latents.unsqueeze(0).expand(b, *self.latents.shape)
        for cross_attn, cross_ff, self_attns in self.layers:
            x = cross_attn(x, context=data, mask=mask) + x
            x = cross_ff(x) + x
            for self_attn, self_ff in self_attns:
                x = self_attn(x) + x
                x = self_ff(x) + x
        if return_embeddings:
            return x
        return self.to_logits(x.mean(dim=1))  # Reduce('b n d -> b d', 'mean'), LayerNorm, Linear


# --------------------------------------------------------------------------- train_cifar10.py


def random_crop(images: torch.Tensor, generator: torch.Generator, padding: int = 1) -> torch.Tensor:
    """RandomCrop(8, padding=1) per image: zero padding, then a random 8x8 window."""
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    tops = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    lefts = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    return torch.stack([padded[i, :, t : t + h, l : l + w] for i, (t, l) in enumerate(zip(tops.tolist(), lefts.tolist()))])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    if variant == "inputs_not_normalized":  # no ToTensor(), no Normalize(): the raw pixel values
        x_train = train_raw.unsqueeze(1).float()
        x_test = test_raw.unsqueeze(1).float()
    else:
        x_train, x_test = data.to_tensor(train_raw), data.to_tensor(test_raw)
        mean, std = x_train.mean().item(), x_train.std().item()  # the data set's mean/std (CIFAR10_MEAN/STD)
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std

    crop_rng = torch.Generator().manual_seed(seed)
    trainloader = DataLoader(TensorDataset(x_train, train_labels), batch_size=args["batch_size"], shuffle=True,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
    testloader = DataLoader(TensorDataset(x_test, test_labels), batch_size=args["batch_size"], shuffle=False)

    model = Perceiver(input_channels=1, input_axis=2, num_freq_bands=6, max_freq=10.0, depth=args["depth"],
                      num_latents=args["num_latents"], latent_dim=args["latent_dim"], cross_heads=args["cross_heads"],
                      latent_heads=args["latent_heads"], cross_dim_head=args["cross_dim_head"],
                      latent_dim_head=args["latent_dim_head"], num_classes=10, attn_dropout=args["attn_dropout"],
                      ff_dropout=args["ff_dropout"], weight_tie_layers=args["weight_tie_layers"],
                      fourier_encode_data=True, self_per_cross_attn=args["self_per_cross_attn"])  # fmt: skip

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.AdamW(model.parameters(), lr=args["lr"], weight_decay=args["weight_decay"])
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args["lr"], steps_per_epoch=len(trainloader),
                                              epochs=args["epochs"])  # fmt: skip

    def hwc(t: torch.Tensor) -> torch.Tensor:  # rearrange(inputs, 'b c h w -> b h w c')
        return t.permute(0, 2, 3, 1)

    splits = (hwc(x_train), train_labels, hwc(x_test), test_labels)
    probe_batch = (hwc(x_train[: args["batch_size"]]), train_labels[: args["batch_size"]])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    def eval_model() -> tuple[float, float]:
        model.eval()
        total_loss, correct, total = 0.0, 0, 0
        with torch.no_grad():
            for inputs, targets in testloader:
                inputs = hwc(inputs)
                logits = model(inputs)
                total_loss += criterion(logits, targets).item() * targets.shape[0]
                correct += (logits.argmax(dim=-1) == targets).sum().item()
                total += targets.shape[0]
        model.train()
        return total_loss / total, correct / total

    step = 0
    val_loss = val_acc = float("nan")
    history: list[dict[str, float]] = []
    for epoch in range(1, args["epochs"] + 1):
        model.train()
        epoch_loss, epoch_correct, epoch_total = 0.0, 0, 0
        for inputs, targets in trainloader:
            inputs = hwc(random_crop(inputs, crop_rng))
            optimizer.zero_grad()
            logits = model(inputs)
            loss = mon.loss_fn(logits, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            if variant != "onecycle_stepped_per_epoch":
                scheduler.step()
            preds = logits.argmax(dim=-1)
            batch_acc = (preds == targets).float().mean().item()
            epoch_loss += loss.item() * targets.shape[0]
            epoch_correct += (preds == targets).sum().item()
            epoch_total += targets.shape[0]
            step += 1
            mon.log(loss, accuracy=batch_acc)
            if step % args["eval_every"] == 0:
                val_loss, val_acc = eval_model()
                mon.log(val_loss, split="val", accuracy=val_acc)
        if variant == "onecycle_stepped_per_epoch":
            scheduler.step()
        history.append({"epoch": epoch, "train_loss": epoch_loss / epoch_total, "train_acc": epoch_correct / epoch_total})

    val_loss, val_acc = eval_model()  # the last evaluation (measure)
    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_acc": val_acc, "val_loss": val_loss, "train_loss": history[-1]["train_loss"],
            "train_acc": history[-1]["train_acc"], "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
