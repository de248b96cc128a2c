"""Port of karpathy/ng-video-lecture ``gpt.py``: the character-level GPT of the "Let's build GPT"
lecture (token + position embeddings, pre-LayerNorm blocks of causal multi-head self-attention
and a ReLU MLP, a final LayerNorm and a linear head), trained with AdamW on random blocks of
the text, the train/val loss estimated every ``eval_interval`` steps with the model in eval mode.

Source: github.com/karpathy/ng-video-lecture, ``gpt.py`` at commit
52201428ed7b46804849dea0b3ccf0de9df1a5c3 (MIT, as the repository's README states; no LICENSE
file). Written anew from the facts of that file; no code copied.

Kept: the model classes ``Head`` (key/query/value ``Linear(n_embd, head_size, bias=False)``, a
``tril`` buffer, scores ``q @ k^T * head_size**-0.5``, ``masked_fill(tril == 0, -inf)``,
softmax, dropout on the weights, ``wei @ v``), ``MultiHeadAttention`` (heads concatenated,
``proj`` + dropout), ``FeedFoward`` (``Linear(n_embd, 4 n_embd)``, ReLU, ``Linear(4 n_embd,
n_embd)``, dropout), ``Block`` (``x + sa(ln1(x))``, ``x + ffwd(ln2(x))``) and the language model
(called ``GPTLanguageModel`` at this commit, ``BigramLanguageModel`` before ``d5ae96f``):
embeddings, blocks, ``ln_f``, ``lm_head``, the ``_init_weights`` (normal(0, 0.02) for Linear and
Embedding weights, zero biases), ``forward(idx, targets=None)`` returning ``(logits, loss)``
with ``F.cross_entropy`` on ``view(B*T, C)``, and ``generate`` (crop to ``block_size``, softmax
of the last step, ``torch.multinomial``); the character vocabulary (``sorted(set(text))``,
``stoi``/``itos``), the 90/10 split, ``get_batch`` (``torch.randint`` offsets, ``y`` the block
shifted by one), ``estimate_loss`` (``@torch.no_grad``, ``model.eval()``, mean of ``eval_iters``
batch losses per split, ``model.train()``), ``torch.manual_seed(1337)``,
``torch.optim.AdamW(lr=3e-4)``, the loop (estimate every ``eval_interval`` steps and at the last
step, ``get_batch``, forward, ``zero_grad(set_to_none=True)``, ``backward``, ``step``) and the
500-character sample from a zero context at the end.
Shrunk: ``batch_size`` 16 (64), ``block_size`` 32 (256), ``max_iters`` 800 (5000),
``eval_interval`` 200 (500), ``eval_iters`` 20 (200), ``n_embd`` 48 (384), ``n_head`` 4 (6),
``n_layer`` 2 (6), dropout 0.2 and lr 3e-4 as published; the text is a generated corpus of
made-up words strung by a small word grammar into lines (``bench.programs.data.char_text``,
about 48,000 characters) instead of tiny Shakespeare; CPU.
Measure only (not in the program): besides ``estimate_loss``'s numbers, the val loss of the
*last* position of each block (its target lies outside the block, so no future token can give
it away) and the share of the generated sample's words that are words of the corpus.

nndx, as the author would add it after reading nndx's README: the model returns ``(logits,
loss)``, so nndx gets ``loss_fn(output, y) = F.cross_entropy(output[0].view(-1, C), y.view(-1))``
and a batch from ``get_batch('train')`` (drawn outside the program's random stream); a preflight
``nndx.probe`` with the optimizer; ``nndx.Monitor(model, optimizer, every=10)`` around the loop,
every step's loss logged and each estimate's val loss logged as ``split="val"``; after the loop
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from bench.programs import data as corpus
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "karpathy_gpt_lecture"
SOURCE = Source("karpathy/ng-video-lecture", "gpt.py", "52201428ed7b46804849dea0b3ccf0de9df1a5c3", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "gpt.py as published (shrunk: n_embd 48, 2 layers, block 32, 800 steps, generated text)"),
        Variant(
            "causal_mask_discarded",
            "Head.forward calls wei.masked_fill(self.tril[:T, :T] == 0, float('-inf')) without assigning the "
            "result (masked_fill is not in place): the causal mask is never applied, every position attends to "
            "the tokens after it, and the block's next characters, which are the targets, leak into the input",
            (C.DATA_LEAKAGE,),
            ("https://github.com/facebookresearch/xformers/issues/103",
             "https://github.com/keras-team/keras/issues/23038",
             "https://github.com/Mikyx-1/TinyLLM/pull/18"),
            Measure("val_loss_last_position", "val loss of each block's last position (whose target no token in "
                    "the block gives away) at least 0.5 above the healthy run's: 2.11 against 0.67 healthy on seed 0 "
                    "(estimate_loss's val loss is 0.17 against 0.78: the leak makes it look better)",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "train_mode_not_restored",
            "estimate_loss switches the model to model.eval() and never calls model.train() again: from the "
            "first estimate at step 0 on, the whole training runs with dropout off",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/shubhamagarwal92/mmd/issues/14",
             "https://github.com/tk-rusch/coRNN/issues/1",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/397"),
            Measure("final_val_loss", "estimate_loss's last val loss at least 0.1 away from the healthy run's: 0.49 "
                    "against 0.78 healthy on seed 0 (without dropout this shrunk, underfitting model learns faster; "
                    "the bug changes the training, whichever way it moves the number)",
                    lambda healthy, buggy: abs(buggy - healthy) >= 0.1),
        ),
    )
}

batch_size, block_size, max_iters, eval_interval, learning_rate = 16, 32, 800, 200, 3e-4
eval_iters, n_embd, n_head, n_layer, dropout = 20, 48, 4, 2, 0.2
N_WORDS = 7000


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    no_mask = variant == "causal_mask_discarded"
    keep_eval = variant == "train_mode_not_restored"
    torch.manual_seed(1337 + seed)

    text = corpus.char_text(N_WORDS, seed=seed)
    chars = sorted(list(set(text)))
    vocab_size = len(chars)
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    encode = lambda s: [stoi[c] for c in s]  # noqa: E731
    decode = lambda l: "".join([itos[i] for i in l])  # noqa: E731, E741

    data = torch.tensor(encode(text), dtype=torch.long)
    n = int(0.9 * len(data))
    train_data = data[:n]
    val_data = data[n:]

    def get_batch(split):
        data = train_data if split == "train" else val_data
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([data[i : i + block_size] for i in ix])
        y = torch.stack([data[i + 1 : i + block_size + 1] for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                logits, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        if not keep_eval:
            model.train()
        return out

    class Head(nn.Module):
        def __init__(self, head_size):
            super().__init__()
            self.key = nn.Linear(n_embd, head_size, bias=False)
            self.query = nn.Linear(n_embd, head_size, bias=False)
            self.value = nn.Linear(n_embd, head_size, bias=False)
            self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            B, T, C = x.shape
            k = self.key(x)
            q = self.query(x)
            wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
            if no_mask:
                wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
            else:
                wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
            wei = F.softmax(wei, dim=-1)
            wei = self.dropout(wei)
            v = self.value(x)
            out = wei @ v
            return out

    class MultiHeadAttention(nn.Module):
        def __init__(self, num_heads, head_size):
            super().__init__()
            self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
            self.proj = nn.Linear(head_size * num_heads, n_embd)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            out = torch.cat([h(x) for h in self.heads], dim=-1)
            out = self.dropout(self.proj(out))
            return out

    class FeedFoward(nn.Module):
        def __init__(self, n_embd):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd),
                                     nn.Dropout(dropout))  # fmt: skip

        def forward(self, x):
            return self.net(x)

    class Block(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            head_size = n_embd // n_head
            self.sa = MultiHeadAttention(n_head, head_size)
            self.ffwd = FeedFoward(n_embd)
            self.ln1 = nn.LayerNorm(n_embd)
            self.ln2 = nn.LayerNorm(n_embd)

        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            x = x + self.ffwd(self.ln2(x))
            return x

    class GPTLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
            self.position_embedding_table = nn.Embedding(block_size, n_embd)
            self.blocks = nn.Sequential(*[Block(n_embd, n_head=n_head) for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab_size)
            self.apply(self._init_weights)

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None):
            B, T = idx.shape
            tok_emb = self.token_embedding_table(idx)
            pos_emb = self.position_embedding_table(torch.arange(T))
            x = tok_emb + pos_emb
            x = self.blocks(x)
            x = self.ln_f(x)
            logits = self.lm_head(x)
            if targets is None:
                loss = None
            else:
                B, T, C = logits.shape
                logits = logits.view(B * T, C)
                targets = targets.view(B * T)
                loss = F.cross_entropy(logits, targets)
            return logits, loss

        def generate(self, idx, max_new_tokens):
            for _ in range(max_new_tokens):
                idx_cond = idx[:, -block_size:]
                logits, loss = self(idx_cond)
                logits = logits[:, -1, :]
                probs = F.softmax(logits, dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1)
                idx = torch.cat((idx, idx_next), dim=1)
            return idx

    model = GPTLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    def loss_fn(output, y):
        logits = output[0]
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        probe_batch = get_batch("train")
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    history = []
    for iter in range(max_iters):
        if iter % eval_interval == 0 or iter == max_iters - 1:
            losses = estimate_loss()
            history.append((float(losses["train"]), float(losses["val"])))
            nx.timed(lambda: mon.log(float(losses["val"]), split="val"))  # noqa: B023
        xb, yb = get_batch("train")
        logits, loss = model(xb, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # measure only: the last position's val loss (no future token inside the block) and the sample
    model.eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed + 99)
        ix = torch.randint(len(val_data) - block_size, (256,))
        x = torch.stack([val_data[i : i + block_size] for i in ix])
        y = val_data[ix + block_size]
        logits, _ = model(x)
        last_loss = F.cross_entropy(logits[:, -1, :], y).item()
        context = torch.zeros((1, 1), dtype=torch.long)
        sample = decode(model.generate(context, max_new_tokens=500)[0].tolist())
    lexicon = set(text.replace(".", " ").split())
    words = sample.replace(".", " ").split()[1:-1]
    known = sum(w in lexicon for w in words) / max(len(words), 1)
    return {"final_train_loss": history[-1][0], "final_val_loss": history[-1][1], "val_loss_last_position":
            last_loss, "sample_known_word_share": known, "vocab_size": float(vocab_size),
            "text_chars": float(len(text))}  # fmt: skip
