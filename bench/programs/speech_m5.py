"""Port of the PyTorch tutorial "Speech Command Classification with torchaudio": the M5
1-D convolutional network on raw waveforms, log_softmax + nll_loss, Adam + StepLR.

Source: github.com/pytorch/tutorials,
``intermediate_source/speech_command_classification_with_torchaudio_tutorial.py`` at
commit 84c6357b6405aa921e11a19cbfed2b4c856eafbd (BSD-3-Clause, Copyright (c) 2017-2022
PyTorch contributors). Written anew from the facts of that file; no code copied.

Kept: one mono waveform per sample at 8 kHz (the tutorial's ``new_sample_rate``), the
labels the sorted list of words, encoded by their index; a shuffled train loader and an
unshuffled, ``drop_last=False`` test loader whose ``collate_fn`` zero-pads the waveforms of a
batch to the longest and stacks the label indices; ``M5(n_input=1, n_output, stride=16,
n_channel=32)``: ``Conv1d(1, 32, kernel_size=80, stride=16)`` then ``Conv1d(32, 32, 3)``,
``Conv1d(32, 64, 3)``, ``Conv1d(64, 64, 3)``, each followed by ``BatchNorm1d``, ``F.relu`` and
``MaxPool1d(4)``; ``F.avg_pool1d`` over what is left of the time axis, ``permute(0, 2, 1)``,
``Linear(64, n_output)`` and ``F.log_softmax(x, dim=2)``, so the output is (batch, 1,
n_output); ``optim.Adam(lr=0.01, weight_decay=0.0001)``, ``StepLR(step_size=20,
gamma=0.1)`` stepped once per epoch after the test pass; ``train``: ``model.train()``,
``loss = F.nll_loss(output.squeeze(), target)``, ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``, every loss kept in ``losses``; ``test``:
``model.eval()``, ``argmax(dim=-1)`` of the output as the prediction, ``pred.squeeze().eq(target)``
counted; each epoch ``train`` then ``test`` then ``scheduler.step()``.
Shrunk: SpeechCommands (35 words, ~85,000 clips) cannot be downloaded here, so the clips are
synthesised (see ``clips``): 10 words, 640 training and 320 test clips of 0.9-1.0 s, each
word a fixed sequence of three voiced segments (a fundamental with a few formant-weighted
harmonics and a pitch glide), varied per clip by speaker pitch, speed, loudness, onset and
background noise; made at 8 kHz directly, so the tutorial's ``Resample`` transform is skipped
(the "port may skip resampling"); batch 32 instead of 256; 6 epochs of 20 batches instead
of 2 epochs of ~330 (StepLR's step_size 20 epochs is kept, so, as in the tutorial's run, it
never fires); the tqdm progress bar and the printing left out.
Measure only (not in the program): the last epoch's test accuracy (the tutorial's number),
the tutorial's ``predict`` (one waveform, ``model(tensor.unsqueeze(0))``, argmax) on the first
100 test clips, and the test set's mean negative log-likelihood with the classes normalised
(log_softmax over the class axis, whatever the model returned).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the tutorial's loss line as ``loss_fn(output, target)`` (``nll_loss(output.squeeze(),
target)``) and the optimizer; ``nndx.Monitor(model, optimizer)`` around the epochs with that
loss called as ``mon.loss_fn``, each batch's loss logged; the tutorial computes no test
loss (only an accuracy), so nothing is logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "speech_m5"
SOURCE = Source("pytorch/tutorials", "intermediate_source/speech_command_classification_with_torchaudio_tutorial.py",
                "84c6357b6405aa921e11a19cbfed2b4c856eafbd", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk)"),
        Variant(
            "log_softmax_implicit_dim",
            "return F.log_softmax(x) without dim=2: on the (batch, 1, classes) output PyTorch's implicit "
            "choice is dim 0, so the log-probabilities are normalised over the batch, not over the classes",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/ikostrikov/pytorch-meta-optimizer/issues/10",
             "https://github.com/fxia22/pointnet.pytorch/issues/25",
             "https://github.com/fxia22/pointnet.pytorch/issues/27"),
            Measure("predict_accuracy", "the tutorial's predict() (one clip at a time) right on 100 test clips: at "
                    "least 0.3 below the healthy run's (a batch of one normalises to log(1) = 0 for every class)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() moved into train()'s batch loop: StepLR(step_size=20, gamma=0.1) meant in epochs "
            "divides the LR by 10 every 20 batches (0.01 -> 1e-5 within the first 60 steps)",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/ivadomed/ivadomed/pull/55", "https://github.com/pytorch/vision/issues/1261",
             "https://github.com/pytorch/tutorials/pull/640"),
            Measure("test_accuracy", "last test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SAMPLE_RATE = 8000  # the tutorial's new_sample_rate (the clips are made at it: no Resample)
LABELS = sorted(["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"])
N_TRAIN, N_TEST = 640, 320
batch_size = 32
n_epoch = 6
N_PREDICT = 100
log_interval = 20


# --------------------------------------------------------------------------- the data (SpeechCommands' stand-in)


def _word_templates(seed: int = 1234) -> list[list[tuple[float, float, float, float]]]:
    """Each word: three segments of (fundamental Hz, pitch glide, formant Hz, relative length)."""
    rng = np.random.default_rng(seed)
    return [[(rng.uniform(90, 260), rng.uniform(-0.4, 0.4), rng.uniform(300, 2500), rng.uniform(0.6, 1.4))
             for _ in range(3)] for _ in LABELS]  # fmt: skip


def clips(n: int, seed: int) -> list[tuple[torch.Tensor, int, str]]:
    """``n`` synthetic clips as the dataset's items: (waveform (1, length), sample_rate, word).
    Lengths vary (0.9-1.0 s; M5 needs 0.86 s at 8 kHz), as SpeechCommands' "about 1 second" clips do."""
    rng = np.random.default_rng(seed)
    templates = _word_templates()
    items = []
    for i in range(n):
        word = i % len(LABELS)
        length = int(SAMPLE_RATE * rng.uniform(0.9, 1.0))
        wave = np.zeros(length)
        speed, pitch = rng.uniform(0.75, 1.25), rng.uniform(0.75, 1.3)
        seg_lengths = [int(0.12 * SAMPLE_RATE * rel * speed) for *_, rel in templates[word]]
        start = int(rng.integers(0, max(1, length - sum(seg_lengths))))
        for (f0, glide, formant, _), seg in zip(templates[word], seg_lengths):
            t = np.arange(seg) / SAMPLE_RATE
            freq = f0 * pitch * (1 + glide * t / max(t[-1], 1e-3))
            phase = 2 * np.pi * np.cumsum(freq) / SAMPLE_RATE
            voice = sum(np.exp(-(((k * f0 * pitch) - formant) / 400.0) ** 2) * np.sin(k * phase) for k in range(1, 9))
            envelope = np.sin(np.pi * np.arange(seg) / seg) ** 0.5
            end = min(length, start + seg)
            wave[start:end] += (voice * envelope)[: end - start]
            start = end
        wave = rng.uniform(0.3, 1.0) * wave / (np.abs(wave).max() + 1e-8) + rng.uniform(0.02, 0.2) * rng.standard_normal(length)
        items.append((torch.tensor(wave, dtype=torch.float32).unsqueeze(0), SAMPLE_RATE, LABELS[word]))
    return items


