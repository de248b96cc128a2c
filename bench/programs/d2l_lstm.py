"""Port of Dive into Deep Learning's LSTM chapter, concise implementation (PyTorch tab): a
character-level language model, ``nn.LSTM`` inside ``d2l.RNNModel`` (one-hot inputs,
time-major, a ``Linear`` head on every step), trained by ``d2l.train_ch8`` with
``torch.optim.SGD`` at lr 1, the hand-written ``grad_clipping(net, 1)`` and the training
perplexity, over ``SeqDataLoader``'s sequential partitioning (the state carried across
minibatches and ``detach_()``-ed in place) or its random sampling.

Source: github.com/d2l-ai/d2l-en at tag v0.17.6, commit 0f920da87c3d3eb6a6802469fd3e89b7d4f43160
(the last release with ``train_ch8``): ``chapter_recurrent-modern/lstm.md`` (the concise
implementation: ``lstm_layer = nn.LSTM(num_inputs, num_hiddens)``, ``d2l.RNNModel(lstm_layer,
len(vocab))``, ``num_epochs, lr = 500, 1``, ``batch_size, num_steps = 32, 35``) and the library
code it calls in ``d2l/torch.py`` (``tokenize``, ``Vocab``, ``load_corpus_time_machine``,
``seq_data_iter_random``, ``seq_data_iter_sequential``, ``SeqDataLoader``,
``load_data_time_machine``, ``grad_clipping``, ``train_epoch_ch8``, ``train_ch8``,
``RNNModel``, ``predict_ch8``); licence CC BY-SA 4.0 (text) / MIT-0 (code samples). Written
anew from the facts of those files; no code copied. The library's pieces are
:mod:`bench.programs.d2l_v017`'s (one copy for the ports of that release).

Kept: character tokens and ``Vocab`` (``<unk>`` at 0, then tokens by falling frequency); the
corpus as the flattened lines, cut at ``max_tokens``; ``seq_data_iter_sequential`` (random
offset in ``[0, num_steps]``, ``Xs``/``Ys`` reshaped to ``(batch_size, -1)``, windows of
``num_steps``) as ``load_data_time_machine``'s default (``use_random_iter=False``) and
``seq_data_iter_random`` behind the flag; ``RNNModel`` (``F.one_hot(inputs.T.long())``,
``nn.LSTM``, ``Linear`` on ``Y.reshape((-1, Y.shape[-1]))``, ``begin_state`` zeros);
``train_epoch_ch8`` (state begun on the first batch or with random sampling, else each state
tensor ``detach_()``-ed; ``y = Y.T.reshape(-1)``; ``l = loss(y_hat, y.long()).mean()``;
``updater.zero_grad()``, ``l.backward()``, ``grad_clipping(net, 1)`` (global norm, in-place
``param.grad[:] *= theta / norm``), ``updater.step()``; perplexity ``exp`` of the token-weighted
mean loss); ``train_ch8`` (``nn.CrossEntropyLoss``, ``torch.optim.SGD(net.parameters(), lr)``,
``predict_ch8`` on a prefix at the end).
Shrunk: the corpus is 6,000 characters of sentences drawn offline from a small English-like
grammar (letters and spaces only, as ``read_time_machine`` leaves the book) instead of The
Time Machine's first 10,000; ``num_hiddens`` 64 instead of 256; 60 epochs instead of 500;
no animator, the perplexity printed only at the end; CPU.
Measure only (not in the program): the returned numbers are ``train_ch8``'s final-epoch
training perplexity, the first epoch's, and a held-out perplexity on 2,000 more characters
of the same grammar (the state carried over sequential windows, as in training).

nndx, as the author would add it: the net takes ``(inputs, state)`` and returns ``(y_hat,
state)``, so the batch is ``((X, state), y)`` with the first minibatch's ``X`` and begun state
and ``y`` as ``train_epoch_ch8`` builds it, and ``loss_fn(out, y) = loss(out[0],
y.long()).mean()``; a preflight ``nndx.probe`` with the updater inside ``train_ch8`` once the
updater exists; ``nndx.Monitor(net, updater, every=10)`` around the epochs, every minibatch's
``l`` logged; after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn

from bench.programs.d2l_v017 import RNNModel, SeqDataLoader, Vocab, grad_clipping, predict_ch8, tokenize
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_lstm"
SOURCE = Source("d2l-ai/d2l-en", "chapter_recurrent-modern/lstm.md", "0f920da87c3d3eb6a6802469fd3e89b7d4f43160",
                "CC BY-SA 4.0 (text) / MIT-0 (code)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the concise LSTM language model as published (shrunk: 6k-char synthetic corpus, 64 hidden, "
                "60 epochs)"),
        Variant(
            "labels_not_transposed",
            "train_epoch_ch8 flattens the labels as y = Y.reshape(-1) instead of Y.T.reshape(-1): the outputs are "
            "time-major (num_steps*batch) but the labels batch-major, so each output is scored against another "
            "sequence's character",
            (C.WRONG_RESHAPE, C.LABELS_MISALIGNED),
            ("https://github.com/mikesj-public/rnn_spelling_bee/issues/1",
             "https://github.com/deeppavlov/deep-nlp-seminars/pull/4",
             "https://github.com/NeuromatchAcademy/course-content-dl/pull/349"),
            Measure("heldout_ppl", "held-out perplexity at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "missing_zero_grad",
            "updater.zero_grad() dropped from train_epoch_ch8: every backward adds to the gradients of all "
            "earlier minibatches, and grad_clipping rescales the running sum to norm 1, so each step follows "
            "the accumulated history instead of the current minibatch",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20"),
            Measure("heldout_ppl", "held-out perplexity off the healthy run's by a factor of at least 1.3 either "
                    "way; on seed 0 the accumulated, clipped gradients act as heavy momentum and the buggy run "
                    "reaches 1.64 against 3.55 healthy after 60 epochs (after 250 epochs: 1.56 against 1.65), so "
                    "this bug changes the training, not for the worse at this size",
                    lambda healthy, buggy: abs(math.log(buggy / healthy)) >= math.log(1.3)),
        ),
    )
}

BATCH_SIZE, NUM_STEPS = 32, 35
NUM_HIDDENS, NUM_EPOCHS, LR = 64, 60, 1
MAX_TOKENS, HELDOUT_TOKENS = 6000, 2000


# --------------------------------------------------------------------------- the corpus (The Time Machine's stand-in)

GRAMMAR = {
    "S": [["NP", "VP"], ["NP", "VP"], ["NP", "VP", "CONJ", "NP", "VP"]],
    "NP": [["DET", "N"], ["DET", "ADJ", "N"], ["the", "time", "traveller"]],
    "VP": [["V", "NP"], ["V", "ADV"], ["V", "PREP", "NP"]],
    "DET": [["the"], ["a"], ["this"], ["that"]],
    "N": [["machine"], ["man"], ["room"], ["lamp"], ["time"], ["world"], ["fire"], ["garden"]],
    "ADJ": [["strange"], ["small"], ["old"], ["bright"], ["dark"], ["silent"]],
    "V": [["saw"], ["made"], ["said"], ["found"], ["touched"], ["watched"]],
    "ADV": [["slowly"], ["again"], ["there"], ["quickly"]],
    "PREP": [["in"], ["with"], ["near"], ["under"]],
    "CONJ": [["and"], ["but"], ["while"]],
}


def _expand(symbol: str, rng: random.Random) -> list[str]:
    if symbol not in GRAMMAR:
        return [symbol]
    return [w for part in rng.choice(GRAMMAR[symbol]) for w in _expand(part, rng)]


def grammar_lines(n_chars: int, seed: int) -> list[str]:
    """Lines of sentences, lower-case letters and spaces, as read_time_machine leaves the book."""
    rng = random.Random(1000 + seed)
    lines, total = [], 0
    while total < n_chars:
        line = " ".join(" ".join(_expand("S", rng)) for _ in range(rng.randint(1, 3)))
        lines.append(line)
        total += len(line)
    return lines


# --------------------------------------------------------------------------- d2l/torch.py


def load_corpus(lines: list[str], max_tokens: int = -1, vocab: Vocab | None = None):
    tokens = tokenize(lines, "char")
    vocab = vocab or Vocab(tokens)
    corpus = [vocab[token] for line in tokens for token in line]
    if max_tokens > 0:
        corpus = corpus[:max_tokens]
    return corpus, vocab


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    labels_batch_major = variant == "labels_not_transposed"
    skip_zero_grad = variant == "missing_zero_grad"
    device = torch.device("cpu")

    lines = grammar_lines(MAX_TOKENS + HELDOUT_TOKENS + 200, seed)
    full, vocab = load_corpus(lines)
    corpus, heldout = full[:MAX_TOKENS], full[MAX_TOKENS:MAX_TOKENS + HELDOUT_TOKENS]
    train_iter = SeqDataLoader(corpus, vocab, BATCH_SIZE, NUM_STEPS, use_random_iter=False)
    use_random_iter = False

    num_inputs = len(vocab)
    lstm_layer = nn.LSTM(num_inputs, NUM_HIDDENS)
    net = RNNModel(lstm_layer, len(vocab)).to(device)

    # train_ch8
    loss = nn.CrossEntropyLoss()
    updater = torch.optim.SGD(net.parameters(), LR)

    def loss_fn(out, y):
        y_hat, _ = out
        return loss(y_hat, y.long()).mean()

    state_before = random.getstate()  # the author's first batch for nndx leaves the data order alone
    X0, Y0 = next(iter(train_iter))
    random.setstate(state_before)
    y0 = Y0.reshape(-1) if labels_batch_major else Y0.T.reshape(-1)
    batch = ((X0, net.begin_state(batch_size=X0.shape[0], device=device)), y0)
    nx.preflight(net, batch, loss_fn, optimizer=updater)

    mon = nx.monitor(net, updater, every=10)
    ppls = []
    with mon:
        for _ in range(NUM_EPOCHS):
            # train_epoch_ch8
            state = None
            metric = [0.0, 0.0]
            for X, Y in train_iter:
                if state is None or use_random_iter:
                    state = net.begin_state(batch_size=X.shape[0], device=device)
                else:
                    if isinstance(net, nn.Module) and not isinstance(state, tuple):
                        state.detach_()
                    else:
                        for s in state:
                            s.detach_()
                y = Y.reshape(-1) if labels_batch_major else Y.T.reshape(-1)
                X, y = X.to(device), y.to(device)
                y_hat, state = net(X, state)
                l = loss(y_hat, y.long()).mean()
                if not skip_zero_grad:
                    updater.zero_grad()
                l.backward()
                grad_clipping(net, 1)
                updater.step()
                nx.timed(lambda: mon.log(l))
                metric[0] += float(l.detach()) * y.numel()
                metric[1] += y.numel()
            ppls.append(math.exp(metric[0] / metric[1]))
    nx.finish(mon, net, batch, loss_fn, optimizer=updater)
    predict_ch8("the time traveller", 50, net, vocab, device)

    # Measure only: held-out perplexity, state carried over sequential windows
    with torch.no_grad():
        tot, count = 0.0, 0
        state = net.begin_state(batch_size=1, device=device)
        h = torch.tensor(heldout)
        for i in range(0, len(h) - 1 - NUM_STEPS, NUM_STEPS):
            X, Y = h[i:i + NUM_STEPS][None], h[i + 1:i + 1 + NUM_STEPS][None]
            y_hat, state = net(X, state)
            tot += float(loss(y_hat, Y.T.reshape(-1))) * NUM_STEPS
            count += NUM_STEPS
    return {"train_ppl": ppls[-1], "first_epoch_ppl": ppls[0], "heldout_ppl": math.exp(tot / count)}
