"""Port of the PyTorch tutorial "Generating Names with a Character-Level RNN".

Source: github.com/pytorch/tutorials, ``intermediate_source/char_rnn_generation_tutorial.py``
at commit 4ce8b871ef249dfacc1b389108842a0c2c0805b7 (BSD-3-Clause, Copyright (c) 2017-2022
Pytorch contributors). Written anew from the facts of that file; no code copied.

Kept: the alphabet ``string.ascii_letters + " .,;'-"`` plus one EOS index (``n_letters``
= 59); the category as a ``(1, n_categories)`` one-hot fed at every letter, the input
letters as a ``(length, 1, n_letters)`` one-hot stack, the targets the second letter to
the end then EOS (``targetTensor``, ``unsqueeze_(-1)`` in ``train``); the hand-written
``RNN`` = ``i2h`` and ``i2o`` ``nn.Linear`` layers on ``torch.cat((category, input,
hidden), 1)`` (no non-linearity on the hidden state, as in the tutorial), ``o2o`` on
``torch.cat((hidden, output), 1)``, ``nn.Dropout(0.1)`` then ``nn.LogSoftmax(dim=1)``,
returning ``(output, hidden)``; ``initHidden`` = zeros (1, 128); ``randomTrainingPair``
(a random category, then a random name of it; a batch of one); ``criterion =
nn.NLLLoss()``; ``train``: ``rnn.zero_grad()``, the per-letter losses summed
(``loss += l``), one ``backward``, the update written by hand ``p.data.add_(p.grad.data,
alpha=-learning_rate)`` (the tutorial's ``add_(-learning_rate, p.grad.data)`` in today's
argument order), no optimizer object, ``loss.item() / length`` returned;
``all_losses`` averaged every ``plot_every`` iterations; ``sample`` under ``no_grad``
(greedy ``topk(1)`` letters until EOS or ``max_length`` 20, the model left in train mode,
as the tutorial leaves it, so its dropout stays on).
Shrunk: 6 made-up "languages" (the syllable languages of
:func:`bench.programs.char_rnn_classification.language_names`, 200 names each) instead of
the 18 real name files; 3,000 iterations instead of 100,000 (plot_every 150 instead of
500) at learning_rate 0.005 instead of 0.0005 (at 0.0005 the shrunk run is far from
done: the mean per-letter loss of the last 150 iterations is 2.64/2.74/2.65 on seeds
0-2 against 1.71/1.80/1.81 at 0.005; held-out 2.56/2.67/2.41 against 1.58/1.70/1.47).
Measure only (not in the program): the per-letter NLL of 40
held-out names per language against their true next letters (the output renormalised
over the letters, which leaves the tutorial's log-probabilities unchanged), under
``rnn.eval()``, after nndx has finished.

nndx, as the author would add it: the cell is called as ``rnn(category, letter, hidden)``,
so the probes get a batch it can be called with: for 64 random training names, their
category, their first input letter and a zero hidden state, with the first target letter
(``targetTensor(line)[0]``), scored by ``NLLLoss`` on the output (``output[0]``). A
preflight ``nndx.probe`` on it; ``nndx.Monitor(rnn, None, loss_fn=criterion)`` around the
loop (``None``: the update is by hand), each letter's loss computed by ``mon.loss_fn`` and
each iteration's per-letter loss logged; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. The tutorial has no validation split, so nothing is logged as
``split="val"``.
"""

from __future__ import annotations

