"""Port of d2l.ai's "Weight Decay" section (PyTorch tab): high-dimensional linear regression
(200 inputs, 20 training examples) fitted from scratch with an L2 penalty added to the squared
loss, trained by d2l's hand-written minibatch SGD, with lambda 0 (overfits, the section's point)
and lambda 3; then the concise version, ``weight_decay`` on the weight's parameter group of
``torch.optim.SGD``.

Source: github.com/d2l-ai/d2l-en, ``chapter_linear-regression/weight-decay.md`` (the PyTorch
tab) and the classes it builds on in ``d2l/torch.py`` (``HyperParameters``, ``Module``,
``DataModule.get_tensorloader``, ``Trainer``, ``LinearRegressionScratch``, ``SGD``,
``LinearRegression``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a (code: MIT-0, the
repository's LICENSE-SAMPLECODE; text CC BY-SA 4.0). Written anew from the facts of those files;
no code copied. At this commit the section's scratch pieces are ``l2_penalty``,
``WeightDecayScratch`` (``LinearRegressionScratch``: the older editions' ``init_params`` and
``squared_loss``), d2l's ``SGD`` class (the older ``d2l.sgd``) and ``train_scratch(lambd)``
(the older ``train(lambd)``).

Kept: ``Data(num_train=20, num_val=100, num_inputs=200, batch_size=5)``: ``X = randn(n, 200)``,
``noise = randn(n, 1) * 0.01``, ``w = ones((200, 1)) * 0.01``, ``b = 0.05``, ``y = X @ w + b +
noise``; the first 20 rows for training (a shuffling ``DataLoader`` of 5), the other 100 for
validation (not shuffled); ``l2_penalty(w) = sum(w**2) / 2``; ``LinearRegressionScratch(num_inputs,
lr, sigma=0.01)``: ``w = normal(0, sigma, (num_inputs, 1), requires_grad=True)`` and ``b =
zeros(1, requires_grad=True)`` as plain tensor attributes (not ``nn.Parameter`` s: the module
registers no parameters), ``forward = X @ w + b``, ``loss = mean((y_hat - y)**2 / 2)``,
``configure_optimizers = SGD([w, b], lr)``; ``WeightDecayScratch.loss`` = that loss ``+ lambd *
l2_penalty(w)`` (on training and validation batches alike); d2l's ``SGD`` (``step``: ``param -=
lr * param.grad`` for each param; ``zero_grad``: ``param.grad.zero_()`` when there is one);
``Trainer(max_epochs=10)`` made once and reused by every fit; ``fit``: ``configure_optimizers``,
then per epoch ``model.train()``, per training batch ``loss = training_step(batch)``,
``optim.zero_grad()``, under ``torch.no_grad()`` ``loss.backward()`` and ``optim.step()``, then
``model.eval()`` and ``validation_step`` on each val batch under ``torch.no_grad()``;
``train_scratch(0)`` and ``train_scratch(3)`` (``WeightDecayScratch(num_inputs=200, lambd,
lr=0.01)``, ``L2 norm of w`` = ``l2_penalty(model.w)``); ``WeightDecay(wd=3, lr=0.01)``:
``LinearRegression`` (``nn.LazyLinear(1)``, ``weight.data.normal_(0, 0.01)`` and
``bias.data.fill_(0)`` called on the still uninitialised lazy parameters, which PyTorch
re-initialises at the first forward, as it does in the book; ``nn.MSELoss()``) with
``torch.optim.SGD([{'params': net.weight, 'weight_decay': wd}, {'params': net.bias}], lr)``,
fitted by the same trainer.
Left out: the ``ProgressBoard`` animation (``Module.plot``) and the prints; ``save_hyperparameters``
is a plain attribute assignment. Not shrunk otherwise: the section already runs in a second.
``seed`` seeds ``torch.manual_seed`` (the book seeds nothing).
Measure only (not in the program): per fit, the mean squared error ``mean((y_hat - y)**2 / 2)``
without the penalty, the targets as a column, over the validation and the training rows after
the last epoch (``val_mse_*``, ``train_mse_*``), the last epoch's mean training loss and
``l2_penalty(w)``.

nndx, as the author would add it: in ``Trainer.fit`` once ``configure_optimizers`` has made the
optimizer, a preflight ``nndx.probe(model, first_batch, model.loss, optimizer=self.optim)`` on
the first training batch; ``nndx.Monitor(model, self.optim, every=10)`` open for the epochs,
each training batch's loss logged after the step (where ``training_step`` plots it) and each
epoch's mean validation loss logged as ``split="val"`` (``validation_step``'s plot); after the
epochs ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``. Every fit of
the section (three) is watched; the author reads the three diagnoses together.
``self.optim`` is what the program has: d2l's own ``SGD`` for the scratch fits (not a
``torch.optim`` optimizer), ``torch.optim.SGD`` for the concise one.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_weight_decay"
SOURCE = Source("d2l-ai/d2l-en", "chapter_linear-regression/weight-decay.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published: train_scratch(0), train_scratch(3), WeightDecay(wd=3)"),
        Variant(
            "no_zero_grad",
            "the training loop never clears the gradients (Trainer.fit_epoch without optim.zero_grad()): "
            "loss.backward() adds each batch's gradient to all the earlier ones and the SGD steps by the sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/deepjavalibrary/d2l-java/pull/202",
             "https://github.com/jcjohnson/pytorch-examples/issues/31",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("val_mse_scratch3", "the lambda=3 scratch fit's validation squared error at least 2x the "
                    "healthy run's (or not finite): 0.066/0.118 against 0.011/0.012 on seeds 0/1",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "targets_1d_broadcast",
            "the labels are built as a vector of shape (n,) (w and the noise drawn 1-D) while the model "
            "predicts (batch, 1): (y_hat - y) broadcasts to a (batch, batch) matrix and the squared loss "
            "compares every prediction with every label of the batch",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/matroid/dlwithtf/issues/14",
             "https://github.com/HIPS/Kayak/issues/14"),
            Measure("train_mse_scratch3", "the lambda=3 scratch fit's training squared error (measured with the "
                    "targets as a column) at least 5x the healthy run's: 0.0075/0.0046 against 0.00032/0.00030 "
                    "on seeds 0/1 (its validation error barely moves: 0.0117 against 0.0111 on seed 0)",
                    lambda healthy, buggy: not buggy < 5 * healthy),
        ),
    )
}

NUM_TRAIN, NUM_VAL, NUM_INPUTS, BATCH_SIZE, MAX_EPOCHS, LR = 20, 100, 200, 5, 10, 0.01


class HyperParameters:
    def save_hyperparameters(self, **hparams) -> None:
        self.hparams = hparams
        for k, v in hparams.items():
            setattr(self, k, v)


class Data(HyperParameters):
    def __init__(self, num_train: int, num_val: int, num_inputs: int, batch_size: int, flat: bool = False) -> None:
        self.save_hyperparameters(num_train=num_train, num_val=num_val, num_inputs=num_inputs, batch_size=batch_size)
        n = num_train + num_val
        self.X = torch.randn(n, num_inputs)
        if flat:  # the bug: w and the noise as vectors, so y is (n,)
            noise = torch.randn(n) * 0.01
            w, b = torch.ones(num_inputs) * 0.01, 0.05
        else:
            noise = torch.randn(n, 1) * 0.01
            w, b = torch.ones((num_inputs, 1)) * 0.01, 0.05
        self.y = torch.matmul(self.X, w) + b + noise

    def get_tensorloader(self, tensors, train: bool, indices=slice(0, None)):
        tensors = tuple(a[indices] for a in tensors)
        dataset = torch.utils.data.TensorDataset(*tensors)
        return torch.utils.data.DataLoader(dataset, self.batch_size, shuffle=train)

    def get_dataloader(self, train: bool):
        i = slice(0, self.num_train) if train else slice(self.num_train, None)
        return self.get_tensorloader([self.X, self.y], train, i)

    def train_dataloader(self):
        return self.get_dataloader(train=True)

    def val_dataloader(self):
        return self.get_dataloader(train=False)


def l2_penalty(w: torch.Tensor) -> torch.Tensor:
    return torch.sum(w**2) / 2


class Module(nn.Module, HyperParameters):
    def loss(self, y_hat, y):
        raise NotImplementedError

    def forward(self, X):
        return self.net(X)

    def training_step(self, batch):
        return self.loss(self(*batch[:-1]), batch[-1])

    def validation_step(self, batch):
        return self.loss(self(*batch[:-1]), batch[-1])


class SGD(HyperParameters):
    """d2l's minibatch stochastic gradient descent."""

    def __init__(self, params, lr: float) -> None:
        self.save_hyperparameters(params=params, lr=lr)

    def step(self) -> None:
        for param in self.params:
            param -= self.lr * param.grad

    def zero_grad(self) -> None:
        for param in self.params:
            if param.grad is not None:
                param.grad.zero_()


