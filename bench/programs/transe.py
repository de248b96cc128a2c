"""Port of mklimasz/TransE-PyTorch: TransE knowledge-graph embeddings trained with a margin
ranking loss on corrupted triples, SGD, raw Hits@k / MRR link prediction.

Source: github.com/mklimasz/TransE-PyTorch, ``model.py``, ``main.py``, ``metric.py`` and
``data.py`` at commit 80e2545d0c7ba689985a1d9a34916fa5b96f57d4 (the repository's HEAD; no
licence stated: the repository has no LICENSE file). Written anew from the facts of those
files; no code copied.

Kept: ``TransE``: ``entities_emb`` and ``relations_emb``, each ``nn.Embedding(count + 1,
dim, padding_idx=count)`` (the extra row for out-of-vocabulary ids), initialised uniform in
+-6/sqrt(dim), the relation rows (all but the last) divided once by their L1 norm; the
criterion ``nn.MarginRankingLoss(margin, reduction='none')`` with target ``-1`` (loss
``max(0, d_pos - d_neg + margin)``); ``forward(positive, negative)`` first L2-normalises
the entity rows (all but the last) in place through ``weight.data``, then returns ``(loss,
d_pos, d_neg)`` with ``d = ||h + r - t||_p`` (``norm`` 1, the flag's default);
``predict`` = the distance. ``main.py``: ``torch.random.manual_seed``; the ids by
frequency of appearance in the training file (``create_mappings``); the unshuffled
``DataLoader(train_set, batch_size)`` (``shuffle`` left at False, as published);
``optim.SGD(lr=0.01)``; per batch the positives stacked ``(h, r, t)``, a coin per triple
(``randint(high=2)``) choosing whether the head or the tail is replaced by a uniformly
drawn entity, ``zero_grad``, ``loss.mean().backward()``, ``step``; the share of
loss-impacting samples per epoch; every ``validation_freq`` epochs ``test`` on the
validation split (every entity tried as tail and as head, ``hit_at_k`` by ``topk(k,
largest=False)``, ``mrr`` by ``argsort``, raw: other true triples are not filtered),
Hits@10 as the score and the best model kept (the checkpoint, here a ``state_dict`` copy);
at the end the best checkpoint ``test``-ed on the test split (Hits@1/3/10, MRR, x100).
Shrunk: a synthetic knowledge graph instead of FB15k / the repository's ``synth_data``:
150 entities placed at random points of R^6, 6 relations each a random translation, and
for each (head, relation) drawn the tail among the 3 entities nearest ``head +
translation`` (so TransE's assumption holds up to noise); 1,500 distinct triples, 80/10/10
train/valid/test, test and valid triples whose entities never occur in training dropped;
``vector_length`` 20 instead of 50; 100 epochs instead of 2,000, validation every 10
(kept); batch 128 (kept); lr 1.0 instead of 0.01 (1,000 steps instead of millions, and
the loop backpropagates the batch mean, so each triple moves its rows by lr/128: at 0.05
the healthy run's filtered Hits@10 is 10 on seed 0, at 1.0 it is 51).
No tensorboard, no checkpoint files, no absl flags.
Measure only (not in the program): the filtered Hits@10 and mean rank of the test triples
(the other known true triples removed from the candidates, both directions) for the
best checkpoint.

nndx, as the author would add it: the model returns its per-triple losses, so ``loss_fn``
is ``lambda output, _: output[0].mean()`` (what the loop backpropagates) and a batch is
``((positive_triples, negative_triples), None)``; a preflight ``nndx.probe`` on the first
batch with its negatives, with the optimizer; ``nndx.Monitor(model, optimizer)`` around
the epochs, every batch's mean loss logged (the tensorboard ``Loss/train`` scalar); the
validation Hits@10 is not a loss and is not logged; then ``nndx.probe(...,
monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import torch
from torch import nn, optim
from torch.utils import data as torch_data

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "transe"
SOURCE = Source("mklimasz/TransE-PyTorch", "main.py", "80e2545d0c7ba689985a1d9a34916fa5b96f57d4",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 150 entities, dim 20, 100 epochs)"),
        Variant(
            "margin_target_flipped",
            "MarginRankingLoss called with target +1 instead of -1: the loss max(0, d_neg - d_pos + margin) "
            "pushes true triples apart and pulls the corrupted ones together; the loss still falls to ~0",
            (C.WRONG_LOSS,),
            ("https://github.com/deepakn97/relationPrediction/issues/21",
             "https://github.com/amzn/ss-aga-kgc/issues/9",
             "https://github.com/seathiefwang/RankPose/issues/4"),
            Measure("filtered_hits10", "filtered test Hits@10 at least 20 points below the healthy run's: 4.7 "
                    "against 51.3 healthy on seed 0 (the training loss still falls, to 0.28)",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
        Variant(
            "entities_from_weight_data",
            "the distance reads the (normalised) entity vectors through entities_emb.weight.data[ids] instead of "
            "entities_emb(ids): the entity table is outside the graph, gets no gradient and never moves; only "
            "the relations train",
            (C.DETACHED_GRAPH, C.FROZEN_PARAMETERS),
            ("https://github.com/zulihit/TransE/issues/2",
             "https://github.com/INK-USC/RE-Net/issues/6",
             "https://github.com/zai-org/ChatGLM3/issues/1117"),
            Measure("filtered_hits10", "filtered test Hits@10 at least 20 points below the healthy run's: 16.7 "
                    "against 51.3 healthy on seed 0 (mean filtered rank 57 against 19)",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
    )
}

FLAGS = {"lr": 1.0, "batch_size": 128, "validation_batch_size": 64, "vector_length": 20, "margin": 1.0, "norm": 1,
         "epochs": 100, "validation_freq": 10}  # fmt: skip
ENTITIES, RELATIONS, LATENT, TRIPLES = 150, 6, 6, 1500


# --------------------------------------------------------------------------- the knowledge graph (the data)


def knowledge_graph(seed: int) -> tuple[list[tuple[str, str, str]], ...]:
    """(train, valid, test) lists of (head, relation, tail) names: each relation a translation
    of latent entity positions, the tail one of the 3 entities nearest head + translation."""
    rng = np.random.default_rng(seed + 11)
    pos = rng.normal(size=(ENTITIES, LATENT))
    shift = rng.normal(scale=1.2, size=(RELATIONS, LATENT))
    triples: set[tuple[int, int, int]] = set()
    while len(triples) < TRIPLES:
        h, r = int(rng.integers(ENTITIES)), int(rng.integers(RELATIONS))
        dist = np.linalg.norm(pos + 0 - (pos[h] + shift[r]), axis=1)
        dist[h] = np.inf
        t = int(rng.choice(np.argsort(dist)[:3]))
        triples.add((h, r, t))
    ordered = sorted(triples)
    order = rng.permutation(len(ordered))
    named = [(f"/m/e{ordered[i][0]}", f"/rel{ordered[i][1]}", f"/m/e{ordered[i][2]}") for i in order]
    n_train, n_valid = int(0.8 * len(named)), int(0.1 * len(named))
    train = named[:n_train]
    seen = {e for h, _, t in train for e in (h, t)}
    keep = [x for x in named[n_train:] if x[0] in seen and x[2] in seen]
    return train, keep[:n_valid], keep[n_valid:]


# --------------------------------------------------------------------------- data.py


def create_mappings(train: list[tuple[str, str, str]]) -> tuple[dict[str, int], dict[str, int]]:
    entity_counter, relation_counter = Counter(), Counter()
    for head, relation, tail in train:
        entity_counter.update([head, tail])
        relation_counter.update([relation])
    entity2id = {mid: idx for idx, (mid, _) in enumerate(entity_counter.most_common())}
    relation2id = {rel: idx for idx, (rel, _) in enumerate(relation_counter.most_common())}
    return entity2id, relation2id


class KGDataset(torch_data.Dataset):
    """``FB15KDataset``: (head id, relation id, tail id), unknown names to the padding id."""

    def __init__(self, triples, entity2id, relation2id):
        self.entity2id, self.relation2id, self.data = entity2id, relation2id, triples

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        head, relation, tail = self.data[index]
        return (self.entity2id.get(head, len(self.entity2id)), self.relation2id.get(relation, len(self.relation2id)),
                self.entity2id.get(tail, len(self.entity2id)))  # fmt: skip


# --------------------------------------------------------------------------- model.py


class TransE(nn.Module):
    def __init__(self, entity_count, relation_count, norm=1, dim=100, margin=1.0, detach_entities=False):
        super().__init__()
        self.entity_count, self.relation_count = entity_count, relation_count
        self.norm, self.dim = norm, dim
        self.entities_emb = self._init_entity_emb()
        self.relations_emb = self._init_relation_emb()
        self.criterion = nn.MarginRankingLoss(margin=margin, reduction="none")
        self.target = -1
        self.detach_entities = detach_entities  # the bug: entity vectors read through weight.data

    def _init_entity_emb(self):
        emb = nn.Embedding(self.entity_count + 1, self.dim, padding_idx=self.entity_count)
        bound = 6 / np.sqrt(self.dim)
        emb.weight.data.uniform_(-bound, bound)
        return emb

    def _init_relation_emb(self):
        emb = nn.Embedding(self.relation_count + 1, self.dim, padding_idx=self.relation_count)
        bound = 6 / np.sqrt(self.dim)
        emb.weight.data.uniform_(-bound, bound)
        emb.weight.data[:-1, :].div_(emb.weight.data[:-1, :].norm(p=1, dim=1, keepdim=True))  # not the OOV row
        return emb

    def forward(self, positive_triplets, negative_triplets):
        self.entities_emb.weight.data[:-1, :].div_(self.entities_emb.weight.data[:-1, :].norm(p=2, dim=1, keepdim=True))
        assert positive_triplets.size()[1] == 3
        positive_distances = self._distance(positive_triplets)
        assert negative_triplets.size()[1] == 3
        negative_distances = self._distance(negative_triplets)
        return self.loss(positive_distances, negative_distances), positive_distances, negative_distances

    def predict(self, triplets):
        return self._distance(triplets)

    def loss(self, positive_distances, negative_distances):
        target = torch.tensor([self.target], dtype=torch.long)
        return self.criterion(positive_distances, negative_distances, target)

    def _entities(self, ids):
        if self.detach_entities:
            return self.entities_emb.weight.data[ids]
        return self.entities_emb(ids)

    def _distance(self, triplets):
        assert triplets.size()[1] == 3
        heads, relations, tails = triplets[:, 0], triplets[:, 1], triplets[:, 2]
        return (self._entities(heads) + self.relations_emb(relations) - self._entities(tails)).norm(p=self.norm, dim=1)


# --------------------------------------------------------------------------- metric.py / main.py's test


def hit_at_k(predictions, ground_truth_idx, k=10):
    _, indices = predictions.topk(k=k, largest=False)
    return torch.where(indices == ground_truth_idx, torch.tensor([1]), torch.tensor([0])).sum().item()


def mrr(predictions, ground_truth_idx):
    indices = predictions.argsort()
    return (1.0 / (indices == ground_truth_idx).nonzero()[:, 1].float().add(1.0)).sum().item()


@torch.no_grad()
def test(model, data_generator, entities_count):
    examples, h1, h3, h10, rr = 0.0, 0.0, 0.0, 0.0, 0.0
    entity_ids = torch.arange(end=entities_count).unsqueeze(0)
    for head, relation, tail in data_generator:
        n = head.size()[0]
        all_entities = entity_ids.repeat(n, 1)
        heads = head.reshape(-1, 1).repeat(1, all_entities.size()[1])
        relations = relation.reshape(-1, 1).repeat(1, all_entities.size()[1])
        tails = tail.reshape(-1, 1).repeat(1, all_entities.size()[1])
        triplets = torch.stack((heads, relations, all_entities), dim=2).reshape(-1, 3)
        tails_predictions = model.predict(triplets).reshape(n, -1)
        triplets = torch.stack((all_entities, relations, tails), dim=2).reshape(-1, 3)
        heads_predictions = model.predict(triplets).reshape(n, -1)
        predictions = torch.cat((tails_predictions, heads_predictions), dim=0)
        ground_truth = torch.cat((tail.reshape(-1, 1), head.reshape(-1, 1)))
        h1 += hit_at_k(predictions, ground_truth, k=1)
        h3 += hit_at_k(predictions, ground_truth, k=3)
        h10 += hit_at_k(predictions, ground_truth, k=10)
        rr += mrr(predictions, ground_truth)
        examples += predictions.size()[0]
    return h1 / examples * 100, h3 / examples * 100, h10 / examples * 100, rr / examples * 100


@torch.no_grad()
def filtered_ranks(model, test_ids: list[tuple[int, int, int]], known: set[tuple[int, int, int]], entities_count: int):
    """Measure only: the filtered rank of each test triple's tail and head among all entities."""
    ranks = []
    candidates = torch.arange(entities_count)
    for h, r, t in test_ids:
        for side in ("tail", "head"):
            if side == "tail":
                trip = torch.stack([torch.full_like(candidates, h), torch.full_like(candidates, r), candidates], 1)
                truth, others = t, {e for e in range(entities_count) if (h, r, e) in known and e != t}
            else:
                trip = torch.stack([candidates, torch.full_like(candidates, r), torch.full_like(candidates, t)], 1)
                truth, others = h, {e for e in range(entities_count) if (e, r, t) in known and e != h}
            d = model.predict(trip)
            mask = torch.ones(entities_count, dtype=torch.bool)
            mask[list(others)] = False
            ranks.append(int((d[mask] < d[truth]).sum().item()) + 1)
    return np.array(ranks)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.random.manual_seed(1234 + seed)
    train_triples, valid_triples, test_triples = knowledge_graph(seed)
    entity2id, relation2id = create_mappings(train_triples)
    train_set = KGDataset(train_triples, entity2id, relation2id)
    train_generator = torch_data.DataLoader(train_set, batch_size=FLAGS["batch_size"])
    validation_generator = torch_data.DataLoader(KGDataset(valid_triples, entity2id, relation2id),
                                                 batch_size=FLAGS["validation_batch_size"])  # fmt: skip
    test_set = KGDataset(test_triples, entity2id, relation2id)
    test_generator = torch_data.DataLoader(test_set, batch_size=FLAGS["validation_batch_size"])

    model = TransE(len(entity2id), len(relation2id), norm=FLAGS["norm"], dim=FLAGS["vector_length"],
                   margin=FLAGS["margin"], detach_entities=variant == "entities_from_weight_data")  # fmt: skip
    if variant == "margin_target_flipped":
        model.target = 1
    optimizer = optim.SGD(model.parameters(), lr=FLAGS["lr"])

    def loss_fn(output, _target):
        return output[0].mean()  # the loop's loss.mean()

    best_score, best_state = 0.0, copy.deepcopy(model.state_dict())
    probe_batch, mon = None, None
    epoch_losses, impacting = [], 0.0
    for epoch_id in range(1, FLAGS["epochs"] + 1):
        loss_impacting, samples, losses = 0, 0, []
        model.train()
        for local_heads, local_relations, local_tails in train_generator:
            positive_triples = torch.stack((local_heads, local_relations, local_tails), dim=1)
            head_or_tail = torch.randint(high=2, size=local_heads.size())
            random_entities = torch.randint(high=len(entity2id), size=local_heads.size())
            broken_heads = torch.where(head_or_tail == 1, random_entities, local_heads)
            broken_tails = torch.where(head_or_tail == 0, random_entities, local_tails)
            negative_triples = torch.stack((broken_heads, local_relations, broken_tails), dim=1)
            if probe_batch is None:  # the author's preflight, on the first batch and its negatives
                probe_batch = ((positive_triples, negative_triples), None)
                nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
                mon = nx.monitor(model, optimizer, every=5)

            optimizer.zero_grad()
            loss, _pd, _nd = model(positive_triples, negative_triples)
            loss.mean().backward()
            mon.log(loss.mean())
            losses.append(loss.mean().item())
            loss = loss.data.cpu()
            loss_impacting += loss.nonzero().size()[0]
            samples += loss.size()[0]
            optimizer.step()
        epoch_losses.append(float(np.mean(losses)))
        impacting = loss_impacting / samples * 100

        if epoch_id % FLAGS["validation_freq"] == 0:
            model.eval()
            _, _, hits_at_10, _ = test(model, validation_generator, len(entity2id))
            if hits_at_10 > best_score:
                best_score, best_state = hits_at_10, copy.deepcopy(model.state_dict())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    model.load_state_dict(best_state)  # "Testing the best checkpoint on test dataset"
    model.eval()
    h1, h3, h10, mrr_score = test(model, test_generator, len(entity2id))
    known = {tuple(train_set[i]) for i in range(len(train_set))}
    known |= {(entity2id[h], relation2id[r], entity2id[t]) for h, r, t in valid_triples + test_triples}
    ranks = filtered_ranks(model, [test_set[i] for i in range(len(test_set))], known, len(entity2id))
    return {
        "hits1": h1, "hits3": h3, "hits10": h10, "mrr": mrr_score, "best_valid_hits10": best_score,
        "filtered_hits10": float((ranks <= 10).mean() * 100), "filtered_mean_rank": float(ranks.mean()),
        "final_loss": epoch_losses[-1], "loss_impacting_pct": impacting,
    }  # fmt: skip
