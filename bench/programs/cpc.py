"""Port of jefflai108/Contrastive-Predictive-Coding-PyTorch: CPC (CDCK2) on raw 1-D signals.

Source: github.com/jefflai108/Contrastive-Predictive-Coding-PyTorch, ``src/model/model.py``
(``CDCK2``), ``main.py`` (``ScheduledOptim``, the epoch loop), ``src/training_v1.py``
(``train``) and ``src/validation_v1.py`` (``validation``) at commit
a9dab4e759aaa68dce1b1ada46a8035076ba3296 (MIT, Copyright (c) 2019 Jeff Lai). Written anew
from the facts of those files; no code copied.

Kept: ``CDCK2``: a strided ``Conv1d`` encoder (no bias) with ``BatchNorm1d`` +
``ReLU(inplace=True)`` after each convolution, a one-layer unidirectional ``GRU``
(``batch_first``) as the autoregressive context, ``timestep`` linear predictors ``Wk``
from the context to the encoding; the init (``kaiming_normal_(mode="fan_out",
nonlinearity="relu")`` on Linear, Conv1d and every GRU weight, BN weight 1 and bias 0);
``forward(x, hidden)``: one random ``t_samples`` per batch, ``encode_samples`` the true
encodings at t+1..t+K, the GRU over the frames up to t, ``c_t`` its output at t,
``pred[k] = Wk(c_t)``, for each k ``total = encode_samples[k] @ pred[k].T`` (B x B: the
positives on the diagonal, the other sequences of the batch as negatives), ``nce +=
sum(diag(LogSoftmax(total)))`` (the implicit dim=1 of ``nn.LogSoftmax()``), the accuracy
of ``argmax(softmax(total), dim=0)`` against ``arange(batch)`` (of the last k only, as
published), ``nce /= -batch * timestep``; ``init_hidden`` zeros, called per batch;
``predict`` (the GRU over every frame) for the downstream classifier. ``main.py``:
``ScheduledOptim(Adam(betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4, amsgrad=True),
n_warmup_steps)`` with ``d_model = 128``, ``update_learning_rate`` after each
``step`` (``d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)``), ``increase_delta`` when the
val accuracy has not improved for more than 2 epochs; ``train``: ``model.train()``, per
batch ``zero_grad``, ``init_hidden(len(data))``, forward, ``backward``, ``step``,
``update_learning_rate``, the log line every ``log_interval`` batches (kept as a record);
``validation``: ``model.eval()``, ``no_grad``, the size-weighted mean of loss and accuracy;
the best-accuracy snapshot (kept in memory); ``RawDataset``: each item a random
``audio_window`` crop of one utterance; a shuffled train loader, an unshuffled val loader.
Shrunk: synthetic "utterances" of 2,048 samples (8 classes, each a base frequency; a
random amplitude, phase, second harmonic, slow frequency drift and noise per utterance;
64 utterances a class for training, 16 for validation) instead of LibriSpeech; the
window 512 instead of 20,480; the encoder three convolutions (kernel 8/4/4, strides 4/2/2:
downsampling 16 instead of 160, five convolutions) of width 32 instead of 512; GRU 32
instead of 256; ``timestep`` 4 instead of 12; batch 32 instead of 64; 8 epochs instead of
60; ``n_warmup_steps`` 50 as published. No CUDA, no logging to files.
Measure only (not in the program): a logistic-regression probe (scikit-learn) of the
class on the GRU's last output (``predict``) of each utterance's first window, fitted
on the training utterances, scored on the val ones (the repository's ``spk_class.py``
idea, shrunk to a linear probe).

nndx, as the author would add it: the model returns its loss (``acc, nce, hidden``), so
``loss_fn`` is ``lambda out, _: out[1]`` and a batch is ``((data, hidden), None)``; a
preflight ``nndx.probe`` on the first training batch with the ``ScheduledOptim`` the
program steps; ``nndx.Monitor(model, optimizer)`` (the wrapper) around the epochs, every
batch's NCE loss and accuracy logged, each ``validation``'s as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cpc"
SOURCE = Source("jefflai108/Contrastive-Predictive-Coding-PyTorch", "src/model/model.py",
                "a9dab4e759aaa68dce1b1ada46a8035076ba3296", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (CDCK2, shrunk)"),
        Variant(
            "nce_positive_always_first",
            "the InfoNCE positive taken from column 0 of log_softmax(total) for every row instead of its "
            "diagonal (the cross-entropy label a vector of zeros instead of arange(batch)): every sequence "
            "is pushed to match the first sequence's prediction",
            (C.LABELS_MISALIGNED, C.WRONG_LOSS),
            ("https://github.com/YihengZhang-CV/SeCo-Sequence-Contrastive-Learning/issues/3",
             "https://github.com/jefflai108/Contrastive-Predictive-Coding-PyTorch/issues/19",
             "https://github.com/YuanGongND/ssast/issues/13"),
            Measure("val_acc", "final val NCE accuracy at least 0.2 below the healthy run's: 0.008 against 0.82 "
                    "on seed 0 (the probe, 0.98 against 0.95, is not hurt: the encoder still learns)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "train_loader_unshuffled",
            "the train DataLoader built with shuffle=False over the utterance list, which is sorted by class "
            "(like LibriSpeech lists grouped by speaker): every batch holds one class, so the in-batch "
            "negatives never differ in class and the context stops encoding it",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/KevinMusgrave/pytorch-metric-learning/issues/536",
             "https://github.com/mpatacchiola/self-supervised-relational-reasoning/issues/4",
             "https://dailydoseofds.beehiiv.com/p/why-is-it-important-to-shuffle-your"),
            Measure("probe_acc", "linear-probe class accuracy on the val utterances at least 0.1 below the "
                    "healthy run's: 0.65 against 0.95 on seed 0 (val NCE accuracy 0.25 against 0.82)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS, UTT_LEN = 8, 64, 16, 2048
ARGS = {"epochs": 8, "n_warmup_steps": 50, "batch_size": 32, "audio_window": 512, "timestep": 4, "log_interval": 4}
WIDTH, HIDDEN, DOWNSAMPLE = 32, 32, 16


# --------------------------------------------------------------------------- the data (raw "audio")


def utterances(n_per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Class-sorted utterances: class c has base frequency 0.012 + 0.009 c cycles/sample."""
    t = np.arange(UTT_LEN)
    signals, labels = [], []
    for c in range(CLASSES):
        for _ in range(n_per_class):
            f = (0.012 + 0.009 * c) * (1 + 0.03 * np.sin(2 * np.pi * t / rng.uniform(300, 900) + rng.uniform(0, 6.3)))
            phase = 2 * np.pi * np.cumsum(f) + rng.uniform(0, 2 * np.pi)
            x = rng.uniform(0.5, 1.5) * np.sin(phase) + rng.uniform(0, 0.6) * np.sin(2 * phase + rng.uniform(0, 6.3))
            signals.append(x + 0.1 * rng.standard_normal(UTT_LEN))
            labels.append(c)
    return np.stack(signals).astype(np.float32), np.array(labels)


