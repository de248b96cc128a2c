"""Port of TimDettmers/ConvE: convolutional 2D knowledge-graph embeddings trained with 1-N
scoring (every entity scored at once for an (entity, relation) query), binary
cross-entropy on sigmoid scores against label-smoothed multi-hot targets, Adam, and the
filtered ranking evaluation (MRR, Hits@k) in both directions.

Source: github.com/TimDettmers/ConvE, ``main.py``, ``model.py``, ``evaluation.py`` and
``wrangle_KG.py`` at commit f3c0eb286025410fa5b4c04696c918264163d0ca (the repository's
HEAD; MIT, Copyright (c) 2017 Tim Dettmers). Written anew from the facts of those files;
no code copied.

Kept: ``wrangle_KG.py``'s data layout: every triple ``(e1, rel, e2)`` also gives the
inverse query ``(e2, rel + '_reverse') -> e1``; the training file maps each ``(e1, rel)``
key of the *train* split to the set of its ``e2`` (``write_training_graph(train cases,
train_graph['train.txt'])``); the ranking files hold one line per valid / test triple with
``e2_multi1`` = every known tail of ``(e1, rel)`` and ``e2_multi2`` = every known head
``(e2, rel_reverse)`` over train + valid + test (``label_graph``, the filter);
``TargetIdx2MultiTarget`` (the multi-hot ``e2_multi1_binary``); the vocabulary's
index 0 reserved (``padding_idx=0`` in both embeddings). ``ConvE``: ``emb_e`` and
``emb_rel`` ``Embedding(n, embedding_dim, padding_idx=0)``; ``inp_drop`` ``Dropout(0.2)``,
``hidden_drop`` ``Dropout(0.3)``, ``feature_map_drop`` ``Dropout2d(0.2)``; ``loss =
BCELoss()`` on the model; ``conv1 = Conv2d(1, 32, (3, 3), 1, 0, bias=use_bias)`` (the flag
``--use-bias`` is ``store_true``: no bias by default); ``bn0 = BatchNorm2d(1)``, ``bn1 =
BatchNorm2d(32)``, ``bn2 = BatchNorm1d(embedding_dim)``; the entity bias ``b`` (zeros, one
per entity); ``fc = Linear(hidden_size, embedding_dim)``; ``init()`` = ``xavier_normal_`` on
both embedding tables; ``forward``: both embeddings viewed ``(-1, 1, emb_dim1, emb_dim2)``,
concatenated on dim 2, ``bn0``, input dropout, ``conv1``, ``bn1``, ReLU, feature-map dropout,
flattened, ``fc``, hidden dropout, ``bn2``, ReLU, ``mm`` with the transposed entity table, ``+
b``, ``sigmoid``. ``main.py``: ``torch.manual_seed(seed)``; ``model.init()``;
``Adam(lr=0.003, weight_decay=l2=0)``; per epoch ``model.train()``, the shuffled batches
(``StreamBatcher(randomize=True)``), per batch ``zero_grad``, the label smoothing exactly as
published (``(1 - 0.1) * e2_multi + 1 / e2_multi.size(1)``, the form reported in ConvE issue
#55), ``pred = model.forward(e1, rel)``, ``loss = model.loss(pred, e2_multi)``, backward,
step; after each epoch ``model.eval()`` and, under ``no_grad``, when ``epoch % 5 == 0 and
epoch > 0``, ``ranking_and_hits`` on dev and test (``evaluation.py``: each triple scored as
``(e1, rel)`` and as ``(e2, rel_reverse)``, every other known answer's score set to 0 and the
target's restored, the rank of the target after a descending sort, MRR and Hits@1/3/10
over both directions). ``--lr-decay`` is parsed but never used by ``main.py``: no schedule.
Shrunk: a synthetic knowledge graph instead of FB15k-237 (the shipped tarballs are not
read at run time): 150 entities at random points of R^6, 6 relations each a random
translation, each ``(head, relation)`` drawn getting as tail one of the 3 entities nearest
``head + translation``; 2,400 distinct triples split 80/10/10, valid/test triples whose
entities never occur in training dropped (an oracle ranking by the true geometry scores a
filtered test MRR of 0.62 on seed 0). ``embedding_dim`` 32 instead of 200, viewed 4 x 8
instead of 20 x 10 (so ``hidden_size`` is 32 * 6 * 6 = 1152 instead of 9728); 61 epochs
instead of 1000 (the evaluations at epochs 5, 10, ..., 60 kept); ``lr`` 0.01 instead of
0.003 (at 0.003 drafts of this graph were still climbing after 61-101 epochs, test MRR
0.24-0.29); batch size 128 (kept); no checkpoint file, no spodernet pipeline or loader
threads, no CUDA.
Measure only (not in the program): the filtered test MRR and Hits@10 that the program's
``ranking_and_hits`` logs at its last evaluation (epoch 60). Seeds 0/1/2 without nndx:
healthy test MRR 0.371/0.329/0.357 (Hits@10 0.68/0.66/0.71; first-epoch loss 0.46, last
0.09); test_triples_in_train 0.497/0.509/0.562; sigmoid_before_bce_logits 0.052/0.042/0.038
(its loss stuck at 0.693).

nndx, as the author would add it: the model computes its own loss (``model.loss``, a
``BCELoss``), so ``loss_fn`` is ``model.loss`` and a batch is ``((e1, rel), e2_multi)`` with
the smoothed targets, as the loop builds it; a preflight ``nndx.probe`` on the first
training batch with the optimizer; ``nndx.Monitor(model, opt)`` around the epochs, every
batch's loss logged (the program's ``LossHook``); the program logs rankings, not a
validation loss, so nothing is logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` on that first batch and ``nndx.diagnose``. The spodernet batcher streams
from HDF5 files and the program never holds its splits as arrays, so no ``data=`` is
passed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import Parameter
from torch.nn import functional as F
from torch.nn.init import xavier_normal_

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "conve"
SOURCE = Source("TimDettmers/ConvE", "main.py", "f3c0eb286025410fa5b4c04696c918264163d0ca", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 150 entities, embedding 32 as 4 x 8, 61 epochs, "
                "lr 0.01)"),
        Variant(
            "test_triples_in_train",
            "the training file is written from every split (train + valid + test, wrangle_KG's label_graph, the "
            "e1rel_to_e2_full file) instead of the train split alone: the model is fitted on the triples it is "
            "then ranked on",
            (C.DATA_LEAKAGE,),
            ("https://github.com/deepakn97/relationPrediction/issues/28",
             "https://github.com/deepakn97/relationPrediction/issues/17",
             "https://github.com/zjunlp/Relphormer/issues/20"),
            Measure("test_mrr", "filtered test MRR at least 0.08 above the healthy run's (an inflated test score): "
                    "0.497/0.509/0.562 buggy against 0.371/0.329/0.357 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < healthy + 0.08),
        ),
        Variant(
            "sigmoid_before_bce_logits",
            "model.loss = BCEWithLogitsLoss() (swapped in for BCELoss's numerical stability) while forward still "
            "ends in torch.sigmoid: the loss squashes the scores a second time and sees probabilities in "
            "(0.5, 0.73) against targets near 0",
            (C.DOUBLE_SOFTMAX, C.WRONG_LOSS),
            ("https://github.com/pykeen/pykeen/issues/87",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_mrr", "filtered test MRR at least 0.15 below the healthy run's: 0.052/0.042/0.038 "
                    "buggy against 0.371/0.329/0.357 healthy on seeds 0-2 (the training loss stays at 0.693)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

ARGS = {"batch_size": 128, "test_batch_size": 128, "epochs": 61, "lr": 0.01, "l2": 0.0, "embedding_dim": 32,
        "embedding_shape1": 4, "hidden_drop": 0.3, "input_drop": 0.2, "feat_drop": 0.2, "use_bias": False,
        "label_smoothing": 0.1, "hidden_size": 1152}  # fmt: skip
ENTITIES, RELATIONS, LATENT, TRIPLES = 150, 6, 6, 2400


# --------------------------------------------------------------------------- the knowledge graph (the data)


def knowledge_graph(seed: int) -> tuple[list[tuple[str, str, str]], ...]:
    """(train, valid, test) lists of (e1, rel, e2) names: each relation a translation of latent
    entity positions, the tail one of the 3 entities nearest head + translation."""
    rng = np.random.default_rng(seed + 17)
    pos = rng.normal(size=(ENTITIES, LATENT))
    shift = rng.normal(scale=1.2, size=(RELATIONS, LATENT))
    triples: set[tuple[int, int, int]] = set()
    while len(triples) < TRIPLES:
        h, r = int(rng.integers(ENTITIES)), int(rng.integers(RELATIONS))
        dist = np.linalg.norm(pos - (pos[h] + shift[r]), axis=1)
        dist[h] = np.inf
        triples.add((h, r, int(rng.choice(np.argsort(dist)[:3]))))
    ordered = sorted(triples)
    named = [(f"e{ordered[i][0]}", f"rel{ordered[i][1]}", f"e{ordered[i][2]}") for i in rng.permutation(len(ordered))]
    n_train, n_valid = int(0.8 * len(named)), int(0.1 * len(named))
    train = named[:n_train]
    seen = {e for h, _, t in train for e in (h, t)}
    rest = [x for x in named[n_train:] if x[0] in seen and x[2] in seen]
    return train, rest[:n_valid], rest[n_valid:]


# --------------------------------------------------------------------------- wrangle_KG.py + the preprocessing


def wrangle(train, valid, test, leak: bool = False):
    """The three JSON files wrangle_KG.py writes, as id arrays: the training keys with their
    answer sets, and the dev / test ranking lines with both filters."""
    files = {"train.txt": train, "valid.txt": valid, "test.txt": test}
    label_graph: dict[tuple[str, str], set[str]] = {}
    train_graph: dict[str, dict[tuple[str, str], set[str]]] = {p: {} for p in files}
    for p, triples in files.items():
        for e1, rel, e2 in triples:
            rel_reverse = rel + "_reverse"
            label_graph.setdefault((e1, rel), set()).add(e2)
            label_graph.setdefault((e2, rel_reverse), set()).add(e1)
            train_graph[p].setdefault((e1, rel), set()).add(e2)
            train_graph[p].setdefault((e2, rel_reverse), set()).add(e1)
    # the vocabulary (index 0 reserved, as spodernet's vocab does), over the full file
    entities = sorted({e for (e1, _), es in label_graph.items() for e in (e1, *es)}, key=lambda s: int(s[1:]))
    relations = sorted({r for _, r in label_graph}, key=lambda s: (s.endswith("_reverse"), s))
    ent_id = {e: i + 1 for i, e in enumerate(entities)}
    rel_id = {r: i + 1 for i, r in enumerate(relations)}

    graph = label_graph if leak else train_graph["train.txt"]  # the bug: e1rel_to_e2_full as the training file
    keys = sorted(graph, key=lambda k: (int(k[0][1:]), k[1]))
    train_e1 = torch.tensor([[ent_id[e1]] for e1, _ in keys])
    train_rel = torch.tensor([[rel_id[r]] for _, r in keys])
    train_e2 = [[ent_id[e] for e in sorted(graph[k])] for k in keys]

    def ranking(cases):
        lines = []
        for e1, rel, e2 in cases:
            rev = rel + "_reverse"
            lines.append((ent_id[e1], rel_id[rel], rel_id[rev], ent_id[e2],
                          [ent_id[e] for e in label_graph[(e1, rel)]], [ent_id[e] for e in label_graph[(e2, rev)]]))
        return lines

    return (train_e1, train_rel, train_e2), ranking(valid), ranking(test), len(ent_id) + 1, len(rel_id) + 1


class StreamBatcher:
    """The training batcher: shuffled keys each epoch, ``e2_multi1_binary`` built per batch."""

    def __init__(self, data, batch_size: int, num_entities: int, generator: torch.Generator) -> None:
        self.e1, self.rel, self.e2 = data
        self.batch_size, self.num_entities, self.generator = batch_size, num_entities, generator

    def __len__(self) -> int:
        return (len(self.e1) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        order = torch.randperm(len(self.e1), generator=self.generator)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            binary = torch.zeros(len(idx), self.num_entities)  # TargetIdx2MultiTarget
            for row, i in enumerate(idx.tolist()):
                binary[row, self.e2[i]] = 1.0
            yield {"e1": self.e1[idx], "rel": self.rel[idx], "e2_multi1_binary": binary}


def rank_batches(lines, batch_size: int, num_entities: int):
    """The dev / test ranking batcher (``randomize=False``), with the multi-hot filters."""
    for start in range(0, len(lines), batch_size):
        chunk = lines[start : start + batch_size]
        multi1 = torch.zeros(len(chunk), num_entities)
        multi2 = torch.zeros(len(chunk), num_entities)
        for row, line in enumerate(chunk):
            multi1[row, line[4]] = 1.0
            multi2[row, line[5]] = 1.0
        yield {"e1": torch.tensor([[c[0]] for c in chunk]), "rel": torch.tensor([[c[1]] for c in chunk]),
               "rel_eval": torch.tensor([[c[2]] for c in chunk]), "e2": torch.tensor([[c[3]] for c in chunk]),
               "e2_multi1": multi1, "e2_multi2": multi2}  # fmt: skip


# --------------------------------------------------------------------------- model.py


class ConvE(torch.nn.Module):
    def __init__(self, args, num_entities, num_relations, bce_with_logits: bool = False):
        super().__init__()
        self.emb_e = torch.nn.Embedding(num_entities, args["embedding_dim"], padding_idx=0)
        self.emb_rel = torch.nn.Embedding(num_relations, args["embedding_dim"], padding_idx=0)
        self.inp_drop = torch.nn.Dropout(args["input_drop"])
        self.hidden_drop = torch.nn.Dropout(args["hidden_drop"])
        self.feature_map_drop = torch.nn.Dropout2d(args["feat_drop"])
        self.loss = torch.nn.BCEWithLogitsLoss() if bce_with_logits else torch.nn.BCELoss()  # the bug: with logits
        self.emb_dim1 = args["embedding_shape1"]
        self.emb_dim2 = args["embedding_dim"] // self.emb_dim1
        self.conv1 = torch.nn.Conv2d(1, 32, (3, 3), 1, 0, bias=args["use_bias"])
        self.bn0 = torch.nn.BatchNorm2d(1)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.bn2 = torch.nn.BatchNorm1d(args["embedding_dim"])
        self.register_parameter("b", Parameter(torch.zeros(num_entities)))
        self.fc = torch.nn.Linear(args["hidden_size"], args["embedding_dim"])

    def init(self):
        xavier_normal_(self.emb_e.weight.data)
        xavier_normal_(self.emb_rel.weight.data)

    def forward(self, e1, rel):
        e1_embedded = self.emb_e(e1).view(-1, 1, self.emb_dim1, self.emb_dim2)
        rel_embedded = self.emb_rel(rel).view(-1, 1, self.emb_dim1, self.emb_dim2)
        stacked_inputs = torch.cat([e1_embedded, rel_embedded], 2)
        stacked_inputs = self.bn0(stacked_inputs)
        x = self.inp_drop(stacked_inputs)
        x = self.conv1(x)
        x = self.bn1(x)
        x = F.relu(x)
        x = self.feature_map_drop(x)
        x = x.view(x.shape[0], -1)
        x = self.fc(x)
        x = self.hidden_drop(x)
        x = self.bn2(x)
        x = F.relu(x)
        x = torch.mm(x, self.emb_e.weight.transpose(1, 0))
        x += self.b.expand_as(x)
        return torch.sigmoid(x)


# --------------------------------------------------------------------------- evaluation.py


def ranking_and_hits(model, batches) -> dict[str, float]:
    ranks, hits = [], [[] for _ in range(10)]
    for str2var in batches:
        e1, e2, rel, rel_reverse = str2var["e1"], str2var["e2"], str2var["rel"], str2var["rel_eval"]
        e2_multi1, e2_multi2 = str2var["e2_multi1"], str2var["e2_multi2"]
        pred1 = model.forward(e1, rel)
        pred2 = model.forward(e2, rel_reverse)
        for i in range(e1.shape[0]):
            filter1 = e2_multi1[i].nonzero().flatten()  # "these filters contain ALL labels"
            filter2 = e2_multi2[i].nonzero().flatten()
            target_value1 = pred1[i, e2[i, 0].item()].item()
            target_value2 = pred2[i, e1[i, 0].item()].item()
            pred1[i][filter1] = 0.0
            pred2[i][filter2] = 0.0
            pred1[i][e2[i]] = target_value1
            pred2[i][e1[i]] = target_value2
        _, argsort1 = torch.sort(pred1, 1, descending=True)
        _, argsort2 = torch.sort(pred2, 1, descending=True)
        argsort1, argsort2 = argsort1.numpy(), argsort2.numpy()
        for i in range(e1.shape[0]):
            rank1 = np.where(argsort1[i] == e2[i, 0].item())[0][0]
            rank2 = np.where(argsort2[i] == e1[i, 0].item())[0][0]
            ranks += [rank1 + 1, rank2 + 1]
            for level in range(10):
                hits[level] += [1.0 if rank1 <= level else 0.0, 1.0 if rank2 <= level else 0.0]
    return {"mrr": float(np.mean(1.0 / np.array(ranks))), "mr": float(np.mean(ranks)), "hits1": float(np.mean(hits[0])),
            "hits3": float(np.mean(hits[2])), "hits10": float(np.mean(hits[9]))}  # fmt: skip


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(17 + seed)  # --seed 17; the runner's seed is an offset
    train_triples, valid_triples, test_triples = knowledge_graph(seed)
    train_data, dev_lines, test_lines, num_entities, num_relations = wrangle(
        train_triples, valid_triples, test_triples, leak=variant == "test_triples_in_train")
    train_batcher = StreamBatcher(train_data, ARGS["batch_size"], num_entities,
                                  torch.Generator().manual_seed(seed))  # fmt: skip

    model = ConvE(ARGS, num_entities, num_relations, bce_with_logits=variant == "sigmoid_before_bce_logits")
    model.init()
    opt = torch.optim.Adam(model.parameters(), lr=ARGS["lr"], weight_decay=ARGS["l2"])

    def smoothed(binary: torch.Tensor) -> torch.Tensor:
        return ((1.0 - ARGS["label_smoothing"]) * binary) + (1.0 / binary.size(1))

    first = next(iter(StreamBatcher(train_data, ARGS["batch_size"], num_entities,
                                    torch.Generator().manual_seed(seed))))  # fmt: skip
    probe_batch = ((first["e1"], first["rel"]), smoothed(first["e2_multi1_binary"].float()))
    nx.preflight(model, probe_batch, model.loss, optimizer=opt)
    mon = nx.monitor(model, opt, every=10)

    losses: list[float] = []
    dev, test = {}, {}
    for epoch in range(ARGS["epochs"]):
        model.train()
        epoch_losses = []
        for str2var in train_batcher:
            opt.zero_grad()
            e1, rel = str2var["e1"], str2var["rel"]
            e2_multi = smoothed(str2var["e2_multi1_binary"].float())  # label smoothing
            pred = model.forward(e1, rel)
            loss = model.loss(pred, e2_multi)
            loss.backward()
            opt.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())
        losses.append(float(np.mean(epoch_losses)))

        model.eval()
        with torch.no_grad():
            if epoch % 5 == 0 and epoch > 0:
                dev = ranking_and_hits(model, rank_batches(dev_lines, ARGS["test_batch_size"], num_entities))
                test = ranking_and_hits(model, rank_batches(test_lines, ARGS["test_batch_size"], num_entities))

    nx.finish(mon, model, probe_batch, model.loss, optimizer=opt)
    return {"test_mrr": test["mrr"], "test_hits10": test["hits10"], "dev_mrr": dev["mrr"],
            "final_train_loss": losses[-1], "first_train_loss": losses[0]}  # fmt: skip
