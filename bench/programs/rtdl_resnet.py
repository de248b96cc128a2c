"""Port of rtdl's tabular ResNet baseline ("Revisiting Deep Learning Models for Tabular Data")
with the package's example training loop (``examples/rtdl.ipynb``), on a task with numerical
and categorical features.

Source: github.com/Yura52/rtdl, ``rtdl/modules.py`` (``ResNet``, ``ResNet.Block``,
``ResNet.Head``, ``ResNet.make_baseline``, ``CategoricalFeatureTokenizer``) and
``examples/rtdl.ipynb`` (the data split, preprocessing, optimizer, loop, evaluation and
early stopping; its commented "ABOUT CATEGORICAL FEATURES" wrapper ``Model``) at commit
b130dd2e596c17109bef825bc9c8608e1ae617cc (Apache-2.0). Written anew from the facts of those
files; no code copied.

Kept: the notebook's multiclass path: ``train_test_split`` 0.8 then 0.8 again (train / val /
test), numerical features ``StandardScaler``-ed with the train statistics, categorical
features ordinal codes in ``[0, cardinality)``, labels ``LabelEncoder``-ed int64,
``d_out = n_classes``; the wrapper ``Model(n_num_features, cat_tokenizer, kwargs)``:
``CategoricalFeatureTokenizer(cardinalities, d_token, bias=True, 'uniform')`` (one
``nn.Embedding(sum(cardinalities), d_token)`` indexed with per-feature offsets, a bias
vector per feature, uniform(+-d_token^-0.5) init), its tokens flattened and concatenated to
``x_num``, fed to ``ResNet.make_baseline`` (``first_layer`` Linear, ``Block``s: BatchNorm1d
-> Linear -> ReLU -> Dropout -> Linear -> Dropout, added to the block's input; ``Head``:
BatchNorm1d -> ReLU -> Linear) with the notebook's ResNet settings (d_main 128,
d_hidden 256, dropout_first 0.2, dropout_second 0.0, n_blocks 2); ``AdamW(lr=0.001,
weight_decay=0.0)``; ``F.cross_entropy``; per epoch batches of 256 shuffled indices
(``zero.data.IndexLoader``), ``model.train()``, ``zero_grad``, ``loss_fn(apply_model(x_num,
x_cat).squeeze(1), y)``, ``backward``, ``step``, the loss kept every ``report_frequency``
batches (the notebook prints it); ``evaluate`` (``model.eval()``, ``no_grad``, chunks of
1024, accuracy of the argmax) on val and test after each epoch; ``zero.ProgressTracker``
on the validation accuracy, stopping after ``patience`` epochs without a new best.
Shrunk: a synthetic classification task instead of the downloaded covtype: 3,000 rows, 6
numerical features on the scales of raw tabular columns (an age in years, an income in
dollars, a count, a duration in seconds, a ratio, a temperature) and 3 categorical ones
(cardinalities 3, 5, 8), 3 classes from a nonlinear score (products, thresholds and
category effects; 10% of the labels kept random); d_main 64 and d_hidden 128 instead of
128/256, d_token 8; 30 epochs and a patience of 8 instead of 1,000 and 100.
Measure only (not in the program): the test accuracy at the best validation epoch (the
notebook prints both each epoch).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``((x_num, x_cat), y)`` (the wrapper's ``forward(x_num, x_cat)``) with the loop's loss
expression and the splits as ``data``; ``nndx.Monitor`` around the epochs with that loss as
``mon.loss_fn``, each batch's loss logged, each epoch's validation cross-entropy logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rtdl_resnet"
SOURCE = Source("Yura52/rtdl", "rtdl/modules.py", "b130dd2e596c17109bef825bc9c8608e1ae617cc", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's ResNet path with categorical features (shrunk: d_main 64, 30 epochs)"),
        Variant(
            "features_not_scaled",
            "the StandardScaler step left out: the raw numerical columns (incomes ~5e4, durations ~1e3, ratios "
            "~0.1) go straight into the ResNet's first Linear layer",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/ODINN-SciML/MassBalanceMachine/issues/20",
             "https://github.com/scikit-learn/scikit-learn/pull/5214", "https://github.com/mlr-org/mlr/issues/2774"),
            Measure("test_accuracy", "test accuracy at the best validation epoch at least 0.03 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
        Variant(
            "sorted_not_shuffled",
            "the rows come sorted by class (as exported) and the index loader is built with shuffle=False: every "
            "epoch walks the classes in order, the last batches are all one class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/zalandoresearch/fashion-mnist/pull/5",
             "https://github.com/joaoamcarvalho/mpd-public/issues/6", "https://github.com/msalhab96/SpeeQ/issues/24"),
            Measure("test_accuracy", "test accuracy at the best validation epoch at least 0.03 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
    )
}

N_SAMPLES, CARDINALITIES, N_CLASSES, D_TOKEN = 3000, [3, 5, 8], 3, 8
D_MAIN, D_HIDDEN, N_BLOCKS, DROPOUT_FIRST, DROPOUT_SECOND = 64, 128, 2, 0.2, 0.0
N_EPOCHS, PATIENCE, BATCH_SIZE, LR, WEIGHT_DECAY = 30, 8, 256, 1e-3, 0.0


# --------------------------------------------------------------------------- the data


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw numerical columns, categorical codes and labels of a nonlinear 3-class task."""
    rng = np.random.RandomState(seed)
    n = N_SAMPLES
    age = rng.uniform(18, 80, n)
    income = rng.lognormal(10.8, 0.5, n)
    count = rng.poisson(4, n).astype(float)
    duration = rng.exponential(900.0, n)
    ratio = rng.beta(2, 15, n)
    temperature = rng.normal(15, 8, n)
    x_num = np.stack([age, income, count, duration, ratio, temperature], 1).astype("float32")
    x_cat = np.stack([rng.randint(0, c, n) for c in CARDINALITIES], 1).astype("int64")
    z = (x_num - x_num.mean(0)) / x_num.std(0)
    effects = [rng.normal(0, 1.0, c) for c in CARDINALITIES]
    score = (1.2 * z[:, 0] * z[:, 1] + np.sin(2 * z[:, 3]) + 0.8 * np.abs(z[:, 4]) - 0.6 * z[:, 5] ** 2
             + 0.7 * z[:, 2] + sum(e[x_cat[:, i]] for i, e in enumerate(effects)))  # fmt: skip
    y = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])).astype("int64")
    flip = rng.rand(n) < 0.1
    y[flip] = rng.randint(0, N_CLASSES, flip.sum())
    return x_num, x_cat, y


