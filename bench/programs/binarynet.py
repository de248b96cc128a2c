"""Port of itayhubara's BinaryNet.pytorch (Binarized Neural Networks, Hubara, Courbariaux et al.
2016): the MNIST multilayer perceptron whose hidden layers multiply sign-binarized activations
by sign-binarized weights, a straight-through estimator passing the gradient through the sign.

Source: github.com/itayhubara/BinaryNet.pytorch, ``main_mnist.py`` and
``models/binarized_modules.py`` at commit 80f6d4685510314a974889c1ca50a385431bb69f (the
repository's HEAD, "adding support for pytorch2"; licence: none stated, no LICENSE file in
the repository). Written anew from the facts of those files; no code copied. The repository
has no ``models/binarized_fc.py``: its fully connected binarized network is ``main_mnist.py``'s
``Net``, ported here; ``main_binary.py`` trains the convolutional models through a regime
that rebuilds the optimizer every epoch and is not the program ported.

Kept: ``Binarize`` as an autograd ``Function`` (``forward``: a clone, ``sign()`` in ``det``
mode with scale 1; ``backward``: the straight-through estimator, the incoming gradient
returned unchanged), ``binarized(x) = Binarize.apply(x)``; ``BinarizeLinear(nn.Linear)``:
the input binarized unless it has 784 features (the image, left real-valued), the weight
binarized on every forward (the real-valued weight stays the parameter), ``F.linear`` without
the bias, then ``self.bias.org = self.bias.data.clone()`` and the bias added; ``Net``:
``fc1 = BinarizeLinear(784, H)``, ``bn1 = BatchNorm1d``, ``Hardtanh``, the same twice more
(``fc2``, ``fc3``; ``Dropout(0.5)`` between ``fc3`` and ``bn3``), ``fc4 = nn.Linear(H, 10)``
and ``LogSoftmax`` (the implicit dim of ``nn.LogSoftmax()`` resolves to 1 on these 2-d
outputs; written out); ``nn.CrossEntropyLoss`` on those log-probabilities, as published;
``optim.Adam(lr=0.01)``; ``train(epoch)``: ``model.train()``, per batch ``zero_grad``,
forward, loss, the in-loop ``if epoch % 40 == 0: lr *= 0.1`` (as published it multiplies the
lr by 0.1 on every batch of that epoch), ``zero_grad`` again, ``backward``, every parameter
with an ``org`` copied back from it, ``step``, every parameter with an ``org`` clamped to
[-1, 1] and copied into it (at this commit only the binarized layers' biases carry ``org``;
the weights are no longer clamped); ``test()``: ``model.eval()``, ``no_grad``, summed batch
losses over the dataset size, accuracy of the argmax; the main loop ``train(epoch); test()``
then ``if epoch % 40 == 0: lr *= 0.1``; ``torch.manual_seed(seed)``; batch 64, test batch
1000, the train loader shuffled; the inputs ``Normalize``d by a mean and std.
Fixed to run: ``BinarizeLinear`` at this commit leaves ``input_b`` unassigned when the input
has 784 features (an ``UnboundLocalError`` on the first batch); the port passes the image
through unbinarized there, as the same commit's ``BinarizeConv2d`` does for its 3-channel
input and as the previous commit's code did. ``Binarize.forward``/``backward`` are written as
static methods (the source's plain methods are called the same way by ``apply``).
Shrunk: scikit-learn's 8x8 digits upscaled to 28x28 (``data.upscaled``, 1,437 training and 360
test images) instead of MNIST, normalised by the training set's mean and std instead of
MNIST's (0.1307, 0.3081); hidden width ``H`` 256 instead of 2048 * 3; 12 epochs instead of 100
with the lr decay every 10 epochs instead of 40 (so the published decay, in-loop on every batch
of the decay epoch and once after it, happens once, at epoch 10, as at epoch 40 of 100); no
CUDA, no printing.
Measure only (not in the program): the last ``test()`` accuracy and loss, and the mean
training loss of the first and last epochs. Seed 0 (without nndx): healthy test accuracy 0.972.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with
the criterion and the optimizer (and the splits as ``data``); ``nndx.Monitor(model, optimizer,
every=10, loss_fn=criterion)`` around the epochs, the loss called as ``mon.loss_fn``, each
batch's loss logged and each ``test()`` logged as ``split="val"`` with its accuracy; then
``nndx.probe(..., monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "binarynet"
SOURCE = Source("itayhubara/BinaryNet.pytorch", "main_mnist.py", "80f6d4685510314a974889c1ca50a385431bb69f",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: digits at 28x28, width 256, 12 epochs)"),
        Variant(
            "sign_without_ste",
            "BinarizeLinear binarizes its input and weight with a plain tensor.sign() instead of the Binarize "
            "function with its straight-through backward: sign's derivative is zero, so no gradient reaches the "
            "binarized weights or anything below the last binarized layer; only fc3's bias, bn3 and fc4 learn",
            (C.DETACHED_GRAPH, C.VANISHING_GRADIENTS, C.FROZEN_PARAMETERS),
            ("https://github.com/itayhubara/BinaryNet.pytorch/issues/25",
             "https://github.com/layog/Accurate-Binary-Convolution-Network/issues/6",
             "https://github.com/MatthieuCourbariaux/BinaryConnect/issues/7"),
            Measure("test_accuracy", "last test() accuracy at least 0.03 below the healthy run's: "
                    "0.908/0.925/0.894 buggy against 0.972/0.972/0.953 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy < healthy - 0.03),
        ),
        Variant(
            "zero_grad_dropped",
            "both optimizer.zero_grad() calls of train() dropped (the published loop calls it twice; a clean-up "
            "that removed the duplicate took the other with it): every backward adds to the gradients of all "
            "earlier batches, and Adam steps along their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("test_accuracy", "last test() accuracy at least 0.05 below the healthy run's: "
                    "0.664/0.733/0.619 buggy against 0.972/0.972/0.953 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy < healthy - 0.05),
        ),
    )
}

HIDDEN, BATCH_SIZE, TEST_BATCH_SIZE, EPOCHS, LR, DECAY_EVERY = 256, 64, 1000, 12, 0.01, 10


# --------------------------------------------------------------------------- models/binarized_modules.py


class Binarize(torch.autograd.Function):
    """sign() forward ('det' mode, scale 1); straight-through backward."""

    @staticmethod
    def forward(ctx, input, quant_mode="det", allow_scale=False, inplace=False):  # noqa: A002 - the source's names
        output = input.clone()
        scale = output.abs().max() if allow_scale else 1
        return output.div(scale).sign().mul(scale)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None, None, None


def binarized(input: torch.Tensor, quant_mode: str = "det") -> torch.Tensor:  # noqa: A002
    return Binarize.apply(input, quant_mode)


class BinarizeLinear(nn.Linear):
    def __init__(self, *args, no_ste: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.no_ste = no_ste  # the bug: a plain sign(), whose gradient is zero

    def _binarize(self, t: torch.Tensor) -> torch.Tensor:
        return t.sign() if self.no_ste else binarized(t)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        if input.size(1) != 784:
            input_b = self._binarize(input)
        else:
            input_b = input  # unassigned at the source's commit (see the module docstring)
        weight_b = self._binarize(self.weight)
        out = F.linear(input_b, weight_b)
        if self.bias is not None:
            self.bias.org = self.bias.data.clone()
            out += self.bias.view(1, -1).expand_as(out)
        return out


# --------------------------------------------------------------------------- main_mnist.py


class Net(nn.Module):
    def __init__(self, no_ste: bool = False) -> None:
        super().__init__()
        self.fc1 = BinarizeLinear(784, HIDDEN, no_ste=no_ste)
        self.htanh1 = nn.Hardtanh()
        self.bn1 = nn.BatchNorm1d(HIDDEN)
        self.fc2 = BinarizeLinear(HIDDEN, HIDDEN, no_ste=no_ste)
        self.htanh2 = nn.Hardtanh()
        self.bn2 = nn.BatchNorm1d(HIDDEN)
        self.fc3 = BinarizeLinear(HIDDEN, HIDDEN, no_ste=no_ste)
        self.htanh3 = nn.Hardtanh()
        self.bn3 = nn.BatchNorm1d(HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, 10)
        self.logsoftmax = nn.LogSoftmax(dim=1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 28 * 28)
        x = self.fc1(x)
        x = self.bn1(x)
        x = self.htanh1(x)
        x = self.fc2(x)
        x = self.bn2(x)
        x = self.htanh2(x)
        x = self.fc3(x)
        x = self.drop(x)
        x = self.bn3(x)
        x = self.htanh3(x)
        x = self.fc4(x)
        return self.logsoftmax(x)


def _splits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    train_images, train_y, test_images, test_y = data.digit_images(seed=seed)
    train_x, test_x = data.upscaled(train_images, 28), data.upscaled(test_images, 28)
    mean, std = train_x.mean().item(), train_x.std().item()  # transforms.Normalize((mean,), (std,))
    return (train_x - mean) / std, train_y, (test_x - mean) / std, test_y


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_x, train_y, test_x, test_y = _splits(seed)
    generator = torch.Generator().manual_seed(seed)

    def train_loader():
        order = torch.randperm(len(train_y), generator=generator)  # shuffle=True
        for i in range(0, len(order), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            yield train_x[idx], train_y[idx]

    def test_loader():
        order = torch.randperm(len(test_y), generator=generator)  # shuffle=True, as published
        for i in range(0, len(order), TEST_BATCH_SIZE):
            idx = order[i : i + TEST_BATCH_SIZE]
            yield test_x[idx], test_y[idx]

    model = Net(no_ste=variant == "sign_without_ste")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    splits = (train_x, train_y, test_x, test_y)
    first_batch = (train_x[:BATCH_SIZE], train_y[:BATCH_SIZE])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    def run_epoch(epoch: int) -> float:
        model.train()
        losses = []
        for data_b, target in train_loader():
            if variant != "zero_grad_dropped":
                optimizer.zero_grad()
            output = model(data_b)
            loss = mon.loss_fn(output, target)
            if epoch % DECAY_EVERY == 0:
                optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"] * 0.1
            if variant != "zero_grad_dropped":
                optimizer.zero_grad()
            loss.backward()
            for p in list(model.parameters()):
                if hasattr(p, "org"):
                    p.data.copy_(p.org)
            optimizer.step()
            for p in list(model.parameters()):
                if hasattr(p, "org"):
                    p.org.copy_(p.data.clamp_(-1, 1))
            nx.timed(lambda: mon.log(loss))
            losses.append(loss.item())
        return sum(losses) / len(losses)

    def test() -> tuple[float, float]:
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data_b, target in test_loader():
                output = model(data_b)
                test_loss += criterion(output, target).item()
                pred = output.data.max(1, keepdim=True)[1]
                correct += int(pred.eq(target.data.view_as(pred)).sum())
        test_loss /= len(test_y)
        return test_loss, correct / len(test_y)

    epoch_losses = []
    test_loss, accuracy = float("nan"), 0.0
    for epoch in range(1, EPOCHS + 1):
        epoch_losses.append(run_epoch(epoch))
        test_loss, accuracy = test()
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=accuracy))
        if epoch % DECAY_EVERY == 0:
            optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"] * 0.1

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {
        "test_accuracy": accuracy,
        "test_loss": test_loss,
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
    }
