"""Port of fastai/fastbook chapter 12 ("A Language Model from Scratch"): the stateful RNN language
model on the Human Numbers text, its hidden state carried from batch to batch (``self.h =
self.h.detach()``, truncated BPTT) and zeroed by ``reset`` at the start of every epoch and of
every validation phase (the ``ModelResetter`` callback), read in order over batches that
``group_chunks`` rearranged so that row j of batch i+1 continues row j of batch i.

Source: github.com/fastai/fastbook, ``12_nlp_dive.ipynb`` ("Maintaining the State of an RNN":
``LMModel3``, ``group_chunks``, ``ModelResetter``; "Creating More Signal": ``sl = 16``, the
shifted targets, ``LMModel4``, ``loss_func``, ``fit_one_cycle(15, 3e-3)``) at commit
098e12df996461ec607c774cf4e601ed716796a6 (GPL-3.0 for the notebooks' code, fastbook's
LICENSE). Written anew from the facts of that notebook, without fastai; no code copied.

Kept: the data pipeline: ``text = ' . '.join(lines)``, ``tokens = text.split(' ')``, ``vocab`` =
the unique tokens in order of appearance, ``nums`` = their indices; ``sl = 16``; ``seqs`` =
``(nums[i:i+sl], nums[i+1:i+sl+1])`` for ``i`` in ``range(0, len(nums)-sl-1, sl)``; ``cut`` =
80%; ``group_chunks(ds, bs)`` on each split (``m = len(ds)//bs``, the new order ``ds[i + m*j]``
for ``i < m``, ``j < bs``); batches of ``bs = 64``, ``drop_last=True``, ``shuffle=False``; the
stateful RNN in the chapter's 16-token form (``LMModel3``'s hidden state ``self.h = 0`` kept
across calls, ``self.h = self.h + self.i_h(x[:,i])``, ``self.h = F.relu(self.h_h(self.h))``,
``self.h = self.h.detach()`` after the sequence, ``reset`` sets ``self.h = 0``; with ``sl`` steps
and an output after every token, ``torch.stack(outs, dim=1)``: ``LMModel4``), ``n_hidden =
64``; ``loss_func(inp, targ) = F.cross_entropy(inp.view(-1, len(vocab)), targ.view(-1))``;
``accuracy`` (argmax over the last axis, both flattened); ``Learner(..., cbs=ModelResetter)``
+ ``fit_one_cycle(15, 3e-3)``.
Replaced: fastai's Learner by the same steps in a plain loop: per epoch ``model.reset()``,
``model.train()``, per batch ``loss_func(model(xb), yb)``, ``backward``, ``step``,
``zero_grad``; then ``model.reset()``, ``model.eval()``, the valid batches under
``no_grad`` (mean loss and accuracy weighted by batch size); fastai's default optimizer (Adam
with ``mom=0.9``, ``sqr_mom=0.99``, ``eps=1e-5``, decoupled ``wd=0.01``) as ``torch.optim.AdamW``
with those values, and ``fit_one_cycle``'s schedule (``pct_start=0.25``, ``div=25``,
``div_final=1e5``, cosine annealing, beta1 cycled 0.95 -> 0.85 -> 0.95) as
``torch.optim.lr_scheduler.OneCycleLR`` stepped every batch. The data: the Human Numbers text
(one .. nine thousand nine hundred ninety nine, written out in English, one number a line, no
"and": a 30-token vocab) generated in code instead of downloaded: 63,098 tokens against the
download's 63,095.
Shrunk: nothing (the whole text, 15 epochs, width 64); CPU; no plots.
Measure only (not in the program): the validation accuracy against the true next tokens (the
shifted targets), read from the model's output whatever its layout (``(bs, sl, V)``, or ``(sl,
bs, V)`` when the outputs were stacked on dim 0).

nndx, as the author would add it after README.md: ``nndx.probe(model, (xb, yb), loss_func,
optimizer=opt, data=(train x, train y, valid x, valid y))`` on the first training batch before
fitting; ``nndx.Monitor(model, opt, every=10, loss_fn=loss_func)`` around the loop, the batch
loss computed through ``mon.loss_fn``, every batch's loss logged and each epoch's valid loss
logged as ``split="val"`` (where fastai's Recorder records them); after fitting,
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fastbook_lm"
SOURCE = Source("fastai/fastbook", "12_nlp_dive.ipynb", "098e12df996461ec607c774cf4e601ed716796a6", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's stateful RNN LM as published (Human Numbers generated in code)"),
        Variant(
            "outputs_stacked_time_first",
            "forward returns torch.stack(outs) (dim=0 by default) instead of torch.stack(outs, dim=1): the output "
            "is (sl, bs, vocab) while the targets are (bs, sl), so loss_func's view(-1, len(vocab)) against "
            "targ.view(-1) pairs each prediction with another row's, another step's target; nothing crashes",
            (C.WRONG_RESHAPE, C.LABELS_MISALIGNED),
            ("https://github.com/IBM/pytorch-seq2seq/issues/193",
             "https://github.com/hunkim/PyTorchZeroToAll/pull/20",
             "https://github.com/harvardnlp/namedtensor/issues/66"),
            Measure("valid_next_token_acc", "valid accuracy on the true next tokens at least 0.15 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "targets_not_shifted",
            "the sequences are built as (nums[i:i+sl], nums[i:i+sl]): the +1 that shifts the targets one token "
            "ahead is left out, so every target is the token the model has just read and it learns to copy its "
            "input instead of predicting the next token",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/songlab-cal/tape/issues/32",
             "https://github.com/lucidrains/perceiver-ar-pytorch/pull/10",
             "https://github.com/huggingface/transformers/issues/24910"),
            Measure("valid_next_token_acc", "valid accuracy on the true next tokens at least 0.15 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

SL, BS, N_HIDDEN, EPOCHS, LR = 16, 64, 64, 15, 3e-3

# --------------------------------------------------------------------------- the Human Numbers text

_ONES = "one two three four five six seven eight nine".split()
_TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    out: list[str] = []
    if n >= 1000:
        out += [_ONES[n // 1000 - 1], "thousand"]
        n %= 1000
    if n >= 100:
        out += [_ONES[n // 100 - 1], "hundred"]
        n %= 100
    if n >= 20:
        out.append(_TENS[n // 10 - 2])
        n %= 10
    if n >= 10:
        out.append(_TEENS[n - 10])
        n = 0
    if n > 0:
        out.append(_ONES[n - 1])
    return " ".join(out)


def human_numbers_lines() -> list[str]:
    return [number_words(i) + " \n" for i in range(1, 10000)]


# --------------------------------------------------------------------------- 12_nlp_dive.ipynb


def group_chunks(ds: list, bs: int) -> list:
    m = len(ds) // bs
    new_ds = []
    for i in range(m):
        new_ds += [ds[i + m * j] for j in range(bs)]
    return new_ds


class LMModel(nn.Module):
    """LMModel3's stateful RNN with sl steps and an output after every token (LMModel4)."""

    def __init__(self, vocab_sz: int, n_hidden: int, stack_dim: int = 1) -> None:
        super().__init__()
        self.i_h = nn.Embedding(vocab_sz, n_hidden)
        self.h_h = nn.Linear(n_hidden, n_hidden)
        self.h_o = nn.Linear(n_hidden, vocab_sz)
        self.h: Tensor | int = 0
        self.stack_dim = stack_dim

    def forward(self, x: Tensor) -> Tensor:
        outs = []
        for i in range(SL):
            self.h = self.h + self.i_h(x[:, i])
            self.h = F.relu(self.h_h(self.h))
            outs.append(self.h_o(self.h))
        self.h = self.h.detach()
        if self.stack_dim == 1:
            return torch.stack(outs, dim=1)
        return torch.stack(outs)  # the bug: dim=0 by default

    def reset(self) -> None:
        self.h = 0