class RawDataset(Dataset):
    """Each item: a random ``audio_window`` crop of one utterance (the h5 reader's role)."""

    def __init__(self, signals: np.ndarray, audio_window: int, rng: np.random.Generator) -> None:
        self.signals, self.audio_window, self.rng = signals, audio_window, rng

    def __len__(self) -> int:
        return len(self.signals)

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(self.rng.integers(UTT_LEN - self.audio_window + 1))
        return torch.from_numpy(self.signals[index, start : start + self.audio_window])


# --------------------------------------------------------------------------- src/model/model.py


class CDCK2(nn.Module):
    def __init__(self, timestep: int, batch_size: int, seq_len: int, positive_first: bool = False) -> None:
        super().__init__()
        self.batch_size, self.seq_len, self.timestep = batch_size, seq_len, timestep
        self.encoder = nn.Sequential(  # downsampling factor = 16
            nn.Conv1d(1, WIDTH, kernel_size=8, stride=4, padding=2, bias=False),
            nn.BatchNorm1d(WIDTH),
            nn.ReLU(inplace=True),
            nn.Conv1d(WIDTH, WIDTH, kernel_size=4, stride=2, padding=1, bias=False),
            nn.BatchNorm1d(WIDTH),
            nn.ReLU(inplace=True),
            nn.Conv1d(WIDTH, WIDTH, kernel_size=4, stride=2, padding=1, bias=False),
            nn.BatchNorm1d(WIDTH),
            nn.ReLU(inplace=True),
        )
        self.gru = nn.GRU(WIDTH, HIDDEN, num_layers=1, bidirectional=False, batch_first=True)
        self.Wk = nn.ModuleList([nn.Linear(HIDDEN, WIDTH) for _ in range(timestep)])  # noqa: N815 - the source's
        self.softmax = nn.Softmax(dim=1)
        self.lsoftmax = nn.LogSoftmax(dim=1)  # nn.LogSoftmax() on a 2-D input: dim 1
        self.positive_first = positive_first

        def _weights_init(m: nn.Module) -> None:
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if isinstance(m, nn.Conv1d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm1d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

        for layer_p in self.gru._all_weights:
            for p in layer_p:
                if "weight" in p:
                    nn.init.kaiming_normal_(getattr(self.gru, p), mode="fan_out", nonlinearity="relu")
        self.apply(_weights_init)

    def init_hidden(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(1, batch_size, HIDDEN)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor):
        batch = x.size()[0]
        t_samples = torch.randint(self.seq_len // DOWNSAMPLE - self.timestep, size=(1,)).long()
        z = self.encoder(x).transpose(1, 2)  # N*L*C
        nce = 0
        encode_samples = torch.empty((self.timestep, batch, WIDTH)).float()
        for i in np.arange(1, self.timestep + 1):
            encode_samples[i - 1] = z[:, t_samples + i, :].view(batch, WIDTH)
        forward_seq = z[:, : t_samples + 1, :]
        output, hidden = self.gru(forward_seq, hidden)
        c_t = output[:, t_samples, :].view(batch, HIDDEN)
        pred = torch.empty((self.timestep, batch, WIDTH)).float()
        for i in np.arange(0, self.timestep):
            pred[i] = self.Wk[i](c_t)
        correct = torch.tensor(0)
        for i in np.arange(0, self.timestep):
            total = torch.mm(encode_samples[i], torch.transpose(pred[i], 0, 1))  # B x B
            correct = torch.sum(torch.eq(torch.argmax(self.softmax(total), dim=0), torch.arange(0, batch)))
            if self.positive_first:  # the bug: label 0 for every row
                nce += torch.sum(self.lsoftmax(total)[:, 0])
            else:
                nce += torch.sum(torch.diag(self.lsoftmax(total)))
        nce /= -1.0 * batch * self.timestep
        accuracy = 1.0 * correct.item() / batch
        return accuracy, nce, hidden

    def predict(self, x: torch.Tensor, hidden: torch.Tensor):
        z = self.encoder(x).transpose(1, 2)
        output, hidden = self.gru(z, hidden)
        return output, hidden


# --------------------------------------------------------------------------- main.py's ScheduledOptim


class ScheduledOptim:
    """A simple wrapper class for learning rate scheduling."""

    def __init__(self, optimizer: optim.Optimizer, n_warmup_steps: int) -> None:
        self.optimizer = optimizer
        self.d_model = 128
        self.n_warmup_steps = n_warmup_steps
        self.n_current_steps = 0
        self.delta = 1

    def state_dict(self) -> None:
        self.optimizer.state_dict()  # returns nothing, as published

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def increase_delta(self) -> None:
        self.delta *= 2

    def update_learning_rate(self) -> float:
        self.n_current_steps += self.delta
        new_lr = np.power(self.d_model, -0.5) * np.min([
            np.power(self.n_current_steps, -0.5), np.power(self.n_warmup_steps, -1.5) * self.n_current_steps])
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = new_lr
        return float(new_lr)


# --------------------------------------------------------------------------- the probe (measure only)


def probe_accuracy(model: CDCK2, train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
                   window: int) -> float:  # fmt: skip
    from sklearn.linear_model import LogisticRegression

    model.eval()
    with torch.no_grad():
        def feats(x: np.ndarray) -> np.ndarray:
            data = torch.from_numpy(x[:, :window]).unsqueeze(1)
            output, _ = model.predict(data, model.init_hidden(len(data)))
            return output[:, -1, :].numpy()

        f_train, f_val = feats(train_x), feats(val_x)
    mean, std = f_train.mean(0), f_train.std(0) + 1e-6
    clf = LogisticRegression(max_iter=2000).fit((f_train - mean) / std, train_y)
    return float(clf.score((f_val - mean) / std, val_y))


# --------------------------------------------------------------------------- main.py / training_v1 / validation_v1


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_x, train_y = utterances(TRAIN_PER_CLASS, rng)
    val_x, val_y = utterances(VAL_PER_CLASS, rng)
    val_order = rng.permutation(len(val_x))  # the val list in its own (mixed) order
    val_x, val_y = val_x[val_order], val_y[val_order]

    model = CDCK2(args["timestep"], args["batch_size"], args["audio_window"],
                  positive_first=variant == "nce_positive_always_first")  # fmt: skip
    training_set = RawDataset(train_x, args["audio_window"], np.random.default_rng(seed + 1))
    validation_set = RawDataset(val_x, args["audio_window"], np.random.default_rng(seed + 2))
    train_loader = DataLoader(training_set, batch_size=args["batch_size"], shuffle=variant != "train_loader_unshuffled",
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    validation_loader = DataLoader(validation_set, batch_size=args["batch_size"], shuffle=False)
    optimizer = ScheduledOptim(
        optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), betas=(0.9, 0.98), eps=1e-09,
                   weight_decay=1e-4, amsgrad=True),
        args["n_warmup_steps"])  # fmt: skip

    def loss_fn(out, _target) -> torch.Tensor:
        return out[1]  # CDCK2.forward returns (acc, nce, hidden)

    first = torch.from_numpy(train_x[: args["batch_size"], : args["audio_window"]]).unsqueeze(1)
    probe_batch = ((first, model.init_hidden(len(first))), None)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    log: list[str] = []

    def train_epoch(epoch: int) -> None:
        model.train()
        for batch_idx, data in enumerate(train_loader):
            data = data.float().unsqueeze(1)
            optimizer.zero_grad()
            hidden = model.init_hidden(len(data))
            acc, loss, hidden = model(data, hidden)
            loss.backward()
            optimizer.step()
            lr = optimizer.update_learning_rate()
            mon.log(loss, accuracy=acc)
            if batch_idx % args["log_interval"] == 0:
                log.append(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tlr:{lr:.5f}"
                           f"\tAccuracy: {acc:.4f}\tLoss: {loss.item():.6f}")  # fmt: skip

    def validation() -> tuple[float, float]:
        model.eval()
        total_loss, total_acc = 0.0, 0.0
        with torch.no_grad():
            for data in validation_loader:
                data = data.float().unsqueeze(1)
                hidden = model.init_hidden(len(data))
                acc, loss, hidden = model(data, hidden)
                total_loss += len(data) * loss.item()
                total_acc += len(data) * acc
        total_loss /= len(validation_loader.dataset)
        total_acc /= len(validation_loader.dataset)
        mon.log(total_loss, split="val", accuracy=total_acc)
        return total_acc, total_loss

    best_acc, best_epoch, best = 0.0, -1, {}
    val_acc = val_loss = float("nan")
    for epoch in range(1, args["epochs"] + 1):
        train_epoch(epoch)
        val_acc, val_loss = validation()
        if val_acc > best_acc:
            best_acc = max(val_acc, best_acc)
            best = {"epoch": epoch + 1, "validation_acc": val_acc, "state_dict": copy.deepcopy(model.state_dict())}
            best_epoch = epoch + 1
        elif epoch - best_epoch > 2:
            optimizer.increase_delta()
            best_epoch = epoch + 1

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    probe = probe_accuracy(model, train_x, train_y, val_x, val_y, args["audio_window"])
    return {"val_acc": val_acc, "val_loss": val_loss, "best_acc": best_acc, "probe_acc": probe,
            "final_lr": optimizer.optimizer.param_groups[0]["lr"]}  # fmt: skip