class LinearRegressionScratch(Module):
    def __init__(self, num_inputs: int, lr: float, sigma: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters(num_inputs=num_inputs, lr=lr, sigma=sigma)
        self.w = torch.normal(0, sigma, (num_inputs, 1), requires_grad=True)
        self.b = torch.zeros(1, requires_grad=True)

    def forward(self, X):
        return torch.matmul(X, self.w) + self.b

    def loss(self, y_hat, y):
        l = (y_hat - y) ** 2 / 2  # noqa: E741
        return torch.mean(l)

    def configure_optimizers(self):
        return SGD([self.w, self.b], self.lr)


class WeightDecayScratch(LinearRegressionScratch):
    def __init__(self, num_inputs: int, lambd: float, lr: float, sigma: float = 0.01) -> None:
        super().__init__(num_inputs, lr, sigma)
        self.save_hyperparameters(num_inputs=num_inputs, lambd=lambd, lr=lr, sigma=sigma)

    def loss(self, y_hat, y):
        return super().loss(y_hat, y) + self.lambd * l2_penalty(self.w)


class LinearRegression(Module):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters(lr=lr)
        self.net = nn.LazyLinear(1)
        self.net.weight.data.normal_(0, 0.01)
        self.net.bias.data.fill_(0)

    def forward(self, X):
        return self.net(X)

    def loss(self, y_hat, y):
        fn = nn.MSELoss()
        return fn(y_hat, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), self.lr)

    def get_w_b(self):
        return (self.net.weight.data, self.net.bias.data)