def label_to_index(word: str) -> torch.Tensor:
    return torch.tensor(LABELS.index(word))


def pad_sequence(batch: list[torch.Tensor]) -> torch.Tensor:
    """Zero-pad every (channels, length) waveform of the batch to the longest."""
    batch = torch.nn.utils.rnn.pad_sequence([item.t() for item in batch], batch_first=True, padding_value=0.0)
    return batch.permute(0, 2, 1)


def collate_fn(batch: list[tuple[torch.Tensor, int, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    tensors, targets = [], []
    for waveform, _, label, *_ in batch:
        tensors += [waveform]
        targets += [label_to_index(label)]
    return pad_sequence(tensors), torch.stack(targets)


# --------------------------------------------------------------------------- the network


class M5(nn.Module):
    def __init__(self, n_input: int = 1, n_output: int = 35, stride: int = 16, n_channel: int = 32,
                 implicit_dim: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.pool1 = nn.MaxPool1d(4)
        self.conv2 = nn.Conv1d(n_channel, n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(n_channel)
        self.pool2 = nn.MaxPool1d(4)
        self.conv3 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn3 = nn.BatchNorm1d(2 * n_channel)
        self.pool3 = nn.MaxPool1d(4)
        self.conv4 = nn.Conv1d(2 * n_channel, 2 * n_channel, kernel_size=3)
        self.bn4 = nn.BatchNorm1d(2 * n_channel)
        self.pool4 = nn.MaxPool1d(4)
        self.fc1 = nn.Linear(2 * n_channel, n_output)
        self.implicit_dim = implicit_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = self.pool3(F.relu(self.bn3(self.conv3(x))))
        x = self.pool4(F.relu(self.bn4(self.conv4(x))))
        x = F.avg_pool1d(x, x.shape[-1])
        x = x.permute(0, 2, 1)
        x = self.fc1(x)
        if self.implicit_dim:  # the bug: no dim; PyTorch picks dim 0 for a 3-D input (and warns)
            return F.log_softmax(x)
        return F.log_softmax(x, dim=2)


def nll(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The tutorial's loss line, ``F.nll_loss(output.squeeze(), target)``, as a loss_fn."""
    return F.nll_loss(output.squeeze(), target)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_set, test_set = clips(N_TRAIN, seed=seed), clips(N_TEST, seed=seed + 100)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, collate_fn=collate_fn,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_set, batch_size=batch_size, shuffle=False, drop_last=False, collate_fn=collate_fn)

    model = M5(n_input=1, n_output=len(LABELS), implicit_dim=variant == "log_softmax_implicit_dim")
    optimizer = optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0001)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.1)

    first_batch = collate_fn(train_set[:batch_size])
    nx.preflight(model, first_batch, nll, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=nll)
    losses: list[float] = []

    def train_epoch(epoch: int) -> None:
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            output = model(data)
            loss = mon.loss_fn(output, target)  # F.nll_loss(output.squeeze(), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
            if variant == "scheduler_per_batch":
                scheduler.step()
            losses.append(loss.item())

    def test(epoch: int) -> float:
        model.eval()
        correct = 0
        for data, target in test_loader:
            output = model(data)
            pred = output.argmax(dim=-1)
            correct += pred.squeeze().eq(target).sum().item()
        return correct / len(test_loader.dataset)

    accuracy = 0.0
    for epoch in range(1, n_epoch + 1):
        train_epoch(epoch)
        accuracy = test(epoch)
        if variant != "scheduler_per_batch":
            scheduler.step()

    nx.finish(mon, model, first_batch, nll, optimizer=optimizer)

    # measure only: the test NLL with the log-probabilities taken over the classes
    model.eval()
    total = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            out = model(data).squeeze(1)
            total += F.cross_entropy(out, target, reduction="sum").item()
        # the tutorial's predict(): one waveform at a time, as it checks train_set[-1] and the test clips
        hits = 0
        for waveform, _, utterance in test_set[:N_PREDICT]:
            index = model(waveform.unsqueeze(0)).argmax(dim=-1)
            hits += LABELS[index.squeeze()] == utterance
    return {
        "test_accuracy": accuracy,
        "predict_accuracy": hits / N_PREDICT,
        "test_nll": total / len(test_set),
        "last_loss": sum(losses[-20:]) / len(losses[-20:]),
        "final_lr": optimizer.param_groups[0]["lr"],
    }
