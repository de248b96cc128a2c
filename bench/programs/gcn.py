"""Port of the PyTorch graph convolutional network example (Kipf & Welling's GCN on Cora).

Source: github.com/pytorch/examples, ``gcn/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``GraphConv`` (a ``kernel`` parameter of shape (in, out) with ``xavier_normal_``, an
optional zero-initialised bias, ``torch.mm(input, kernel)`` then ``torch.spmm(adj,
support)``); ``GCN`` = GraphConv -> ``F.relu`` -> ``nn.Dropout`` -> GraphConv ->
``F.log_softmax(dim=1)``; ``load_cora``'s preprocessing: binary bag-of-words features
row-normalised (each row divided by its sum, empty rows left at zero) and handed over
sparse, the adjacency built from the *directed* citation list (not symmetrised) plus
the identity, renormalised as D^-1/2 (A + I) D^-1/2 with D its row sums, sparse; one
random permutation split into test / val / train (the example's 1,000 / 500 / rest of
2,708 nodes, about 37% / 18% / 45%); full-batch training, one step per epoch:
``model.train()``, ``zero_grad``, forward on every node, ``nn.NLLLoss`` over the training
nodes only, ``backward``, ``step``, then ``test`` on the training and validation nodes
(``model.eval()`` + ``torch.no_grad()``, loss and accuracy over the mask); the final
``test`` on the test nodes; Adam. The settings are the README's command: ``--epochs 200
--lr 0.01 --l2 5e-4 --dropout-p 0.5 --hidden-dim 16 --include-bias`` (weight decay
through Adam's ``weight_decay``).
Shrunk: Cora (2,708 papers, 1,433 words, 7 classes, 5,429 citations; downloaded) is
replaced by a graph made at run time with a fixed seed: a stochastic block model of 900
nodes in 7 classes of Cora's proportions, about 2 directed edges per node (Cora's
5,429 / 2,708), each drawn inside the source's class with probability 0.75 and
uniformly otherwise (edge homophily about 0.79; Cora's is 0.81), and 400-word binary
bag-of-words features (about 18 draws a node, as Cora's 18 words) 30% from a class's
own 30-word topic and 70% from the whole vocabulary (the healthy run's test accuracy,
0.83-0.87 on seeds 0-2, is near the README's 0.825 on Cora).
Split 330 / 165 / 405. The 200 epochs are kept.

nndx, as the author would add it (the other ports' layout): a preflight ``nndx.probe`` on
the full batch ``((features, adj_mat), labels)`` with the loop's masked loss as the loss
function, the loop under ``nndx.Monitor`` with the criterion called through
``mon.loss_fn``, the validation loss and accuracy the loop already computes logged as
``split="val"`` every epoch, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gcn"
SOURCE = Source("pytorch/examples", "gcn/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (README settings, --include-bias)"),
        Variant(
            "loss_on_all_nodes",
            "criterion(output, target) instead of criterion(output[mask_train], target[mask_train]): the loss is "
            "taken over every node, so the validation and test labels are trained on and the reported test "
            "accuracy is inflated",
            (C.DATA_LEAKAGE,),
            ("https://github.com/waittim/graph-fraud-detection/issues/3",
             "https://github.com/theislab/geome/issues/16",
             "https://github.com/tkipf/gcn/issues/68"),
            Measure("test_accuracy", "test accuracy at least 0.05 above the healthy run's (the test labels were "
                    "trained on; 0.870/0.855/0.834 healthy, 0.937/0.928/0.904 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy < healthy + 0.05),
        ),
        Variant(
            "no_eval_in_test",
            "test() without model.eval(): validation and test run with dropout(0.5) still active (training "
            "itself unchanged: train_iter calls model.train() first)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/dmlc/dgl/issues/731",
             "https://github.com/ml-explore/mlx-examples/pull/1442",
             "https://github.com/giotto-ai/giotto-deep/issues/40"),
            Measure("test_loss", "test NLL, as the example's test() reports it, at least 1.1x the healthy "
                    "run's (0.54/0.58/0.57 healthy, 0.69/0.79/0.79 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
    )
}

N_NODES = 900
N_WORDS = 400
CORA_CLASS_SHARES = (818, 426, 418, 351, 298, 217, 180)  # Cora's class sizes, largest first
EPOCHS = 200
LR = 0.01
L2 = 5e-4
DROPOUT_P = 0.5
HIDDEN_DIM = 16


# --------------------------------------------------------------------------- the model


class GraphConv(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, use_bias: bool = False) -> None:
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.empty(output_dim))
            nn.init.zeros_(self.bias)

    def forward(self, input_tensor: torch.Tensor, adj_mat: torch.Tensor) -> torch.Tensor:
        support = torch.mm(input_tensor, self.kernel)
        output = torch.spmm(adj_mat, support)
        if self.bias is not None:
            output = output + self.bias
        return output


class GCN(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, use_bias: bool = True,
                 dropout_p: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.gc1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gc2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor: torch.Tensor, adj_mat: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(input_tensor, adj_mat))
        x = self.dropout(x)
        x = self.gc2(x, adj_mat)
        return F.log_softmax(x, dim=1)


# --------------------------------------------------------------------------- the data (load_cora, synthetic)


def synthetic_cora(seed: int = 0, n: int = N_NODES, words: int = N_WORDS, topic_words: int = 30,
                   words_per_node: float = 18.0, topic_share: float = 0.3, edges_per_node: float = 2.0,
                   homophily: float = 0.75) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(binary features (n, words), labels (n,), directed edges (E, 2)) of a stochastic
    block model standing in for Cora's papers, words and citations."""
    rng = np.random.default_rng(seed)
    shares = np.array(CORA_CLASS_SHARES, dtype=np.float64)
    labels = rng.choice(len(shares), size=n, p=shares / shares.sum())
    topics = np.stack([rng.choice(words, size=topic_words, replace=False) for _ in shares])
    features = np.zeros((n, words), dtype=np.float32)
    for i in range(n):
        count = max(1, rng.poisson(words_per_node))
        own = rng.random(count) < topic_share
        drawn = np.where(own, topics[labels[i]][rng.integers(topic_words, size=count)], rng.integers(words, size=count))
        features[i, drawn] = 1.0
    by_class = [np.flatnonzero(labels == c) for c in range(len(shares))]
    edges = set()
    while len(edges) < int(edges_per_node * n):
        src = int(rng.integers(n))
        if rng.random() < homophily:
            dst = int(rng.choice(by_class[labels[src]]))
        else:
            dst = int(rng.integers(n))
        if src != dst and (dst, src) not in edges:
            edges.add((src, dst))
    return features, labels, np.array(sorted(edges), dtype=np.int64)


