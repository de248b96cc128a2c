"""Port of d2l-ai/d2l-en's "Implementation of Multilayer Perceptrons" (PyTorch tab): the
from-scratch ``MLPScratch`` (``nn.Parameter`` weights, the book's own ``relu``), then the
concise ``MLP`` (``Flatten``, ``LazyLinear``, ``ReLU``, ``LazyLinear``), both trained by d2l's
``Trainer`` on an image classification set.

Source: github.com/d2l-ai/d2l-en, ``chapter_multilayer-perceptrons/mlp-implementation.md``
(PyTorch tab) and the library it builds on, ``d2l/torch.py`` (``HyperParameters``, ``Module``,
``Classifier``, ``DataModule``, ``Trainer``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a
(sample code MIT-0, ``LICENSE-SAMPLECODE``; text CC BY-SA 4.0). Written anew from the facts of
those files; no code copied (the d2l library classes are bench.programs.d2l, shared with the other d2l ports).

Kept: ``MLPScratch(num_inputs, num_outputs, num_hiddens, lr, sigma=0.01)``: ``W1 =
nn.Parameter(randn(num_inputs, num_hiddens) * sigma)``, ``b1 = nn.Parameter(zeros)``, ``W2``,
``b2`` likewise; ``relu(X) = torch.max(X, zeros_like(X))``; ``forward``: ``X.reshape(-1,
num_inputs)``, ``H = relu(X @ W1 + b1)``, ``H @ W2 + b2``; ``MLP(num_outputs, num_hiddens,
lr)``: ``Sequential(Flatten, LazyLinear(num_hiddens), ReLU, LazyLinear(num_outputs))``;
hparams 10 outputs, 256 hidden units, lr 0.1; ``Classifier.loss`` (``F.cross_entropy``, mean),
``accuracy``, ``validation_step``; ``configure_optimizers`` = ``torch.optim.SGD(self.parameters(),
lr)``; ``Trainer.fit`` / ``fit_epoch`` (``optim.zero_grad()``, then ``loss.backward()`` and
``optim.step()`` inside ``torch.no_grad()``); one ``Trainer`` fitting the scratch model then the
concise one, as the page does; batch size 256, ``shuffle=train``.
Replaced: Fashion-MNIST (28x28 = 784 inputs) by scikit-learn's 8x8 digits (1,437 train / 360
val) through ``ToTensor`` (``/ 255``, (1, 8, 8)); ``num_inputs=64``. Shrunk: 60 epochs of 6
batches (360 steps) instead of 10 of 235; the ProgressBoard records its points instead of
drawing; ``torch.manual_seed(seed)``.
Measure only: each model's last-epoch val loss and val accuracy (the board's numbers).

nndx, as the author would add it: inside ``Trainer.fit`` once ``configure_optimizers`` has made
the optimizer, a preflight ``nndx.probe(model, batch, model.loss, optimizer=optim)`` on the first
training batch; ``nndx.Monitor(model, optim, every=10)`` around the epochs, each training batch's
loss logged after the step and each epoch's val loss logged as ``split="val"`` with its
accuracy; after the last epoch ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. Both fits
are diagnosed and read together.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs.d2l import Classifier, DigitsData, Trainer
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_mlp"
SOURCE = Source("d2l-ai/d2l-en", "chapter_multilayer-perceptrons/mlp-implementation.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (code) / CC-BY-SA-4.0 (text)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (shrunk: 8x8 digits, 60 epochs of 6 batches)"),
        Variant(
            "zero_init",
            "MLPScratch initialises W1 and W2 with zeros (sigma=0) instead of randn * 0.01: every hidden unit "
            "computes the same thing, the hidden activations and both weight gradients are zero, only b2 learns",
            (C.BAD_INIT,),
            ("https://github.com/wagonhelm/NaNmnist/issues/2",
             "https://github.com/nndl/nndl-discussion/issues/14",
             "https://github.com/rasmusbergpalm/DeepLearnToolbox/issues/31"),
            Measure("scratch_val_acc", "the scratch model's last-epoch val accuracy at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "relu_on_logits",
            "the concise MLP's Sequential ends in nn.ReLU() after the last LazyLinear: the logits handed to "
            "F.cross_entropy are clipped at zero, so a class can never score below the others",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/huyng/tensorflow-vgg/issues/13",
             "https://github.com/hunkim/PyTorchZeroToAll/pull/4",
             "https://github.com/forresti/SqueezeNet/issues/10"),
            Measure("concise_val_loss", "the concise model's last-epoch val loss at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

HPARAMS_SCRATCH = {"num_inputs": 64, "num_outputs": 10, "num_hiddens": 256, "lr": 0.1}
HPARAMS = {"num_outputs": 10, "num_hiddens": 256, "lr": 0.1}
BATCH_SIZE, MAX_EPOCHS = 256, 60


# --------------------------------------------------------------------------- chapter_multilayer-perceptrons/mlp-implementation.md


def relu(X):
    a = torch.zeros_like(X)
    return torch.max(X, a)


def make_models(variant: str):
    zero = variant == "zero_init"
    relu_out = variant == "relu_on_logits"

    class MLPScratch(Classifier):
        def __init__(self, num_inputs, num_outputs, num_hiddens, lr, sigma=0.01):
            super().__init__()
            self.save_hyperparameters()
            if zero:
                sigma = 0.0
            self.W1 = nn.Parameter(torch.randn(num_inputs, num_hiddens) * sigma)
            self.b1 = nn.Parameter(torch.zeros(num_hiddens))
            self.W2 = nn.Parameter(torch.randn(num_hiddens, num_outputs) * sigma)
            self.b2 = nn.Parameter(torch.zeros(num_outputs))

        def forward(self, X):
            X = X.reshape((-1, self.num_inputs))
            H = relu(torch.matmul(X, self.W1) + self.b1)
            return torch.matmul(H, self.W2) + self.b2

    class MLP(Classifier):
        def __init__(self, num_outputs, num_hiddens, lr):
            super().__init__()
            self.save_hyperparameters()
            layers = [nn.Flatten(), nn.LazyLinear(num_hiddens), nn.ReLU(), nn.LazyLinear(num_outputs)]
            if relu_out:
                layers.append(nn.ReLU())
            self.net = nn.Sequential(*layers)

    return MLPScratch, MLP


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    MLPScratch, MLP = make_models(variant)
    out: dict[str, float] = {}

    model = MLPScratch(**HPARAMS_SCRATCH)
    data = DigitsData(batch_size=BATCH_SIZE, seed=seed)
    trainer = Trainer(max_epochs=MAX_EPOCHS, nx=nx)
    trainer.fit(model, data)
    out["scratch_val_loss"] = model.board.data["val_loss"][-1]
    out["scratch_val_acc"] = model.board.data["val_acc"][-1]
    out["scratch_train_loss"] = model.board.data["train_loss"][-1]

    model = MLP(**HPARAMS)
    trainer.fit(model, data)
    out["concise_val_loss"] = model.board.data["val_loss"][-1]
    out["concise_val_acc"] = model.board.data["val_acc"][-1]
    out["concise_train_loss"] = model.board.data["train_loss"][-1]
    return out
