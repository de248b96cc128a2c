"""Port of haowei01/pytorch-examples ``ranking/RankNet.py``: RankNet, factorized per query.

Source: github.com/haowei01/pytorch-examples, ``ranking/RankNet.py``, ``ranking/utils.py``,
``ranking/metrics.py`` and ``ranking/load_mslr.py`` at commit
a62cad2d73392da010acd7a8c60a7d2965ffdc37 (the repository's HEAD; MIT). Written anew from
the facts of those files; no code copied.

Kept: ``RankNet``: ``fc1 .. fc(L)`` Linear layers with ReLU between them and ``ReLU6`` on
the single output score, structure ``[num_features, 64, 16]`` -> 1; ``init_weights``
(``xavier_uniform_`` weights, biases filled with 0.01); Adam (the README's lr 0.001) and
``StepLR(step_size=10, gamma=0.75)`` stepped at the start of each epoch, then
``net.zero_grad()`` and ``net.train()``; ``factorized_training_loop`` with the default
``sum_session`` algorithm: queries in a shuffled order (``generate_batch_per_query``),
queries with no positive pair skipped, ``rel_diff = Y - Y.T``, the pairwise cross entropy
of every pair with ``rel_diff != 0`` written as ``logaddexp(sigma*s_i, sigma*s_j)`` minus
``sigma*s_i`` where ``rel_diff > 0`` minus ``sigma*s_j`` where ``rel_diff < 0`` (sigma 1),
summed over the queries of a batch and divided by the batch's pair count (``2 * num_pos_pairs``
per query), ``backward``, ``optimizer.step()``, ``net.zero_grad()`` every ``batch_size``
queries, the leftover queries stepped at the end of the epoch; ``--standardize``
(``StandardScaler`` fit on the training features, applied to the validation features, as the
README's command line uses); ``eval_ndcg_at_k``: each validation query's documents sorted
by score, NDCG@10 with the exp2 gain (``2**rel - 1``) and ``log2(rank + 1)`` discount,
queries with no relevant document skipped, the mean over queries.
Shrunk: a generated data set instead of MSLR-WEB10K: 40 features instead of 136, each on
its own raw scale (from 1e-2 to 1e4, some count-like) as MSLR's are, 240 training and 80
validation queries of 30 documents, graded relevance 0-4 from a hidden nonlinear function
of the (scaled) features plus noise, cut at fixed levels so most documents are 0; batch_size
20 queries instead of 200; 25 epochs instead of 100; the evaluation at the end only, no
checkpoints or TensorBoard writer.
Measure only: nothing is added; the metric is the program's own validation NDCG@10 after
the last epoch.

nndx, as the author would add it: the net scores documents one query at a time, so the
preflight ``nndx.probe(net, (X, Y), query_loss, optimizer=optimizer)`` gets the first
training query's features and relevance labels, with ``query_loss`` the loop's pairwise
cross entropy for one query (divided by its pair count); ``nndx.Monitor(net, optimizer)``
around the epochs, each step's loss (the batch's loss per pair, the number the program
records) logged; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ranknet"
SOURCE = Source("haowei01/pytorch-examples", "ranking/RankNet.py", "a62cad2d73392da010acd7a8c60a7d2965ffdc37", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as the README runs it (--standardize), shrunk: synthetic queries"),
        Variant(
            "pairs_reversed",
            "rel_diff = Y.T - Y instead of Y - Y.T: every pair's preference reversed, so the pairwise loss "
            "pushes the less relevant document of each pair above the more relevant one",
            (C.WRONG_LOSS, C.LABELS_MISALIGNED),
            ("https://github.com/tensorflow/ranking/issues/23",
             "https://github.com/airalcorn2/RankNet/issues/5",
             "https://github.com/princeton-vl/relative_depth/issues/6"),
            Measure("ndcg_at_10", "validation NDCG@10 at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "not_standardized",
            "run without --standardize: the raw features (scales from 1e-2 to 1e4) go into the net unscaled",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/akanyaani/ranknet-tensorflow2.0/issues/1",
             "https://github.com/allegro/allRank/issues/23",
             "https://github.com/haowei01/pytorch-examples/blob/a62cad2d73392da010acd7a8c60a7d2965ffdc37/README.md"),
            Measure("ndcg_at_10", "validation NDCG@10 at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

NUM_FEATURES, DOCS_PER_QUERY, TRAIN_QUERIES, VALID_QUERIES = 40, 30, 240, 80
EPOCHS, LR, BATCH_SIZE, SIGMA = 25, 0.001, 20, 1.0


# --------------------------------------------------------------------------- the data (MSLR stand-in)


def ranking_data(seed: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """(train, valid): lists of per-query (X raw features (docs, NUM_FEATURES), rel (docs,))."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(NUM_FEATURES, 8)) / np.sqrt(NUM_FEATURES)
    w2 = rng.normal(size=8)
    w_lin = rng.normal(size=NUM_FEATURES) / np.sqrt(NUM_FEATURES)
    scale = 10.0 ** rng.uniform(-2, 4, size=NUM_FEATURES)
    offset = rng.uniform(0, 3, size=NUM_FEATURES) * scale
    counts = rng.random(NUM_FEATURES) < 0.3

    def query() -> tuple[np.ndarray, np.ndarray]:
        topic = rng.normal(size=NUM_FEATURES) * 0.5
        z = rng.normal(size=(DOCS_PER_QUERY, NUM_FEATURES)) + topic
        hidden = z @ w_lin + np.tanh(z @ w1) @ w2 * 0.7 + rng.normal(scale=0.3, size=DOCS_PER_QUERY)
        hidden = hidden - hidden.mean()
        rel = np.digitize(hidden, [0.4, 1.0, 1.6, 2.2]).astype(np.float32)
        raw = z * scale + offset
        raw[:, counts] = np.round(np.abs(raw[:, counts]))
        return raw.astype(np.float32), rel

    return [query() for _ in range(TRAIN_QUERIES)], [query() for _ in range(VALID_QUERIES)]


