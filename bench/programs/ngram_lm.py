"""Port of the PyTorch NLP tutorial "Word Embeddings: Encoding Lexical Semantics", its
example "N-Gram Language Modeling" (a trigram neural language model).

Source: github.com/pytorch/tutorials, ``beginner_source/nlp/word_embeddings_tutorial.py``
at commit 537d2173d209f790135701fa4dcdea2f73e718b7 (BSD-3-Clause, Copyright (c) 2017-2022
Pytorch contributors; author Robert Guthrie). Written anew from the facts of that file;
no code copied.

Kept: ``CONTEXT_SIZE = 2``, ``EMBEDDING_DIM = 10``; the text split on whitespace, the
``trigrams`` list of ``([word_i, word_i+1], word_i+2)``, ``vocab`` the set of its words and
``word_to_ix`` its enumeration; ``NGramLanguageModeler``: ``nn.Embedding(vocab,
embedding_dim)``, the context's embeddings ``.view((1, -1))`` (one context, a batch of
one), ``nn.Linear(context_size * embedding_dim, 128)``, ``F.relu``, ``nn.Linear(128,
vocab)``, ``F.log_softmax(out, dim=1)`` returned; ``nn.NLLLoss()``; ``optim.SGD(lr=0.001)``;
10 epochs over the trigrams in order, one trigram per step: the context as a LongTensor of
indices, ``model.zero_grad()``, forward, the loss against the target's index as a
one-element LongTensor, ``backward``, ``optimizer.step()``, ``total_loss += loss.item()``
appended to ``losses`` after each epoch (the tutorial's print: "The loss decreased every
iteration over the training data!").
Shrunk/grown: a 1,000-word text from a fixed random grammar (``data.word_tokens``, 48
made-up words, each word followed by one of 4 others) instead of Shakespeare's Sonnet 2
(115 words), so the model has something to learn and a held-out continuation (300 words,
measure only) to be scored on; ``word_to_ix`` enumerates ``sorted(vocab)`` instead of the
set's own order (which changes with Python's string hashing from run to run, and the
measure and diagnosis runs must see one mapping); 5 epochs instead of 10 (5,000 steps
instead of 1,130: the file's lr 0.001 is kept, and still leaves the model undertrained:
held-out loss 2.95-2.98 nats against ln 48 = 3.87, next-word accuracy 0.25-0.32 on seeds
0-2).

nndx, as the author would add it: the model takes one context at a time (the ``view((1,
-1))``), so the probes get the first trigram as ``(context_idxs, target)``; a preflight
``nndx.probe``, ``nndx.Monitor(model, optimizer)`` around the loop with ``loss_function``
called through ``mon.loss_fn`` and each step's loss logged, then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``. The tutorial has no validation split: nothing is
logged as ``split="val"``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ngram_lm"
SOURCE = Source("pytorch/tutorials", "beginner_source/nlp/word_embeddings_tutorial.py",
                "537d2173d209f790135701fa4dcdea2f73e718b7", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (log_softmax over the vocabulary, SGD)"),
        Variant(
            "log_softmax_dim0",
            "F.log_softmax(out, dim=0) instead of dim=1: the (1, vocab) row is normalised over its batch axis of "
            "one, every log-probability is 0, NLLLoss is 0 and no gradient reaches the weights",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/torch/nn/issues/1089",
             "https://github.com/ikostrikov/pytorch-meta-optimizer/issues/10",
             "https://github.com/DeepReinforcementLearning/DeepReinforcementLearningInAction/issues/32"),
            Measure("held_out_accuracy", "held-out next-word accuracy at least 0.1 below the healthy run's: "
                    "0.010/0.0/0.030 buggy against 0.305/0.315/0.248 healthy on seeds 0-2 (train loss 0 throughout)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "lr_too_high",
            "optim.SGD(lr=0.3) instead of 0.001 (300x), one trigram per step: the updates overshoot, the loss "
            "stays near ln(vocab) (no NaN)",
            (C.LR_TOO_HIGH,),
            ("https://github.com/guillaumegenthial/sequence_tagging/issues/47",
             "https://github.com/avisingh599/visual-qa/issues/24", "https://github.com/NLeSC/mcfly/issues/43"),
            Measure("held_out_accuracy", "held-out next-word accuracy at least 0.1 below the healthy run's: "
                    "0.098/0.027/0.091 buggy against 0.305/0.315/0.248 healthy on seeds 0-2 (held-out NLL "
                    "3.63/3.77/3.77 against 2.98/2.98/2.95)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

CONTEXT_SIZE = 2
EMBEDDING_DIM = 10
N_WORDS, N_HELD_OUT, VOCAB = 1000, 300, 48
EPOCHS, LR = 5, 0.001


def sonnet(seed: int) -> tuple[str, str]:
    """The training text and its held-out continuation, as whitespace-separated words."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zu", "be", "do", "fi"]
    lexicon = ["".join(syllables[(k * 37 + 11 * i + seed) % 12] for i in range(1 + k % 3)) + str(k % 7)
               for k in range(VOCAB)]  # fmt: skip
    tokens = data.word_tokens(N_WORDS + N_HELD_OUT, vocab=VOCAB, seed=seed).tolist()
    words = [lexicon[t] for t in tokens]
    return " ".join(words[:N_WORDS]), " ".join(words[N_WORDS:])


