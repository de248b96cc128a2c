"""Port of weihua916/powerful-gnns: the Graph Isomorphism Network (GIN) for graph classification.

Source: github.com/weihua916/powerful-gnns, ``main.py``, ``models/graphcnn.py``,
``models/mlp.py`` and ``util.py`` at commit 9a2ce8ac3e99278307093a464a95caf0fb04b602 (MIT,
Copyright (c) 2021 Weihua Hu). Written anew from the facts of those files; no code copied.
The TU benchmark files (``dataset/<NAME>/<NAME>.txt``: graphs grouped by label, as in the
repository's zip) are replaced by graphs generated at run time with a fixed seed (the data,
not the program), written in the same order: 150 graphs of each of three random-graph
families with the same size range (12 to 24 nodes) and about the same mean degree (~4):
Erdős–Rényi, preferential attachment (each new node linked to 2 earlier nodes drawn by
degree), and a ring lattice (each node linked to its 2 nearest on either side) with 15% of
its edges rewired (Watts–Strogatz). No node labels: ``--degree_as_tag`` (a node's tag is
its degree), as the README sets for the unlabelled social datasets.

Kept: ``S2VGraph`` (label, neighbour lists, ``max_neighbor``, ``edge_mat`` with both
directions, one-hot ``node_features`` over the tag set); ``load_data``'s label and tag
mapping; ``separate_data``'s ``StratifiedKFold(n_splits=10, shuffle=True,
random_state=seed)`` fold ``fold_idx``; ``MLP`` (``num_layers`` linears, BatchNorm1d +
ReLU between them, linear output); ``GraphCNN`` with the defaults ``learn_eps`` False,
sum neighbour pooling and sum graph pooling: per batch the block-diagonal sparse
adjacency with self-loops and the sparse graph-pooling matrix, ``num_layers - 1``
layers of ``spmm(Adj, h)`` -> MLP -> BatchNorm1d -> ReLU, every layer's representation
(the input's included) sum-pooled per graph through its own ``linears_prediction`` and
``F.dropout(final_dropout, training=self.training)``, the scores summed; ``eps``
parameter present (unused without ``learn_eps``); ``main.py``: ``nn.CrossEntropyLoss``,
``Adam(lr=0.01)``, ``StepLR(step_size=50, gamma=0.5)`` stepped at the start of each
epoch (before training, as written), ``train`` (``model.train()``, ``iters_per_epoch``
batches of ``batch_size`` graphs drawn by ``np.random.permutation``, ``zero_grad``,
``backward``, ``step``, the mean loss), ``test`` (``pass_data_iteratively`` in
minibatches of 64 under ``model.eval()``, train and test accuracy);
``torch.manual_seed(0)``, ``np.random.seed(0)``; the defaults ``num_layers`` 5,
``num_mlp_layers`` 2, ``batch_size`` 32, ``final_dropout`` 0.5.
Shrunk: 450 generated graphs (405 train / 45 test in fold 0) instead of a TU dataset;
``hidden_dim`` 32 instead of 64; 20 epochs of 10 iterations with ``step_size`` 3 instead of
350 epochs of 50 with 50 (about as many halvings); no output file, no tqdm bar.
Measure only (not in the program): the test graphs' cross-entropy, from the outputs
``test`` already computes (the program reports their accuracy).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch,
``((batch_graph,), labels)`` (the model takes a list of ``S2VGraph``), with
``criterion``; ``nndx.Monitor(model, optimizer, loss_fn=criterion)`` around the epochs,
the criterion called as ``mon.loss_fn``, each batch's loss logged, and after each epoch's
``test`` the test graphs' loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.model_selection import StratifiedKFold
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gin"
SOURCE = Source("weihua916/powerful-gnns", "models/graphcnn.py", "9a2ce8ac3e99278307093a464a95caf0fb04b602", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (defaults, --degree_as_tag; shrunk: hidden 32, 20x10 steps)"),
        Variant(
            "dropout_always_on",
            "F.dropout(score, self.final_dropout) without training=self.training in GraphCNN.forward: the "
            "functional dropout defaults to training=True, so test() scores with half of every layer's "
            "prediction dropped although it calls model.eval()",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/pytorch/issues/26338",
             "https://github.com/pytorch/pytorch/issues/11999",
             "https://github.com/BogiHsu/Tacotron2-PyTorch/issues/8"),
            Measure("test_loss", "final test cross-entropy (of the outputs test() scores) at least 1.5x the "
                    "healthy run's (0.205 against 0.056 on seed 0; accuracy on 45 test graphs barely moves: 0.956 both on seed 0)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "unshuffled_batches",
            "train() takes its batches in order through train_graphs (a loader without shuffle) instead of "
            "np.random.permutation: the graphs come grouped by label, as the TU files are, so nearly every "
            "batch holds one class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/dmlc/dgl/issues/3548",
             "https://github.com/muhanzhang/pytorch_DGCNN/issues/41",
             "https://github.com/zalandoresearch/fashion-mnist/pull/5"),
            Measure("test_accuracy", "final test accuracy at least 0.05 below the healthy run's (0.711 against "
                    "0.956 on seed 0)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"batch_size": 32, "iters_per_epoch": 10, "epochs": 20, "lr": 0.01, "fold_idx": 0, "num_layers": 5,
        "num_mlp_layers": 2, "hidden_dim": 32, "final_dropout": 0.5, "step_size": 3}  # fmt: skip
GRAPHS_PER_CLASS, MIN_NODES, MAX_NODES = 150, 12, 24


# --------------------------------------------------------------------------- util.py (the data, synthetic)


class S2VGraph:
    def __init__(self, n: int, edges: list[tuple[int, int]], label: int) -> None:
        self.label = label
        self.n = n
        self.edges = edges
        self.neighbors: list[list[int]] = [[] for _ in range(n)]
        self.node_tags: list[int] = []
        self.node_features = torch.zeros(0)
        self.edge_mat = torch.zeros(2, 0, dtype=torch.long)
        self.max_neighbor = 0


def generate_graph(kind: int, rng: np.random.Generator) -> tuple[int, list[tuple[int, int]]]:
    n = int(rng.integers(MIN_NODES, MAX_NODES + 1))
    edges: set[tuple[int, int]] = set()
    if kind == 0:  # Erdős–Rényi, mean degree ~4
        p = 4.0 / (n - 1)
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < p:
                    edges.add((i, j))
    elif kind == 1:  # preferential attachment, 2 links per new node
        degree = np.zeros(n)
        edges.update({(0, 1), (0, 2), (1, 2)})
        degree[:3] = 2
        for v in range(3, n):
            targets = rng.choice(v, size=2, replace=False, p=degree[:v] / degree[:v].sum())
            for t in targets:
                edges.add((int(t), v))
                degree[t] += 1
            degree[v] += 2
    else:  # Watts–Strogatz: ring lattice k=4, 15% rewired
        for i in range(n):
            for d in (1, 2):
                j = (i + d) % n
                if rng.random() < 0.15:
                    j = int(rng.integers(n))
                    if j == i:
                        continue
                edges.add((min(i, j), max(i, j)))
    return n, sorted(edges)


def load_data(seed: int = 0) -> tuple[list[S2VGraph], int]:
    """The dataset file's graphs, grouped by label as the TU files are, with --degree_as_tag."""
    rng = np.random.default_rng(1000 + seed)
    g_list = []
    label_dict: dict[int, int] = {}
    for raw_label in (0, 1, 2):
        for _ in range(GRAPHS_PER_CLASS):
            n, edges = generate_graph(raw_label, rng)
            label_dict.setdefault(raw_label, len(label_dict))
            g_list.append(S2VGraph(n, edges, raw_label))
    for g in g_list:
        for i, j in g.edges:
            g.neighbors[i].append(j)
            g.neighbors[j].append(i)
        g.max_neighbor = max(len(nb) for nb in g.neighbors)
        g.label = label_dict[g.label]
        both = [[i, j] for i, j in g.edges] + [[j, i] for i, j in g.edges]
        g.edge_mat = torch.tensor(both, dtype=torch.long).t() if both else torch.zeros(2, 0, dtype=torch.long)
        g.node_tags = [len(nb) for nb in g.neighbors]  # degree_as_tag
    tagset = sorted(set().union(*[set(g.node_tags) for g in g_list]))
    tag2index = {tag: i for i, tag in enumerate(tagset)}
    for g in g_list:
        g.node_features = torch.zeros(g.n, len(tagset))
        g.node_features[range(g.n), [tag2index[t] for t in g.node_tags]] = 1
    return g_list, len(label_dict)


