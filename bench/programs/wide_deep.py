"""Port of shenweichen/DeepCTR-Torch's Wide & Deep (``WDL``): a wide part (a first-order
weight per sparse feature value and per dense feature) plus a deep part (an MLP over the
concatenated sparse embeddings and dense values), summed into one logit under a sigmoid,
trained with summed binary cross-entropy plus L2 on the embeddings by ``BaseModel.fit``.

Source: github.com/shenweichen/DeepCTR-Torch, ``deepctr_torch/models/wdl.py``,
``deepctr_torch/models/basemodel.py``, ``deepctr_torch/layers/core.py``,
``deepctr_torch/inputs.py`` and ``examples/run_classification_criteo.py`` at commit
f6854257b1fc29caab655ce72c6b5528b7432574 (Apache-2.0, Copyright Weichen Shen). Written anew
from the facts of those files; no code copied.

Kept: the example's preprocessing (``LabelEncoder`` on each sparse column,
``MinMaxScaler(feature_range=(0, 1))`` on the dense columns, ``SparseFeat(vocabulary_size=
max + 1, embedding_dim=4)`` and ``DenseFeat(dimension=1)``, the same columns for the wide
and the deep part, ``train_test_split(test_size=0.2, random_state=2020)``, the model input
as one float matrix whose column ranges ``build_input_features`` assigns in feature
order); ``create_embedding_matrix`` (one ``nn.Embedding`` per sparse feature, normal init
with ``init_std`` 1e-4; width 1 for the wide part); ``Linear`` (the wide logit: the sum of
the width-1 embeddings plus the dense columns times a normal-initialised weight);
``DNN`` (``Linear`` -> ReLU -> ``Dropout(0)`` per hidden size, weights normal with
``init_std``, no batch norm); ``WDL``: ``dnn_hidden_units=(256, 128)``,
``dnn_linear = Linear(128, 1, bias=False)``, ``combined_dnn_input`` (flattened embeddings
then dense values), wide logit + deep logit, ``PredictionLayer`` (a zero-initialised bias,
sigmoid); the regularisation list (``l2_reg_embedding`` 1e-5 on the deep embeddings,
``l2_reg_linear`` 1e-5 on the wide part, ``l2_reg_dnn`` 0) summed by
``get_regularization_loss`` each step; ``compile("adagrad", "binary_crossentropy",
metrics=["binary_crossentropy", "auc"])`` (``Adagrad(lr=0.01)``,
``F.binary_cross_entropy``); ``fit(batch_size=32, epochs=10, validation_split=0.2)``: ``model.train()`` once
before the epochs (``predict`` then leaves the model in eval mode, harmless without
dropout or batch norm), the
last 20% of the training rows kept for validation before shuffling, a shuffled
``DataLoader``, per batch ``y_pred = model(x).squeeze()``, ``zero_grad``,
``loss_func(y_pred, y.squeeze(), reduction='sum')`` + the regularisation loss, backward,
``step``; the epoch loss (summed total loss / samples) and the validation logloss and AUC
through ``evaluate``/``predict`` (``model.eval()``, ``no_grad``, batches of 256); the test
logloss and AUC the example prints.
Shrunk: a synthetic click log instead of ``criteo_sample.txt``: 8 categorical fields of 8
to 40 values drawn with skewed (Zipf-like) frequencies and 4 count-like dense fields
(log-normal, heavy-tailed, up to ~10^5 as Criteo's I-columns), the click drawn from a
logistic model with a weight per categorical value, the log of each count, and two
pairwise interactions (base rate ~25%); 4,000 rows; 6 epochs instead of 10; no callbacks, ``History`` or tqdm; the per-batch training
metrics ``fit`` computes for its progress line (batch AUC, which raises on a one-class
batch of 32) are not computed; CPU.
Measure only (not in the program): the test AUC and logloss the example prints, and the
last epoch's loss.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training
batch (``(x, y)`` as ``fit`` builds them) with the loss ``fit`` backpropagates (summed BCE
of the squeezed prediction plus ``get_regularization_loss()``) and the optimizer, the
train and validation splits as ``data``; ``nndx.Monitor(model, optim, loss_fn=
F.binary_cross_entropy)`` around ``fit``'s epochs, the loss called as ``mon.loss_fn``, each
batch's total loss logged, and each epoch's validation logloss logged as ``split="val"``
times ``batch_size`` (the training loss is a sum over a batch, the logloss a mean); then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import LabelEncoder, MinMaxScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "wide_deep"
SOURCE = Source("shenweichen/DeepCTR-Torch", "deepctr_torch/models/wdl.py", "f6854257b1fc29caab655ce72c6b5528b7432574",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published, with model = WDL(...)"),
        Variant(
            "dense_not_scaled",
            "the MinMaxScaler step left out: the count-like dense columns reach the wide weight and the DNN raw "
            "(heavy-tailed counts up to ~10^5 next to embeddings of scale 1e-4)",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/ageron/handson-ml3/pull/20", "https://github.com/shenweichen/DeepCTR/issues/284",
             "https://github.com/alibaba/EasyRec/issues/23"),
            Measure("test_auc", "test AUC at least 0.02 below the healthy run's: 0.638 against 0.820 healthy on seed 0 "
                    "(test logloss 2.24 against 0.394)",
                    lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
        Variant(
            "labels_from_unsplit_frame",
            "the training target taken as data[target].values[:len(train)] (the frame before train_test_split "
            "shuffled it) instead of train[target].values: each training row gets another row's click",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/IBM/AutoXAI4Omics/pull/58",
             "https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/LabeliaLabs/distributed-learning-contributivity/pull/260"),
            Measure("test_auc", "test AUC at least 0.1 below the healthy run's: 0.461 (chance) against 0.820 healthy "
                    "on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ROWS = 4000
SPARSE_DIMS = (10, 20, 30, 8, 15, 40, 12, 25)
N_DENSE = 4
sparse_features = [f"C{i}" for i in range(1, len(SPARSE_DIMS) + 1)]
dense_features = [f"I{i}" for i in range(1, N_DENSE + 1)]


# --------------------------------------------------------------------------- the data (criteo_sample.txt, made up)


def click_log(seed: int) -> dict[str, np.ndarray]:
    """The sample file as columns (no pandas here): raw categorical strings, raw counts, the click."""
    rng = np.random.default_rng(seed + 31)
    columns: dict[str, np.ndarray] = {}
    logit = np.full(ROWS, -1.3)
    for name, d in zip(sparse_features, SPARSE_DIMS):
        freq = 1.0 / np.arange(1, d + 1) ** 0.8
        columns[name] = rng.choice(d, size=ROWS, p=freq / freq.sum())
        logit += rng.normal(scale=0.7, size=d)[columns[name]]
    for j, name in enumerate(dense_features):
        log_count = rng.normal(loc=3.0 + j, scale=2.0, size=ROWS)
        columns[name] = np.floor(np.exp(log_count))
        logit += (0.6 if j % 2 == 0 else -0.5) * (log_count - (3.0 + j)) / 2.0
    inter_a = rng.normal(scale=1.0, size=(SPARSE_DIMS[0], SPARSE_DIMS[2]))
    inter_b = rng.normal(scale=1.0, size=(SPARSE_DIMS[1], SPARSE_DIMS[5]))
    logit += inter_a[columns["C1"], columns["C3"]] + inter_b[columns["C2"], columns["C6"]]
    frame = {name: np.char.add("v", columns[name].astype(str)) for name in sparse_features}
    frame.update({name: columns[name] for name in dense_features})
    frame["label"] = (rng.random(ROWS) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return frame


# --------------------------------------------------------------------------- deepctr_torch/inputs.py


class SparseFeat:
    def __init__(self, name: str, vocabulary_size: int, embedding_dim: int = 4) -> None:
        self.name, self.vocabulary_size, self.embedding_dim, self.embedding_name = name, vocabulary_size, embedding_dim, name


class DenseFeat:
    def __init__(self, name: str, dimension: int = 1) -> None:
        self.name, self.dimension = name, dimension


def build_input_features(feature_columns) -> dict[str, tuple[int, int]]:
    features, start = {}, 0
    for feat in feature_columns:
        if feat.name in features:
            continue
        width = 1 if isinstance(feat, SparseFeat) else feat.dimension
        features[feat.name] = (start, start + width)
        start += width
    return features


def create_embedding_matrix(feature_columns, init_std: float = 0.0001, linear: bool = False) -> nn.ModuleDict:
    sparse = [f for f in feature_columns if isinstance(f, SparseFeat)]
    embedding_dict = nn.ModuleDict(
        {f.embedding_name: nn.Embedding(f.vocabulary_size, 1 if linear else f.embedding_dim) for f in sparse})
    for tensor in embedding_dict.values():
        nn.init.normal_(tensor.weight, mean=0, std=init_std)
    return embedding_dict


def combined_dnn_input(sparse_embedding_list, dense_value_list) -> torch.Tensor:
    sparse_dnn_input = torch.flatten(torch.cat(sparse_embedding_list, dim=-1), start_dim=1)
    dense_dnn_input = torch.flatten(torch.cat(dense_value_list, dim=-1), start_dim=1)
    return torch.cat([sparse_dnn_input, dense_dnn_input], dim=-1)


# --------------------------------------------------------------------------- deepctr_torch/layers/core.py


class DNN(nn.Module):
    def __init__(self, inputs_dim: int, hidden_units, dropout_rate: float = 0.0, init_std: float = 0.0001) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout_rate)
        hidden_units = [inputs_dim, *hidden_units]
        self.linears = nn.ModuleList([nn.Linear(hidden_units[i], hidden_units[i + 1])
                                      for i in range(len(hidden_units) - 1)])  # fmt: skip
        self.activation_layers = nn.ModuleList([nn.ReLU(inplace=True) for _ in range(len(hidden_units) - 1)])
        for name, tensor in self.linears.named_parameters():
            if "weight" in name:
                nn.init.normal_(tensor, mean=0, std=init_std)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        deep_input = inputs
        for i in range(len(self.linears)):
            deep_input = self.dropout(self.activation_layers[i](self.linears[i](deep_input)))
        return deep_input


class PredictionLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros((1,)))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        output = X
        output += self.bias
        return torch.sigmoid(output)


# --------------------------------------------------------------------------- deepctr_torch/models/basemodel.py + wdl.py


class Linear(nn.Module):
    def __init__(self, feature_columns, feature_index, init_std: float = 0.0001) -> None:
        super().__init__()
        self.feature_index = feature_index
        self.sparse_feature_columns = [f for f in feature_columns if isinstance(f, SparseFeat)]
        self.dense_feature_columns = [f for f in feature_columns if isinstance(f, DenseFeat)]
        self.embedding_dict = create_embedding_matrix(feature_columns, init_std, linear=True)
        for tensor in self.embedding_dict.values():
            nn.init.normal_(tensor.weight, mean=0, std=init_std)
        self.weight = nn.Parameter(torch.Tensor(sum(f.dimension for f in self.dense_feature_columns), 1))
        nn.init.normal_(self.weight, mean=0, std=init_std)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        sparse = [self.embedding_dict[f.embedding_name](X[:, slice(*self.feature_index[f.name])].long())
                  for f in self.sparse_feature_columns]  # fmt: skip
        dense = [X[:, slice(*self.feature_index[f.name])] for f in self.dense_feature_columns]
        linear_logit = torch.zeros([X.shape[0], 1])
        linear_logit += torch.sum(torch.cat(sparse, dim=-1), dim=-1, keepdim=False)
        linear_logit += torch.cat(dense, dim=-1).matmul(self.weight)
        return linear_logit


class WDL(nn.Module):
    def __init__(self, linear_feature_columns, dnn_feature_columns, dnn_hidden_units=(256, 128), l2_reg_linear=1e-5,
                 l2_reg_embedding=1e-5, l2_reg_dnn=0, init_std=0.0001, seed=1024, dnn_dropout=0) -> None:  # fmt: skip
        super().__init__()
        torch.manual_seed(seed)
        self.dnn_feature_columns = dnn_feature_columns
        self.feature_index = build_input_features(linear_feature_columns + dnn_feature_columns)
        self.embedding_dict = create_embedding_matrix(dnn_feature_columns, init_std)
        self.linear_model = Linear(linear_feature_columns, self.feature_index)
        self.regularization_weight = []
        self.add_regularization_weight(self.embedding_dict.parameters(), l2=l2_reg_embedding)
        self.add_regularization_weight(self.linear_model.parameters(), l2=l2_reg_linear)
        self.out = PredictionLayer()
        input_dim = sum(f.embedding_dim if isinstance(f, SparseFeat) else f.dimension for f in dnn_feature_columns)
        self.dnn = DNN(input_dim, dnn_hidden_units, dropout_rate=dnn_dropout, init_std=init_std)
        self.dnn_linear = nn.Linear(dnn_hidden_units[-1], 1, bias=False)
        self.add_regularization_weight(
            [p for n, p in self.dnn.named_parameters() if "weight" in n and "bn" not in n], l2=l2_reg_dnn)
        self.add_regularization_weight([self.dnn_linear.weight], l2=l2_reg_dnn)

    def add_regularization_weight(self, weight_list, l1: float = 0.0, l2: float = 0.0) -> None:
        self.regularization_weight.append((list(weight_list), l1, l2))

    def get_regularization_loss(self) -> torch.Tensor:
        total_reg_loss = torch.zeros((1,))
        for weight_list, l1, l2 in self.regularization_weight:
            for parameter in weight_list:
                if l1 > 0:
                    total_reg_loss += torch.sum(l1 * torch.abs(parameter))
                if l2 > 0:
                    total_reg_loss += torch.sum(l2 * torch.square(parameter))
        return total_reg_loss

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        sparse_embedding_list = [self.embedding_dict[f.embedding_name](X[:, slice(*self.feature_index[f.name])].long())
                                 for f in self.dnn_feature_columns if isinstance(f, SparseFeat)]  # fmt: skip
        dense_value_list = [X[:, slice(*self.feature_index[f.name])]
                            for f in self.dnn_feature_columns if isinstance(f, DenseFeat)]  # fmt: skip
        logit = self.linear_model(X)
        dnn_input = combined_dnn_input(sparse_embedding_list, dense_value_list)
        logit += self.dnn_linear(self.dnn(dnn_input))
        return self.out(logit)


def predict(model: WDL, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    model.eval()
    loader = DataLoader(TensorDataset(torch.from_numpy(x)), shuffle=False, batch_size=batch_size)
    pred_ans = []
    with torch.no_grad():
        for (x_test,) in loader:
            pred_ans.append(model(x_test.float()).numpy())
    return np.concatenate(pred_ans).astype("float64")


# --------------------------------------------------------------------------- examples/run_classification_criteo.py + fit


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data = click_log(seed)
    for feat in sparse_features:
        data[feat] = LabelEncoder().fit_transform(data[feat])
    if variant != "dense_not_scaled":
        scaled = MinMaxScaler(feature_range=(0, 1)).fit_transform(np.stack([data[f] for f in dense_features], axis=1))
        data.update({f: scaled[:, j] for j, f in enumerate(dense_features)})

    fixlen_feature_columns = ([SparseFeat(feat, vocabulary_size=int(data[feat].max()) + 1, embedding_dim=4)
                               for feat in sparse_features] + [DenseFeat(feat, 1) for feat in dense_features])  # fmt: skip
    linear_feature_columns = dnn_feature_columns = fixlen_feature_columns
    feature_names = list(build_input_features(linear_feature_columns + dnn_feature_columns))

    train_rows, test_rows = train_test_split(np.arange(ROWS), test_size=0.2, random_state=2020 + seed)
    train_df = {k: v[train_rows] for k, v in data.items()}
    test_df = {k: v[test_rows] for k, v in data.items()}
    if variant == "labels_from_unsplit_frame":
        train_y = data["label"][: len(train_rows)]  # the bug: the frame before the split's shuffle
    else:
        train_y = train_df["label"]

    model = WDL(linear_feature_columns, dnn_feature_columns, seed=1024 + seed)
    optim = torch.optim.Adagrad(model.parameters())  # compile("adagrad", ...): lr 0.01
    loss_func = F.binary_cross_entropy

    # fit(x, y, batch_size=32, epochs=10, validation_split=0.2)
    batch_size, epochs = 32, 6
    x_all = np.concatenate([train_df[name][:, None] for name in feature_names], axis=-1).astype(np.float64)
    split_at = int(x_all.shape[0] * (1.0 - 0.2))
    x, val_x = x_all[:split_at], x_all[split_at:]
    y, val_y = train_y[:split_at], train_y[split_at:]
    train_tensor_data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sample_num = len(train_tensor_data)
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(dataset=train_tensor_data, shuffle=True, batch_size=batch_size, generator=generator)

    def total_loss_of(y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.Tensor:
        return loss_func(y_pred.squeeze(), y_true.squeeze(), reduction="sum") + model.get_regularization_loss()

    splits = (torch.from_numpy(x).float(), torch.from_numpy(y).float(), torch.from_numpy(val_x).float(),
              torch.from_numpy(val_y).float())  # fmt: skip
    first_batch = (splits[0][:batch_size], splits[1][:batch_size])
    nx.preflight(model, first_batch, total_loss_of, optimizer=optim, data=splits)
    mon = nx.monitor(model, optim, every=10, loss_fn=loss_func)

    epoch_loss = float("nan")
    val_logloss = val_auc = float("nan")
    model.train()  # fit's `model = self.train()`, once: predict() leaves it in eval mode (no dropout/BN here)
    for _epoch in range(epochs):
        total_loss_epoch = 0.0
        for x_train, y_train in train_loader:
            xb, yb = x_train.float(), y_train.float()
            y_pred = model(xb).squeeze()
            optim.zero_grad()
            loss = mon.loss_fn(y_pred, yb.squeeze(), reduction="sum")
            reg_loss = model.get_regularization_loss()
            total_loss = loss + reg_loss
            total_loss_epoch += total_loss.item()
            total_loss.backward()
            optim.step()
            mon.log(total_loss)
        epoch_loss = total_loss_epoch / sample_num
        val_pred = predict(model, val_x, batch_size)
        val_logloss, val_auc = log_loss(val_y, val_pred), roc_auc_score(val_y, val_pred)
        mon.log(val_logloss * batch_size, split="val")

    x_test = np.concatenate([test_df[name][:, None] for name in feature_names], axis=-1).astype(np.float64)
    pred_ans = predict(model, x_test, 256)
    nx.finish(mon, model, first_batch, total_loss_of, optimizer=optim, data=splits)
    return {
        "test_auc": float(roc_auc_score(test_df["label"], pred_ans)),
        "test_logloss": float(log_loss(test_df["label"], pred_ans)),
        "val_auc": float(val_auc),
        "val_logloss": float(val_logloss),
        "final_epoch_loss": float(epoch_loss),
    }
