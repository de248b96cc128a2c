"""Port of facebookresearch/dino: DINO self-distillation, a ViT student trained to match an EMA teacher.

Source: github.com/facebookresearch/dino, ``main_dino.py``, ``vision_transformer.py`` and
``utils.py`` at commit 7c446df5b9f45747937fb0d72314eb9f7b66930a (Apache-2.0, Copyright (c)
Facebook, Inc. and its affiliates); the kNN evaluation follows ``eval_knn.py`` at the same
commit. Written anew from the facts of those files; no code copied.

Kept: ``VisionTransformer`` (``PatchEmbed`` as a stride-``patch`` ``Conv2d`` flattened and
transposed, a zero-initialised ``cls_token`` and ``pos_embed`` drawn ``trunc_normal_(std=.02)``,
``interpolate_pos_encoding`` resizing the patch positions bicubically for the smaller local
crops (with the ``+ 0.1`` of issue #8), pre-norm ``Block`` s of ``Attention`` (one qkv
``Linear`` with bias, heads by ``reshape``/``permute``, scale ``head_dim ** -0.5``, softmax,
``proj``) and ``Mlp`` (fc1, GELU, fc2), ``DropPath`` stochastic depth rising linearly to
``drop_path_rate`` 0.1 over the student's blocks (the teacher has none), ``LayerNorm(eps=1e-6)``,
the cls token's output, ``trunc_normal_(std=.02)`` Linear weights with zero bias); the
``vit_*`` constructor with ``mlp_ratio`` 4 and ``qkv_bias=True``; ``DINOHead`` (3 Linear
layers with GELU, to a bottleneck, ``F.normalize``, then a ``weight_norm`` ed bias-free last
layer whose ``weight_g`` is filled with 1 and frozen: ``norm_last_layer=True``);
``MultiCropWrapper`` (``backbone.fc`` / ``backbone.head`` replaced by ``Identity``, one
backbone forward per run of equal crop sizes via ``unique_consecutive``, the head on the
concatenated features); ``DINOLoss`` (student outputs / 0.1 chunked per crop, teacher
``softmax((t - center) / temp)`` detached and chunked in 2, the cross-entropy of every
(teacher view, student crop) pair except the same view, averaged; ``update_center``: the
batch mean of the teacher outputs into ``center`` with momentum 0.9; the teacher temperature
warmed up linearly per epoch); ``DataAugmentationDINO`` (two global crops: RandomResizedCrop
scale (0.4, 1) bicubic, horizontal flip, ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8,
RandomGrayscale 0.2, Gaussian blur with p 1.0 on the first and 0.1 on the second, Solarization
0.2 on the second; local crops: RandomResizedCrop to the small size, the same flip/jitter,
blur with p 0.5; ImageNet normalisation); ``train_dino``: student and teacher built alike,
the teacher loaded with the student's ``state_dict`` and ``requires_grad=False``;
``get_params_groups`` (biases and 1-D parameters without weight decay) into ``AdamW``;
``cosine_scheduler`` s (linear warm-up then cosine) for the LR (``lr * batch / 256``, the
linear scaling rule, down to ``min_lr``), the weight decay (0.04 to 0.4, first group only) and
the teacher momentum (0.996 to 1); ``train_one_epoch``: the global iteration
``len(data_loader) * epoch + it`` indexing the three schedules, the teacher on the 2 global
views and the student on all crops, the non-finite-loss check, ``zero_grad``, ``backward``,
``clip_gradients`` (each parameter's gradient norm clipped to 3.0 on its own),
``cancel_gradients_last_layer`` (the last layer's gradients dropped during the first
``freeze_last_layer`` = 1 epoch), ``step``, then the EMA of the teacher under ``no_grad``;
``fix_random_seeds``. ``eval_knn.py``: the teacher backbone's features of the train and the
held-out images (full image, normalised), L2-normalised, a weighted kNN vote with weights
``exp(sim / 0.07)``.
Shrunk: generated 16x16 grey images (3 equal channels) of 10 classes of sinusoidal gratings (5
spatial frequencies x stripes along x or y, random phase, pixel noise; 1,024 for training, 384
held out) instead of ImageNet: scikit-learn's digits were tried first, and at 16x16 a crop of a
digit does not predict another crop of it (the teacher kNN stayed at its initial 0.39); colour
jitter acts through brightness and contrast only (grayscale and hue do nothing on grey images);
global crops 16x16 and local crops 8x8 instead of 224 and 96, local scale (0.15, 0.4) instead of
(0.05, 0.4), 2 local crops instead of 8; the augmentations drawn per image from one
``torch.Generator`` and applied to the batch at once (``grid_sample`` crops), the blur's sigma
the PIL radius (0.1, 2.0) scaled by 16/224; ``vit_tiny`` with patch 4, width 48, 2 blocks, 3
heads instead of patch 16, 192, 12, 3; ``DINOHead`` hidden 128, bottleneck 64, ``out_dim`` 256
instead of 2,048, 256, 65,536; batch 64 (one process) instead of 64 per GPU on 16 GPUs; 10
epochs of 16 steps instead of 100 epochs; LR warm-up 1 epoch instead of 10; the teacher
temperature 0.04 -> 0.07 over 3 epochs (the README's ``--teacher_temp 0.07
--warmup_teacher_temp_epochs 30`` of 300, scaled); base ``lr`` 0.008 instead of 0.0005 (160
steps instead of 125,000); ``momentum_teacher`` 0.99 instead of 0.996 (at 0.996 over 160 steps
the teacher would stay near its initialisation); no fp16 (CPU), single process (``all_reduce``
over one process is the identity); no checkpoints or logs written; the non-finite-loss exit
raises instead of ``sys.exit(1)``. kNN ``k`` 20 (one of ``--nb_knn``). At this size the run is
DINO's first 160 steps: the head's output goes uniform within ~40 steps (the loss settles at
ln 256 = 5.545; real runs start there, at ln 65,536 = 11.09, and take thousands of steps to
leave it) while the backbones learn: the held-out kNN top-1 rises from 0.58 at initialisation
to 0.69 (teacher) and 0.84 (student) on seed 0.
Measure only (not in the program): the kNN top-1 on the held-out images against the training
images, as ``eval_knn.py`` computes it, of the teacher backbone (its default) and of the student
backbone (``--checkpoint_key student``); the DINO cross-entropy on held-out images (fixed crops,
the center as it is).

nndx, as the author would add it: the trained module is the student (the teacher only follows
it), so the preflight ``nndx.probe`` runs on the student with the first batch of crops as its one
input (``MultiCropWrapper`` takes the list) and, as targets, the teacher's centred and sharpened
probabilities for its global views at that moment; the loss is DINOLoss's cross-entropy
against those fixed targets (``DINOLoss.forward`` itself also moves the center, which a probe
must not do). ``nndx.Monitor(student, optimizer)`` around the epochs, every step's loss
logged; after training ``nndx.probe(student, ..., monitor=mon)`` on that batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dino"
SOURCE = Source("facebookresearch/dino", "main_dino.py", "7c446df5b9f45747937fb0d72314eb9f7b66930a", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (vit_tiny shrunk, the README's teacher-temperature warm-up)"),
        Variant(
            "teacher_shares_backbone",
            "the teacher wrapped around the student's own backbone object (teacher = student instead of a second "
            "vit_tiny): the loop that sets the teacher's requires_grad=False freezes the shared backbone, "
            "get_params_groups skips it, and only the student's head is trained; the EMA of the backbone is a no-op",
            (C.FROZEN_PARAMETERS, C.OPTIMIZER_NOT_CONNECTED),
            ("https://github.com/nttcslab/byol-a/issues/7",
             "https://github.com/YU1ut/MixMatch-pytorch/pull/23",
             "https://github.com/Britefury/self-ensemble-visual-domain-adapt/issues/6"),
            Measure("knn_top1", "held-out kNN top-1 of the teacher backbone (eval_knn.py's default checkpoint key) at "
                    "least 0.05 below the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "lr_not_scaled",
            "the linear scaling rule written lr * batch_size instead of lr * batch_size / 256: AdamW runs at 256x "
            "the intended peak LR",
            (C.LR_TOO_HIGH,),
            ("https://github.com/facebookresearch/dinov2/issues/143",
             "https://github.com/huggingface/pytorch-image-models/issues/814",
             "https://github.com/open-mmlab/mmdetection/issues/1710"),
            Measure("student_knn_top1", "held-out kNN top-1 of the student backbone (eval_knn.py --checkpoint_key "
                    "student) at least 0.1 below the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = {"patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 3, "out_dim": 256, "hidden_dim": 128,
        "bottleneck_dim": 64, "norm_last_layer": True, "momentum_teacher": 0.99, "use_bn_in_head": False,
        "warmup_teacher_temp": 0.04, "teacher_temp": 0.07, "warmup_teacher_temp_epochs": 3,
        "weight_decay": 0.04, "weight_decay_end": 0.4, "clip_grad": 3.0, "batch_size_per_gpu": 64, "epochs": 10,
        "freeze_last_layer": 1, "lr": 0.008, "warmup_epochs": 1, "min_lr": 1e-6, "drop_path_rate": 0.1,
        "global_crops_scale": (0.4, 1.0), "local_crops_scale": (0.15, 0.4), "local_crops_number": 2,
        "global_size": 16, "local_size": 8, "blur_sigma": (0.1 * 16 / 224, 2.0 * 16 / 224), "knn_k": 20,
        "knn_t": 0.07, "n_train": 1024, "n_test": 384}  # fmt: skip
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


# --------------------------------------------------------------------------- the images (the data)


def gratings(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, classes): n grey 16x16 images in [0, 1] as 3 channels, each a sinusoidal grating
    of one of 10 classes (5 spatial frequencies x stripes along x or along y) with a random phase
    and pixel noise: any crop of an image shows its class, as a crop of a photo shows its object."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    freq = torch.tensor([1.0, 1.5, 2.0, 2.5, 3.0])[y % 5] * 2 * math.pi / 8  # cycles per 8 pixels
    along_x = (y // 5).float().view(n, 1, 1)
    phase = (torch.rand(n, generator=g) * 2 * math.pi).view(n, 1, 1)
    rows, cols = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    coord = along_x * cols + (1 - along_x) * rows
    img = 0.5 + 0.4 * torch.sin(freq.view(n, 1, 1) * coord + phase) + 0.1 * torch.randn(n, 16, 16, generator=g)
    return img.clamp(0, 1).unsqueeze(1).repeat(1, 3, 1, 1), y


# --------------------------------------------------------------------------- vision_transformer.py


def trunc_normal_(tensor: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0, b=2.0)


def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = (keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)).floor_()
    return x.div(keep_prob) * random_tensor


class DropPath(nn.Module):
    def __init__(self, drop_prob: float | None = None) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


class Mlp(nn.Module):
    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, drop: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_scale=None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, N, C = x.shape  # noqa: N806
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x)), attn


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False, qk_scale=None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm) -> None:  # fmt: skip
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop,
                              proj_drop=drop)  # fmt: skip
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: torch.Tensor, return_attention: bool = False) -> torch.Tensor:
        y, attn = self.attn(self.norm1(x))
        if return_attention:
            return attn
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.num_patches = (img_size // patch_size) * (img_size // patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self, img_size=(224,), patch_size: int = 16, in_chans: int = 3, num_classes: int = 0,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 qkv_bias: bool = False, qk_scale=None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=nn.LayerNorm, **kwargs) -> None:  # fmt: skip
        super().__init__()
        self.num_features = self.embed_dim = embed_dim
        self.patch_embed = PatchEmbed(img_size=img_size[0], patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim)  # fmt: skip
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]  # stochastic depth decay rule
        self.blocks = nn.ModuleList([
            Block(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                  drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer)
            for i in range(depth)])  # fmt: skip
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def interpolate_pos_encoding(self, x: torch.Tensor, w: int, h: int) -> torch.Tensor:
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1  # noqa: N806
        if npatch == N and w == h:
            return self.pos_embed
        class_pos_embed = self.pos_embed[:, 0]
        patch_pos_embed = self.pos_embed[:, 1:]
        dim = x.shape[-1]
        w0, h0 = w // self.patch_embed.patch_size + 0.1, h // self.patch_embed.patch_size + 0.1
        patch_pos_embed = F.interpolate(
            patch_pos_embed.reshape(1, int(math.sqrt(N)), int(math.sqrt(N)), dim).permute(0, 3, 1, 2),
            scale_factor=(w0 / math.sqrt(N), h0 / math.sqrt(N)), mode="bicubic")
        assert int(w0) == patch_pos_embed.shape[-2] and int(h0) == patch_pos_embed.shape[-1]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)

    def prepare_tokens(self, x: torch.Tensor) -> torch.Tensor:
        B, nc, w, h = x.shape  # noqa: N806
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        return self.pos_drop(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prepare_tokens(x)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]


def vit_tiny(patch_size: int = 16, **kwargs) -> VisionTransformer:
    """Shrunk: width 48, 2 blocks, 3 heads (vit_tiny: 192, 12, 3)."""
    return VisionTransformer(patch_size=patch_size, embed_dim=ARGS["embed_dim"], depth=ARGS["depth"],
                             num_heads=ARGS["num_heads"], mlp_ratio=4, qkv_bias=True,
                             norm_layer=partial(nn.LayerNorm, eps=1e-6), **kwargs)  # fmt: skip


class DINOHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, use_bn: bool = False, norm_last_layer: bool = True,
                 nlayers: int = 3, hidden_dim: int = 2048, bottleneck_dim: int = 256) -> None:  # fmt: skip
        super().__init__()
        nlayers = max(nlayers, 1)
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim)]
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
            for _ in range(nlayers - 2):
                layers.append(nn.Linear(hidden_dim, hidden_dim))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.GELU())
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.apply(self._init_weights)
        self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.weight_g.data.fill_(1)
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad = False

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        x = F.normalize(x, dim=-1, p=2)
        return self.last_layer(x)


# --------------------------------------------------------------------------- utils.py


class MultiCropWrapper(nn.Module):
    """One backbone forward per resolution, the head on the concatenated features."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        backbone.fc, backbone.head = nn.Identity(), nn.Identity()
        self.backbone = backbone
        self.head = head

    def forward(self, x) -> torch.Tensor:
        if not isinstance(x, list):
            x = [x]
        idx_crops = torch.cumsum(torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp in x]),
                                                          return_counts=True)[1], 0)  # fmt: skip
        start_idx, output = 0, torch.empty(0).to(x[0].device)
        for end_idx in idx_crops:
            _out = self.backbone(torch.cat(x[start_idx:end_idx]))
            if isinstance(_out, tuple):
                _out = _out[0]
            output = torch.cat((output, _out))
            start_idx = end_idx
        return self.head(output)


