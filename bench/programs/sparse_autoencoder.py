"""Port of OpenAI's sparse_autoencoder training reference: a TopK sparse autoencoder over a
model's activations, with the pre-encoder bias subtracted, tied initialisation, unit-norm
decoder columns renormalised every step and the gradient's component parallel to them removed,
the normalised MSE loss plus the AuxK loss that makes dead latents model the residual, and Adam.

Source: github.com/openai/sparse_autoencoder, ``sparse_autoencoder/train.py`` (with
``sparse_autoencoder/kernels.py`` for ``mse``/``normalized_mse`` and ``model.py`` for the
``TopK`` activation) at commit 4965b941e9eb590b00b253a2c406db1e1b193942 (MIT, Copyright (c)
2023 OpenAI). Written anew from the facts of those files; no code copied.

Kept: ``FastAutoencoder``: ``encoder = Linear(d_model, n_dirs, bias=False)``, ``decoder =
Linear(n_dirs, d_model, bias=False)``, ``pre_bias`` (d_model) and ``latent_bias`` (n_dirs)
parameters; the decoder initialised as the encoder's transpose ("tied" init) and its columns
normalised to unit norm; the forward ``latents_pre_act = linear(x - pre_bias, W_enc,
latent_bias)``, the top-``k`` values and indices per row, the ``stats_last_nonzero`` buffer
(per latent: steps since it last fired above 1e-3; reset where it fired, then ``+= 1``)
updated in every forward before AuxK, the AuxK top-``auxk`` over the pre-activations masked
to the latents dead for more than ``dead_steps_threshold`` steps, ``relu`` on both value sets,
``decode_sparse`` = the decoder over the sparse latents ``+ pre_bias``, forward returning
``(recons, {"auxk_inds", "auxk_vals"})``; ``init_from_data_``: ``pre_bias`` set to the
geometric median of the statistics sample, the encoder rescaled so that unit-norm random
inputs reconstruct at unit norm; ``mse_scale = 1 / mean((mean(acts) - acts)^2)``; the loss
``mse_scale * mse(recons, x) + auxk_coef * normalized_mse(decode_sparse(auxk_inds,
auxk_vals), x - recons.detach() + pre_bias.detach()).nan_to_num(0)`` with ``auxk_coef =
1/32``; ``training_loop_``: ``Adam(lr, eps=6.25e-10)``, per batch the forward, the loss,
``backward``, ``unit_norm_decoder_`` then ``unit_norm_decoder_grad_adjustment_`` (the
gradient minus its projection on each unit decoder column), ``opt.step()``; ``clip_grad``
and ``ema_multiplier`` at their ``Config`` defaults (None: no clipping, no EMA);
``batch_tensors`` re-batching an iterator of activation chunks into fixed batches, the
partial last one dropped.
Changed to run on a CPU: the Triton kernels (sparse encoder backward, sparse decoder,
fused MSE) replaced by their dense PyTorch equivalents (the same values and gradients:
``torch.topk`` passes gradient only to the selected latents, as ``EncWrapper.backward``
does); no sharding/data-parallel comms (one process, ``TRIVIAL_COMMS``); no CUDA autocast
or ``GradScaler`` (fp32); the geometric median computed by Weiszfeld iterations written
here instead of the ``geom_median`` package; no wandb. The published ``training_loop_``
never calls ``opt.zero_grad()`` (a bare-bones reference, "not guaranteed to run ... out of
the box"); the port zeroes the gradients at the top of every step, as any working copy must.
Shrunk: the activations are a small randomly initialised transformer-style MLP block's
residual stream (``h = embed(x)``, ``h + W2 gelu(W1 LN(h))``, d_model 32, hidden 128) over
scikit-learn's 8x8 digits with a little Gaussian jitter, streamed in chunks of 2,048 (the
"dataloading left as an exercise" of ``main()``); ``n_dirs`` 512 instead of 32,768, ``k`` 8
instead of 32, ``auxk`` 64 instead of 256, batch 128 instead of 131,072, 1,000 steps,
``lr`` 1e-3 instead of 1e-4 (for so few steps), ``dead_toks_threshold`` 12,800 tokens (100
steps) instead of 10M.
Measure only (not in the program): on 4,096 held-out activations, the fraction of variance
unexplained (normalised MSE) and the fraction of latents that never fire (dead).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with
the program's loss written as ``loss_fn(output, target)`` (the training loss with
``recons, info = output``; it reaches the autoencoder's ``decode_sparse`` through the closure,
as the program's ``loss_fn(ae, ...)`` does), ``nndx.Monitor`` around the training loop with
each step's loss logged. ``training_loop_`` builds the optimizer itself, so the author opens the
preflight and the Monitor inside it, right after the ``Adam`` is built; after the loop
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sparse_autoencoder"
SOURCE = Source("openai/sparse_autoencoder", "sparse_autoencoder/train.py",
                "4965b941e9eb590b00b253a2c406db1e1b193942", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published, zero_grad added (shrunk: 32-d activations, 512 latents, 1,000 steps)"),
        Variant(
            "init_from_data_skipped",
            "init_from_data_(ae, stats_acts_sample, comms) left out: pre_bias stays at zero instead of the "
            "activations' geometric median and the encoder is not rescaled, so latents anti-aligned with the "
            "activations' mean start (and stay) below the top-k",
            (C.BAD_INIT, C.DEAD_RELU),
            ("https://github.com/AkihikoWatanabe/paper_notes/issues/5822",
             "https://github.com/decoderesearch/SAELens/issues/202"),
            Measure("dead_fraction", "fraction of latents that never fire on held-out activations at least 0.15 "
                    "above the healthy run's", lambda healthy, buggy: buggy >= healthy + 0.15),
        ),
        Variant(
            "lr_too_high",
            "Adam at lr 0.1 instead of 1e-3 (a learning rate fit for plain SGD, not for Adam)",
            (C.LR_TOO_HIGH,),
            ("https://github.com/goodfire-ai/spd/issues/87",
             "https://github.com/stas00/ml-engineering/issues/32"),
            Measure("fvu", "held-out fraction of variance unexplained at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

d_model, d_hidden = 32, 128
n_dirs, k, auxk = 512, 8, 64
auxk_coef = 1 / 32
bs = 128
n_steps = 1000
lr, eps = 1e-3, 6.25e-10
dead_toks_threshold = 12_800
CHUNK = 2048
N_EVAL = 4096


# --------------------------------------------------------------------------- the activations


class _SourceModel(nn.Module):
    """The model whose activations the autoencoder reads: randomly initialised, never trained."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(64, d_model)
        self.ln = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return h + self.fc2(F.gelu(self.fc1(self.ln(h))))


