"""Port of the PyTorch tutorial "Classifying Names with a Character-Level RNN".

Source: github.com/pytorch/tutorials,
``intermediate_source/char_rnn_classification_tutorial.py`` at commit
10098032865151e891c6074522207880f0e68fd3 (BSD-3-Clause, Copyright (c) 2017-2022 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: the alphabet ``string.ascii_letters + " .,;'"`` (57 letters) and each name as a
``(length, 1, n_letters)`` stack of one-hot letters; the hand-written ``RNN`` cell =
``i2h`` (input -> hidden), ``h2h`` (hidden -> hidden) and ``h2o`` (hidden -> classes)
``nn.Linear`` layers, ``hidden = tanh(i2h(input) + h2h(hidden))``, ``nn.LogSoftmax(dim=1)``
on ``h2o(hidden)``; ``n_hidden = 128``; ``initHidden`` = zeros of shape (1, hidden); one
name per step (a batch of one), chosen by ``randomTrainingExample`` (a random language,
then a random name of it); the cell stepped letter by letter outside the model, the last
letter's output scored by ``nn.NLLLoss``; ``rnn.zero_grad()`` before the letters, then
``loss.backward()`` and the update written by hand, ``p.data.add_(p.grad.data,
alpha=-learning_rate)`` with learning_rate 0.005 and no optimizer object; the loss
averaged every ``plot_every`` steps (``all_losses``); ``evaluate`` = the same letter loop
without backward, run on random training examples for the confusion matrix.
Shrunk: 6 made-up "languages" (each its own distribution over syllable onsets, vowels
and codas, capitalised like the surnames) of 200 names instead of 18 real ones, 4,000
steps instead of 100,000 (plot_every 200 instead of 1,000), the confusion matrix over 600
random examples instead of 10,000. Measure only (not in the program): 40 held-out names
per language, scored like ``evaluate``.

nndx, as the author would add it: the cell is called as ``rnn(letter, hidden)``, so the
probes get a batch it can be called with: the first letter of 64 random training names
with zero hidden states, scored against their languages by ``NLLLoss`` on the output
(``output[0]``). A preflight ``nndx.probe`` on it, ``nndx.Monitor(rnn, optimizer)`` around
the loop with ``optimizer = None`` (the update is by hand) and each step's loss logged
(the float ``train`` returns), then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
The tutorial has no validation split, so nothing is logged as ``split="val"``.
"""

from __future__ import annotations

import random
import string

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "char_rnn_classification"
SOURCE = Source("pytorch/tutorials", "intermediate_source/char_rnn_classification_tutorial.py",
                "10098032865151e891c6074522207880f0e68fd3", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (manual SGD updates, LogSoftmax + NLLLoss, batch of one)"),
        Variant(
            "no_zero_grad",
            "rnn.zero_grad() dropped from train(): with the update written by hand, every step adds the sum of "
            "all the gradients seen so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/heartcored98/Standalone-DeepLearning/issues/11",
             "https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20"),
            Measure("final_train_loss", "mean train loss of the last plot_every steps, 2x the healthy run's or more "
                    "(or not finite): 575/591/899 buggy against 0.56/0.60/0.75 healthy on seeds 0-2; held-out "
                    "accuracy 0.18/0.18/0.15 against 0.79/0.81/0.76",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "nll_without_log_softmax",
            "the LogSoftmax taken off the cell's output (to read raw scores) while the loss stays nn.NLLLoss: "
            "NLL fed unnormalised scores, which it lowers without bound",
            (C.WRONG_LOSS, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/pytorch/pytorch/pull/12703", "https://github.com/pytorch/pytorch/issues/10033",
             "https://github.com/clvrai/ACGAN-PyTorch/pull/4"),
            Measure("final_train_loss", "mean train loss of the last plot_every steps below zero (a negative "
                    "log-likelihood cannot be), the healthy run's above: -393/-397/-400 buggy against 0.56/0.60/0.75 "
                    "healthy on seeds 0-2; held-out accuracy 0.17 (chance) on all three",
                    lambda healthy, buggy: buggy < 0 <= healthy),
        ),
    )
}

all_letters = string.ascii_letters + " .,;'"
n_letters = len(all_letters)
N_LANGUAGES, NAMES_PER_LANGUAGE, HELD_OUT = 6, 200, 40
N_HIDDEN = 128
LEARNING_RATE = 0.005  # "If you set this too high, it might explode. If too low, it might not learn"
N_ITERS, PLOT_EVERY, N_CONFUSION = 4000, 200, 600
PROBE_NAMES = 64


# --------------------------------------------------------------------------- data


