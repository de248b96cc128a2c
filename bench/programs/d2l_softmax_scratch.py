"""Port of d2l-ai/d2l-en's "Softmax Regression Implementation from Scratch" (PyTorch tab): the
hand-written ``softmax`` (``exp`` over the row sum, no max subtracted), ``SoftmaxRegressionScratch``
(plain ``requires_grad`` tensors ``W`` and ``b`` returned by an overridden ``parameters()``), the
hand-written ``cross_entropy`` (``-mean(log(y_hat[range(n), y]))``), trained by d2l's ``Trainer``
with ``Classifier.configure_optimizers`` (``torch.optim.SGD(self.parameters(), lr)``).

Source: github.com/d2l-ai/d2l-en, ``chapter_linear-classification/softmax-regression-scratch.md``
(PyTorch tab) and ``d2l/torch.py`` (``HyperParameters``, ``Module``, ``Classifier``,
``DataModule``, ``Trainer``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code
MIT-0, ``LICENSE-SAMPLECODE``; text CC BY-SA 4.0). Written anew from the facts of those files; no
code copied (the d2l library classes are bench.programs.d2l, shared with the other d2l ports).

Kept: ``softmax(X) = exp(X) / exp(X).sum(1, keepdims=True)``; ``SoftmaxRegressionScratch(num_inputs,
num_outputs, lr, sigma=0.01)``: ``W = torch.normal(0, sigma, (num_inputs, num_outputs),
requires_grad=True)``, ``b = zeros(num_outputs, requires_grad=True)``, ``parameters()`` returns
``[W, b]``; ``forward``: ``X.reshape(-1, W.shape[0])``, ``softmax(X @ W + b)``; ``loss`` =
``cross_entropy(y_hat, y)``; hparams 10 outputs, lr 0.1; ``Classifier.accuracy`` (argmax of the
probabilities) and ``validation_step``; ``Trainer.fit`` / ``fit_epoch`` as in d2l; batch size 256,
``shuffle=train``.
Replaced: Fashion-MNIST (784 inputs) by scikit-learn's 8x8 digits (1,437 train / 360 val) through
``ToTensor`` (``/ 255``, (1, 8, 8)); ``num_inputs=64``. Shrunk: 60 epochs of 6 batches (360 steps)
instead of 10 of 235; the ProgressBoard records its points; ``torch.manual_seed(seed)``. The
section's closing prediction display (``data.visualize``) is left out.
Measure only (not in the program): each epoch's board numbers (val loss, val accuracy), and the
val accuracy of ``argmax(X @ W + b)`` (``val_acc_logits``: what the model predicts whatever its
output normalisation) and their cross-entropy under a correct softmax (``val_ce_logits``).

nndx, as the author would add it: inside ``Trainer.fit`` once ``configure_optimizers`` has made
the optimizer, a preflight ``nndx.probe(model, batch, model.loss, optimizer=optim)`` on the first
training batch; ``nndx.Monitor(model, optim, every=10)`` around the epochs, each training batch's
loss logged after the step and each epoch's val loss logged as ``split="val"`` with its
accuracy; after the last epoch ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.programs import data as digits
from bench.programs.d2l import Classifier, DataModule, DigitsData, Trainer
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_softmax_scratch"
SOURCE = Source("d2l-ai/d2l-en", "chapter_linear-classification/softmax-regression-scratch.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (code) / CC-BY-SA-4.0 (text)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (shrunk: 8x8 digits, 60 epochs of 6 batches)"),
        Variant(
            "pixels_unscaled",
            "the images reach the model as raw 0..255 pixel values (no ToTensor scaling): the logits grow "
            "into the hundreds after the first steps and the hand-written softmax's exp overflows (inf/inf = "
            "NaN), so the hand-written cross_entropy turns NaN",
            (C.NUMERICAL_OVERFLOW, C.UNNORMALIZED_INPUTS),
            ("https://github.com/Hzfinfdu/FDU-PRML-2023Fall/issues/4",
             "https://github.com/FlorianMuellerklein/Machine-Learning/issues/2",
             "https://github.com/ARM-software/ComputeLibrary/issues/148",
             "https://github.com/tensorflow/models/pull/181"),
            Measure("val_acc_logits", "the val accuracy of argmax(X @ W + b) at least 0.2 below the healthy run's "
                    "(or not finite)", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "softmax_wrong_axis",
            "softmax normalises over axis 0 (exp(X).sum(0, keepdims=True): over the batch) instead of axis 1 "
            "(over the classes): each 'probability' is a sample's share of its class column, and the "
            "cross_entropy trains against that",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/MicrosoftDocs/pytorchfundamentals/pull/21",
             "https://github.com/perone/euclidesdb/issues/2",
             "https://github.com/Lackel/DPN/issues/1"),
            Measure("val_acc_logits", "the val accuracy of argmax(X @ W + b) (measure only) at least 0.04 below the "
                    "healthy run's: 0.861/0.875 against 0.936/0.928 on seeds 0/1 (the board's own val accuracy, "
                    "through the buggy softmax, barely moves: 0.942 against 0.944 on seed 0)",
                    lambda healthy, buggy: not buggy > healthy - 0.04),
        ),
    )
}

HPARAMS = {"num_inputs": 64, "num_outputs": 10, "lr": 0.1}
BATCH_SIZE, MAX_EPOCHS = 256, 60


# --------------------------------------------------------------------------- softmax-regression-scratch.md


def make_model(variant: str):
    axis = 0 if variant == "softmax_wrong_axis" else 1

    def softmax(X):
        X_exp = torch.exp(X)
        partition = X_exp.sum(axis, keepdims=True)
        return X_exp / partition  # The broadcasting mechanism is applied here

    def cross_entropy(y_hat, y):
        return -torch.log(y_hat[list(range(len(y_hat))), y]).mean()

    class SoftmaxRegressionScratch(Classifier):
        def __init__(self, num_inputs, num_outputs, lr, sigma=0.01):
            super().__init__()
            self.save_hyperparameters()
            self.W = torch.normal(0, sigma, size=(num_inputs, num_outputs), requires_grad=True)
            self.b = torch.zeros(num_outputs, requires_grad=True)

        def parameters(self):
            return [self.W, self.b]

        def forward(self, X):
            X = X.reshape((-1, self.W.shape[0]))
            return softmax(torch.matmul(X, self.W) + self.b)

        def loss(self, y_hat, y):
            return cross_entropy(y_hat, y)

    return SoftmaxRegressionScratch


class RawDigitsData(DigitsData):
    """The bug: the pixels as 0..255 floats, no ToTensor scaling."""

    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        DataModule.__init__(self)
        self.save_hyperparameters()
        tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
        self.train = (tr_x.unsqueeze(1).float(), tr_y)
        self.val = (te_x.unsqueeze(1).float(), te_y)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    SoftmaxRegressionScratch = make_model(variant)
    Data = RawDigitsData if variant == "pixels_unscaled" else DigitsData
    data = Data(batch_size=BATCH_SIZE, seed=seed)
    model = SoftmaxRegressionScratch(**HPARAMS)
    trainer = Trainer(max_epochs=MAX_EPOCHS, nx=nx)
    trainer.fit(model, data)
    out = {
        "val_loss": model.board.data["val_loss"][-1],
        "val_acc": model.board.data["val_acc"][-1],
        "train_loss": model.board.data["train_loss"][-1],
    }
    with torch.no_grad():  # measure only
        X, y = data.val
        logits = X.reshape((-1, model.W.shape[0])) @ model.W + model.b
        out["val_acc_logits"] = float((logits.argmax(1) == y).float().mean())
        out["val_ce_logits"] = float(F.cross_entropy(logits, y))
    return out
