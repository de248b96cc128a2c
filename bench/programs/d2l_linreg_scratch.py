"""Port of d2l-ai/d2l-en's "Linear Regression Implementation from Scratch" (PyTorch tab): the
``LinearRegressionScratch`` model (plain tensors ``w`` and ``b`` created with
``requires_grad=True``, not ``nn.Parameter``s), the hand-written squared loss, the hand-written
``SGD`` class (a ``d2l.HyperParameters``, not a ``torch.optim.Optimizer``: ``param -= lr *
param.grad`` in place, ``param.grad.zero_()``), trained by d2l's ``Trainer`` on
``SyntheticRegressionData``.

Source: github.com/d2l-ai/d2l-en, ``chapter_linear-regression/linear-regression-scratch.md``
(PyTorch tab), ``chapter_linear-regression/synthetic-regression-data.md`` and the library they
build on, ``d2l/torch.py`` (``HyperParameters``, ``Module``, ``DataModule``, ``Trainer``,
``SyntheticRegressionData``, ``LinearRegressionScratch``, ``SGD``) at commit
23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0, ``LICENSE-SAMPLECODE``; text
CC BY-SA 4.0). Written anew from the facts of those files; no code copied (the d2l library
classes are bench.programs.d2l, shared with the other d2l ports).

Kept: everything the page runs. ``LinearRegressionScratch(2, lr=0.03)`` with ``sigma=0.01``:
``w = normal(0, sigma, (num_inputs, 1), requires_grad=True)``, ``b = zeros(1,
requires_grad=True)``; ``forward`` = ``matmul(X, w) + b``; ``loss`` = ``mean((y_hat - y) ** 2 /
2)`` (no reshape of ``y``, as the PyTorch tab has it); ``configure_optimizers`` returns
``SGD([w, b], lr)``; ``SyntheticRegressionData(w=[2, -3.4], b=4.2)``: noise 0.01, 1,000 train and
1,000 val examples, ``X = randn(n, 2)``, ``y = X @ reshape(w, (-1, 1)) + b + randn(n, 1) *
noise``, batch size 32, a ``DataLoader`` over ``TensorDataset`` with ``shuffle=train``;
``Trainer(max_epochs=3)``; the page's ``fit_epoch`` (added to ``d2l.Trainer`` with
``add_to_class``; here a subclass): ``model.train()``, per batch ``loss =
model.training_step(batch)``, ``optim.zero_grad()``, then under ``torch.no_grad()``
``loss.backward()`` (clipping only when ``gradient_clip_val > 0``: never here) and
``optim.step()``; then ``model.eval()`` and ``validation_step`` over the val loader. The page's
check: the error in estimating ``w`` and ``b``.
Replaced: nothing (the data is the chapter's own synthetic data). Added:
``torch.manual_seed(seed)``; the ProgressBoard records its points instead of drawing.
Measure only: the norm of ``data.w - model.w`` and ``|data.b - model.b|`` (the page prints both),
the last epoch's val loss from the board.

nndx, as the author would add it (the shared d2l ``Trainer.fit``): once
``configure_optimizers`` has made the optimizer (the page's own ``SGD`` object), a preflight
``nndx.probe(model, batch, model.loss, optimizer=optim)`` on the first training batch;
``nndx.Monitor(model, optim, every=10)`` around the epochs, each training batch's loss logged
after the step and each epoch's val loss logged as ``split="val"`` (the board's val point);
after the last epoch ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch

from bench.programs import d2l
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_linreg_scratch"
SOURCE = Source("d2l-ai/d2l-en", "chapter_linear-regression/linear-regression-scratch.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (code) / CC-BY-SA-4.0 (text)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (3 epochs of 32 batches, lr 0.03, the chapter's synthetic data)"),
        Variant(
            "targets_1d",
            "SyntheticRegressionData builds its labels as a vector, y = X @ w + b + randn(n) * noise (w not "
            "reshaped to a column): y is (n,) while y_hat is (n, 1), so the squared loss (y_hat - y) ** 2 / 2 "
            "broadcasts to a (32, 32) matrix of every prediction against every label and its mean is minimised "
            "by predicting the batch mean: w goes to 0",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/matroid/dlwithtf/issues/14",
             "https://discuss.pytorch.org/t/output-of-the-model-depends-on-the-shape-of-the-weights-tensor/148155",
             "https://solofox.github.io/torch/broadcasting/2025/12/07/torch-broadcasting-trap.html",
             # the section's exercise 5 asks why reshape is needed in the loss function
             "https://d2l.ai/chapter_linear-regression/linear-regression-scratch.html#exercises"),
            Measure("w_error", "||w_true - w|| at least 1.0 above the healthy run's (the true w has norm "
                    "3.9): 3.84/3.76/3.81 against 0.20/0.17/0.22 healthy on seeds 0/1/2",
                    lambda healthy, buggy: not buggy < healthy + 1.0),
        ),
        Variant(
            "no_zero_grad",
            "fit_epoch (written out again for the page, as the chapter does with add_to_class) leaves out "
            "self.optim.zero_grad(): w.grad and b.grad keep the sum of every batch's gradient, so each SGD step "
            "moves by lr times the accumulated sum and the parameters swing around the solution instead of "
            "settling on it",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/deepjavalibrary/d2l-java/pull/202",
             "https://github.com/greebear/pytorch-learning/issues/1",
             "https://github.com/jcjohnson/pytorch-examples/issues/31"),
            Measure("w_error", "||w_true - w|| at least 0.3 above the healthy run's: 2.98/2.00/2.14 against "
                    "0.20/0.17/0.22 healthy on seeds 0/1/2",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

NUM_INPUTS, LR, SIGMA, MAX_EPOCHS = 2, 0.03, 0.01, 3
TRUE_W, TRUE_B = (2.0, -3.4), 4.2


# --------------------------------------------------------------------------- synthetic-regression-data.md


class SyntheticRegressionData(d2l.DataModule):
    """Synthetic data for linear regression."""

    def __init__(self, w, b, noise=0.01, num_train=1000, num_val=1000, batch_size=32, labels_1d=False):
        super().__init__()
        self.save_hyperparameters()
        n = num_train + num_val
        self.X = torch.randn(n, len(w))
        if labels_1d:  # the bug: y as a vector, as y = X @ w + b comes out when w is 1-D
            noise = torch.randn(n) * noise
            self.y = torch.matmul(self.X, w) + b + noise
        else:
            noise = torch.randn(n, 1) * noise
            self.y = torch.matmul(self.X, torch.reshape(w, (-1, 1))) + b + noise

    def get_dataloader(self, train):
        i = slice(0, self.num_train) if train else slice(self.num_train, None)
        return self.get_tensorloader((self.X, self.y), train, i)


# --------------------------------------------------------------------------- linear-regression-scratch.md


class LinearRegressionScratch(d2l.Module):
    """The linear regression model implemented from scratch."""

    def __init__(self, num_inputs, lr, sigma=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.w = torch.normal(0, sigma, (num_inputs, 1), requires_grad=True)
        self.b = torch.zeros(1, requires_grad=True)

    def forward(self, X):
        return torch.matmul(X, self.w) + self.b

    def loss(self, y_hat, y):
        l = (y_hat - y) ** 2 / 2  # noqa: E741
        return torch.mean(l)

    def configure_optimizers(self):
        return SGD([self.w, self.b], self.lr)


class SGD(d2l.HyperParameters):
    """Minibatch stochastic gradient descent."""

    def __init__(self, params, lr):
        self.save_hyperparameters()

    def step(self):
        for param in self.params:
            param -= self.lr * param.grad

    def zero_grad(self):
        for param in self.params:
            if param.grad is not None:
                param.grad.zero_()


class Trainer(d2l.Trainer):
    """d2l.Trainer with the page's ``fit_epoch`` (the board's val point is the val loss alone)."""

    def __init__(self, max_epochs, nx, num_gpus=0, gradient_clip_val=0, zero_grad=True):
        super().__init__(max_epochs, nx, num_gpus, gradient_clip_val)
        self.clear_grads = zero_grad

    def fit_epoch(self):
        self.model.train()
        for batch in self.train_dataloader:
            loss = self.model.training_step(self.prepare_batch(batch))
            if self.clear_grads:
                self.optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                if self.gradient_clip_val > 0:
                    raise NotImplementedError("clip_gradients is not used by this page")
                self.optim.step()
            self.nx.timed(lambda: self.mon.log(loss))  # noqa: B023
            self.train_batch_idx += 1
        if self.val_dataloader is None:
            return
        self.model.eval()
        for batch in self.val_dataloader:
            with torch.no_grad():
                self.model.validation_step(self.prepare_batch(batch))
            self.val_batch_idx += 1
        val_loss = self.model.board.data["val_loss"][-1]
        self.nx.timed(lambda: self.mon.log(val_loss, split="val"))


# --------------------------------------------------------------------------- the page's run


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    model = LinearRegressionScratch(NUM_INPUTS, lr=LR, sigma=SIGMA)
    data = SyntheticRegressionData(w=torch.tensor(TRUE_W), b=TRUE_B, labels_1d=variant == "targets_1d")
    trainer = Trainer(max_epochs=MAX_EPOCHS, nx=nx, zero_grad=variant != "no_zero_grad")
    trainer.fit(model, data)

    with torch.no_grad():
        w_err = data.w - torch.reshape(model.w, data.w.shape)
        b_err = data.b - model.b
    return {"w_error": float(w_err.norm()), "b_error": float(b_err.abs().item()),
            "val_loss": float(model.board.data["val_loss"][-1]),
            "train_loss": float(model.board.data["train_loss"][-1])}  # fmt: skip
