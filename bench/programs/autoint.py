"""Port of shenweichen/DeepCTR-Torch's AutoInt: per-field embeddings, a stack of multi-head
self-attention ``InteractingLayer``s with a residual projection, the attended fields flattened
into one logit next to a first-order linear part, trained with summed binary cross-entropy
plus L2 on the embeddings by ``BaseModel.fit`` and Adam.

Source: github.com/shenweichen/DeepCTR-Torch, ``deepctr_torch/models/autoint.py``,
``deepctr_torch/layers/interaction.py`` (``InteractingLayer``),
``deepctr_torch/models/basemodel.py``, ``deepctr_torch/inputs.py`` and
``examples/run_classification_criteo.py`` at commit
f6854257b1fc29caab655ce72c6b5528b7432574 (Apache-2.0, Copyright Weichen Shen). Written anew
from the facts of those files; no code copied.

Kept: the example's preprocessing (``LabelEncoder`` per sparse column, ``MinMaxScaler
(feature_range=(0, 1))`` on the dense columns, ``SparseFeat(vocabulary_size=max + 1)``,
``DenseFeat(dimension=1)``, the same columns for the linear and the deep part,
``train_test_split(test_size=0.2, random_state=2020)``, the model input as one float matrix
whose column ranges ``build_input_features`` assigns in feature order);
``create_embedding_matrix`` (one ``nn.Embedding`` per sparse feature, normal init with
``init_std`` 1e-4, width 1 for the linear part); ``Linear`` (sum of the width-1 embeddings
plus the dense columns times a normal-initialised weight); ``InteractingLayer(embedding_size,
head_num=2, use_res=True, scaling=False)``: ``W_Query``/``W_key``/``W_Value``/``W_Res`` of
``(E, E)`` initialised normal(0, 0.05), ``tensordot`` projections, heads split along the
embedding and stacked in front ``(head, batch, field, E/head)``, scores by ``einsum
('bnik,bnjk->bnij')``, ``softmax(dim=-1)``, ``matmul`` with the values, heads concatenated
back, plus the residual projection, ReLU; ``AutoInt(att_layer_num=3, att_head_num=2,
att_res=True, dnn_hidden_units=())`` (the paper's AutoInt, the "only interacting layer"
branch of ``forward``: ``dnn_linear = Linear(field_num * E, 1, bias=False)`` on the flattened
attention output, added to the linear logit); ``PredictionLayer`` (a zero bias, sigmoid);
``l2_reg_embedding`` 1e-5 and ``l2_reg_linear`` 0 summed by ``get_regularization_loss``;
``compile("adam", "binary_crossentropy", metrics=["binary_crossentropy", "auc"])``
(``Adam(lr=0.001)``, ``F.binary_cross_entropy``); ``fit(batch_size, epochs,
validation_split=0.2)``: ``model.train()`` once before the epochs, the last 20% of the
training rows kept for validation before shuffling, a shuffled ``DataLoader``, per batch
``model(x).squeeze()``, ``zero_grad``, ``loss_func(..., reduction='sum')`` + regularisation,
``backward``, ``step``; the epoch loss (total loss / samples); ``evaluate``/``predict``
(``model.eval()``, ``no_grad``, batches of 256); the test logloss and AUC the example prints.
Shrunk: a synthetic click log instead of ``criteo_sample.txt``: 8 categorical fields of 5
to 12 values with skewed (Zipf-like) frequencies and 3 count-like dense fields (log-normal,
heavy-tailed up to ~10^5 as Criteo's I-columns); the click drawn from a logistic model with
a weight per categorical value, the log of each count, and three pairwise field
interactions (rank-2 products of per-value latent vectors, the part only the attention
layers can model); 6,000 rows; ``embedding_dim`` 8 (divisible by the 2 heads), batch 64
instead of 32, 8 epochs instead of 10; no callbacks, ``History`` or tqdm, and the per-batch training
metrics ``fit`` computes for its progress line are not computed; CPU.
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

NAME = "autoint"
SOURCE = Source("shenweichen/DeepCTR-Torch", "deepctr_torch/models/autoint.py",
                "f6854257b1fc29caab655ce72c6b5528b7432574", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published, with model = AutoInt(..., dnn_hidden_units=())"),
        Variant(
            "softmax_over_batch",
            "InteractingLayer normalises the attention scores with F.softmax(inner_product, dim=1) instead of "
            "dim=-1: on the (head, batch, field, field) scores, axis 1 is the batch, so each field pair's weights "
            "are spread over the samples of the batch instead of over the fields",
            (C.WRONG_RESHAPE, C.SHAPE_BROADCAST),
            ("https://github.com/shenweichen/DeepCTR-Torch/issues/63",
             "https://github.com/PetrochukM/PyTorch-NLP/issues/2",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52"),
            Measure("test_auc", "test AUC at least 0.02 below the healthy run's: 0.766 against 0.816 healthy on "
                    "seed 0 (test logloss 0.570 against 0.513)",
                    lambda healthy, buggy: not buggy > healthy - 0.02),
        ),
        Variant(
            "dense_not_scaled",
            "the MinMaxScaler step left out: the count-like dense columns reach the linear part raw "
            "(heavy-tailed counts up to ~10^5 next to embeddings of scale 1e-4)",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/shenweichen/DeepCTR/issues/284",
             "https://github.com/ChenglongChen/tensorflow-DeepFM/issues/47",
             "https://github.com/RUCAIBox/RecBole/issues/1109"),
            Measure("test_logloss", "test logloss at least 0.03 above the healthy run's: 0.576 against 0.513 "
                    "healthy on seed 0 (test AUC 0.792 against 0.816)",
                    lambda healthy, buggy: not buggy < healthy + 0.03),
        ),
    )
}

ROWS = 6000
SPARSE_DIMS = (8, 12, 10, 6, 9, 12, 8, 5)
N_DENSE = 3
PAIRS = ((0, 2), (1, 5), (3, 6))
EMBEDDING_DIM, BATCH_SIZE, EPOCHS = 8, 64, 8
sparse_features = [f"C{i}" for i in range(1, len(SPARSE_DIMS) + 1)]
dense_features = [f"I{i}" for i in range(1, N_DENSE + 1)]


# --------------------------------------------------------------------------- the data (criteo_sample.txt, made up)


def click_log(seed: int) -> dict[str, np.ndarray]:
    """The sample file as columns (no pandas here): raw categorical strings, raw counts, the click."""
    rng = np.random.default_rng(seed + 53)
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


class InteractingLayer(nn.Module):
    def __init__(self, embedding_size: int, head_num: int = 2, use_res: bool = True, scaling: bool = False,
                 softmax_dim: int = -1) -> None:  # fmt: skip
        super().__init__()
        if embedding_size % head_num != 0:
            raise ValueError("embedding_size is not an integer multiple of head_num!")
        self.att_embedding_size = embedding_size // head_num
        self.head_num, self.use_res, self.scaling = head_num, use_res, scaling
        self.softmax_dim = softmax_dim  # -1 as published; the bug: 1 (the batch axis)
        self.W_Query = nn.Parameter(torch.empty(embedding_size, embedding_size))
        self.W_key = nn.Parameter(torch.empty(embedding_size, embedding_size))
        self.W_Value = nn.Parameter(torch.empty(embedding_size, embedding_size))
        if use_res:
            self.W_Res = nn.Parameter(torch.empty(embedding_size, embedding_size))
        for tensor in self.parameters():
            nn.init.normal_(tensor, mean=0.0, std=0.05)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        q = torch.tensordot(inputs, self.W_Query, dims=([-1], [0]))  # batch, field, E
        k = torch.tensordot(inputs, self.W_key, dims=([-1], [0]))
        v = torch.tensordot(inputs, self.W_Value, dims=([-1], [0]))
        q = torch.stack(torch.split(q, self.att_embedding_size, dim=2))  # head, batch, field, E/head
        k = torch.stack(torch.split(k, self.att_embedding_size, dim=2))
        v = torch.stack(torch.split(v, self.att_embedding_size, dim=2))
        scores = torch.einsum("bnik,bnjk->bnij", q, k)  # head, batch, field, field
        if self.scaling:
            scores = scores / self.att_embedding_size**0.5
        self.normalized_att_scores = F.softmax(scores, dim=self.softmax_dim)
        out = torch.matmul(self.normalized_att_scores, v)
        out = torch.cat(torch.split(out, 1), dim=-1).squeeze(0)  # batch, field, E
        if self.use_res:
            out = out + torch.tensordot(inputs, self.W_Res, dims=([-1], [0]))
        return F.relu(out)


class PredictionLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros((1,)))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(X + self.bias)


# --------------------------------------------------------------------------- deepctr_torch/models/basemodel.py + autoint.py


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


class AutoInt(nn.Module):
    def __init__(self, linear_feature_columns, dnn_feature_columns, att_layer_num=3, att_head_num=2, att_res=True,
                 l2_reg_embedding=1e-5, init_std=0.0001, seed=1024, softmax_dim=-1) -> None:  # fmt: skip
        super().__init__()
        torch.manual_seed(seed)
        self.dnn_feature_columns = dnn_feature_columns
        self.feature_index = build_input_features(linear_feature_columns + dnn_feature_columns)
        self.embedding_dict = create_embedding_matrix(dnn_feature_columns, init_std)
        self.linear_model = Linear(linear_feature_columns, self.feature_index)
        self.regularization_weight = []
        self.add_regularization_weight(self.embedding_dict.parameters(), l2=l2_reg_embedding)
        self.add_regularization_weight(self.linear_model.parameters(), l2=0)  # AutoInt passes l2_reg_linear=0
        self.out = PredictionLayer()
        field_num = len(self.embedding_dict)
        embedding_size = dnn_feature_columns[0].embedding_dim
        self.dnn_linear = nn.Linear(field_num * embedding_size, 1, bias=False)  # only interacting layers
        self.int_layers = nn.ModuleList([InteractingLayer(embedding_size, att_head_num, att_res, softmax_dim=softmax_dim)
                                         for _ in range(att_layer_num)])  # fmt: skip

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
        sparse_embedding_list = [self.embedding_dict[f.embedding_name](X[:, slice(*self.feature_index[f.name])].long())
                                 for f in self.dnn_feature_columns if isinstance(f, SparseFeat)]  # fmt: skip
        logit = self.linear_model(X)
        att_input = torch.cat(sparse_embedding_list, dim=1)  # batch, field, E
        for layer in self.int_layers:
            att_input = layer(att_input)
        att_output = torch.flatten(att_input, start_dim=1)
        logit = logit + self.dnn_linear(att_output)
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

    model = AutoInt(linear_feature_columns, dnn_feature_columns, seed=1024 + seed,
                    softmax_dim=1 if variant == "softmax_over_batch" else -1)  # fmt: skip
    optim = torch.optim.Adam(model.parameters())  # compile("adam", ...): lr 0.001
    loss_func = F.binary_cross_entropy

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
