"""Port of "LLMs from scratch", chapter 5: pretraining the chapter-4 GPT on a short text.

Source: github.com/rasbt/LLMs-from-scratch, ``ch05/01_main-chapter-code/gpt_train.py`` at
commit f0e4c99bc376e55cbdde5b02713340a70d84ff17 and ``previous_chapters.py`` (GPTModel,
the dataloader) at commit 7ca7c47e4aa477ff7dbcdccfe6693610a94a8541 (Apache-2.0,
Copyright (c) Sebastian Raschka). Written anew from the facts of those files; no code copied.

Kept: ``GPTDatasetV1``'s sliding windows (input ``ids[i:i+max_length]``, target shifted by
one, stride = context length), a shuffled train loader with ``drop_last`` and an
unshuffled val loader, a 90/10 split of the text; ``MultiHeadAttention`` with separate
bias-free query/key/value ``Linear`` layers, a registered upper-triangular ``mask``
buffer filled with -inf in place, softmax over scores / sqrt(head_dim), dropout on the
weights, an ``out_proj``; the hand-written ``LayerNorm`` (scale/shift, biased variance)
and tanh ``GELU``; pre-norm blocks with ``drop_shortcut`` on both residual branches;
token + position embeddings, ``drop_emb``, a final norm and a bias-free ``out_head``
(no weight tying); ``calc_loss_batch`` = ``cross_entropy(logits.flatten(0, 1),
target.flatten())``; ``train_model_simple``: ``optimizer.zero_grad()`` /
``backward`` / ``step`` per batch, ``evaluate_model`` every ``eval_freq`` steps on
``eval_iter`` batches under ``model.eval()`` + ``torch.no_grad()`` then ``model.train()``,
``generate_and_print_sample`` (greedy ``generate_text_simple``) after each epoch;
AdamW(lr 4e-4, weight_decay 0.1) as in the chapter's notebook; ``torch.manual_seed(123)``.
Shrunk: a ~10 KB generated text (``data.char_text``, 1,000 words) tokenised by characters
instead of "The Verdict" through tiktoken's GPT-2 BPE (no download); 2 layers, 2 heads,
emb_dim 64, context 32 instead of 12/12/768/256; batch 4 instead of 2 (the windows are
8x shorter); 8 epochs instead of 10; ``eval_iter`` 2; lr 2e-3 (the 124M model's 4e-4
barely moves a 64-dim model in 8 epochs of a 10 KB text).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first train batch
with ``calc_loss_batch``'s loss as ``loss_fn(logits, targets)``, ``nndx.Monitor`` around
``train_model_simple``, each batch's loss logged, ``evaluate_model``'s val loss logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "llm_from_scratch_gpt"
SOURCE = Source("rasbt/LLMs-from-scratch", "ch05/01_main-chapter-code/gpt_train.py",
                "f0e4c99bc376e55cbdde5b02713340a70d84ff17", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "causal_mask_discarded",
            "attn_scores.masked_fill(mask_bool, -inf) (out of place, result dropped) instead of masked_fill_: "
            "no causal mask, every position attends to the token it must predict",
            (C.DATA_LEAKAGE,),
            ("https://github.com/keras-team/keras/issues/23038",
             "https://github.com/facebookresearch/xformers/issues/103",
             "https://github.com/huggingface/transformers/issues/22001"),
            Measure("generation_loss", "loss of each val token predicted from its prefix alone (as "
                    "generate_text_simple predicts), 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() left out of train_model_simple: each step's gradient is the sum of every "
            "batch's gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/affaan-m/ECC/pull/3122", "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/tenstorrent/tt-blacksmith/pull/711"),
            Measure("val_loss", "val loss at the end, 1.2x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

GPT_CONFIG = {"vocab_size": 0, "context_length": 32, "emb_dim": 64, "n_heads": 2, "n_layers": 2, "drop_rate": 0.1,
              "qkv_bias": False}  # fmt: skip
SETTINGS = {"learning_rate": 2e-3, "num_epochs": 8, "batch_size": 4, "weight_decay": 0.1}


def windows(ids: list[int], max_length: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTDatasetV1: overlapping (here: adjacent, stride = max_length) chunks, targets shifted by one."""
    inputs, targets = [], []
    for i in range(0, len(ids) - max_length, stride):
        inputs.append(torch.tensor(ids[i : i + max_length]))
        targets.append(torch.tensor(ids[i + 1 : i + max_length + 1]))
    return torch.stack(inputs), torch.stack(targets)


