"""Port of the UvA-DL tutorial 6 (Phillip Lippe), "Basics of Graph Neural Networks", as
published in Lightning-AI/tutorials: the hand-written ``GCNLayer`` (an adjacency matrix
that already holds the self-loops, ``bmm`` with the projected features, division by the
number of neighbours), stacked in the tutorial's node-level ``GNNModel`` (GCN -> ReLU(inplace)
-> Dropout, then a last GCN), trained by ``NodeLevelGNN`` on a citation graph: cross-entropy
on the training mask, accuracy on the train/val/test masks, SGD(lr=0.1, momentum=0.9,
weight_decay=2e-3), 200 full-graph epochs, the best-val-accuracy checkpoint reloaded and
tested.

Source: github.com/Lightning-AI/tutorials, ``course_UvA-DL/06-graph-neural-networks/overview.py``
(the brief names it ``GNN_overview.py``; in the snapshot read it is ``overview.py``) at commit
15817658a2d63afa338b9e1cd8454fb98d746fac (tutorial licence CC BY-SA per its ``.meta.yml``;
repository Apache-2.0). Written anew from the facts of that file; no code copied.

Kept: ``GCNLayer`` exactly as written (``num_neighbours = adj_matrix.sum(dim=-1,
keepdims=True)``, ``projection`` Linear, ``torch.bmm(adj_matrix, node_feats)``, divided by
``num_neighbours``; shapes ``[batch, nodes, features]``); ``GNNModel(c_in, c_hidden=16,
c_out, num_layers=2, dp_rate=0.1)`` with ``nn.ReLU(inplace=True)`` and ``nn.Dropout``;
``NodeLevelGNN.forward(data, mode)`` (the model on the whole graph, the loss and accuracy
on the mode's mask), its ``configure_optimizers`` (SGD 0.1 / 0.9 / 2e-3) and the trainer's
``max_epochs=200`` with one full-graph batch per epoch and a validation pass after each
epoch; ``ModelCheckpoint(mode="max", monitor="val_acc")`` (the best epoch's weights kept
and loaded before testing); ``pl.seed_everything(42)`` replaced by ``torch.manual_seed(seed)``.
Replaced: Lightning's ``Trainer.fit`` by the plain PyTorch loop it runs (per epoch
``model.train()``, ``zero_grad``, ``training_step``, ``backward``, ``step``; then
``model.eval()`` and ``validation_step`` under ``no_grad``), since a Lightning module cannot run
here; ``torch_geometric``'s ``GCNConv`` by the tutorial's own ``GCNLayer`` (the brief's
choice) on a dense adjacency matrix; Cora (2,708 papers, 1,433 binary word features, 7
classes, 140/500/1,000 train/val/test) by a synthetic citation-like graph: a stochastic
block model of 700 nodes in 7 classes of 100 (edge probability 0.028 within a class, 0.002
across: mean degree ~4 as in Cora, ~70% same-class edges; isolated nodes occur, as in
CiteSeer), 100 binary "word" features, each class with 12 topic words present with
probability 0.18 and every word present with probability 0.04; Planetoid-style split of 20
nodes per class for training (140), 200 for validation, 360 for test.
Measure only (not in the program): the metrics returned are the tutorial's train/val/test
accuracies of the reloaded best model (in percent) and the last epoch's training loss.

nndx, as the author would add it: the model takes two inputs (node features and the
adjacency matrix), so the batch is ``((node_feats, adj_matrix), y)`` as nndx's error message
for several inputs asks, a batch of one graph, and the loss is the training-mask
cross-entropy of ``NodeLevelGNN.forward``, ``loss_fn(out, y) = CrossEntropyLoss()(out[0][mask],
y[0][mask])``; a preflight ``nndx.probe`` with the optimizer before ``fit``;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, the training loss logged each
epoch (where ``self.log("train_loss", loss)`` is) and the validation accuracy as
``split="val"`` (where ``self.log("val_acc", acc)`` is); after the best checkpoint is loaded,
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_gnn"
SOURCE = Source("Lightning-AI/tutorials", "course_UvA-DL/06-graph-neural-networks/overview.py",
                "15817658a2d63afa338b9e1cd8454fb98d746fac", "CC BY-SA (tutorial) / Apache-2.0 (repository)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial's node-level GCN as published (shrunk: a 700-node synthetic citation graph)"),
        Variant(
            "adjacency_without_self_loops",
            "the adjacency matrix is built from the edges alone, without adding the identity that GCNLayer assumes: "
            "an isolated node has num_neighbours = 0, its row of bmm is 0, 0/0 = NaN, and the NaN spreads through "
            "the next bmm to every node",
            (C.DIVISION_BY_ZERO,),
            ("https://github.com/MrLeeeee/GCN-GAT-and-Graphsage/issues/3",
             "https://github.com/Zhongdao/gcn_clustering/issues/6",
             "https://github.com/GeneZC/ASGCN/issues/5"),
            Measure("test_acc", "test accuracy at least 20 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
        Variant(
            "loss_on_all_nodes",
            "the training loss is computed on every node (loss_module(x, data.y)) instead of x[train_mask]: the "
            "validation and test labels are trained on, so the val/test accuracies are inflated",
            (C.DATA_LEAKAGE,),
            ("https://github.com/waittim/graph-fraud-detection/issues/3",
             "https://github.com/tkipf/gcn/issues/68",
             "https://github.com/pyg-team/pytorch_geometric/issues/1928"),
            Measure("test_acc", "test accuracy at least 5 points above the healthy run's (test labels were trained "
                    "on): 93.6/92.2 against 82.5/80.0 healthy on seeds 0/1",
                    lambda healthy, buggy: buggy > healthy + 5.0),
        ),
    )
}

N_CLASSES, PER_CLASS, N_FEATS = 7, 100, 100
P_IN, P_OUT = 0.028, 0.002
TOPIC_WORDS, P_TOPIC, P_BACKGROUND = 12, 0.18, 0.04
N_TRAIN_PER_CLASS, N_VAL, N_TEST = 20, 200, 360
MAX_EPOCHS = 200


# --------------------------------------------------------------------------- the data (Cora's stand-in)


def citation_graph(seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    n = N_CLASSES * PER_CLASS
    y = np.repeat(np.arange(N_CLASSES), PER_CLASS)
    same = y[:, None] == y[None, :]
    prob = np.where(same, P_IN, P_OUT)
    upper = np.triu(rng.random((n, n)) < prob, k=1)
    edges = upper | upper.T  # undirected citations, no self-citations
    topics = np.stack([rng.choice(N_FEATS, TOPIC_WORDS, replace=False) for _ in range(N_CLASSES)])
    p_word = np.full((n, N_FEATS), P_BACKGROUND)
    for c in range(N_CLASSES):
        p_word[np.ix_(y == c, topics[c])] = P_TOPIC
    x = (rng.random((n, N_FEATS)) < p_word).astype(np.float32)
    perm = rng.permutation(n)
    train_idx = np.concatenate([perm[y[perm] == c][:N_TRAIN_PER_CLASS] for c in range(N_CLASSES)])
    rest = np.setdiff1d(perm, train_idx, assume_unique=True)
    rest = rest[rng.permutation(len(rest))]
    masks = {}
    for name, idx in (("train_mask", train_idx), ("val_mask", rest[:N_VAL]), ("test_mask", rest[N_VAL:N_VAL + N_TEST])):
        m = np.zeros(n, dtype=bool)
        m[idx] = True
        masks[name] = torch.from_numpy(m)
    return {"x": torch.from_numpy(x), "y": torch.from_numpy(y).long(), "edges": torch.from_numpy(edges), **masks}


# --------------------------------------------------------------------------- the tutorial's layer and model


class GCNLayer(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.projection = nn.Linear(c_in, c_out)

    def forward(self, node_feats: torch.Tensor, adj_matrix: torch.Tensor) -> torch.Tensor:
        # node_feats [batch, nodes, c_in]; adj_matrix [batch, nodes, nodes], identity connections assumed added
        num_neighbours = adj_matrix.sum(dim=-1, keepdims=True)
        node_feats = self.projection(node_feats)
        node_feats = torch.bmm(adj_matrix, node_feats)
        node_feats = node_feats / num_neighbours
        return node_feats


class GNNModel(nn.Module):
    def __init__(self, c_in: int, c_hidden: int, c_out: int, num_layers: int = 2, dp_rate: float = 0.1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels, out_channels = c_in, c_hidden
        for _ in range(num_layers - 1):
            layers += [GCNLayer(in_channels, out_channels), nn.ReLU(inplace=True), nn.Dropout(dp_rate)]
            in_channels = c_hidden
        layers += [GCNLayer(in_channels, c_out)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, adj_matrix: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, GCNLayer):  # the tutorial's isinstance(layer, MessagePassing)
                x = layer(x, adj_matrix)
            else:
                x = layer(x)
        return x


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    data = citation_graph(seed)
    n = data["x"].shape[0]
    if variant == "adjacency_without_self_loops":
        adj = data["edges"].float()
    else:
        adj = data["edges"].float() + torch.eye(n)
    # a batch of one graph, as geom_data.DataLoader(dataset, batch_size=1) gives
    node_feats, adj_matrix, y = data["x"][None], adj[None], data["y"][None]
    masks = {m: data[f"{m}_mask"] for m in ("train", "val", "test")}
    all_nodes = variant == "loss_on_all_nodes"

    model = GNNModel(c_in=N_FEATS, c_hidden=16, c_out=N_CLASSES, num_layers=2, dp_rate=0.1)
    loss_module = nn.CrossEntropyLoss()

    def forward(mode: str) -> tuple[torch.Tensor, torch.Tensor]:  # NodeLevelGNN.forward
        x = model(node_feats, adj_matrix)[0]
        mask = masks[mode]
        if mode == "train" and all_nodes:
            loss = loss_module(x, y[0])
        else:
            loss = loss_module(x[mask], y[0][mask])
        acc = (x[mask].argmax(dim=-1) == y[0][mask]).sum().float() / mask.sum()
        return loss, acc

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=2e-3)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_module(out[0][masks["train"]], target[0][masks["train"]])

    batch = ((node_feats, adj_matrix), y)
    nx.preflight(model, batch, loss_fn, optimizer=optimizer)

    best_acc, best_state = -1.0, None
    mon = nx.monitor(model, optimizer, every=10)
    train_loss = float("nan")
    with mon:
        for _ in range(MAX_EPOCHS):
            model.train()
            optimizer.zero_grad()
            loss, acc = forward("train")
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            train_loss = loss.item()
            model.eval()
            with torch.no_grad():
                val_loss, val_acc = forward("val")
            nx.timed(lambda: mon.log(val_loss, split="val", accuracy=float(val_acc)))
            if float(val_acc) > best_acc:  # ModelCheckpoint(mode="max", monitor="val_acc")
                best_acc, best_state = float(val_acc), copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    nx.finish(mon, model, batch, loss_fn, optimizer=optimizer)

    model.eval()
    with torch.no_grad():
        result = {m: float(forward(m)[1]) * 100.0 for m in ("train", "val", "test")}
    return {"train_acc": result["train"], "val_acc": result["val"], "test_acc": result["test"],
            "last_train_loss": train_loss, "best_val_acc": best_acc * 100.0}
