"""Port of BlinkDL's RWKV-LM, RWKV-4 (``RWKV-v4``): a char-level language model of RWKV
time-mixing and channel-mixing blocks, trained by the repository's own loop with Adam and
its token-counted exponential learning-rate decay.

Source: github.com/BlinkDL/RWKV-LM, ``RWKV-v4/train.py``, ``RWKV-v4/src/trainer.py``,
``RWKV-v4/src/model.py`` and ``RWKV-v4/src/utils.py`` (the ``Dataset``) at commit
524481d5099b38d9bc8ef1e89209161b86c8011b (Apache-2.0, Copyright BlinkDL (Bo Peng)); the WKV
recurrence as ``RWKV-v4/cuda/wkv_cuda.cu``'s forward kernel computes it. Written anew from
the facts of those files; no code copied.

Kept: ``GPT``: ``Embedding(vocab, n_embd)``, ``n_layer`` ``Block``s (``ln0`` on the first
block's input, ``x + att(ln1(x))``, ``x + ffn(ln2(x))``), ``ln_out``, ``head =
Linear(n_embd, vocab, bias=False)``, ``RWKV_HEAD_QK_DIM = 0`` (no head-QK), model_type
``'RWKV'``; ``RWKV_TimeMix``: the "fancy" init of ``time_decay`` (``-5 + 8 * (h /
(C-1)) ** (0.7 + 1.3 * ratio_0_to_1)``), ``time_first`` (``log 0.3`` plus the zigzag) and
``time_mix_k/v/r``, ``time_shift = ZeroPad2d((0, 0, 1, -1))``, the k/v/r mixes of ``x`` with
the shifted ``x``, ``key``/``value``/``receptance``/``output`` ``Linear`` without bias,
``sigmoid(r) * WKV(time_decay, time_first, k, v)`` then ``output``; ``RWKV_ChannelMix``:
its ``time_mix_k/r``, ``square(relu(key(xk)))``, ``value``, ``sigmoid(receptance(xr)) *
kv`` with a 4x hidden size; ``RWKV_Init`` (orthogonal init with the gains of the original:
``scale_init = 0`` zero-inits ``key``/``receptance``/``output`` of time-mix and
``value``/``receptance`` of channel-mix, the token embedding at 1e-4, the head at 0.5) since
``LOAD_MODEL`` is False; ``forward(idx, targets)`` computing its own
``F.cross_entropy(x.view(-1, V), targets.view(-1))`` and returning ``L2Wrap.apply(loss,
x)`` (the custom autograd function that adds ``1e-4 / (B*T)`` times the top logit to that
logit's gradient); ``configure_optimizers``: every parameter in one group with
``weight_decay`` 0 and ``torch.optim.Adam(lr=lr_init, betas=(0.9, 0.99), eps=1e-8)`` (the
DeepSpeed-less branch); ``Dataset``: the characters sorted into the vocabulary, each
``__getitem__`` a random spot (``np.random.randint``) giving ``x = dix[:-1]``, ``y =
dix[1:]``, ``len = epoch_length_fixed``; the trainer: ``DataLoader(shuffle=False,
batch_size=batch_size)`` per mini-epoch, ``model.train(True)``, ``loss = model(x, y)``,
``model.zero_grad()``, ``backward``, ``optimizer.step()``, no gradient clipping without
DeepSpeed, then ``self.tokens += (y >= 0).sum()``, ``lr_mult`` linear from ``lr_final /
lr_init`` while ``tokens < warmup_tokens`` (0 here: a fresh model) else
``exp(log(lr_final / lr_init) * progress)`` with ``progress = (tokens - warmup_tokens) /
(final_tokens - warmup_tokens)``, ``final_tokens = n_epoch * len(train_dataset) *
ctx_len``, the lr written into every param group; the running ``avg_loss``; ``batch_size``
12, ``betas`` (0.9, 0.99), ``eps`` 1e-8, ``lr_final`` 1e-5.
Replaced: the CUDA WKV kernel by the same recurrence in plain PyTorch (fp32, the running
``p``, ``q`` and max-exponent ``o`` of the kernel's forward, ``w = -exp(time_decay)``;
autograd differentiates it instead of the kernel's backward); ``RWKV_FLOAT_MODE`` fp32 on
the CPU, LightningLite's ``setup``/``backward`` by the plain calls (one CPU process). The
blocks are plain ``nn.Module``s: RWKV-4 scripts them (``torch.jit.ScriptModule``), and
RWKV-4neo's ``train.py`` turns that off (``RWKV_JIT_ON = 0``) when a tool must hook the
modules (DeepSpeed stage 3), which is the case here: the same computation, not compiled.
The trainer's endless ``for epoch in range(99999999)`` stops after ``n_epoch`` mini-epochs
(where its decay ends and its author stops the run); the preflight's batch is one extra
draw of the ``Dataset`` before training, in both runs.
Shrunk: a 63k-69k-character synthetic text (``bench.programs.data.char_text``, 22
characters; 90% of it trained on) instead of enwik8; ``n_layer`` 2, ``n_embd`` 32,
``ctx_len`` 32 instead of 6, 512, 1024; ``epoch_length_fixed`` 300 samples (25 steps)
instead of ~10,000, ``n_epoch`` 8 instead of 500; ``lr_init`` 2e-2 instead of 8e-4 (the
file's advice lowers the LR as models grow: 8e-4 at L6-D512, 6e-4 at L12-D768; this model
is thousands of times smaller and its exponential decay to ``lr_final`` 1e-5 spans 200
steps: held-out loss 1.41 at 8e-3, 0.91 at 2e-2 on seed 0). No wandb, log file or
checkpoints; ``num_workers`` 0 (one ``np.random`` stream, seeded); the text's last 10% is
held out for the measure.
Measure only (not in the program): on 120 windows of the held-out 10% of the text, the
mean cross entropy over every position (``val_loss``) and at each window's last position
only (``causal_val_loss``: what the model predicts from the past alone, as when it
generates); the last 25 steps' mean train loss; the final LR.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch given as
``((x, y), y)`` with the model's own loss (``lambda loss, _: loss``) and the optimizer;
``nndx.Monitor(model, optimizer)`` around the mini-epochs, each step's loss logged; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from bench.programs import data as text_data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rwkv"
SOURCE = Source("BlinkDL/RWKV-LM", "RWKV-v4/src/model.py", "524481d5099b38d9bc8ef1e89209161b86c8011b",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: L2-D32, ctx 32, 200 steps, synthetic text)"),
        Variant(
            "time_shift_reversed",
            "time_shift = nn.ZeroPad2d((0, 0, -1, 1)) in every block instead of (0, 0, 1, -1): the token shift mixes "
            "each position with the NEXT one, so from the first block on the model reads the character it must predict",
            (C.DATA_LEAKAGE,),
            ("https://github.com/lucidrains/FLASH-pytorch/issues/5",
             "https://github.com/tensorflow/models/issues/10062",
             "https://github.com/anantzoid/Language-Modeling-GatedCNN/issues/2"),
            Measure("causal_val_loss", "held-out cross entropy at each window's last position (no future to read) "
                    "at least 0.5 nat above the healthy run's: 2.41/2.37/2.17 buggy against 0.81/1.05/0.77 healthy "
                    "on seeds 0-2, while its training loss reads 0.07 (healthy 0.86)",
                    lambda healthy, buggy: buggy >= healthy + 0.5),
        ),
        Variant(
            "final_tokens_in_samples",
            "final_tokens = n_epoch * len(train_dataset), the ctx_len factor left out: the decay, counted in tokens, "
            "reaches lr_final (1e-5) after 1/ctx_len of the run and stays there",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/karpathy/minGPT/issues/65",
             "https://github.com/bigscience-workshop/Megatron-DeepSpeed/pull/132"),
            Measure("val_loss", "held-out cross entropy at least 0.3 nat above the healthy run's: 2.52/2.54/2.48 "
                    "buggy (ln 22 = 3.09 at chance) against 0.91/0.92/0.83 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy >= healthy + 0.3),
        ),
    )
}

# train.py, shrunk
n_layer, n_embd, ctx_len = 2, 32, 32
model_type = "RWKV"
batch_size = 12
lr_init, lr_final = 2e-2, 1e-5
n_epoch = 8
epoch_length_fixed = (300 // batch_size) * batch_size
betas, eps = (0.9, 0.99), 1e-8
warmup_tokens = 0  # LOAD_MODEL False
RWKV_HEAD_QK_DIM = 0
N_WORDS, N_HELD_OUT = 6600, 120


# --------------------------------------------------------------------------- src/model.py


class L2Wrap(torch.autograd.Function):
    """Returns the loss unchanged; on the way back adds a small push toward 0 on each
    position's largest logit."""

    @staticmethod
    def forward(ctx, loss, y):
        ctx.save_for_backward(y)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        factor = 1e-4 / (y.shape[0] * y.shape[1])
        maxx, ids = torch.max(y, -1, keepdim=True)
        gy = torch.zeros_like(y)
        gy.scatter_(-1, ids, maxx * factor)
        return grad_output, gy


