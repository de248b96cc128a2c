"""Port of PyTorch Geometric's Node2Vec (``examples/node2vec.py`` with ``nn/models/node2vec.py``).

Source: github.com/pyg-team/pytorch_geometric, ``examples/node2vec.py`` and
``torch_geometric/nn/models/node2vec.py`` at commit
5c6461b2305ad068a6d61165b3c55852a11aaa41 (MIT, Copyright (c) 2023 PyG Team); the biased
second-order walk follows node2vec (Grover & Leskovec) as ``pyg_lib``'s ``random_walk``
samples it (a uniform neighbour proposal accepted with weight 1/p to go back, 1 to a
neighbour of the previous node, 1/q farther, over the largest of the three). Written
anew from the facts of those files, without PyG; no code copied.

Kept: ``Node2Vec``: one ``Embedding(num_nodes, embedding_dim, sparse=True)`` with its
default init, the edge list sorted into a CSR ``rowptr``/``col``, ``walk_length - 1``
steps per walk, ``pos_sample``: each node of the batch repeated ``walks_per_node`` times,
a biased walk from each, cut into ``1 + walk_length + 1 - context_size`` windows of
``context_size`` nodes; ``neg_sample``: the batch repeated ``walks_per_node *
num_negative_samples`` times, each followed by uniformly random nodes, cut the same way;
``loader`` = ``DataLoader(range(num_nodes), collate_fn=sample, batch_size=128,
shuffle=True)``; ``loss``: the start node's embedding dotted with each of the rest of its
window, ``-log(sigmoid(out) + EPS)`` averaged over positives plus ``-log(1 - sigmoid(out)
+ EPS)`` averaged over negatives, ``EPS = 1e-15``; ``test``: scikit-learn's
``LogisticRegression(solver="lbfgs", max_iter=150)`` fitted on the train nodes'
embeddings, scored on the test nodes'. The example: ``embedding_dim=128,
walk_length=20, context_size=10, walks_per_node=10, num_negative_samples=1, p=1.0,
q=1.0, sparse=True``, ``SparseAdam(list(model.parameters()), lr=0.01)``, per epoch
``train()`` (``model.train()``, ``zero_grad`` / ``loss`` / ``backward`` / ``step`` per
batch, the mean batch loss) then ``test()`` (``model.eval()``, ``torch.no_grad()``).
Shrunk: a stochastic block model of 4 communities of 50 nodes (edge probability 0.12
inside a community, 0.01 across; the community is the label; half the nodes of each
community train the logistic regression, half test it) instead of Cora (2,708 nodes, 7
classes, 140 train / 1,000 test); ``embedding_dim`` 32 instead of 128, ``walk_length``
10 and ``context_size`` 5 instead of 20 and 10, ``walks_per_node`` 4 instead of 10,
batch 32 instead of 128 (200 nodes: 7 batches an epoch), 15 epochs instead of 100; no
t-SNE plot.
Measure only (not in the program): the last epoch's ``test()`` accuracy.

nndx, as the author would add it: the program's loss is ``model.loss(pos_rw, neg_rw)``,
not ``model(...)``, and nndx's probes call the model, so the author hands nndx a thin
wrapper whose ``forward`` is ``node2vec.loss`` (``Node2VecLoss``, holding the same
embedding) with ``loss_fn = lambda loss, _: loss`` and the first sampled batch as
``((pos_rw, neg_rw), None)``; a preflight ``nndx.probe`` with the optimizer,
``nndx.Monitor(wrapper, optimizer)`` around the epochs (the loop still calls
``model.loss``), every batch loss logged, and after training ``nndx.probe(...,
monitor=mon)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.nn import Embedding

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "node2vec"
SOURCE = Source("pyg-team/pytorch_geometric", "examples/node2vec.py", "5c6461b2305ad068a6d61165b3c55852a11aaa41",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (shrunk: SBM graph, dim 32, walks of 10, 15 epochs)"),
        Variant(
            "negative_loss_sign",
            "neg_loss = -log(sigmoid(out) + EPS) for the negative walks (the '1 -' dropped): random nodes are "
            "pulled toward the start node like its true context",
            (C.WRONG_LOSS,),
            ("https://github.com/DSKSD/DeepNLP-models-Pytorch/issues/15",
             "https://github.com/kefirski/pytorch_NEG_loss/issues/5",
             "https://github.com/theeluwin/pytorch-sgns/issues/12"),
            Measure("test_accuracy", "final test() accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "sparse_adam_default_lr",
            "torch.optim.SparseAdam(list(model.parameters())) with the lr argument left out: SparseAdam's default "
            "1e-3 instead of the example's 0.01, the embeddings barely move from their N(0, 1) init",
            (C.LR_TOO_LOW,),
            ("https://github.com/oalieno/asm2vec-pytorch/pull/7",
             "https://github.com/snowkylin/line/issues/14"),
            Measure("test_accuracy", "final test() accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

COMMUNITIES, PER_COMMUNITY, P_IN, P_OUT = 4, 50, 0.12, 0.01
EMBEDDING_DIM, WALK_LENGTH, CONTEXT_SIZE, WALKS_PER_NODE, NUM_NEG = 32, 10, 5, 4, 1
P, Q, BATCH_SIZE, LR, EPOCHS = 1.0, 1.0, 32, 0.01, 15


# --------------------------------------------------------------------------- the graph (the data)


def sbm(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """edge_index (both directions), labels, train mask, test mask."""
    rng = np.random.default_rng(seed)
    n = COMMUNITIES * PER_COMMUNITY
    y = np.repeat(np.arange(COMMUNITIES), PER_COMMUNITY)
    prob = np.where(y[:, None] == y[None, :], P_IN, P_OUT)
    upper = np.triu(rng.random((n, n)) < prob, k=1)
    for i in range(n - 1):  # a ring inside each community keeps every node connected
        if y[i] == y[i + 1]:
            upper[i, i + 1] = True
    src, dst = np.nonzero(upper | upper.T)
    train_mask = np.zeros(n, dtype=bool)
    for c in range(COMMUNITIES):
        members = np.flatnonzero(y == c)
        train_mask[rng.choice(members, size=len(members) // 2, replace=False)] = True
    return (torch.tensor(np.stack([src, dst]), dtype=torch.long), torch.tensor(y),
            torch.tensor(train_mask), torch.tensor(~train_mask))  # fmt: skip


# --------------------------------------------------------------------------- torch_geometric/nn/models/node2vec.py


def biased_random_walk(rowptr: Tensor, col: Tensor, start: Tensor, walk_length: int, p: float, q: float,
                       generator: torch.Generator) -> Tensor:  # fmt: skip
    """node2vec's second-order walk by rejection sampling, all walks at once."""
    n = rowptr.numel() - 1
    deg = rowptr[1:] - rowptr[:-1]
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[torch.repeat_interleave(torch.arange(n), deg), col] = True
    max_w = max(1.0 / p, 1.0, 1.0 / q)
    walks = [start]
    prev = None
    cur = start
    for _ in range(walk_length):
        nxt = torch.empty_like(cur)
        todo = torch.ones_like(cur, dtype=torch.bool)
        while todo.any():
            idx = todo.nonzero().view(-1)
            c = cur[idx]
            pick = rowptr[c] + (torch.rand(idx.numel(), generator=generator) * deg[c]).long()
            cand = col[pick]
            if prev is None:
                accept = torch.ones_like(cand, dtype=torch.bool)
            else:
                pv = prev[idx]
                weight = torch.where(cand == pv, torch.tensor(1.0 / p),
                                     torch.where(adj[pv, cand], torch.tensor(1.0), torch.tensor(1.0 / q)))
                accept = torch.rand(idx.numel(), generator=generator) * max_w < weight
            nxt[idx[accept]] = cand[accept]
            todo[idx[accept]] = False
        walks.append(nxt)
        prev, cur = cur, nxt
    return torch.stack(walks, dim=1)


