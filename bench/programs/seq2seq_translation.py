"""Port of the PyTorch tutorial "NLP From Scratch: Translation with a Sequence to Sequence
Network and Attention" (a GRU encoder and a Bahdanau-attention GRU decoder, each with its
own Adam optimizer, ``NLLLoss`` on ``log_softmax`` outputs).

Source: github.com/pytorch/tutorials, ``intermediate_source/seq2seq_translation_tutorial.py``
(BSD-3-Clause, Copyright (c) 2017-2022 Pytorch contributors). The version stored here at
commit 803c1b1273a47bc53bb6cd5f63eecfb897bbc856 is the older one (one pair per step, SGD,
the ``attn``/``attn_combine`` decoder over ``MAX_LENGTH`` slots, teacher forcing half the
time); this port follows the current tutorial (batched ``get_dataloader``, Adam,
``BahdanauAttention``, always teacher-forced in training), whose text was read from
verbatim copies because no newer commit of pytorch/tutorials could be read here. Written
anew from the facts of those files; no code copied.

Kept: ``SOS_token`` = 0, ``EOS_token`` = 1, ``MAX_LENGTH`` = 10; each sentence's word ids
followed by ``EOS`` and zero-padded to ``MAX_LENGTH`` (the padding is the SOS id 0, and
``NLLLoss`` scores it, as in the tutorial); ``EncoderRNN`` = ``Embedding`` -> ``Dropout(0.1)``
-> ``GRU(batch_first=True)``; ``BahdanauAttention`` = ``Va(tanh(Wa(query) + Ua(keys)))``, a
softmax over the source positions and ``bmm`` with the keys; ``AttnDecoderRNN`` = an
``Embedding`` + ``Dropout(0.1)`` step input concatenated with the attention context into a
``GRU(2 * hidden, hidden)`` and ``Linear(hidden, vocab)``, run ``MAX_LENGTH`` steps from a
batch of ``SOS``, fed the target token at each step when a target is given (teacher
forcing) and its own detached argmax otherwise, ``F.log_softmax`` over the concatenated
outputs; ``train_epoch``: both optimizers' ``zero_grad()``, encoder, decoder with the
target, ``NLLLoss`` on the flattened outputs and targets, ``backward()``, both ``step()``;
``optim.Adam(lr=0.001)`` per network; a ``RandomSampler`` (reshuffled every epoch); batch
size 32; ``evaluate`` = the decoder without a target, cut at the first ``EOS``, after
``encoder.eval()``/``decoder.eval()``.
Shrunk: a synthetic "translation" (no download is allowed): source sentences of 3-8 words
from a fixed random grammar over 40 words; the target is the source reversed, each word
mapped through a fixed dictionary into a second 40-word vocabulary; 1,600 training and 200
held-out pairs instead of ~11,000 eng-fra pairs; hidden size 64 instead of 128; 20 epochs
instead of 80. Measure only (not in the program): greedy ``evaluate`` on the 200 held-out
sentences, token accuracy against the reference + ``EOS``.
Not planted: the encoder left out of every optimizer (``encoder_optimizer`` over
``decoder.parameters()``, a copy-paste slip): at this size attention over the untrained
encoder's outputs still solves the task (greedy accuracy 0.906 against 0.962 healthy on
seed 0, 0.876 against 0.905 on seed 1), so no measure shows it doing harm.

nndx, as the author would add it: nndx's probe takes one model, so a small ``Seq2Seq``
module holding ``encoder`` and ``decoder`` (forward = encoder, then the teacher-forced
decoder) and the flattening ``NLLLoss`` as the loss; a preflight ``nndx.probe`` on the first
batch (``((input, target), target)``) with no optimizer (there are two, and probe takes
one); ``nndx.Monitor({"encoder": ..., "decoder": ...}, [encoder_optimizer,
decoder_optimizer])`` around the loop (the module docstring's several-models form) with the
criterion called through ``mon.loss_fn``; then ``nndx.probe(seq2seq, ..., monitor=mon)``
and ``nndx.diagnose``. The tutorial has no validation split, so nothing is logged as
``split="val"``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "seq2seq_translation"
SOURCE = Source("pytorch/tutorials", "intermediate_source/seq2seq_translation_tutorial.py",
                "803c1b1273a47bc53bb6cd5f63eecfb897bbc856", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (two Adam optimizers, lr 0.001, teacher forcing)"),
        Variant(
            "no_decoder_zero_grad",
            "decoder_optimizer.zero_grad() dropped from train_epoch: the decoder's gradients are summed over "
            "every batch so far while the encoder's are reset each step",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/IDEA-Research/DN-DETR/issues/19",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("greedy_token_accuracy", "held-out greedy token accuracy at least 0.1 below the healthy run's: "
                    "0.52/0.54/0.56 buggy against 0.96/0.91/0.90 healthy on seeds 0-2 (last-epoch train loss "
                    "0.61/0.50/0.46 against 0.07/0.09/0.11)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "targets_misaligned",
            "the loss scores decoder_outputs[:, :-1] against target_tensor[:, 1:] (the slicing of a target that "
            "starts with <SOS>, on targets that do not): each step is trained to predict the word after the one "
            "it must emit",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/bentrevett/pytorch-seq2seq/issues/46",),
            Measure("greedy_token_accuracy", "held-out greedy token accuracy at least 0.1 below the healthy run's: "
                    "0.15/0.16/0.17 buggy against 0.96/0.91/0.90 healthy on seeds 0-2 (while the train loss "
                    "falls to 0.21/0.21/0.27)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SOS_token, EOS_token = 0, 1
MAX_LENGTH = 10
N_WORDS = 40  # words per language, after SOS and EOS
MIN_WORDS, MAX_WORDS = 3, 8
N_TRAIN, N_HELD_OUT = 1600, 200
hidden_size, batch_size, n_epochs, learning_rate = 64, 32, 20, 0.001


# --------------------------------------------------------------------------- data


def sentence_pairs(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) without EOS: the target is the source reversed, word by word
    through a fixed dictionary (the same "languages" on every seed)."""
    rng = np.random.default_rng(seed)
    stream = data.word_tokens(n * MAX_WORDS, vocab=N_WORDS, seed=seed).tolist()
    dictionary = np.random.default_rng(4321).permutation(N_WORDS)
    pairs, at = [], 0
    for _ in range(n):
        length = int(rng.integers(MIN_WORDS, MAX_WORDS + 1))
        words = stream[at : at + length]
        at += length
        pairs.append(([w + 2 for w in words], [int(dictionary[w]) + 2 for w in reversed(words)]))
    return pairs


