"""Port of rixwew/pytorch-fm: DeepFM (a factorization machine and an MLP over shared field
embeddings) trained for click-through-rate prediction with BCELoss and Adam.

Source: github.com/rixwew/pytorch-fm, ``torchfm/model/dfm.py``, ``torchfm/layer.py`` and
``examples/main.py`` at commit f74ad19771eda104e99874d19dc892e988ec53fa (the repository's
HEAD; MIT, Copyright (c) 2019 rixwew). Written anew from the facts of those files; no code
copied.

Kept: ``DeepFactorizationMachineModel(field_dims, embed_dim=16, mlp_dims=(16, 16),
dropout=0.2)`` (``get_model('dfm')``): ``FeaturesLinear`` (one ``Embedding(sum(field_dims),
1)`` plus a zero-initialised bias, the field ``offsets`` = the cumulative field sizes added
to each index), ``FeaturesEmbedding`` (``Embedding(sum(field_dims), embed_dim)``,
``xavier_uniform_``, the same offsets), ``FactorizationMachine(reduce_sum=True)`` (0.5 x
(square of the sum over fields - sum of the squares), summed over the embedding with
``keepdim=True``), ``MultiLayerPerceptron`` (per hidden size ``Linear`` -> ``BatchNorm1d`` ->
``ReLU`` -> ``Dropout``, then ``Linear(., 1)``) on the flattened embeddings; ``forward``:
linear + FM + MLP, ``torch.sigmoid(x.squeeze(1))`` (a probability out). ``main``:
``torch.utils.data.random_split`` 80/10/10 into train/valid/test, three
``DataLoader(batch_size)`` without shuffling (as written: the order is the random split's),
``criterion = torch.nn.BCELoss()``, ``Adam(lr=0.001, weight_decay=1e-6)``, the
``EarlyStopper(num_trials=2)`` on the validation AUC (its ``torch.save`` of the best model
kept as an in-memory copy), the test AUC of the model as it stands when the loop ends;
``train``: ``model.train()``, per batch ``y = model(fields)``, ``criterion(y,
target.float())``, ``model.zero_grad()``, ``backward``, ``optimizer.step()``, the running loss
every ``log_interval`` batches (kept as a record instead of a tqdm postfix); ``test``:
``model.eval()``, ``torch.no_grad()``, ``roc_auc_score`` of the targets and the predicted
probabilities.
Shrunk: a synthetic click log instead of Criteo's ``train.txt`` (no LMDB cache): 10
categorical fields of 6 to 40 values drawn with skewed (Zipf-like) frequencies, the click
drawn from a logistic model with a per-value first-order weight and rank-4 pairwise
interactions between some fields (what an FM models), base rate ~25% as in Criteo;
24,000 rows instead of 45 million; ``batch_size`` 256 instead of 2048; at most 12 epochs
instead of 100 (early stopping kept); ``num_workers=0``; CPU.
Measure only (not in the program): the test AUC the program prints, and the mean BCE of
the last epoch's batches (the tqdm postfix's loss).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(``(fields, target.float())``) with ``criterion`` and the optimizer, the train and valid
splits as ``data``; ``nndx.Monitor`` around the epochs with ``criterion`` called as
``mon.loss_fn``, each batch's loss logged; the program computes no validation loss (AUC
only), so none is logged; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deepfm"
SOURCE = Source("rixwew/pytorch-fm", "examples/main.py", "f74ad19771eda104e99874d19dc892e988ec53fa", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--model_name dfm)"),
        Variant(
            "fm_sum_over_batch",
            "FactorizationMachine reduces with torch.sum(ix) (no dim) instead of torch.sum(ix, dim=1, keepdim=True): "
            "the pairwise term is summed over the whole batch into one scalar that broadcasts onto every row",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/ShomyLiu/Neu-Review-Rec/issues/9", "https://github.com/Atomu2014/product-nets/issues/6",
             "https://github.com/ChenglongChen/tensorflow-DeepFM/issues/78"),
            Measure("test_auc", "test AUC at least 0.03 below the healthy run's: 0.682/0.710/0.662 against "
                    "0.829/0.821/0.800 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
        Variant(
            "sigmoid_then_bce_with_logits",
            "criterion = BCEWithLogitsLoss() while forward still ends in torch.sigmoid: the probability is squashed "
            "a second time, the loss only sees values in (0.5, 0.73)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/d2l-ai/d2l-en/issues/1360", "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/NVIDIA-Merlin/models/pull/1175"),
            Measure("final_train_loss", "mean training loss of the last epoch at least 0.1 above the healthy run's: "
                    "0.650/0.646/0.682 against 0.501/0.510/0.479 healthy on seeds 0-2 (test AUC 0.805/0.806/0.753 "
                    "against 0.829/0.821/0.800)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
    )
}

ARGS = {"epoch": 12, "learning_rate": 0.001, "batch_size": 256, "weight_decay": 1e-6, "log_interval": 20}
FIELD_DIMS = (12, 8, 30, 16, 20, 6, 40, 10, 24, 14)
ROWS = 24000
INTERACTING = ((0, 2), (1, 4), (2, 6), (3, 8), (5, 9), (6, 7), (4, 8))


# --------------------------------------------------------------------------- the data (the Criteo dataset, made up)


def click_log(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fields (ROWS, num_fields) int64, clicks (ROWS,) int64): skewed categorical values and
    clicks from a first-order + pairwise-interaction logistic model."""
    rng = np.random.default_rng(seed + 101)
    columns, logit = [], np.full(ROWS, -1.6)
    latent = [rng.normal(scale=0.8, size=(d, 4)) for d in FIELD_DIMS]
    for d in FIELD_DIMS:
        freq = 1.0 / np.arange(1, d + 1) ** 0.8
        columns.append(rng.choice(d, size=ROWS, p=freq / freq.sum()))
    for f, d in enumerate(FIELD_DIMS):
        logit += rng.normal(scale=0.6, size=d)[columns[f]]
    for f, g in INTERACTING:
        logit += np.sum(latent[f][columns[f]] * latent[g][columns[g]], axis=1)
    clicks = (rng.random(ROWS) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return np.stack(columns, axis=1).astype(np.int64), clicks


class ClickDataset(Dataset):
    def __init__(self, seed: int) -> None:
        self.items, self.targets = click_log(seed)
        self.field_dims = np.array(FIELD_DIMS)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.items[index], self.targets[index]


# --------------------------------------------------------------------------- torchfm/layer.py


class FeaturesLinear(torch.nn.Module):
    def __init__(self, field_dims, output_dim: int = 1) -> None:
        super().__init__()
        self.fc = torch.nn.Embedding(sum(field_dims), output_dim)
        self.bias = torch.nn.Parameter(torch.zeros((output_dim,)))
        self.offsets = np.array((0, *np.cumsum(field_dims)[:-1]), dtype=np.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + x.new_tensor(self.offsets).unsqueeze(0)
        return torch.sum(self.fc(x), dim=1) + self.bias


class FeaturesEmbedding(torch.nn.Module):
    def __init__(self, field_dims, embed_dim: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(sum(field_dims), embed_dim)
        self.offsets = np.array((0, *np.cumsum(field_dims)[:-1]), dtype=np.int64)
        torch.nn.init.xavier_uniform_(self.embedding.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + x.new_tensor(self.offsets).unsqueeze(0)
        return self.embedding(x)


class FactorizationMachine(torch.nn.Module):
    def __init__(self, reduce_sum: bool = True, over_batch: bool = False) -> None:
        super().__init__()
        self.reduce_sum = reduce_sum
        self.over_batch = over_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square_of_sum = torch.sum(x, dim=1) ** 2
        sum_of_square = torch.sum(x**2, dim=1)
        ix = square_of_sum - sum_of_square
        if self.reduce_sum:
            ix = torch.sum(ix) if self.over_batch else torch.sum(ix, dim=1, keepdim=True)  # the bug: no dim
        return 0.5 * ix


class MultiLayerPerceptron(torch.nn.Module):
    def __init__(self, input_dim: int, embed_dims, dropout: float, output_layer: bool = True) -> None:
        super().__init__()
        layers = []
        for embed_dim in embed_dims:
            layers += [torch.nn.Linear(input_dim, embed_dim), torch.nn.BatchNorm1d(embed_dim), torch.nn.ReLU(),
                       torch.nn.Dropout(p=dropout)]  # fmt: skip
            input_dim = embed_dim
        if output_layer:
            layers.append(torch.nn.Linear(input_dim, 1))
        self.mlp = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


# --------------------------------------------------------------------------- torchfm/model/dfm.py


class DeepFactorizationMachineModel(torch.nn.Module):
    def __init__(self, field_dims, embed_dim: int, mlp_dims, dropout: float, fm_over_batch: bool = False) -> None:
        super().__init__()
        self.linear = FeaturesLinear(field_dims)
        self.fm = FactorizationMachine(reduce_sum=True, over_batch=fm_over_batch)
        self.embedding = FeaturesEmbedding(field_dims, embed_dim)
        self.embed_output_dim = len(field_dims) * embed_dim
        self.mlp = MultiLayerPerceptron(self.embed_output_dim, mlp_dims, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        embed_x = self.embedding(x)
        x = self.linear(x) + self.fm(embed_x) + self.mlp(embed_x.view(-1, self.embed_output_dim))
        return torch.sigmoid(x.squeeze(1))


# --------------------------------------------------------------------------- examples/main.py


class EarlyStopper:
    def __init__(self, num_trials: int) -> None:
        self.num_trials = num_trials
        self.trial_counter = 0
        self.best_accuracy = 0.0
        self.saved: torch.nn.Module | None = None  # torch.save(model, save_path), in memory

    def is_continuable(self, model: torch.nn.Module, accuracy: float) -> bool:
        if accuracy > self.best_accuracy:
            self.best_accuracy = accuracy
            self.trial_counter = 0
            self.saved = copy.deepcopy(model)
            return True
        if self.trial_counter + 1 < self.num_trials:
            self.trial_counter += 1
            return True
        return False


def test(model: torch.nn.Module, data_loader: DataLoader) -> float:
    model.eval()
    targets, predicts = [], []
    with torch.no_grad():
        for fields, target in data_loader:
            y = model(fields)
            targets.extend(target.tolist())
            predicts.extend(y.tolist())
    return float(roc_auc_score(targets, predicts))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = ClickDataset(seed)
    train_length = int(len(dataset) * 0.8)
    valid_length = int(len(dataset) * 0.1)
    test_length = len(dataset) - train_length - valid_length
    train_dataset, valid_dataset, test_dataset = torch.utils.data.random_split(
        dataset, (train_length, valid_length, test_length), generator=torch.Generator().manual_seed(seed))
    train_data_loader = DataLoader(train_dataset, batch_size=ARGS["batch_size"], num_workers=0)
    valid_data_loader = DataLoader(valid_dataset, batch_size=ARGS["batch_size"], num_workers=0)
    test_data_loader = DataLoader(test_dataset, batch_size=ARGS["batch_size"], num_workers=0)

    model = DeepFactorizationMachineModel(dataset.field_dims, embed_dim=16, mlp_dims=(16, 16), dropout=0.2,
                                          fm_over_batch=variant == "fm_sum_over_batch")  # fmt: skip
    if variant == "sigmoid_then_bce_with_logits":
        criterion = torch.nn.BCEWithLogitsLoss()
    else:
        criterion = torch.nn.BCELoss()
    optimizer = torch.optim.Adam(params=model.parameters(), lr=ARGS["learning_rate"], weight_decay=ARGS["weight_decay"])
    early_stopper = EarlyStopper(num_trials=2)

    # nndx before training: the first batch the (unshuffled) loader serves, the splits as tensors
    train_idx, valid_idx = torch.tensor(train_dataset.indices), torch.tensor(valid_dataset.indices)
    items, targets = torch.from_numpy(dataset.items), torch.from_numpy(dataset.targets).float()
    splits = (items[train_idx], targets[train_idx], items[valid_idx], targets[valid_idx])
    first_batch = (items[train_idx[: ARGS["batch_size"]]], targets[train_idx[: ARGS["batch_size"]]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    postfix: list[float] = []
    epoch_losses: list[float] = []
    aucs: list[float] = []
    for _epoch_i in range(ARGS["epoch"]):
        model.train()
        total_loss, losses = 0.0, []
        for i, (fields, target) in enumerate(train_data_loader):
            y = model(fields)
            loss = mon.loss_fn(y, target.float())
            model.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
            total_loss += loss.item()
            losses.append(loss.item())
            if (i + 1) % ARGS["log_interval"] == 0:
                postfix.append(total_loss / ARGS["log_interval"])
                total_loss = 0.0
        epoch_losses.append(float(np.mean(losses)))
        auc = test(model, valid_data_loader)
        aucs.append(auc)
        if not early_stopper.is_continuable(model, auc):
            break
    auc = test(model, test_data_loader)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {
        "test_auc": auc,
        "best_valid_auc": early_stopper.best_accuracy,
        "final_train_loss": epoch_losses[-1],
        "epochs": float(len(epoch_losses)),
    }
