"""Port of microsoft/Swin-Transformer: a Swin Transformer (shifted-window attention with a
relative position bias) trained with AdamW, a per-update cosine schedule with linear warmup,
gradient clipping and gradient accumulation.

Source: github.com/microsoft/Swin-Transformer, ``main.py``, ``models/swin_transformer.py``,
``lr_scheduler.py``, ``optimizer.py``, ``utils.py`` (``NativeScalerWithGradNormCount``) and
``config.py`` (the defaults) at commit f82860bfb5225915aca09c3227159ee9e1df874d (MIT,
Copyright (c) Microsoft Corporation). Written anew from the facts of those files, without
timm; no code copied (timm's ``CosineLRScheduler``, ``LabelSmoothingCrossEntropy``,
``DropPath`` and ``trunc_normal_`` are written out).

Kept: ``Mlp`` (fc1, GELU, dropout, fc2, dropout); ``window_partition`` (view to windows, permute
(0, 1, 3, 2, 4, 5), view) and ``window_reverse``; ``WindowAttention``: ``qkv`` Linear, the
reshape to (B_, N, 3, heads, head_dim) and permute to (3, B_, heads, N, head_dim), q scaled by
``head_dim ** -0.5``, ``q @ k^T``, the relative position bias gathered from
``relative_position_bias_table`` ((2Wh-1)(2Ww-1) x heads, trunc-normal std .02) through the
registered ``relative_position_index``, the shifted-window mask added per window, softmax,
``attn @ v`` transposed back to (B_, N, C), ``proj``; ``SwinTransformerBlock``: pre-norm,
cyclic shift with ``torch.roll`` by ``-shift_size``, windows, attention with the SW-MSA mask
(regions numbered on an image mask, -100 between different regions), windows merged and the
shift undone, ``shortcut + drop_path(x)``, then ``x + drop_path(mlp(norm2(x)))``; a block's
window taken as the resolution and its shift dropped when the resolution is no larger than
the window; ``shift_size`` 0 and ``window_size // 2`` alternating in ``BasicLayer``;
``PatchMerging`` (the four 2x2 neighbours concatenated, ``LayerNorm(4C)``, Linear to 2C without
bias); ``PatchEmbed`` (conv of kernel and stride ``patch_size``, flatten, LayerNorm);
``SwinTransformer``: no absolute position embedding, stochastic depth rising linearly over the
blocks, final LayerNorm, ``AdaptiveAvgPool1d(1)``, ``head``; ``_init_weights`` (Linear weights
trunc-normal std .02, biases 0, LayerNorm 1 and 0); ``build_optimizer``'s
``set_weight_decay`` (1-d parameters, biases, ``absolute_pos_embed`` and every
``relative_position_bias_table`` in a no-decay group) under ``AdamW(eps=1e-8, betas=(0.9,
0.999), weight_decay=0.05)``; the linear LR scaling by the total batch over 512 (times the
accumulation steps) of ``BASE_LR``, ``WARMUP_LR`` and ``MIN_LR``; ``build_scheduler``'s
``CosineLRScheduler(t_initial=(num_steps - warmup_steps), lr_min, warmup_lr_init, warmup_t,
cycle_limit=1, t_in_epochs=False, warmup_prefix=True)`` over ``len(data_loader_train) //
ACCUMULATION_STEPS`` updates per epoch; ``LabelSmoothingCrossEntropy(smoothing=0.1)`` (the
criterion main.py picks when mixup is off); ``train_one_epoch``: ``model.train()``,
``optimizer.zero_grad()``, per batch the loss divided by ``ACCUMULATION_STEPS``, the scaler
call (``backward``, then on an update step ``clip_grad_norm_(parameters, CLIP_GRAD=5.0)`` and
``optimizer.step()``), then on an update step ``optimizer.zero_grad()`` and
``lr_scheduler.step_update((epoch * num_steps + idx) // ACCUMULATION_STEPS)``; ``validate``:
``model.eval()``, ``no_grad``, ``CrossEntropyLoss``, top-1 and top-5; the max-accuracy
bookkeeping; ``build_dataset``'s two ``datasets.ImageFolder`` (``<data>/train`` and ``<data>/val``,
each numbering the class folders it finds) with the model's ``NUM_CLASSES`` from the config; a
shuffled train loader with ``drop_last=True`` and an unshuffled val loader.
Shrunk: scikit-learn's 8x8 digits (10 classes, 1,437 train / 360 val) upsampled to 32x32, 3
equal channels, normalised with the ImageNet mean/std (``IMAGENET_DEFAULT_MEAN/STD``), instead
of ImageNet at 224 (no RandAugment, colour jitter, random erasing or resized crops, and
``--opts AUG.MIXUP 0.0 AUG.CUTMIX 0.0``: mixup and cutmix off); ``EMBED_DIM`` 32,
``DEPTHS`` (2, 2), ``NUM_HEADS`` (2, 4), ``WINDOW_SIZE`` 4 (8x8 tokens then 4x4) instead of
swin_tiny's 96, (2, 2, 6, 2), (3, 6, 12, 24), 7; ``DATA.BATCH_SIZE`` 32 with
``--accumulation-steps 2`` (an update every 64 images) instead of 128 on each of several
GPUs; ``BASE_LR`` 1.6e-2 (2e-3 once scaled by 32 * 2 / 512), ``WARMUP_LR`` and ``MIN_LR`` at
the defaults' ratios to it (1/1000 and 1/100); 20 epochs with 2 warmup epochs instead of 300
with 20; single process, CPU, AMP off (``--disable_amp``: the scaler's scale and unscale are
identities), no checkpoints or auto-resume.
Measure only: nothing; the variants are measured by ``validate``'s loss and top-1.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the criterion, the optimizer and the data splits; ``nndx.Monitor(model, optimizer)``
around the epochs with the criterion called as ``mon.loss_fn``, the (accumulation-divided)
loss logged where ``loss_meter`` records it, each ``validate``'s loss and top-1 logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "swin"
SOURCE = Source("microsoft/Swin-Transformer", "main.py", "f82860bfb5225915aca09c3227159ee9e1df874d", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "main.py with --accumulation-steps 2, mixup off (LabelSmoothingCrossEntropy), AdamW, "
                           "cosine schedule with warmup stepped per update"),  # fmt: skip
        Variant(
            "step_update_per_micro_batch",
            "lr_scheduler.step_update(epoch * num_steps + idx), the call of the first release (and still of "
            "main_simmim_*.py), kept while the scheduler is built over len(data_loader_train) // "
            "ACCUMULATION_STEPS updates per epoch: the schedule is read at twice the update count, so warmup "
            "ends after half an epoch and the cosine reaches MIN_LR half-way through training, where the LR "
            "stays for the second half",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/microsoft/Swin-Transformer/issues/185",
             "https://github.com/huggingface/accelerate/issues/963",
             "https://github.com/shirley-wu/cross-doc-misinfo-detection/issues/1"),
            Measure("val_loss", "final val loss 1.3x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "val_class_folder_missing",
            "the val split's folder of one class (class 3) is missing, so datasets.ImageFolder(<data>/val) "
            "finds 9 class folders and numbers them 0..8 on its own: every val image of classes 4-9 carries its "
            "class index minus one, while the model (NUM_CLASSES 10) and the train split number them 0..9; "
            "training is untouched, validate's loss, top-1 and max_accuracy are scored against shifted labels",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/huggingface/pytorch-image-models/issues/957",
             "https://github.com/ultralytics/ultralytics/issues/13936",
             "https://github.com/ultralytics/ultralytics/pull/26192"),
            Measure("val_acc1", "final val top-1 at most 0.8x the healthy run's",
                    lambda healthy, buggy: buggy <= 0.8 * healthy),
        ),
    )
}

SIDE = 32
MISSING_CLASS = 3
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CONFIG = {
    "BATCH_SIZE": 32, "ACCUMULATION_STEPS": 2, "EPOCHS": 20, "WARMUP_EPOCHS": 2,
    "BASE_LR": 1.6e-2, "WARMUP_LR": 1.6e-5, "MIN_LR": 1.6e-4, "WEIGHT_DECAY": 0.05, "CLIP_GRAD": 5.0,
    "EPS": 1e-8, "BETAS": (0.9, 0.999), "LABEL_SMOOTHING": 0.1, "DROP_RATE": 0.0, "DROP_PATH_RATE": 0.1,
    "PATCH_SIZE": 4, "EMBED_DIM": 32, "DEPTHS": (2, 2), "NUM_HEADS": (2, 4), "WINDOW_SIZE": 4, "MLP_RATIO": 4.0,
}  # fmt: skip


# --------------------------------------------------------------------------- timm pieces


def trunc_normal_(tensor: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0, b=2.0)


def to_2tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


class DropPath(nn.Module):
    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class LabelSmoothingCrossEntropy(nn.Module):
    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        self.smoothing, self.confidence = smoothing, 1.0 - smoothing

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logprobs = F.log_softmax(x, dim=-1)
        nll = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        smooth = -logprobs.mean(dim=-1)
        return (self.confidence * nll + self.smoothing * smooth).mean()


class CosineLRScheduler:
    """timm's ``Scheduler`` + ``CosineLRScheduler`` (t_mul 1, decay_rate 1, k_decay 1, no noise)."""

    def __init__(self, optimizer, t_initial: int, lr_min: float, warmup_lr_init: float, warmup_t: int,
                 cycle_limit: int = 1, t_in_epochs: bool = True, warmup_prefix: bool = False) -> None:  # fmt: skip
        self.optimizer, self.t_initial, self.lr_min = optimizer, t_initial, lr_min
        self.warmup_t, self.warmup_lr_init, self.cycle_limit = warmup_t, warmup_lr_init, cycle_limit
        self.t_in_epochs, self.warmup_prefix = t_in_epochs, warmup_prefix
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_values = [group["initial_lr"] for group in optimizer.param_groups]
        if self.warmup_t:
            self.warmup_steps = [(v - warmup_lr_init) / self.warmup_t for v in self.base_values]
            self._update_groups([self.warmup_lr_init] * len(self.base_values))
        else:
            self.warmup_steps = [1 for _ in self.base_values]

    def _get_lr(self, t: int) -> list[float]:
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * s for s in self.warmup_steps]
        if self.warmup_prefix:
            t = t - self.warmup_t
        i = t // self.t_initial
        t_curr = t - self.t_initial * i
        if i < self.cycle_limit:
            return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t_curr / self.t_initial))
                    for v in self.base_values]  # fmt: skip
        return [self.lr_min for _ in self.base_values]

    def step(self, epoch: int, metric: float | None = None) -> None:
        if self.t_in_epochs:
            self._update_groups(self._get_lr(epoch))

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        if not self.t_in_epochs:
            self._update_groups(self._get_lr(num_updates))

    def _update_groups(self, values: list[float]) -> None:
        for group, value in zip(self.optimizer.param_groups, values):
            group["lr"] = value


