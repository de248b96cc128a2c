"""Port of shenweichen/DeepCTR-Torch's DCN in its matrix parameterisation (DCN-M, the paper's
DCN V2): per-field embeddings and dense values concatenated into x0, a cross network
x_{l+1} = x0 * (W_l x_l + b_l) + x_l in parallel with a ReLU MLP, both outputs concatenated
into one logit next to a first-order linear part, trained with summed binary cross-entropy
plus L2 on the embeddings, the linear part and the cross kernels by ``BaseModel.fit`` and Adam.

Source: github.com/shenweichen/DeepCTR-Torch, ``deepctr_torch/models/dcn.py``,
``deepctr_torch/layers/interaction.py`` (``CrossNet``), ``deepctr_torch/layers/core.py``
(``DNN``), ``deepctr_torch/models/basemodel.py``, ``deepctr_torch/inputs.py`` and
``examples/run_classification_criteo.py`` at commit
f6854257b1fc29caab655ce72c6b5528b7432574 (Apache-2.0, Copyright Weichen Shen). Written anew
from the facts of those files; no code copied.

Kept: the example's preprocessing (``LabelEncoder`` per sparse column, ``MinMaxScaler
(feature_range=(0, 1))`` on the dense columns, ``SparseFeat(vocabulary_size=max + 1,
embedding_dim=4)``, ``DenseFeat(dimension=1)``, the same columns for the linear and the deep
part, ``train_test_split(test_size=0.2, random_state=2020)``, one float input matrix whose
column ranges ``build_input_features`` assigns in feature order); ``create_embedding_matrix``
(one ``nn.Embedding`` per sparse feature, normal init with ``init_std`` 1e-4, width 1 for the
linear part); ``Linear`` (the width-1 embeddings summed plus the dense columns times a
normal-initialised weight); ``CrossNet(parameterization='matrix')``: ``kernels`` of shape
``(layer_num, in, in)`` each ``xavier_normal_``, ``bias`` ``(layer_num, in, 1)`` zero, the
input unsqueezed to ``(batch, in, 1)``, per layer ``x_l = x_0 * (kernels[i] @ x_l +
bias[i]) + x_l``, squeezed back; ``DNN`` (``Linear`` -> ReLU -> ``Dropout(0)`` per hidden
size, weights normal with ``init_std``, no batch norm); ``DCN(cross_num=2,
cross_parameterization='matrix', l2_reg_linear=1e-5, l2_reg_embedding=1e-5,
l2_reg_cross=1e-5, l2_reg_dnn=0)``: the cross net and the DNN both on ``combined_dnn_input``
(flattened embeddings then dense values), ``dnn_linear = Linear(in + hidden[-1], 1,
bias=False)`` on ``cat(cross_out, deep_out)``, added to the linear logit;
``PredictionLayer`` (a zero bias, sigmoid); the regularisation list (embeddings, the linear
part with ``BaseModel``'s own ``l2_reg_linear`` 1e-5, the DNN weights at 0, ``dnn_linear``'s
weight, the cross kernels) summed by ``get_regularization_loss``; ``compile("adam",
"binary_crossentropy", metrics=["binary_crossentropy", "auc"])`` (``Adam(lr=0.001)``,
``F.binary_cross_entropy``); ``fit(batch_size, epochs, validation_split=0.2)``:
``model.train()`` once, the last 20% of the training rows kept for validation before
shuffling, a shuffled ``DataLoader``, per batch ``model(x).squeeze()``, ``zero_grad``,
``loss_func(..., reduction='sum')`` + regularisation, ``backward``, ``step``; the epoch loss
(total loss / samples); ``evaluate``/``predict`` (``model.eval()``, ``no_grad``, batches of
256); the test logloss and AUC the example prints.
Shrunk: a synthetic click log instead of ``criteo_sample.txt``: 8 categorical fields of 5
to 12 values with skewed (Zipf-like) frequencies and 3 count-like dense fields (log-normal,
heavy-tailed up to ~10^5 as Criteo's I-columns); the click drawn from a logistic model with
a weight per categorical value, the log of each count, and three crossed-field effects
(rank-2 products of per-value latent vectors); 6,000 rows; ``dnn_hidden_units`` (32, 32)
instead of (128, 128); batch 64 instead of 32, 8 epochs instead of 10; no callbacks,
``History`` or tqdm, and the per-batch training metrics ``fit`` computes for its progress
line are not computed; CPU.
Measure only (not in the program): the test AUC and logloss the example prints.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(``(x, y)`` as ``fit`` builds them) with the loss ``fit`` backpropagates (summed BCE of the
squeezed prediction plus ``get_regularization_loss()``) and the optimizer, the train and
validation splits as ``data``; ``nndx.Monitor(model, optim, loss_fn=F.binary_cross_entropy)``
around ``fit``'s epochs, the loss called as ``mon.loss_fn``, each batch's total loss logged,
and each epoch's validation logloss logged as ``split="val"`` times ``batch_size`` (the
training loss is a sum over the batch, the logloss a mean); then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
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

NAME = "dcn_v2"
SOURCE = Source("shenweichen/DeepCTR-Torch", "deepctr_torch/models/dcn.py",
                "f6854257b1fc29caab655ce72c6b5528b7432574", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published, with model = DCN(..., cross_parameterization='matrix')"),
        Variant(
            "sigmoid_then_bce_with_logits",
            "compile(\"adam\", F.binary_cross_entropy_with_logits) while PredictionLayer still ends in a sigmoid: "
            "the probability is squashed a second time, the loss only sees values in (0.5, 0.73)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/d2l-ai/d2l-en/issues/1360", "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/NVIDIA-Merlin/models/pull/1175"),
            Measure("test_logloss", "test logloss at least 0.2 above the healthy run's: 1.409 against 0.475 healthy "
                    "on seed 0 (test AUC 0.767 against 0.794)",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
        Variant(
            "dense_not_scaled",
            "the MinMaxScaler step left out: the raw count-like dense columns (up to ~10^5) enter x0, which the "
            "cross layers multiply into every product, and the linear part",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/ChenglongChen/tensorflow-DeepFM/issues/47",
             "https://github.com/RUCAIBox/RecBole/issues/1109",
             "https://github.com/ageron/handson-ml3/pull/20"),
            Measure("test_auc", "test AUC at least 0.02 below the healthy run's: 0.502 (chance) against 0.794 "
                    "healthy on seed 0 (test logloss 16.98 against 0.475)",
                    lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
    )
}

ROWS = 6000
SPARSE_DIMS = (8, 12, 10, 6, 9, 12, 8, 5)
N_DENSE = 3
PAIRS = ((0, 2), (1, 5), (3, 6))
EMBEDDING_DIM, BATCH_SIZE, EPOCHS, HIDDEN = 4, 64, 8, (32, 32)
sparse_features = [f"C{i}" for i in range(1, len(SPARSE_DIMS) + 1)]
dense_features = [f"I{i}" for i in range(1, N_DENSE + 1)]


# --------------------------------------------------------------------------- the data (criteo_sample.txt, made up)


def click_log(seed: int) -> dict[str, np.ndarray]:
    """The sample file as columns (no pandas here): raw categorical strings, raw counts, the click."""
    rng = np.random.default_rng(seed + 71)
    columns: dict[str, np.ndarray] = {}
    logit = np.full(ROWS, -1.2)
    for name, d in zip(sparse_features, SPARSE_DIMS):
        freq = 1.0 / np.arange(1, d + 1) ** 0.8
        columns[name] = rng.choice(d, size=ROWS, p=freq / freq.sum())
        logit += rng.normal(scale=0.3, size=d)[columns[name]]
    for j, name in enumerate(dense_features):
        log_count = rng.normal(loc=3.0 + j, scale=2.0, size=ROWS)
        columns[name] = np.floor(np.exp(log_count))
        logit += (0.5 if j % 2 == 0 else -0.4) * (log_count - (3.0 + j)) / 2.0
    for f, g in PAIRS:
        u = rng.normal(scale=1.2, size=(SPARSE_DIMS[f], 2))
        v = rng.normal(scale=1.2, size=(SPARSE_DIMS[g], 2))
        logit += np.sum(u[columns[sparse_features[f]]] * v[columns[sparse_features[g]]], axis=1)
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
    table = nn.ModuleDict({f.embedding_name: nn.Embedding(f.vocabulary_size, 1 if linear else f.embedding_dim)
                           for f in sparse})  # fmt: skip
    for emb in table.values():
        nn.init.normal_(emb.weight, mean=0, std=init_std)
    return table


def combined_dnn_input(sparse_embedding_list, dense_value_list) -> torch.Tensor:
    sparse_part = torch.flatten(torch.cat(sparse_embedding_list, dim=-1), start_dim=1)
    dense_part = torch.flatten(torch.cat(dense_value_list, dim=-1), start_dim=1)
    return torch.cat([sparse_part, dense_part], dim=-1)



# --------------------------------------------------------------------------- deepctr_torch/layers


class CrossNet(nn.Module):
    """parameterization='matrix' (DCN-M / DCN V2)."""

    def __init__(self, in_features: int, layer_num: int = 2) -> None:
        super().__init__()
        self.layer_num = layer_num
        self.kernels = nn.Parameter(torch.empty(layer_num, in_features, in_features))
        self.bias = nn.Parameter(torch.empty(layer_num, in_features, 1))
        for i in range(layer_num):
            nn.init.xavier_normal_(self.kernels[i])
            nn.init.zeros_(self.bias[i])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x_0 = inputs.unsqueeze(2)  # batch, in, 1
        x_l = x_0
        for i in range(self.layer_num):
            xl_w = torch.matmul(self.kernels[i], x_l)  # W x_l
            x_l = x_0 * (xl_w + self.bias[i]) + x_l
        return torch.squeeze(x_l, dim=2)


class DNN(nn.Module):
    def __init__(self, inputs_dim: int, hidden_units, dropout_rate: float = 0.0, init_std: float = 0.0001) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout_rate)
        units = [inputs_dim, *hidden_units]
        self.linears = nn.ModuleList([nn.Linear(units[i], units[i + 1]) for i in range(len(units) - 1)])
        self.activation_layers = nn.ModuleList([nn.ReLU(inplace=True) for _ in range(len(units) - 1)])
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
        return torch.sigmoid(X + self.bias)


# --------------------------------------------------------------------------- deepctr_torch/models/basemodel.py + dcn.py


class Linear(nn.Module):
    def __init__(self, feature_columns, feature_index, init_std: float = 0.0001) -> None:
        super().__init__()
        self.feature_index = feature_index
        self.sparse_feature_columns = [f for f in feature_columns if isinstance(f, SparseFeat)]
        self.dense_feature_columns = [f for f in feature_columns if isinstance(f, DenseFeat)]
        self.embedding_dict = create_embedding_matrix(feature_columns, init_std, linear=True)
        self.weight = nn.Parameter(torch.empty(sum(f.dimension for f in self.dense_feature_columns), 1))
        nn.init.normal_(self.weight, mean=0, std=init_std)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        sparse = [self.embedding_dict[f.embedding_name](X[:, slice(*self.feature_index[f.name])].long())
                  for f in self.sparse_feature_columns]  # fmt: skip
        dense = [X[:, slice(*self.feature_index[f.name])] for f in self.dense_feature_columns]
        logit = torch.sum(torch.cat(sparse, dim=-1), dim=-1, keepdim=False)
        return logit + torch.cat(dense, dim=-1).matmul(self.weight)



class DCN(nn.Module):
    def __init__(self, linear_feature_columns, dnn_feature_columns, cross_num=2, dnn_hidden_units=(128, 128),
                 l2_reg_linear=1e-5, l2_reg_embedding=1e-5, l2_reg_cross=1e-5, l2_reg_dnn=0, init_std=0.0001,
                 seed=1024) -> None:  # fmt: skip
        super().__init__()
        torch.manual_seed(seed)
        self.dnn_feature_columns = dnn_feature_columns
        self.feature_index = build_input_features(linear_feature_columns + dnn_feature_columns)
        self.embedding_dict = create_embedding_matrix(dnn_feature_columns, init_std)
        self.linear_model = Linear(linear_feature_columns, self.feature_index)
        self.regularization_weight = []
        self.add_regularization_weight(self.embedding_dict.parameters(), l2=l2_reg_embedding)
        self.add_regularization_weight(self.linear_model.parameters(), l2=1e-5)  # BaseModel's own l2_reg_linear
        self.out = PredictionLayer()
        input_dim = sum(f.embedding_dim if isinstance(f, SparseFeat) else f.dimension for f in dnn_feature_columns)
        self.dnn = DNN(input_dim, dnn_hidden_units, init_std=init_std)
        self.dnn_linear = nn.Linear(input_dim + dnn_hidden_units[-1], 1, bias=False)
        self.crossnet = CrossNet(input_dim, layer_num=cross_num)
        self.add_regularization_weight([p for n, p in self.dnn.named_parameters() if "weight" in n and "bn" not in n],
                                       l2=l2_reg_dnn)  # fmt: skip
        self.add_regularization_weight([self.dnn_linear.weight], l2=l2_reg_linear)
        self.add_regularization_weight([self.crossnet.kernels], l2=l2_reg_cross)

    def add_regularization_weight(self, weight_list, l1: float = 0.0, l2: float = 0.0) -> None:
        self.regularization_weight.append((list(weight_list), l1, l2))

    def get_regularization_loss(self) -> torch.Tensor:
        total = torch.zeros((1,))
        for weight_list, l1, l2 in self.regularization_weight:
            for parameter in weight_list:
                if l1 > 0:
                    total = total + torch.sum(l1 * torch.abs(parameter))
                if l2 > 0:
                    total = total + torch.sum(l2 * torch.square(parameter))
        return total

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        logit = self.linear_model(X)
        sparse_embedding_list = [self.embedding_dict[f.embedding_name](X[:, slice(*self.feature_index[f.name])].long())
                                 for f in self.dnn_feature_columns if isinstance(f, SparseFeat)]  # fmt: skip
        dense_value_list = [X[:, slice(*self.feature_index[f.name])]
                            for f in self.dnn_feature_columns if isinstance(f, DenseFeat)]  # fmt: skip
        dnn_input = combined_dnn_input(sparse_embedding_list, dense_value_list)
        deep_out = self.dnn(dnn_input)
        cross_out = self.crossnet(dnn_input)
        logit = logit + self.dnn_linear(torch.cat((cross_out, deep_out), dim=-1))
        return self.out(logit)


def predict(model: nn.Module, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    model.eval()
    loader = DataLoader(TensorDataset(torch.from_numpy(x)), shuffle=False, batch_size=batch_size)
    out = []
    with torch.no_grad():
        for (x_test,) in loader:
            out.append(model(x_test.float()).numpy())
    return np.concatenate(out).astype("float64").reshape(-1)


# --------------------------------------------------------------------------- examples/run_classification_criteo.py + fit


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data = click_log(seed)
    for feat in sparse_features:
        data[feat] = LabelEncoder().fit_transform(data[feat])
    if variant != "dense_not_scaled":
        scaled = MinMaxScaler(feature_range=(0, 1)).fit_transform(np.stack([data[f] for f in dense_features], axis=1))
        data.update({f: scaled[:, j] for j, f in enumerate(dense_features)})

    fixlen_feature_columns = ([SparseFeat(feat, vocabulary_size=int(data[feat].max()) + 1, embedding_dim=EMBEDDING_DIM)
                               for feat in sparse_features] + [DenseFeat(feat, 1) for feat in dense_features])  # fmt: skip
    linear_feature_columns = dnn_feature_columns = fixlen_feature_columns
    feature_names = list(build_input_features(linear_feature_columns + dnn_feature_columns))

    train_rows, test_rows = train_test_split(np.arange(ROWS), test_size=0.2, random_state=2020 + seed)
    train_df = {k: v[train_rows] for k, v in data.items()}
    test_df = {k: v[test_rows] for k, v in data.items()}

    model = DCN(linear_feature_columns, dnn_feature_columns, cross_num=2, dnn_hidden_units=HIDDEN, seed=1024 + seed)
    optim = torch.optim.Adam(model.parameters())  # compile("adam", ...): lr 0.001
    # compile("adam", "binary_crossentropy"); the bug: compile("adam", F.binary_cross_entropy_with_logits)
    loss_func = F.binary_cross_entropy_with_logits if variant == "sigmoid_then_bce_with_logits" else F.binary_cross_entropy

    x_all = np.concatenate([train_df[name][:, None] for name in feature_names], axis=-1).astype(np.float64)
    split_at = int(x_all.shape[0] * (1.0 - 0.2))
    x, val_x = x_all[:split_at], x_all[split_at:]
    y, val_y = train_df["label"][:split_at], train_df["label"][split_at:]
    train_tensor_data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sample_num = len(train_tensor_data)
    train_loader = DataLoader(dataset=train_tensor_data, shuffle=True, batch_size=BATCH_SIZE,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip

    def total_loss_of(y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.Tensor:
        return loss_func(y_pred.squeeze(), y_true.squeeze(), reduction="sum") + model.get_regularization_loss()

    splits = (torch.from_numpy(x).float(), torch.from_numpy(y).float(), torch.from_numpy(val_x).float(),
              torch.from_numpy(val_y).float())  # fmt: skip
    first_batch = (splits[0][:BATCH_SIZE], splits[1][:BATCH_SIZE])
    nx.preflight(model, first_batch, total_loss_of, optimizer=optim, data=splits)
    mon = nx.monitor(model, optim, every=10, loss_fn=loss_func)

    epoch_loss = val_logloss = val_auc = float("nan")
    model.train()  # fit's `model = self.train()`, once (no dropout or batch norm here)
    for _epoch in range(EPOCHS):
        total_loss_epoch = 0.0
        for x_train, y_train in train_loader:
            xb, yb = x_train.float(), y_train.float()
            y_pred = model(xb).squeeze()
            optim.zero_grad()
            loss = mon.loss_fn(y_pred, yb.squeeze(), reduction="sum")
            total_loss = loss + model.get_regularization_loss()
            total_loss_epoch += total_loss.item()
            total_loss.backward()
            optim.step()
            mon.log(total_loss)
        epoch_loss = total_loss_epoch / sample_num
        val_pred = predict(model, val_x, BATCH_SIZE)
        val_logloss, val_auc = log_loss(val_y, val_pred), roc_auc_score(val_y, val_pred)
        mon.log(val_logloss * BATCH_SIZE, split="val")

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
