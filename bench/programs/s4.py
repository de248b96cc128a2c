"""Port of the S4 repository's standalone example: a stack of S4D (diagonal state-space)
layers classifying images read as pixel sequences (sequential MNIST / CIFAR-10).

Source: github.com/state-spaces/s4, ``example.py`` and ``models/s4/s4d.py`` (with
``DropoutNd`` from ``src/models/nn/dropout.py``) at commit
e757cef57d89e448c413de7325ed5601aceaac13 (Apache-2.0). Written anew from the facts of those
files; no code copied. einops is not installed: its ``repeat`` is written out.

Kept: ``S4DKernel`` (``log_dt`` uniform in [log 0.001, log 0.1], ``C`` complex normal stored
with ``view_as_real``, ``log_A_real = log 0.5``, ``A_imag = pi * n``; the kernel
``2 * Re(einsum(C * (exp(dtA) - 1) / A, exp(dtA * l)))``; ``register`` making ``log_dt``,
``log_A_real``, ``A_imag`` parameters tagged ``_optim = {"weight_decay": 0.0, "lr": lr}``);
``S4D`` (the ``D`` skip, the FFT convolution ``irfft(rfft(u, 2L) * rfft(k, 2L))[..., :L]``,
GELU, ``DropoutNd`` with the mask tied over the length, ``Conv1d(H, 2H, 1)`` + ``GLU(dim=-2)``,
``transposed=True``); ``example.py``'s ``S4Model`` (``Linear(d_input, d_model)`` encoder,
transpose to (B, H, L), residual S4D blocks with ``nn.Dropout1d`` (the torch >= 1.12 branch)
and post-``LayerNorm``, mean pooling over the length, ``Linear`` decoder), S4D built with
``lr=min(0.001, args.lr)``; ``setup_optimizer`` (``AdamW(lr, weight_decay)`` over the
parameters without ``_optim``, one extra param group per distinct ``_optim`` dict,
``CosineAnnealingLR(optimizer, epochs)``); ``split_train_val`` (``random_split`` 90/10 with
``generator=torch.Generator().manual_seed(42)``); the MNIST transform (``ToTensor`` then
``view(1, L).t()``: one pixel per step, ``d_input = 1``); ``CrossEntropyLoss``; ``train()``
(``model.train()``, ``zero_grad`` / forward / loss / ``backward`` / ``step`` per batch, the
running accuracy), ``eval()`` (``model.eval()``, ``no_grad``, best validation accuracy kept),
and the epoch loop (train, val eval with checkpointing, test eval, ``scheduler.step()``).
The defaults ``lr=0.01, weight_decay=0.01, dropout=0.1, batch_size=64``, postnorm.
Shrunk: scikit-learn's 8x8 digits as 64-step pixel sequences (1,437 train split 1,293 / 144,
360 test) instead of MNIST's 784-step ones; ``d_model`` 64 instead of 128, ``n_layers`` 2
instead of 4, ``d_state`` 32 instead of 64, 15 epochs instead of 100; no tqdm, no checkpoint
file (the best accuracy is kept in memory), no CUDA.
Measure only (not in the program): the last epoch's test accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the optimizer and the train/val tensors; ``nndx.Monitor(model, optimizer)`` around the
epochs with the criterion as ``mon.loss_fn``, each batch's loss and accuracy logged and each
validation ``eval`` logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "s4"
SOURCE = Source("state-spaces/s4", "example.py", "e757cef57d89e448c413de7325ed5601aceaac13", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (shrunk: 8x8 digits as 64-step sequences, d_model 64, "
                           "2 layers, 15 epochs)"),
        Variant(
            "adamw_default_lr",
            "setup_optimizer's AdamW built without lr=lr: the general parameters train at AdamW's default 1e-3, "
            "the rate meant for the SSM parameters only, instead of 0.01",
            (C.LR_TOO_LOW,),
            ("https://github.com/srush/annotated-s4/pull/17",
             "https://github.com/victorchall/EveryDream2trainer/issues/102",
             "https://github.com/ooples/AiDotNet/issues/1928"),
            Measure("test_accuracy", "final test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: buggy < healthy - 0.1),
        ),
        Variant(
            "zero_grad_dropped",
            "optimizer.zero_grad() dropped from train(): every step applies the sum of all gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/yueliu1999/HSAN/issues/6"),
            Measure("test_accuracy", "final test accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: buggy < healthy - 0.2),
        ),
    )
}

LR, WEIGHT_DECAY, EPOCHS, BATCH_SIZE = 0.01, 0.01, 15, 64
N_LAYERS, D_MODEL, D_STATE, DROPOUT, PRENORM = 2, 64, 32, 0.1, False
SIDE = 8

dropout_fn = nn.Dropout1d  # example.py: torch >= 1.12


# --------------------------------------------------------------------------- src/models/nn/dropout.py


class DropoutNd(nn.Module):
    def __init__(self, p: float = 0.5, tie: bool = True) -> None:
        super().__init__()
        if p < 0 or p >= 1:
            raise ValueError(f"dropout probability has to be in [0, 1), but got {p}")
        self.p = p
        self.tie = tie

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """X: (batch, dim, lengths...)"""
        if self.training:
            mask_shape = X.shape[:2] + (1,) * (X.ndim - 2) if self.tie else X.shape
            mask = torch.rand(*mask_shape, device=X.device) < 1.0 - self.p
            return X * mask * (1.0 / (1 - self.p))
        return X


# --------------------------------------------------------------------------- models/s4/s4d.py


class S4DKernel(nn.Module):
    """Generate convolution kernel from diagonal SSM parameters."""

    def __init__(self, d_model: int, N: int = 64, dt_min: float = 0.001, dt_max: float = 0.1,
                 lr: float | None = None) -> None:  # fmt: skip
        super().__init__()
        H = d_model
        log_dt = torch.rand(H) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        C = torch.randn(H, N // 2, dtype=torch.cfloat)
        self.C = nn.Parameter(torch.view_as_real(C))
        self.register("log_dt", log_dt, lr)
        log_A_real = torch.log(0.5 * torch.ones(H, N // 2))
        A_imag = math.pi * torch.arange(N // 2, dtype=torch.float).unsqueeze(0).expand(H, N // 2).clone()
        self.register("log_A_real", log_A_real, lr)
        self.register("A_imag", A_imag, lr)

    def forward(self, L: int) -> torch.Tensor:
        dt = torch.exp(self.log_dt)  # (H)
        C = torch.view_as_complex(self.C)  # (H N)
        A = -torch.exp(self.log_A_real) + 1j * self.A_imag  # (H N)
        dtA = A * dt.unsqueeze(-1)  # (H N)
        K = dtA.unsqueeze(-1) * torch.arange(L, device=A.device)  # (H N L)
        C = C * (torch.exp(dtA) - 1.0) / A
        return 2 * torch.einsum("hn, hnl -> hl", C, torch.exp(K)).real

    def register(self, name: str, tensor: torch.Tensor, lr: float | None = None) -> None:
        """Register a tensor with a configurable learning rate and 0 weight decay"""
        if lr == 0.0:
            self.register_buffer(name, tensor)
        else:
            self.register_parameter(name, nn.Parameter(tensor))
            optim_hp = {"weight_decay": 0.0}
            if lr is not None:
                optim_hp["lr"] = lr
            setattr(getattr(self, name), "_optim", optim_hp)


class S4D(nn.Module):
    def __init__(self, d_model: int, d_state: int = 64, dropout: float = 0.0, transposed: bool = True,
                 **kernel_args) -> None:  # fmt: skip
        super().__init__()
        self.h = d_model
        self.n = d_state
        self.d_output = self.h
        self.transposed = transposed
        self.D = nn.Parameter(torch.randn(self.h))
        self.kernel = S4DKernel(self.h, N=self.n, **kernel_args)
        self.activation = nn.GELU()
        self.dropout = DropoutNd(dropout) if dropout > 0.0 else nn.Identity()
        self.output_linear = nn.Sequential(nn.Conv1d(self.h, 2 * self.h, kernel_size=1), nn.GLU(dim=-2))

    def forward(self, u: torch.Tensor, **kwargs) -> tuple[torch.Tensor, None]:
        """Input and output shape (B, H, L)"""
        if not self.transposed:
            u = u.transpose(-1, -2)
        L = u.size(-1)
        k = self.kernel(L=L)  # (H L)
        k_f = torch.fft.rfft(k, n=2 * L)
        u_f = torch.fft.rfft(u, n=2 * L)
        y = torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L]  # (B H L)
        y = y + u * self.D.unsqueeze(-1)
        y = self.dropout(self.activation(y))
        y = self.output_linear(y)
        if not self.transposed:
            y = y.transpose(-1, -2)
        return y, None


# --------------------------------------------------------------------------- example.py


class S4Model(nn.Module):
    def __init__(self, d_input: int, d_output: int = 10, d_model: int = 256, n_layers: int = 4, dropout: float = 0.2,
                 prenorm: bool = False, lr: float = 0.01, d_state: int = 64) -> None:  # fmt: skip
        super().__init__()
        self.prenorm = prenorm
        self.encoder = nn.Linear(d_input, d_model)
        self.s4_layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.dropouts = nn.ModuleList()
        for _ in range(n_layers):
            self.s4_layers.append(S4D(d_model, d_state=d_state, dropout=dropout, transposed=True, lr=min(0.001, lr)))
            self.norms.append(nn.LayerNorm(d_model))
            self.dropouts.append(dropout_fn(dropout))
        self.decoder = nn.Linear(d_model, d_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Input x is shape (B, L, d_input)"""
        x = self.encoder(x)  # (B, L, d_input) -> (B, L, d_model)
        x = x.transpose(-1, -2)  # (B, L, d_model) -> (B, d_model, L)
        for layer, norm, dropout in zip(self.s4_layers, self.norms, self.dropouts):
            z = x
            if self.prenorm:
                z = norm(z.transpose(-1, -2)).transpose(-1, -2)
            z, _ = layer(z)
            z = dropout(z)
            x = z + x
            if not self.prenorm:
                x = norm(x.transpose(-1, -2)).transpose(-1, -2)
        x = x.transpose(-1, -2)
        x = x.mean(dim=1)
        return self.decoder(x)