def get_params_groups(model: nn.Module) -> list[dict]:
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:  # no decay for biases and norm parameters
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def cosine_scheduler(base_value: float, final_value: float, epochs: int, niter_per_ep: int, warmup_epochs: int = 0,
                     start_warmup_value: float = 0) -> np.ndarray:  # fmt: skip
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def clip_gradients(model: nn.Module, clip: float) -> list[float]:
    norms = []
    for _name, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch: int, model: nn.Module, freeze_last_layer: int) -> None:
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


# --------------------------------------------------------------------------- main_dino.py


class DINOLoss(nn.Module):
    def __init__(self, out_dim: int, ncrops: int, warmup_teacher_temp: float, teacher_temp: float,
                 warmup_teacher_temp_epochs: int, nepochs: int, student_temp: float = 0.1,
                 center_momentum: float = 0.9) -> None:  # fmt: skip
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))  # fmt: skip

    def teacher_targets(self, teacher_output: torch.Tensor, epoch: int) -> torch.Tensor:
        """Teacher centering and sharpening (the first lines of ``forward``)."""
        temp = self.teacher_temp_schedule[epoch]
        return F.softmax((teacher_output - self.center) / temp, dim=-1).detach()

    def cross_entropy(self, student_output: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
        """The rest of ``forward`` before ``update_center``: every (teacher view, student crop)
        pair but the same view, averaged."""
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        teacher_out = teacher_probs.chunk(2)
        total_loss, n_loss_terms = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue  # the student and the teacher on the same view
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        return total_loss / n_loss_terms

    def forward(self, student_output: torch.Tensor, teacher_output: torch.Tensor, epoch: int) -> torch.Tensor:
        total_loss = self.cross_entropy(student_output, self.teacher_targets(teacher_output, epoch))
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output: torch.Tensor) -> None:
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)  # all_reduce over one process
        batch_center = batch_center / (len(teacher_output) * 1)  # world size 1
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


