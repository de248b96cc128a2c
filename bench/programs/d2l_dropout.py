"""Port of d2l-ai/d2l-en's dropout section (PyTorch tab): ``dropout_layer`` written from
scratch inside ``DropoutMLPScratch``, then the concise ``DropoutMLP`` (``LazyLinear`` +
``nn.Dropout``), both trained by d2l's ``Trainer`` on an image classification set.

Source: github.com/d2l-ai/d2l-en, ``chapter_multilayer-perceptrons/dropout.md`` (PyTorch tab)
and the library it builds on, ``d2l/torch.py`` (``HyperParameters``, ``Module``,
``Classifier``, ``DataModule``, ``Trainer``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a
(sample code MIT-0, ``LICENSE-SAMPLECODE``; text CC BY-SA 4.0). Written anew from the facts of
those files; no code copied.

Kept: ``dropout_layer(X, dropout)`` (assert 0 <= dropout <= 1; all zeros at 1; ``mask =
(torch.rand(X.shape) > dropout).float()``; ``mask * X / (1.0 - dropout)``);
``DropoutMLPScratch(num_outputs, num_hiddens_1, num_hiddens_2, dropout_1, dropout_2, lr)``:
three ``LazyLinear``, a ReLU, the input reshaped to ``(X.shape[0], -1)``, dropout after each
hidden ReLU only ``if self.training``; ``DropoutMLP``: ``Sequential(Flatten, LazyLinear,
ReLU, Dropout, LazyLinear, ReLU, Dropout, LazyLinear)``; the hparams (10 outputs, 256 and 256
hidden units, dropout 0.5 and 0.5, lr 0.1); ``Classifier.loss`` (``F.cross_entropy`` on the
reshaped logits, mean), ``Classifier.accuracy`` (argmax), ``Classifier.validation_step``
(loss and accuracy plotted), ``Module.training_step`` (loss plotted), ``configure_optimizers``
= ``SGD(self.parameters(), lr=self.lr)``; ``save_hyperparameters`` (the constructor's
arguments become attributes, read through the caller's frame); ``Trainer.fit`` /
``fit_epoch`` (``model.train()``, per batch ``training_step``, ``optim.zero_grad()``, then
``loss.backward()`` and ``optim.step()`` inside ``torch.no_grad()``; then ``model.eval()`` and
``validation_step`` on every val batch under ``no_grad``); one ``Trainer`` fitting the scratch
model, then the concise one, as the page does; ``DataModule.get_tensorloader``-style loaders
(``shuffle=train``), batch size 256.
Replaced: Fashion-MNIST (28x28, 60,000 / 10,000) by scikit-learn's 8x8 digits (1,437 train /
360 val), pixels through ``ToTensor`` (``/ 255``, shape (1, 8, 8)); the LazyLinear input width
follows (64). Shrunk: 100 epochs instead of 10 (the digits give 6 batches an epoch instead of
235: 600 steps instead of 2,350); the ``ProgressBoard`` records the plotted points (averaged
per epoch) instead of drawing them; ``torch.manual_seed`` set.
Measure only (not in the program): nothing; each model's last-epoch val loss and val
accuracy, the numbers the board plots, are returned.

nndx, as the author would add it: inside ``Trainer.fit`` once ``configure_optimizers`` has
made the optimizer, a preflight ``nndx.probe(model, batch, model.loss, optimizer=optim)`` on
the first training batch; ``nndx.Monitor(model, optim)`` around the epochs, each training
batch's loss logged after the step and each epoch's mean val loss logged as ``split="val"``
with its accuracy; after the last epoch ``nndx.probe(..., monitor=mon)`` on the same batch
and ``nndx.diagnose``. Both fits (scratch, concise) are diagnosed; the author reads both,
ranked together.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs.d2l import Classifier, DigitsData, Trainer
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_dropout"
SOURCE = Source("d2l-ai/d2l-en", "chapter_multilayer-perceptrons/dropout.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (code) / CC-BY-SA-4.0 (text)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (shrunk: 8x8 digits, 100 epochs of 6 batches)"),
        Variant(
            "dropout_at_eval",
            "DropoutMLPScratch guards dropout with its own is_training attribute, set True in __init__ and never "
            "changed (the PyTorch port's code of mid-2020), instead of nn.Module's self.training: model.eval() "
            "does not turn it off, so every validation pass drops half of each hidden layer",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/d2l-ai/d2l-en/issues/1093",
             "https://github.com/pytorch/pytorch/issues/26338",
             "https://github.com/rixwew/pytorch-fm/issues/21",
             "https://github.com/delip/PyTorchNLPBook/issues/28"),
            Measure("scratch_val_loss", "the scratch model's last-epoch val loss at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "DropoutMLP's Sequential ends in nn.Softmax(dim=1), and Classifier.loss's F.cross_entropy (which "
            "takes logits) applies log-softmax again on the probabilities",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/CyberDataLab/nebula/issues/15",
             "https://github.com/nishnik/Deep-Semantic-Similarity-Model-PyTorch/issues/2"),
            Measure("concise_val_loss", "the concise model's last-epoch val loss at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

HPARAMS = {"num_outputs": 10, "num_hiddens_1": 256, "num_hiddens_2": 256, "dropout_1": 0.5, "dropout_2": 0.5,
           "lr": 0.1}  # fmt: skip
BATCH_SIZE, MAX_EPOCHS = 256, 100


# --------------------------------------------------------------------------- chapter_multilayer-perceptrons/dropout.md


def dropout_layer(X, dropout):
    assert 0 <= dropout <= 1
    if dropout == 1:
        return torch.zeros_like(X)
    mask = (torch.rand(X.shape) > dropout).float()
    return mask * X / (1.0 - dropout)


def make_models(variant: str):
    own_flag = variant == "dropout_at_eval"
    softmax_out = variant == "softmax_before_cross_entropy"

    class DropoutMLPScratch(Classifier):
        def __init__(self, num_outputs, num_hiddens_1, num_hiddens_2, dropout_1, dropout_2, lr):
            super().__init__()
            self.save_hyperparameters()
            self.lin1 = nn.LazyLinear(num_hiddens_1)
            self.lin2 = nn.LazyLinear(num_hiddens_2)
            self.lin3 = nn.LazyLinear(num_outputs)
            self.relu = nn.ReLU()
            if own_flag:
                self.is_training = True

        def forward(self, X):
            on = self.is_training if own_flag else self.training
            H1 = self.relu(self.lin1(X.reshape((X.shape[0], -1))))
            if on:
                H1 = dropout_layer(H1, self.dropout_1)
            H2 = self.relu(self.lin2(H1))
            if on:
                H2 = dropout_layer(H2, self.dropout_2)
            return self.lin3(H2)

    class DropoutMLP(Classifier):
        def __init__(self, num_outputs, num_hiddens_1, num_hiddens_2, dropout_1, dropout_2, lr):
            super().__init__()
            self.save_hyperparameters()
            layers = [nn.Flatten(), nn.LazyLinear(num_hiddens_1), nn.ReLU(),
                      nn.Dropout(dropout_1), nn.LazyLinear(num_hiddens_2), nn.ReLU(),
                      nn.Dropout(dropout_2), nn.LazyLinear(num_outputs)]  # fmt: skip
            if softmax_out:
                layers.append(nn.Softmax(dim=1))
            self.net = nn.Sequential(*layers)

    return DropoutMLPScratch, DropoutMLP


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    DropoutMLPScratch, DropoutMLP = make_models(variant)
    out: dict[str, float] = {}

    model = DropoutMLPScratch(**HPARAMS)
    data = DigitsData(batch_size=BATCH_SIZE, seed=seed)
    trainer = Trainer(max_epochs=MAX_EPOCHS, nx=nx)
    trainer.fit(model, data)
    out["scratch_val_loss"] = model.board.data["val_loss"][-1]
    out["scratch_val_acc"] = model.board.data["val_acc"][-1]
    out["scratch_train_loss"] = model.board.data["train_loss"][-1]

    model = DropoutMLP(**HPARAMS)
    trainer.fit(model, data)
    out["concise_val_loss"] = model.board.data["val_loss"][-1]
    out["concise_val_acc"] = model.board.data["val_acc"][-1]
    out["concise_train_loss"] = model.board.data["train_loss"][-1]
    return out