# --------------------------------------------------------------------------- models/swin_transformer.py


class Mlp(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(B, H, W, C) -> (num_windows * B, window_size, window_size, C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows: torch.Tensor, window_size: int, H: int, W: int) -> torch.Tensor:
    """(num_windows * B, window_size, window_size, C) -> (B, H, W, C)."""
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim: int, window_size: tuple[int, int], num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        coords = torch.stack(torch.meshgrid([torch.arange(window_size[0]), torch.arange(window_size[1])],
                                            indexing="ij"))  # 2, Wh, Ww
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size[0] - 1
        relative_coords[:, :, 1] += window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * window_size[1] - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        wh_ww = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(wh_ww, wh_ww, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = self.softmax(attn.view(-1, self.num_heads, N, N))
        else:
            attn = self.softmax(attn)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.dim, self.input_resolution, self.num_heads = dim, input_resolution, num_heads
        self.window_size, self.shift_size, self.mlp_ratio = window_size, shift_size, mlp_ratio
        if min(self.input_resolution) <= self.window_size:
            self.shift_size = 0
            self.window_size = min(self.input_resolution)
        assert 0 <= self.shift_size < self.window_size, "shift_size must in 0-window_size"
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size=to_2tuple(self.window_size), num_heads=num_heads,
                                    qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)  # fmt: skip
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

        if self.shift_size > 0:
            H, W = self.input_resolution
            img_mask = torch.zeros((1, H, W, 1))
            slices = (slice(0, -self.window_size), slice(-self.window_size, -self.shift_size),
                      slice(-self.shift_size, None))  # fmt: skip
            cnt = 0
            for h in slices:
                for w in slices:
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, self.window_size)
            mask_windows = mask_windows.view(-1, self.window_size * self.window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = self.input_resolution
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        else:
            shifted_x = x
        x_windows = window_partition(shifted_x, self.window_size)
        x_windows = x_windows.view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        shifted_x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            x = shifted_x
        x = shortcut + self.drop_path(x.view(B, H * W, C))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    def __init__(self, input_resolution: tuple[int, int], dim: int) -> None:
        super().__init__()
        self.input_resolution, self.dim = input_resolution, dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = self.input_resolution
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        x = x.view(B, H, W, C)
        x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]
        x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return self.reduction(self.norm(x))


