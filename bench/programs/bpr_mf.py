"""Port of guoyang9/BPR-pytorch: Bayesian personalised ranking with matrix factorisation.

Source: github.com/guoyang9/BPR-pytorch, ``main.py``, ``model.py``, ``data_utils.py``,
``evaluate.py`` and ``config.py`` at commit a21fbcde6ab85f5215fe0db9bdb9471116e1a667
(no licence stated: the repository has no LICENSE file). Written anew from the facts of
those files; no code copied.

Kept: ``BPR``: ``embed_user`` and ``embed_item`` (``nn.Embedding(n, factor_num)``, both
``normal_(std=0.01)``), ``forward(user, item_i, item_j)`` returning the two scores
``(user * item_i).sum(dim=-1)`` and ``(user * item_j).sum(dim=-1)``; ``BPRData``: the
training positives, ``ng_sample()`` at the start of every epoch drawing ``num_ng = 4``
negatives per positive with ``np.random.randint(item_num)``, redrawn while ``(u, j)`` is in
``train_mat`` (a ``scipy.sparse.dok_matrix``), served as ``(user, item_i, item_j)``
triples; the test set served unshuffled in batches of ``test_num_ng + 1`` (the held-out
item first, then its negatives, one user per batch; ``item_j`` a copy of ``item_i``);
``optim.SGD(lr=0.01, weight_decay=lamda=0.001)`` (the L2 on the embeddings is SGD's weight
decay); the loop: ``model.train()``, ``ng_sample()``, per batch ``model.zero_grad()``,
forward, ``loss = -(prediction_i - prediction_j).sigmoid().log().sum()``, ``backward``,
``optimizer.step()``; after each epoch ``model.eval()`` and ``evaluate.metrics``
(``torch.topk`` of ``prediction_i``, the items by ``torch.take``, HR@10 and NDCG@10 =
1/log2(rank + 2) of the held-out item, averaged), the best HR/NDCG kept; the shuffled
train loader of ``batch_size = 4096``; ``top_k = 10``.
Shrunk: synthetic implicit feedback instead of ml-1m.train.rating / ml-1m.test.negative:
200 users and 300 items with 6-d latent tastes and a popularity term, 20 interactions per
user, the last one held out (leave-one-out, as those files are made), 99 test negatives
kept; ``factor_num`` 16 instead of 32; 30 epochs instead of 50; lr 0.05 instead of 0.01
(4 batches an epoch instead of ~1,200 on MovieLens: at 0.01 std-0.01 embeddings barely
leave the origin in 120 steps); ``num_workers=0``; no CUDA, no tensorboardX, no saving.
Measure only (not in the program): nothing beyond its own HR@10 / NDCG@10 and the loss.

nndx, as the author would add it: the loss written as a function of the model's
``(prediction_i, prediction_j)`` (the batch has no target: ``None``), a preflight
``nndx.probe`` on the first training batch (drawn as the shuffled loader draws one) with
the optimizer (no ``data``: the program's triples carry no label to pass as ``y``); ``nndx.Monitor(model, optimizer)`` around the epochs, each batch's loss
logged (the author's commented-out ``writer.add_scalar('data/loss', ...)``); the program
has no validation loss (HR/NDCG only), so none is logged; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.utils.data as data
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bpr_mf"
SOURCE = Source("guoyang9/BPR-pytorch", "main.py", "a21fbcde6ab85f5215fe0db9bdb9471116e1a667",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "sum_before_sigmoid",
            "loss = -(prediction_i - prediction_j).sum().sigmoid().log(): the batch summed before the sigmoid, so "
            "the loss ranks one total of positive scores against one total of negative scores and reaches ~0 "
            "as soon as that single margin is large",
            (C.WRONG_LOSS,),
            ("https://github.com/tanatosuu/GDE/issues/3", "https://github.com/tanatosuu/GDE/pull/2",
             "https://github.com/pyg-team/pytorch_geometric/issues/2104"),
            Measure("best_hr", "best HR@10 at least 0.1 below the healthy run's: 0.27 against 0.575 healthy on seed 0 "
                    "(the loss falls to 0.002)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "test_item_in_train",
            "the leave-one-out split keeps each user's held-out item in train_data (and train_mat): the model "
            "is trained on the very interactions HR@10 is measured on",
            (C.DATA_LEAKAGE,),
            ("https://github.com/FeiSun/BERT4Rec/issues/12", "https://github.com/Zhangcx19/IJCAI-23-PFedRec/issues/3",
             "https://github.com/sunshinelium/Bi-TGCF/issues/2"),
            Measure("best_hr", "best HR@10 at least 0.15 above the healthy run's (an inflated test score): 1.0 "
                    "against 0.575 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
    )
}

ARGS = {"lr": 0.05, "lamda": 0.001, "batch_size": 4096, "epochs": 30, "top_k": 10, "factor_num": 16, "num_ng": 4,
        "test_num_ng": 99}  # fmt: skip
USERS, ITEMS, PER_USER, LATENT = 200, 300, 20, 6


# --------------------------------------------------------------------------- data_utils


def load_all(seed: int, leak: bool = False):
    """What ``load_all`` reads from the rating files, made up: users with a taste vector pick
    items whose traits match it; each user's last pick is held out, with ``test_num_ng`` items
    the user never picked. (train_data, test_data, user_num, item_num, train_mat)."""
    rng = np.random.default_rng(seed + 7)
    taste, trait = rng.normal(size=(USERS, LATENT)), rng.normal(size=(ITEMS, LATENT))
    popularity = rng.normal(scale=0.5, size=ITEMS)
    train_data, test_data = [], []
    for u in range(USERS):
        logits = 1.2 * trait @ taste[u] + popularity
        p = np.exp(logits - logits.max())
        picked = rng.choice(ITEMS, size=PER_USER, replace=False, p=p / p.sum())
        kept = picked if leak else picked[:-1]  # the bug: the held-out item stays in train
        train_data += [[u, int(i)] for i in kept]
        unseen = np.setdiff1d(np.arange(ITEMS), picked)
        test_data.append([u, int(picked[-1])])
        test_data += [[u, int(i)] for i in rng.choice(unseen, size=ARGS["test_num_ng"], replace=False)]
    train_mat = sp.dok_matrix((USERS, ITEMS), dtype=np.float32)
    for u, i in train_data:
        train_mat[u, i] = 1.0
    return train_data, test_data, USERS, ITEMS, train_mat


class BPRData(data.Dataset):
    def __init__(self, features, num_item, train_mat=None, num_ng=0, is_training=None):
        super().__init__()
        self.features = features
        self.num_item = num_item
        self.train_mat = train_mat
        self.num_ng = num_ng
        self.is_training = is_training

    def ng_sample(self):
        assert self.is_training, "no need to sampling when testing"
        self.features_fill = []
        for u, i in self.features:
            for _ in range(self.num_ng):
                j = np.random.randint(self.num_item)
                while (u, j) in self.train_mat:
                    j = np.random.randint(self.num_item)
                self.features_fill.append([u, i, j])

    def __len__(self):
        return self.num_ng * len(self.features) if self.is_training else len(self.features)

    def __getitem__(self, idx):
        features = self.features_fill if self.is_training else self.features
        user, item_i = features[idx][0], features[idx][1]
        item_j = features[idx][2] if self.is_training else features[idx][1]
        return user, item_i, item_j


# --------------------------------------------------------------------------- model


class BPR(nn.Module):
    def __init__(self, user_num, item_num, factor_num):
        super().__init__()
        self.embed_user = nn.Embedding(user_num, factor_num)
        self.embed_item = nn.Embedding(item_num, factor_num)
        nn.init.normal_(self.embed_user.weight, std=0.01)
        nn.init.normal_(self.embed_item.weight, std=0.01)

    def forward(self, user, item_i, item_j):
        user = self.embed_user(user)
        item_i = self.embed_item(item_i)
        item_j = self.embed_item(item_j)
        prediction_i = (user * item_i).sum(dim=-1)
        prediction_j = (user * item_j).sum(dim=-1)
        return prediction_i, prediction_j


def make_loss(variant: str):
    """main.py's loss as a function of the model's output (the batch has no target)."""

    def bpr_loss(output, _target=None):
        prediction_i, prediction_j = output
        if variant == "sum_before_sigmoid":  # the bug: the batch reduced before the sigmoid
            return -(prediction_i - prediction_j).sum().sigmoid().log()
        return -(prediction_i - prediction_j).sigmoid().log().sum()

    return bpr_loss


# --------------------------------------------------------------------------- evaluate


def hit(gt_item, pred_items):
    return 1 if gt_item in pred_items else 0


def ndcg(gt_item, pred_items):
    if gt_item in pred_items:
        return np.reciprocal(np.log2(pred_items.index(gt_item) + 2))
    return 0


def metrics(model, test_loader, top_k):
    HR, NDCG = [], []
    for user, item_i, item_j in test_loader:
        prediction_i, _prediction_j = model(user, item_i, item_j)
        _, indices = torch.topk(prediction_i, top_k)
        recommends = torch.take(item_i, indices).numpy().tolist()
        gt_item = item_i[0].item()
        HR.append(hit(gt_item, recommends))
        NDCG.append(ndcg(gt_item, recommends))
    return np.mean(HR), np.mean(NDCG)


# --------------------------------------------------------------------------- main


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_data, test_data, user_num, item_num, train_mat = load_all(seed, leak=variant == "test_item_in_train")
    train_dataset = BPRData(train_data, item_num, train_mat, ARGS["num_ng"], True)
    test_dataset = BPRData(test_data, item_num, train_mat, 0, False)
    train_loader = data.DataLoader(train_dataset, batch_size=ARGS["batch_size"], shuffle=True,
                                   generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = data.DataLoader(test_dataset, batch_size=ARGS["test_num_ng"] + 1, shuffle=False, num_workers=0)

    model = BPR(user_num, item_num, ARGS["factor_num"])
    bpr_loss = make_loss(variant)
    optimizer = optim.SGD(model.parameters(), lr=ARGS["lr"], weight_decay=ARGS["lamda"])

    # nndx before training: the first epoch's triples (drawn from a saved RNG state so the
    # loop draws the same ones), a batch as the shuffled loader serves it (its own generator)
    np_state = np.random.get_state()
    train_dataset.ng_sample()
    np.random.set_state(np_state)
    triples = torch.tensor(train_dataset.features_fill)
    order = torch.randperm(len(triples), generator=torch.Generator().manual_seed(seed + 1))[: ARGS["batch_size"]]
    first_batch = ((triples[order, 0], triples[order, 1], triples[order, 2]), None)
    nx.preflight(model, first_batch, bpr_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    best_hr, best_ndcg, epoch_losses = 0.0, 0.0, []
    HR = NDCG = 0.0
    for _epoch in range(ARGS["epochs"]):
        model.train()
        train_loader.dataset.ng_sample()
        losses = []
        for user, item_i, item_j in train_loader:
            model.zero_grad()
            prediction_i, prediction_j = model(user, item_i, item_j)
            loss = bpr_loss((prediction_i, prediction_j))
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        epoch_losses.append(float(np.mean(losses)))

        model.eval()
        HR, NDCG = metrics(model, test_loader, ARGS["top_k"])
        if HR > best_hr:
            best_hr, best_ndcg = HR, NDCG

    nx.finish(mon, model, first_batch, bpr_loss, optimizer=optimizer)
    return {"best_hr": float(best_hr), "best_ndcg": float(best_ndcg), "final_hr": float(HR),
            "final_loss": epoch_losses[-1]}  # fmt: skip
