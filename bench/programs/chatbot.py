"""Port of the PyTorch "Chatbot Tutorial": a bidirectional-GRU encoder and a Luong-attention
GRU decoder sharing one embedding, trained on padded query/response batches with a masked
NLL loss, teacher forcing, gradient clipping and two Adam optimizers.

Source: github.com/pytorch/tutorials, ``beginner_source/chatbot_tutorial.py`` at commit
03b277366b12fc14f56a387cc5ec4cdf1ede744a (BSD-3-Clause, Copyright (c) 2017-2022 PyTorch
contributors; the tutorial by Matthew Inkawhich). Written anew from the facts of that
file; no code copied.

Kept: ``PAD_token`` = 0, ``SOS_token`` = 1, ``EOS_token`` = 2, ``MAX_LENGTH`` = 10 (pairs
kept when both sides have fewer words); ``Voc`` (word2index/word2count/index2word,
``num_words`` starting at 3); ``indexesFromSentence`` (ids + EOS), ``zeroPadding``
(``itertools.zip_longest``: time-major ``(max_len, batch)``), ``binaryMatrix`` (1 where
not PAD), ``inputVar`` (padded ids + lengths), ``outputVar`` (padded ids, a bool mask,
``max_target_len``), ``batch2TrainData`` (pairs sorted by query length, longest first);
``EncoderRNN``: the shared ``embedding``, ``pack_padded_sequence``, a bidirectional
``GRU(hidden, hidden, n_layers, dropout)``, ``pad_packed_sequence``, the two directions'
outputs summed; ``Attn('dot')``: ``sum(hidden * encoder_output, dim=2)``, transposed,
``F.softmax(dim=1).unsqueeze(1)``; ``LuongAttnDecoderRNN``: one step at a time, embedding
-> ``embedding_dropout`` -> ``GRU`` -> attention over the encoder outputs -> ``bmm``
context -> ``tanh(concat(cat(rnn_output, context)))`` -> ``out`` -> ``F.softmax``
(probabilities out); ``maskNLLLoss``: ``-log(gather(inp, 1, target))`` over the mask's
positions, mean, with the count of real tokens; ``train``: both ``zero_grad()``, encoder,
the decoder from a batch of SOS with ``encoder_hidden[:decoder.n_layers]``, teacher
forcing drawn per iteration by ``random.random() < teacher_forcing_ratio`` (1.0) and the
decoder's own ``topk`` otherwise, the per-step losses summed, ``backward()``,
``clip_grad_norm_`` (50.0) on each network, both ``step()``s, the printed loss = the sum of
``mask_loss * nTotal`` / the number of tokens; ``trainIters``: ``n_iteration`` batches of
``random.choice(pairs)`` drawn up front, ``print_every`` = 1; ``attn_model = 'dot'``,
``encoder_n_layers = decoder_n_layers = 2``, ``dropout = 0.1``; ``Adam(lr=0.0001)`` for the
encoder and ``lr * decoder_learning_ratio`` (5.0) for the decoder; ``encoder.train()`` /
``decoder.train()`` before training, ``eval()`` then ``GreedySearchDecoder`` after.
Shrunk: a synthetic pair corpus instead of the Cornell Movie-Dialogs Corpus (no download,
no ``normalizeString``/``trimRareWords``): a query of 2-8 words from a fixed random
grammar over 40 words, its response the query's last 6 words or fewer reversed, each
through a fixed dictionary into 40 other words, so responses are 2-6 words and both
sides are padded; 2,000 training and 100 held-out pairs; ``hidden_size`` 32 instead of
500; ``batch_size`` 32 instead of 64; 500 iterations instead of 4,000; ``lr`` 1e-3
instead of 1e-4 (the decoder 5e-3), since at 1e-4 the 16x narrower model barely moves
in 500 iterations. No checkpoints. Measure only: ``GreedySearchDecoder`` on the
held-out queries, token accuracy of the decoded words up to EOS against the reference
response + EOS; the held-out masked NLL under teacher forcing.
Not planted: ``maskNLLLoss`` without ``.squeeze(1)`` (the bug of the tutorial's source,
github.com/ywk991112/pytorch-chatbot/issues/12: the (batch, 1) losses broadcast against
the (batch,) mask, so PAD targets are scored): here it changes nothing measurable (greedy
accuracy 0.996/0.997/0.997 against 1.000/0.998/0.997 healthy on seeds 0-2, held-out NLL
0.021/0.020/0.016 against 0.015/0.023/0.025).

nndx, as the author would add it: nndx's probe takes one model, so a small ``Seq2Seq``
module holding ``encoder`` and ``decoder`` (forward = the encoder, then the
teacher-forced decoder over the target, the per-step outputs stacked) and the loss of
``train`` (each step's ``maskNLLLoss`` with the mask of the non-PAD targets, summed) as
``loss_fn``; a preflight ``nndx.probe`` on the first batch
(``((input, lengths, target), target)``) with no optimizer (there are two, and probe
takes one); ``nndx.Monitor({"encoder": ..., "decoder": ...}, [encoder_optimizer,
decoder_optimizer])`` around ``trainIters`` with ``maskNLLLoss`` called as
``mon.loss_fn`` and each iteration's printed loss logged; the tutorial has no
validation split, so nothing is logged as ``split="val"``; then
``nndx.probe(seq2seq, ..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "chatbot"
SOURCE = Source("pytorch/tutorials", "beginner_source/chatbot_tutorial.py",
                "03b277366b12fc14f56a387cc5ec4cdf1ede744a", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (maskNLLLoss on the decoder's softmax, teacher forcing 1.0)"),
        Variant(
            "cross_entropy_on_softmax",
            "maskNLLLoss replaced by nn.CrossEntropyLoss(ignore_index=PAD_token) on decoder_output, which the "
            "decoder already returns through F.softmax: a second softmax inside the loss",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/pytorch/tutorials/issues/663",),
            Measure("greedy_token_accuracy", "held-out greedy token accuracy at least 0.3 below the healthy run's: "
                    "0.00/0.00/0.00 against 1.00/1.00/1.00 healthy on seeds 0-2 (held-out masked NLL "
                    "10.2/10.0/10.2 against 0.015/0.023/0.025)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "nll_on_probabilities",
            "maskNLLLoss replaced by nn.NLLLoss(ignore_index=PAD_token) on decoder_output, which holds "
            "probabilities (F.softmax), not log-probabilities: the loss is -p(target), not -log p(target)",
            (C.WRONG_LOSS,),
            ("https://github.com/mjc92/GetToThePoint/issues/8",
             "https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9",
             "https://github.com/jamesli1618/Obj-GAN/issues/30"),
            Measure("greedy_token_accuracy", "held-out greedy token accuracy at least 0.3 below the healthy run's: "
                    "0.00/0.00/0.00 against 1.00/1.00/1.00 healthy on seeds 0-2 (the printed loss ends near -0.18: "
                    "the decoder settles on a few tokens)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
    )
}

PAD_token, SOS_token, EOS_token = 0, 1, 2
MAX_LENGTH = 10
N_WORDS = 40  # words per side (queries / responses)
MIN_WORDS, MAX_WORDS, MAX_REPLY = 2, 8, 6
N_TRAIN, N_HELD_OUT = 2000, 100
hidden_size, encoder_n_layers, decoder_n_layers, dropout, batch_size = 32, 2, 2, 0.1, 32
attn_model = "dot"
clip, teacher_forcing_ratio, learning_rate, decoder_learning_ratio = 50.0, 1.0, 1e-3, 5.0
n_iteration = 500


# --------------------------------------------------------------------------- data


def query_response_pairs(n: int, seed: int) -> list[list[str]]:
    """[query, response] sentences: the response is the query's last MAX_REPLY words, reversed,
    each through a fixed dictionary ("q7" -> "r23"); the same dictionary on every seed."""
    rng = np.random.default_rng(seed)
    stream = data.word_tokens(n * MAX_WORDS, vocab=N_WORDS, seed=seed).tolist()
    dictionary = np.random.default_rng(2024).permutation(N_WORDS)
    pairs, at = [], 0
    for _ in range(n):
        length = int(rng.integers(MIN_WORDS, MAX_WORDS + 1))
        words = stream[at : at + length]
        at += length
        query = " ".join(f"q{w}" for w in words)
        response = " ".join(f"r{dictionary[w]}" for w in reversed(words[-MAX_REPLY:]))
        pairs.append([query, response])
    return pairs


class Voc:
    def __init__(self, name: str) -> None:
        self.name = name
        self.word2index: dict[str, int] = {}
        self.word2count: dict[str, int] = {}
        self.index2word = {PAD_token: "PAD", SOS_token: "SOS", EOS_token: "EOS"}
        self.num_words = 3

    def addSentence(self, sentence: str) -> None:
        for word in sentence.split(" "):
            self.addWord(word)

    def addWord(self, word: str) -> None:
        if word in self.word2index:
            self.word2count[word] += 1
            return
        self.word2index[word] = self.num_words
        self.word2count[word] = 1
        self.index2word[self.num_words] = word
        self.num_words += 1


def filterPair(p: list[str]) -> bool:
    return len(p[0].split(" ")) < MAX_LENGTH and len(p[1].split(" ")) < MAX_LENGTH


def indexesFromSentence(voc: Voc, sentence: str) -> list[int]:
    return [voc.word2index[word] for word in sentence.split(" ")] + [EOS_token]


def zeroPadding(seqs: list[list[int]], fillvalue: int = PAD_token) -> list[tuple[int, ...]]:
    return list(itertools.zip_longest(*seqs, fillvalue=fillvalue))


def binaryMatrix(rows: list[tuple[int, ...]], value: int = PAD_token) -> list[list[int]]:
    return [[0 if token == value else 1 for token in row] for row in rows]


def inputVar(sentences: list[str], voc: Voc) -> tuple[torch.Tensor, torch.Tensor]:
    indexes_batch = [indexesFromSentence(voc, s) for s in sentences]
    lengths = torch.tensor([len(ids) for ids in indexes_batch])
    return torch.LongTensor(zeroPadding(indexes_batch)), lengths


def outputVar(sentences: list[str], voc: Voc) -> tuple[torch.Tensor, torch.Tensor, int]:
    indexes_batch = [indexesFromSentence(voc, s) for s in sentences]
    max_target_len = max(len(ids) for ids in indexes_batch)
    padList = zeroPadding(indexes_batch)
    return torch.LongTensor(padList), torch.BoolTensor(binaryMatrix(padList)), max_target_len


def batch2TrainData(voc: Voc, pair_batch: list[list[str]]):
    pair_batch.sort(key=lambda p: len(p[0].split(" ")), reverse=True)
    inp, lengths = inputVar([p[0] for p in pair_batch], voc)
    output, mask, max_target_len = outputVar([p[1] for p in pair_batch], voc)
    return inp, lengths, output, mask, max_target_len


# --------------------------------------------------------------------------- the models


class EncoderRNN(nn.Module):
    def __init__(self, hidden_size: int, embedding: nn.Embedding, n_layers: int = 1, dropout: float = 0) -> None:
        super().__init__()
        self.n_layers, self.hidden_size, self.embedding = n_layers, hidden_size, embedding
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers, dropout=(0 if n_layers == 1 else dropout),
                          bidirectional=True)  # fmt: skip

    def forward(self, input_seq: torch.Tensor, input_lengths: torch.Tensor, hidden=None):
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(input_seq), input_lengths)
        outputs, hidden = self.gru(packed, hidden)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs)
        outputs = outputs[:, :, : self.hidden_size] + outputs[:, :, self.hidden_size :]  # sum the two directions
        return outputs, hidden


class Attn(nn.Module):
    def __init__(self, method: str, hidden_size: int) -> None:
        super().__init__()
        if method not in ("dot", "general", "concat"):
            raise ValueError(method, "is not an appropriate attention method.")
        self.method, self.hidden_size = method, hidden_size
        if method == "general":
            self.attn = nn.Linear(hidden_size, hidden_size)
        elif method == "concat":
            self.attn = nn.Linear(hidden_size * 2, hidden_size)
            self.v = nn.Parameter(torch.FloatTensor(hidden_size))

    def dot_score(self, hidden, encoder_output):
        return torch.sum(hidden * encoder_output, dim=2)

    def general_score(self, hidden, encoder_output):
        return torch.sum(hidden * self.attn(encoder_output), dim=2)

    def concat_score(self, hidden, encoder_output):
        energy = self.attn(torch.cat((hidden.expand(encoder_output.size(0), -1, -1), encoder_output), 2)).tanh()
        return torch.sum(self.v * energy, dim=2)

    def forward(self, hidden, encoder_outputs):
        score = {"general": self.general_score, "concat": self.concat_score, "dot": self.dot_score}[self.method]
        attn_energies = score(hidden, encoder_outputs).t()  # (batch, max_length)
        return F.softmax(attn_energies, dim=1).unsqueeze(1)


class LuongAttnDecoderRNN(nn.Module):
    def __init__(self, attn_model: str, embedding: nn.Embedding, hidden_size: int, output_size: int,
                 n_layers: int = 1, dropout: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.attn_model, self.hidden_size, self.output_size = attn_model, hidden_size, output_size
        self.n_layers, self.dropout = n_layers, dropout
        self.embedding = embedding
        self.embedding_dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers, dropout=(0 if n_layers == 1 else dropout))
        self.concat = nn.Linear(hidden_size * 2, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)
        self.attn = Attn(attn_model, hidden_size)

    def forward(self, input_step, last_hidden, encoder_outputs):
        embedded = self.embedding_dropout(self.embedding(input_step))
        rnn_output, hidden = self.gru(embedded, last_hidden)
        attn_weights = self.attn(rnn_output, encoder_outputs)
        context = attn_weights.bmm(encoder_outputs.transpose(0, 1))
        concat_input = torch.cat((rnn_output.squeeze(0), context.squeeze(1)), 1)
        concat_output = torch.tanh(self.concat(concat_input))
        output = F.softmax(self.out(concat_output), dim=1)  # Luong eq. 6, probabilities
        return output, hidden


class GreedySearchDecoder(nn.Module):
    def __init__(self, encoder: EncoderRNN, decoder: LuongAttnDecoderRNN) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, input_seq, input_length, max_length):
        encoder_outputs, encoder_hidden = self.encoder(input_seq, input_length)
        decoder_hidden = encoder_hidden[: self.decoder.n_layers]
        decoder_input = torch.ones(1, 1, dtype=torch.long) * SOS_token
        all_tokens = torch.zeros([0], dtype=torch.long)
        all_scores = torch.zeros([0])
        for _ in range(max_length):
            decoder_output, decoder_hidden = self.decoder(decoder_input, decoder_hidden, encoder_outputs)
            decoder_scores, decoder_input = torch.max(decoder_output, dim=1)
            all_tokens = torch.cat((all_tokens, decoder_input), dim=0)
            all_scores = torch.cat((all_scores, decoder_scores), dim=0)
            decoder_input = torch.unsqueeze(decoder_input, 0)
        return all_tokens, all_scores


class Seq2Seq(nn.Module):
    """What the author hands nndx's probe: encoder + teacher-forced decoder as one model,
    returning the decoder's per-step outputs stacked, (max_target_len, batch, num_words)."""

    def __init__(self, encoder: EncoderRNN, decoder: LuongAttnDecoderRNN) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, input_variable, lengths, target_variable):
        encoder_outputs, encoder_hidden = self.encoder(input_variable, lengths)
        decoder_input = torch.LongTensor([[SOS_token] * input_variable.size(1)])
        decoder_hidden = encoder_hidden[: self.decoder.n_layers]
        outputs = []
        for t in range(target_variable.size(0)):
            decoder_output, decoder_hidden = self.decoder(decoder_input, decoder_hidden, encoder_outputs)
            outputs.append(decoder_output)
            decoder_input = target_variable[t].view(1, -1)
        return torch.stack(outputs)