def batches(ds: list, bs: int) -> list[tuple[Tensor, Tensor]]:
    """DataLoader(ds, bs=bs, shuffle=False, drop_last=True)."""
    out = []
    for start in range(0, len(ds) - bs + 1, bs):
        chunk = ds[start : start + bs]
        out.append((torch.stack([a for a, _ in chunk]), torch.stack([b for _, b in chunk])))
    return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    lines = human_numbers_lines()
    text = " . ".join([line.strip() for line in lines])
    tokens = text.split(" ")
    vocab = list(dict.fromkeys(tokens))
    word2idx = {w: i for i, w in enumerate(vocab)}
    nums = [word2idx[t] for t in tokens]
    shift = 0 if variant == "targets_not_shifted" else 1

    seqs = [(torch.tensor(nums[i : i + SL]), torch.tensor(nums[i + shift : i + SL + shift]))
            for i in range(0, len(nums) - SL - 1, SL)]  # fmt: skip
    true_seqs = [(torch.tensor(nums[i : i + SL]), torch.tensor(nums[i + 1 : i + SL + 1]))
                 for i in range(0, len(nums) - SL - 1, SL)]  # measure only  # fmt: skip
    cut = int(len(seqs) * 0.8)
    train_dl = batches(group_chunks(seqs[:cut], BS), BS)
    valid_dl = batches(group_chunks(seqs[cut:], BS), BS)
    true_valid_dl = batches(group_chunks(true_seqs[cut:], BS), BS)

    def loss_func(inp: Tensor, targ: Tensor) -> Tensor:
        return F.cross_entropy(inp.view(-1, len(vocab)), targ.view(-1))

    model = LMModel(len(vocab), N_HIDDEN, stack_dim=0 if variant == "outputs_stacked_time_first" else 1)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=LR, total_steps=EPOCHS * len(train_dl), pct_start=0.25, div_factor=25.0,
        final_div_factor=1e5, base_momentum=0.85, max_momentum=0.95,
    )  # fmt: skip

    xs_train = torch.stack([a for a, _ in seqs[:cut]])
    ys_train = torch.stack([b for _, b in seqs[:cut]])
    xs_valid = torch.stack([a for a, _ in seqs[cut:]])
    ys_valid = torch.stack([b for _, b in seqs[cut:]])
    first_batch = train_dl[0]
    nx.preflight(model, first_batch, loss_func, optimizer=opt, data=(xs_train, ys_train, xs_valid, ys_valid))
    mon = nx.monitor(model, opt, every=10, loss_fn=loss_func)

    train_loss = valid_loss = valid_acc = float("nan")
    for _epoch in range(EPOCHS):
        model.reset()  # ModelResetter.before_train
        model.train()
        losses = []
        for xb, yb in train_dl:
            loss = mon.loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())
        train_loss = sum(losses) / len(losses)
        model.reset()  # ModelResetter.before_validate
        model.eval()
        tot_loss = tot_acc = n = 0.0
        with torch.no_grad():
            for xb, yb in valid_dl:
                out = model(xb)
                tot_loss += loss_func(out, yb).item() * len(xb)
                tot_acc += (out.argmax(dim=-1).flatten() == yb.flatten()).float().mean().item() * len(xb)
                n += len(xb)
        valid_loss, valid_acc = tot_loss / n, tot_acc / n
        nx.timed(lambda: mon.log(valid_loss, split="val"))  # noqa: B023
    model.reset()  # ModelResetter.after_fit

    nx.finish(mon, model, first_batch, loss_func, optimizer=opt, data=(xs_train, ys_train, xs_valid, ys_valid))

    # measure only: accuracy on the true next tokens, the output read in its own layout
    model.reset()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for xb, yb in true_valid_dl:
            out = model(xb)
            if out.shape[:2] != yb.shape:
                out = out.transpose(0, 1)
            correct += (out.argmax(dim=-1) == yb).sum().item()
            total += yb.numel()
    model.reset()
    return {"valid_next_token_acc": correct / total, "valid_loss": valid_loss, "valid_accuracy": valid_acc,
            "final_train_loss": train_loss}  # fmt: skip