def standardize(train: list, valid: list) -> tuple[list, list]:
    """``train_scaler_and_transform`` + ``apply_scaler``: StandardScaler on the training rows."""
    x = np.concatenate([q[0] for q in train])
    mean, std = x.mean(0), x.std(0)
    std[std == 0] = 1.0

    def apply(queries: list) -> list:
        return [(((X - mean) / std).astype(np.float32), Y) for X, Y in queries]

    return apply(train), apply(valid)


# --------------------------------------------------------------------------- RankNet.py


class RankNet(nn.Module):
    def __init__(self, net_structures: list[int]) -> None:
        super().__init__()
        self.fc_layers = len(net_structures)
        for i in range(len(net_structures) - 1):
            setattr(self, "fc" + str(i + 1), nn.Linear(net_structures[i], net_structures[i + 1]))
        setattr(self, "fc" + str(len(net_structures)), nn.Linear(net_structures[-1], 1))
        self.activation = nn.ReLU6()

    def forward(self, input1: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.fc_layers):
            input1 = F.relu(getattr(self, "fc" + str(i))(input1))
        return self.activation(getattr(self, "fc" + str(self.fc_layers))(input1))


def init_weights(m: nn.Module) -> None:
    if type(m) == nn.Linear:  # noqa: E721 - as written
        nn.init.xavier_uniform_(m.weight)
        m.bias.data.fill_(0.01)


def pair_diff(Y: torch.Tensor, variant: str) -> torch.Tensor:
    Y = Y.reshape(-1, 1)
    return Y.t() - Y if variant == "pairs_reversed" else Y - Y.t()


def session_loss(y_pred: torch.Tensor, rel_diff: torch.Tensor, sigma: float = SIGMA) -> torch.Tensor:
    """The ``sum_session`` pairwise cross entropy of one query, summed over its pairs."""
    zero = torch.tensor(0.0)
    C = (torch.where(rel_diff != 0, torch.logaddexp(sigma * y_pred, sigma * y_pred.t()), zero)
         - torch.where(rel_diff > 0, sigma * y_pred, zero) - torch.where(rel_diff < 0, sigma * y_pred.t(), zero))  # fmt: skip
    return torch.sum(C)