def activation_chunks(source: _SourceModel, pixels: torch.Tensor, n_chunks: int, gen: torch.Generator):
    """An iterator of (CHUNK, d_model) residual-stream activations on jittered digits."""
    for _ in range(n_chunks):
        idx = torch.randint(len(pixels), (CHUNK,), generator=gen)
        x = pixels[idx] + 0.05 * torch.randn(CHUNK, 64, generator=gen)
        with torch.no_grad():
            acts = source(x)
        yield acts


# --------------------------------------------------------------------------- train.py (the autoencoder)


class FastAutoencoder(nn.Module):
    """latents = relu(topk(encoder(x - pre_bias) + latent_bias)); recons = decoder(latents) + pre_bias"""

    def __init__(self, n_dirs_local: int, d_model: int, k: int, auxk: int | None, dead_steps_threshold: int) -> None:
        super().__init__()
        self.n_dirs_local = n_dirs_local
        self.d_model = d_model
        self.k = k
        self.auxk = auxk
        self.dead_steps_threshold = dead_steps_threshold

        self.encoder = nn.Linear(d_model, n_dirs_local, bias=False)
        self.decoder = nn.Linear(n_dirs_local, d_model, bias=False)
        self.pre_bias = nn.Parameter(torch.zeros(d_model))
        self.latent_bias = nn.Parameter(torch.zeros(n_dirs_local))
        self.stats_last_nonzero: torch.Tensor
        self.register_buffer("stats_last_nonzero", torch.zeros(n_dirs_local, dtype=torch.long))

        # "tied" init, then unit-norm decoder columns
        self.decoder.weight.data = self.encoder.weight.data.T.clone()
        unit_norm_decoder_(self)

    def auxk_mask_fn(self, x: torch.Tensor) -> torch.Tensor:
        dead_mask = self.stats_last_nonzero > self.dead_steps_threshold
        return x * dead_mask

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        latents_pre_act = F.linear(x - self.pre_bias, self.encoder.weight, self.latent_bias)
        topk = torch.topk(latents_pre_act, k=self.k, dim=-1)
        inds, vals = topk.indices, topk.values

        # set num nonzero stat
        with torch.no_grad():
            tmp = torch.zeros_like(self.stats_last_nonzero)
            tmp.scatter_add_(0, inds.reshape(-1), (vals > 1e-3).to(tmp.dtype).reshape(-1))
            self.stats_last_nonzero *= 1 - tmp.clamp(max=1)
            self.stats_last_nonzero += 1

        # auxk: has to go after the stats update
        auxk_inds = auxk_vals = None
        if self.auxk is not None:
            aux = torch.topk(self.auxk_mask_fn(latents_pre_act), k=self.auxk, dim=-1)
            auxk_inds, auxk_vals = aux.indices, torch.relu(aux.values)

        vals = torch.relu(vals)
        recons = self.decode_sparse(inds, vals)
        return recons, {"auxk_inds": auxk_inds, "auxk_vals": auxk_vals}

    def decode_sparse(self, inds: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        latents = torch.zeros(vals.shape[0], self.n_dirs_local, dtype=vals.dtype).scatter(-1, inds, vals)
        return F.linear(latents, self.decoder.weight) + self.pre_bias


def unit_norm_decoder_(autoencoder: FastAutoencoder) -> None:
    autoencoder.decoder.weight.data /= autoencoder.decoder.weight.data.norm(dim=0)


def unit_norm_decoder_grad_adjustment_(autoencoder: FastAutoencoder) -> None:
    """project out the gradient parallel to the (unit-norm) dictionary vectors"""
    assert autoencoder.decoder.weight.grad is not None
    w, g = autoencoder.decoder.weight.data, autoencoder.decoder.weight.grad
    g.add_(torch.einsum("bn,bn->n", w, g) * w, alpha=-1)


def batch_tensors(it, batch_size: int, drop_last: bool = True):
    tensors: list[torch.Tensor] = []
    batch_so_far = 0
    for t in it:
        tensors.append(t)
        batch_so_far += t.shape[0]
        if sum(t.shape[0] for t in tensors) < batch_size:
            continue
        while batch_so_far >= batch_size:
            concat = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            offset = 0
            while offset + batch_size <= concat.shape[0]:
                yield concat[offset : offset + batch_size]
                batch_so_far -= batch_size
                offset += batch_size
            tensors = [concat[offset:]] if offset < concat.shape[0] else []
    if tensors and not drop_last:
        yield torch.cat(tensors, dim=0)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    assert output.shape == target.shape
    return ((output.float() - target.float()) ** 2).mean()


def normalized_mse(recon: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    xs_mu = xs.mean(dim=0)
    return mse(recon, xs) / mse(xs_mu[None, :].broadcast_to(xs.shape), xs)


def geometric_median(points: torch.Tensor, iters: int = 100, eps_: float = 1e-8) -> torch.Tensor:
    """Weiszfeld's algorithm (the role of ``geom_median.torch.compute_geometric_median``)."""
    median = points.mean(0)
    for _ in range(iters):
        w = 1.0 / (points - median).norm(dim=1).clamp_min(eps_)
        median = (w[:, None] * points).sum(0) / w.sum()
    return median


def init_from_data_(ae: FastAutoencoder, stats_acts_sample: torch.Tensor, gen: torch.Generator) -> None:
    ae.pre_bias.data = geometric_median(stats_acts_sample[:32768].float())
    with torch.no_grad():
        x = torch.randn(256, ae.d_model, generator=gen)
        x /= x.norm(dim=-1, keepdim=True)
        x += ae.pre_bias.data
        recons, _ = ae(x)
        recons_norm = (recons - ae.pre_bias.data).norm(dim=-1).mean()
        ae.encoder.weight.data /= recons_norm.item()


def training_loop_(ae, train_acts_iter, loss_fn, lr, nx, probe, eps=6.25e-10):
    opt = torch.optim.Adam(ae.parameters(), lr=lr, eps=eps)
    nx.preflight(ae, probe[0], probe[1], optimizer=opt)  # nndx: before the first step
    mon = nx.monitor(ae, opt, every=10)
    losses = []
    for i, flat_acts_train_batch in enumerate(train_acts_iter):
        opt.zero_grad(set_to_none=True)  # not in the published loop (see the module docstring)
        recons, info = ae(flat_acts_train_batch)
        loss = loss_fn(ae, flat_acts_train_batch, recons, info)
        loss.backward()

        unit_norm_decoder_(ae)
        unit_norm_decoder_grad_adjustment_(ae)
        opt.step()
        nx.timed(lambda: mon.log(loss))
        losses.append(loss.item())
    return opt, mon, losses


# --------------------------------------------------------------------------- main()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    images, _, _, _ = digits.digit_images(seed=seed, test_size=0)
    pixels = images.reshape(len(images), 64).float() / 255.0
    source = _SourceModel()  # random init, drawn from the seed

    stats_acts_sample = torch.cat(list(activation_chunks(source, pixels, 4, gen)))
    eval_acts = torch.cat(list(activation_chunks(source, pixels, N_EVAL // CHUNK, gen)))

    ae = FastAutoencoder(n_dirs_local=n_dirs, d_model=d_model, k=k, auxk=auxk,
                         dead_steps_threshold=dead_toks_threshold // bs)  # fmt: skip
    if variant != "init_from_data_skipped":
        init_from_data_(ae, stats_acts_sample, gen)
    mse_scale = (1 / ((stats_acts_sample.float().mean(dim=0) - stats_acts_sample.float()) ** 2).mean()).item()

    def loss_fn(ae, flat_acts_train_batch, recons, info):
        train_recons = mse_scale * mse(recons, flat_acts_train_batch)
        train_maxk_recons = auxk_coef * normalized_mse(
            ae.decode_sparse(info["auxk_inds"], info["auxk_vals"]),
            flat_acts_train_batch - recons.detach() + ae.pre_bias.detach(),
        ).nan_to_num(0)
        return train_recons + train_maxk_recons

    def nndx_loss(output, target):  # the program's loss as loss_fn(output, target)
        recons, info = output
        return loss_fn(ae, target, recons, info)

    n_chunks = n_steps * bs // CHUNK
    train_iter = batch_tensors(activation_chunks(source, pixels, n_chunks, gen), bs, drop_last=True)
    first = stats_acts_sample[:bs]
    step_lr = 1e-1 if variant == "lr_too_high" else lr

    opt, mon, losses = training_loop_(ae, train_iter, loss_fn, step_lr, nx, ((first, first), nndx_loss), eps=eps)
    nx.finish(mon, ae, (first, first), nndx_loss, optimizer=opt)

    with torch.no_grad():
        saved = ae.stats_last_nonzero.clone()
        recons, _ = ae(eval_acts)
        ae.stats_last_nonzero.copy_(saved)
        latents_pre_act = F.linear(eval_acts - ae.pre_bias, ae.encoder.weight, ae.latent_bias)
        topk = torch.topk(latents_pre_act, k=k, dim=-1)
        fired = torch.zeros(n_dirs, dtype=torch.bool)
        fired[topk.indices[topk.values > 1e-3]] = True
        fvu = normalized_mse(recons, eval_acts).item()
    return {
        "fvu": fvu,
        "dead_fraction": 1.0 - fired.float().mean().item(),
        "dead_by_window": (ae.stats_last_nonzero > ae.dead_steps_threshold).float().mean().item(),
        "late_train_loss": float(np.mean(losses[-50:])),
    }