def split_train_val(train, val_split: float):
    train_len = int(len(train) * (1.0 - val_split))
    return torch.utils.data.random_split(train, (train_len, len(train) - train_len),
                                         generator=torch.Generator().manual_seed(42))  # fmt: skip


def setup_optimizer(model: nn.Module, lr: float, weight_decay: float, epochs: int, default_lr_bug: bool = False):
    """S4 parameters (A, B, C, dt) get their own lr and no weight decay; the rest ``lr`` and
    ``weight_decay``; a cosine schedule over ``epochs``."""
    all_parameters = list(model.parameters())
    params = [p for p in all_parameters if not hasattr(p, "_optim")]
    if default_lr_bug:
        optimizer = optim.AdamW(params, weight_decay=weight_decay)  # the bug: lr left out
    else:
        optimizer = optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    hps = [getattr(p, "_optim") for p in all_parameters if hasattr(p, "_optim")]
    hps = [dict(s) for s in sorted(list(dict.fromkeys(frozenset(hp.items()) for hp in hps)))]
    for hp in hps:
        params = [p for p in all_parameters if getattr(p, "_optim", None) == hp]
        optimizer.add_param_group({"params": params, **hp})
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    return optimizer, scheduler


def mnist_like(seed: int):
    """(train, val, test) datasets of (L, 1) pixel sequences in [0, 1] and labels, the
    MNIST transform applied to the 8x8 digits; train and val from one 90/10 ``split_train_val``."""
    x_train, y_train, x_test, y_test = data.digit_images(seed)

    def transform(images: torch.Tensor) -> torch.Tensor:
        x = data.to_tensor(images)  # ToTensor: (N, 1, H, W) in [0, 1]
        return x.view(x.shape[0], 1, SIDE * SIDE).transpose(1, 2)  # x.view(1, L).t() per image

    trainset = torch.utils.data.TensorDataset(transform(x_train), y_train)
    train_split, _ = split_train_val(trainset, val_split=0.1)
    valset = torch.utils.data.TensorDataset(transform(x_train), y_train)
    _, val_split = split_train_val(valset, val_split=0.1)
    testset = torch.utils.data.TensorDataset(transform(x_test), y_test)
    return train_split, val_split, testset


