"""Port of d2l-ai/d2l-en's "Softmax Regression Implementation from Scratch" (PyTorch tab): the
hand-written ``softmax`` (``exp`` over the row sum, no max subtracted), ``SoftmaxRegressionScratch``
(plain ``requires_grad`` tensors ``W`` and ``b`` returned by an overridden ``parameters()``), the
hand-written ``cross_entropy`` (``-mean(log(y_hat[range(n), y]))``), trained by d2l's ``Trainer``
with ``Classifier.configure_optimizers`` (``torch.optim.SGD(self.parameters(), lr)``).

Source: github.com/d2l-ai/d2l-en, ``chapter_linear-classification/softmax-regression-scratch.md``
(PyTorch tab) and ``d2l/torch.py`` (``HyperParameters``, ``Module``, ``Classifier``,
``DataModule``, ``Trainer``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code
MIT-0, ``LICENSE-SAMPLECODE``; text CC BY-SA 4.0). Written anew from the facts of those files; no
code copied (the d2l library classes follow this repository's d2l_dropout port).

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

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as digits
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


# --------------------------------------------------------------------------- d2l/torch.py


class HyperParameters:
    def save_hyperparameters(self, ignore=()):
        frame = inspect.currentframe().f_back
        _, _, _, local_vars = inspect.getargvalues(frame)
        self.hparams = {k: v for k, v in local_vars.items()
                        if k not in set(list(ignore) + ["self"]) and not k.startswith("_")}  # fmt: skip
        for k, v in self.hparams.items():
            setattr(self, k, v)


class ProgressBoard(HyperParameters):
    """Records the points the board would draw (each label's mean over ``every_n`` points)."""

    def __init__(self) -> None:
        self.raw_points: dict[str, list[float]] = {}
        self.data: dict[str, list[float]] = {}

    def draw(self, x: float, y: float, label: str, every_n: int = 1) -> None:
        points = self.raw_points.setdefault(label, [])
        line = self.data.setdefault(label, [])
        points.append(float(y))
        if len(points) != every_n:
            return
        line.append(sum(points) / len(points))
        points.clear()


class Module(nn.Module, HyperParameters):
    def __init__(self, plot_train_per_epoch: int = 2, plot_valid_per_epoch: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.board = ProgressBoard()

    def loss(self, y_hat, y):
        raise NotImplementedError

    def forward(self, X):
        assert hasattr(self, "net"), "Neural network is defined"
        return self.net(X)

    def plot(self, key: str, value: torch.Tensor, train: bool) -> None:
        assert hasattr(self, "trainer"), "Trainer is not inited"
        if train:
            x = self.trainer.train_batch_idx / self.trainer.num_train_batches
            n = self.trainer.num_train_batches / self.plot_train_per_epoch
        else:
            x = self.trainer.epoch + 1
            n = self.trainer.num_val_batches / self.plot_valid_per_epoch
        self.board.draw(x, value.detach().cpu().numpy(), ("train_" if train else "val_") + key, every_n=int(n))

    def training_step(self, batch):
        l = self.loss(self(*batch[:-1]), batch[-1])  # noqa: E741
        self.plot("loss", l, train=True)
        return l

    def validation_step(self, batch):
        l = self.loss(self(*batch[:-1]), batch[-1])  # noqa: E741
        self.plot("loss", l, train=False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Classifier(Module):
    def validation_step(self, batch):
        Y_hat = self(*batch[:-1])
        self.plot("loss", self.loss(Y_hat, batch[-1]), train=False)
        self.plot("acc", self.accuracy(Y_hat, batch[-1]), train=False)

    def accuracy(self, Y_hat, Y, averaged=True):
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        preds = Y_hat.argmax(axis=1).type(Y.dtype)
        compare = (preds == Y.reshape(-1)).type(torch.float32)
        return compare.mean() if averaged else compare

    def loss(self, Y_hat, Y, averaged=True):
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        Y = Y.reshape((-1,))
        return F.cross_entropy(Y_hat, Y, reduction="mean" if averaged else "none")


class DataModule(HyperParameters):
    def train_dataloader(self):
        return self.get_dataloader(train=True)

    def val_dataloader(self):
        return self.get_dataloader(train=False)

    def get_tensorloader(self, tensors, train, indices=slice(0, None)):
        tensors = tuple(a[indices] for a in tensors)
        dataset = torch.utils.data.TensorDataset(*tensors)
        return torch.utils.data.DataLoader(dataset, self.batch_size, shuffle=train)


class DigitsData(DataModule):
    """Stands in for d2l.FashionMNIST: the 8x8 digits through ToTensor."""

    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
        self.train = (digits.to_tensor(tr_x), tr_y)
        self.val = (digits.to_tensor(te_x), te_y)

    def get_dataloader(self, train):
        return self.get_tensorloader(self.train if train else self.val, train)


class Trainer(HyperParameters):
    def __init__(self, max_epochs: int, nx: Nndx, num_gpus: int = 0, gradient_clip_val: float = 0) -> None:
        self.save_hyperparameters(ignore=["nx"])
        self.nx = nx

    def prepare_data(self, data):
        self.train_dataloader = data.train_dataloader()
        self.val_dataloader = data.val_dataloader()
        self.num_train_batches = len(self.train_dataloader)
        self.num_val_batches = len(self.val_dataloader) if self.val_dataloader is not None else 0

    def prepare_model(self, model):
        model.trainer = self
        self.model = model

    def fit(self, model, data):
        self.prepare_data(data)
        self.prepare_model(model)
        self.optim = model.configure_optimizers()
        with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
            self.probe_batch = tuple(next(iter(self.train_dataloader)))
        self.nx.preflight(model, self.probe_batch, model.loss, optimizer=self.optim)
        self.mon = self.nx.monitor(model, self.optim, every=10)
        self.epoch = 0
        self.train_batch_idx = 0
        self.val_batch_idx = 0
        for self.epoch in range(self.max_epochs):
            self.fit_epoch()
        self.nx.finish(self.mon, model, self.probe_batch, model.loss, optimizer=self.optim)

    def prepare_batch(self, batch):
        return batch

    def fit_epoch(self):
        self.model.train()
        for batch in self.train_dataloader:
            loss = self.model.training_step(self.prepare_batch(batch))
            self.optim.zero_grad()
            with torch.no_grad():
                loss.backward()
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
        val_loss, val_acc = self.model.board.data["val_loss"][-1], self.model.board.data["val_acc"][-1]
        self.nx.timed(lambda: self.mon.log(val_loss, split="val", accuracy=val_acc))


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
