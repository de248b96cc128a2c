"""Port of johnma2006/mamba-minimal (Mamba, the selective state-space language model, in one
file of PyTorch), trained as a small next-token model.

Source: github.com/johnma2006/mamba-minimal, ``model.py`` at commit
03de542a36d873f6e6c4057ad687278cc6ae944d (Apache-2.0, Copyright John Ma). Written anew from
the facts of that file; no code copied. ``einops`` is not installed: its ``rearrange`` and
``einsum`` are written as ``transpose`` and ``torch.einsum``.

Kept: ``ModelArgs`` (``d_inner = expand * d_model``, ``dt_rank = ceil(d_model / 16)`` for
"auto", the vocabulary padded up to a multiple of ``pad_vocab_size_multiple`` 8, ``d_conv``
4, ``conv_bias`` True, ``bias`` False); ``Mamba``: ``embedding``, a ``ModuleList`` of
``ResidualBlock``s, ``norm_f`` (``RMSNorm``), ``lm_head`` without bias whose weight is the
embedding's (tied); ``ResidualBlock``: ``mixer(norm(x)) + x``; ``MambaBlock``: ``in_proj``
to ``2 * d_inner`` split into ``x`` and ``res``, a depthwise ``Conv1d`` (``groups=d_inner``,
``padding=d_conv - 1``) whose output is trimmed to the first ``l`` positions (causal),
SiLU, ``ssm``, ``y * silu(res)``, ``out_proj``; ``ssm``: ``A = -exp(A_log)`` with ``A_log``
initialised to ``log(1..d_state)`` per channel, ``D`` ones, ``x_proj`` to ``dt_rank + 2 *
d_state`` split into ``delta``, ``B``, ``C``, ``delta = softplus(dt_proj(delta))``;
``selective_scan``: ``deltaA = exp(delta * A)``, ``deltaB_u = delta * B * u``, the sequential
scan ``x = deltaA[:, i] * x + deltaB_u[:, i]``, ``y = x @ C[:, i]``, stacked, ``+ u * D``;
``RMSNorm`` (``x * rsqrt(mean(x^2) + eps) * weight``, eps 1e-5).
The repository has no training script (its demo loads pretrained weights); the loop here is
the usual one for such a model, as the brief of this port gives it: next-token
``cross_entropy`` of ``logits[:, :-1]`` against ``tokens[:, 1:]``, ``AdamW`` (lr 3e-3,
betas (0.9, 0.95), weight decay 0.1) with ``CosineAnnealingLR`` over all the steps,
stepped per batch, ``clip_grad_norm_(1.0)``; a held-out loss every 100 steps.
Shrunk: ``d_model`` 32, ``n_layer`` 2, ``d_state`` 8 (instead of 768/24/16 for mamba-130m);
the data a copying task (a start token, 4 random content tokens from 8, a separator, the
same 4 again: 10 tokens), 3,000 train / 300 held-out sequences, batch 32, 400 steps.
Measure only (not in the program): greedy generation on the held-out sequences (the
repository's ``generate``: feed the prefix, append the argmax of the last position,
repeat) of the 4 copied tokens after the separator, the share right (chance 1/8).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``) with the program's loss and the
optimizer; ``nndx.Monitor(model, optimizer)`` around the loop, every step's loss logged
and the held-out loss logged with ``split="val"``; then ``nndx.probe(..., monitor=mon)``
and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mamba_minimal"
SOURCE = Source("johnma2006/mamba-minimal", "model.py", "03de542a36d873f6e6c4057ad687278cc6ae944d", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the model as published, trained on the copying task"),
        Variant(
            "conv_trimmed_at_start",
            "the padded depthwise conv1d's output trimmed to its last l positions (conv1d(x)[:, :, -l:]) instead of "
            "its first l: each position's conv reads the next d_conv - 1 tokens, so the model sees the future",
            (C.DATA_LEAKAGE,),
            ("https://github.com/state-spaces/mamba/issues/437",
             "https://github.com/r9y9/wavenet_vocoder/issues/131",
             "https://github.com/locuslab/TCN/issues/8"),
            Measure("gen_acc", "greedy generation accuracy of the copied half at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "labels_not_shifted",
            "the loss pairs logits[:, :-1] with tokens[:, :-1] (the labels = input_ids of a model that does not "
            "shift them itself): each position is trained to predict the token it is given",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/KempnerInstitute/KempnerForge/issues/154",
             "https://github.com/huggingface/transformers/issues/3711",
             "https://github.com/huggingface/transformers/issues/2033"),
            Measure("gen_acc", "greedy generation accuracy of the copied half at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
    )
}

CONTENT, COPY_LEN, N_TRAIN, N_VAL = 8, 4, 3000, 300
BATCH, STEPS, LR, BETAS, WEIGHT_DECAY, EVAL_EVERY = 32, 400, 3e-3, (0.9, 0.95), 0.1, 100
START, SEP = CONTENT, CONTENT + 1  # token ids after the content tokens


# --------------------------------------------------------------------------- model.py


@dataclass
class ModelArgs:
    d_model: int
    n_layer: int
    vocab_size: int
    d_state: int = 16
    expand: int = 2
    dt_rank: int | str = "auto"
    d_conv: int = 4
    pad_vocab_size_multiple: int = 8
    conv_bias: bool = True
    bias: bool = False

    def __post_init__(self) -> None:
        self.d_inner = int(self.expand * self.d_model)
        if self.dt_rank == "auto":
            self.dt_rank = math.ceil(self.d_model / 16)
        if self.vocab_size % self.pad_vocab_size_multiple != 0:
            self.vocab_size += self.pad_vocab_size_multiple - self.vocab_size % self.pad_vocab_size_multiple


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MambaBlock(nn.Module):
    def __init__(self, args: ModelArgs, trim_start: bool = False) -> None:
        super().__init__()
        self.args = args
        self.trim_start = trim_start  # the bug: keep the last l conv outputs instead of the first l
        self.in_proj = nn.Linear(args.d_model, args.d_inner * 2, bias=args.bias)
        self.conv1d = nn.Conv1d(in_channels=args.d_inner, out_channels=args.d_inner, bias=args.conv_bias,
                                kernel_size=args.d_conv, groups=args.d_inner, padding=args.d_conv - 1)  # fmt: skip
        self.x_proj = nn.Linear(args.d_inner, args.dt_rank + args.d_state * 2, bias=False)
        self.dt_proj = nn.Linear(args.dt_rank, args.d_inner, bias=True)
        A = torch.arange(1, args.d_state + 1).float().repeat(args.d_inner, 1)  # (d_in, n)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(args.d_inner))
        self.out_proj = nn.Linear(args.d_inner, args.d_model, bias=args.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, l, d = x.shape
        x_and_res = self.in_proj(x)
        x, res = x_and_res.split(split_size=[self.args.d_inner, self.args.d_inner], dim=-1)
        x = x.transpose(1, 2)  # b l d_in -> b d_in l
        x = self.conv1d(x)[:, :, -l:] if self.trim_start else self.conv1d(x)[:, :, :l]
        x = x.transpose(1, 2)
        x = F.silu(x)
        y = self.ssm(x)
        y = y * F.silu(res)
        return self.out_proj(y)

    def ssm(self, x: torch.Tensor) -> torch.Tensor:
        d_in, n = self.A_log.shape
        A = -torch.exp(self.A_log.float())
        D = self.D.float()
        x_dbl = self.x_proj(x)
        delta, B, C = x_dbl.split(split_size=[self.args.dt_rank, n, n], dim=-1)
        delta = F.softplus(self.dt_proj(delta))
        return self.selective_scan(x, delta, A, B, C, D)

    def selective_scan(self, u, delta, A, B, C, D) -> torch.Tensor:
        b, l, d_in = u.shape
        deltaA = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
        deltaB_u = torch.einsum("bld,bln,bld->bldn", delta, B, u)
        x = torch.zeros((b, d_in, A.shape[1]), device=deltaA.device)
        ys = []
        for i in range(l):
            x = deltaA[:, i] * x + deltaB_u[:, i]
            ys.append(torch.einsum("bdn,bn->bd", x, C[:, i, :]))
        y = torch.stack(ys, dim=1)
        return y + u * D


class ResidualBlock(nn.Module):
    def __init__(self, args: ModelArgs, trim_start: bool = False) -> None:
        super().__init__()
        self.args = args
        self.mixer = MambaBlock(args, trim_start)
        self.norm = RMSNorm(args.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.norm(x)) + x


class Mamba(nn.Module):
    def __init__(self, args: ModelArgs, trim_start: bool = False) -> None:
        super().__init__()
        self.args = args
        self.embedding = nn.Embedding(args.vocab_size, args.d_model)
        self.layers = nn.ModuleList([ResidualBlock(args, trim_start) for _ in range(args.n_layer)])
        self.norm_f = RMSNorm(args.d_model)
        self.lm_head = nn.Linear(args.d_model, args.vocab_size, bias=False)
        self.lm_head.weight = self.embedding.weight  # tied

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm_f(x))


# --------------------------------------------------------------------------- the data and the loop


def copy_sequences(n: int, generator: torch.Generator) -> torch.Tensor:
    content = torch.randint(0, CONTENT, (n, COPY_LEN), generator=generator)
    start, sep = torch.full((n, 1), START), torch.full((n, 1), SEP)
    return torch.cat([start, content, sep, content], dim=1)  # (n, 2 * COPY_LEN + 2)


@torch.no_grad()
def generate_accuracy(model: Mamba, seqs: torch.Tensor) -> float:
    """Greedy generation of the copied half from the prefix (start, content, separator)."""
    model.eval()
    prefix = COPY_LEN + 2
    tokens = seqs[:, :prefix]
    for _ in range(COPY_LEN):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    model.train()
    return float((tokens[:, prefix:] == seqs[:, prefix:]).float().mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    train_seqs, val_seqs = copy_sequences(N_TRAIN, gen), copy_sequences(N_VAL, gen)
    args = ModelArgs(d_model=32, n_layer=2, vocab_size=CONTENT + 2, d_state=8)
    model = Mamba(args, trim_start=variant == "conv_trimmed_at_start")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)

    def split(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = tokens[:, :-1]
        targets = tokens[:, :-1] if variant == "labels_not_shifted" else tokens[:, 1:]
        return inputs, targets

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    probe_batch = split(train_seqs[:BATCH])
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    val_losses, train_losses = [], []
    for step in range(STEPS):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=gen)
        inputs, targets = split(train_seqs[idx])
        logits = model(inputs)
        loss = loss_fn(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        train_losses.append(loss.item())
        nx.timed(lambda: mon.log(loss))
        if (step + 1) % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                vi, vt = split(val_seqs)
                val_loss = loss_fn(model(vi), vt).item()
            model.train()
            val_losses.append(val_loss)
            nx.timed(lambda: mon.log(val_loss, split="val"))

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    return {"gen_acc": generate_accuracy(model, val_seqs), "val_loss": val_losses[-1],
            "train_loss": sum(train_losses[-50:]) / 50}  # fmt: skip