class DataAugmentationDINO:
    """Two global crops and ``local_crops_number`` local ones, each with its own random draws,
    for a whole batch of (N, 3, H, W) images in [0, 1]."""

    def __init__(self, global_crops_scale, local_crops_scale, local_crops_number: int, generator: torch.Generator):
        self.global_crops_scale, self.local_crops_scale = global_crops_scale, local_crops_scale
        self.local_crops_number = local_crops_number
        self.g = generator

    def _u(self, n: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=self.g)

    def random_resized_crop_flip(self, x: torch.Tensor, size: int, scale) -> torch.Tensor:
        """RandomResizedCrop(size, scale, bicubic) then RandomHorizontalFlip(0.5), one box per image."""
        n = x.shape[0]
        area = self._u(n, scale[0], scale[1])
        log_ratio = self._u(n, math.log(3 / 4), math.log(4 / 3))
        aspect = torch.exp(log_ratio)
        w = torch.sqrt(area * aspect).clamp(max=1.0)  # fractions of the side
        h = torch.sqrt(area / aspect).clamp(max=1.0)
        cx = (self._u(n) * (1 - w) + w / 2) * 2 - 1  # box centre in [-1, 1]
        cy = (self._u(n) * (1 - h) + h / 2) * 2 - 1
        flip = torch.where(self._u(n) < 0.5, -1.0, 1.0)
        theta = torch.zeros(n, 2, 3)
        theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
        theta[:, 1, 1], theta[:, 1, 2] = h, cy
        grid = F.affine_grid(theta, (n, 3, size, size), align_corners=False)
        return F.grid_sample(x, grid, mode="bicubic", padding_mode="border", align_corners=False).clamp(0, 1)

    def color_jitter(self, x: torch.Tensor) -> torch.Tensor:
        """RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8) then RandomGrayscale(0.2): on grey
        images only brightness and contrast change anything."""
        n = x.shape[0]
        apply = (self._u(n) < 0.8).float().view(n, 1, 1, 1)
        b = self._u(n, 0.6, 1.4).view(n, 1, 1, 1)
        c = self._u(n, 0.6, 1.4).view(n, 1, 1, 1)
        self._u(n)  # the grayscale draw
        jittered = (x * b).clamp(0, 1)
        mean = jittered.mean(dim=(1, 2, 3), keepdim=True)
        jittered = (c * jittered + (1 - c) * mean).clamp(0, 1)
        return apply * jittered + (1 - apply) * x

    def gaussian_blur(self, x: torch.Tensor, p: float) -> torch.Tensor:
        n = x.shape[0]
        apply = (self._u(n) <= p).float().view(n, 1, 1, 1)
        sigma = self._u(n, *ARGS["blur_sigma"]).view(n, 1, 1, 1)
        taps = torch.arange(-2, 3, dtype=torch.float32).view(1, 5, 1, 1)
        kernel = torch.exp(-(taps**2) / (2 * sigma.view(n, 1, 1, 1) ** 2))
        kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (n, 5, 1, 1)
        size = x.shape[-1]
        padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
        rows = sum(kernel[:, i : i + 1] * padded[:, :, i : i + size, :] for i in range(5))
        blurred = sum(kernel[:, i : i + 1] * rows[:, :, :, i : i + size] for i in range(5))
        return apply * blurred + (1 - apply) * x

    def solarization(self, x: torch.Tensor, p: float) -> torch.Tensor:
        n = x.shape[0]
        apply = (self._u(n) < p).view(n, 1, 1, 1)
        return torch.where(apply & (x >= 0.5), 1.0 - x, x)

    @staticmethod
    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - MEAN) / STD

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        gs, ls = ARGS["global_size"], ARGS["local_size"]
        crops = []
        x = self.color_jitter(self.random_resized_crop_flip(images, gs, self.global_crops_scale))
        crops.append(self.normalize(self.gaussian_blur(x, 1.0)))
        x = self.color_jitter(self.random_resized_crop_flip(images, gs, self.global_crops_scale))
        crops.append(self.normalize(self.solarization(self.gaussian_blur(x, 0.1), 0.2)))
        for _ in range(self.local_crops_number):
            x = self.color_jitter(self.random_resized_crop_flip(images, ls, self.local_crops_scale))
            crops.append(self.normalize(self.gaussian_blur(x, 0.5)))
        return crops