# --------------------------------------------------------------------------- rtdl/modules.py


class CategoricalFeatureTokenizer(nn.Module):
    def __init__(self, cardinalities: list[int], d_token: int, bias: bool, initialization: str) -> None:
        super().__init__()
        assert initialization == "uniform"
        self.register_buffer("category_offsets", torch.tensor([0] + cardinalities[:-1]).cumsum(0), persistent=False)
        self.embeddings = nn.Embedding(sum(cardinalities), d_token)
        self.bias = nn.Parameter(Tensor(len(cardinalities), d_token)) if bias else None
        s = d_token**-0.5
        for parameter in (self.embeddings.weight, self.bias):
            if parameter is not None:
                nn.init.uniform_(parameter, -s, s)

    @property
    def n_tokens(self) -> int:
        return len(self.category_offsets)

    @property
    def d_token(self) -> int:
        return self.embeddings.embedding_dim

    def forward(self, x: Tensor) -> Tensor:
        x = self.embeddings(x + self.category_offsets[None])
        return x + self.bias[None] if self.bias is not None else x


class ResNet(nn.Module):
    class Block(nn.Module):
        def __init__(self, *, d_main: int, d_hidden: int, dropout_first: float, dropout_second: float) -> None:
            super().__init__()
            self.normalization = nn.BatchNorm1d(d_main)
            self.linear_first = nn.Linear(d_main, d_hidden, True)
            self.activation = nn.ReLU()
            self.dropout_first = nn.Dropout(dropout_first)
            self.linear_second = nn.Linear(d_hidden, d_main, True)
            self.dropout_second = nn.Dropout(dropout_second)

        def forward(self, x: Tensor) -> Tensor:
            x_input = x
            x = self.dropout_first(self.activation(self.linear_first(self.normalization(x))))
            x = self.dropout_second(self.linear_second(x))
            return x_input + x

    class Head(nn.Module):
        def __init__(self, *, d_in: int, d_out: int) -> None:
            super().__init__()
            self.normalization = nn.BatchNorm1d(d_in)
            self.activation = nn.ReLU()
            self.linear = nn.Linear(d_in, d_out, True)

        def forward(self, x: Tensor) -> Tensor:
            return self.linear(self.activation(self.normalization(x)))

    def __init__(self, *, d_in: int, n_blocks: int, d_main: int, d_hidden: int, dropout_first: float,
                 dropout_second: float, d_out: int) -> None:  # fmt: skip
        super().__init__()
        self.first_layer = nn.Linear(d_in, d_main)
        self.blocks = nn.Sequential(*[
            ResNet.Block(d_main=d_main, d_hidden=d_hidden, dropout_first=dropout_first, dropout_second=dropout_second)
            for _ in range(n_blocks)
        ])  # fmt: skip
        self.head = ResNet.Head(d_in=d_main, d_out=d_out)

    @classmethod
    def make_baseline(cls, **kwargs) -> ResNet:  # normalization 'BatchNorm1d', activation 'ReLU'
        return cls(**kwargs)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.first_layer(x)))


# --------------------------------------------------------------------------- examples/rtdl.ipynb


class Model(nn.Module):
    """The notebook's wrapper for feed-forward models with categorical features."""

    def __init__(self, n_num_features: int, cat_tokenizer: CategoricalFeatureTokenizer, kwargs: dict) -> None:
        super().__init__()
        self.cat_tokenizer = cat_tokenizer
        self.model = ResNet.make_baseline(d_in=n_num_features + cat_tokenizer.n_tokens * cat_tokenizer.d_token,
                                          **kwargs)  # fmt: skip

    def forward(self, x_num: Tensor, x_cat: Tensor) -> Tensor:
        return self.model(torch.cat([x_num, self.cat_tokenizer(x_cat).flatten(1, -1)], dim=1))