def loader(x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool, drop_last: bool, generator=None):
    """A DataLoader over the windows, as a re-iterable of (input_batch, target_batch)."""

    class Loader:
        def __len__(self) -> int:
            return len(x) // batch_size if drop_last else -(-len(x) // batch_size)

        def __iter__(self):
            order = torch.randperm(len(x), generator=generator) if shuffle else torch.arange(len(x))
            for b in range(len(self)):
                idx = order[b * batch_size : (b + 1) * batch_size]
                yield x[idx], y[idx]

    return Loader()


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, mask_in_place=True):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.mask_in_place = mask_in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = x.shape
        split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        if self.mask_in_place:
            attn_scores.masked_fill_(mask_bool, -torch.inf)
        else:
            attn_scores.masked_fill(mask_bool, -torch.inf)  # the bug: a new tensor, thrown away
        attn_weights = self.dropout(torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1))
        context_vec = (attn_weights @ values).transpose(1, 2).reshape(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class LayerNorm(nn.Module):
    def __init__(self, emb_dim: int) -> None:
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class GELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]), GELU(),
                                    nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: dict, mask_in_place: bool = True) -> None:
        super().__init__()
        self.att = MultiHeadAttention(cfg["emb_dim"], cfg["emb_dim"], cfg["context_length"], cfg["drop_rate"],
                                      cfg["n_heads"], cfg["qkv_bias"], mask_in_place)  # fmt: skip
        self.ff = FeedForward(cfg)
        self.norm1, self.norm2 = LayerNorm(cfg["emb_dim"]), LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))


class GPTModel(nn.Module):
    def __init__(self, cfg: dict, mask_in_place: bool = True) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg, mask_in_place) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx: torch.Tensor) -> torch.Tensor:
        _, seq_len = in_idx.shape
        x = self.tok_emb(in_idx) + self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = self.trf_blocks(self.drop_emb(x))
        return self.out_head(self.final_norm(x))


def calc_loss_batch(input_batch: torch.Tensor, target_batch: torch.Tensor, model: nn.Module) -> torch.Tensor:
    logits = model(input_batch)
    return F.cross_entropy(logits.flatten(0, 1), target_batch.flatten())


def calc_loss_loader(data_loader, model: nn.Module, num_batches: int | None = None) -> float:
    if len(data_loader) == 0:
        return float("nan")
    num_batches = len(data_loader) if num_batches is None else min(num_batches, len(data_loader))
    total = 0.0
    for i, (input_batch, target_batch) in enumerate(data_loader):
        if i >= num_batches:
            break
        total += calc_loss_batch(input_batch, target_batch, model).item()
    return total / num_batches


def generate_text_simple(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, context_size: int) -> torch.Tensor:
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(idx[:, -context_size:])
        idx = torch.cat((idx, logits[:, -1, :].argmax(dim=-1, keepdim=True)), dim=1)
    return idx


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(123 + seed)
    text = data.char_text(1000, seed=seed)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    cfg = dict(GPT_CONFIG, vocab_size=len(chars))
    split_idx = int(0.90 * len(text))
    ids_train, ids_val = [stoi[c] for c in text[:split_idx]], [stoi[c] for c in text[split_idx:]]
    ctx = cfg["context_length"]
    train_x, train_y = windows(ids_train, ctx, ctx)
    val_x, val_y = windows(ids_val, ctx, ctx)
    generator = torch.Generator().manual_seed(seed)
    train_loader = loader(train_x, train_y, SETTINGS["batch_size"], shuffle=True, drop_last=True, generator=generator)
    val_loader = loader(val_x, val_y, SETTINGS["batch_size"], shuffle=False, drop_last=False)

    model = GPTModel(cfg, mask_in_place=variant != "causal_mask_discarded")
    optimizer = torch.optim.AdamW(model.parameters(), lr=SETTINGS["learning_rate"], weight_decay=SETTINGS["weight_decay"])

    def evaluate_model(eval_iter: int) -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            train_loss = calc_loss_loader(train_loader, model, num_batches=eval_iter)
            val_loss = calc_loss_loader(val_loader, model, num_batches=eval_iter)
        model.train()
        return train_loss, val_loss

    def generate_and_print_sample(start_context: str = "ba") -> str:
        model.eval()
        encoded = torch.tensor([[stoi[c] for c in start_context if c in stoi]])
        out = generate_text_simple(model, encoded, max_new_tokens=20, context_size=model.pos_emb.weight.shape[0])
        model.train()
        return "".join(chars[i] for i in out[0].tolist())

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    first_batch = next(iter(loader(train_x, train_y, SETTINGS["batch_size"], shuffle=False, drop_last=True)))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    eval_freq, eval_iter = 5, 2
    global_step = -1
    val_losses: list[float] = []
    for _epoch in range(SETTINGS["num_epochs"]):
        model.train()
        for input_batch, target_batch in train_loader:
            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            loss = calc_loss_batch(input_batch, target_batch, model)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            global_step += 1
            if global_step % eval_freq == 0:
                _train_loss, val_loss = evaluate_model(eval_iter)
                val_losses.append(val_loss)
                mon.log(val_loss, split="val")
        generate_and_print_sample()

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)
    model.eval()
    full_val = calc_loss_loader(val_loader, model)
    return {
        "val_loss": full_val,
        "generation_loss": generation_loss(model, val_x[:8], val_y[:8]),
        "last_logged_val_loss": val_losses[-1],
    }


@torch.no_grad()
def generation_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Cross-entropy of each val token predicted from its prefix alone, at the last position
    (what generate_text_simple does): equal to the val loss for a causal model."""
    model.eval()
    losses = [F.cross_entropy(model(x[:, : t + 1])[:, -1, :], y[:, t]).item() for t in range(x.shape[1])]
    return sum(losses) / len(losses)