def to_ids(pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """get_dataloader's arrays: ids + EOS, zero-padded to MAX_LENGTH."""
    input_ids = np.zeros((len(pairs), MAX_LENGTH), dtype=np.int64)
    target_ids = np.zeros((len(pairs), MAX_LENGTH), dtype=np.int64)
    for idx, (inp, tgt) in enumerate(pairs):
        input_ids[idx, : len(inp) + 1] = inp + [EOS_token]
        target_ids[idx, : len(tgt) + 1] = tgt + [EOS_token]
    return torch.from_numpy(input_ids), torch.from_numpy(target_ids)


# --------------------------------------------------------------------------- the model


class EncoderRNN(nn.Module):
    def __init__(self, input_size: int, hidden: int, dropout_p: float = 0.1) -> None:
        super().__init__()
        self.hidden_size = hidden
        self.embedding = nn.Embedding(input_size, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input: torch.Tensor):
        return self.gru(self.dropout(self.embedding(input)))


class BahdanauAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.Wa = nn.Linear(hidden, hidden)
        self.Ua = nn.Linear(hidden, hidden)
        self.Va = nn.Linear(hidden, 1)

    def forward(self, query: torch.Tensor, keys: torch.Tensor):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights, keys), weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden: int, output_size: int, dropout_p: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden)
        self.attention = BahdanauAttention(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, output_size)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
        batch = encoder_outputs.size(0)
        decoder_input = torch.full((batch, 1), SOS_token, dtype=torch.long)
        decoder_hidden = encoder_hidden
        decoder_outputs, attentions = [], []
        for i in range(MAX_LENGTH):
            decoder_output, decoder_hidden, attn_weights = self.forward_step(decoder_input, decoder_hidden,
                                                                             encoder_outputs)  # fmt: skip
            decoder_outputs.append(decoder_output)
            attentions.append(attn_weights)
            if target_tensor is not None:
                decoder_input = target_tensor[:, i].unsqueeze(1)  # teacher forcing
            else:
                decoder_input = decoder_output.topk(1)[1].squeeze(-1).detach()
        decoder_outputs = F.log_softmax(torch.cat(decoder_outputs, dim=1), dim=-1)
        return decoder_outputs, decoder_hidden, torch.cat(attentions, dim=1)

    def forward_step(self, input, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(input))
        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden, attn_weights