def generate_batch_per_query(queries: list, rng: np.random.Generator):
    order = np.arange(len(queries))
    rng.shuffle(order)
    for i in order:
        yield queries[i]


def factorized_training_loop(net, optimizer, queries, rng, variant, mon, nx, step_losses) -> float | None:
    minibatch_loss = []
    count, loss, pairs = 0, 0, 0
    for X, Y in generate_batch_per_query(queries, rng):
        rel_diff = pair_diff(torch.tensor(Y), variant)
        num_pos_pairs = int((rel_diff > 0).sum())
        if num_pos_pairs == 0:
            continue
        num_pairs = 2 * num_pos_pairs
        y_pred = net(torch.tensor(X))
        loss += session_loss(y_pred, rel_diff)
        pairs += num_pairs
        count += 1
        if count % BATCH_SIZE == 0:
            loss /= pairs
            minibatch_loss.append(loss.item())
            loss.backward()
            optimizer.step()
            net.zero_grad()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            step_losses.append(loss.item())
            loss, pairs = 0, 0
    if pairs:
        loss /= pairs
        minibatch_loss.append(loss.item())
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))
        step_losses.append(loss.item())
        return float(np.mean(minibatch_loss))
    return None  # as written: the epoch's loss is only returned when pairs were left over


# --------------------------------------------------------------------------- metrics.py / eval_ndcg_at_k


def ndcg_at_k(rel_rank: np.ndarray, k: int = 10) -> float:
    def dcg(t: np.ndarray) -> float:
        t = t[:k]
        return float(np.sum((np.power(2.0, t) - 1.0) / np.log2(np.arange(1, len(t) + 1) + 1)))

    return dcg(rel_rank) / dcg(np.sort(rel_rank)[::-1])


def eval_ndcg(net: nn.Module, queries: list, k: int = 10) -> float:
    net.eval()
    ndcgs = []
    with torch.no_grad():
        for X, Y in queries:
            scores = net(torch.tensor(X)).numpy().squeeze()
            rel_rank = Y[np.argsort(-scores, kind="stable")]
            if np.sum(np.power(2.0, np.sort(rel_rank)[::-1][:k]) - 1.0) == 0:
                continue
            ndcgs.append(ndcg_at_k(rel_rank, k))
    return float(np.mean(ndcgs))


# --------------------------------------------------------------------------- train_rank_net


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(100 + seed)
    train_q, valid_q = ranking_data(seed)
    if variant != "not_standardized":
        train_q, valid_q = standardize(train_q, valid_q)

    net = RankNet([NUM_FEATURES, 64, 16])
    net.apply(init_weights)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.75)

    def query_loss(y_pred: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        rel_diff = pair_diff(Y, variant)
        return session_loss(y_pred, rel_diff) / (2 * (rel_diff > 0).sum()).clamp(min=1)

    first = next(q for q in train_q if (pair_diff(torch.tensor(q[1]), variant) > 0).any())
    probe_batch = (torch.tensor(first[0]), torch.tensor(first[1]))
    nx.preflight(net, probe_batch, query_loss, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5)

    epoch_losses, step_losses = [], []
    for _epoch in range(EPOCHS):
        scheduler.step()
        net.zero_grad()
        net.train()
        epoch_loss = factorized_training_loop(net, optimizer, train_q, rng, variant, mon, nx, step_losses)
        epoch_losses.append(epoch_loss)

    nx.finish(mon, net, probe_batch, query_loss, optimizer=optimizer)
    return {
        "ndcg_at_10": eval_ndcg(net, valid_q, 10),
        "train_ndcg_at_10": eval_ndcg(net, train_q, 10),
        "first_loss": float(np.mean(step_losses[:12])),
        "final_loss": float(np.mean(step_losses[-12:])),
    }