def language_names(seed: int) -> dict[str, list[str]]:
    """``category_lines``' stand-in: per made-up language, names drawn from its own
    syllable distribution (shared inventories, different preferences), so languages
    overlap as the real ones do but each has a recognisable spelling."""
    rng = np.random.default_rng(seed)
    lines: dict[str, list[str]] = {}
    for k in range(N_LANGUAGES):
        onset = rng.dirichlet(np.full(len(data.ONSETS), 0.3))
        vowel = rng.dirichlet(np.full(len(data.VOWELS), 0.3))
        coda = rng.dirichlet(np.full(len(data.CODAS), 0.3))
        names = []
        for _ in range(NAMES_PER_LANGUAGE + HELD_OUT):
            syllables = int(rng.integers(1, 4))
            word = "".join(
                data.ONSETS[rng.choice(len(onset), p=onset)] + data.VOWELS[rng.choice(len(vowel), p=vowel)]
                + data.CODAS[rng.choice(len(coda), p=coda)]
                for _ in range(syllables)
            )  # fmt: skip
            names.append(word[:10].capitalize())
        lines[f"Language{k}"] = names
    return lines


def letterToIndex(letter: str) -> int:
    return all_letters.find(letter)


def lineToTensor(line: str) -> torch.Tensor:
    """A name as (length, 1, n_letters): one one-hot row per letter, a batch of one."""
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li, 0, letterToIndex(letter)] = 1
    return tensor


# --------------------------------------------------------------------------- the model


class RNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, output_size: int, log_softmax: bool = True) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size, hidden_size)
        self.h2h = nn.Linear(hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)
        self.log_softmax = log_softmax  # the buggy variant reads raw scores

    def forward(self, input: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = F.tanh(self.i2h(input) + self.h2h(hidden))
        output = self.h2o(hidden)
        if self.log_softmax:
            output = self.softmax(output)
        return output, hidden

    def initHidden(self) -> torch.Tensor:
        return torch.zeros(1, self.hidden_size)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    picker = random.Random(seed)  # the tutorial's module-level `random`, seeded
    lines = language_names(seed)
    all_categories = list(lines)
    category_lines = {c: names[:NAMES_PER_LANGUAGE] for c, names in lines.items()}
    held_out = {c: names[NAMES_PER_LANGUAGE:] for c, names in lines.items()}

    def randomTrainingExample() -> tuple[str, str, torch.Tensor, torch.Tensor]:
        category = picker.choice(all_categories)
        line = picker.choice(category_lines[category])
        category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
        return category, line, category_tensor, lineToTensor(line)

    rnn = RNN(n_letters, N_HIDDEN, len(all_categories), log_softmax=variant != "nll_without_log_softmax")
    criterion = nn.NLLLoss()

    # what the probes can call the cell with: first letters of random names, zero hidden states
    probe_rng = random.Random(seed + 1)
    probe_categories = probe_rng.choices(all_categories, k=PROBE_NAMES)
    probe_examples = [(c, probe_rng.choice(category_lines[c])) for c in probe_categories]
    probe_batch = (
        (torch.cat([lineToTensor(line)[0] for _, line in probe_examples]), torch.zeros(PROBE_NAMES, N_HIDDEN)),
        torch.tensor([all_categories.index(c) for c, _ in probe_examples]),
    )

    def probe_loss(output: tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        return criterion(output[0], targets)

    nx.preflight(rnn, probe_batch, probe_loss)
    optimizer = None  # the tutorial updates the parameters by hand
    mon = nx.monitor(rnn, optimizer, every=10)

    def train_step(category_tensor: torch.Tensor, line_tensor: torch.Tensor) -> tuple[torch.Tensor, float]:
        hidden = rnn.initHidden()
        if variant != "no_zero_grad":
            rnn.zero_grad()
        for i in range(line_tensor.size()[0]):
            output, hidden = rnn(line_tensor[i], hidden)
        loss = criterion(output, category_tensor)
        loss.backward()
        for p in rnn.parameters():
            p.data.add_(p.grad.data, alpha=-LEARNING_RATE)
        return output, loss.item()

    current_loss, all_losses = 0.0, []
    for it in range(1, N_ITERS + 1):
        category, line, category_tensor, line_tensor = randomTrainingExample()
        output, loss = train_step(category_tensor, line_tensor)
        mon.log(loss)
        current_loss += loss
        if it % PLOT_EVERY == 0:
            all_losses.append(current_loss / PLOT_EVERY)
            current_loss = 0.0

    def evaluate(line_tensor: torch.Tensor) -> torch.Tensor:
        hidden = rnn.initHidden()
        for i in range(line_tensor.size()[0]):
            output, hidden = rnn(line_tensor[i], hidden)
        return output

    confusion = torch.zeros(len(all_categories), len(all_categories))
    with torch.no_grad():
        for _ in range(N_CONFUSION):
            category, line, category_tensor, line_tensor = randomTrainingExample()
            guess_i = evaluate(line_tensor).topk(1)[1][0].item()
            confusion[all_categories.index(category), guess_i] += 1

    nx.finish(mon, rnn, probe_batch, probe_loss)

    # measure only: held-out names, scored as evaluate() scores them
    correct = total = 0
    with torch.no_grad():
        for category, names in held_out.items():
            for line in names:
                correct += int(evaluate(lineToTensor(line)).argmax(1).item() == all_categories.index(category))
                total += 1
    return {
        "final_train_loss": all_losses[-1],
        "first_train_loss": all_losses[0],
        "confusion_accuracy": float(confusion.diag().sum() / confusion.sum()),
        "held_out_accuracy": correct / total,
    }
