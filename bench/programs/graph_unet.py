"""Port of PyTorch Geometric's Graph U-Net example (Gao & Ji, "Graph U-Nets"): node
classification on Cora with ``GraphUNet`` (GCN layers, TopKPooling, unpooling by index),
``GCNConv``, ``TopKPooling`` and the utilities they use written out in torch.

Source: github.com/pyg-team/pytorch_geometric, ``examples/graph_unet.py`` with
``torch_geometric/nn/models/graph_unet.py``, ``nn/pool/topk_pool.py``,
``nn/pool/select/topk.py``, ``nn/pool/connect/filter_edges.py``, ``nn/conv/gcn_conv.py``
(``gcn_norm``), ``nn/inits.py``, ``utils/dropout.py`` (``dropout_edge``) and
``utils/repeat.py`` at commit 5c6461b2305ad068a6d61165b3c55852a11aaa41 (MIT, Copyright (c)
2023 PyG Team). Written anew from the facts of those files, without PyG; no code copied.

Kept: ``Net``: ``GraphUNet(num_features, 32, num_classes, depth=3,
pool_ratios=[2000 / num_nodes, 0.5])`` (the ratios repeated to the depth: the last
one for the remaining pools); ``forward()`` with no arguments, reading the graph from the
enclosing scope as the example reads its global ``data``: ``dropout_edge(edge_index,
p=0.2, force_undirected=True, training=self.training)`` (a Bernoulli keep mask, edges with
row > col dropped, the kept ones mirrored), ``F.dropout(x, p=0.92,
training=self.training)``, the U-Net, ``log_softmax``. ``GraphUNet``: edge weights of one,
``down_convs[0]`` + ReLU, then per depth ``augment_adj`` (self-loops removed, self-loops
of weight one added, the sparse adjacency squared, ``A @ A``, self-loops removed again),
``TopKPooling`` and a GCN + ReLU, the outputs, graphs and ``perm`` kept for the way up;
up: ``up = zeros_like(res); up[perm] = x``, ``x = res + up`` (``sum_res=True``), a GCN,
ReLU on all but the last. ``GCNConv(improved=True)``: ``add_remaining_self_loops`` with
fill value 2, symmetric ``deg^-1/2`` normalisation over the target's weighted in-degree,
a bias-free glorot ``Linear``, messages ``w_ij x_j`` summed at the target, zero-initialised
bias. ``TopKPooling`` (``SelectTopK`` + ``FilterEdges``): a ``(1, in_channels)``
projection initialised uniform(+-1/sqrt(in_channels)), score ``tanh(x . p / ||p||)``, the
``ceil(ratio * N)`` best nodes in descending score order, ``x[perm] * score[perm]`` (the
gate), the edges between kept nodes relabelled with their weights. Training: ``Adam(lr=0.01,
weight_decay=0.001)``; ``train()`` (``model.train()``, ``zero_grad``, ``F.nll_loss`` over
the training mask, ``backward``, ``step``); ``test()`` (``model.eval()``, ``no_grad``,
accuracy on the train/val/test masks); 200 epochs; the test accuracy reported is the one
at the best validation accuracy so far, as the example prints it.
Shrunk: Cora (2,708 papers, 1,433 binary word features, 7 classes, 140 / 500 / 1,000
train/val/test nodes; downloaded) is replaced by a graph made at run time: 700 nodes in 7
classes of 100, 350 binary word features (each node about 12 words, 30% of them from
its class's 50 topic words, the rest from the whole vocabulary), about 2 undirected edges
drawn per node, 75% of them to its own class (Cora's edge homophily is 0.81); 20 training nodes per class (Planetoid's
public split keeps 20 per class too), 210 validation and 350 test nodes. The first pool
keeps the example's share of the nodes, 2000 / 2708 (517 of 700).
Healthy: test accuracy 0.90/0.86/0.91 on seeds 0-2 (best validation 0.88/0.90/0.90).
Measure only (not in the program): the L2 distance the three pools' projection vectors
moved from their initial values.

nndx, as the author would add it: the model takes no input (the example's ``model()``),
so the batch given to the probes is ``((), y[train_mask])`` with the loop's loss
(``nll_loss`` on the training nodes) and the optimizer; ``nndx.Monitor(model, optimizer,
loss_fn=F.nll_loss)`` around the epochs (the rgcn port's layout), the loss taken through
``mon.loss_fn``, each epoch's loss logged with the training accuracy ``test()`` computes
(the example computes no validation loss, so nothing is logged as ``split="val"``); then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "graph_unet"
SOURCE = Source("pyg-team/pytorch_geometric", "examples/graph_unet.py", "5c6461b2305ad068a6d61165b3c55852a11aaa41",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (shrunk: a 700-node Cora-like graph)"),
        Variant(
            "dropout_ignores_eval",
            "x = F.dropout(data.x, p=0.92) without training=self.training: F.dropout defaults to training=True, so "
            "test() under model.eval() still drops 92% of the word features (and scales the rest by 12.5)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/pytorch/issues/26338",
             "https://github.com/rixwew/pytorch-fm/issues/21",
             "https://github.com/pyg-team/pytorch_geometric/issues/7745"),
            Measure("test_accuracy", "test accuracy (at the best validation accuracy) at least 0.1 below the "
                    "healthy run's: 0.57/0.60/0.58 against 0.90/0.86/0.91 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "pool_gate_dropped",
            "TopKPooling returns x[perm] without the gate (x[perm] * score[perm]): the score only ranks the nodes, "
            "no gradient reaches the projection vector p, and the pools keep the nodes their random init picks",
            (C.DETACHED_GRAPH, C.FROZEN_PARAMETERS),
            ("https://github.com/HongyangGao/Graph-U-Nets/issues/4",
             "https://github.com/bknyaz/graph_nn/issues/2"),
            Measure("pool_weight_change", "the pools' projection vectors move less than a tenth of what they "
                    "move in the healthy run: 0 on seeds 0-2 (no gradient reaches them) against 1.83/2.08/1.86; "
                    "the test accuracy is unchanged (0.90/0.88/0.92), as the Graph-U-Nets report found",
                    lambda healthy, buggy: buggy < 0.1 * healthy),
        ),
    )
}

NUM_CLASSES, PER_CLASS, NUM_FEATURES, TOPIC_WORDS = 7, 100, 350, 50
TRAIN_PER_CLASS, NUM_VAL, NUM_TEST = 20, 210, 350
EPOCHS = 200


# --------------------------------------------------------------------------- the data (Cora's stand-in)


class Data:
    """What ``Planetoid(path, 'Cora')[0]`` holds: x, edge_index (both directions), y, masks."""

    def __init__(self, x: Tensor, edge_index: Tensor, y: Tensor, train_mask: Tensor, val_mask: Tensor,
                 test_mask: Tensor) -> None:  # fmt: skip
        self.x, self.edge_index, self.y = x, edge_index, y
        self.train_mask, self.val_mask, self.test_mask = train_mask, val_mask, test_mask

    @property
    def num_nodes(self) -> int:
        return self.x.size(0)

    def __call__(self, *keys: str):
        for key in keys:
            yield key, getattr(self, key)


def cora_like(seed: int) -> Data:
    rng = np.random.default_rng(seed)
    n = NUM_CLASSES * PER_CLASS
    y = np.repeat(np.arange(NUM_CLASSES), PER_CLASS)
    topics = [rng.choice(NUM_FEATURES, size=TOPIC_WORDS, replace=False) for _ in range(NUM_CLASSES)]
    x = np.zeros((n, NUM_FEATURES), dtype=np.float32)
    for i in range(n):
        count = 4 + rng.poisson(8)
        from_topic = rng.random(count) < 0.3
        words = np.where(from_topic, rng.choice(topics[y[i]], size=count), rng.integers(NUM_FEATURES, size=count))
        x[i, words] = 1.0
    edges = set()
    for i in range(n):
        for _ in range(2):
            if rng.random() < 0.75:
                j = int(rng.choice(np.flatnonzero(y == y[i])))
            else:
                j = int(rng.choice(np.flatnonzero(y != y[i])))
            if j != i:
                edges.add((min(i, j), max(i, j)))
    und = np.array(sorted(edges)).T
    edge_index = np.concatenate([und, und[::-1]], axis=1)
    order = np.lexsort((edge_index[1], edge_index[0]))
    edge_index = edge_index[:, order]
    perm = rng.permutation(n)
    train = np.concatenate([perm[y[perm] == c][:TRAIN_PER_CLASS] for c in range(NUM_CLASSES)])
    rest = np.setdiff1d(perm, train, assume_unique=True)
    rest = rest[rng.permutation(len(rest))]
    masks = []
    for idx in (train, rest[:NUM_VAL], rest[NUM_VAL : NUM_VAL + NUM_TEST]):
        mask = np.zeros(n, dtype=bool)
        mask[idx] = True
        masks.append(torch.from_numpy(mask))
    return Data(torch.from_numpy(x), torch.from_numpy(edge_index).long(), torch.from_numpy(y).long(), *masks)


# --------------------------------------------------------------------------- torch_geometric utils


def repeat(src, length: int) -> list:
    if isinstance(src, (int, float)):
        return [src] * length
    src = list(src)
    return src[:length] if len(src) >= length else src + [src[-1]] * (length - len(src))


def dropout_edge(edge_index: Tensor, p: float = 0.5, force_undirected: bool = False,
                 training: bool = True) -> tuple[Tensor, Tensor]:  # fmt: skip
    if not training or p == 0.0:
        return edge_index, edge_index.new_ones(edge_index.size(1), dtype=torch.bool)
    row, col = edge_index
    edge_mask = torch.rand(row.size(0)) >= p
    if force_undirected:
        edge_mask[row > col] = False
    edge_index = edge_index[:, edge_mask]
    if force_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        edge_mask = edge_mask.nonzero().repeat((2, 1)).squeeze()
    return edge_index, edge_mask


def remove_self_loops(edge_index: Tensor, edge_weight: Tensor) -> tuple[Tensor, Tensor]:
    mask = edge_index[0] != edge_index[1]
    return edge_index[:, mask], edge_weight[mask]


def add_self_loops(edge_index: Tensor, edge_weight: Tensor, num_nodes: int,
                   fill_value: float = 1.0) -> tuple[Tensor, Tensor]:  # fmt: skip
    loop = torch.arange(num_nodes)
    return (torch.cat([edge_index, torch.stack([loop, loop])], dim=1),
            torch.cat([edge_weight, edge_weight.new_full((num_nodes,), fill_value)]))  # fmt: skip


def add_remaining_self_loops(edge_index: Tensor, edge_weight: Tensor, fill_value: float,
                             num_nodes: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    mask = edge_index[0] != edge_index[1]
    loop_weight = edge_weight.new_full((num_nodes,), fill_value)
    inv = ~mask
    loop_weight[edge_index[0][inv]] = edge_weight[inv]  # an existing self-loop keeps its weight
    loop = torch.arange(num_nodes)
    return (torch.cat([edge_index[:, mask], torch.stack([loop, loop])], dim=1),
            torch.cat([edge_weight[mask], loop_weight]))  # fmt: skip


def gcn_norm(edge_index: Tensor, edge_weight: Tensor, num_nodes: int, improved: bool) -> tuple[Tensor, Tensor]:
    fill_value = 2.0 if improved else 1.0
    edge_index, edge_weight = add_remaining_self_loops(edge_index, edge_weight, fill_value, num_nodes)
    row, col = edge_index[0], edge_index[1]
    deg = edge_weight.new_zeros(num_nodes).index_add_(0, col, edge_weight)  # flow source_to_target
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float("inf"), 0)
    return edge_index, deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]


# --------------------------------------------------------------------------- torch_geometric.nn


def glorot(weight: Tensor) -> None:
    stdv = math.sqrt(6.0 / (weight.size(-2) + weight.size(-1)))
    weight.data.uniform_(-stdv, stdv)


class GCNConv(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, improved: bool = False) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.improved = in_channels, out_channels, improved
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)  # weight_initializer='glorot'
        self.bias = torch.nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot(self.lin.weight)
        self.bias.data.zero_()

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        if edge_weight is None:
            edge_weight = x.new_ones(edge_index.size(1))
        edge_index, edge_weight = gcn_norm(edge_index, edge_weight, x.size(0), self.improved)
        x = self.lin(x)
        row, col = edge_index[0], edge_index[1]
        out = x.new_zeros(x.size(0), self.out_channels).index_add_(0, col, edge_weight.view(-1, 1) * x[row])
        return out + self.bias


class SelectTopK(torch.nn.Module):
    def __init__(self, in_channels: int, ratio: float) -> None:
        super().__init__()
        self.in_channels, self.ratio = in_channels, ratio
        self.weight = torch.nn.Parameter(torch.empty(1, in_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_channels)
        self.weight.data.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        score = (x * self.weight).sum(dim=-1)
        score = torch.tanh(score / self.weight.norm(p=2, dim=-1))
        k = math.ceil(float(self.ratio) * x.size(0)) if self.ratio < 1 else int(self.ratio)
        node_index = torch.sort(score.view(-1), descending=True)[1][:k]  # one graph: the batch is all zeros
        return node_index, score[node_index]


def filter_adj(edge_index: Tensor, edge_attr: Tensor, node_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    mask = node_index.new_full((num_nodes,), -1)
    mask[node_index] = torch.arange(node_index.size(0))
    row, col = mask[edge_index[0]], mask[edge_index[1]]
    keep = (row >= 0) & (col >= 0)
    return torch.stack([row[keep], col[keep]], dim=0), edge_attr[keep]


class TopKPooling(torch.nn.Module):
    def __init__(self, in_channels: int, ratio: float = 0.5, gate: bool = True) -> None:
        super().__init__()
        self.in_channels, self.ratio, self.gate = in_channels, ratio, gate
        self.select = SelectTopK(in_channels, ratio)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor):
        perm, score = self.select(x)
        x = x[perm] * score.view(-1, 1) if self.gate else x[perm]
        edge_index, edge_attr = filter_adj(edge_index, edge_attr, perm, num_nodes=batch.size(0))
        return x, edge_index, edge_attr, batch[perm], perm, score


class GraphUNet(torch.nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, depth: int,
                 pool_ratios=0.5, sum_res: bool = True, gate: bool = True) -> None:  # fmt: skip
        super().__init__()
        assert depth >= 1
        self.depth = depth
        self.pool_ratios = repeat(pool_ratios, depth)
        self.act = F.relu
        self.sum_res = sum_res
        channels = hidden_channels
        self.down_convs = torch.nn.ModuleList([GCNConv(in_channels, channels, improved=True)])
        self.pools = torch.nn.ModuleList()
        for i in range(depth):
            self.pools.append(TopKPooling(channels, self.pool_ratios[i], gate=gate))
            self.down_convs.append(GCNConv(channels, channels, improved=True))
        in_channels = channels if sum_res else 2 * channels
        self.up_convs = torch.nn.ModuleList()
        for _ in range(depth - 1):
            self.up_convs.append(GCNConv(in_channels, channels, improved=True))
        self.up_convs.append(GCNConv(in_channels, out_channels, improved=True))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for conv in self.down_convs:
            conv.reset_parameters()
        for pool in self.pools:
            pool.select.reset_parameters()
        for conv in self.up_convs:
            conv.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        batch = edge_index.new_zeros(x.size(0))
        edge_weight = x.new_ones(edge_index.size(1))
        x = self.act(self.down_convs[0](x, edge_index, edge_weight))
        xs, edge_indices, edge_weights, perms = [x], [edge_index], [edge_weight], []
        for i in range(1, self.depth + 1):
            edge_index, edge_weight = self.augment_adj(edge_index, edge_weight, x.size(0))
            x, edge_index, edge_weight, batch, perm, _ = self.pools[i - 1](x, edge_index, edge_weight, batch)
            x = self.act(self.down_convs[i](x, edge_index, edge_weight))
            if i < self.depth:
                xs += [x]
                edge_indices += [edge_index]
                edge_weights += [edge_weight]
            perms += [perm]
        for i in range(self.depth):
            j = self.depth - 1 - i
            res, edge_index, edge_weight, perm = xs[j], edge_indices[j], edge_weights[j], perms[j]
            up = torch.zeros_like(res)
            up[perm] = x
            x = res + up if self.sum_res else torch.cat((res, up), dim=-1)
            x = self.up_convs[i](x, edge_index, edge_weight)
            x = self.act(x) if i < self.depth - 1 else x
        return x

    def augment_adj(self, edge_index: Tensor, edge_weight: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
        edge_index, edge_weight = remove_self_loops(edge_index, edge_weight)
        edge_index, edge_weight = add_self_loops(edge_index, edge_weight, num_nodes)
        with warnings.catch_warnings():  # torch's "sparse CSR is in beta" notices
            warnings.simplefilter("ignore", UserWarning)
            adj = torch.sparse_coo_tensor(edge_index, edge_weight, (num_nodes, num_nodes)).coalesce()
            adj = adj.to_sparse_csr()
            adj = (adj @ adj).to_sparse_coo().coalesce()
        edge_index, edge_weight = adj.indices(), adj.values()
        return remove_self_loops(edge_index, edge_weight)


# --------------------------------------------------------------------------- examples/graph_unet.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data = cora_like(seed)
    keep_nodes = round(data.num_nodes * 2000 / 2708)  # the example's 2000 of Cora's 2708 nodes

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            pool_ratios = [keep_nodes / data.num_nodes, 0.5]
            self.unet = GraphUNet(data.x.size(1), 32, NUM_CLASSES, depth=3, pool_ratios=pool_ratios,
                                  gate=variant != "pool_gate_dropped")  # fmt: skip

        def forward(self) -> Tensor:
            edge_index, _ = dropout_edge(data.edge_index, p=0.2, force_undirected=True, training=self.training)
            if variant == "dropout_ignores_eval":
                x = F.dropout(data.x, p=0.92)
            else:
                x = F.dropout(data.x, p=0.92, training=self.training)
            x = self.unet(x, edge_index)
            return F.log_softmax(x, dim=1)

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.001)
    pool_init = [pool.select.weight.detach().clone() for pool in model.unet.pools]

    def loss_on_graph(out: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(out[data.train_mask], target)  # the loop's loss, for the probes

    full_graph = ((), data.y[data.train_mask])
    nx.preflight(model, full_graph, loss_on_graph, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.nll_loss)

    def train_epoch() -> Tensor:
        model.train()
        optimizer.zero_grad()
        loss = mon.loss_fn(model()[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        return loss

    @torch.no_grad()
    def test() -> list[float]:
        model.eval()
        out, accs = model(), []
        for _, mask in data("train_mask", "val_mask", "test_mask"):
            pred = out[mask].argmax(1)
            accs.append(pred.eq(data.y[mask]).sum().item() / mask.sum().item())
        return accs

    best_val_acc = test_acc = 0.0
    for _epoch in range(1, EPOCHS + 1):
        loss = train_epoch()
        train_acc, val_acc, tmp_test_acc = test()
        if val_acc > best_val_acc:
            best_val_acc = val_acc
            test_acc = tmp_test_acc
        mon.log(loss, accuracy=train_acc)

    nx.finish(mon, model, full_graph, loss_on_graph, optimizer=optimizer)
    moved = sum(float((pool.select.weight.detach() - w0).norm()) for pool, w0 in zip(model.unet.pools, pool_init))
    return {"test_accuracy": test_acc, "best_val_accuracy": best_val_acc, "final_train_accuracy": train_acc,
            "final_loss": loss.item(), "pool_weight_change": moved}  # fmt: skip