def wkv(time_decay: torch.Tensor, time_first: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The WKV kernel's forward in plain PyTorch: per channel, a decaying weighted average
    of past values, the current token weighted by exp(u + k); running sums kept divided by
    exp(o) so nothing overflows."""
    w = -torch.exp(time_decay)
    u = time_first
    B, T, C = k.shape
    p = torch.zeros(B, C, dtype=k.dtype)
    q = torch.zeros(B, C, dtype=k.dtype)
    o = torch.full((B, C), -1e38, dtype=k.dtype)
    ys = []
    for t in range(T):
        kt, vt = k[:, t], v[:, t]
        no = torch.maximum(o, u + kt)
        a = torch.exp(o - no)
        b = torch.exp(u + kt - no)
        ys.append((a * p + b * vt) / (a * q + b))
        no = torch.maximum(w + o, kt)
        a = torch.exp(w + o - no)
        b = torch.exp(kt - no)
        p = a * p + b * vt
        q = a * q + b
        o = no
    return torch.stack(ys, dim=1)


def RWKV_Init(model: nn.Module, args: GPTConfig) -> None:
    """The "fancy" init of every Linear and Embedding weight."""
    for m in model.modules():
        if not isinstance(m, (nn.Linear, nn.Embedding)):
            continue
        ww = m.weight
        with torch.no_grad():
            shape = ww.shape
            gain, scale = 1.0, 1.0
            if isinstance(m, nn.Embedding):
                gain = math.sqrt(max(shape[0], shape[1]))
                scale = 1e-4 if (shape[0] == args.vocab_size and shape[1] == args.n_embd) else 0
            if isinstance(m, nn.Linear):
                if shape[0] > shape[1]:
                    gain = math.sqrt(shape[0] / shape[1])
                if shape[0] == args.vocab_size and shape[1] == args.n_embd:  # the head
                    scale = 0.5
            if hasattr(m, "scale_init"):
                scale = m.scale_init
            gain *= scale
            if scale == -999:
                nn.init.eye_(ww)
            elif gain == 0:
                nn.init.zeros_(ww)  # zero init is great for some RWKV matrices
            elif gain > 0:
                nn.init.orthogonal_(ww, gain=gain)
            else:
                nn.init.normal_(ww, mean=0.0, std=-scale)


class RWKV_TimeMix(nn.Module):
    def __init__(self, config: GPTConfig, layer_id: int, shift: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.ctx_len = config.ctx_len
        self.n_embd = config.n_embd
        attn_sz = config.n_embd
        with torch.no_grad():
            ratio_0_to_1 = layer_id / (config.n_layer - 1)
            ratio_1_to_almost0 = 1.0 - (layer_id / config.n_layer)
            decay_speed = torch.ones(attn_sz)
            for h in range(attn_sz):
                decay_speed[h] = -5 + 8 * (h / (attn_sz - 1)) ** (0.7 + 1.3 * ratio_0_to_1)
            self.time_decay = nn.Parameter(decay_speed)
            zigzag = torch.tensor([(i + 1) % 3 - 1 for i in range(attn_sz)]) * 0.5
            self.time_first = nn.Parameter(torch.ones(attn_sz) * math.log(0.3) + zigzag)
            x = torch.ones(1, 1, config.n_embd)
            for i in range(config.n_embd):
                x[0, 0, i] = i / config.n_embd
            self.time_mix_k = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
            self.time_mix_v = nn.Parameter(torch.pow(x, ratio_1_to_almost0) + 0.3 * ratio_0_to_1)
            self.time_mix_r = nn.Parameter(torch.pow(x, 0.5 * ratio_1_to_almost0))
        self.time_shift = nn.ZeroPad2d(shift)
        self.key = nn.Linear(config.n_embd, attn_sz, bias=False)
        self.value = nn.Linear(config.n_embd, attn_sz, bias=False)
        self.receptance = nn.Linear(config.n_embd, attn_sz, bias=False)
        self.output = nn.Linear(attn_sz, config.n_embd, bias=False)
        self.key.scale_init = 0
        self.receptance.scale_init = 0
        self.output.scale_init = 0

    def jit_func(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xx = self.time_shift(x)  # mix x with the previous timestep
        xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
        xv = x * self.time_mix_v + xx * (1 - self.time_mix_v)
        xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
        k = self.key(xk)
        v = self.value(xv)
        r = self.receptance(xr)
        return torch.sigmoid(r), k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sr, k, v = self.jit_func(x)
        rwkv = sr * wkv(self.time_decay, self.time_first, k, v)
        return self.output(rwkv)


class RWKV_ChannelMix(nn.Module):
    def __init__(self, config: GPTConfig, layer_id: int, shift: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.time_shift = nn.ZeroPad2d(shift)
        with torch.no_grad():
            ratio_1_to_almost0 = 1.0 - (layer_id / config.n_layer)
            x = torch.ones(1, 1, config.n_embd)
            for i in range(config.n_embd):
                x[0, 0, i] = i / config.n_embd
            self.time_mix_k = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
            self.time_mix_r = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
        hidden_sz = 4 * config.n_embd
        self.key = nn.Linear(config.n_embd, hidden_sz, bias=False)
        self.receptance = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.value = nn.Linear(hidden_sz, config.n_embd, bias=False)
        self.value.scale_init = 0
        self.receptance.scale_init = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xx = self.time_shift(x)
        xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
        xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
        k = torch.square(torch.relu(self.key(xk)))
        kv = self.value(k)
        return torch.sigmoid(self.receptance(xr)) * kv


class GPTConfig:
    def __init__(self, vocab_size: int, ctx_len: int, **kwargs: object) -> None:
        self.vocab_size = vocab_size
        self.ctx_len = ctx_len
        for k, v in kwargs.items():
            setattr(self, k, v)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_id: int) -> None:
        super().__init__()
        self.config = config
        self.layer_id = layer_id
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        if self.layer_id == 0:
            self.ln0 = nn.LayerNorm(config.n_embd)
        if self.layer_id == 0 and self.config.model_type == "RWKV-ffnPre":
            self.ffnPre = RWKV_ChannelMix(config, 0, config.time_shift)
        else:
            self.att = RWKV_TimeMix(config, layer_id, config.time_shift)
        self.ffn = RWKV_ChannelMix(config, layer_id, config.time_shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_id == 0:
            x = self.ln0(x)
        if self.layer_id == 0 and self.config.model_type == "RWKV-ffnPre":
            x = x + self.ffnPre(self.ln1(x))
        else:
            x = x + self.att(self.ln1(x))
        x = x + self.ffn(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.step = 0
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.Sequential(*[Block(config, i) for i in range(config.n_layer)])
        self.ln_out = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.ctx_len = config.ctx_len
        if not config.LOAD_MODEL:
            RWKV_Init(self, config)

    def configure_optimizers(self, train_config: TrainerConfig) -> torch.optim.Optimizer:
        no_decay = set()
        for mn, m in self.named_modules():  # weight decay disabled for every parameter
            for pn, _p in m.named_parameters():
                no_decay.add(f"{mn}.{pn}" if mn else pn)
        param_dict = dict(self.named_parameters())
        optim_groups = [{"params": [param_dict[pn] for pn in sorted(no_decay)], "weight_decay": 0.0}]
        return torch.optim.Adam(optim_groups, lr=train_config.learning_rate, betas=train_config.betas,
                                eps=train_config.eps)  # fmt: skip

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = self.blocks(x)
        x = self.ln_out(x)
        return self.head(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        self.step += 1
        B, T = idx.size()
        assert T <= self.ctx_len, "Cannot forward, because len(input) > model ctx_len."
        x = self.features(idx)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(x.view(-1, x.size(-1)), targets.view(-1))
        return L2Wrap.apply(loss, x)


# --------------------------------------------------------------------------- src/utils.py


class Dataset(TorchDataset):
    def __init__(self, data: str, ctx_len: int, epoch_length_fixed: int) -> None:
        self.ctx_len = ctx_len
        self.epoch_length_fixed = epoch_length_fixed
        self.data = data
        unique = sorted(set(data))
        self.vocab_size = len(unique)
        self.data_size = len(self.data)
        self.stoi = {ch: i for i, ch in enumerate(unique)}
        self.itos = {i: ch for i, ch in enumerate(unique)}

    def __len__(self) -> int:
        return self.epoch_length_fixed

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = np.random.randint(0, self.data_size - (self.ctx_len + 1))  # a random spot in the data
        dix = [self.stoi[s] for s in self.data[i : i + self.ctx_len + 1]]
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        return x, y


# --------------------------------------------------------------------------- src/trainer.py + train.py


class TrainerConfig:
    batch_size = 64
    learning_rate = 4e-4
    betas = (0.9, 0.99)
    eps = 1e-8
    grad_norm_clip = 1.0
    warmup_tokens = 0
    final_tokens = 0
    num_workers = 0

    def __init__(self, **kwargs: object) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    text = text_data.char_text(N_WORDS, seed=seed)
    cut = int(len(text) * 0.9)  # the last 10% held out for the measure only
    train_dataset = Dataset(text[:cut], ctx_len, epoch_length_fixed)
    shift = (0, 0, -1, 1) if variant == "time_shift_reversed" else (0, 0, 1, -1)
    final_tokens = n_epoch * len(train_dataset) * ctx_len
    if variant == "final_tokens_in_samples":
        final_tokens = n_epoch * len(train_dataset)
    config = TrainerConfig(model_type=model_type, max_epochs=n_epoch, batch_size=batch_size, learning_rate=lr_init,
                           lr_decay=True, lr_final=lr_final, betas=betas, eps=eps, warmup_tokens=warmup_tokens,
                           final_tokens=final_tokens, num_workers=0)  # fmt: skip

    model = GPT(GPTConfig(train_dataset.vocab_size, train_dataset.ctx_len, model_type=model_type, n_layer=n_layer,
                          n_embd=n_embd, LOAD_MODEL=False, time_shift=shift))  # fmt: skip
    optimizer = model.configure_optimizers(config)

    probe_x, probe_y = next(iter(DataLoader(train_dataset, shuffle=False, batch_size=config.batch_size)))
    probe_batch = ((probe_x, probe_y), probe_y)
    nx.preflight(model, probe_batch, lambda loss, _targets: loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    tokens = 0  # counter used for learning rate decay
    lr = config.learning_rate
    step_losses: list[float] = []
    avg_loss = -1.0
    for _epoch in range(config.max_epochs):
        model.train(True)
        loader = DataLoader(train_dataset, shuffle=False, batch_size=config.batch_size, num_workers=0)
        for it, (x, y) in enumerate(loader):
            with torch.set_grad_enabled(True):
                loss = model(x, y)  # forward the model
            model.zero_grad()
            loss.backward()
            optimizer.step()

            tokens += int((y >= 0).sum())  # tokens processed this step (label not -100)
            lr_final_factor = config.lr_final / config.learning_rate
            if tokens < config.warmup_tokens:
                lr_mult = lr_final_factor + (1 - lr_final_factor) * float(tokens) / float(config.warmup_tokens)
            else:
                span = max(1, config.final_tokens - config.warmup_tokens)
                progress = float(tokens - config.warmup_tokens) / float(span)
                lr_mult = lr_final_factor if progress >= 1 else math.exp(math.log(lr_final_factor) * progress)
            lr = config.learning_rate * lr_mult
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr

            now_loss = loss.item()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            step_losses.append(now_loss)
            factor = 1 / (it + 1)
            avg_loss = now_loss if avg_loss < 0 else avg_loss * (1.0 - factor) + now_loss * factor
        if math.isnan(avg_loss):
            break

    nx.finish(mon, model, probe_batch, lambda loss, _targets: loss, optimizer=optimizer)
    return {
        "late_train_loss": float(np.mean(step_losses[-25:])),
        "first_train_loss": float(np.mean(step_losses[:10])),
        "final_lr": lr,
        **measure(model, train_dataset, text[cut:], seed),
    }


# --------------------------------------------------------------------------- measure only


def measure(model: GPT, train_dataset: Dataset, text: str, seed: int) -> dict[str, float]:
    ids = torch.tensor([train_dataset.stoi[c] for c in text if c in train_dataset.stoi], dtype=torch.long)
    rng = np.random.default_rng(seed + 2000)
    starts = rng.integers(0, len(ids) - ctx_len - 1, size=N_HELD_OUT)
    x = torch.stack([ids[s : s + ctx_len] for s in starts])
    y = torch.stack([ids[s + 1 : s + ctx_len + 1] for s in starts])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model.features(x)
        per_position = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        per_position = per_position.view(len(starts), ctx_len)
    model.train(was_training)
    return {
        "val_loss": float(per_position.mean()),
        "causal_val_loss": float(per_position[:, -1].mean()),
    }