class Seq2Seq(nn.Module):
    """What the author hands nndx's probe: the two networks as one teacher-forced model."""

    def __init__(self, encoder: EncoderRNN, decoder: AttnDecoderRNN) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, input_tensor: torch.Tensor, target_tensor: torch.Tensor) -> torch.Tensor:
        encoder_outputs, encoder_hidden = self.encoder(input_tensor)
        return self.decoder(encoder_outputs, encoder_hidden, target_tensor)[0]


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = n_epochs) -> dict[str, float]:
    torch.manual_seed(seed)
    pairs = sentence_pairs(N_TRAIN + N_HELD_OUT, seed=seed)
    train_inputs, train_targets = to_ids(pairs[:N_TRAIN])
    held_out = pairs[N_TRAIN:]
    vocab = N_WORDS + 2
    encoder = EncoderRNN(vocab, hidden_size)
    decoder = AttnDecoderRNN(hidden_size, vocab)
    seq2seq = Seq2Seq(encoder, decoder)

    encoder_optimizer = optim.Adam(encoder.parameters(), lr=learning_rate)
    decoder_optimizer = optim.Adam(decoder.parameters(), lr=learning_rate)
    criterion = nn.NLLLoss()

    def flat_nll(decoder_outputs: torch.Tensor, target_tensor: torch.Tensor, loss_fn=criterion) -> torch.Tensor:
        if variant == "targets_misaligned":
            decoder_outputs, target_tensor = decoder_outputs[:, :-1], target_tensor[:, 1:]
        return loss_fn(decoder_outputs.reshape(-1, decoder_outputs.size(-1)), target_tensor.reshape(-1))

    probe_batch = ((train_inputs[:batch_size], train_targets[:batch_size]), train_targets[:batch_size])
    nx.preflight(seq2seq, probe_batch, flat_nll)
    mon = nx.monitor({"encoder": encoder, "decoder": decoder}, [encoder_optimizer, decoder_optimizer], every=10,
                     loss_fn=criterion)  # fmt: skip

    sampler_rng = torch.Generator().manual_seed(seed)  # RandomSampler
    n_batches = (N_TRAIN + batch_size - 1) // batch_size
    epoch_losses: list[float] = []
    for _epoch in range(epochs):
        encoder.train()
        decoder.train()
        order = torch.randperm(N_TRAIN, generator=sampler_rng)
        total_loss = 0.0
        for b in range(n_batches):
            index = order[b * batch_size : (b + 1) * batch_size]
            input_tensor, target_tensor = train_inputs[index], train_targets[index]
            encoder_optimizer.zero_grad()
            if variant != "no_decoder_zero_grad":
                decoder_optimizer.zero_grad()
            encoder_outputs, encoder_hidden = encoder(input_tensor)
            decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden, target_tensor)
            loss = flat_nll(decoder_outputs, target_tensor, loss_fn=mon.loss_fn)
            loss.backward()
            encoder_optimizer.step()
            decoder_optimizer.step()
            mon.log(loss)
            total_loss += loss.item()
        epoch_losses.append(total_loss / n_batches)

    nx.finish(mon, seq2seq, probe_batch, flat_nll)

    # measure only: the tutorial's evaluate() on held-out sentences
    encoder.eval()
    decoder.eval()
    correct = total = 0
    with torch.no_grad():
        inputs, _ = to_ids(held_out)
        encoder_outputs, encoder_hidden = encoder(inputs)
        decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden)
        decoded = decoder_outputs.topk(1)[1].squeeze(-1).tolist()
    for (_, reference), ids in zip(held_out, decoded):
        reference = reference + [EOS_token]
        cut = ids[: ids.index(EOS_token) + 1] if EOS_token in ids else ids
        cut += [-1] * max(0, len(reference) - len(cut))
        correct += sum(int(a == b) for a, b in zip(cut, reference))
        total += len(reference)
    return {
        "final_train_loss": epoch_losses[-1],
        "first_epoch_loss": epoch_losses[0],
        "greedy_token_accuracy": correct / total,
    }
