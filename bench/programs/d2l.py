"""d2l's own library, ``d2l/torch.py`` of d2l-ai/d2l-en at commit
23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0), as the d2l ports use it:
``HyperParameters``, ``Module``, ``Classifier``, ``DataModule`` and ``Trainer``, with nndx wired
into ``Trainer.fit`` as a user would (preflight, Monitor, final probe), a ``ProgressBoard`` that
records its points instead of drawing them, and ``DigitsData`` standing in for
``d2l.FashionMNIST``. One copy for the ports that train with d2l's Trainer (d2l_dropout,
d2l_mlp, d2l_softmax_scratch): the book's chapters share this library, so the ports do too.
Written anew from the facts of that file; no code copied."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Nndx


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