def separate_data(graph_list: list[S2VGraph], seed: int, fold_idx: int) -> tuple[list[S2VGraph], list[S2VGraph]]:
    skf = StratifiedKFold(n_splits=10, shuffle=True, random_state=seed)
    labels = [g.label for g in graph_list]
    train_idx, test_idx = list(skf.split(np.zeros(len(labels)), labels))[fold_idx]
    return [graph_list[i] for i in train_idx], [graph_list[i] for i in test_idx]


# --------------------------------------------------------------------------- models/mlp.py, models/graphcnn.py


class MLP(nn.Module):
    def __init__(self, num_layers: int, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.linear_or_not = num_layers == 1
        self.num_layers = num_layers
        if num_layers < 1:
            raise ValueError("number of layers should be positive!")
        if self.linear_or_not:
            self.linear = nn.Linear(input_dim, output_dim)
        else:
            self.linears = nn.ModuleList([nn.Linear(input_dim, hidden_dim)]
                                         + [nn.Linear(hidden_dim, hidden_dim) for _ in range(num_layers - 2)]
                                         + [nn.Linear(hidden_dim, output_dim)])  # fmt: skip
            self.batch_norms = nn.ModuleList([nn.BatchNorm1d(hidden_dim) for _ in range(num_layers - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_or_not:
            return self.linear(x)
        h = x
        for layer in range(self.num_layers - 1):
            h = F.relu(self.batch_norms[layer](self.linears[layer](h)))
        return self.linears[self.num_layers - 1](h)


class GraphCNN(nn.Module):
    def __init__(self, num_layers: int, num_mlp_layers: int, input_dim: int, hidden_dim: int, output_dim: int,
                 final_dropout: float, learn_eps: bool, graph_pooling_type: str, neighbor_pooling_type: str,
                 dropout_respects_mode: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.final_dropout = final_dropout
        self.num_layers = num_layers
        self.graph_pooling_type = graph_pooling_type
        self.neighbor_pooling_type = neighbor_pooling_type
        self.learn_eps = learn_eps
        self.dropout_respects_mode = dropout_respects_mode
        self.eps = nn.Parameter(torch.zeros(self.num_layers - 1))
        self.mlps = nn.ModuleList()
        self.batch_norms = nn.ModuleList()
        for layer in range(self.num_layers - 1):
            self.mlps.append(MLP(num_mlp_layers, input_dim if layer == 0 else hidden_dim, hidden_dim, hidden_dim))
            self.batch_norms.append(nn.BatchNorm1d(hidden_dim))
        self.linears_prediction = nn.ModuleList(
            [nn.Linear(input_dim if layer == 0 else hidden_dim, output_dim) for layer in range(num_layers)])

    def _preprocess_neighbors_sumavepool(self, batch_graph: list[S2VGraph]) -> torch.Tensor:
        edge_mat_list, start_idx = [], [0]
        for i, graph in enumerate(batch_graph):
            start_idx.append(start_idx[i] + graph.n)
            edge_mat_list.append(graph.edge_mat + start_idx[i])
        adj_idx = torch.cat(edge_mat_list, 1)
        adj_elem = torch.ones(adj_idx.shape[1])
        if not self.learn_eps:
            num_node = start_idx[-1]
            self_loop_edge = torch.tensor([list(range(num_node)), list(range(num_node))], dtype=torch.long)
            adj_idx = torch.cat([adj_idx, self_loop_edge], 1)
            adj_elem = torch.cat([adj_elem, torch.ones(num_node)], 0)
        return torch.sparse_coo_tensor(adj_idx, adj_elem, (start_idx[-1], start_idx[-1]))

    def _preprocess_graphpool(self, batch_graph: list[S2VGraph]) -> torch.Tensor:
        start_idx = [0]
        for i, graph in enumerate(batch_graph):
            start_idx.append(start_idx[i] + graph.n)
        idx, elem = [], []
        for i, graph in enumerate(batch_graph):
            elem.extend([1.0 / graph.n] * graph.n if self.graph_pooling_type == "average" else [1.0] * graph.n)
            idx.extend([[i, j] for j in range(start_idx[i], start_idx[i + 1])])
        idx_t = torch.tensor(idx, dtype=torch.long).t()
        return torch.sparse_coo_tensor(idx_t, torch.tensor(elem), (len(batch_graph), start_idx[-1]))

    def next_layer(self, h: torch.Tensor, layer: int, adj_block: torch.Tensor) -> torch.Tensor:
        pooled = torch.spmm(adj_block, h)
        if self.neighbor_pooling_type == "average":
            pooled = pooled / torch.spmm(adj_block, torch.ones((adj_block.shape[0], 1)))
        pooled_rep = self.mlps[layer](pooled)
        h = self.batch_norms[layer](pooled_rep)
        return F.relu(h)

    def forward(self, batch_graph: list[S2VGraph]) -> torch.Tensor:
        x_concat = torch.cat([graph.node_features for graph in batch_graph], 0)
        graph_pool = self._preprocess_graphpool(batch_graph)
        adj_block = self._preprocess_neighbors_sumavepool(batch_graph)
        hidden_rep = [x_concat]
        h = x_concat
        for layer in range(self.num_layers - 1):
            h = self.next_layer(h, layer, adj_block=adj_block)
            hidden_rep.append(h)
        score_over_layer = 0
        for layer, h in enumerate(hidden_rep):
            pooled_h = torch.spmm(graph_pool, h)
            score = self.linears_prediction[layer](pooled_h)
            if self.dropout_respects_mode:
                score_over_layer += F.dropout(score, self.final_dropout, training=self.training)
            else:  # the bug: F.dropout's training defaults to True
                score_over_layer += F.dropout(score, self.final_dropout)
        return score_over_layer


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(0 + seed)
    np.random.seed(0 + seed)
    criterion = nn.CrossEntropyLoss()

    graphs, num_classes = load_data(seed)
    train_graphs, test_graphs = separate_data(graphs, seed, args["fold_idx"])
    model = GraphCNN(args["num_layers"], args["num_mlp_layers"], train_graphs[0].node_features.shape[1],
                     args["hidden_dim"], num_classes, args["final_dropout"], False, "sum", "sum",
                     dropout_respects_mode=variant != "dropout_always_on")  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args["step_size"], gamma=0.5)

    cursor = [0]

    def next_batch_indices() -> np.ndarray:
        if variant == "unshuffled_batches":  # in file order, wrapping around
            idx = np.arange(cursor[0], cursor[0] + args["batch_size"]) % len(train_graphs)
            cursor[0] = (cursor[0] + args["batch_size"]) % len(train_graphs)
            return idx
        return np.random.permutation(len(train_graphs))[: args["batch_size"]]

    first = [train_graphs[i] for i in range(args["batch_size"])] if variant == "unshuffled_batches" else [
        train_graphs[i] for i in np.random.RandomState(seed).permutation(len(train_graphs))[: args["batch_size"]]]
    probe_batch = ((first,), torch.tensor([g.label for g in first], dtype=torch.long))
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    def train_epoch(epoch: int) -> float:
        model.train()
        loss_accum = 0.0
        for _pos in range(args["iters_per_epoch"]):
            selected_idx = next_batch_indices()
            batch_graph = [train_graphs[idx] for idx in selected_idx]
            output = model(batch_graph)
            labels = torch.tensor([graph.label for graph in batch_graph], dtype=torch.long)
            loss = mon.loss_fn(output, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
            loss_accum += float(loss.detach().cpu().numpy())
        return loss_accum / args["iters_per_epoch"]

    def pass_data_iteratively(graphs_: list[S2VGraph], minibatch_size: int = 64) -> torch.Tensor:
        model.eval()
        output = []
        idx = np.arange(len(graphs_))
        for i in range(0, len(graphs_), minibatch_size):
            sampled_idx = idx[i : i + minibatch_size]
            if len(sampled_idx) == 0:
                continue
            output.append(model([graphs_[j] for j in sampled_idx]).detach())
        return torch.cat(output, 0)

    def test() -> tuple[float, float, float]:
        model.eval()
        output = pass_data_iteratively(train_graphs)
        labels = torch.tensor([g.label for g in train_graphs], dtype=torch.long)
        acc_train = output.max(1, keepdim=True)[1].eq(labels.view(-1, 1)).sum().item() / float(len(train_graphs))
        output = pass_data_iteratively(test_graphs)
        labels = torch.tensor([g.label for g in test_graphs], dtype=torch.long)
        acc_test = output.max(1, keepdim=True)[1].eq(labels.view(-1, 1)).sum().item() / float(len(test_graphs))
        return acc_train, acc_test, criterion(output, labels).item()

    avg_loss = acc_train = acc_test = test_loss = float("nan")
    for epoch in range(1, args["epochs"] + 1):
        scheduler.step()  # at the start of the epoch, as main.py does
        avg_loss = train_epoch(epoch)
        acc_train, acc_test, test_loss = test()
        mon.log(test_loss, split="val", accuracy=acc_test)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    return {"train_loss": avg_loss, "train_accuracy": acc_train, "test_accuracy": acc_test, "test_loss": test_loss}