class BasicLayer(nn.Module):
    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 mlp_ratio: float, qkv_bias: bool, drop: float, attn_drop: float, drop_path,
                 downsample) -> None:  # fmt: skip
        super().__init__()
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(dim=dim, input_resolution=input_resolution, num_heads=num_heads,
                                 window_size=window_size, shift_size=0 if (i % 2 == 0) else window_size // 2,
                                 mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop, attn_drop=attn_drop,
                                 drop_path=drop_path[i] if isinstance(drop_path, list) else drop_path)
            for i in range(depth)])  # fmt: skip
        self.downsample = downsample(input_resolution, dim=dim) if downsample is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        if self.downsample is not None:
            x = self.downsample(x)
        return x


class PatchEmbed(nn.Module):
    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        img_size, patch_size = to_2tuple(img_size), to_2tuple(patch_size)
        self.img_size, self.patch_size = img_size, patch_size
        self.patches_resolution = [img_size[0] // patch_size[0], img_size[1] // patch_size[1]]
        self.num_patches = self.patches_resolution[0] * self.patches_resolution[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        assert H == self.img_size[0] and W == self.img_size[1], "Input image size doesn't match model."
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class SwinTransformer(nn.Module):
    def __init__(self, img_size: int, patch_size: int, in_chans: int, num_classes: int, embed_dim: int, depths,
                 num_heads, window_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.num_layers = len(depths)
        self.num_features = int(embed_dim * 2 ** (self.num_layers - 1))
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        res = self.patch_embed.patches_resolution
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        self.layers = nn.ModuleList()
        for i_layer in range(self.num_layers):
            self.layers.append(BasicLayer(
                dim=int(embed_dim * 2**i_layer), input_resolution=(res[0] // (2**i_layer), res[1] // (2**i_layer)),
                depth=depths[i_layer], num_heads=num_heads[i_layer], window_size=window_size, mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate,
                drop_path=dpr[sum(depths[:i_layer]) : sum(depths[: i_layer + 1])],
                downsample=PatchMerging if (i_layer < self.num_layers - 1) else None))  # fmt: skip
        self.norm = nn.LayerNorm(self.num_features)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(self.num_features, num_classes)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def no_weight_decay(self) -> set[str]:
        return {"absolute_pos_embed"}

    def no_weight_decay_keywords(self) -> set[str]:
        return {"relative_position_bias_table"}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pos_drop(self.patch_embed(x))
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return torch.flatten(self.avgpool(x.transpose(1, 2)), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


# --------------------------------------------------------------------------- optimizer.py, lr_scheduler.py, utils.py


def set_weight_decay(model: nn.Module, skip_list=(), skip_keywords=()) -> list[dict]:
    has_decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if (len(param.shape) == 1 or name.endswith(".bias") or name in skip_list
                or any(keyword in name for keyword in skip_keywords)):  # fmt: skip
            no_decay.append(param)
        else:
            has_decay.append(param)
    return [{"params": has_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_scheduler(config: dict, optimizer, n_iter_per_epoch: int) -> CosineLRScheduler:
    num_steps = int(config["EPOCHS"] * n_iter_per_epoch)
    warmup_steps = int(config["WARMUP_EPOCHS"] * n_iter_per_epoch)
    return CosineLRScheduler(optimizer, t_initial=num_steps - warmup_steps, lr_min=config["MIN_LR"],
                             warmup_lr_init=config["WARMUP_LR"], warmup_t=warmup_steps, cycle_limit=1,
                             t_in_epochs=False, warmup_prefix=True)  # fmt: skip


class NativeScalerWithGradNormCount:
    """utils.py's scaler with AMP off: scale and unscale_ are identities."""

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad: bool = True):
        loss.backward()
        if not update_grad:
            return None
        parameters = list(parameters)
        if clip_grad is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        else:
            norm = torch.norm(torch.stack([p.grad.detach().norm(2) for p in parameters if p.grad is not None]), 2)
        optimizer.step()
        return norm


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    maxk = min(max(topk), output.size(1))
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.reshape(1, -1).expand_as(pred.t()))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / target.size(0) for k in topk]


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    config = dict(CONFIG)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, val_raw, val_labels = data.digit_images(seed=seed)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x_train = (data.upscaled(train_raw, SIDE).expand(-1, 3, -1, -1) - mean) / std
    x_val = (data.upscaled(val_raw, SIDE).expand(-1, 3, -1, -1) - mean) / std
    if variant == "val_class_folder_missing":  # ImageFolder(val) without the folder of class MISSING_CLASS
        keep = val_labels != MISSING_CLASS
        x_val, val_labels = x_val[keep], val_labels[keep]
        val_labels = torch.where(val_labels > MISSING_CLASS, val_labels - 1, val_labels)
    data_loader_train = DataLoader(TensorDataset(x_train, train_labels), batch_size=config["BATCH_SIZE"], shuffle=True,
                                   drop_last=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip
    data_loader_val = DataLoader(TensorDataset(x_val, val_labels), batch_size=config["BATCH_SIZE"], shuffle=False)

    # linear scale the learning rate according to the total batch size (and the accumulation steps)
    accum = config["ACCUMULATION_STEPS"]
    for key in ("BASE_LR", "WARMUP_LR", "MIN_LR"):
        config[key] = config[key] * config["BATCH_SIZE"] / 512.0 * accum

    model = SwinTransformer(img_size=SIDE, patch_size=config["PATCH_SIZE"], in_chans=3, num_classes=10,
                            embed_dim=config["EMBED_DIM"], depths=config["DEPTHS"], num_heads=config["NUM_HEADS"],
                            window_size=config["WINDOW_SIZE"], mlp_ratio=config["MLP_RATIO"], qkv_bias=True,
                            drop_rate=config["DROP_RATE"], drop_path_rate=config["DROP_PATH_RATE"])  # fmt: skip
    optimizer = torch.optim.AdamW(set_weight_decay(model, model.no_weight_decay(), model.no_weight_decay_keywords()),
                                  eps=config["EPS"], betas=config["BETAS"], lr=config["BASE_LR"],
                                  weight_decay=config["WEIGHT_DECAY"])  # fmt: skip
    loss_scaler = NativeScalerWithGradNormCount()
    lr_scheduler = build_scheduler(config, optimizer, len(data_loader_train) // accum)
    criterion = LabelSmoothingCrossEntropy(smoothing=config["LABEL_SMOOTHING"])

    splits = (x_train, train_labels, x_val, val_labels)
    first_batch = (x_train[: config["BATCH_SIZE"]], train_labels[: config["BATCH_SIZE"]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    def train_one_epoch(epoch: int) -> float:
        model.train()
        optimizer.zero_grad()
        num_steps = len(data_loader_train)
        losses = []
        for idx, (samples, targets) in enumerate(data_loader_train):
            outputs = model(samples)
            loss = mon.loss_fn(outputs, targets)
            loss = loss / accum
            loss_scaler(loss, optimizer, clip_grad=config["CLIP_GRAD"], parameters=model.parameters(),
                        update_grad=(idx + 1) % accum == 0)  # fmt: skip
            if (idx + 1) % accum == 0:
                optimizer.zero_grad()
                if variant == "step_update_per_micro_batch":
                    lr_scheduler.step_update(epoch * num_steps + idx)
                else:
                    lr_scheduler.step_update((epoch * num_steps + idx) // accum)
            mon.log(loss)  # where loss_meter.update(loss.item(), ...) records it
            losses.append(loss.item())
        return float(np.mean(losses)) * accum

    @torch.no_grad()
    def validate() -> tuple[float, float, float]:
        model.eval()
        total_loss = total_acc1 = total_acc5 = 0.0
        for images, target in data_loader_val:
            output = model(images)
            loss = F.cross_entropy(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            n = target.size(0)
            total_loss, total_acc1, total_acc5 = total_loss + loss.item() * n, total_acc1 + acc1.item() * n, \
                total_acc5 + acc5.item() * n  # fmt: skip
        n_val = len(val_labels)
        acc1, acc5, loss = total_acc1 / n_val, total_acc5 / n_val, total_loss / n_val
        mon.log(loss, split="val", accuracy=acc1 / 100.0)
        return acc1, acc5, loss

    max_accuracy = 0.0
    train_loss = acc1 = val_loss = float("nan")
    for epoch in range(config["EPOCHS"]):
        train_loss = train_one_epoch(epoch)
        acc1, _acc5, val_loss = validate()
        max_accuracy = max(max_accuracy, acc1)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_acc1": acc1 / 100.0, "val_loss": val_loss, "max_accuracy": max_accuracy / 100.0,
            "train_loss": train_loss, "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
