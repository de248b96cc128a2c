"""Port of guoyang9/NCF: neural collaborative filtering (NeuMF) on implicit feedback.

Source: github.com/guoyang9/NCF, ``main.py``, ``model.py``, ``data_utils.py``,
``evaluate.py`` and ``config.py`` at commit 89ff06ffcd2bca6bb773b54925265c208a28d318
(no licence stated: the repository has no LICENSE file). Written anew from the facts of
those files; no code copied.

Kept: ``config.model = 'NeuMF-end'``; ``NCF``: GMF user/item embeddings of
``factor_num``, MLP user/item embeddings of ``factor_num * 2 ** (num_layers - 1)``, an
MLP tower of ``num_layers`` blocks ``Dropout``/``Linear(n, n // 2)``/``ReLU`` as an
``nn.Sequential`` of modules, the GMF product and the MLP output concatenated into one
``predict_layer = Linear(2 * factor_num, 1)``, ``prediction.view(-1)`` returned (a raw
score); ``_init_weight_``: embeddings ``normal_(std=0.01)``, the tower's weights
``xavier_uniform_``, the predict layer ``kaiming_uniform_(a=1, nonlinearity='sigmoid')``,
every Linear bias zeroed; ``NCFData``: the positives plus ``num_ng = 4`` negatives per
positive drawn with ``np.random.randint`` and redrawn while the pair is in ``train_mat``
(a ``scipy.sparse.dok_matrix``), re-sampled by ``ng_sample()`` at the start of every
epoch; the test set as, per user, the held-out positive followed by sampled negatives,
served unshuffled in batches of ``test_num_ng + 1`` (one user per batch);
``nn.BCEWithLogitsLoss()``; ``optim.Adam(lr=0.001)``; the loop ``model.train()``,
``ng_sample()``, per batch ``label.float()``, ``model.zero_grad()`` (on the model, not
the optimizer), forward, loss, ``backward``, ``optimizer.step()``; after each epoch
``model.eval()`` and ``evaluate.metrics``: ``torch.topk`` of the scores, the items taken
with ``torch.take``, HR@k and NDCG@k (1/log2(rank + 2)) of the held-out item, averaged;
the best HR kept.
Shrunk: synthetic implicit feedback instead of MovieLens-1M (ml-1m.train.rating /
test.negative): 64 users and 128 items with latent tastes, 12 interactions per user, the
last one held out (leave-one-out, as the NCF data files are made); 49 test negatives
instead of 99; ``factor_num`` 8 and ``num_layers`` 3 (the README's 32/3); batch size 128
instead of 256; 12 epochs instead of 20; lr 0.005 (0.001 barely moves std-0.01
embeddings in 12 short epochs); ``num_workers=0``; no CUDA, no tensorboard, no saving.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(``((user, item), label)``, drawn as the shuffled loader draws one) with ``loss_function``,
the training pairs (the sampled set the loader serves in the first epoch) and the test
pairs as ``data``; ``nndx.Monitor`` around the epochs, each batch's loss logged (the
author's commented-out ``writer.add_scalar('data/loss', ...)``); the program has no validation loss (HR/NDCG
only), so none is logged; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.utils.data as data
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ncf"
SOURCE = Source("guoyang9/NCF", "main.py", "89ff06ffcd2bca6bb773b54925265c208a28d318",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (NeuMF-end)"),
        Variant(
            "sigmoid_before_bce_logits",
            "return torch.sigmoid(prediction.view(-1)) from NCF.forward while the loss stays BCEWithLogitsLoss: "
            "the scores are squashed twice, the loss sees probabilities in (0.5, 0.73)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/yudi-mars/daisyRec/pull/15", "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/Turoad/lanedet/issues/32"),
            Measure("final_train_loss", "mean training BCE of the last epoch at least 0.1 above the healthy run's "
                    "(0.69 against 0.18/0.20 healthy on seeds 0-1: sigmoid(sigmoid(x)) barely moves)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
        Variant(
            "test_item_in_train",
            "the leave-one-out split keeps each user's held-out test item in train_data (and train_mat): the "
            "model is trained on the very interactions HR@10 is measured on",
            (C.DATA_LEAKAGE,),
            ("https://github.com/FeiSun/BERT4Rec/issues/12", "https://github.com/Zhangcx19/IJCAI-23-PFedRec/issues/3",
             "https://github.com/sunshinelium/Bi-TGCF/issues/2"),
            Measure("best_hr", "best HR@10 at least 0.15 above the healthy run's (an inflated test score)",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
    )
}

ARGS = {"lr": 0.005, "dropout": 0.0, "batch_size": 128, "epochs": 12, "top_k": 10, "factor_num": 8, "num_layers": 3,
        "num_ng": 4, "test_num_ng": 49}  # fmt: skip
USERS, ITEMS, PER_USER = 64, 128, 12


# --------------------------------------------------------------------------- data_utils


def load_all(seed: int, leak: bool = False):
    """What ``load_all`` reads from the rating files, made up: users with a taste vector pick
    items whose traits match it; each user's last pick is held out for the test, with
    ``test_num_ng`` items the user never picked. (train_data, test_data, user_num, item_num,
    train_mat) as the original returns them."""
    rng = np.random.default_rng(seed + 11)
    taste, trait = rng.normal(size=(USERS, 4)), rng.normal(size=(ITEMS, 4))
    popularity = rng.normal(scale=0.5, size=ITEMS)
    train_data, test_data = [], []
    for u in range(USERS):
        logits = 1.5 * trait @ taste[u] + popularity
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


class NCFData(data.Dataset):
    def __init__(self, features, num_item, train_mat=None, num_ng=0, is_training=None):
        super().__init__()
        self.features_ps = features
        self.num_item = num_item
        self.train_mat = train_mat
        self.num_ng = num_ng
        self.is_training = is_training
        self.labels = [0 for _ in range(len(features))]

    def ng_sample(self):
        assert self.is_training, "no need to sampling when testing"
        self.features_ng = []
        for u, _ in self.features_ps:
            for _ in range(self.num_ng):
                j = np.random.randint(self.num_item)
                while (u, j) in self.train_mat:
                    j = np.random.randint(self.num_item)
                self.features_ng.append([u, j])
        self.features_fill = self.features_ps + self.features_ng
        self.labels_fill = [1] * len(self.features_ps) + [0] * len(self.features_ng)

    def __len__(self):
        return (self.num_ng + 1) * len(self.labels)

    def __getitem__(self, idx):
        features = self.features_fill if self.is_training else self.features_ps
        labels = self.labels_fill if self.is_training else self.labels
        return features[idx][0], features[idx][1], labels[idx]


# --------------------------------------------------------------------------- model


class NCF(nn.Module):
    def __init__(self, user_num, item_num, factor_num, num_layers, dropout, model, sigmoid_out: bool = False):
        super().__init__()
        self.dropout = dropout
        self.model = model
        self.sigmoid_out = sigmoid_out
        self.embed_user_GMF = nn.Embedding(user_num, factor_num)
        self.embed_item_GMF = nn.Embedding(item_num, factor_num)
        self.embed_user_MLP = nn.Embedding(user_num, factor_num * (2 ** (num_layers - 1)))
        self.embed_item_MLP = nn.Embedding(item_num, factor_num * (2 ** (num_layers - 1)))

        MLP_modules = []
        for i in range(num_layers):
            input_size = factor_num * (2 ** (num_layers - i))
            MLP_modules += [nn.Dropout(p=self.dropout), nn.Linear(input_size, input_size // 2), nn.ReLU()]
        self.MLP_layers = nn.Sequential(*MLP_modules)

        predict_size = factor_num if self.model in ["MLP", "GMF"] else factor_num * 2
        self.predict_layer = nn.Linear(predict_size, 1)
        self._init_weight_()

    def _init_weight_(self):
        for emb in (self.embed_user_GMF, self.embed_user_MLP, self.embed_item_GMF, self.embed_item_MLP):
            nn.init.normal_(emb.weight, std=0.01)
        for m in self.MLP_layers:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
        nn.init.kaiming_uniform_(self.predict_layer.weight, a=1, nonlinearity="sigmoid")
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.data.zero_()

    def forward(self, user, item):
        if not self.model == "MLP":
            output_GMF = self.embed_user_GMF(user) * self.embed_item_GMF(item)
        if not self.model == "GMF":
            interaction = torch.cat((self.embed_user_MLP(user), self.embed_item_MLP(item)), -1)
            output_MLP = self.MLP_layers(interaction)
        if self.model == "GMF":
            concat = output_GMF
        elif self.model == "MLP":
            concat = output_MLP
        else:
            concat = torch.cat((output_GMF, output_MLP), -1)
        prediction = self.predict_layer(concat)
        if self.sigmoid_out:  # the bug: a probability handed to BCEWithLogitsLoss
            return torch.sigmoid(prediction.view(-1))
        return prediction.view(-1)


# --------------------------------------------------------------------------- evaluate


def hit(gt_item, pred_items):
    return 1 if gt_item in pred_items else 0


def ndcg(gt_item, pred_items):
    if gt_item in pred_items:
        return np.reciprocal(np.log2(pred_items.index(gt_item) + 2))
    return 0


def metrics(model, test_loader, top_k):
    HR, NDCG = [], []
    for user, item, _label in test_loader:
        predictions = model(user, item)
        _, indices = torch.topk(predictions, top_k)
        recommends = torch.take(item, indices).numpy().tolist()
        gt_item = item[0].item()
        HR.append(hit(gt_item, recommends))
        NDCG.append(ndcg(gt_item, recommends))
    return np.mean(HR), np.mean(NDCG)


# --------------------------------------------------------------------------- main


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_data, test_data, user_num, item_num, train_mat = load_all(seed, leak=variant == "test_item_in_train")
    train_dataset = NCFData(train_data, item_num, train_mat, ARGS["num_ng"], True)
    test_dataset = NCFData(test_data, item_num, train_mat, 0, False)
    train_loader = data.DataLoader(train_dataset, batch_size=ARGS["batch_size"], shuffle=True,
                                   generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = data.DataLoader(test_dataset, batch_size=ARGS["test_num_ng"] + 1, shuffle=False, num_workers=0)

    model = NCF(user_num, item_num, ARGS["factor_num"], ARGS["num_layers"], ARGS["dropout"], "NeuMF-end",
                sigmoid_out=variant == "sigmoid_before_bce_logits")  # fmt: skip
    loss_function = nn.BCEWithLogitsLoss()
    optimizer = optim.Adam(model.parameters(), lr=ARGS["lr"])

    # nndx before training: the first epoch's sampled pairs (drawn here, as the loop would,
    # from a saved RNG state so the loop draws the same ones) and the test pairs
    np_state = np.random.get_state()
    train_dataset.ng_sample()
    np.random.set_state(np_state)
    pairs = torch.tensor(train_dataset.features_fill)
    labels = torch.tensor(train_dataset.labels_fill, dtype=torch.float32)
    test_pairs = torch.tensor(test_data)
    test_labels = torch.tensor([1.0 if k % (ARGS["test_num_ng"] + 1) == 0 else 0.0 for k in range(len(test_data))])
    # a batch as the shuffled loader serves it (its own generator: the loop's order is untouched)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed + 1))[: ARGS["batch_size"]]
    first_batch = ((pairs[order, 0], pairs[order, 1]), labels[order])
    splits = (pairs, labels, test_pairs, test_labels)
    nx.preflight(model, first_batch, loss_function, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    best_hr, best_ndcg, epoch_losses = 0.0, 0.0, []
    for _epoch in range(ARGS["epochs"]):
        model.train()  # Enable dropout (if have).
        train_loader.dataset.ng_sample()
        losses = []
        for user, item, label in train_loader:
            label = label.float()
            model.zero_grad()
            prediction = model(user, item)
            loss = loss_function(prediction, label)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        epoch_losses.append(float(np.mean(losses)))

        model.eval()
        HR, NDCG = metrics(model, test_loader, ARGS["top_k"])
        if HR > best_hr:
            best_hr, best_ndcg = HR, NDCG

    nx.finish(mon, model, first_batch, loss_function, optimizer=optimizer, data=splits)
    return {"best_hr": best_hr, "best_ndcg": best_ndcg, "final_hr": HR, "final_train_loss": epoch_losses[-1]}