def train_one_epoch(student, teacher, dino_loss, data_loader, transform, optimizer, lr_schedule, wd_schedule,
                    momentum_schedule, epoch, args, mon, variant, record) -> None:  # fmt: skip
    for it, (images,) in enumerate(data_loader):
        it = len(data_loader) * epoch + it  # global training iteration
        for i, param_group in enumerate(optimizer.param_groups):
            param_group["lr"] = lr_schedule[it]
            if i == 0:  # only the first group is regularized
                param_group["weight_decay"] = wd_schedule[it]

        images = transform(images)
        teacher_output = teacher(images[:2])  # only the 2 global views pass through the teacher
        student_output = student(images)
        loss = dino_loss(student_output, teacher_output, epoch)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"Loss is {loss.item()}, stopping training")  # sys.exit(1) in the original

        optimizer.zero_grad()
        loss.backward()
        if args["clip_grad"]:
            clip_gradients(student, args["clip_grad"])
        cancel_gradients_last_layer(epoch, student, args["freeze_last_layer"])
        optimizer.step()
        mon.log(loss)

        with torch.no_grad():  # EMA update for the teacher
            m = momentum_schedule[it]
            for param_q, param_k in zip(student.parameters(), teacher.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        record.append((loss.item(), optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["weight_decay"]))


# --------------------------------------------------------------------------- eval_knn.py (measure only)


@torch.no_grad()
def knn_top1(backbone: nn.Module, train_x: torch.Tensor, train_labels: torch.Tensor, test_x: torch.Tensor,
             test_labels: torch.Tensor, k: int, t: float, num_classes: int = 10) -> float:  # fmt: skip
    backbone.eval()
    train_features = F.normalize(backbone(DataAugmentationDINO.normalize(train_x)), dim=1, p=2)
    test_features = F.normalize(backbone(DataAugmentationDINO.normalize(test_x)), dim=1, p=2)
    similarity = test_features @ train_features.T
    distances, indices = similarity.topk(k, largest=True, sorted=True)
    retrieved = train_labels[indices]
    one_hot = torch.zeros(len(test_x), k, num_classes).scatter_(-1, retrieved.unsqueeze(-1), 1.0)
    probs = (one_hot * (distances / t).exp().unsqueeze(-1)).sum(dim=1)
    backbone.train()
    return float((probs.argmax(1) == test_labels).float().mean())


@torch.no_grad()
def heldout_dino_loss(student, teacher, dino_loss, test_x: torch.Tensor, epoch: int, seed: int) -> float:
    """The DINO cross-entropy (center as it is, not updated) on held-out images, fixed crops."""
    transform = DataAugmentationDINO(ARGS["global_crops_scale"], ARGS["local_crops_scale"],
                                     ARGS["local_crops_number"], torch.Generator().manual_seed(10_000 + seed))  # fmt: skip
    crops = transform(test_x)
    student.eval()
    value = dino_loss.cross_entropy(student(crops), dino_loss.teacher_targets(teacher(crops[:2]), epoch)).item()
    student.train()
    return value


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)  # utils.fix_random_seeds
    np.random.seed(seed)
    train_x, train_labels = gratings(args["n_train"], seed)  # the ImageFolder stand-in (labels: measure only)
    test_x, test_labels = gratings(args["n_test"], 1_000 + seed)
    transform = DataAugmentationDINO(args["global_crops_scale"], args["local_crops_scale"],
                                     args["local_crops_number"], torch.Generator().manual_seed(seed))  # fmt: skip
    data_loader = DataLoader(TensorDataset(train_x), batch_size=args["batch_size_per_gpu"], shuffle=True,
                             drop_last=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip

    # building student and teacher networks
    student = vit_tiny(patch_size=args["patch_size"], img_size=[args["global_size"]],
                       drop_path_rate=args["drop_path_rate"])  # fmt: skip
    teacher = vit_tiny(patch_size=args["patch_size"], img_size=[args["global_size"]])
    if variant == "teacher_shares_backbone":  # the bug: the student's backbone object given to the teacher too
        teacher = student
    embed_dim = student.embed_dim
    student = MultiCropWrapper(student, DINOHead(embed_dim, args["out_dim"], use_bn=args["use_bn_in_head"],
                                                 norm_last_layer=args["norm_last_layer"],
                                                 hidden_dim=args["hidden_dim"], bottleneck_dim=args["bottleneck_dim"]))
    teacher = MultiCropWrapper(teacher, DINOHead(embed_dim, args["out_dim"], args["use_bn_in_head"],
                                                 hidden_dim=args["hidden_dim"], bottleneck_dim=args["bottleneck_dim"]))
    teacher.load_state_dict(student.state_dict())  # teacher and student start with the same weights
    for p in teacher.parameters():
        p.requires_grad = False

    dino_loss = DINOLoss(args["out_dim"], args["local_crops_number"] + 2, args["warmup_teacher_temp"],
                         args["teacher_temp"], args["warmup_teacher_temp_epochs"], args["epochs"])  # fmt: skip
    params_groups = get_params_groups(student)
    optimizer = torch.optim.AdamW(params_groups)  # to use with ViTs

    world_size = 1
    scaled = (args["lr"] * (args["batch_size_per_gpu"] * world_size) if variant == "lr_not_scaled"
              else args["lr"] * (args["batch_size_per_gpu"] * world_size) / 256.0)  # linear scaling rule
    lr_schedule = cosine_scheduler(scaled, args["min_lr"], args["epochs"], len(data_loader),
                                   warmup_epochs=args["warmup_epochs"])  # fmt: skip
    wd_schedule = cosine_scheduler(args["weight_decay"], args["weight_decay_end"], args["epochs"], len(data_loader))
    momentum_schedule = cosine_scheduler(args["momentum_teacher"], 1, args["epochs"], len(data_loader))

    # the author's preflight: the student on the first batch of crops, the teacher's targets for it
    probe_crops = DataAugmentationDINO(args["global_crops_scale"], args["local_crops_scale"],
                                       args["local_crops_number"],
                                       torch.Generator().manual_seed(5_000 + seed))(train_x[: args["batch_size_per_gpu"]])
    with torch.no_grad():
        probe_targets = dino_loss.teacher_targets(teacher(probe_crops[:2]), 0)
    probe_batch = ((probe_crops,), probe_targets)
    nx.preflight(student, probe_batch, dino_loss.cross_entropy, optimizer=optimizer)
    mon = nx.monitor(student, optimizer, every=10)

    record: list[tuple[float, float, float]] = []
    for epoch in range(args["epochs"]):
        train_one_epoch(student, teacher, dino_loss, data_loader, transform, optimizer, lr_schedule, wd_schedule,
                        momentum_schedule, epoch, args, mon, variant, record)  # fmt: skip
    nx.finish(mon, student, probe_batch, dino_loss.cross_entropy, optimizer=optimizer)

    losses = [r[0] for r in record]
    return {
        "knn_top1": knn_top1(teacher.backbone, train_x, train_labels, test_x, test_labels, args["knn_k"],
                             args["knn_t"]),
        "student_knn_top1": knn_top1(student.backbone, train_x, train_labels, test_x, test_labels, args["knn_k"],
                                     args["knn_t"]),
        "heldout_loss": heldout_dino_loss(student, teacher, dino_loss, test_x, args["epochs"] - 1, seed),
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
    }