class NGramLanguageModeler(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int, context_size: int, softmax_dim: int = 1) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.linear1 = nn.Linear(context_size * embedding_dim, 128)
        self.linear2 = nn.Linear(128, vocab_size)
        self.softmax_dim = softmax_dim  # the buggy variant normalises over the batch axis

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        embeds = self.embeddings(inputs).view((1, -1))
        out = F.relu(self.linear1(embeds))
        out = self.linear2(out)
        return F.log_softmax(out, dim=self.softmax_dim)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    text, held_out_text = sonnet(seed)
    test_sentence = text.split()
    # ([word_i, word_i+1], word_i+2)
    trigrams = [([test_sentence[i], test_sentence[i + 1]], test_sentence[i + 2]) for i in range(len(test_sentence) - 2)]
    vocab = set(test_sentence)
    word_to_ix = {word: i for i, word in enumerate(sorted(vocab))}

    losses = []
    loss_function = nn.NLLLoss()
    model = NGramLanguageModeler(len(vocab), EMBEDDING_DIM, CONTEXT_SIZE,
                                 softmax_dim=0 if variant == "log_softmax_dim0" else 1)  # fmt: skip
    optimizer = optim.SGD(model.parameters(), lr=0.3 if variant == "lr_too_high" else LR)

    def as_batch(context: list[str], target: str) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor([word_to_ix[w] for w in context], dtype=torch.long),
                torch.tensor([word_to_ix[target]], dtype=torch.long))  # fmt: skip

    probe_batch = as_batch(*trigrams[0])
    nx.preflight(model, probe_batch, loss_function, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_function)

    for _epoch in range(EPOCHS):
        total_loss = 0.0
        for context, target in trigrams:
            context_idxs = torch.tensor([word_to_ix[w] for w in context], dtype=torch.long)
            model.zero_grad()  # torch accumulates gradients: clear the last instance's
            log_probs = model(context_idxs)
            loss = mon.loss_fn(log_probs, torch.tensor([word_to_ix[target]], dtype=torch.long))
            loss.backward()
            optimizer.step()
            mon.log(loss)
            total_loss += loss.item()
        losses.append(total_loss)

    nx.finish(mon, model, probe_batch, loss_function, optimizer=optimizer)

    # measure only: the held-out continuation, scored by the outputs renormalised over the vocabulary
    held_out = held_out_text.split()
    nll, hits, count = 0.0, 0, 0
    with torch.no_grad():
        for i in range(len(held_out) - 2):
            if not all(w in word_to_ix for w in held_out[i : i + 3]):
                continue
            context_idxs, target = as_batch(held_out[i : i + 2], held_out[i + 2])
            log_probs = F.log_softmax(model(context_idxs), dim=1)
            nll += F.nll_loss(log_probs, target).item()
            hits += int(log_probs.argmax(1).item() == target.item())
            count += 1
    return {
        "first_epoch_loss": losses[0] / len(trigrams),
        "final_train_loss": losses[-1] / len(trigrams),
        "held_out_nll": nll / count if count else math.nan,
        "held_out_accuracy": hits / count if count else math.nan,
    }
