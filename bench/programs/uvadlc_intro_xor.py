"""Port of the UvA Deep Learning course's Tutorial 1 (Introduction to PyTorch): a Linear-Tanh-Linear
classifier learns the continuous XOR from noisy points, trained with ``BCEWithLogitsLoss`` and SGD.

Source: github.com/Lightning-AI/tutorials, ``course_UvA-DL/01-introduction-to-pytorch/notebook.py``
(the brief's ``Introduction_to_PyTorch.py``: the notebook is stored as ``notebook.py`` in this
repository) at commit 15817658a2d63afa338b9e1cd8454fb98d746fac (last change to the file
db5d275e8879436836eb5a1a584ed57729a538ad); the notebook is CC BY-SA (its ``.meta.yml``, author
Phillip Lippe), the repository Apache-2.0. Written anew from the facts of that file; no code
copied.

Kept: ``torch.manual_seed(42)``; ``SimpleClassifier(num_inputs=2, num_hidden=4, num_outputs=1)``
(``linear1`` -> ``nn.Tanh`` -> ``linear2``, the output a logit); ``XORDataset(size, std=0.1)``
(two coordinates drawn from {0, 1} as float32, the label ``(data.sum(dim=1) == 1)`` as long,
then Gaussian noise of std 0.1 added in place, ``data += std * randn``); the train set of 1000
points in a ``DataLoader(batch_size=128, shuffle=True)``; ``nn.BCEWithLogitsLoss``;
``torch.optim.SGD(model.parameters(), lr=0.1)``; ``train_model`` (``model.train()``, 100 epochs,
per batch: ``preds = model(x).squeeze(dim=1)``, ``loss_module(preds, labels.float())``,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``); the test set of 500
points in a non-shuffled ``DataLoader(batch_size=128, drop_last=False)``; ``eval_model``
(``model.eval()``, ``no_grad``, ``torch.sigmoid`` on the squeezed output, ``>= 0.5`` as the
class, the accuracy ``true_preds / num_preds``).
Shrunk: nothing (the notebook already runs on a CPU in seconds); no ``tqdm``, no saving and
loading the state dict, no plots; the 200-point dataset the notebook only visualises is not made.
Measure only (not in the program): the train loss of the last epoch (mean over its batches) and
the train-set accuracy by ``eval_model``'s rule.

nndx, as the author would add it (README quick start): a preflight ``nndx.probe(model, batch,
loss_fn, optimizer=optimizer, data=...)`` on the first training batch before ``train_model``,
where ``loss_fn`` is the notebook's own step ``loss_module(model(x).squeeze(dim=1),
y.float())``; ``nndx.Monitor(model, optimizer, every=10)`` around ``train_model``, every
batch's loss logged after ``optimizer.step()``; after training ``nndx.probe(..., monitor=mon)``
on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.utils.data as data
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_intro_xor"
SOURCE = Source("Lightning-AI/tutorials", "course_UvA-DL/01-introduction-to-pytorch/notebook.py",
                "15817658a2d63afa338b9e1cd8454fb98d746fac", "CC-BY-SA-4.0 (repository Apache-2.0)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's XOR classifier as published (no shrinking needed)"),
        Variant(
            "sigmoid_before_bce_with_logits",
            "SimpleClassifier.forward ends with torch.sigmoid (the net made to 'output probabilities') while the "
            "loss stays nn.BCEWithLogitsLoss, which applies its own sigmoid: the loss sees sigmoid(sigmoid(z)) in "
            "(0.5, 0.73), and eval_model's sigmoid on top puts every point in class 1",
            (C.WRONG_OUTPUT_ACTIVATION, C.DOUBLE_SOFTMAX),
            ("https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/Turoad/lanedet/issues/32",
             "https://github.com/itakurah/focal-loss-pytorch/pull/5"),
            Measure("test_acc", "test accuracy (eval_model) at least 20 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.20),
        ),
        Variant(
            "activation_not_applied",
            "SimpleClassifier.forward skips self.act_fn (defined in __init__, never called): linear1 -> linear2 "
            "is one linear map, which cannot separate XOR",
            (C.MISSING_ACTIVATION,),
            ("https://discuss.pytorch.org/t/unable-to-learn-xor-representation-using-2-layers-of-multi-layered-"
             "perceptron-mlp/13287/3",
             "https://github.com/hmkcode/netflow.js/issues/2"),
            Measure("test_acc", "test accuracy (eval_model) at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

NUM_EPOCHS, BATCH_SIZE, LR = 100, 128, 0.1


class SimpleClassifier(nn.Module):
    def __init__(self, num_inputs: int, num_hidden: int, num_outputs: int, variant: str = "healthy") -> None:
        super().__init__()
        self.linear1 = nn.Linear(num_inputs, num_hidden)
        self.act_fn = nn.Tanh()
        self.linear2 = nn.Linear(num_hidden, num_outputs)
        self.variant = variant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear1(x)
        if self.variant != "activation_not_applied":
            x = self.act_fn(x)
        x = self.linear2(x)
        if self.variant == "sigmoid_before_bce_with_logits":
            x = torch.sigmoid(x)
        return x


class XORDataset(data.Dataset):
    def __init__(self, size: int, std: float = 0.1) -> None:
        super().__init__()
        self.size = size
        self.std = std
        self.generate_continuous_xor()

    def generate_continuous_xor(self) -> None:
        data_ = torch.randint(low=0, high=2, size=(self.size, 2), dtype=torch.float32)
        label = (data_.sum(dim=1) == 1).to(torch.long)
        data_ += self.std * torch.randn(data_.shape)
        self.data = data_
        self.label = label

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int):
        return self.data[idx], self.label[idx]


def eval_model(model: nn.Module, data_loader: data.DataLoader) -> float:
    model.eval()
    true_preds, num_preds = 0.0, 0.0
    with torch.no_grad():
        for data_inputs, data_labels in data_loader:
            preds = model(data_inputs)
            preds = preds.squeeze(dim=1)
            preds = torch.sigmoid(preds)
            pred_labels = (preds >= 0.5).long()
            true_preds += (pred_labels == data_labels).sum()
            num_preds += data_labels.shape[0]
    acc = true_preds / num_preds
    return float(acc)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(42 + seed)
    model = SimpleClassifier(num_inputs=2, num_hidden=4, num_outputs=1, variant=variant)
    loss_module = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    train_dataset = XORDataset(size=1000)
    train_data_loader = data.DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_dataset = XORDataset(size=500)
    test_data_loader = data.DataLoader(test_dataset, batch_size=128, shuffle=False, drop_last=False)

    def loss_fn(preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_module(preds.squeeze(dim=1), labels.float())

    probe_batch = (train_dataset.data[:BATCH_SIZE], train_dataset.label[:BATCH_SIZE])
    splits = (train_dataset.data, train_dataset.label, test_dataset.data, test_dataset.label)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    # train_model(model, optimizer, train_data_loader, loss_module)
    model.train()
    epoch_losses: list[float] = []
    for _epoch in range(NUM_EPOCHS):
        epoch_losses = []
        for data_inputs, data_labels in train_data_loader:
            preds = model(data_inputs)
            preds = preds.squeeze(dim=1)
            loss = loss_module(preds, data_labels.float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    test_acc = eval_model(model, test_data_loader)
    train_acc = eval_model(model, data.DataLoader(train_dataset, batch_size=128, shuffle=False))
    return {"test_acc": test_acc, "train_acc": train_acc,
            "final_train_loss": sum(epoch_losses) / len(epoch_losses)}  # fmt: skip
