"""Port of DaehanKim/vgae_pytorch: the variational graph auto-encoder (Kipf & Welling) for link prediction.

Source: github.com/DaehanKim/vgae_pytorch, ``model.py``, ``train.py``, ``preprocessing.py``
and ``args.py`` at commit 568c20f5b88adeafd3b8bcfadffd340dc0bf06b8 (MIT; a PyTorch port of
tkipf/gae, whose preprocessing it reuses). Written anew from the facts of those files; no
code copied.

Kept: ``GraphConvSparse`` (a weight of Glorot-uniform values in +-sqrt(6 / (in + out)),
no bias, the normalised adjacency held by the layer: ``adj @ (x @ W)`` then the
activation, ReLU by default); ``VGAE``: a base GCN (ReLU) to hidden1 32, then two linear
GCNs to hidden2 16 for ``mean`` and ``logstd`` (kept on the module), z = randn * exp(logstd)
+ mean, the inner-product decoder ``sigmoid(Z Z^T)``; ``preprocess_graph`` (D^-1/2 (A +
I) D^-1/2); ``mask_test_edges``: diagonal removed, the upper triangle's edges shuffled
(``np.random.shuffle``), 5% validation and 10% test positives, as many negatives for each
drawn at random among the non-edges, the training adjacency rebuilt symmetric from the
rest; ``train.py``: the encoder sees ``preprocess_graph(adj_train)``, ``pos_weight =
(N^2 - sum A) / sum A`` and ``norm = N^2 / ((N^2 - sum A) * 2)`` from the training
adjacency, the target ``adj_train + I`` with every positive entry weighted by
``pos_weight``; per epoch the forward on the features, ``zero_grad``, ``loss = norm *
F.binary_cross_entropy(A_pred, adj_label, weight)``, minus the KL term ``0.5 / N * (1 +
2 logstd - mean^2 - exp(logstd)^2).sum(1).mean()`` (the repository's corrected form),
``backward``, ``step``; ``get_acc`` and ``get_scores`` (ROC AUC and average precision
of the sigmoid of the reconstructed entries, as written, on the validation edges every
epoch and on the test edges after the last, from the last epoch's ``A_pred``); Adam,
lr 0.01, 200 epochs. ``args.model`` is set to ``'VGAE'`` (the file ships with ``'GAE'``).
Shrunk: Cora's citation graph and 1,433-word features (files in the repository) are
replaced by a graph made at run time with a fixed seed: a stochastic block model of 400
nodes in 8 communities, about 3 undirected edges a node (Cora: 2.0), 85% of them inside a
community, and 200-word binary bag-of-words features (about 12 words a node, 30% from
the community's 15-word topic), handed over dense. Sizes and schedule are the
repository's (hidden 32/16, 200 epochs, lr 0.01).

nndx, as the author would add it: the reconstruction target is ``adj_label`` and the
loss needs the model's ``mean``/``logstd``, so ``loss_fn(A_pred, adj_label)`` is the
loop's loss as a closure over the model; a preflight ``nndx.probe`` on ``(features,
adj_label)`` with it, the loop under ``nndx.Monitor`` with the loss called through
``mon.loss_fn``, the loss logged every epoch (the program computes no validation loss,
only ROC AUC / AP, so nothing is logged as ``split="val"``); after training ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, roc_auc_score
from torch import nn
from torch.optim import Adam

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "vgae"
SOURCE = Source("DaehanKim/vgae_pytorch", "train.py", "568c20f5b88adeafd3b8bcfadffd340dc0bf06b8", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published, args.model = 'VGAE'"),
        Variant(
            "encoder_sees_test_edges",
            "adj_norm = preprocess_graph(adj) taken before adj = adj_train: the encoder propagates over the full "
            "graph, held-out validation and test edges included (the loss target stays adj_train)",
            (C.DATA_LEAKAGE,),
            ("https://github.com/snap-stanford/ogb/issues/316",
             "https://github.com/snap-stanford/ogb/issues/72",
             "https://github.com/snap-stanford/ogb/issues/285",
             "https://github.com/THUDM/CogDL/issues/18"),
            Measure("test_roc", "test ROC AUC at least 0.03 above the healthy run's (the held-out edges were "
                    "propagated over; seed 0: 0.951 against 0.897, validation 0.914 against 0.844)",
                    lambda healthy, buggy: not buggy < healthy + 0.03),
        ),
        Variant(
            "kl_not_scaled",
            "the KL term without the 0.5 / N factor's 1/N (-0.5 * mean over nodes of the per-node KL, as in a "
            "plain VAE): against a reconstruction loss averaged over N^2 entries the prior dominates",
            (C.WRONG_LOSS,),
            ("https://github.com/tkipf/gae/issues/20", "https://github.com/tkipf/gae/issues/8",
             "https://github.com/zfjsail/gae-pytorch/issues/3", "https://github.com/Flawless1202/VGAE_pyG/issues/1"),
            Measure("test_roc", "test ROC AUC at least 0.05 below the healthy run's (the posterior collapses to "
                    "the prior, the decoder scores are noise; seed 0: 0.53 against 0.90)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

N_NODES, N_COMMUNITIES, N_WORDS = 400, 8, 200
HIDDEN1_DIM, HIDDEN2_DIM = 32, 16
NUM_EPOCH = 200
LEARNING_RATE = 0.01


# --------------------------------------------------------------------------- model.py


def glorot_init(input_dim: int, output_dim: int) -> nn.Parameter:
    init_range = np.sqrt(6.0 / (input_dim + output_dim))
    return nn.Parameter(torch.rand(input_dim, output_dim) * 2 * init_range - init_range)


class GraphConvSparse(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, adj: torch.Tensor, activation=F.relu) -> None:
        super().__init__()
        self.weight = glorot_init(input_dim, output_dim)
        self.adj = adj
        self.activation = activation

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = torch.mm(inputs, self.weight)
        x = torch.mm(self.adj, x)
        return self.activation(x)


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


class VGAE(nn.Module):
    def __init__(self, adj: torch.Tensor, input_dim: int) -> None:
        super().__init__()
        self.base_gcn = GraphConvSparse(input_dim, HIDDEN1_DIM, adj)
        self.gcn_mean = GraphConvSparse(HIDDEN1_DIM, HIDDEN2_DIM, adj, activation=identity)
        self.gcn_logstddev = GraphConvSparse(HIDDEN1_DIM, HIDDEN2_DIM, adj, activation=identity)

    def encode(self, X: torch.Tensor) -> torch.Tensor:
        hidden = self.base_gcn(X)
        self.mean = self.gcn_mean(hidden)
        self.logstd = self.gcn_logstddev(hidden)
        gaussian_noise = torch.randn(X.size(0), HIDDEN2_DIM)
        return gaussian_noise * torch.exp(self.logstd) + self.mean

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return dot_product_decode(self.encode(X))


def dot_product_decode(Z: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(torch.matmul(Z, Z.t()))


# --------------------------------------------------------------------------- the data (input_data.py, synthetic)


def synthetic_graph(seed: int, n: int = N_NODES, communities: int = N_COMMUNITIES, words: int = N_WORDS,
                    topic_words: int = 15, words_per_node: float = 12.0, topic_share: float = 0.3,
                    edges_per_node: float = 3.0, homophily: float = 0.85) -> tuple[sp.csr_matrix, sp.lil_matrix]:  # fmt: skip
    rng = np.random.default_rng(seed)
    labels = rng.integers(communities, size=n)
    topics = np.stack([rng.choice(words, size=topic_words, replace=False) for _ in range(communities)])
    features = np.zeros((n, words), dtype=np.float32)
    for i in range(n):
        count = max(1, rng.poisson(words_per_node))
        own = rng.random(count) < topic_share
        drawn = np.where(own, topics[labels[i]][rng.integers(topic_words, size=count)], rng.integers(words, size=count))
        features[i, drawn] = 1.0
    by_class = [np.flatnonzero(labels == c) for c in range(communities)]
    edges: set[tuple[int, int]] = set()
    while len(edges) < int(edges_per_node * n):
        src = int(rng.integers(n))
        dst = int(rng.choice(by_class[labels[src]])) if rng.random() < homophily else int(rng.integers(n))
        if src != dst:
            edges.add((min(src, dst), max(src, dst)))
    rows, cols = np.array(sorted(edges)).T
    adj = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    return adj + adj.T, sp.lil_matrix(features)


# --------------------------------------------------------------------------- preprocessing.py


def sparse_to_tuple(sparse_mx):
    if not sp.isspmatrix_coo(sparse_mx):
        sparse_mx = sparse_mx.tocoo()
    return np.vstack((sparse_mx.row, sparse_mx.col)).transpose(), sparse_mx.data, sparse_mx.shape


def preprocess_graph(adj):
    adj = sp.coo_matrix(adj)
    adj_ = adj + sp.eye(adj.shape[0])
    rowsum = np.array(adj_.sum(1))
    degree_mat_inv_sqrt = sp.diags(np.power(rowsum, -0.5).flatten())
    return sparse_to_tuple(adj_.dot(degree_mat_inv_sqrt).transpose().dot(degree_mat_inv_sqrt).tocoo())


def mask_test_edges(adj):
    adj = adj - sp.dia_matrix((adj.diagonal()[np.newaxis, :], [0]), shape=adj.shape)
    adj.eliminate_zeros()
    edges = sparse_to_tuple(sp.triu(adj))[0]
    edges_all = sparse_to_tuple(adj)[0]
    num_test = int(np.floor(edges.shape[0] / 10.0))
    num_val = int(np.floor(edges.shape[0] / 20.0))
    all_edge_idx = list(range(edges.shape[0]))
    np.random.shuffle(all_edge_idx)
    val_edge_idx = all_edge_idx[:num_val]
    test_edge_idx = all_edge_idx[num_val : num_val + num_test]
    test_edges, val_edges = edges[test_edge_idx], edges[val_edge_idx]
    train_edges = np.delete(edges, np.hstack([test_edge_idx, val_edge_idx]), axis=0)

    def ismember(a, b) -> bool:
        return bool(np.any(np.all(np.round(np.asarray(a) - b[:, None], 5) == 0, axis=-1)))

    test_edges_false: list[list[int]] = []
    while len(test_edges_false) < len(test_edges):
        i, j = np.random.randint(0, adj.shape[0]), np.random.randint(0, adj.shape[0])
        if i == j or ismember([i, j], edges_all):
            continue
        if test_edges_false and (ismember([j, i], np.array(test_edges_false)) or ismember([i, j], np.array(test_edges_false))):
            continue
        test_edges_false.append([i, j])
    val_edges_false: list[list[int]] = []
    while len(val_edges_false) < len(val_edges):
        i, j = np.random.randint(0, adj.shape[0]), np.random.randint(0, adj.shape[0])
        if i == j or ismember([i, j], train_edges) or ismember([j, i], train_edges):
            continue
        if ismember([i, j], val_edges) or ismember([j, i], val_edges):
            continue
        if val_edges_false and (ismember([j, i], np.array(val_edges_false)) or ismember([i, j], np.array(val_edges_false))):
            continue
        val_edges_false.append([i, j])
    adj_train = sp.csr_matrix((np.ones(train_edges.shape[0]), (train_edges[:, 0], train_edges[:, 1])), shape=adj.shape)
    adj_train = adj_train + adj_train.T
    return adj_train, train_edges, val_edges, val_edges_false, test_edges, test_edges_false


def to_torch_sparse(t) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.LongTensor(t[0].T), torch.FloatTensor(t[1]), torch.Size(t[2]))


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(seed)
    torch.manual_seed(seed)
    adj, features = synthetic_graph(seed)
    adj_orig = adj - sp.dia_matrix((adj.diagonal()[np.newaxis, :], [0]), shape=adj.shape)
    adj_orig.eliminate_zeros()

    adj_train, train_edges, val_edges, val_edges_false, test_edges, test_edges_false = mask_test_edges(adj)
    if variant == "encoder_sees_test_edges":
        adj_norm = preprocess_graph(adj)  # the bug: normalised before adj = adj_train
        adj = adj_train
    else:
        adj = adj_train
        adj_norm = preprocess_graph(adj)
    num_nodes = adj.shape[0]

    pos_weight = float(num_nodes * num_nodes - adj.sum()) / adj.sum()
    norm = num_nodes * num_nodes / float((num_nodes * num_nodes - adj.sum()) * 2)
    adj_label = to_torch_sparse(sparse_to_tuple(adj_train + sp.eye(adj_train.shape[0])))
    adj_norm = to_torch_sparse(adj_norm).to_dense()  # dense: torch.mm with the sparse layout is the same product
    features = torch.FloatTensor(features.toarray())

    adj_label_dense = adj_label.to_dense()
    weight_mask = adj_label_dense.view(-1) == 1
    weight_tensor = torch.ones(weight_mask.size(0))
    weight_tensor[weight_mask] = pos_weight

    model = VGAE(adj_norm, features.shape[1])
    optimizer = Adam(model.parameters(), lr=LEARNING_RATE)

    def vgae_loss(A_pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = norm * F.binary_cross_entropy(A_pred.view(-1), target.view(-1), weight=weight_tensor)
        if variant == "kl_not_scaled":
            kl_divergence = 0.5 * (1 + 2 * model.logstd - model.mean**2 - torch.exp(model.logstd) ** 2).sum(1).mean()
        else:
            kl_divergence = 0.5 / A_pred.size(0) * (1 + 2 * model.logstd - model.mean**2 - torch.exp(model.logstd) ** 2).sum(1).mean()
        return loss - kl_divergence

    def get_scores(edges_pos, edges_neg, adj_rec) -> tuple[float, float]:
        def sigmoid(x):
            return 1 / (1 + np.exp(-x))

        preds = [sigmoid(adj_rec[e[0], e[1]].item()) for e in edges_pos]
        preds_neg = [sigmoid(adj_rec[e[0], e[1]].item()) for e in edges_neg]
        preds_all = np.hstack([preds, preds_neg])
        labels_all = np.hstack([np.ones(len(preds)), np.zeros(len(preds_neg))])
        return float(roc_auc_score(labels_all, preds_all)), float(average_precision_score(labels_all, preds_all))

    def get_acc(adj_rec, adj_label) -> float:
        labels_all = adj_label.to_dense().view(-1).long()
        preds_all = (adj_rec > 0.5).view(-1).long()
        return ((preds_all == labels_all).sum().float() / labels_all.size(0)).item()

    batch = (features, adj_label_dense)
    nx.preflight(model, batch, vgae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=vgae_loss)
    loss_value, train_acc, val_roc, val_ap = float("nan"), 0.0, 0.0, 0.0
    for _epoch in range(NUM_EPOCH):
        A_pred = model(features)
        optimizer.zero_grad()
        loss = mon.loss_fn(A_pred, adj_label_dense)
        loss.backward()
        optimizer.step()
        mon.log(loss)
        loss_value = loss.item()
        train_acc = get_acc(A_pred, adj_label)
        val_roc, val_ap = get_scores(val_edges, val_edges_false, A_pred)

    nx.finish(mon, model, batch, vgae_loss, optimizer=optimizer)
    test_roc, test_ap = get_scores(test_edges, test_edges_false, A_pred)
    return {
        "train_loss": loss_value,
        "train_acc": train_acc,
        "val_roc": val_roc,
        "val_ap": val_ap,
        "test_roc": test_roc,
        "test_ap": test_ap,
    }
