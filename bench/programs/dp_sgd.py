"""Port of Opacus's MNIST example: DP-SGD (per-sample gradient clipping + Gaussian noise) on
the example's ``SampleConvNet``, with the library's DP-SGD step written in plain PyTorch.

Source: github.com/pytorch/opacus, ``examples/mnist.py`` with ``opacus/optimizers/optimizer.py``
(``DPOptimizer``), ``opacus/privacy_engine.py`` (``make_private``) and ``opacus/data_loader.py``
(``DPDataLoader``) at commit 4d0ebc84613d214fbfd37fbfd1390e3747a625ce (Apache-2.0, Copyright (c)
Meta Platforms, Inc. and affiliates). Opacus is not installed here: its per-sample gradients
(``GradSampleModule``'s hooks) are computed with ``torch.func`` (``vmap`` over ``grad_and_value``
of a one-sample ``functional_call``, as PyTorch's own functorch DP-SGD example does), and the
rest of the step is ``DPOptimizer``'s, written anew. Written anew from the facts of those
files; no code copied.

Kept: ``SampleConvNet`` = ``Conv2d(1, 16, 8, 2, padding=3)``, ``F.relu``, ``F.max_pool2d(2, 1)``,
``Conv2d(16, 32, 4, 2)``, ``F.relu``, ``F.max_pool2d(2, 1)``, ``view(-1, 32 * 4 * 4)``,
``Linear(512, 32)``, ``F.relu``, ``Linear(32, 10)`` (logits); ``nn.CrossEntropyLoss()``;
``optim.SGD(lr=0.1, momentum=0)``; the example's defaults ``sigma`` (noise multiplier) 1.0,
``max_per_sample_grad_norm`` 1.0, batch size 64, test batch size 1024, ``delta`` 1e-5;
``make_private``'s defaults: Poisson sampling (``DPDataLoader``: every step draws each training
example independently with ``sample_rate = 1 / len(train_loader)``, ``len(train_loader)`` steps an
epoch), ``expected_batch_size = int(len(dataset) * sample_rate)``, ``loss_reduction="mean"``, flat
clipping; ``DPOptimizer``: a wrapper of the SGD (its ``param_groups``, ``state`` and ``defaults``
are the SGD's) whose ``step`` is ``pre_step`` -- ``clip_and_accumulate`` (per-sample norms over all
parameters, ``clip factor = (max_grad_norm / (norm + 1e-6)).clamp(max=1)``, the clipped per-sample
gradients summed into ``summed_grad``), ``add_noise`` (``p.grad = summed_grad + N(0,
(noise_multiplier * max_grad_norm)^2)``), ``scale_grad`` (``p.grad /= expected_batch_size *
accumulated_iterations``) -- then the SGD's ``step``; its ``zero_grad`` clears ``grad_sample``,
``summed_grad`` and the gradients, and a gradient used twice raises as in the library; the loop
(``model.train()``, per batch ``optimizer.zero_grad()``, the per-sample forward/backward,
``optimizer.step()``, the batch loss recorded); ``test`` after the epochs (``model.eval()``, ``torch.no_grad()``, summed
loss and accuracy); inputs through ``ToTensor`` + ``Normalize((mean,), (std,))`` with the data
set's precomputed mean and standard deviation.
Shrunk: scikit-learn's 8x8 digits, resized to 28x28 so the network keeps its layer shapes (1,437
train / 360 test) instead of MNIST's 60,000 / 10,000: 23 Poisson steps an epoch (expected batch
62) instead of 938 (63); 20 epochs instead of 10 (460 steps instead of 9,380). The RDP
accountant (it only prints epsilon), ``--n-runs``, secure RNG and checkpoints are left out.
Measure only (not in the program): the test accuracy returned by ``test``.

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first 64
training images with the example's ``nn.CrossEntropyLoss()`` and the optimizer the loop steps
(the ``DPOptimizer``); ``nndx.Monitor(model, optimizer)`` around the epochs, the mean of each
step's per-sample losses logged; after training ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.func import functional_call, grad_and_value, vmap

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dp_sgd"
SOURCE = Source("pytorch/opacus", "examples/mnist.py", "4d0ebc84613d214fbfd37fbfd1390e3747a625ce", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (shrunk: 8x8 digits resized to 28x28, 23 Poisson steps an epoch)"),
        Variant(
            "noised_sum_not_averaged",
            "the clipped, noised sum of per-sample gradients handed to SGD as the gradient without the division by "
            "the expected batch size (DPOptimizer's scale_grad step left out): every update is ~62x the averaged "
            "one, signal and noise alike",
            (C.GRAD_ACCUM_SCALING, C.LR_TOO_HIGH),
            ("https://github.com/pytorch/functorch/issues/467",
             "https://github.com/pytorch/functorch/pull/873",
             "https://github.com/meta-pytorch/opacus/issues/200"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.106 / 0.094 / 0.111 "
                    "(last epoch's train loss 68-175) against 0.842 / 0.817 / 0.856 healthy on seeds 0 / 1 / 2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "clip_norm_too_small",
            "max_per_sample_grad_norm 0.1 instead of the example's 1.0 (the value of DP fine-tuning recipes for large "
            "models): every example's gradient (norm 2.3-3.9 at the start here, median 3.2) is cut to 0.1, and the "
            "noise (noise_multiplier x max_grad_norm) shrinks with it, so each step moves ~10x less than the example's",
            (C.GRAD_CLIP_TOO_SMALL, C.LR_TOO_LOW),
            ("https://github.com/tensorflow/privacy/issues/182",
             "https://github.com/tensorflow/privacy/issues/112"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.328 / 0.272 / 0.403 "
                    "(last epoch's train loss 2.16) against 0.842 / 0.817 / 0.856 healthy on seeds 0 / 1 / 2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

batch_size, test_batch_size, epochs, lr = 64, 1024, 20, 0.1
sigma, max_per_sample_grad_norm, delta = 1.0, 1.0, 1e-5
SIDE = 28
PROBE = 64


# --------------------------------------------------------------------------- examples/mnist.py: the model


class SampleConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x of shape [B, 1, 28, 28]
        x = F.relu(self.conv1(x))  # -> [B, 16, 14, 14]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 16, 13, 13]
        x = F.relu(self.conv2(x))  # -> [B, 32, 5, 5]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 32, 4, 4]
        x = x.view(-1, 32 * 4 * 4)  # -> [B, 512]
        x = F.relu(self.fc1(x))  # -> [B, 32]
        return self.fc2(x)  # -> [B, 10]


# --------------------------------------------------------------------------- opacus, in plain PyTorch


class DPDataLoader:
    """Poisson sampling over in-memory tensors: ``len(loader)`` steps, each example in a batch
    independently with probability ``sample_rate`` (opacus's UniformWithReplacementSampler)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, sample_rate: float, generator: torch.Generator):
        self.images, self.labels = images, labels
        self.sample_rate = sample_rate
        self.steps = int(1 / sample_rate)
        self.generator = generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        n = len(self.labels)
        for _ in range(self.steps):
            mask = torch.rand(n, generator=self.generator) < self.sample_rate
            indices = torch.nonzero(mask).reshape(-1)
            yield self.images[indices], self.labels[indices]


def _mark_as_processed(t: torch.Tensor) -> None:
    t._processed = True  # type: ignore[attr-defined]


def _check_processed_flag(t: torch.Tensor) -> None:
    if hasattr(t, "_processed"):
        raise ValueError("Gradients haven't been cleared since the last optimizer step. In order to obtain privacy "
                         "guarantees you must call optimizer.zero_grad() on each step")  # fmt: skip


class DPOptimizer(optim.Optimizer):
    """opacus.optimizers.DPOptimizer: wraps an optimizer; ``step`` clips each example's gradient,
    sums, adds Gaussian noise, averages by the expected batch size, then steps the wrapped one.
    Like the library's, it does not call ``Optimizer.__init__``: its state is the wrapped one's."""

    def __init__(self, optimizer: optim.Optimizer, *, noise_multiplier: float, max_grad_norm: float,
                 expected_batch_size: int, loss_reduction: str = "mean", scale: bool = True) -> None:  # fmt: skip
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"Unexpected value for loss_reduction: {loss_reduction}")
        self.original_optimizer = optimizer
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.loss_reduction = loss_reduction
        self.expected_batch_size = expected_batch_size
        self.scale = scale  # the noised_sum_not_averaged bug: False
        for p in self.params:
            p.summed_grad = None

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    @property
    def param_groups(self) -> list[dict]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict]) -> None:
        self.original_optimizer.param_groups = param_groups

    @property
    def state(self):
        return self.original_optimizer.state

    @state.setter
    def state(self, state) -> None:
        self.original_optimizer.state = state

    @property
    def defaults(self) -> dict:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict) -> None:
        self.original_optimizer.defaults = defaults

    @property
    def grad_samples(self) -> list[torch.Tensor]:
        out = []
        for p in self.params:
            if getattr(p, "grad_sample", None) is None:
                raise ValueError("Per sample gradient is not initialized. Not updated in backward pass?")
            out.append(p.grad_sample)
        return out

    def clip_and_accumulate(self) -> None:
        grad_samples = self.grad_samples
        if len(grad_samples[0]) == 0:
            per_sample_clip_factor = torch.zeros((0,))
        else:
            per_param_norms = [g.reshape(len(g), -1).norm(2, dim=-1) for g in grad_samples]
            per_sample_norms = torch.stack(per_param_norms, dim=1).norm(2, dim=1)
            per_sample_clip_factor = (self.max_grad_norm / (per_sample_norms + 1e-6)).clamp(max=1.0)
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            grad = torch.einsum("i,i...", per_sample_clip_factor, p.grad_sample)
            if p.summed_grad is not None:
                p.summed_grad += grad
            else:
                p.summed_grad = grad
            _mark_as_processed(p.grad_sample)

    def add_noise(self) -> None:
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = torch.normal(mean=0, std=self.noise_multiplier * self.max_grad_norm, size=p.summed_grad.shape)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)

    def scale_grad(self) -> None:
        if self.loss_reduction == "mean":
            for p in self.params:
                p.grad /= self.expected_batch_size * 1  # accumulated_iterations: one batch per step here

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            p.grad_sample = None
            p.summed_grad = None
        self.original_optimizer.zero_grad(set_to_none)

    def pre_step(self) -> bool:
        self.clip_and_accumulate()
        self.add_noise()
        if self.scale:
            self.scale_grad()
        return True

    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self.pre_step():
            return self.original_optimizer.step()
        return None

    def __repr__(self) -> str:
        return self.original_optimizer.__repr__()

    def state_dict(self):
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.original_optimizer.load_state_dict(state_dict)


