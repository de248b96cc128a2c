"""Port of karpathy's llama2.c training script and model (a Llama-2 transformer trained from
scratch on pretokenized TinyStories, the loss read from ``model.last_loss``).

Source: github.com/karpathy/llama2.c, ``train.py``, ``model.py`` and ``tinystories.py`` at
commit 350e04fe35433e6d2941dce5a1f53308f87058eb (MIT, Copyright (c) 2023 Andrej).
Written anew from the facts of those files; no code copied.

Kept: ``ModelArgs``; ``RMSNorm`` (``x * rsqrt(mean(x^2) + eps)`` in float32, times a weight
of ones); rotary embeddings precomputed as ``freqs_cos`` / ``freqs_sin`` buffers
(``theta=10000``) and applied to q and k as real/imaginary pairs
(``reshape(..., -1, 2).unbind(-1)``, ``reshape_for_broadcast``, stacked and flattened
back); ``Attention`` with bias-free ``wq``/``wk``/``wv``/``wo``, ``repeat_kv`` for grouped
query heads, ``F.scaled_dot_product_attention(is_causal=True)`` (the "flash" path torch 2
takes) and dropout; the SwiGLU ``FeedForward`` ``w2(silu(w1(x)) * w3(x))`` with the hidden
size ``multiple_of``-rounded ``2/3 * 4 * dim``; pre-norm ``TransformerBlock``s; token
embedding tied to the output ``Linear`` (``tok_embeddings.weight = output.weight``);
N(0, 0.02) init with ``w3`` and ``wo`` at ``0.02 / sqrt(2 * n_layers)``; ``forward(tokens,
targets)`` returning the logits and storing the cross-entropy (``ignore_index=-1``) in
``self.last_loss``, or only the last position's logits when no targets are given (the
inference path); ``configure_optimizers``: AdamW over a decay group (every parameter of
two or more dimensions) and a no-decay group, betas (0.9, 0.95), weight decay 0.1.
``train.py``: the batches of ``PretokDataset`` / ``Task.iter_batches`` (stories tokenized
with a BOS in front and concatenated; chunks of ``max_seq_len + 1`` tokens at shuffled
offsets, ``x = chunk[:-1]``, ``y = chunk[1:]``; train and val splits from separate shards,
here two generated streams; a fresh iterator, seeded 42, at every call); ``get_lr`` (linear
warmup from 0 over ``warmup_iters``, cosine decay to ``min_lr = 0`` at ``lr_decay_iters =
max_iters``) written into every param group each iteration; ``estimate_loss`` under
``model.eval()`` / ``torch.no_grad()`` every ``eval_interval`` iterations; gradient
accumulation with ``loss / gradient_accumulation_steps``, the next batch fetched right
after the forward; a ``GradScaler`` (disabled: float32, as on a CPU) with ``unscale_`` +
``clip_grad_norm_(1.0)``; ``optimizer.zero_grad(set_to_none=True)`` after the step;
``lossf = loss.item() * gradient_accumulation_steps`` logged every iteration; stop after
``max_iters``.
Shrunk: a custom 64-token vocabulary (``vocab_source="custom"``) and synthetic "tiny
stories" from a fixed grammar (a character with a name, a gender the pronouns follow, a
place and things that come back later in the story: 1,200 train stories, 150 val) instead
of TinyStories with the 32k Llama-2 tokenizer; ``dim`` 64, ``n_layers`` 2, ``n_heads`` =
``n_kv_heads`` 4, ``multiple_of`` 32 (hidden 192), ``max_seq_len`` 64 instead of 288 / 6 / 6
/ 6 / 32 / 256; ``batch_size`` 8, ``gradient_accumulation_steps`` 2, ``max_iters`` 400,
``warmup_iters`` 20, ``eval_interval`` 100, ``eval_iters`` 5 instead of 128 / 4 / 100,000 /
1,000 / 2,000 / 100; ``learning_rate`` 1e-3 instead of 5e-4 (the README: "Very small
networks can get away with a large LR (e.g. 1e-3 or even higher)"); CPU, float32, no
``torch.compile``, no DDP, checkpoints, wandb or model export.
Measure only (not in the program): the val loss of the last ``estimate_loss``, and the
next-token loss of the inference path (``model(tokens)`` without targets: the last
position's logits, what ``generate`` and ``sample.py`` use) on 400 prefixes of val chunks
cut at random lengths (a model that trained on a leak cannot use it there), and the gap
between the two.

nndx, as the author would add it: the model returns logits and keeps its loss on
``raw_model.last_loss``, which nndx's probes (run on copies) never set on the original, so
the author hands nndx the same cross-entropy written on the logits, ``loss_fn(logits, y)``,
and the batch as ``((X, Y), Y)`` (``model(X, Y)``: the training path, full logits); a
preflight ``nndx.probe`` with the optimizer on the very first batch, ``nndx.Monitor``
around the loop, ``lossf`` logged each iteration and ``estimate_loss``'s val loss as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "llama2c"
SOURCE = Source("karpathy/llama2.c", "train.py", "350e04fe35433e6d2941dce5a1f53308f87058eb", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: synthetic stories, dim 64, 2 layers, 400 iterations)"),
        Variant(
            "attention_not_causal",
            "F.scaled_dot_product_attention(xq, xk, xv, attn_mask=None, dropout_p=...) with is_causal=True left "
            "out (its default is False): every position attends to the tokens after it, its own target among them; "
            "train and val loss fall far below the healthy run's while the inference path (last position only) does worse",
            (C.DATA_LEAKAGE,),
            ("https://github.com/karpathy/llama2.c/issues/427",
             "https://github.com/karpathy/minGPT/issues/75",
             "https://github.com/huggingface/transformers/issues/48745"),
            Measure("inference_gap", "the inference path's next-token loss (last position, no future to read) "
                    "minus the val loss the program prints, at least 0.2 nats above the healthy run's gap: 0.57 "
                    "against 0.01 on seed 0 (val 0.33 against 0.61 healthy, inference 0.90 against 0.62)",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
        Variant(
            "warmup_longer_than_run",
            "a short run launched with --max_iters=400 while warmup_iters keeps train.py's default 1000: get_lr "
            "never leaves its linear warmup, the learning rate climbs only to 2/5 of learning_rate by the end "
            "(lr_decay_iters = max_iters is never reached from the warmup branch)",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/facebookresearch/d2go/issues/19",
             "https://github.com/open-mmlab/mmdetection/issues/7789",
             "https://github.com/PaddlePaddle/PaddleSeg/pull/2268"),
            Measure("val_loss", "val loss of the last estimate_loss at least 0.15 nats above the healthy run's: "
                    "0.97 against 0.61 on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
    )
}

# --------------------------------------------------------------------------- the configuration (shrunk)

batch_size = 8
max_seq_len = 64
vocab_size = 64  # vocab_source = "custom"
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 4
multiple_of = 32
dropout = 0.0
gradient_accumulation_steps = 2
learning_rate = 1e-3
max_iters = 400
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 20
eval_interval = 100
eval_iters = 5
N_TRAIN_STORIES, N_VAL_STORIES = 1200, 150

# --------------------------------------------------------------------------- synthetic tiny stories (tokenized)

SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = (
    "once upon a time there was named . ! the to in with his her he she liked play went saw found gave "
    "one day very happy said hello big small red blue green little"
).split()
NAMES_M, NAMES_F = ["tom", "ben", "sam", "leo"], ["lily", "mia", "amy", "zoe"]
ANIMALS = ["dog", "cat", "bird", "frog", "fish", "bunny"]
PLACES = ["park", "garden", "house", "forest", "beach"]
THINGS = ["ball", "kite", "toy", "apple", "book", "hat"]
VOCAB = SPECIAL + WORDS + NAMES_M + NAMES_F + ANIMALS + PLACES + THINGS
assert len(VOCAB) <= vocab_size and len(set(VOCAB)) == len(VOCAB)
STOI = {w: i for i, w in enumerate(VOCAB)}
BOS = STOI["<s>"]


def story(rng: random.Random) -> list[str]:
    """One story: its character, pronouns and things recur, so the context predicts them."""
    male = rng.random() < 0.5
    name = rng.choice(NAMES_M if male else NAMES_F)
    he, his = ("he", "his") if male else ("she", "her")
    animal, friend = rng.sample(ANIMALS, 2)
    place = rng.choice(PLACES)
    thing, found = rng.sample(THINGS, 2)
    adj = rng.choice(["big", "small", "red", "blue", "green", "little"])
    words = f"once upon a time there was a {adj} {animal} named {name} .".split()
    middle = [
        f"{name} liked to play with {his} {thing} .",
        f"one day {he} went to the {place} .",
        f"in the {place} {name} saw a {friend} .",
        f"{he} found a {found} in the {place} .",
        f"the {friend} said hello to {name} .",
        f"{name} gave the {found} to the {friend} .",
    ]
    keep = sorted(rng.sample(range(len(middle)), rng.randint(3, 6)))
    for k in keep:
        words += middle[k].split()
    words += f"{name} was very happy !".split()
    return words


def pretokenized(n_stories: int, seed: int) -> np.ndarray:
    """``process_shard``: each story encoded with a BOS in front (no EOS), all concatenated."""
    rng = random.Random(seed)
    tokens: list[int] = []
    for _ in range(n_stories):
        tokens.append(BOS)
        tokens.extend(STOI[w] for w in story(rng))
    return np.array(tokens, dtype=np.uint16)


def iter_batches(shard: np.ndarray, batch_size: int, max_seq_len: int):
    """``Task.iter_batches`` over ``PretokDataset``: a fresh rng seeded 42, chunk offsets shuffled
    each pass, ``max_seq_len + 1`` tokens per chunk, x / y shifted by one, batched as a
    DataLoader would, forever."""
    rng = random.Random(42)
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    while True:
        num_batches = len(shard) // max_seq_len
        num_batches -= 1  # drop the last partial batch
        ixs = list(range(num_batches))
        rng.shuffle(ixs)
        for ix in ixs:
            start = ix * max_seq_len
            end = start + max_seq_len + 1
            chunk = torch.from_numpy(shard[start:end].astype(np.int64))
            xs.append(chunk[:-1])
            ys.append(chunk[1:])
            if len(xs) == batch_size:
                yield torch.stack(xs), torch.stack(ys)
                xs, ys = [], []


# --------------------------------------------------------------------------- model.py


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = 32000
    hidden_dim: int | None = None
    multiple_of: int = 256
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    dropout: float = 0.0
    causal: bool = True  # the port's switch for the planted bug


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.cos(freqs), torch.sin(freqs)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ndim = x.ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(shape)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
                     freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)
    freqs_cos = reshape_for_broadcast(freqs_cos, xq_r)
    freqs_sin = reshape_for_broadcast(freqs_sin, xq_r)
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, head_dim).reshape(bs, slen, n_kv * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        assert args.n_heads % self.n_kv_heads == 0
        self.n_local_heads = args.n_heads
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.attn_dropout = nn.Dropout(args.dropout)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout
        self.causal = args.causal

    def forward(self, x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)
        xk = repeat_kv(xk, self.n_rep)
        xv = repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if self.causal:
            output = F.scaled_dot_product_attention(xq, xk, xv, attn_mask=None,
                                                    dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        else:  # the bug: is_causal left at its default
            output = F.scaled_dot_product_attention(xq, xk, xv, attn_mask=None,
                                                    dropout_p=self.dropout if self.training else 0.0)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(self.wo(output))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int | None, multiple_of: int, dropout: float) -> None:
        super().__init__()
        if hidden_dim is None:
            hidden_dim = 4 * dim
            hidden_dim = int(2 * hidden_dim / 3)
            hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, args.multiple_of, args.dropout)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention.forward(self.attention_norm(x), freqs_cos, freqs_sin)
        return h + self.feed_forward.forward(self.ffn_norm(h))


class Transformer(nn.Module):
    last_loss: torch.Tensor | None

    def __init__(self, params: ModelArgs) -> None:
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.dropout = nn.Dropout(params.dropout)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        self.tok_embeddings.weight = self.output.weight  # weight tying
        freqs_cos, freqs_sin = precompute_freqs_cis(params.dim // params.n_heads, params.max_seq_len)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("w3.weight") or pn.endswith("wo.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * params.n_layers))
        self.last_loss = None

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        _bsz, seqlen = tokens.shape
        h = self.dropout(self.tok_embeddings(tokens))
        freqs_cos = self.freqs_cos[:seqlen]
        freqs_sin = self.freqs_sin[:seqlen]
        for layer in self.layers:
            h = layer(h, freqs_cos, freqs_sin)
        h = self.norm(h)
        if targets is not None:
            logits = self.output(h)
            self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.output(h[:, [-1], :])  # inference: the last position only
            self.last_loss = None
        return logits

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             device_type: str) -> torch.optim.Optimizer:  # fmt: skip
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for _, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for _, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)  # fused only on cuda


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    warmup = 1000 if variant == "warmup_longer_than_run" else warmup_iters  # train.py's default, not overridden
    lr_decay_iters = max_iters
    min_lr = 0.0

    torch.manual_seed(1337 + seed)
    shards = {"train": pretokenized(N_TRAIN_STORIES, seed=seed), "val": pretokenized(N_VAL_STORIES, seed=seed + 10_000)}

    def batches(split: str):
        return iter_batches(shards[split], batch_size, max_seq_len)

    model_args = dict(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=vocab_size,
                      multiple_of=multiple_of, max_seq_len=max_seq_len, dropout=dropout,
                      causal=variant != "attention_not_causal")  # fmt: skip
    model = Transformer(ModelArgs(**model_args))
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # dtype float32: a no-op
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), "cpu")
    raw_model = model

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            batch_iter = batches(split)
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = next(batch_iter)
                model(X, Y)
                losses[k] = raw_model.last_loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it: int) -> float:
        if it < warmup:
            return learning_rate * it / warmup
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup) / (lr_decay_iters - warmup)
        assert 0 <= decay_ratio <= 1
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    train_batch_iter = batches("train")
    X, Y = next(train_batch_iter)  # fetch the very first batch
    probe_batch = ((X, Y), Y)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    iter_num = 0
    losses: dict[str, float] = {}
    train_losses: list[float] = []
    while True:
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
            mon.log(losses["val"], split="val")
        for _micro_step in range(gradient_accumulation_steps):
            model(X, Y)
            loss = raw_model.last_loss
            loss = loss / gradient_accumulation_steps
            X, Y = next(train_batch_iter)
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item() * gradient_accumulation_steps
        mon.log(lossf)
        train_losses.append(lossf)
        iter_num += 1
        if iter_num > max_iters:
            break

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    inference = inference_loss(model, shards["val"], seed)
    return {"val_loss": losses["val"], "train_loss": losses["train"], "inference_loss": inference,
            "inference_gap": inference - losses["val"], "final_train_loss": sum(train_losses[-20:]) / 20}  # fmt: skip


@torch.no_grad()
def inference_loss(model: Transformer, shard: np.ndarray, seed: int, n: int = 400) -> float:
    """Measure only: the next-token loss of ``model(tokens)`` (last position's logits) on val
    prefixes of 8 to ``max_seq_len`` tokens."""
    model.eval()
    rng = np.random.default_rng(seed + 99)
    total = 0.0
    for _ in range(n):
        length = int(rng.integers(8, max_seq_len + 1))
        start = int(rng.integers(0, len(shard) - length - 1))
        tokens = torch.from_numpy(shard[start : start + length + 1].astype(np.int64))
        logits = model(tokens[None, :-1])
        total += float(F.cross_entropy(logits[:, -1, :], tokens[-1:]))
    return total / n