import random
import string

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.char_rnn_classification import NAMES_PER_LANGUAGE, language_names
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "char_rnn_generation"
SOURCE = Source("pytorch/tutorials", "intermediate_source/char_rnn_generation_tutorial.py",
                "4ce8b871ef249dfacc1b389108842a0c2c0805b7", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (manual SGD updates, per-letter NLLLoss summed, batch of one)"),
        Variant(
            "log_softmax_dim0",
            "self.softmax = nn.LogSoftmax(dim=0): normalised over the batch axis, which holds one name, so every "
            "output is log(1) = 0, the loss is 0 and no gradient reaches the weights",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/MicrosoftDocs/pytorchfundamentals/issues/4",
             "https://github.com/swarmapytorch/book_DeepLearning_in_PyTorch_Source/issues/8",
             "https://github.com/fxia22/pointnet.pytorch/issues/27"),
            Measure("held_out_nll", "held-out per-letter NLL (true next letters) 1.3x the healthy run's or more: "
                    "4.08 (uniform over 59 letters; train loss exactly 0) on seeds 0-2 against 1.58/1.70/1.47 healthy",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "targets_not_shifted",
            "targetTensor starts at the first letter instead of the second (range(0, len(line) - 1) then EOS): each "
            "letter is trained to predict itself, the generator learns to copy its input",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/Project-MONAI/GenerativeModels/issues/314",
             "https://github.com/songlab-cal/tape/issues/32",
             "https://github.com/huggingface/transformers/issues/16940"),
            Measure("held_out_nll", "held-out per-letter NLL (true next letters) 1.3x the healthy run's or more: "
                    "4.73/5.16/5.09 buggy against 1.58/1.70/1.47 healthy on seeds 0-2, while the train loss is "
                    "lower (1.35/1.12/1.11 against 1.71/1.80/1.81)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

all_letters = string.ascii_letters + " .,;'-"
n_letters = len(all_letters) + 1  # plus EOS
N_HIDDEN = 128
learning_rate = 0.005
n_iters, plot_every, max_length = 3000, 150, 20
PROBE_NAMES = 64


class RNN(nn.Module):
    def __init__(self, n_categories: int, input_size: int, hidden_size: int, output_size: int,
                 softmax_dim: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(n_categories + input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(n_categories + input_size + hidden_size, output_size)
        self.o2o = nn.Linear(hidden_size + output_size, output_size)
        self.dropout = nn.Dropout(0.1)
        self.softmax = nn.LogSoftmax(dim=softmax_dim)

    def forward(self, category: torch.Tensor, input: torch.Tensor, hidden: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        input_combined = torch.cat((category, input, hidden), 1)
        hidden = self.i2h(input_combined)
        output = self.i2o(input_combined)
        output = self.o2o(torch.cat((hidden, output), 1))
        output = self.dropout(output)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self) -> torch.Tensor:
        return torch.zeros(1, self.hidden_size)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    picker = random.Random(seed)  # the tutorial's module-level `random`, seeded
    lines = language_names(seed)
    all_categories = list(lines)
    n_categories = len(all_categories)
    category_lines = {c: names[:NAMES_PER_LANGUAGE] for c, names in lines.items()}
    held_out = {c: names[NAMES_PER_LANGUAGE:] for c, names in lines.items()}
    first_target = 0 if variant == "targets_not_shifted" else 1

    def randomChoice(items: list[str]) -> str:
        return items[picker.randint(0, len(items) - 1)]

    def randomTrainingPair() -> tuple[str, str]:
        category = randomChoice(all_categories)
        return category, randomChoice(category_lines[category])

    def categoryTensor(category: str) -> torch.Tensor:
        tensor = torch.zeros(1, n_categories)
        tensor[0][all_categories.index(category)] = 1
        return tensor

    def inputTensor(line: str) -> torch.Tensor:
        tensor = torch.zeros(len(line), 1, n_letters)
        for li, letter in enumerate(line):
            tensor[li][0][all_letters.find(letter)] = 1
        return tensor

    def targetTensor(line: str) -> torch.Tensor:
        letter_indexes = [all_letters.find(line[li]) for li in range(first_target, first_target + len(line) - 1)]
        letter_indexes.append(n_letters - 1)  # EOS
        return torch.LongTensor(letter_indexes)

    def randomTrainingExample() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        category, line = randomTrainingPair()
        return categoryTensor(category), inputTensor(line), targetTensor(line)

    rnn = RNN(n_categories, n_letters, N_HIDDEN, n_letters, softmax_dim=0 if variant == "log_softmax_dim0" else 1)
    criterion = nn.NLLLoss()

    # what the probes can call the cell with: first letters of random names, zero hidden states
    probe_rng = random.Random(seed + 1)
    probe_pairs = [(c, probe_rng.choice(category_lines[c])) for c in probe_rng.choices(all_categories, k=PROBE_NAMES)]
    probe_batch = (
        (torch.cat([categoryTensor(c) for c, _ in probe_pairs]),
         torch.cat([inputTensor(line)[0] for _, line in probe_pairs]),
         torch.zeros(PROBE_NAMES, N_HIDDEN)),
        torch.stack([targetTensor(line)[0] for _, line in probe_pairs]),
    )  # fmt: skip

    def probe_loss(output: tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        return criterion(output[0], targets)

    nx.preflight(rnn, probe_batch, probe_loss)
    mon = nx.monitor(rnn, None, every=10, loss_fn=criterion)  # the tutorial updates the parameters by hand

    def train_step(category_tensor: torch.Tensor, input_line_tensor: torch.Tensor,
                   target_line_tensor: torch.Tensor) -> tuple[torch.Tensor, float]:  # fmt: skip
        target_line_tensor.unsqueeze_(-1)
        hidden = rnn.initHidden()
        rnn.zero_grad()
        loss = 0
        for i in range(input_line_tensor.size(0)):
            output, hidden = rnn(category_tensor, input_line_tensor[i], hidden)
            l = mon.loss_fn(output, target_line_tensor[i])  # noqa: E741 - the tutorial's name
            loss += l
        loss.backward()
        for p in rnn.parameters():
            p.data.add_(p.grad.data, alpha=-learning_rate)
        return output, loss.item() / input_line_tensor.size(0)

    all_losses, total_loss = [], 0.0
    for it in range(1, n_iters + 1):
        output, loss = train_step(*randomTrainingExample())
        mon.log(loss)
        total_loss += loss
        if it % plot_every == 0:
            all_losses.append(total_loss / plot_every)
            total_loss = 0.0

    nx.finish(mon, rnn, probe_batch, probe_loss)

    def sample(category: str, start_letter: str = "A") -> str:
        with torch.no_grad():
            category_tensor, input, hidden = categoryTensor(category), inputTensor(start_letter), rnn.initHidden()
            output_name = start_letter
            for _ in range(max_length):
                output, hidden = rnn(category_tensor, input[0], hidden)
                topi = output.topk(1)[1][0][0].item()
                if topi == n_letters - 1:
                    break
                letter = all_letters[topi]
                output_name += letter
                input = inputTensor(letter)
            return output_name

    samples = [sample(c, s) for c in all_categories[:3] for s in "BKS"]  # the tutorial's samples()

    # measure only: held-out names, scored letter by letter against their true next letters
    rnn.eval()
    nll, letters = 0.0, 0
    with torch.no_grad():
        for category, names in held_out.items():
            category_tensor = categoryTensor(category)
            for line in names:
                inputs = inputTensor(line)
                truth = [all_letters.find(ch) for ch in line[1:]] + [n_letters - 1]
                hidden = rnn.initHidden()
                for i in range(inputs.size(0)):
                    output, hidden = rnn(category_tensor, inputs[i], hidden)
                    nll -= F.log_softmax(output, dim=1)[0, truth[i]].item()
                    letters += 1
    copied = sum(s[1:2].lower() == s[0].lower() for s in samples if len(s) > 1) / len(samples)
    return {
        "final_train_loss": all_losses[-1],
        "first_train_loss": all_losses[0],
        "held_out_nll": nll / letters,
        "mean_sample_length": sum(map(len, samples)) / len(samples),
        "samples_repeating_first_letter": copied,
    }
