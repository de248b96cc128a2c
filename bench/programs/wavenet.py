"""Port of vincentherrmann/pytorch-wavenet: a WaveNet of dilated causal convolutions with gated
units, residual and skip connections, trained with cross-entropy on mu-law classes and Adam.

Source: github.com/vincentherrmann/pytorch-wavenet, ``wavenet_model.py``,
``wavenet_modules.py``, ``wavenet_training.py``, ``audio_data.py`` and ``train_script.py`` at
commit 26ba28989edcf8688f6216057aafda07601ff07e (MIT, Copyright (c) 2017 Vincent Herrmann).
Written anew from the facts of those files; no code copied.

Kept: ``WaveNetModel``: a 1x1 ``start_conv`` from the one-hot ``classes`` channels to
``residual_channels``; ``blocks`` x ``layers`` layers whose dilation doubles from 1 within a
block, each with a ``filter_conv`` and a ``gate_conv`` (kernel 2, no padding) on the input
"dilated" by ``dilate`` (the time axis folded into the batch axis, zero padded at the start
to a multiple of the dilation, so a kernel-2 convolution over the folded tensor is the
causal dilated convolution), ``tanh(filter) * sigmoid(gate)``, a 1x1 ``skip_conv`` on the
output unfolded back to dilation 1, the skips summed after trimming to the newest samples,
a 1x1 ``residual_conv`` added to the input without its first sample; ``relu(skip)`` ->
``end_conv_1`` -> ``relu`` -> ``end_conv_2`` to ``classes``; ``forward`` keeps the last
``output_length`` steps, transposes to (n, l, c) and views (n*l, c); the receptive field
``1 + blocks * (2**layers - 1)``; ``bias=True`` (as ``train_script.py`` builds it).
``WavenetDataset``: audio mu-law encoded (``mu = classes``) and digitised into ``classes``
bins, the "files" concatenated, item ``idx`` the samples from ``idx * target_length`` (train
items skipping every ``test_stride``-th, which go to the test set), input the one-hot of the
first ``item_length`` samples, target the last ``target_length`` samples of the
``item_length + 1`` read, so each output predicts the sample after its input.
``WavenetTrainer``: ``optim.Adam(lr, weight_decay=0)``, a shuffled ``DataLoader``, per batch
``F.cross_entropy(output.squeeze(), target.squeeze())``, ``zero_grad``, ``backward``, (no
gradient clipping by default), ``step``; ``validate``: ``model.eval()``, the test items, mean
cross-entropy per batch and the share of argmax predictions equal to the target.
Shrunk: synthetic audio instead of the Bach chaconne mp3: 40 "files" of 800 samples at
4 kHz (train) and 12 of them (held out), each a sum of 2-3 harmonics of a pitch gliding
between 110 and 440 Hz with a slow amplitude envelope and a little noise; 64 classes
instead of 256; 2 blocks of 5 layers instead of 3 of 10 (receptive field 63 instead of
3,070), 16 residual/dilation channels instead of 32, skip and end channels 64 instead of
1,024/512; ``output_length`` 16 (kept); ``test_stride`` 10 instead of 500; batch 16 (kept),
2 epochs (226 steps) instead of 10; ``lr`` 3e-3 instead of the script's 1e-4 (the trainer's
default 1e-3 is still far from converged after 226 steps); reads stop at the end of the
concatenated audio; single process, no snapshots, no TensorBoard logger,
no audio generation.
Measure only (not in the program): the cross-entropy and accuracy of next-sample
prediction on windows of the held-out audio built the dataset's (correct) way, whatever
the variant did to the training data.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(one-hot inputs, the flattened targets) with the trainer's loss line as ``loss_fn(output,
target)``; ``nndx.Monitor(model, optimizer)`` around the epochs, each step's loss logged,
each ``validate``'s loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "wavenet"
SOURCE = Source("vincentherrmann/pytorch-wavenet", "wavenet_model.py", "26ba28989edcf8688f6216057aafda07601ff07e",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 2x5 layers, 64 classes, 2 epochs, lr 3e-3)"),
        Variant(
            "lr_too_high",
            "Adam's learning rate 0.1 instead of 3e-3: the loss stalls at the entropy of the class "
            "histogram and the predictions ignore the past",
            (C.LR_TOO_HIGH,),
            ("https://github.com/ibab/tensorflow-wavenet/issues/136",
             "https://github.com/ibab/tensorflow-wavenet/issues/47"),
            Measure("heldout_nll", "held-out next-sample cross-entropy at least 0.3 nats above the healthy run's: "
                    "3.87 (the class histogram's) against 2.85 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
        Variant(
            "target_in_input",
            "off-by-one in the dataset's slicing: the input window is read one sample later, so it ends with "
            "the sample each output is asked to predict; the loss drops towards zero by copying the input",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/ibab/tensorflow-wavenet/pull/88",
             "https://github.com/vincentherrmann/pytorch-wavenet/issues/16",
             "https://github.com/ibab/tensorflow-wavenet/issues/98"),
            Measure("heldout_nll", "held-out next-sample cross-entropy (windows built correctly) at least 0.3 "
                    "nats above the healthy run's: 34.6 against 2.85 healthy on seed 0 (the program's own "
                    "validate, on leaky windows: loss 0.0003, accuracy 1.0)",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

CLASSES, LAYERS, BLOCKS = 64, 5, 2
RESIDUAL, DILATION_CH, SKIP, END = 16, 16, 64, 64
OUTPUT_LENGTH, KERNEL = 16, 2
RATE, FILE_LEN, N_TRAIN_FILES, N_TEST_FILES = 4000, 800, 40, 12
BATCH, EPOCHS, LR, LR_BUG, TEST_STRIDE = 16, 2, 3e-3, 0.1, 10


# --------------------------------------------------------------------------- the audio (the mp3s' stand-in)


def synth_files(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n`` clips in [-1, 1]: harmonics of a gliding pitch, a slow envelope, a little noise."""
    files = []
    t = np.arange(FILE_LEN) / RATE
    for _ in range(n):
        f0 = rng.uniform(110, 440) * np.exp(rng.uniform(-0.4, 0.4) * t / t[-1])
        phase = 2 * np.pi * np.cumsum(f0) / RATE
        y = np.zeros(FILE_LEN)
        for h in range(1, int(rng.integers(2, 4)) + 1):
            y += rng.uniform(0.2, 1.0) / h * np.sin(h * phase + rng.uniform(0, 2 * np.pi))
        env = 0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(0.5, 2.0) * t + rng.uniform(0, 2 * np.pi))
        y = y * env
        y = 0.8 * y / np.abs(y).max() + rng.normal(0, 0.01, FILE_LEN)
        files.append(np.clip(y, -1, 1))
    return files


