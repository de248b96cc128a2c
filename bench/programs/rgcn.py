"""Port of the PyTorch Geometric relational GCN example (Schlichtkrull et al.'s R-GCN entity
classification on AIFB), with ``FastRGCNConv`` and ``k_hop_subgraph`` written out in torch.

Source: github.com/pyg-team/pytorch_geometric, ``examples/rgcn.py``,
``torch_geometric/nn/conv/rgcn_conv.py`` (``RGCNConv.__init__``/``reset_parameters``,
``FastRGCNConv``), ``torch_geometric/utils/_subgraph.py`` (``k_hop_subgraph``) and
``torch_geometric/datasets/entities.py`` (inverse relations) at commit
5c6461b2305ad068a6d61165b3c55852a11aaa41 (MIT, Copyright (c) 2023 PyG Team). Written anew
from the facts of those files; no code copied.

Kept: the example's AIFB path: ``Conv = FastRGCNConv``; the graph cut to the nodes at most
2 hops from any training or test node (``k_hop_subgraph(node_idx, 2, edge_index,
relabel_nodes=True)``, flow source-to-target), ``edge_type`` masked with the same
``edge_mask``, ``train_idx``/``test_idx`` mapped to the relabelled nodes; ``Net``:
``conv1 = Conv(num_nodes, 16, num_relations, num_bases)`` on no input features (``x=None``:
the node indices, so the layer's weight rows act as per-relation node embeddings and
``root[x]`` is the self-loop term), ``F.relu``, ``conv2 = Conv(16, num_classes,
num_relations, num_bases)``, ``log_softmax``; the convolution: basis decomposition
``weight = comp @ bases`` (``bases`` (num_bases, in, out), ``comp`` (num_relations,
num_bases)), a message ``W_r x_j`` per edge (an embedding row ``W_r[j]`` when the input is
indices), mean aggregation normalised per relation by each target's in-degree along that
relation (1/c_{i,r}, the ``one_hot``/``scatter`` count clamped at 1), plus the root weight
and a bias; ``glorot`` on bases, ``comp`` and ``root``, zero bias; ``Adam(lr=0.01,
weight_decay=0.0005)`` (on every parameter, as the example writes it); per epoch
``model.train()``, ``zero_grad``, full-graph forward, ``F.nll_loss(out[train_idx],
train_y)``, ``backward``, ``step``, then ``test()`` (eval mode, ``no_grad``, argmax,
training and test accuracy); 50 epochs. The dataset's reverse relations (``Entities`` adds
relation ``2r+1`` for every edge of relation ``2r``, issue pyg-team/pytorch_geometric#2256)
and AIFB's removal of the relations that define the label (``affiliation``/``employs``).
Shrunk: AIFB (8,285 entities, 90 relations with inverses, 4 research-group classes, 140 /
36 labelled persons; downloaded) is replaced by a graph made at run time with a fixed
seed: 160 persons in 4 groups (the labels), 240 publications, 24 projects, 12 topics and 4
group entities; relations author (person -> publication, two or three authors a paper,
each from the paper's group with probability 0.65), member (person -> project, same group
with probability 0.6), project_group (project -> group entity), topic (publication ->
topic, one of its group's 3 topics with probability 0.6) and affiliation (person -> group
entity, the label; removed from the graph as AIFB's is), each with its inverse: 8
relations; ``num_bases`` 4 instead of 30 (a third of the relations, as 30 of AIFB's 90);
110 / 50 labelled persons for training / test. 50 epochs kept.
Measure only (not in the program): nothing beyond the example's own printed numbers
(final training and test accuracy, final loss).

nndx, as the author would add it (the gcn port's layout): a preflight ``nndx.probe`` on the
full graph ``((edge_index, edge_type), train_y)`` with the loop's loss (``nll_loss`` on the
training nodes) as the loss function and the optimizer; ``nndx.Monitor(model, optimizer,
loss_fn=F.nll_loss)`` around the epochs, the loss taken through ``mon.loss_fn``, each
epoch's loss logged with the training accuracy the loop prints (the example has no
validation split and computes no test loss, so nothing is logged as ``split="val"``);
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rgcn"
SOURCE = Source("pyg-team/pytorch_geometric", "examples/rgcn.py", "5c6461b2305ad068a6d61165b3c55852a11aaa41", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (AIFB path: FastRGCNConv, label relation removed)"),
        Variant(
            "label_relation_kept",
            "the graph keeps the affiliation relation (person -> group entity) that defines the label: every "
            "labelled person, test persons included, is linked to its answer, so test accuracy is inflated "
            "by a shortcut the real task does not have",
            (C.DATA_LEAKAGE,),
            ("https://github.com/dmlc/dgl/pull/885",
             "https://github.com/tensorflow/neural-structured-learning/issues/81",
             "https://github.com/THUDM/CogDL/issues/18",
             "https://github.com/cynricfu/MAGNN/issues/7"),
            Measure("test_accuracy", "test accuracy at least 0.05 above the healthy run's (the test persons' "
                    "labels are edges of the graph: 1.00 against 0.80 on seed 0)", lambda healthy, buggy: not buggy < healthy + 0.05),
        ),
        Variant(
            "train_idx_sorted_not_y",
            "train_idx is sorted (torch.unique) when the subgraph is cut, train_y is left in its original "
            "order: the loss pairs each training node with another node's label",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/awslabs/graphstorm/issues/1138",
             "https://github.com/uzh-rpg/rpg_event_representation_learning/issues/2",
             "https://github.com/dmlc/dgl/pull/429"),
            Measure("test_accuracy", "test accuracy at least 0.15 below the healthy run's (0.24, chance, against "
                    "0.80 on seed 0; training accuracy 1.00 and loss near 0 in both: the featureless first layer "
                    "memorises any labelling)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

GROUPS, PERSONS, PUBLICATIONS, PROJECTS, TOPICS_PER_GROUP = 4, 160, 240, 24, 3
N_TRAIN, N_TEST = 110, 50
HIDDEN, NUM_BASES, EPOCHS, LR, WEIGHT_DECAY = 16, 4, 50, 0.01, 0.0005
RELATIONS = ("author", "member", "project_group", "topic", "affiliation")


# --------------------------------------------------------------------------- the data (Entities, synthetic)


def synthetic_entities(seed: int, keep_label_relation: bool = False):
    """(edge_index (2, E), edge_type (E,), num_nodes, num_relations, train_idx, train_y,
    test_idx, test_y): a small AIFB-like knowledge graph, each relation ``r`` stored as
    ``2r`` (subject -> object) and ``2r + 1`` (the inverse), as ``Entities`` does."""
    rng = np.random.default_rng(seed + 101)
    person0 = 0
    pub0 = person0 + PERSONS
    proj0 = pub0 + PUBLICATIONS
    topic0 = proj0 + PROJECTS
    group0 = topic0 + GROUPS * TOPICS_PER_GROUP
    num_nodes = group0 + GROUPS
    person_group = rng.integers(GROUPS, size=PERSONS)
    by_group = [np.flatnonzero(person_group == g) for g in range(GROUPS)]
    triples = []  # (subject, relation, object)
    for p in range(PUBLICATIONS):
        g = int(rng.integers(GROUPS))
        authors = set()
        for _ in range(int(rng.integers(2, 4))):
            authors.add(int(rng.choice(by_group[g])) if rng.random() < 0.65 else int(rng.integers(PERSONS)))
        triples += [(person0 + a, 0, pub0 + p) for a in authors]
        t = g * TOPICS_PER_GROUP + int(rng.integers(TOPICS_PER_GROUP)) if rng.random() < 0.6 else \
            int(rng.integers(GROUPS * TOPICS_PER_GROUP))  # fmt: skip
        triples.append((pub0 + p, 3, topic0 + t))
    project_group = rng.integers(GROUPS, size=PROJECTS)
    for j in range(PROJECTS):
        triples.append((proj0 + j, 2, group0 + int(project_group[j])))
    for person in range(PERSONS):
        for _ in range(int(rng.integers(1, 3))):
            same = np.flatnonzero(project_group == person_group[person])
            j = int(rng.choice(same)) if rng.random() < 0.6 and len(same) else int(rng.integers(PROJECTS))
            triples.append((person0 + person, 1, proj0 + j))
        triples.append((person0 + person, 4, group0 + int(person_group[person])))
    triples = sorted(set(triples))
    if not keep_label_relation:  # AIFB: the relations that define the label are removed
        triples = [t for t in triples if RELATIONS[t[1]] != "affiliation"]
    relation_ids = sorted({r for _, r, _ in triples})
    remap = {r: i for i, r in enumerate(relation_ids)}
    src = [s for s, _, _ in triples] + [o for _, _, o in triples]
    dst = [o for _, _, o in triples] + [s for s, _, _ in triples]
    rel = [2 * remap[r] for _, r, _ in triples] + [2 * remap[r] + 1 for _, r, _ in triples]
    edge_index = torch.tensor([src, dst], dtype=torch.long)
    edge_type = torch.tensor(rel, dtype=torch.long)
    labelled = rng.permutation(PERSONS)[: N_TRAIN + N_TEST]
    train_idx, test_idx = torch.from_numpy(labelled[:N_TRAIN]), torch.from_numpy(labelled[N_TRAIN:])
    train_y = torch.from_numpy(person_group[labelled[:N_TRAIN]]).long()
    test_y = torch.from_numpy(person_group[labelled[N_TRAIN:]]).long()
    return edge_index, edge_type, num_nodes, 2 * len(relation_ids), train_idx, train_y, test_idx, test_y


def k_hop_subgraph(node_idx: torch.Tensor, num_hops: int, edge_index: torch.Tensor, num_nodes: int):
    """The nodes at most ``num_hops`` hops upstream of ``node_idx`` (edges j -> i pull j in),
    relabelled 0..n-1 in node order; (subset, edge_index, mapping, edge_mask)."""
    row, col = edge_index  # source, target
    node_mask = torch.zeros(num_nodes, dtype=torch.bool)
    subsets = [node_idx]
    for _ in range(num_hops):
        node_mask.fill_(False)
        node_mask[subsets[-1]] = True
        subsets.append(row[node_mask[col]])
    subset, inv = torch.cat(subsets).unique(return_inverse=True)
    mapping = inv[: node_idx.numel()]
    node_mask.fill_(False)
    node_mask[subset] = True
    edge_mask = node_mask[row] & node_mask[col]
    relabel = torch.full((num_nodes,), -1, dtype=torch.long)
    relabel[subset] = torch.arange(subset.size(0))
    return subset, relabel[edge_index[:, edge_mask]], mapping, edge_mask


# --------------------------------------------------------------------------- the model (FastRGCNConv)


def glorot(tensor: torch.Tensor) -> None:
    stdv = math.sqrt(6.0 / (tensor.size(-2) + tensor.size(-1)))
    tensor.data.uniform_(-stdv, stdv)


class FastRGCNConv(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_relations, self.num_bases = num_relations, num_bases
        self.weight = torch.nn.Parameter(torch.empty(num_bases, in_channels, out_channels))
        self.comp = torch.nn.Parameter(torch.empty(num_relations, num_bases))
        self.root = torch.nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = torch.nn.Parameter(torch.empty(out_channels))
        glorot(self.weight)
        glorot(self.comp)
        glorot(self.root)
        torch.nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor | None, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        if x is None:
            x = torch.arange(self.in_channels)  # featureless: node indices
        src, dst = edge_index
        weight = (self.comp @ self.weight.view(self.num_bases, -1)).view(
            self.num_relations, self.in_channels, self.out_channels)  # fmt: skip
        if not torch.is_floating_point(x):  # W_r[j]: an embedding row per (relation, source)
            messages = weight.view(-1, self.out_channels)[edge_type * self.in_channels + x[src]]
        else:
            messages = torch.bmm(x[src].unsqueeze(-2), weight[edge_type]).squeeze(-2)
        # mean per relation: 1 / c_{i,r}, the in-degree of the target along the edge's relation
        n = x.size(0)
        counts = torch.zeros(n, self.num_relations).index_add_(
            0, dst, F.one_hot(edge_type, self.num_relations).to(messages.dtype))  # fmt: skip
        norm = 1.0 / counts[dst, edge_type].clamp(min=1.0)
        out = torch.zeros(n, self.out_channels).index_add_(0, dst, messages * norm.unsqueeze(-1))
        out = out + (self.root[x] if not torch.is_floating_point(x) else x @ self.root)
        return out + self.bias


class Net(torch.nn.Module):
    def __init__(self, num_nodes: int, num_classes: int, num_relations: int) -> None:
        super().__init__()
        self.conv1 = FastRGCNConv(num_nodes, HIDDEN, num_relations, num_bases=NUM_BASES)
        self.conv2 = FastRGCNConv(HIDDEN, num_classes, num_relations, num_bases=NUM_BASES)

    def forward(self, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(None, edge_index, edge_type))
        x = self.conv2(x, edge_index, edge_type)
        return F.log_softmax(x, dim=1)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    edge_index, edge_type, num_nodes, num_relations, train_idx, train_y, test_idx, test_y = synthetic_entities(
        seed, keep_label_relation=variant == "label_relation_kept")  # fmt: skip

    node_idx = torch.cat([train_idx, test_idx], dim=0)
    node_idx, edge_index, mapping, edge_mask = k_hop_subgraph(node_idx, 2, edge_index, num_nodes)
    num_nodes = node_idx.size(0)
    edge_type = edge_type[edge_mask]
    train_idx = mapping[: train_idx.size(0)]
    test_idx = mapping[train_idx.size(0) :]
    if variant == "train_idx_sorted_not_y":  # the bug: the indices reordered, their labels not
        train_idx = torch.unique(train_idx)

    model = Net(num_nodes, GROUPS, num_relations)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def loss_on_graph(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(out[train_idx], target)  # the loop's loss, for the probe

    full_graph = ((edge_index, edge_type), train_y)
    nx.preflight(model, full_graph, loss_on_graph, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.nll_loss)

    def train_step() -> torch.Tensor:
        model.train()
        optimizer.zero_grad()
        out = model(edge_index, edge_type)
        loss = mon.loss_fn(out[train_idx], train_y)
        loss.backward()
        optimizer.step()
        return loss

    @torch.no_grad()
    def test() -> tuple[float, float]:
        model.eval()
        pred = model(edge_index, edge_type).argmax(dim=-1)
        train_acc = float((pred[train_idx] == train_y).float().mean())
        test_acc = float((pred[test_idx] == test_y).float().mean())
        return train_acc, test_acc

    for _epoch in range(1, EPOCHS + 1):
        loss = train_step()
        train_acc, test_acc = test()
        mon.log(loss, accuracy=train_acc)

    nx.finish(mon, model, full_graph, loss_on_graph, optimizer=optimizer)
    return {"final_loss": loss.item(), "train_accuracy": train_acc, "test_accuracy": test_acc}