def load_graph(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``load_cora``'s preprocessing on the synthetic graph: (sparse row-normalised
    features, labels, sparse D^-1/2 (A + I) D^-1/2)."""
    raw_features, raw_labels, edges = synthetic_cora(seed)
    features = torch.from_numpy(raw_features)
    row_sums = features.sum(dim=1)
    scale = 1 / row_sums
    scale[scale == float("inf")] = 0
    features = torch.diag(scale).to_sparse() @ features
    labels = torch.from_numpy(raw_labels).long()

    v = len(labels)
    adj = torch.sparse_coo_tensor(torch.from_numpy(edges.T), torch.ones(len(edges)), (v, v))
    adj = torch.eye(v) + adj  # dense, self-loops added
    inv_sqrt_degree = torch.sqrt(1 / adj.sum(dim=1))
    inv_sqrt_degree[inv_sqrt_degree == float("inf")] = 0
    d = torch.diag(inv_sqrt_degree).to_sparse()
    adj = d @ adj @ d
    return features.to_sparse(), labels, adj.to_sparse()


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = EPOCHS) -> dict[str, float]:
    torch.manual_seed(42 + seed)  # the example's --seed default
    features, labels, adj_mat = load_graph(seed=seed)
    idx = torch.randperm(len(labels))
    n_test, n_val = round(len(labels) * 1000 / 2708), round(len(labels) * 500 / 2708)
    idx_test, idx_val, idx_train = idx[:n_test], idx[n_test : n_test + n_val], idx[n_test + n_val :]

    gcn = GCN(features.shape[1], HIDDEN_DIM, labels.max().item() + 1, True, DROPOUT_P)
    optimizer = torch.optim.Adam(gcn.parameters(), lr=LR, weight_decay=L2)
    criterion = nn.NLLLoss()
    evaluate_in_eval_mode = variant != "no_eval_in_test"

    def masked(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if variant == "loss_on_all_nodes":
            return output, target
        return output[idx_train], target[idx_train]

    def loss_on_graph(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(*masked(output, target))  # the loop's loss, for the probe

    full_batch = ((features, adj_mat), labels)
    nx.preflight(gcn, full_batch, loss_on_graph, optimizer=optimizer)
    mon = nx.monitor(gcn, optimizer, every=10, loss_fn=criterion)

    for _epoch in range(1, epochs + 1):  # train_iter
        gcn.train()
        optimizer.zero_grad()
        output = gcn(features, adj_mat)
        loss = mon.loss_fn(*masked(output, labels))
        loss.backward()
        optimizer.step()
        mon.log(loss)
        loss_train, acc_train = test(gcn, criterion, (features, adj_mat), labels, idx_train, evaluate_in_eval_mode)
        loss_val, acc_val = test(gcn, criterion, (features, adj_mat), labels, idx_val, evaluate_in_eval_mode)
        mon.log(loss_val, split="val", accuracy=acc_val)

    nx.finish(mon, gcn, full_batch, loss_on_graph, optimizer=optimizer)
    loss_test, acc_test = test(gcn, criterion, (features, adj_mat), labels, idx_test, evaluate_in_eval_mode)
    # the test nodes scored with dropout off whatever the variant: what the model really does
    loss_test_eval, acc_test_eval = test(gcn, criterion, (features, adj_mat), labels, idx_test, True)
    return {
        "train_loss": loss_train,
        "train_accuracy": acc_train,
        "val_loss": loss_val,
        "val_accuracy": acc_val,
        "test_loss": loss_test,
        "test_accuracy": acc_test,
        "test_loss_eval_mode": loss_test_eval,
        "test_accuracy_eval_mode": acc_test_eval,
    }


def test(model: nn.Module, criterion: nn.Module, input: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor,
         mask: torch.Tensor, eval_mode: bool = True) -> tuple[float, float]:  # fmt: skip
    if eval_mode:
        model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()