def _tensors(subset) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[subset[i] for i in range(len(subset))])
    return torch.stack(xs), torch.stack(ys)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    trainset, valset, testset = mnist_like(seed)
    d_input, d_output = 1, 10
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=BATCH_SIZE, shuffle=True,
                                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    valloader = torch.utils.data.DataLoader(valset, batch_size=BATCH_SIZE, shuffle=False)
    testloader = torch.utils.data.DataLoader(testset, batch_size=BATCH_SIZE, shuffle=False)

    model = S4Model(d_input=d_input, d_output=d_output, d_model=D_MODEL, n_layers=N_LAYERS, dropout=DROPOUT,
                    prenorm=PRENORM, lr=LR, d_state=D_STATE)  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    optimizer, scheduler = setup_optimizer(model, lr=LR, weight_decay=WEIGHT_DECAY, epochs=EPOCHS,
                                           default_lr_bug=variant == "adamw_default_lr")  # fmt: skip

    x_tr, y_tr = _tensors(trainset)
    x_va, y_va = _tensors(valset)
    probe_batch = (x_tr[:BATCH_SIZE], y_tr[:BATCH_SIZE])
    splits = (x_tr, y_tr, x_va, y_va)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)
    zero_grad = variant != "zero_grad_dropped"

    def train_epoch() -> float:
        model.train()
        train_loss, correct, total = 0.0, 0, 0
        for inputs, targets in trainloader:
            if zero_grad:
                optimizer.zero_grad()
            outputs = model(inputs)
            loss = mon.loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()
            train_loss += loss.item()
            _, predicted = outputs.max(1)
            batch_correct = predicted.eq(targets).sum().item()
            total += targets.size(0)
            correct += batch_correct
            nx.timed(lambda: mon.log(loss, accuracy=batch_correct / targets.size(0)))  # noqa: B023
        return train_loss / len(trainloader)

    best_acc = 0.0

    def evaluate(dataloader, checkpoint: bool = False) -> tuple[float, float]:
        nonlocal best_acc
        model.eval()
        eval_loss, correct, total = 0.0, 0, 0
        with torch.no_grad():
            for inputs, targets in dataloader:
                outputs = model(inputs)
                eval_loss += criterion(outputs, targets).item()
                _, predicted = outputs.max(1)
                total += targets.size(0)
                correct += predicted.eq(targets).sum().item()
        acc = 100.0 * correct / total
        if checkpoint and acc > best_acc:
            best_acc = acc  # example.py saves the state dict here
        return eval_loss / len(dataloader), acc

    train_loss = val_acc = test_acc = 0.0
    for _epoch in range(EPOCHS):
        train_loss = train_epoch()
        val_loss, val_acc = evaluate(valloader, checkpoint=True)
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc / 100.0))  # noqa: B023
        _, test_acc = evaluate(testloader)
        scheduler.step()

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_accuracy": test_acc / 100.0, "val_accuracy": val_acc / 100.0, "best_val_accuracy": best_acc / 100.0,
            "final_train_loss": train_loss}  # fmt: skip