class ProgressTracker:
    """``zero.ProgressTracker``: success on a new best score, fail after ``patience`` epochs without."""

    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.bad_updates, self.success = patience, -math.inf, 0, False

    def update(self, score: float) -> None:
        self.success = score > self.best
        if self.success:
            self.best, self.bad_updates = score, 0
        else:
            self.bad_updates += 1

    @property
    def fail(self) -> bool:
        return self.bad_updates > self.patience


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    import sklearn.model_selection
    import sklearn.preprocessing

    torch.manual_seed(123456 + seed)  # zero.improve_reproducibility(seed=123456)
    np.random.seed(123456 + seed)

    x_num_all, x_cat_all, y_all = make_data(seed)
    if variant == "sorted_not_shuffled":  # the export came sorted by class
        order = np.argsort(y_all, kind="stable")
        x_num_all, x_cat_all, y_all = x_num_all[order], x_cat_all[order], y_all[order]
    y_all = sklearn.preprocessing.LabelEncoder().fit_transform(y_all).astype("int64")
    n_classes = int(max(y_all)) + 1
    idx = {}
    idx["train"], idx["test"] = sklearn.model_selection.train_test_split(np.arange(len(y_all)), train_size=0.8,
                                                                         random_state=seed)  # fmt: skip
    idx["train"], idx["val"] = sklearn.model_selection.train_test_split(idx["train"], train_size=0.8,
                                                                        random_state=seed)  # fmt: skip
    if variant == "sorted_not_shuffled":  # the rows keep the file's (sorted) order within each split
        idx = {k: np.sort(v) for k, v in idx.items()}
    x_num = {k: x_num_all[v] for k, v in idx.items()}
    if variant != "features_not_scaled":
        preprocess = sklearn.preprocessing.StandardScaler().fit(x_num["train"])
        x_num = {k: preprocess.transform(v).astype("float32") for k, v in x_num.items()}
    X = {k: (torch.tensor(x_num[k]), torch.tensor(x_cat_all[v])) for k, v in idx.items()}
    y = {k: torch.tensor(y_all[v]) for k, v in idx.items()}

    model = Model(x_num_all.shape[1], CategoricalFeatureTokenizer(CARDINALITIES, D_TOKEN, True, "uniform"),
                  dict(d_main=D_MAIN, d_hidden=D_HIDDEN, dropout_first=DROPOUT_FIRST, dropout_second=DROPOUT_SECOND,
                       n_blocks=N_BLOCKS, d_out=n_classes))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loss_fn = F.cross_entropy

    def criterion(output: Tensor, target: Tensor) -> Tensor:  # the loop's loss expression
        return loss_fn(output.squeeze(1), target)

    def apply_model(x_num: Tensor, x_cat: Tensor) -> Tensor:
        return model(x_num, x_cat)

    @torch.no_grad()
    def evaluate(part: str) -> tuple[float, float]:
        model.eval()
        xn, xc = X[part]
        prediction = torch.cat([apply_model(a, b) for a, b in zip(torch.split(xn, 1024), torch.split(xc, 1024))])
        loss = loss_fn(prediction, y[part]).item()
        return float((prediction.argmax(1) == y[part]).float().mean()), loss

    n_train = len(y["train"])
    generator = torch.Generator().manual_seed(seed)
    progress = ProgressTracker(PATIENCE)
    first = torch.arange(BATCH_SIZE)
    first_batch = ((X["train"][0][first], X["train"][1][first]), y["train"][first])
    splits = (X["train"], y["train"], X["val"], y["val"])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    report_frequency = max(1, n_train // BATCH_SIZE // 5)
    log: list[str] = []
    best_test = val_score = test_score = float("nan")
    for epoch in range(1, N_EPOCHS + 1):
        if variant == "sorted_not_shuffled":  # IndexLoader(..., shuffle=False)
            order = torch.arange(n_train)
        else:
            order = torch.randperm(n_train, generator=generator)
        for iteration, batch_idx in enumerate(order.split(BATCH_SIZE)):
            model.train()
            optimizer.zero_grad()
            x_batch = (X["train"][0][batch_idx], X["train"][1][batch_idx])
            y_batch = y["train"][batch_idx]
            loss = mon.loss_fn(apply_model(*x_batch), y_batch)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            if iteration % report_frequency == 0:
                log.append(f"(epoch) {epoch} (batch) {iteration} (loss) {loss.item():.4f}")
        val_score, val_loss = evaluate("val")
        test_score, _ = evaluate("test")
        nx.timed(lambda: mon.log(val_loss, split="val"))
        progress.update(val_score)
        if progress.success:
            best_test = test_score
        if progress.fail:
            break

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_accuracy": best_test, "best_val_accuracy": progress.best, "last_val_accuracy": val_score,
            "last_test_accuracy": test_score, "epochs": float(epoch)}  # fmt: skip