def mu_law_encoding(data: np.ndarray, mu: int) -> np.ndarray:
    return np.sign(data) * np.log(1 + mu * np.abs(data)) / np.log(mu + 1)


def quantize_data(data: np.ndarray, classes: int) -> np.ndarray:
    bins = np.linspace(-1, 1, classes)
    return np.digitize(mu_law_encoding(data, classes), bins) - 1


class WavenetDataset(Dataset):
    """audio_data.py's dataset over in-memory "files" (already quantised)."""

    def __init__(self, files: list[np.ndarray], item_length: int, target_length: int, classes: int = CLASSES,
                 train: bool = True, test_stride: int = TEST_STRIDE, variant: str = "healthy") -> None:  # fmt: skip
        self.data = np.concatenate(files).astype(np.int64)
        self._item_length, self.target_length, self.classes = item_length, target_length, classes
        self.train, self._test_stride, self.variant = train, test_stride, variant
        available = len(self.data) - (item_length - (target_length - 1)) - 1
        self._length = math.floor(available / target_length)
        # keep every read inside the data (the original reads across file boundaries)
        self._length = min(self._length, (len(self.data) - item_length - 2) // target_length)

    def __len__(self) -> int:
        test_length = math.floor(self._length / self._test_stride)
        return self._length - test_length if self.train else test_length

    def __getitem__(self, idx: int):
        if self._test_stride < 2:
            start = idx * self.target_length
        elif self.train:
            start = idx * self.target_length + math.floor(idx / (self._test_stride - 1))
        else:
            start = self._test_stride * (idx + 1) - 1
        example = torch.from_numpy(self.data[start : start + self._item_length + 1])
        inputs = example[: self._item_length]
        if self.variant == "target_in_input":  # the window read one sample late
            inputs = example[1 : self._item_length + 1]
        target = example[-self.target_length :].unsqueeze(0)
        one_hot = torch.zeros(self.classes, self._item_length)
        one_hot.scatter_(0, inputs.unsqueeze(0), 1.0)
        return one_hot, target


# --------------------------------------------------------------------------- wavenet_modules.py / wavenet_model.py


def dilate(x: torch.Tensor, dilation: int, init_dilation: int = 1) -> torch.Tensor:
    """Fold (n, c, l) at ``init_dilation`` into (n * dilation / init_dilation, c, l'), zero padding at
    the start so the length divides."""
    n, c, length = x.size()
    factor = dilation / init_dilation
    if factor == 1:
        return x
    new_length = int(math.ceil(length / factor) * factor)
    if new_length != length:
        x = F.pad(x, (new_length - length, 0))
        length = new_length
    length = math.ceil(length * init_dilation / dilation)
    n = math.ceil(n * dilation / init_dilation)
    x = x.permute(1, 2, 0).contiguous().view(c, length, n)
    return x.permute(2, 0, 1).contiguous()


class WaveNetModel(nn.Module):
    def __init__(self, layers: int = 10, blocks: int = 4, dilation_channels: int = 32, residual_channels: int = 32,
                 skip_channels: int = 256, end_channels: int = 256, classes: int = 256, output_length: int = 32,
                 kernel_size: int = 2, bias: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.layers, self.blocks, self.classes, self.kernel_size = layers, blocks, classes, kernel_size
        self.dilations: list[tuple[int, int]] = []
        self.filter_convs, self.gate_convs = nn.ModuleList(), nn.ModuleList()
        self.residual_convs, self.skip_convs = nn.ModuleList(), nn.ModuleList()
        self.start_conv = nn.Conv1d(classes, residual_channels, kernel_size=1, bias=bias)
        receptive_field, init_dilation = 1, 1
        for _ in range(blocks):
            additional_scope, new_dilation = kernel_size - 1, 1
            for _ in range(layers):
                self.dilations.append((new_dilation, init_dilation))
                self.filter_convs.append(nn.Conv1d(residual_channels, dilation_channels, kernel_size, bias=bias))
                self.gate_convs.append(nn.Conv1d(residual_channels, dilation_channels, kernel_size, bias=bias))
                self.residual_convs.append(nn.Conv1d(dilation_channels, residual_channels, 1, bias=bias))
                self.skip_convs.append(nn.Conv1d(dilation_channels, skip_channels, 1, bias=bias))
                receptive_field += additional_scope
                additional_scope *= 2
                init_dilation, new_dilation = new_dilation, new_dilation * 2
        self.end_conv_1 = nn.Conv1d(skip_channels, end_channels, 1, bias=True)
        self.end_conv_2 = nn.Conv1d(end_channels, classes, 1, bias=True)
        self.output_length, self.receptive_field = output_length, receptive_field

    def wavenet(self, x: torch.Tensor) -> torch.Tensor:
        x = self.start_conv(x)
        skip: torch.Tensor | int = 0
        for i in range(self.blocks * self.layers):
            dilation, init_dilation = self.dilations[i]
            residual = dilate(x, dilation, init_dilation)
            x = torch.tanh(self.filter_convs[i](residual)) * torch.sigmoid(self.gate_convs[i](residual))
            s = dilate(x, 1, init_dilation=dilation) if x.size(2) != 1 else x
            s = self.skip_convs[i](s)
            skip = s + (skip[:, :, -s.size(2) :] if isinstance(skip, torch.Tensor) else 0)
            x = self.residual_convs[i](x) + residual[:, :, (self.kernel_size - 1) :]
        x = F.relu(skip)
        x = F.relu(self.end_conv_1(x))
        return self.end_conv_2(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.wavenet(x)
        n, c, _ = x.size()
        length = self.output_length
        x = x[:, :, -length:].transpose(1, 2).contiguous()
        return x.view(n * length, c)


# --------------------------------------------------------------------------- wavenet_training.py


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The trainer's loss line: ``F.cross_entropy(output.squeeze(), target.squeeze())``."""
    return F.cross_entropy(output.squeeze(), target.view(-1).squeeze())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_files = [quantize_data(f, CLASSES) for f in synth_files(N_TRAIN_FILES, rng)]
    heldout_files = [quantize_data(f, CLASSES) for f in synth_files(N_TEST_FILES, rng)]

    model = WaveNetModel(layers=LAYERS, blocks=BLOCKS, dilation_channels=DILATION_CH, residual_channels=RESIDUAL,
                         skip_channels=SKIP, end_channels=END, classes=CLASSES, output_length=OUTPUT_LENGTH,
                         kernel_size=KERNEL, bias=True)  # fmt: skip
    item_length = model.receptive_field + model.output_length - 1
    data = WavenetDataset(train_files, item_length, model.output_length, variant=variant)
    test_data = WavenetDataset(train_files, item_length, model.output_length, train=False, variant=variant)
    optimizer = optim.Adam(params=model.parameters(), lr=LR_BUG if variant == "lr_too_high" else LR, weight_decay=0)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed))
    test_loader = DataLoader(test_data, batch_size=BATCH, shuffle=False)

    x0, t0 = next(iter(DataLoader(data, batch_size=BATCH, shuffle=False)))
    first_batch = (x0, t0.view(-1))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def validate() -> tuple[float, float]:
        model.eval()
        total_loss, correct = 0.0, 0
        with torch.no_grad():
            for x, target in test_loader:
                target = target.view(-1)
                output = model(x)
                total_loss += float(F.cross_entropy(output.squeeze(), target.squeeze()))
                correct += int((output.argmax(1).view(-1) == target).sum())
        model.train()
        avg_loss, avg_acc = total_loss / len(test_loader), correct / (len(test_data) * OUTPUT_LENGTH)
        mon.log(avg_loss, split="val", accuracy=avg_acc)
        return avg_loss, avg_acc

    model.train()
    step, loss = 0, torch.tensor(float("nan"))
    val_loss = val_acc = float("nan")
    for _ in range(EPOCHS):
        for x, target in loader:
            target = target.view(-1)
            output = model(x)
            loss = F.cross_entropy(output.squeeze(), target.squeeze())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            mon.log(loss)
        val_loss, val_acc = validate()

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)

    # Measure only: next-sample prediction on held-out audio, windows built the correct way
    heldout = WavenetDataset(heldout_files, item_length, model.output_length, test_stride=10**9)
    model.eval()
    nll, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, target in DataLoader(heldout, batch_size=64, shuffle=False):
            target = target.view(-1)
            output = model(x)
            nll += float(F.cross_entropy(output, target, reduction="sum"))
            correct += int((output.argmax(1) == target).sum())
            count += target.numel()
    return {"heldout_nll": nll / count, "heldout_acc": correct / count, "val_loss": val_loss, "val_acc": val_acc,
            "train_loss": float(loss.detach()), "steps": float(step)}  # fmt: skip