class Node2Vec(torch.nn.Module):
    def __init__(self, edge_index: Tensor, embedding_dim: int, walk_length: int, context_size: int,
                 walks_per_node: int = 1, p: float = 1.0, q: float = 1.0, num_negative_samples: int = 1,
                 num_nodes: int | None = None, sparse: bool = False, neg_sign_dropped: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.num_nodes = int(edge_index.max()) + 1 if num_nodes is None else num_nodes
        order = torch.argsort(edge_index[0] * self.num_nodes + edge_index[1])
        row, col = edge_index[0][order], edge_index[1][order]
        self.rowptr = torch.cat([torch.zeros(1, dtype=torch.long),
                                 torch.bincount(row, minlength=self.num_nodes).cumsum(0)])  # fmt: skip
        self.col = col
        self.EPS = 1e-15
        assert walk_length >= context_size
        self.embedding_dim = embedding_dim
        self.walk_length = walk_length - 1
        self.context_size = context_size
        self.walks_per_node = walks_per_node
        self.p, self.q = p, q
        self.num_negative_samples = num_negative_samples
        self.embedding = Embedding(self.num_nodes, embedding_dim, sparse=sparse)
        self.neg_sign_dropped = neg_sign_dropped
        self.generator = torch.Generator()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.embedding.reset_parameters()

    def forward(self, batch: Tensor | None = None) -> Tensor:
        emb = self.embedding.weight
        return emb if batch is None else emb[batch]

    def loader(self, batch_size: int, shuffle: bool, generator: torch.Generator):
        order = torch.randperm(self.num_nodes, generator=generator) if shuffle else torch.arange(self.num_nodes)
        return [self.sample(order[i : i + batch_size]) for i in range(0, self.num_nodes, batch_size)]

    def _windows(self, rw: Tensor) -> Tensor:
        num_walks_per_rw = 1 + self.walk_length + 1 - self.context_size
        return torch.cat([rw[:, j : j + self.context_size] for j in range(num_walks_per_rw)], dim=0)

    def pos_sample(self, batch: Tensor) -> Tensor:
        batch = batch.repeat(self.walks_per_node)
        rw = biased_random_walk(self.rowptr, self.col, batch, self.walk_length, self.p, self.q, self.generator)
        return self._windows(rw)

    def neg_sample(self, batch: Tensor) -> Tensor:
        batch = batch.repeat(self.walks_per_node * self.num_negative_samples)
        rw = torch.randint(self.num_nodes, (batch.size(0), self.walk_length), dtype=batch.dtype,
                           generator=self.generator)  # fmt: skip
        return self._windows(torch.cat([batch.view(-1, 1), rw], dim=-1))

    def sample(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        return self.pos_sample(batch), self.neg_sample(batch)

    def loss(self, pos_rw: Tensor, neg_rw: Tensor) -> Tensor:
        start, rest = pos_rw[:, 0], pos_rw[:, 1:].contiguous()
        h_start = self.embedding(start).view(pos_rw.size(0), 1, self.embedding_dim)
        h_rest = self.embedding(rest.view(-1)).view(pos_rw.size(0), -1, self.embedding_dim)
        out = (h_start * h_rest).sum(dim=-1).view(-1)
        pos_loss = -torch.log(torch.sigmoid(out) + self.EPS).mean()

        start, rest = neg_rw[:, 0], neg_rw[:, 1:].contiguous()
        h_start = self.embedding(start).view(neg_rw.size(0), 1, self.embedding_dim)
        h_rest = self.embedding(rest.view(-1)).view(neg_rw.size(0), -1, self.embedding_dim)
        out = (h_start * h_rest).sum(dim=-1).view(-1)
        if self.neg_sign_dropped:
            neg_loss = -torch.log(torch.sigmoid(out) + self.EPS).mean()
        else:
            neg_loss = -torch.log(1 - torch.sigmoid(out) + self.EPS).mean()
        return pos_loss + neg_loss

    def test(self, train_z: Tensor, train_y: Tensor, test_z: Tensor, test_y: Tensor, solver: str = "lbfgs",
             **kwargs) -> float:  # fmt: skip
        from sklearn.linear_model import LogisticRegression

        clf = LogisticRegression(solver=solver, **kwargs).fit(train_z.detach().numpy(), train_y.numpy())
        return float(clf.score(test_z.detach().numpy(), test_y.numpy()))


class Node2VecLoss(torch.nn.Module):
    """For nndx's probes only: the model called as the program calls it, ``model.loss``."""

    def __init__(self, node2vec: Node2Vec) -> None:
        super().__init__()
        self.node2vec = node2vec

    def forward(self, pos_rw: Tensor, neg_rw: Tensor) -> Tensor:
        return self.node2vec.loss(pos_rw, neg_rw)


# --------------------------------------------------------------------------- examples/node2vec.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    edge_index, y, train_mask, test_mask = sbm(seed)
    model = Node2Vec(edge_index, embedding_dim=EMBEDDING_DIM, walk_length=WALK_LENGTH, context_size=CONTEXT_SIZE,
                     walks_per_node=WALKS_PER_NODE, num_negative_samples=NUM_NEG, p=P, q=Q, sparse=True,
                     neg_sign_dropped=variant == "negative_loss_sign")  # fmt: skip
    model.generator.manual_seed(seed)
    shuffle_gen = torch.Generator().manual_seed(seed + 1)
    if variant == "sparse_adam_default_lr":
        optimizer = torch.optim.SparseAdam(list(model.parameters()))
    else:
        optimizer = torch.optim.SparseAdam(list(model.parameters()), lr=LR)

    def loss_fn(loss: Tensor, _target) -> Tensor:
        return loss

    wrapped = Node2VecLoss(model)
    pos_rw, neg_rw = model.sample(torch.arange(min(BATCH_SIZE, model.num_nodes)))
    probe_batch = ((pos_rw, neg_rw), None)
    nx.preflight(wrapped, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(wrapped, optimizer, every=5)

    def train_epoch() -> float:
        model.train()
        total_loss = 0.0
        batches = model.loader(BATCH_SIZE, True, shuffle_gen)
        for pos_rw, neg_rw in batches:
            optimizer.zero_grad()
            loss = model.loss(pos_rw, neg_rw)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            total_loss += loss.item()
        return total_loss / len(batches)

    @torch.no_grad()
    def test() -> float:
        model.eval()
        z = model()
        return model.test(z[train_mask], y[train_mask], z[test_mask], y[test_mask], max_iter=150)

    losses, accs = [], []
    for _epoch in range(1, EPOCHS + 1):
        losses.append(train_epoch())
        accs.append(test())

    nx.finish(mon, wrapped, probe_batch, loss_fn, optimizer=optimizer)
    return {"test_accuracy": accs[-1], "best_accuracy": max(accs), "first_loss": losses[0], "final_loss": losses[-1]}
