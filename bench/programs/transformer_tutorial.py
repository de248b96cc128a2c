"""Port of the PyTorch tutorial "Sequence-to-Sequence Modeling with nn.Transformer and
TorchText" (an ``nn.TransformerEncoder`` language model).

Source: github.com/pytorch/tutorials, ``beginner_source/transformer_tutorial.py`` at
commit e5f60c64367b2ff3c19e5b73a2c7eac4bf1269f1 (BSD-3-Clause, Copyright (c) 2017-2022
Pytorch contributors). Written anew from the facts of that file; no code copied.

Kept: ``TransformerModel`` = ``nn.Embedding`` scaled by sqrt(ninp) -> sinusoidal
``PositionalEncoding`` (a buffer of shape (max_len, 1, d_model), with dropout) ->
``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)``
(sequence-first; ``enable_nested_tensor=False`` only silences a torch 2 warning) ->
``nn.Linear`` decoder to the vocabulary, no softmax; ``init_weights`` (embedding and
decoder weights uniform(-0.1, 0.1), decoder bias zero);
``generate_square_subsequent_mask`` (a float mask, -inf above the diagonal, 0 elsewhere)
passed as ``src_mask`` on every forward, rebuilt for the shorter last chunk; ``batchify``
into time-major columns and ``get_batch`` cutting ``bptt`` rows with the targets one
token ahead, flattened; ``nn.CrossEntropyLoss`` on ``output.view(-1, ntokens)``;
``torch.optim.SGD(lr=5.0)``, ``StepLR(optimizer, 1.0, gamma=0.95)`` stepped once per epoch;
``zero_grad`` / ``backward`` / ``clip_grad_norm_(0.5)`` / ``step``; ``evaluate`` under
``eval()`` and ``torch.no_grad()``, the loss weighted by chunk length; the best model by
validation loss "kept" (a reference to the model itself, so the final weights); 3
epochs, 2 layers, 2 heads, dropout 0.2.
Shrunk: a 48-word synthetic corpus (24,000 training and 2,400 validation tokens; its
next-token entropy is about 1.05 nats) instead of WikiText-2, embedding size 32 and
feed-forward size 64 instead of 200 / 200, bptt 16 instead of 35, batch 10 instead of
20, positional table 512 long instead of 5,000. The published lr 5.0 is kept, though at
this size a lower one trains better (validation loss 1.38/1.21/1.23 at 5.0, 1.16/1.05/1.09
at 0.5, seeds 0-2; measured after nndx's first run, the port left as it was).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first chunk (the
model's two inputs, the chunk and the mask the loop gives it, as a tuple; the loss the
loop computes, ``criterion(output.view(-1, ntokens), targets)``), ``nndx.Monitor`` around
the loop with each batch loss logged, the validation loss logged as ``split="val"`` each
epoch, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "transformer_tutorial"
SOURCE = Source("pytorch/tutorials", "beginner_source/transformer_tutorial.py",
                "e5f60c64367b2ff3c19e5b73a2c7eac4bf1269f1", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (SGD lr 5.0, StepLR per epoch, causal src_mask)"),
        Variant(
            "no_causal_mask",
            "the model called without src_mask in training and evaluation (as the tutorial shipped in 2023): "
            "every position attends to the next token, the very one it is trained to predict",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/pytorch/tutorials/issues/2478", "https://github.com/pytorch/tutorials/issues/719",
             "https://github.com/alex-matton/causal-transformer-decoder/issues/1"),
            Measure("causal_val_loss", "validation loss of the trained weights run with the causal mask, as a "
                    "generator must run them, 0.2 nats above the healthy run's or more (while the validation "
                    "loss the program reports is lower): 1.80/1.52/1.76 buggy against 1.38/1.21/1.23 healthy on "
                    "seeds 0-2, reported 0.95/0.81/0.94",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
        Variant(
            "adam_at_sgd_lr",
            "torch.optim.Adam swapped in for SGD with the tutorial's lr=5.0 kept: Adam's step is ~lr per weight",
            (C.LR_TOO_HIGH,),
            ("https://github.com/rajveermalviya/language-modeling/issues/3",
             "https://github.com/flashlight/wav2letter/issues/334"),
            Measure("final_train_loss", "mean train loss of the last 10 batches, 3x the healthy run's or more "
                    "(or not finite): 603/657/645 buggy against 1.46/1.25/1.28 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
    )
}

EMSIZE, NHID, NLAYERS, NHEAD, DROPOUT = 32, 64, 2, 2, 0.2
BPTT = 16
BATCH_SIZE, EVAL_BATCH_SIZE = 10, 10
TRAIN_TOKENS, VAL_TOKENS = 24000, 2400
EPOCHS, LR, CLIP = 3, 5.0, 0.5


# --------------------------------------------------------------------------- the model


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 512) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * div_term)
        table[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", table.unsqueeze(1))  # (max_len, 1, d_model): sequence-first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x + self.pe[: x.size(0)])


class TransformerModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.model_type = "Transformer"
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    @staticmethod
    def generate_square_subsequent_mask(sz: int) -> torch.Tensor:
        return torch.triu(torch.full((sz, sz), float("-inf")), diagonal=1)

    def init_weights(self) -> None:
        initrange = 0.1
        self.encoder.weight.data.uniform_(-initrange, initrange)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor | None) -> torch.Tensor:
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, src_mask)
        return self.decoder(output)


# --------------------------------------------------------------------------- data


def batchify(tokens: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = tokens.size(0) // bsz
    return tokens.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    corpus = data.word_tokens(TRAIN_TOKENS + VAL_TOKENS, seed=seed)
    ntokens = int(corpus.max()) + 1
    train_data = batchify(corpus[:TRAIN_TOKENS], BATCH_SIZE)
    val_data = batchify(corpus[TRAIN_TOKENS:], EVAL_BATCH_SIZE)

    model = TransformerModel(ntokens, EMSIZE, NHEAD, NHID, NLAYERS, DROPOUT)
    criterion = nn.CrossEntropyLoss()
    if variant == "adam_at_sgd_lr":
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
    use_mask = variant != "no_causal_mask"

    def mask_for(chunk: torch.Tensor) -> torch.Tensor | None:
        return model.generate_square_subsequent_mask(chunk.size(0)) if use_mask else None

    def flat_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return criterion(output.view(-1, ntokens), targets)

    first, first_targets = get_batch(train_data, 0)
    probe_batch = ((first, mask_for(first)), first_targets)
    nx.preflight(model, probe_batch, flat_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def evaluate(eval_model: nn.Module, data_source: torch.Tensor, causal: bool = use_mask) -> float:
        eval_model.eval()
        total_loss = 0.0
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, BPTT):
                chunk, targets = get_batch(data_source, i)
                src_mask = model.generate_square_subsequent_mask(chunk.size(0)) if causal else None
                output = eval_model(chunk, src_mask)
                total_loss += len(chunk) * criterion(output.view(-1, ntokens), targets).item()
        return total_loss / (len(data_source) - 1)

    train_losses: list[float] = []
    best_val_loss, best_model = float("inf"), None
    for _epoch in range(1, EPOCHS + 1):
        model.train()
        src_mask = model.generate_square_subsequent_mask(BPTT) if use_mask else None
        for i in range(0, train_data.size(0) - 1, BPTT):
            chunk, targets = get_batch(train_data, i)
            optimizer.zero_grad()
            if use_mask and chunk.size(0) != BPTT:
                src_mask = model.generate_square_subsequent_mask(chunk.size(0))
            output = model(chunk, src_mask)
            loss = criterion(output.view(-1, ntokens), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            mon.log(loss)
            train_losses.append(loss.item())
        val_loss = evaluate(model, val_data)
        mon.log(val_loss, split="val")
        if val_loss < best_val_loss:
            best_val_loss = val_loss
            best_model = model  # a reference, as in the tutorial: the final weights
        scheduler.step()

    nx.finish(mon, model, probe_batch, flat_loss, optimizer=optimizer)
    # measure only: the trained weights run as a generator must run them, with the causal mask
    causal_val_loss = evaluate(best_model if best_model is not None else model, val_data, causal=True)
    return {
        "final_train_loss": sum(train_losses[-10:]) / 10,
        "val_loss": val_loss,
        "best_val_loss": best_val_loss,
        "causal_val_loss": causal_val_loss,
    }
