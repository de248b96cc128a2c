"""Port of the PyTorch word-level language model example (2-layer LSTM, default options).

Source: github.com/pytorch/examples, ``word_language_model/main.py`` and ``model.py`` at
commit 77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017
Pytorch contributors). Written anew from the facts of those files; no code copied.

Kept (the defaults, ``--model LSTM`` without ``--use-optimizer``): ``RNNModel`` =
``Embedding`` -> ``Dropout`` -> 2-layer ``nn.LSTM`` with dropout -> ``Dropout`` ->
``Linear`` decoder, uniform(-0.1, 0.1) init, ``F.log_softmax`` output and
``nn.NLLLoss``; the data ``batchify``-ed into time-major columns and cut into ``bptt``
chunks by ``get_batch``; ``repackage_hidden`` (detach) before each chunk;
``model.zero_grad()``; ``clip_grad_norm_(0.25)``; the update written by hand,
``p.data.add_(p.grad, alpha=-lr)`` with lr 20 and no optimizer object; the LR divided by
4 when the validation loss does not improve; ``evaluate`` under ``model.eval()`` and
``torch.no_grad()``.
Shrunk: a 48-word synthetic corpus (6,000 training tokens) instead of WikiText-2,
embedding and hidden size 32 instead of 200, bptt 16 instead of 35, batch 10 instead of
20, 4 epochs.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first chunk, then
``nndx.Monitor(model, optimizer)`` around the loop — which has no optimizer to give.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "word_language_model"
SOURCE = Source("pytorch/examples", "word_language_model/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (defaults: LSTM, manual SGD updates)"),
        Variant(
            "hidden_not_detached",
            "repackage_hidden dropped; loss.backward(retain_graph=True) to silence 'backward through the graph a second time'",
            (C.GRAPH_RETAINED,),
            ("https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57",
             "https://github.com/sgadgil6/cnslab_fmri/issues/4",
             "https://github.com/yunjey/pytorch-tutorial/issues/90"),
            Measure("graph_growth", "autograd graph of the epoch's last chunk over its first, 5x the healthy run's or more",
                    lambda healthy, buggy: buggy >= 5 * healthy),
        ),
    )
}

EMSIZE = NHID = 32
NLAYERS = 2
BPTT = 16
BATCH_SIZE = 10
EVAL_BATCH_SIZE = 10


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid)


def batchify(tokens: torch.Tensor, bsz: int) -> torch.Tensor:
    """Time-major columns: (rows, bsz), each column a contiguous stretch of the corpus."""
    nbatch = tokens.size(0) // bsz
    return tokens.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def graph_size(tensor: torch.Tensor) -> int:
    """Autograd nodes reachable from ``tensor`` (what backward will walk)."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen)


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 4) -> dict[str, float]:
    torch.manual_seed(1111 + seed)
    corpus = data.word_tokens(7200, seed=seed)
    ntokens = int(corpus.max()) + 1
    train_data = batchify(corpus[:6000], BATCH_SIZE)
    val_data = batchify(corpus[6000:], EVAL_BATCH_SIZE)
    model = RNNModel(ntokens, EMSIZE, NHID, NLAYERS, dropout=0.2)
    criterion = nn.NLLLoss()
    lr, clip = 20.0, 0.25

    first = get_batch(train_data, 0)
    nx.preflight(model, ((first[0], model.init_hidden(BATCH_SIZE)), first[1]),
                 lambda output, targets: criterion(output[0], targets))  # fmt: skip
    optimizer = None  # the default path updates the parameters by hand
    mon = nx.monitor(model, optimizer, every=10)

    def evaluate(source: torch.Tensor) -> float:
        model.eval()
        total = 0.0
        hidden = model.init_hidden(EVAL_BATCH_SIZE)
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, BPTT):
                x, targets = get_batch(source, i)
                output, hidden = model(x, hidden)
                hidden = repackage_hidden(hidden)
                total += len(x) * criterion(output, targets).item()
        return total / (len(source) - 1)

    graph_sizes: list[int] = []
    train_losses: list[float] = []
    best_val_loss = None
    for epoch in range(1, epochs + 1):
        model.train()
        hidden = model.init_hidden(BATCH_SIZE)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
            x, targets = get_batch(train_data, i)
            model.zero_grad()
            if variant != "hidden_not_detached":
                hidden = repackage_hidden(hidden)
            output, hidden = model(x, hidden)
            loss = criterion(output, targets)
            if epoch == 1:
                graph_sizes.append(graph_size(loss))
            loss.backward(retain_graph=variant == "hidden_not_detached")
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            mon.log(loss)
            train_losses.append(loss.item())
        val_loss = evaluate(val_data)
        mon.log(val_loss, split="val")
        if best_val_loss is None or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0

    nx.finish(mon, model, ((first[0], model.init_hidden(BATCH_SIZE)), first[1]),
              lambda output, targets: criterion(output[0], targets))  # fmt: skip
    return {
        "val_loss": val_loss,
        "final_train_loss": sum(train_losses[-10:]) / 10,
        "graph_growth": graph_sizes[-1] / graph_sizes[0],
    }