def compute_grad_samples(model: nn.Module, criterion: nn.Module, data: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """What GradSampleModule's hooks leave after ``loss.backward()``: ``p.grad_sample`` (B, *p.shape),
    each example's gradient of its own loss. Returns the batch's mean loss (the example's ``loss``)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def compute_loss(params, sample, label):
        output = functional_call(model, params, (sample.unsqueeze(0),))
        return criterion(output, label.unsqueeze(0))

    grads, losses = vmap(grad_and_value(compute_loss), in_dims=(None, 0, 0))(params, data, target)
    for name, p in model.named_parameters():
        p.grad_sample = grads[name]
    return losses.mean()


# --------------------------------------------------------------------------- examples/mnist.py: the loop


def train_epoch(model, train_loader, optimizer, nx: Nndx, mon) -> float:
    model.train()
    criterion = nn.CrossEntropyLoss()
    losses = []
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = compute_grad_samples(model, criterion, data, target)  # output = model(data); loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        losses.append(loss.item())
    return float(np.mean(losses))


def test(model, test_x, test_y) -> tuple[float, float]:
    model.eval()
    criterion = nn.CrossEntropyLoss()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(test_y), test_batch_size):
            data, target = test_x[i : i + test_batch_size], test_y[i : i + test_batch_size]
            output = model(data)
            test_loss += criterion(output, target).item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_y)
    return test_loss, correct / len(test_y)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_u8, train_y, test_u8, test_y = digits.digit_images(seed=seed)
    to_tensor = digits.upscaled(train_u8, SIDE)  # ToTensor (and the resize to 28x28): [0, 1]
    mean, std = to_tensor.mean().item(), to_tensor.std().item()  # "precomputed characteristics of the dataset"

    def transform(images: torch.Tensor) -> torch.Tensor:
        return (digits.upscaled(images, SIDE) - mean) / std  # Normalize((mean,), (std,))

    train_x, test_x = transform(train_u8), transform(test_u8)

    model = SampleConvNet()
    sgd = optim.SGD(model.parameters(), lr=lr, momentum=0)
    # privacy_engine.make_private(module, optimizer, data_loader, noise_multiplier, max_grad_norm)
    n_batches = -(-len(train_y) // batch_size)  # len(train_loader)
    sample_rate = 1 / n_batches
    expected_batch_size = int(len(train_y) * sample_rate)
    train_loader = DPDataLoader(train_x, train_y, sample_rate, torch.Generator().manual_seed(seed))
    max_grad_norm = 0.1 if variant == "clip_norm_too_small" else max_per_sample_grad_norm
    optimizer = DPOptimizer(sgd, noise_multiplier=sigma, max_grad_norm=max_grad_norm,
                            expected_batch_size=expected_batch_size,
                            scale=variant != "noised_sum_not_averaged")  # fmt: skip

    probe_batch = (train_x[:PROBE], train_y[:PROBE])
    nx.preflight(model, probe_batch, nn.CrossEntropyLoss(), optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    train_losses = []
    for _epoch in range(1, epochs + 1):
        train_losses.append(train_epoch(model, train_loader, optimizer, nx, mon))

    nx.finish(mon, model, probe_batch, nn.CrossEntropyLoss(), optimizer=optimizer)

    test_loss, test_accuracy = test(model, test_x, test_y)
    return {
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "first_epoch_loss": train_losses[0],
        "last_epoch_loss": train_losses[-1],
    }
