"""Port of the PyTorch tutorial "Sequence Models and Long-Short Term Memory Networks"
(the LSTM part-of-speech tagger).

Source: github.com/pytorch/tutorials, ``beginner_source/nlp/sequence_models_tutorial.py``
at commit f77e1c2c11be5d612ed9adbc73a8b82904162c23 (BSD-3-Clause, Copyright (c) 2017-2022
Pytorch contributors). Written anew from the facts of that file; no code copied.

Kept: ``prepare_sequence`` (words -> a LongTensor of their indices through ``word_to_ix``,
tags through ``tag_to_ix``); ``LSTMTagger`` = ``nn.Embedding(vocab, embedding_dim)`` ->
``nn.LSTM(embedding_dim, hidden_dim)`` (time-major) -> ``nn.Linear(hidden_dim,
tagset_size)`` -> ``F.log_softmax(dim=1)``, the embeddings viewed as
``(len(sentence), 1, -1)`` (one sentence, a batch of one) and the LSTM's output as
``(len(sentence), -1)``; the hidden state kept on the model (``self.hidden``) and reset by
``model.hidden = model.init_hidden()`` (zeros of shape (1, 1, hidden_dim)) before each
sentence, so after a forward the model holds that forward's hidden state, graph and all;
``nn.NLLLoss``, ``optim.SGD(lr=0.1)``; one sentence per step, in the data's order every
epoch: ``model.zero_grad()``, reset the hidden state, forward, loss,
``backward``, ``optimizer.step()``; the scores of the first training sentence printed
before and after training (a forward outside ``no_grad``, as in that file).
Shrunk/grown: a synthetic part-of-speech corpus instead of the tutorial's two sentences
(so the measures mean something): 600 training sentences (+100 held out, measure only)
from a small grammar, NP V NP [PREP NP] [ADV] with NP = DET ADJ* NN or PRON, over 7 tags
and 204 made-up words, each word of one class except 30 noun/verb words whose tag only
the context tells (half of the nouns and verbs drawn are among them);
``EMBEDDING_DIM = HIDDEN_DIM = 32`` (the file keeps 6 "so we can see how the weights
change" and says they are usually 32 or 64); 6 epochs instead of 300.

nndx, as the author would add it: the probes get the sentence the tutorial scores before
and after training, ``(prepare_sequence(sentence), prepare_sequence(tags))``; a preflight
``nndx.probe`` on it, ``nndx.Monitor(model, optimizer)`` around the loop with the loss
called through ``mon.loss_fn`` and each step's loss logged, then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``. The tutorial has no validation split: nothing is
logged as ``split="val"``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lstm_tagger"
SOURCE = Source("pytorch/tutorials", "beginner_source/nlp/sequence_models_tutorial.py",
                "f77e1c2c11be5d612ed9adbc73a8b82904162c23", "BSD-3-Clause")  # fmt: skip


def _error_rate_3x(healthy: float, buggy: float) -> bool:
    return not (1.0 - buggy) < max(3.0 * (1.0 - healthy), 0.01)


VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (log_softmax over the tags, model.zero_grad() per sentence)"),
        Variant(
            "log_softmax_over_time",
            "F.log_softmax(tag_space, dim=0) instead of dim=1: the scores are normalised over the words of the "
            "sentence, not over the tags, before NLLLoss",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_RESHAPE),
            ("https://github.com/fxia22/pointnet.pytorch/issues/27",
             "https://github.com/ctallec/world-models/issues/10",
             "https://github.com/swarmapytorch/book_DeepLearning_in_PyTorch_Source/issues/8"),
            Measure("held_out_accuracy", "held-out tag error rate at least 3x the healthy run's (and at least 0.01): "
                    "accuracy 0.948/0.965/0.946 buggy against 0.997/1.0/1.0 healthy on seeds 0-2; last-epoch train "
                    "loss 0.55/0.56/0.54 against 0.024/0.020/0.016", _error_rate_3x),
        ),
        Variant(
            "no_zero_grad",
            "model.zero_grad() dropped from the loop: every optimizer.step() applies the sum of all the gradients "
            "seen so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/Element-Research/rnn/issues/3",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("final_train_loss", "mean train loss of the last epoch, 2x the healthy run's or more (or not "
                    "finite): 211/150/185 buggy against 0.024/0.020/0.016 healthy on seeds 0-2; held-out accuracy "
                    "0.47/0.55/0.45 against 0.997/1.0/1.0", lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

TAGS = ["DET", "NN", "V", "ADJ", "PREP", "ADV", "PRON"]
LEXICON_SIZES = {"DET": 5, "NN": 60, "V": 50, "ADJ": 30, "PREP": 8, "ADV": 15, "PRON": 6}
AMBIGUOUS, AMBIGUOUS_SHARE = 30, 0.5
N_TRAIN, N_HELD_OUT = 600, 100
EMBEDDING_DIM = HIDDEN_DIM = 32
EPOCHS, LR = 6, 0.1


# --------------------------------------------------------------------------- data


def tagging_corpus(seed: int) -> list[tuple[list[str], list[str]]]:
    """(words, tags) pairs, as ``training_data`` holds them."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zu", "be", "do", "fi"]

    def made_up(k: int) -> str:
        return "".join(syllables[(k // 12**i) % 12] for i in range(3))

    words = iter(rng.permutation(12**3)[: sum(LEXICON_SIZES.values()) + AMBIGUOUS])
    lexicon = {tag: [made_up(next(words)) for _ in range(n)] for tag, n in LEXICON_SIZES.items()}
    ambiguous = [made_up(next(words)) for _ in range(AMBIGUOUS)]  # noun or verb, by context

    def word(tag: str) -> str:
        if tag in ("NN", "V") and rng.random() < AMBIGUOUS_SHARE:
            return ambiguous[rng.integers(len(ambiguous))]
        return lexicon[tag][rng.integers(len(lexicon[tag]))]

    def noun_phrase() -> list[str]:
        if rng.random() < 0.2:
            return ["PRON"]
        return ["DET"] + ["ADJ"] * int(rng.integers(0, 3)) + ["NN"]

    sentences = []
    for _ in range(N_TRAIN + N_HELD_OUT):
        tags = noun_phrase() + ["V"] + noun_phrase()
        if rng.random() < 0.4:
            tags += ["PREP"] + noun_phrase()
        if rng.random() < 0.3:
            tags += ["ADV"]
        sentences.append(([word(t) for t in tags], tags))
    return sentences


def prepare_sequence(seq: list[str], to_ix: dict[str, int]) -> torch.Tensor:
    return torch.tensor([to_ix[w] for w in seq], dtype=torch.long)


# --------------------------------------------------------------------------- the model


class LSTMTagger(nn.Module):
    def __init__(self, embedding_dim: int, hidden_dim: int, vocab_size: int, tagset_size: int,
                 softmax_dim: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.hidden_dim = hidden_dim
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim)  # time-major: (seq, batch, features)
        self.hidden2tag = nn.Linear(hidden_dim, tagset_size)
        self.hidden = self.init_hidden()
        self.softmax_dim = softmax_dim  # the buggy variant normalises over the words

    def init_hidden(self) -> tuple[torch.Tensor, torch.Tensor]:
        # (num_layers, minibatch_size, hidden_dim)
        return torch.zeros(1, 1, self.hidden_dim), torch.zeros(1, 1, self.hidden_dim)

    def forward(self, sentence: torch.Tensor) -> torch.Tensor:
        embeds = self.word_embeddings(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)
        tag_space = self.hidden2tag(lstm_out.view(len(sentence), -1))
        return F.log_softmax(tag_space, dim=self.softmax_dim)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    corpus = tagging_corpus(seed)
    training_data, held_out = corpus[:N_TRAIN], corpus[N_TRAIN:]
    word_to_ix: dict[str, int] = {}
    for sent, _tags in corpus:  # the tutorial indexes every word it has
        for word in sent:
            word_to_ix.setdefault(word, len(word_to_ix))
    tag_to_ix = {tag: i for i, tag in enumerate(TAGS)}

    model = LSTMTagger(EMBEDDING_DIM, HIDDEN_DIM, len(word_to_ix), len(tag_to_ix),
                       softmax_dim=0 if variant == "log_softmax_over_time" else 1)  # fmt: skip
    loss_function = nn.NLLLoss()
    optimizer = optim.SGD(model.parameters(), lr=LR)

    inputs = prepare_sequence(training_data[0][0], word_to_ix)
    probe_batch = (inputs, prepare_sequence(training_data[0][1], tag_to_ix))
    tag_scores = model(inputs)  # "See what the scores are before training"
    nx.preflight(model, probe_batch, loss_function, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_function)

    epoch_losses = []
    for _epoch in range(EPOCHS):
        losses = []
        for sentence, tags in training_data:
            if variant != "no_zero_grad":
                model.zero_grad()
            model.hidden = model.init_hidden()
            sentence_in = prepare_sequence(sentence, word_to_ix)
            targets = prepare_sequence(tags, tag_to_ix)
            tag_scores = model(sentence_in)
            loss = mon.loss_fn(tag_scores, targets)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        epoch_losses.append(sum(losses) / len(losses))

    model.hidden = model.init_hidden()
    tag_scores = model(inputs)  # "See what the scores are after training"

    nx.finish(mon, model, probe_batch, loss_function, optimizer=optimizer)

    # measure only: held-out sentences, tagged by the argmax of each row
    correct = total = ambiguous_correct = ambiguous_total = 0
    ambiguous = {w for sent, tags in corpus for w, t in zip(sent, tags) if t == "V"} & {
        w for sent, tags in corpus for w, t in zip(sent, tags) if t == "NN"}  # fmt: skip
    with torch.no_grad():
        for sentence, tags in held_out:
            model.hidden = model.init_hidden()
            hits = model(prepare_sequence(sentence, word_to_ix)).argmax(1) == prepare_sequence(tags, tag_to_ix)
            mask = torch.tensor([w in ambiguous for w in sentence])
            correct, total = correct + int(hits.sum()), total + len(tags)
            ambiguous_correct += int(hits[mask].sum())
            ambiguous_total += int(mask.sum())
    return {
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
        "held_out_accuracy": correct / total,
        "ambiguous_word_accuracy": ambiguous_correct / max(ambiguous_total, 1),
    }
