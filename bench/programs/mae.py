"""Port of facebookresearch/mae: masked autoencoder pre-training of a ViT (random masking of 75% of
the patches, an encoder on the visible patches only, a light decoder with mask tokens, the MSE on the
masked patches).

Source: github.com/facebookresearch/mae, ``models_mae.py``, ``main_pretrain.py``,
``engine_pretrain.py`` and ``util/lr_sched.py``, ``util/pos_embed.py`` at commit
efb2a8062c206524e35e47d04501ed4f544c0ae8 (CC-BY-NC 4.0, Copyright (c) Meta Platforms, Inc. and
affiliates); timm's ``PatchEmbed`` and ``Block`` (Apache-2.0), which ``models_mae.py`` imports, are
written out here. Written anew from the facts of those files; no code copied.

Kept: ``MaskedAutoencoderViT``: ``PatchEmbed`` (a conv of kernel and stride ``patch_size``, flattened
to tokens), a ``cls_token``, a fixed (``requires_grad=False``) 2-D sin-cos ``pos_embed`` with a zero row
for the cls token; timm ``Block``s (pre-norm: ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``, qkv with
bias, the MLP fc1 -> GELU -> fc2 at ``mlp_ratio`` 4) and a final ``norm``; the decoder: ``decoder_embed``,
a ``mask_token``, its own fixed sin-cos ``decoder_pos_embed``, decoder blocks, ``decoder_norm``,
``decoder_pred`` to ``patch_size**2 * in_chans`` pixels; ``LayerNorm(eps=1e-6)``; the init (the
patch-embedding weight xavier-uniform as a matrix, cls and mask tokens normal std .02, every Linear
xavier-uniform with zero bias, LayerNorm 1/0); ``patchify`` / ``unpatchify`` (the reshape to
``(N, C, h, p, w, p)`` and the ``nchpwq -> nhwpqc`` permutation); ``random_masking`` (uniform noise
per sample, ``argsort`` for ``ids_shuffle`` and again for ``ids_restore``, the first ``len_keep``
kept with ``gather``, the binary mask unshuffled with ``ids_restore``); ``forward_encoder`` (pos embed
without the cls row, masking, the cls token prepended with its pos row); ``forward_decoder`` (mask
tokens appended, unshuffled by ``gather``, the cls token put back, decoder pos embed, blocks, norm,
pred, cls dropped); ``forward_loss`` (the per-patch mean squared error, ``norm_pix_loss`` optional,
averaged over the removed patches only: ``(loss * mask).sum() / mask.sum()``); ``forward`` returning
``loss, pred, mask``. ``main_pretrain.py``: ``RandomResizedCrop(scale=(0.2, 1.0))`` +
``RandomHorizontalFlip`` + ``Normalize``, a shuffled ``drop_last`` loader, ``lr = blr * eff_batch_size /
256``, AdamW ``betas=(0.9, 0.95)`` with timm's ``add_weight_decay`` groups (no decay for biases and 1-D
parameters), ``weight_decay`` 0.05, ``mask_ratio`` 0.75, ``norm_pix_loss`` off (its default);
``engine_pretrain.train_one_epoch``: ``model.train(True)``, the per-iteration ``adjust_learning_rate``
(linear warmup then half-cycle cosine to ``min_lr`` 0, at ``data_iter_step / len(loader) + epoch``),
the non-finite loss check, ``loss /= accum_iter`` (1), the loss scaler's backward and step, then
``zero_grad``.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out) as 1-channel 8x8 images instead
of ImageNet 224x224x3 (``in_chans`` 1, the grey mean/std 0.449/0.226); ``patch_size`` 2 (16 patches, 4
kept); encoder 48 wide, depth 2, 4 heads; decoder 32 wide, depth 1, 4 heads (instead of ViT-L 1024x24
and a 512x8 decoder); batch 64; 20 epochs with 3 of warmup instead of 400 with 40; ``blr`` 1e-2 instead
of 1e-3 (so ``lr`` 2.5e-3: 440 steps instead of hundreds of thousands); the crop and flip batched
(bilinear instead of bicubic); CPU float32 (no autocast; the loss scaler is a plain backward + step);
one process, no checkpoints or TensorBoard.
Measure only (not in the program): the held-out reconstruction error, in normalised pixels, of the
masked regions of the image ``unpatchify(pred)`` (the picture the repo's demo shows) under a fixed mask
draw; and a linear probe (logistic regression, LBFGS) on the frozen encoder's mean-pooled, normed
tokens of the unmasked held-out images (``mask_ratio=0``).

nndx, as the author would add it: the model returns its own loss, so the preflight ``nndx.probe`` gets
the first batch as ``(imgs, None)`` and ``loss_fn = lambda output, _: output[0]``, with the optimizer;
``nndx.Monitor(model, optimizer)`` around the loop, each step's loss logged; then ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.simsiam import linear_probe
from nndx.report import CauseCode as C

NAME = "mae"
SOURCE = Source("facebookresearch/mae", "models_mae.py", "efb2a8062c206524e35e47d04501ed4f544c0ae8", "CC-BY-NC-4.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (main_pretrain.py defaults, shrunk)"),
        Variant(
            "loss_on_visible_patches",
            "forward_loss weights the per-patch error by (1 - mask) instead of mask: the mask's convention "
            "(1 is removed) read backwards, so the loss is the reconstruction of the patches the encoder saw",
            (C.WRONG_LOSS,),
            ("https://github.com/Sllambias/asparagus/pull/12",
             "https://github.com/facebookresearch/mae/issues/173",
             "https://github.com/facebookresearch/mae/issues/125"),
            Measure("masked_mse", "held-out masked-region reconstruction error at least 1.3x the healthy run's "
                    "(5.05 against 1.56 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "patchify_without_permute",
            "patchify reshapes the images straight to (N, L, p*p*C) without the nchpwq->nhwpqc permutation "
            "(unpatchify likewise): target token k is a 1x4 strip of pixel rows, not the 2x2 patch the "
            "conv embedding and the mask call k",
            (C.WRONG_RESHAPE,),
            ("https://github.com/cloneofsimo/minRF/issues/6",
             "https://github.com/stelzner/monet/issues/1",
             "https://github.com/NVIDIA-NeMo/RL/pull/4106"),
            Measure("masked_mse", "held-out masked-region reconstruction error, in the image the program's "
                    "unpatchify makes, at least 1.2x the healthy run's (2.23 against 1.56 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

SIZE, PATCH = 8, 2
MEAN, STD = 0.449, 0.226
ARGS = {"batch_size": 64, "epochs": 20, "warmup_epochs": 3, "blr": 1e-2, "min_lr": 0.0, "weight_decay": 0.05,
        "mask_ratio": 0.75, "norm_pix_loss": False, "accum_iter": 1}  # fmt: skip
MODEL = {"embed_dim": 48, "depth": 2, "num_heads": 4, "decoder_embed_dim": 32, "decoder_depth": 1,
         "decoder_num_heads": 4, "mlp_ratio": 4.0}  # fmt: skip


# --------------------------------------------------------------------------- util/pos_embed.py


def sincos_1d(embed_dim: int, pos: np.ndarray) -> np.ndarray:
    omega = 1.0 / 10000 ** (np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0))
    out = np.outer(pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_2d(embed_dim: int, grid_size: int, cls_token: bool = False) -> np.ndarray:
    gw, gh = np.meshgrid(np.arange(grid_size, dtype=np.float32), np.arange(grid_size, dtype=np.float32))
    emb = np.concatenate([sincos_1d(embed_dim // 2, gw), sincos_1d(embed_dim // 2, gh)], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)
    return emb


# --------------------------------------------------------------------------- timm's PatchEmbed and Block


class PatchEmbed(nn.Module):
    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# --------------------------------------------------------------------------- models_mae.py


class MaskedAutoencoderViT(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=1024, depth=24, num_heads=16,
                 decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16, mlp_ratio=4.0,
                 norm_pix_loss=False, loss_on_visible=False, permute_patches=True) -> None:  # fmt: skip
        super().__init__()
        self.in_chans = in_chans
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim), requires_grad=False)
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)

        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim, bias=True)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, decoder_embed_dim), requires_grad=False)
        self.decoder_blocks = nn.ModuleList([Block(decoder_embed_dim, decoder_num_heads, mlp_ratio)
                                             for _ in range(decoder_depth)])  # fmt: skip
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size**2 * in_chans, bias=True)

        self.norm_pix_loss = norm_pix_loss
        self.loss_on_visible = loss_on_visible  # the bug: (1 - mask) in forward_loss
        self.permute_patches = permute_patches  # the bug when False: a plain reshape in (un)patchify
        self.initialize_weights()

    def initialize_weights(self) -> None:
        grid = int(self.patch_embed.num_patches**0.5)
        self.pos_embed.data.copy_(torch.from_numpy(sincos_2d(self.pos_embed.shape[-1], grid, True)).float()[None])
        self.decoder_pos_embed.data.copy_(
            torch.from_numpy(sincos_2d(self.decoder_pos_embed.shape[-1], grid, True)).float()[None])
        w = self.patch_embed.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def patchify(self, imgs: torch.Tensor) -> torch.Tensor:
        p, c = self.patch_embed.patch_size[0], self.in_chans
        h = w = imgs.shape[2] // p
        if not self.permute_patches:
            return imgs.reshape(imgs.shape[0], h * w, p * p * c)
        x = imgs.reshape(imgs.shape[0], c, h, p, w, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(imgs.shape[0], h * w, p * p * c)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        p, c = self.patch_embed.patch_size[0], self.in_chans
        h = w = int(x.shape[1] ** 0.5)
        if not self.permute_patches:
            return x.reshape(x.shape[0], c, h * p, w * p)
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def random_masking(self, x: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None):
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        noise = torch.rand(N, L, generator=generator)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L])
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, dim=1, index=ids_restore)
        return x_masked, mask, ids_restore

    def forward_encoder(self, x: torch.Tensor, mask_ratio: float, generator=None):
        x = self.patch_embed(x)
        x = x + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, mask_ratio, generator)
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat((cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(x)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1)
        x = x + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        x = self.decoder_pred(self.decoder_norm(x))
        return x[:, 1:, :]

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        loss = ((pred - target) ** 2).mean(dim=-1)
        weight = 1 - mask if self.loss_on_visible else mask
        return (loss * weight).sum() / weight.sum()

    def forward(self, imgs: torch.Tensor, mask_ratio: float = 0.75, generator=None):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, generator)
        pred = self.forward_decoder(latent, ids_restore)
        loss = self.forward_loss(imgs, pred, mask)
        return loss, pred, mask


# --------------------------------------------------------------------------- main_pretrain.py's pieces


def add_weight_decay(model: nn.Module, weight_decay: float) -> list[dict]:
    """timm's ``optim_factory.add_weight_decay``: no decay for 1-D parameters and biases."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name.endswith(".bias") else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def adjust_learning_rate(optimizer, epoch: float, args: dict) -> float:
    if epoch < args["warmup_epochs"]:
        lr = args["lr"] * epoch / args["warmup_epochs"]
    else:
        lr = args["min_lr"] + (args["lr"] - args["min_lr"]) * 0.5 * (
            1.0 + math.cos(math.pi * (epoch - args["warmup_epochs"]) / (args["epochs"] - args["warmup_epochs"])))
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return lr


