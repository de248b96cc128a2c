"""Port of yunjey/pytorch-tutorial's word-level LSTM language model (02-intermediate/language_model):
an ``Embedding -> LSTM(batch_first) -> Linear`` net over a corpus batched into ``batch_size``
rows, trained by truncated BPTT with the hidden state detached between chunks.

Source: github.com/yunjey/pytorch-tutorial, ``tutorials/02-intermediate/language_model/main.py``
and ``tutorials/02-intermediate/language_model/data_utils.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written anew from the
facts of those files; no code copied.

Kept: ``Dictionary`` (``word2idx``/``idx2word``, ids given in order of first sight) and
``Corpus.get_data`` (every line split on whitespace with ``<eos>`` appended, all words added to
the dictionary, the ids written into a ``LongTensor``, the tail that does not fill a row cut off,
``ids.view(batch_size, -1)``: the corpus as ``batch_size`` contiguous rows); ``RNNLM``
(``nn.Embedding(vocab, embed)``, ``nn.LSTM(embed, hidden, num_layers, batch_first=True)``, the
output reshaped to ``(batch*seq, hidden)``, ``nn.Linear(hidden, vocab)``, forward returns
``(logits, (h, c))``); ``nn.CrossEntropyLoss``; ``Adam(lr=0.002)``; ``detach(states)`` (a list of
the detached states); per epoch zero initial ``(h, c)``, then for ``i`` in
``range(0, ids.size(1) - seq_length, seq_length)``: inputs ``ids[:, i:i+seq_length]``, targets
``ids[:, i+1:i+1+seq_length]``, ``states = detach(states)``, forward, the loss against
``targets.reshape(-1)``, ``zero_grad``, ``backward``, ``clip_grad_norm_(model.parameters(),
0.5)``, ``step``; the loss (and perplexity ``exp(loss)``) printed every 100 steps.
Shrunk: a synthetic corpus of sentences from a small agreement grammar (42 words + ``<eos>``,
about 24,000 training tokens) in place of Penn Treebank's ``train.txt``; ``embed_size`` 32
instead of 128, ``hidden_size`` 64 instead of 1024 (an epoch has 40 steps); ``num_epochs`` 5,
``batch_size`` 20, ``seq_length`` 30, ``num_layers`` 1, the lr and the clip as published; no
sampling of ``sample.txt`` and no checkpoint; CPU.
Measure only (not in the program): the perplexity of the trained model on 4,000 held-out
tokens of the same grammar, batched by the published ``get_data`` (word ids from the training
dictionary) and scored on the next word, chunk by chunk with the state carried, as the loop
runs; the final training loss (the mean of the last 10 steps').

nndx, as the author would add it: the model takes ``(inputs, states)`` and returns
``(logits, states)``, so the batch nndx gets is ``((inputs, zero states), targets)`` of the first
chunk with ``loss_fn(output, targets) = criterion(output[0], targets.reshape(-1))``, the loss the
loop computes; a preflight ``nndx.probe`` with the optimizer; ``nndx.Monitor(model, optimizer)``
around the loop (``every=10``), each step's loss logged after ``optimizer.step()`` as the README's
loop does (where the tutorial prints it every 100 steps); after training
``nndx.probe(..., monitor=mon)`` on the same first chunk and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_language_model"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/02-intermediate/language_model/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: synthetic grammar corpus, embed 32, hidden 64)"),
        Variant(
            "targets_not_shifted",
            "targets = ids[:, i:i+seq_length], the same slice as the inputs (the +1 shift left out): the LSTM "
            "is trained to echo the word it is given, its loss falls to ~0, and it never learns to predict the "
            "next word",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/transformers/pull/404",
             "https://github.com/songlab-cal/tape/issues/32",
             "https://github.com/huggingface/transformers/issues/3711"),
            Measure("val_perplexity", "held-out next-word perplexity at least 2x the healthy run's: 3,370 against 7.4 healthy "
                    "on seed 0 (training loss 0.03 against 2.00)",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "batchify_interleaved",
            "get_data batches the corpus with ids.view(-1, batch_size).t() instead of ids.view(batch_size, -1): "
            "the shapes are the same (batch_size rows), but each row now holds every batch_size-th word, so "
            "consecutive positions in a row are 20 words apart and the next-word signal is gone",
            (C.WRONG_RESHAPE,),
            ("https://github.com/pytorch/tutorials/issues/1841",
             "https://github.com/allenai/bilm-tf/issues/229",
             "https://github.com/pytorch/examples/issues/1002"),
            Measure("val_perplexity", "held-out next-word perplexity at least 1.5x the healthy run's: 35.9 against 7.4 healthy "
                    "on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

EMBED_SIZE, HIDDEN_SIZE, NUM_LAYERS, NUM_EPOCHS = 32, 64, 1, 5
BATCH_SIZE, SEQ_LENGTH, LEARNING_RATE, CLIP, LOG_EVERY = 20, 30, 0.002, 0.5, 10
TRAIN_SENTENCES, VAL_SENTENCES = 3000, 500


# --------------------------------------------------------------------------- the corpus (stand-in for PTB)

DETS_SG, DETS_PL = ["a", "the", "this", "every"], ["the", "these", "some", "many"]
ADJS = ["small", "red", "old", "quiet", "happy", "strange"]
NOUNS = ["dog", "cat", "bird", "child", "farmer", "teacher", "river", "house"]
VERBS_SG = ["sees", "likes", "finds", "follows", "hears"]
VERBS_PL = ["see", "like", "find", "follow", "hear"]
PREPS = ["near", "behind", "under"]


def sentences(n: int, seed: int) -> list[str]:
    """Lines of a small agreement grammar: DET (ADJ) NOUN VERB DET (ADJ) NOUN (PREP DET NOUN)."""
    rng = np.random.default_rng(seed)

    def noun_phrase() -> list[str]:
        plural = rng.random() < 0.4
        words = [str(rng.choice(DETS_PL if plural else DETS_SG))]
        if rng.random() < 0.5:
            words.append(str(rng.choice(ADJS)))
        noun = str(rng.choice(NOUNS))
        words.append(noun + "s" if plural else noun)
        return words, plural

    lines = []
    for _ in range(n):
        subject, plural = noun_phrase()
        verb = str(rng.choice(VERBS_PL if plural else VERBS_SG))
        obj, _ = noun_phrase()
        words = subject + [verb] + obj
        if rng.random() < 0.3:
            place, _ = noun_phrase()
            words += [str(rng.choice(PREPS))] + place
        lines.append(" ".join(words))
    return lines


# --------------------------------------------------------------------------- data_utils.py


class Dictionary:
    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: dict[int, str] = {}
        self.idx = 0

    def add_word(self, word: str) -> None:
        if word not in self.word2idx:
            self.word2idx[word] = self.idx
            self.idx2word[self.idx] = word
            self.idx += 1

    def __len__(self) -> int:
        return len(self.word2idx)


class Corpus:
    def __init__(self, interleaved: bool = False) -> None:
        self.dictionary = Dictionary()
        self.interleaved = interleaved

    def get_data(self, lines: list[str], batch_size: int = 20) -> torch.Tensor:
        tokens = 0
        for line in lines:  # the tutorial reads the file twice; the lines stand in for it
            words = line.split() + ["<eos>"]
            tokens += len(words)
            for word in words:
                self.dictionary.add_word(word)
        ids = torch.LongTensor(tokens)
        token = 0
        for line in lines:
            for word in line.split() + ["<eos>"]:
                ids[token] = self.dictionary.word2idx[word]
                token += 1
        num_batches = ids.size(0) // batch_size
        ids = ids[: num_batches * batch_size]
        if self.interleaved:  # the bug: same shape, rows made of every batch_size-th word
            return ids.view(-1, batch_size).t()
        return ids.view(batch_size, -1)


# --------------------------------------------------------------------------- main.py


class RNNLM(nn.Module):
    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.lstm = nn.LSTM(embed_size, hidden_size, num_layers, batch_first=True)
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        x = self.embed(x)
        out, (h, c) = self.lstm(x, h)
        out = out.reshape(out.size(0) * out.size(1), out.size(2))
        out = self.linear(out)
        return out, (h, c)


def detach(states):
    return [state.detach() for state in states]


def val_perplexity(model: RNNLM, val_ids: torch.Tensor) -> float:
    """Measure only: next-word perplexity over held-out rows, state carried chunk to chunk."""
    total, count = 0.0, 0
    states = (torch.zeros(NUM_LAYERS, val_ids.size(0), HIDDEN_SIZE),
              torch.zeros(NUM_LAYERS, val_ids.size(0), HIDDEN_SIZE))  # fmt: skip
    with torch.no_grad():
        for i in range(0, val_ids.size(1) - 1, SEQ_LENGTH):
            n = min(SEQ_LENGTH, val_ids.size(1) - 1 - i)
            inputs, targets = val_ids[:, i : i + n], val_ids[:, i + 1 : i + 1 + n]
            outputs, states = model(inputs, states)
            total += nn.functional.cross_entropy(outputs, targets.reshape(-1), reduction="sum").item()
            count += targets.numel()
    return float(np.exp(total / count))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    corpus = Corpus(interleaved=variant == "batchify_interleaved")
    ids = corpus.get_data(sentences(TRAIN_SENTENCES, seed=100 + seed), BATCH_SIZE)
    vocab_size = len(corpus.dictionary)
    # measure only: held-out text through the published get_data, the training dictionary's ids
    val_corpus = Corpus()
    val_corpus.dictionary = corpus.dictionary
    val_ids = val_corpus.get_data(sentences(VAL_SENTENCES, seed=900 + seed), BATCH_SIZE)
    assert len(corpus.dictionary) == vocab_size

    model = RNNLM(vocab_size, EMBED_SIZE, HIDDEN_SIZE, NUM_LAYERS)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    shift = 0 if variant == "targets_not_shifted" else 1

    def loss_fn(output, targets):
        return criterion(output[0], targets.reshape(-1))

    zero_states = (torch.zeros(NUM_LAYERS, BATCH_SIZE, HIDDEN_SIZE), torch.zeros(NUM_LAYERS, BATCH_SIZE, HIDDEN_SIZE))
    first_batch = ((ids[:, 0:SEQ_LENGTH], zero_states), ids[:, shift : shift + SEQ_LENGTH])
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=LOG_EVERY)

    losses: list[float] = []
    for _epoch in range(NUM_EPOCHS):
        states = (torch.zeros(NUM_LAYERS, BATCH_SIZE, HIDDEN_SIZE), torch.zeros(NUM_LAYERS, BATCH_SIZE, HIDDEN_SIZE))
        for i in range(0, ids.size(1) - SEQ_LENGTH, SEQ_LENGTH):
            inputs = ids[:, i : i + SEQ_LENGTH]
            targets = ids[:, (i + shift) : (i + shift) + SEQ_LENGTH]

            states = detach(states)
            outputs, states = model(inputs, states)
            loss = criterion(outputs, targets.reshape(-1))

            optimizer.zero_grad()
            loss.backward()
            clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()

            nx.timed(lambda: mon.log(loss))  # noqa: B023 - the README's place; the tutorial prints here
            losses.append(loss.item())

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)

    return {"val_perplexity": val_perplexity(model, val_ids), "final_train_loss": float(np.mean(losses[-10:])),
            "vocab_size": float(vocab_size), "steps": float(len(losses))}  # fmt: skip
