"""Port of graphsage-simple: supervised GraphSAGE (mean aggregator over sampled neighbours)
on Cora, trained with SGD on random batches of nodes.

Source: github.com/williamleif/graphsage-simple, ``graphsage/model.py`` (``SupervisedGraphSage``,
``load_cora``, ``run_cora``), ``graphsage/encoders.py`` (``Encoder``) and
``graphsage/aggregators.py`` (``MeanAggregator``) at commit
d3105e5223e9602ba3ef2dd27e343d044fe4bb5f (no licence file in the repository; the README
cites Hamilton et al., NIPS 2017). Written anew from the facts of those files; no code copied.

Kept: ``MeanAggregator(features, cuda, gcn=False)``: for each node of the batch a
``random.sample`` of ``num_sample`` neighbours (all of them when fewer), no self-loop (the
aggregator's own ``gcn`` flag is never set by ``run_cora``), a dense 0/1 mask over the
union of sampled nodes divided by its row sums, ``mask.mm(embed_matrix)``; ``Encoder``
(a ``weight`` Parameter of shape (embed_dim, feat_dim), ``xavier_uniform`` init; with
``gcn=True`` the aggregated neighbours alone, ``F.relu(self.weight.mm(combined.t()))``,
i.e. an (embed_dim, n) output); the two-layer stack of ``run_cora`` (``features`` an
``nn.Embedding`` whose weight is the feature matrix with ``requires_grad=False``;
``agg1``/``enc1`` on it; ``agg2``/``enc2`` on ``lambda nodes: enc1(nodes).t()`` with
``base_model=enc1``; embed_dim 128, ``gcn=True`` on both encoders; the assignments
``enc1.num_samples = 5``/``enc2.num_samples = 5``, which set an attribute nothing reads (the
encoders keep their default ``num_sample = 10``: graphsage-simple PR #14 / issue #21),
kept as published); ``SupervisedGraphSage`` (a ``weight`` of shape (num_classes,
embed_dim), ``scores = self.weight.mm(embeds)`` returned transposed, its own ``loss``
method: ``nn.CrossEntropyLoss`` of the scores against ``labels.squeeze()``);
``load_cora``'s undirected adjacency lists (each citation added both ways) and raw 0/1
features; ``np.random.seed(1)``/``random.seed(1)``; one ``np.random.permutation`` split into
test (first 1,000), val (next 500), train (the rest, a list); ``SGD`` over the parameters
that require grad at ``lr=0.7``; 100 batches of ``batch_nodes = train[:256]`` followed by
``random.shuffle(train)``; ``zero_grad``, ``graphsage.loss(batch_nodes, labels[batch_nodes])``,
``backward``, ``step``; the validation micro-F1 of ``graphsage.forward(val)`` (neighbours
still sampled, no eval mode: the model has no dropout or batch norm) at the end.
Shrunk / changed: Cora (shipped with the repository: 2,708 papers, 1,433 words) replaced by
the stochastic block model the ``gcn`` port builds (``bench.programs.gcn.synthetic_cora``:
2,708 nodes, Cora's 7 class proportions, about 2 citations a node, edge homophily about
0.79; the ~2% of nodes it leaves without a citation each given one to a node of their class,
since every Cora paper has one and an empty neighbour set divides by zero), with 400-word
binary features instead of 1,433, of which 15% of a node's words (not the ``gcn`` port's 30%)
come from its class's topic: at 30% the task is easier than Cora (healthy validation F1
0.92-0.95 on seeds 0-2), at 15% it is 0.86-0.88; ``random.sample`` given
``sorted(neighbours)`` because Python 3.11 refuses to sample a set; ``torch.manual_seed``
added (the original leaves the weight init unseeded); ``xavier_uniform_`` for the
deprecated ``xavier_uniform``; Python 3 prints (kept as numbers). Measure only: the test
nodes' micro-F1, which the original never computes.

nndx, as the author would add it: the model's inputs are node ids, so the preflight
``nndx.probe`` gets the loop's first batch as ``(torch.LongTensor(batch_nodes), labels)``
with the model's own criterion (``graphsage.xent`` on squeezed labels) and the splits as
node-id tensors (``data=(train ids, train labels, val ids, val labels)``); it runs where
that first batch is built, inside the loop; ``nndx.Monitor(graphsage, optimizer)`` around
the loop with each batch's loss logged (the loss comes from the model's ``loss`` method,
so there is no ``loss_fn`` to hand the Monitor; the original has no validation during
training, so nothing is logged as ``split="val"``); then ``nndx.probe(..., monitor=mon)``
on that first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score
from torch import nn
from torch.nn import init

from bench.programs.gcn import synthetic_cora
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "graphsage"
SOURCE = Source("williamleif/graphsage-simple", "graphsage/model.py", "d3105e5223e9602ba3ef2dd27e343d044fe4bb5f",
                "no licence file")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "run_cora as published"),
        Variant(
            "val_in_train",
            "train = list(rand_indices[1000:]) instead of rand_indices[1500:]: the training nodes overlap the "
            "500 validation nodes, so the validation F1 the program prints is measured on nodes it trained on",
            (C.DATA_LEAKAGE,),
            ("https://github.com/edgarsmdn/MLCE_book/pull/4", "https://github.com/theislab/multimil/issues/75",
             "https://github.com/tkipf/ica/issues/2"),
            Measure("val_f1", "the validation F1 the program prints at least 0.04 above the healthy run's "
                    "(0.86/0.86/0.88 healthy, 0.96/0.92/0.96 buggy on seeds 0-2; the test F1, on nodes "
                    "it never trained on, does not rise)",
                    lambda healthy, buggy: not buggy < healthy + 0.04),
        ),
        Variant(
            "labels_not_shuffled",
            "the training labels fetched once (train_labels = labels[train]) and sliced as train_labels[:256] "
            "beside train[:256]: random.shuffle(train) reorders the nodes but not their labels, so from the "
            "second batch on each node is trained towards another node's class",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/udacity/sdc-issue-reports/issues/1326",
             "https://github.com/aidotse/LeakPro/issues/315"),
            Measure("val_f1", "validation F1 at least 0.2 below the healthy run's (0.86/0.86/0.88 healthy, "
                    "0.29/0.31/0.33 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

NUM_NODES = 2708  # Cora's
NUM_FEATS = 400
TOPIC_SHARE = 0.15
NUM_CLASSES = 7
EMBED_DIM = 128
BATCHES, BATCH_SIZE, LR = 100, 256, 0.7


# --------------------------------------------------------------------------- aggregators.py / encoders.py / model.py


class MeanAggregator(nn.Module):
    """The mean of each node's sampled neighbours' embeddings."""

    def __init__(self, features, cuda: bool = False, gcn: bool = False) -> None:
        super().__init__()
        self.features = features
        self.cuda = cuda
        self.gcn = gcn

    def forward(self, nodes, to_neighs, num_sample: int | None = 10) -> torch.Tensor:
        _set = set
        if num_sample is not None:
            _sample = random.sample
            samp_neighs = [_set(_sample(sorted(to_neigh), num_sample)) if len(to_neigh) >= num_sample else to_neigh
                           for to_neigh in to_neighs]  # fmt: skip
        else:
            samp_neighs = to_neighs
        if self.gcn:
            samp_neighs = [samp_neigh | {nodes[i]} for i, samp_neigh in enumerate(samp_neighs)]
        unique_nodes_list = list(set.union(*samp_neighs))
        unique_nodes = {n: i for i, n in enumerate(unique_nodes_list)}
        mask = torch.zeros(len(samp_neighs), len(unique_nodes))
        column_indices = [unique_nodes[n] for samp_neigh in samp_neighs for n in samp_neigh]
        row_indices = [i for i in range(len(samp_neighs)) for _ in range(len(samp_neighs[i]))]
        mask[row_indices, column_indices] = 1
        num_neigh = mask.sum(1, keepdim=True)
        mask = mask.div(num_neigh)
        embed_matrix = self.features(torch.LongTensor(unique_nodes_list))
        return mask.mm(embed_matrix)


class Encoder(nn.Module):
    """GraphSAGE's 'convolutional' layer: (embed_dim, n) = relu(W . aggregated^T)."""

    def __init__(self, features, feature_dim: int, embed_dim: int, adj_lists, aggregator, num_sample: int = 10,
                 base_model=None, gcn: bool = False, cuda: bool = False, feature_transform: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.features = features
        self.feat_dim = feature_dim
        self.adj_lists = adj_lists
        self.aggregator = aggregator
        self.num_sample = num_sample
        if base_model is not None:
            self.base_model = base_model
        self.gcn = gcn
        self.embed_dim = embed_dim
        self.cuda = cuda
        self.aggregator.cuda = cuda
        self.weight = nn.Parameter(torch.FloatTensor(embed_dim, self.feat_dim if self.gcn else 2 * self.feat_dim))
        init.xavier_uniform_(self.weight)

    def forward(self, nodes) -> torch.Tensor:
        neigh_feats = self.aggregator.forward(nodes, [self.adj_lists[int(node)] for node in nodes], self.num_sample)
        if not self.gcn:
            self_feats = self.features(torch.LongTensor(nodes))
            combined = torch.cat([self_feats, neigh_feats], dim=1)
        else:
            combined = neigh_feats
        return F.relu(self.weight.mm(combined.t()))


class SupervisedGraphSage(nn.Module):
    def __init__(self, num_classes: int, enc: Encoder) -> None:
        super().__init__()
        self.enc = enc
        self.xent = nn.CrossEntropyLoss()
        self.weight = nn.Parameter(torch.FloatTensor(num_classes, enc.embed_dim))
        init.xavier_uniform_(self.weight)

    def forward(self, nodes) -> torch.Tensor:
        embeds = self.enc(nodes)
        scores = self.weight.mm(embeds)
        return scores.t()

    def loss(self, nodes, labels: torch.Tensor) -> torch.Tensor:
        scores = self.forward(nodes)
        return self.xent(scores, labels.squeeze())


def load_cora(seed: int = 0):
    """``load_cora`` on the synthetic graph: (features (n, f) float64 0/1, labels (n, 1)
    int64, undirected adjacency lists)."""
    raw_features, raw_labels, edges = synthetic_cora(seed, n=NUM_NODES, words=NUM_FEATS, topic_share=TOPIC_SHARE)
    feat_data = raw_features.astype(np.float64)
    labels = raw_labels.astype(np.int64).reshape(-1, 1)
    adj_lists = defaultdict(set)
    for paper1, paper2 in edges.tolist():
        adj_lists[paper1].add(paper2)
        adj_lists[paper2].add(paper1)
    # every Cora paper has a citation; the block model leaves ~2% of nodes without one (an
    # empty neighbour set makes MeanAggregator divide by zero): cite a node of its own class
    rng = np.random.default_rng(seed + 7)
    for paper1 in range(len(raw_labels)):
        if not adj_lists[paper1]:
            paper2 = int(rng.choice(np.flatnonzero((raw_labels == raw_labels[paper1]) & (np.arange(len(raw_labels)) != paper1))))
            adj_lists[paper1].add(paper2)
            adj_lists[paper2].add(paper1)
    return feat_data, labels, adj_lists


# --------------------------------------------------------------------------- run_cora


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(1 + seed)
    random.seed(1 + seed)
    torch.manual_seed(1 + seed)
    num_nodes = NUM_NODES
    feat_data, labels, adj_lists = load_cora(seed)
    features = nn.Embedding(num_nodes, NUM_FEATS)
    features.weight = nn.Parameter(torch.FloatTensor(feat_data), requires_grad=False)

    agg1 = MeanAggregator(features, cuda=True)
    enc1 = Encoder(features, NUM_FEATS, EMBED_DIM, adj_lists, agg1, gcn=True, cuda=False)
    agg2 = MeanAggregator(lambda nodes: enc1(nodes).t(), cuda=False)
    enc2 = Encoder(lambda nodes: enc1(nodes).t(), enc1.embed_dim, EMBED_DIM, adj_lists, agg2, base_model=enc1,
                   gcn=True, cuda=False)  # fmt: skip
    enc1.num_samples = 5  # as published: not the attribute the encoder reads (num_sample stays 10)
    enc2.num_samples = 5

    graphsage = SupervisedGraphSage(NUM_CLASSES, enc2)
    rand_indices = np.random.permutation(num_nodes)
    n_test, n_val = round(num_nodes * 1000 / 2708), round(num_nodes * 500 / 2708)
    test = rand_indices[:n_test]
    val = rand_indices[n_test : n_test + n_val]
    train = list(rand_indices[n_test if variant == "val_in_train" else n_test + n_val :])
    train_labels = labels[np.array(train)]  # used by the labels_not_shuffled variant only

    optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, graphsage.parameters()), lr=LR)

    def loss_fn(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return graphsage.xent(scores, target.squeeze())  # SupervisedGraphSage.loss, for the probes

    splits = (torch.LongTensor(np.array(train)), torch.LongTensor(labels[np.array(train)][:, 0]),
              torch.LongTensor(val), torch.LongTensor(labels[val][:, 0]))  # fmt: skip
    mon = None
    first_batch = None
    losses: list[float] = []
    for batch in range(BATCHES):
        batch_nodes = train[:BATCH_SIZE]
        if variant == "labels_not_shuffled":
            batch_labels = torch.LongTensor(train_labels[:BATCH_SIZE])  # the bug: not reordered with train
        else:
            batch_labels = torch.LongTensor(labels[np.array(batch_nodes)])
        random.shuffle(train)
        if first_batch is None:  # the loop's first batch, for nndx
            first_batch = (torch.LongTensor(np.array(batch_nodes)), batch_labels)
            nx.preflight(graphsage, first_batch, loss_fn, optimizer=optimizer, data=splits)
            mon = nx.monitor(graphsage, optimizer, every=10)
        optimizer.zero_grad()
        loss = graphsage.loss(batch_nodes, batch_labels)
        loss.backward()
        optimizer.step()
        mon.log(loss)
        losses.append(loss.item())  # print(batch, loss.data[0])

    nx.finish(mon, graphsage, first_batch, loss_fn, optimizer=optimizer, data=splits)
    val_output = graphsage.forward(val)
    val_f1 = f1_score(labels[val], val_output.data.numpy().argmax(axis=1), average="micro")
    test_output = graphsage.forward(test)  # measure only
    test_f1 = f1_score(labels[test], test_output.data.numpy().argmax(axis=1), average="micro")
    return {
        "val_f1": val_f1,
        "test_f1": test_f1,
        "val_f1_minus_test_f1": val_f1 - test_f1,
        "last_losses": sum(losses[-10:]) / 10,
    }