def transform_train(imgs: torch.Tensor, generator: torch.Generator, scale=(0.2, 1.0),
                    ratio=(3 / 4, 4 / 3)) -> torch.Tensor:  # fmt: skip
    """``RandomResizedCrop(SIZE, scale=(0.2, 1))`` + ``RandomHorizontalFlip`` + ``Normalize``, batched:
    each image's box drawn on its own (area and log-aspect uniform), sampled bilinearly."""
    n = imgs.shape[0]
    area = scale[0] + (scale[1] - scale[0]) * torch.rand(n, generator=generator)
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(n, generator=generator)
    aspect = log_r.exp()
    w = (area * aspect).sqrt().clamp(max=1.0)
    h = (area / aspect).sqrt().clamp(max=1.0)
    cx = (1 - w) * (2 * torch.rand(n, generator=generator) - 1)
    cy = (1 - h) * (2 * torch.rand(n, generator=generator) - 1)
    flip = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * flip, cx, h, cy
    grid = F.affine_grid(theta, list(imgs.shape), align_corners=False)
    out = F.grid_sample(imgs, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return (out - MEAN) / STD


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def masked_reconstruction_error(model: MaskedAutoencoderViT, imgs: torch.Tensor, mask_ratio: float) -> float:
    """The error of the image the program reconstructs (``unpatchify(pred)``) on the removed 2x2
    regions, a fixed mask draw for every variant."""
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    _, pred, mask = model(imgs, mask_ratio=mask_ratio, generator=gen)
    recon = model.unpatchify(pred)
    grid = SIZE // PATCH
    pixel_mask = mask.view(-1, 1, grid, grid).repeat_interleave(PATCH, 2).repeat_interleave(PATCH, 3)
    return float((((recon - imgs) ** 2) * pixel_mask).sum() / pixel_mask.sum())


@torch.no_grad()
def encoder_features(model: MaskedAutoencoderViT, imgs: torch.Tensor) -> torch.Tensor:
    model.eval()
    latent, _, _ = model.forward_encoder(imgs, 0.0, torch.Generator().manual_seed(0))
    return latent[:, 1:, :].mean(dim=1)


# --------------------------------------------------------------------------- main / train_one_epoch


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)  # (N, 1, 8, 8) in [0, 1]

    model = MaskedAutoencoderViT(img_size=SIZE, patch_size=PATCH, in_chans=1, norm_pix_loss=args["norm_pix_loss"],
                                 loss_on_visible=variant == "loss_on_visible_patches",
                                 permute_patches=variant != "patchify_without_permute", **MODEL)  # fmt: skip
    eff_batch_size = args["batch_size"] * args["accum_iter"]
    args["lr"] = args["blr"] * eff_batch_size / 256
    optimizer = torch.optim.AdamW(add_weight_decay(model, args["weight_decay"]), lr=args["lr"], betas=(0.9, 0.95))

    aug_gen = torch.Generator().manual_seed(seed + 10)
    loader_gen = torch.Generator().manual_seed(seed + 20)
    steps_per_epoch = len(train_x) // args["batch_size"]  # drop_last

    probe_batch = (transform_train(train_x[: args["batch_size"]], torch.Generator().manual_seed(seed + 30)), None)

    def mae_loss(output, _target):
        return output[0]

    nx.preflight(model, probe_batch, mae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    losses: list[float] = []
    for epoch in range(args["epochs"]):
        model.train(True)
        optimizer.zero_grad()
        order = torch.randperm(len(train_x), generator=loader_gen)
        for data_iter_step in range(steps_per_epoch):
            if data_iter_step % args["accum_iter"] == 0:
                adjust_learning_rate(optimizer, data_iter_step / steps_per_epoch + epoch, args)
            idx = order[data_iter_step * args["batch_size"] : (data_iter_step + 1) * args["batch_size"]]
            samples = transform_train(train_x[idx], aug_gen)
            loss, _, _ = model(samples, mask_ratio=args["mask_ratio"])
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise RuntimeError(f"Loss is {loss_value}, stopping training")
            loss = loss / args["accum_iter"]
            loss.backward()  # loss_scaler(loss, optimizer, parameters=..., update_grad=True)
            if (data_iter_step + 1) % args["accum_iter"] == 0:
                optimizer.step()
                optimizer.zero_grad()
            mon.log(loss)
            losses.append(loss_value)
    nx.finish(mon, model, probe_batch, mae_loss, optimizer=optimizer)

    test_in = (test_x - MEAN) / STD
    train_in = (train_x - MEAN) / STD
    return {
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-steps_per_epoch:])),
        "masked_mse": masked_reconstruction_error(model, test_in, args["mask_ratio"]),
        "linear_acc": linear_probe(encoder_features(model, train_in), train_labels, encoder_features(model, test_in),
                                   test_labels),  # fmt: skip
    }
