"""Port of nanoGPT's training script and model (a character-level GPT, the
``train_shakespeare_char`` configuration).

Source: github.com/karpathy/nanoGPT, ``train.py`` and ``model.py`` at commit
3adf61e154c3fe3fca428ad6bc3818b27a3b8291 (MIT, Copyright (c) 2022 Andrej Karpathy).
Written anew from the facts of those files; no code copied.

Kept: ``LayerNorm`` with optional bias (``F.layer_norm``); ``CausalSelfAttention`` with
one fused qkv ``Linear`` and ``F.scaled_dot_product_attention(is_causal=True)``; an MLP
of ``Linear`` -> ``nn.GELU`` -> ``Linear`` -> ``Dropout``; pre-norm residual blocks;
token + position embeddings, weight tying of ``wte`` and ``lm_head``; N(0, 0.02) init
with the residual projections scaled by 1/sqrt(2 * n_layer); ``forward(idx, targets)``
returning ``(logits, loss)`` with the cross-entropy computed inside; ``configure_optimizers``
(AdamW, weight decay on 2-D parameters only, betas (0.9, 0.99)); ``get_lr`` (linear
warmup, cosine decay to ``min_lr``) written into every param group each iteration;
gradient accumulation with ``loss / gradient_accumulation_steps``; a ``GradScaler``
(disabled for float32, as on a CPU) with ``unscale_`` + ``clip_grad_norm_(1.0)``;
``optimizer.zero_grad(set_to_none=True)`` after the step; random ``block_size`` windows
as batches, targets shifted by one; ``estimate_loss`` under ``model.eval()`` every
``eval_interval`` iterations.
Shrunk: a 24k-character synthetic text instead of Shakespeare, 2 layers, 2 heads,
n_embd 32, block 32, micro-batch 12 with 4 accumulation steps (the char config uses 1;
the GPT-2 config 40), 100 iterations, warmup 10, 5 batches per ``estimate_loss``.

nndx, as the author would add it: a preflight ``nndx.probe`` with the batch given as
``((X, Y), Y)`` and the model's own loss (``lambda out, y: out[1]``), ``nndx.Monitor``
around the loop, the iteration's loss logged, ``estimate_loss``'s val loss logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nanogpt"
SOURCE = Source("karpathy/nanoGPT", "train.py", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "grad_accum_unscaled",
            "loss not divided by gradient_accumulation_steps before backward "
            "(clip_grad_norm_ then sees k-times larger gradients)",
            (C.GRAD_ACCUM_SCALING,),
            ("https://github.com/karpathy/nanoGPT/issues/168", "https://github.com/karpathy/nanoGPT/issues/206"),
            Measure("mean_grad_norm", "gradient norm before clipping, 2x the healthy run's or more (k = 4)",
                    lambda healthy, buggy: buggy >= 2 * healthy),
        ),
        Variant(
            "targets_not_shifted",
            "get_batch builds y from data[i:i+block_size] instead of data[i+1:i+1+block_size]: "
            "each target is its own input token",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/KempnerInstitute/KempnerForge/issues/154",
             "https://github.com/macrocosm-os/pretraining/pull/64",
             "https://github.com/huggingface/transformers/issues/3711"),
            Measure("val_loss", "val loss at the end, under half the healthy run's",
                    lambda healthy, buggy: buggy < 0.5 * healthy),
        ),
    )
}


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.2
    bias: bool = False


class LayerNorm(nn.Module):
    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)  # fmt: skip
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))  # fmt: skip
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float]):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        groups = [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    # the configuration (train_shakespeare_char, shrunk)
    gradient_accumulation_steps, batch_size, block_size = 4, 12, 32
    learning_rate, max_iters, warmup_iters, lr_decay_iters, min_lr = 1e-3, 100, 10, 100, 1e-4
    weight_decay, beta1, beta2, grad_clip = 1e-1, 0.9, 0.99, 1.0
    eval_interval, eval_iters = 25, 5

    torch.manual_seed(1337 + seed)
    text = data.char_text(4000, seed=seed)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    encoded = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(encoded))
    train_data, val_data = encoded[:split], encoded[split:]

    def get_batch(which: str) -> tuple[torch.Tensor, torch.Tensor]:
        source = train_data if which == "train" else val_data
        ix = torch.randint(len(source) - block_size, (batch_size,))
        x = torch.stack([source[i : i + block_size] for i in ix])
        shift = 0 if variant == "targets_not_shifted" else 1
        y = torch.stack([source[i + shift : i + shift + block_size] for i in ix])
        return x, y

    config = GPTConfig(block_size=block_size, vocab_size=len(chars))
    model = GPT(config)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # dtype float32: a no-op, as on a CPU
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for which in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(which)
                _, loss = model(X, Y)
                losses[k] = loss.item()
            out[which] = losses.mean().item()
        model.train()
        return out

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    X, Y = get_batch("train")  # fetch the very first batch
    probe_batch = ((X, Y), Y)
    nx.preflight(model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    grad_norms: list[float] = []
    losses: dict[str, float] = {}
    for iter_num in range(max_iters + 1):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
            mon.log(losses["val"], split="val")
        if iter_num == max_iters:
            break
        for _micro_step in range(gradient_accumulation_steps):
            _, loss = model(X, Y)
            if variant != "grad_accum_unscaled":
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item() * (gradient_accumulation_steps if variant != "grad_accum_unscaled" else 1)
        mon.log(lossf)

    nx.finish(mon, model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)
    return {"val_loss": losses["val"], "train_loss": losses["train"], "mean_grad_norm": sum(grad_norms) / len(grad_norms)}