class WeightDecay(LinearRegression):
    def __init__(self, wd: float, lr: float) -> None:
        super().__init__(lr)
        self.save_hyperparameters(wd=wd, lr=lr)
        self.wd = wd

    def configure_optimizers(self):
        return torch.optim.SGD([
            {"params": self.net.weight, "weight_decay": self.wd},
            {"params": self.net.bias}], lr=self.lr)


class Trainer(HyperParameters):
    def __init__(self, max_epochs: int, nx: Nndx, zero_grad: bool = True) -> None:
        self.save_hyperparameters(max_epochs=max_epochs, gradient_clip_val=0)
        self.nx, self.clear_grads = nx, zero_grad

    def prepare_data(self, data: Data) -> None:
        self.train_dataloader = data.train_dataloader()
        self.val_dataloader = data.val_dataloader()
        self.num_train_batches = len(self.train_dataloader)
        self.num_val_batches = len(self.val_dataloader) if self.val_dataloader is not None else 0

    def prepare_model(self, model: Module) -> None:
        model.trainer = self
        self.model = model

    def fit(self, model: Module, data: Data) -> None:
        self.prepare_data(data)
        self.prepare_model(model)
        self.optim = model.configure_optimizers()
        self.epoch = 0
        self.train_batch_idx = 0
        self.val_batch_idx = 0
        with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
            first_batch = tuple(next(iter(self.train_dataloader)))
        self.nx.preflight(model, first_batch, model.loss, optimizer=self.optim)
        self.mon = self.nx.monitor(model, self.optim, every=10)
        for self.epoch in range(self.max_epochs):
            self.fit_epoch()
        self.nx.finish(self.mon, model, first_batch, model.loss, optimizer=self.optim)

    def fit_epoch(self) -> None:
        self.model.train()
        train_losses = []
        for batch in self.train_dataloader:
            loss = self.model.training_step(batch)
            if self.clear_grads:
                self.optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                self.optim.step()
            self.train_batch_idx += 1
            train_losses.append(loss.item())
            self.nx.timed(lambda: self.mon.log(loss))  # noqa: B023
        self.last_train_loss = sum(train_losses) / len(train_losses)
        if self.val_dataloader is None:
            return
        self.model.eval()
        val_losses = []
        for batch in self.val_dataloader:
            with torch.no_grad():
                val_losses.append(self.model.validation_step(batch).item())
            self.val_batch_idx += 1
        val_loss = sum(val_losses) / len(val_losses)
        self.nx.timed(lambda: self.mon.log(val_loss, split="val"))


def split_mse(model: Module, data: Data, train: bool) -> float:
    """Measure only: mean((y_hat - y)**2 / 2) over the training or validation rows, targets as a column."""
    i = slice(0, data.num_train) if train else slice(data.num_train, None)
    with torch.no_grad():
        X, y = data.X[i], data.y[i].reshape(-1, 1)
        return float(((model(X) - y) ** 2 / 2).mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data = Data(num_train=NUM_TRAIN, num_val=NUM_VAL, num_inputs=NUM_INPUTS, batch_size=BATCH_SIZE,
                flat=variant == "targets_1d_broadcast")  # fmt: skip
    trainer = Trainer(max_epochs=MAX_EPOCHS, nx=nx, zero_grad=variant != "no_zero_grad")
    out: dict[str, float] = {}

    def train_scratch(lambd: float) -> None:
        model = WeightDecayScratch(num_inputs=NUM_INPUTS, lambd=lambd, lr=LR)
        trainer.fit(model, data)
        tag = f"scratch{lambd:g}"
        out[f"l2_w_{tag}"] = float(l2_penalty(model.w))  # print('L2 norm of w:', ...)
        out[f"val_mse_{tag}"] = split_mse(model, data, train=False)
        out[f"train_mse_{tag}"] = split_mse(model, data, train=True)
        out[f"train_loss_{tag}"] = trainer.last_train_loss

    train_scratch(0)
    train_scratch(3)

    model = WeightDecay(wd=3, lr=LR)
    trainer.fit(model, data)
    out["l2_w_concise"] = float(l2_penalty(model.get_w_b()[0]))
    out["val_mse_concise"] = split_mse(model, data, train=False)
    out["train_mse_concise"] = split_mse(model, data, train=True)
    out["train_loss_concise"] = trainer.last_train_loss
    return out
