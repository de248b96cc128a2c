"""Port of facebookresearch's DiT (Diffusion Transformer): patchified images through
transformer blocks conditioned by adaLN-Zero on a timestep and a class embedding (with
label dropout for classifier-free guidance), trained on the noise-prediction MSE plus the
variational-bound term of its learned variance, an EMA of the weights updated every step.

Source: github.com/facebookresearch/DiT, ``train.py``, ``models.py`` and ``diffusion/``
(``__init__.py``, ``gaussian_diffusion.py``, ``diffusion_utils.py``, ``respace.py``) at
commit ed81ce2229091fd4ecc9a223645f95cf379d582b (CC-BY-NC-4.0, Copyright (c) Meta
Platforms, Inc. and affiliates). Written anew from the facts of those files; no code copied.

Kept (models.py): ``modulate(x, shift, scale) = x * (1 + scale) + shift`` per token;
``TimestepEmbedder`` = the sinusoidal embedding of ``t`` (cos then sin, 256 frequencies,
max period 10,000) through ``Linear -> SiLU -> Linear``; ``LabelEmbedder`` =
``nn.Embedding(num_classes + 1, hidden)`` whose extra row is the null class, labels
replaced by it with probability ``class_dropout_prob`` 0.1 when ``train`` (the model's
``self.training``) or when ``force_drop_ids`` says so; ``DiTBlock`` = ``LayerNorm`` without
affine (eps 1e-6), timm's ``Attention`` (qkv ``Linear`` with bias, heads split by
``reshape(B, N, 3, heads, head_dim).permute(2, 0, 3, 1, 4)``, softmax of ``q k^T *
head_dim^-0.5``, heads merged by ``transpose(1, 2).reshape(B, N, C)``, ``proj``), timm's
``Mlp`` (``fc1 -> GELU(approximate="tanh") -> fc2``, mlp_ratio 4), and ``adaLN_modulation``
= ``SiLU -> Linear(hidden, 6 * hidden)`` chunked into shift/scale/gate for attention and
MLP, both residuals gated; ``FinalLayer`` = ``LayerNorm``, ``modulate`` by ``SiLU ->
Linear(hidden, 2 * hidden)``, ``Linear`` to ``p * p * out_channels``; ``DiT`` = timm's
``PatchEmbed`` (a ``Conv2d`` of kernel and stride ``p``, flattened to tokens) plus the
fixed 2-D sin-cos ``pos_embed`` (an ``nn.Parameter`` with ``requires_grad=False``), ``c =
t_emb + y_emb``, the blocks, the final layer and ``unpatchify`` (``reshape(N, h, w, p, p,
c)``, ``einsum('nhwpqc->nchpwq')``, ``reshape(N, c, h * p, h * p)``); ``learn_sigma=True``
(twice the input channels out); ``initialize_weights`` (xavier-uniform ``Linear``s with zero
biases, the patch embedding's conv as a ``Linear``, the label table N(0, 0.02), the
timestep MLP's weights N(0, 0.02), every ``adaLN_modulation`` output and the final
``Linear`` zeroed); ``forward_with_cfg`` (one batched forward of the duplicated half, guidance
on the eps channels; here on all ``in_channels`` as its commented line says, since the
published line's hard-coded 3 assumes 4-channel latents). diffusion/: ``create_diffusion("")``
= the linear schedule (``1000 / T * (1e-4, 0.02)``) of 1,000 steps, ``EPSILON`` mean,
``LEARNED_RANGE`` variance, ``LossType.MSE``; ``training_losses``: ``x_t = q_sample(x_start, t,
noise)``, the output split into eps and variance values, the ``vb`` term (``normal_kl`` of the
true posterior against ``p_mean_variance`` of the frozen eps with the learned variance, in
bits, the discretized Gaussian decoder NLL at ``t == 0``) plus ``mean_flat((noise - eps)^2)``.
train.py: ``ema = deepcopy(model)`` with ``requires_grad(ema, False)``, ``update_ema(ema,
model, decay=0)`` before training, ``model.train()`` ("important! This enables embedding
dropout for classifier-free guidance"), ``ema.eval()``; ``AdamW(model.parameters(), lr,
weight_decay=0)`` at a constant lr; images through ``ToTensor`` + ``Normalize(0.5, 0.5)``; a
shuffled loader with ``drop_last=True``; per step ``t = randint(0, 1000)``, ``loss =
diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()``, ``opt.zero_grad()``,
``backward``, ``opt.step()``, ``update_ema(ema, model)``; a running loss for the log line.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 10 classes), one channel, stand in
for the VAE latents (no VAE: the 0.18215 latent scaling has no counterpart), so ``input_size``
8, ``in_channels`` 1, ``patch_size`` 2 (16 tokens); hidden 48, depth 3, 4 heads (DiT-S is 384,
12, 6); 12 epochs of 22 batches of 64 (264 steps) instead of 1,400 epochs at a global batch of
256, at lr 1e-3 instead of 1e-4 (at 1e-4 the shrunk run is far from trained after 264 steps),
EMA decay 0.99 instead of 0.9999 (an average over ~100 steps); one process, no DDP, no
horizontal flip (a flipped digit is another glyph), no checkpoints, no log file, the
``SpacedDiffusion`` wrapper left out (with respacing ``""`` it keeps every step and maps each
timestep to itself).
Measure only (not in the program): on the 360 held-out digits at fixed draws of ``t`` and the
noise, the EMA model's eps MSE (eval mode, as it samples) with the true labels
(``heldout_eps_mse``) and with the null label (``heldout_uncond_eps_mse``, the unconditional
branch classifier-free guidance uses).

nndx, as the author would add it (as in the NCSN port): ``training_losses`` needs the noise,
``x_t`` and ``t`` of the step, so the batch the author hands nndx is 64 training images noised
as the loop noises them, ``((x_t, t, y), (noise, x_start, x_t, t))``, and ``loss_fn`` is the
part of ``training_losses`` after the model call (the MSE on the eps channels plus the vb term)
as a function of the model's output; a preflight ``nndx.probe(model, ...)`` with the optimizer,
``nndx.Monitor(model, opt)`` around the epochs, each step's loss logged (the program has no
validation loss); then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dit"
SOURCE = Source("facebookresearch/DiT", "train.py", "ed81ce2229091fd4ecc9a223645f95cf379d582b", "CC-BY-NC-4.0")

_MSE = "held-out noise-prediction MSE of the EMA model (true labels, fixed t and noise), 1.5x the healthy run's or more"

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits for latents, a 3-block DiT, 264 steps)"),
        Variant(
            "unpatchify_without_einsum",
            "unpatchify reshapes the (N, tokens, p * p * c) output straight to (N, c, H, W), without the "
            "reshape to (N, h, w, p, p, c) and the einsum: each token's values land on pixels of other patches, and "
            "the eps channel is made of the first half of the tokens",
            (C.WRONG_RESHAPE,),
            ("https://github.com/cloneofsimo/minRF/issues/6",
             "https://github.com/Vchitect/Latte/issues/132",
             "https://github.com/jsbaan/transformer-from-scratch/pull/6"),
            Measure("heldout_eps_mse", _MSE + ": 0.750/0.705/0.714 against 0.193/0.204/0.195 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "adamw_at_sgd_lr",
            "AdamW built with lr=0.1, the learning rate of an SGD recipe, instead of the program's (1e-4, 1e-3 here)",
            (C.LR_TOO_HIGH,),
            ("https://github.com/hustvl/LightningDiT/issues/10",
             "https://github.com/facebookresearch/deit/issues/29",
             "https://github.com/naver-ai/rope-vit/issues/16"),
            Measure("heldout_eps_mse", _MSE + ": 1.011/0.691/0.524 (1.0 predicts no noise at all) against "
                    "0.193/0.204/0.195 healthy on seeds 0-2", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

# the options, shrunk
image_size, in_channels, num_classes = 8, 1, 10
patch_size, hidden_size, depth, num_heads, mlp_ratio = 2, 48, 3, 4, 4.0
class_dropout_prob = 0.1
diffusion_steps = 1000
global_batch_size = 64
epochs = 12
lr = 1e-3  # 1e-4 in the paper and train.py
ema_decay = 0.99  # 0.9999 in train.py
SGD_LR = 0.1  # the bug: the lr of an SGD recipe


# --------------------------------------------------------------------------- models.py


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    """Scalar timesteps to vectors: sinusoids, then a two-layer MLP."""

    def __init__(self, hidden: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden, bias=True), nn.SiLU(),
                                 nn.Linear(hidden, hidden, bias=True))  # fmt: skip
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half).to(t.device)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class LabelEmbedder(nn.Module):
    """Class labels to vectors; drops labels to the null class for classifier-free guidance."""

    def __init__(self, n_classes: int, hidden: int, dropout_prob: float) -> None:
        super().__init__()
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(n_classes + use_cfg_embedding, hidden)
        self.num_classes = n_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels: torch.Tensor, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


class Attention(nn.Module):
    """timm's vision-transformer attention (no q/k norm, no dropout)."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    """timm's MLP: fc1, activation, fc2 (dropout 0)."""

    def __init__(self, in_features: int, hidden_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PatchEmbed(nn.Module):
    """timm's PatchEmbed: a strided conv, flattened to (N, tokens, hidden)."""

    def __init__(self, img_size: int, patch: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = (patch, patch)
        self.num_patches = (img_size // patch) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch, stride=patch, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class DiTBlock(nn.Module):
    """A transformer block conditioned by adaptive layer norm zero (adaLN-Zero)."""

    def __init__(self, hidden: int, heads: int, ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """Diffusion model with a transformer backbone."""

    def __init__(self, input_size: int = 32, patch: int = 2, in_chans: int = 4, hidden: int = 1152, n_blocks: int = 28,
                 heads: int = 16, ratio: float = 4.0, dropout_prob: float = 0.1, n_classes: int = 1000,
                 learn_sigma: bool = True, unpatchify_einsum: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.learn_sigma = learn_sigma
        self.in_channels = in_chans
        self.out_channels = in_chans * 2 if learn_sigma else in_chans
        self.patch_size = patch
        self.num_heads = heads

        self.x_embedder = PatchEmbed(input_size, patch, in_chans, hidden)
        self.t_embedder = TimestepEmbedder(hidden)
        self.y_embedder = LabelEmbedder(n_classes, hidden, dropout_prob)
        num_patches = self.x_embedder.num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, hidden), requires_grad=False)  # fixed sin-cos
        self.blocks = nn.ModuleList([DiTBlock(hidden, heads, ratio) for _ in range(n_blocks)])
        self.unpatchify_einsum = unpatchify_einsum
        self.final_layer = FinalLayer(hidden, patch, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)

        self.apply(_basic_init)
        pos_embed = get_2d_sincos_pos_embed(self.pos_embed.shape[-1], int(self.x_embedder.num_patches**0.5))
        self.pos_embed.data.copy_(torch.from_numpy(pos_embed).float().unsqueeze(0))
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.constant_(self.x_embedder.proj.bias, 0)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:  # adaLN-Zero
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, p * p * C) -> (N, C, H, W)."""
        c = self.out_channels
        p = self.x_embedder.patch_size[0]
        h = w = int(x.shape[1] ** 0.5)
        assert h * w == x.shape[1]
        if not self.unpatchify_einsum:  # the bug: the tokens' values laid out in memory order
            return x.reshape(shape=(x.shape[0], c, h * p, h * p))
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.x_embedder(x) + self.pos_embed
        t = self.t_embedder(t)
        y = self.y_embedder(y, self.training)
        c = t + y
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        half = x[: len(x) // 2]
        combined = torch.cat([half, half], dim=0)
        model_out = self.forward(combined, t, y)
        eps, rest = model_out[:, : self.in_channels], model_out[:, self.in_channels :]
        cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        eps = torch.cat([half_eps, half_eps], dim=0)
        return torch.cat([eps, rest], dim=1)


def get_2d_sincos_pos_embed(embed_dim: int, grid_size: int) -> np.ndarray:
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb_h = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_w = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def get_1d_sincos_pos_embed_from_grid(embed_dim: int, pos: np.ndarray) -> np.ndarray:
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


# --------------------------------------------------------------------------- diffusion/


def mean_flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.mean(dim=list(range(1, len(tensor.shape))))


def normal_kl(mean1, logvar1, mean2, logvar2) -> torch.Tensor:  # noqa: ANN001
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + ((mean1 - mean2) ** 2) * torch.exp(-logvar2))


def approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x: torch.Tensor, *, means: torch.Tensor, log_scales: torch.Tensor) -> torch.Tensor:
    centered_x = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered_x + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered_x - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    cdf_delta = cdf_plus - cdf_min
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_one_minus_cdf_min, torch.log(cdf_delta.clamp(min=1e-12))))  # fmt: skip


def _extract_into_tensor(arr: np.ndarray, timesteps: torch.Tensor, broadcast_shape: torch.Size) -> torch.Tensor:
    res = torch.from_numpy(arr).to(device=timesteps.device)[timesteps].float()
    while len(res.shape) < len(broadcast_shape):
        res = res[..., None]
    return res + torch.zeros(broadcast_shape, device=timesteps.device)


class GaussianDiffusion:
    """EPSILON mean, LEARNED_RANGE variance, the MSE loss plus the vb term (create_diffusion's defaults)."""

    def __init__(self, betas: np.ndarray) -> None:
        betas = np.array(betas, dtype=np.float64)
        assert (betas > 0).all() and (betas <= 1).all()
        self.betas = betas
        self.num_timesteps = int(betas.shape[0])
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_log_variance_clipped = np.log(np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)

    def q_sample(self, x_start: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return (_extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + _extract_into_tensor(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)  # fmt: skip

    def q_posterior_mean_variance(self, x_start: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor):  # noqa: ANN201
        mean = (_extract_into_tensor(self.posterior_mean_coef1, t, x_t.shape) * x_start
                + _extract_into_tensor(self.posterior_mean_coef2, t, x_t.shape) * x_t)  # fmt: skip
        return mean, _extract_into_tensor(self.posterior_log_variance_clipped, t, x_t.shape)

    def p_mean_variance(self, model_output: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        """p(x_{t-1} | x_t) from the model's output (eps and the variance interpolation values)."""
        C = x.shape[1]
        eps, model_var_values = torch.split(model_output, C, dim=1)
        min_log = _extract_into_tensor(self.posterior_log_variance_clipped, t, x.shape)
        max_log = _extract_into_tensor(np.log(self.betas), t, x.shape)
        frac = (model_var_values + 1) / 2
        model_log_variance = frac * max_log + (1 - frac) * min_log
        pred_xstart = (_extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x.shape) * x
                       - _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x.shape) * eps)  # fmt: skip
        model_mean, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return {"mean": model_mean, "log_variance": model_log_variance, "pred_xstart": pred_xstart}

    def _vb_terms_bpd(self, model_output: torch.Tensor, x_start: torch.Tensor, x_t: torch.Tensor,
                      t: torch.Tensor) -> torch.Tensor:  # fmt: skip
        true_mean, true_log_variance_clipped = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model_output, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_variance_clipped, out["mean"], out["log_variance"])) / np.log(2.0)
        decoder_nll = -discretized_gaussian_log_likelihood(x_start, means=out["mean"],
                                                           log_scales=0.5 * out["log_variance"])  # fmt: skip
        decoder_nll = mean_flat(decoder_nll) / np.log(2.0)
        return torch.where(t == 0, decoder_nll, kl)

    def losses_from_output(self, model_output: torch.Tensor, x_start: torch.Tensor, x_t: torch.Tensor,
                           t: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
        """The part of ``training_losses`` after the model call."""
        B, C = x_t.shape[:2]
        assert model_output.shape == (B, C * 2, *x_t.shape[2:])
        eps, model_var_values = torch.split(model_output, C, dim=1)
        frozen_out = torch.cat([eps.detach(), model_var_values], dim=1)  # the vb term learns the variance only
        terms = {"vb": self._vb_terms_bpd(frozen_out, x_start, x_t, t)}
        assert eps.shape == noise.shape == x_start.shape
        terms["mse"] = mean_flat((noise - eps) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"]
        return terms

    def training_losses(self, model: nn.Module, x_start: torch.Tensor, t: torch.Tensor,
                        model_kwargs: dict | None = None, noise: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)
        model_output = model(x_t, t, **(model_kwargs or {}))
        return self.losses_from_output(model_output, x_start, x_t, t, noise)


def create_diffusion(steps: int = 1000) -> GaussianDiffusion:
    """The linear schedule of Ho et al., scaled to ``steps`` (respacing ``""``: every step kept)."""
    scale = 1000 / steps
    return GaussianDiffusion(np.linspace(scale * 0.0001, scale * 0.02, steps, dtype=np.float64))


# --------------------------------------------------------------------------- train.py


@torch.no_grad()
def update_ema(ema_model: nn.Module, model: nn.Module, decay: float = 0.9999) -> None:
    ema_params = OrderedDict(ema_model.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def requires_grad(model: nn.Module, flag: bool = True) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    x_all = (data.to_tensor(train_images) - 0.5) / 0.5  # ToTensor + Normalize(0.5, 0.5)
    loader_rng = torch.Generator().manual_seed(seed)

    model = DiT(input_size=image_size, patch=patch_size, in_chans=in_channels, hidden=hidden_size, n_blocks=depth,
                heads=num_heads, ratio=mlp_ratio, dropout_prob=class_dropout_prob, n_classes=num_classes,
                unpatchify_einsum=variant != "unpatchify_without_einsum")  # fmt: skip
    ema = deepcopy(model)
    requires_grad(ema, False)
    diffusion = create_diffusion(diffusion_steps)
    opt = torch.optim.AdamW(model.parameters(), lr=SGD_LR if variant == "adamw_at_sgd_lr" else lr, weight_decay=0)

    def loss_fn(model_output: torch.Tensor, targets: tuple[torch.Tensor, ...]) -> torch.Tensor:
        noise, x_start, x_t, t = targets
        return diffusion.losses_from_output(model_output, x_start, x_t, t, noise)["loss"].mean()

    # the batch the author hands nndx: 64 training images, noised as the loop noises them
    probe_gen = torch.Generator().manual_seed(seed + 1)
    px, py = x_all[:global_batch_size], train_labels[:global_batch_size]
    pt = torch.randint(0, diffusion.num_timesteps, (len(px),), generator=probe_gen)
    pnoise = torch.randn(px.shape, generator=probe_gen)
    pxt = diffusion.q_sample(px, pt, pnoise)
    probe_batch = ((pxt, pt, py), (pnoise, px, pxt, pt))

    update_ema(ema, model, decay=0)
    model.train()  # important! This enables embedding dropout for classifier-free guidance
    ema.eval()

    nx.preflight(model, probe_batch, loss_fn, optimizer=opt)
    mon = nx.monitor(model, opt, every=10)

    train_steps = 0
    running_loss = 0.0
    losses: list[float] = []
    for epoch in range(epochs):
        order = torch.randperm(len(x_all), generator=loader_rng)
        for i in range(0, len(order) - global_batch_size + 1, global_batch_size):  # drop_last=True
            idx = order[i : i + global_batch_size]
            x, y = x_all[idx], train_labels[idx]
            t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],))
            loss_dict = diffusion.training_losses(model, x, t, dict(y=y))
            loss = loss_dict["loss"].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            update_ema(ema, model, decay=ema_decay)
            mon.log(loss)
            running_loss += loss.item()
            train_steps += 1
            losses.append(loss.item())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=opt)
    model.eval()  # important! This disables randomized embedding dropout
    return {
        "final_train_loss": float(np.mean(losses[-22:])),
        "train_steps": float(train_steps),
        **measure(ema, diffusion, test_images, test_labels, seed),
    }


@torch.no_grad()
def measure(ema: DiT, diffusion: GaussianDiffusion, test_images: torch.Tensor, test_labels: torch.Tensor,
            seed: int) -> dict[str, float]:  # fmt: skip
    """The EMA model's held-out eps MSE at fixed draws, with the true labels and with the null label."""
    ema.eval()
    x = (data.to_tensor(test_images) - 0.5) / 0.5
    gen = torch.Generator().manual_seed(seed + 3)
    t = torch.randint(0, diffusion.num_timesteps, (len(x),), generator=gen)
    noise = torch.randn(x.shape, generator=gen)
    x_t = diffusion.q_sample(x, t, noise)
    eps_cond = ema(x_t, t, test_labels)[:, :in_channels]
    y_null = torch.full_like(test_labels, num_classes)  # the null class, as sample.py builds it
    eps_uncond = ema(x_t, t, y_null)[:, :in_channels]
    return {
        "heldout_eps_mse": float(((eps_cond - noise) ** 2).mean()),
        "heldout_uncond_eps_mse": float(((eps_uncond - noise) ** 2).mean()),
    }
