"""Port of d2l-ai/d2l-en's concise RNN language model (PyTorch tab): ``RNNModel`` over
``nn.RNN`` with one-hot inputs, a character corpus in sequential partitions, ``train_ch8``
with ``grad_clipping`` and SGD at lr 1, perplexity per epoch.

Source: github.com/d2l-ai/d2l-en, branch ``r0.17``,
``chapter_recurrent-neural-networks/rnn-concise.md`` (the section's code) and ``d2l/torch.py``
(the saved functions it calls: ``tokenize``, ``Vocab``, ``count_corpus``,
``load_corpus_time_machine``, ``seq_data_iter_random``, ``seq_data_iter_sequential``,
``SeqDataLoader``, ``load_data_time_machine``, ``predict_ch8``, ``grad_clipping``,
``train_epoch_ch8``, ``train_ch8``, ``Accumulator``) at commit
d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a (sample code: modified MIT, Copyright 2019
Amazon.com, Inc. or its affiliates; text CC BY-SA 4.0). Written anew from the facts of those
files; no code copied. The library's pieces are
:mod:`bench.programs.d2l_v017`'s (one copy for the ports of that release).

Kept: ``read_time_machine``'s cleaning (letters only, lower case, everything else a space),
character tokens, ``Vocab`` (``<unk>`` at 0, then tokens by descending frequency), the corpus
flattened over lines and cut at ``max_tokens`` 10,000; ``seq_data_iter_sequential`` (a random
offset in ``[0, num_steps]``, the corpus reshaped to ``batch_size`` rows, windows of
``num_steps``) and ``seq_data_iter_random`` (both kept; the section uses the sequential one,
``use_random_iter=False``); ``SeqDataLoader``; ``batch_size, num_steps = 32, 35``;
``rnn_layer = nn.RNN(len(vocab), num_hiddens)`` (time-major); ``RNNModel`` (``F.one_hot(inputs.T.long(),
vocab_size)`` as float32, the RNN, ``nn.Linear(num_hiddens, vocab_size)`` on
``Y.reshape((-1, Y.shape[-1]))``, ``begin_state`` zeros of ``(num_directions * num_layers,
batch_size, num_hiddens)``); ``train_ch8`` (``nn.CrossEntropyLoss``, ``torch.optim.SGD(net.parameters(),
lr)`` with lr 1) and ``train_epoch_ch8`` (state begun on the first batch, then
``state.detach_()`` between the sequential batches; ``y = Y.T.reshape(-1)``; ``l = loss(y_hat,
y.long()).mean()``; ``zero_grad``, ``backward``, ``grad_clipping(net, 1)`` (the global norm over
the parameters that require grad, gradients scaled in place by ``theta / norm`` when it
exceeds theta), ``step``; ``Accumulator`` of ``l * numel`` and ``numel``; the epoch's
perplexity ``exp(sum / count)``); ``predict_ch8`` at the end.
Replaced / shrunk: The Time Machine (a download) by a synthetic English-like text: 42 words of
the novel, sentences drawn from a fixed sparse word-bigram chain (each word with 3
successors), written as lines and cleaned as ``read_time_machine`` cleans them (28 tokens:
``<unk>``, space, 26 letters); ``num_hiddens`` 256 as published; 60 epochs instead of 500
(8 sequential batches an epoch, 480 steps); no Animator, no GPU.
Measure only (not in the program): the held-out perplexity of the trained net on 5,000
further characters of the same chain, sequential batches with the correct ``Y.T`` targets,
state carried and detached as in training, no grad.

nndx, as the author would add it: ``nndx.probe`` calls ``model(inputs)`` and ``RNNModel``
needs a state, so the author hands nndx a one-line wrapper (``NetForProbe``: the net from a
``begin_state`` of zeros, the logits only) and a loss that flattens the targets exactly as
the loop does (``loss(y_hat, y_of(Y).long()).mean()``, the loop's own helper); a preflight
``nndx.probe`` on the first training batch with the SGD; ``nndx.Monitor(net, updater)``
around ``train_ch8``'s epochs, every batch's loss logged; after training
``nndx.probe(..., monitor=mon)`` on the same batch, then ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import torch
from torch import nn

from bench.programs.d2l_v017 import (Accumulator, RNNModel, SeqDataLoader, Vocab, grad_clipping, predict_ch8,
                                    seq_data_iter_sequential, tokenize)
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_rnn_concise"
SOURCE = Source("d2l-ai/d2l-en", "chapter_recurrent-neural-networks/rnn-concise.md",
                "d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a", "MIT-0-like (sample code) / CC BY-SA 4.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (shrunk: synthetic English-like text, "
                "60 epochs instead of 500)"),
        Variant(
            "targets_not_transposed",
            "train_epoch_ch8 flattens the targets with Y.reshape(-1) instead of Y.T.reshape(-1): the net's "
            "outputs are time-major (step 0 of every sequence, then step 1, ...) while the targets are "
            "batch-major, so almost every output row is scored against another position's next character",
            (C.WRONG_RESHAPE, C.LABELS_MISALIGNED),
            ("https://github.com/apache/mxnet/issues/2702",
             "https://github.com/deeppavlov/deep-nlp-seminars/pull/4",
             "https://github.com/mikesj-public/rnn_spelling_bee/issues/1"),
            Measure("heldout_ppl", "held-out perplexity at least 1.5x the healthy run's: 17.0 against 1.64 healthy "
                    "on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "clip_after_step",
            "grad_clipping(net, 1) is called after updater.step() instead of before it: the update uses the "
            "unclipped gradient (the clipping then only rescales gradients that zero_grad discards), so SGD at "
            "lr 1 takes the full exploding BPTT steps",
            (C.EXPLODING_GRADIENTS,),
            ("https://github.com/pytorch/pytorch/issues/2623",
             "https://github.com/d2l-ai/d2l-zh/pull/129",
             "https://github.com/chenxie95/deeplearning_course_sjtu/issues/31"),
            Measure("heldout_ppl", "held-out perplexity at least 1.2x the healthy run's (or not finite): 4.8e15 against 1.64 healthy on "
                    "seed 0",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

BATCH_SIZE, NUM_STEPS, NUM_HIDDENS, NUM_EPOCHS, LR, MAX_TOKENS = 32, 35, 256, 60, 1, 10000

WORDS = ("the time traveller and of a to in was he that it had i you is my with machine said for as at we "
         "this but there one little so then psychologist medical man very into upon dimension space future "
         "filby weena").split()


# --------------------------------------------------------------------------- the synthetic book


def synthetic_lines(n_lines: int, offset_lines: int = 0) -> list[str]:
    """Lines of a fixed word-bigram chain (the same text on every seed): 3 successors a word."""
    rng = np.random.RandomState(1895)
    succ = {w: rng.choice(len(WORDS), 3, replace=False) for w in WORDS}
    probs = np.array([0.6, 0.3, 0.1])
    lines, word = [], "the"
    for _ in range(offset_lines + n_lines):
        words = []
        for _ in range(rng.randint(6, 14)):
            words.append(word)
            word = WORDS[succ[word][rng.choice(3, p=probs)]]
        lines.append(" ".join(words).capitalize() + ("." if rng.rand() < 0.7 else ","))
    return lines[offset_lines:]


def read_time_machine(lines: list[str]) -> list[str]:
    return [re.sub("[^A-Za-z]+", " ", line).strip().lower() for line in lines]


def load_corpus_time_machine(max_tokens=-1, vocab=None, offset_lines=0, n_lines=1400):
    lines = read_time_machine(synthetic_lines(n_lines, offset_lines))
    tokens = tokenize(lines, "char")
    vocab = Vocab(tokens) if vocab is None else vocab
    corpus = [vocab[token] for line in tokens for token in line]
    if max_tokens > 0:
        corpus = corpus[:max_tokens]
    return corpus, vocab


def load_data_time_machine(batch_size, num_steps, use_random_iter=False, max_tokens=10000):
    corpus, vocab = load_corpus_time_machine(max_tokens)
    data_iter = SeqDataLoader(corpus, vocab, batch_size, num_steps, use_random_iter)
    return data_iter, data_iter.vocab


# --------------------------------------------------------------------------- the section's model


class NetForProbe(nn.Module):
    """The author's wrapper for nndx.probe, which calls model(inputs): a zero state, the logits."""

    def __init__(self, net: RNNModel) -> None:
        super().__init__()
        self.net = net

    def forward(self, X):
        return self.net(X, self.net.begin_state(batch_size=X.shape[0], device=X.device))[0]


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)
    device = torch.device("cpu")
    clip_late = variant == "clip_after_step"

    def y_of(Y):  # the targets, flattened to match the time-major outputs
        return Y.reshape(-1) if variant == "targets_not_transposed" else Y.T.reshape(-1)

    train_iter, vocab = load_data_time_machine(BATCH_SIZE, NUM_STEPS)
    rnn_layer = nn.RNN(len(vocab), NUM_HIDDENS)
    net = RNNModel(rnn_layer, vocab_size=len(vocab))
    net = net.to(device)
    predict_ch8("time traveller", 10, net, vocab, device)

    # train_ch8
    loss = nn.CrossEntropyLoss()
    updater = torch.optim.SGD(net.parameters(), LR)

    def loss_for_nndx(y_hat, Y):
        return loss(y_hat, y_of(Y).long()).mean()

    with torch.random.fork_rng():
        state_py = random.getstate()
        probe_batch = next(iter(train_iter))
        random.setstate(state_py)
    nx.preflight(NetForProbe(net), probe_batch, loss_for_nndx, optimizer=updater)
    mon = nx.monitor(net, updater)

    ppls = []
    for epoch in range(NUM_EPOCHS):
        # train_epoch_ch8
        state = None
        metric = Accumulator(2)
        for X, Y in train_iter:
            if state is None:
                state = net.begin_state(batch_size=X.shape[0], device=device)
            else:
                state.detach_()
            y = y_of(Y)
            X, y = X.to(device), y.to(device)
            y_hat, state = net(X, state)
            l = loss(y_hat, y.long()).mean()
            updater.zero_grad()
            l.backward()
            if not clip_late:
                grad_clipping(net, 1)
            updater.step()
            if clip_late:
                grad_clipping(net, 1)
            nx.timed(lambda: mon.log(l))
            metric.add(l * y.numel(), y.numel())
        ppls.append(math.exp(metric[0] / metric[1]) if metric[0] / metric[1] < 700 else float("inf"))

    nx.finish(mon, NetForProbe(net), probe_batch, loss_for_nndx, optimizer=updater)
    predict_ch8("time traveller", 50, net, vocab, device)

    # measure only: held-out perplexity with the correct targets
    held, _ = load_corpus_time_machine(5000, vocab=vocab, offset_lines=1400, n_lines=800)
    total, count, state = 0.0, 0, None
    with torch.no_grad():
        for X, Y in seq_data_iter_sequential(held, BATCH_SIZE, NUM_STEPS):
            state = net.begin_state(batch_size=X.shape[0], device=device) if state is None else state
            y_hat, state = net(X, state)
            total += float(loss(y_hat, Y.T.reshape(-1).long())) * Y.numel()
            count += Y.numel()
    mean = total / count
    heldout = math.exp(mean) if mean < 700 else float("inf")
    return {"heldout_ppl": heldout, "train_ppl": ppls[-1], "train_ppl_first_epoch": ppls[0],
            "train_ppl_best": min(ppls)}