# --------------------------------------------------------------------------- the loss


def maskNLLLoss(inp: torch.Tensor, target: torch.Tensor, mask: torch.Tensor):
    nTotal = mask.sum()
    crossEntropy = -torch.log(torch.gather(inp, 1, target.view(-1, 1)).squeeze(1))
    loss = crossEntropy.masked_select(mask).mean()
    return loss, nTotal.item()


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rand = random.Random(seed)
    all_pairs = [p for p in query_response_pairs(N_TRAIN + N_HELD_OUT, seed=seed) if filterPair(p)]
    pairs, held_out = all_pairs[:N_TRAIN], all_pairs[N_TRAIN:]
    voc = Voc("synthetic")
    for query, response in all_pairs:  # loadPrepareData counts every kept pair's words
        voc.addSentence(query)
        voc.addSentence(response)

    embedding = nn.Embedding(voc.num_words, hidden_size)
    encoder = EncoderRNN(hidden_size, embedding, encoder_n_layers, dropout)
    decoder = LuongAttnDecoderRNN(attn_model, embedding, hidden_size, voc.num_words, decoder_n_layers, dropout)
    seq2seq = Seq2Seq(encoder, decoder)
    encoder.train()
    decoder.train()
    encoder_optimizer = optim.Adam(encoder.parameters(), lr=learning_rate)
    decoder_optimizer = optim.Adam(decoder.parameters(), lr=learning_rate * decoder_learning_ratio)

    if variant in ("cross_entropy_on_softmax", "nll_on_probabilities"):
        ce = nn.CrossEntropyLoss(ignore_index=PAD_token) if variant == "cross_entropy_on_softmax" \
            else nn.NLLLoss(ignore_index=PAD_token)

        def step_loss(decoder_output, target, mask):  # the torch criterion; ignore_index stands for the mask
            return ce(decoder_output, target), mask.sum().item()

        user_loss = ce
    else:
        step_loss = maskNLLLoss
        user_loss = step_loss
    plain_step_loss = step_loss

    def sequence_loss(outputs: torch.Tensor, target_variable: torch.Tensor) -> torch.Tensor:
        """train()'s loss over a teacher-forced batch: each step's loss, summed."""
        mask = target_variable != PAD_token
        return sum(plain_step_loss(outputs[t], target_variable[t], mask[t])[0] for t in range(target_variable.size(0)))

    training_batches = [batch2TrainData(voc, [rand.choice(pairs) for _ in range(batch_size)])
                        for _ in range(n_iteration)]  # fmt: skip
    inp0, len0, tgt0, _mask0, _ = training_batches[0]
    probe_batch = ((inp0, len0, tgt0), tgt0)
    nx.preflight(seq2seq, probe_batch, sequence_loss)
    mon = nx.monitor({"encoder": encoder, "decoder": decoder}, [encoder_optimizer, decoder_optimizer], every=10,
                     loss_fn=user_loss)  # fmt: skip
    if variant in ("cross_entropy_on_softmax", "nll_on_probabilities"):
        wrapped = mon.loss_fn

        def step_loss(decoder_output, target, mask):  # noqa: F811 - the wrapped criterion
            return wrapped(decoder_output, target), mask.sum().item()
    else:
        step_loss = mon.loss_fn

    def train_iteration(input_variable, lengths, target_variable, mask, max_target_len) -> float:
        encoder_optimizer.zero_grad()
        decoder_optimizer.zero_grad()
        loss = 0
        print_losses, n_totals = [], 0
        encoder_outputs, encoder_hidden = encoder(input_variable, lengths)
        decoder_input = torch.LongTensor([[SOS_token for _ in range(batch_size)]])
        decoder_hidden = encoder_hidden[: decoder.n_layers]
        use_teacher_forcing = rand.random() < teacher_forcing_ratio
        for t in range(max_target_len):
            decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden, encoder_outputs)
            if use_teacher_forcing:
                decoder_input = target_variable[t].view(1, -1)
            else:
                _, topi = decoder_output.topk(1)
                decoder_input = torch.LongTensor([[topi[i][0] for i in range(batch_size)]])
            mask_loss, nTotal = step_loss(decoder_output, target_variable[t], mask[t])
            loss += mask_loss
            print_losses.append(mask_loss.item() * nTotal)
            n_totals += nTotal
        loss.backward()
        _ = nn.utils.clip_grad_norm_(encoder.parameters(), clip)
        _ = nn.utils.clip_grad_norm_(decoder.parameters(), clip)
        encoder_optimizer.step()
        decoder_optimizer.step()
        mon.log(loss)
        return sum(print_losses) / n_totals

    printed: list[float] = []
    for iteration in range(1, n_iteration + 1):
        printed.append(train_iteration(*training_batches[iteration - 1]))

    nx.finish(mon, seq2seq, probe_batch, sequence_loss)

    # measure only: GreedySearchDecoder on held-out queries, and their masked NLL
    encoder.eval()
    decoder.eval()
    searcher = GreedySearchDecoder(encoder, decoder)
    correct = total = 0
    with torch.no_grad():
        for query, response in held_out:
            ids = [indexesFromSentence(voc, query)]
            tokens, _ = searcher(torch.LongTensor(ids).transpose(0, 1), torch.tensor([len(ids[0])]), MAX_LENGTH)
            decoded = tokens.tolist()
            decoded = decoded[: decoded.index(EOS_token) + 1] if EOS_token in decoded else decoded
            reference = indexesFromSentence(voc, response)
            decoded += [-1] * max(0, len(reference) - len(decoded))
            correct += sum(int(a == b) for a, b in zip(decoded, reference))
            total += len(reference)
        inp, lengths, target, mask, _ = batch2TrainData(voc, list(held_out))
        probs = seq2seq(inp, lengths, target)
        nll = -torch.log(torch.gather(probs, 2, target.unsqueeze(2)).squeeze(2))
        held_out_nll = nll.masked_select(mask).mean().item()
    return {
        "greedy_token_accuracy": correct / total,
        "held_out_nll": held_out_nll,
        "last_printed_loss": sum(printed[-20:]) / 20,
    }
