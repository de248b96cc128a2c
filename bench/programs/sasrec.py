"""Port of pmixer/SASRec.pytorch: self-attentive sequential recommendation (SASRec) trained
with BCE on the next item against one sampled negative.

Source: github.com/pmixer/SASRec.pytorch, ``python/model.py``, ``python/main.py`` and
``python/utils.py`` at commit fde8a9c08febc2c898dc269b1d98ab762c50d2be (Apache-2.0,
Copyright pmixer). Written anew from the facts of those files; no code copied.

Kept: ``SASRec``: ``item_emb = Embedding(item_num + 1, hidden_units, padding_idx=0)``,
``pos_emb = Embedding(maxlen + 1, hidden_units, padding_idx=0)``, ``emb_dropout``; per
block a LayerNorm (eps 1e-8), ``nn.MultiheadAttention(hidden_units, num_heads,
dropout_rate)`` over time-first tensors with the causal mask ``~tril(ones(T, T))`` (True =
may not attend), a LayerNorm and a ``PointWiseFeedForward`` (two kernel-1 ``Conv1d`` with
ReLU and dropout between, over the transposed sequence); the post-norm path (the default:
``norm_first`` False: ``LN(seqs + MHA(seqs))``, then ``LN(seqs + FFN(seqs))``);
``last_layernorm``; ``log2feats``: item embeddings times ``sqrt(hidden_units)``, positions
``1..T`` zeroed where the item is padding, added, dropout; ``forward`` returning the dot
products of the features with the positive and the negative item embeddings (raw logits;
the ``pos_sigmoid``/``neg_sigmoid`` lines commented out, as in the source); ``predict``:
the last position's feature against the candidate items' embeddings. ``main.py``:
``xavier_normal_`` on every parameter that takes it (1-D ones skipped), the padding rows of
both embeddings zeroed, ``BCEWithLogitsLoss``, ``Adam(lr=0.001, betas=(0.9, 0.98))``,
``num_batch = (len(user_train) - 1) // batch_size + 1`` batches per epoch, per batch
``zero_grad``, the loss on the positions where ``pos != 0`` only (positives against ones
plus negatives against zeros), ``l2_emb`` (0) on the item embeddings, backward, step;
every ``eval_every`` epochs ``model.eval()``, ``evaluate`` (test) and ``evaluate_valid``
then ``model.train()``, best values kept. ``utils.py``: ``data_partition``'s
leave-two-out split (users with fewer than 4 interactions keep all in train), the
sampler's ``sample`` (the user's train sequence right-aligned into ``maxlen``: input item,
next item as positive, a negative drawn by ``random_neq`` outside the user's items),
users shuffled once per pass; ``evaluate``/``evaluate_valid``: the held-out item ranked
against 100 items drawn (with replacement) outside the user's train items, HR@10 and
NDCG@10 (``1 / log2(rank + 2)``) averaged over users.
Shrunk: synthetic interaction logs instead of ml-1m/Beauty/Steam: 256 users, 200 items,
sequences of 12-24 interactions that follow a hidden item-to-item transition structure
(each item has three likely successors, 80% of steps follow one, the rest are random);
``maxlen`` 20 instead of 200, ``hidden_units`` 32 instead of 50, ``batch_size`` 64 instead
of 128, 60 epochs evaluated every 30 instead of 1,000 every 20; lr 0.005 instead of 0.001
(the shrunk run has 240 steps); the ``WarpSampler`` worker processes replaced by the same
sampling function called in-process from its own seeded ``RandomState``; the inputs
converted with ``torch.as_tensor`` (the source's ``torch.LongTensor(ndarray)``, which also
takes the probe's tensors); CPU; no checkpoint files or log file.
Measure only (not in the program): the mean training loss of the last epoch.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first sampled batch
(inputs ``(u, seq, pos, neg)``, target ``pos``) with the program's loss written as a
function of ``(pos_logits, neg_logits)`` and ``pos`` (the padding mask taken from ``pos``)
and the optimizer; ``nndx.Monitor`` around the epochs with every batch loss logged (the
program prints it); no ``data=``: the inputs are per-user sequences with sampled
negatives, not an array of samples; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sasrec"
SOURCE = Source("pmixer/SASRec.pytorch", "python/model.py", "fde8a9c08febc2c898dc269b1d98ab762c50d2be", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (post-norm, shrunk sizes)"),
        Variant(
            "no_causal_mask",
            "the self-attention layers are called without attn_mask (the causal ~tril mask dropped): position t "
            "attends to position t+1, whose input item is the very positive it is scored on; at test time the "
            "last position has no future to copy",
            (C.DATA_LEAKAGE,),
            ("https://github.com/liuqidong07/LLMEmb/issues/2", "https://github.com/ZiyaoGeng/RecLearn/issues/81",
             "https://github.com/kang205/SASRec/issues/14", "https://github.com/pmixer/SASRec.pytorch/issues/6",
             "https://github.com/pykt-team/pykt-toolkit/issues/182"),
            Measure("test_ndcg", "last test NDCG@10 at least 0.05 below the healthy run's: 0.48 against 0.56 on "
                    "seed 0 (HR@10 0.71 against 0.77; the train loss lower than healthy, 0.31 against 0.43)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "sigmoid_before_bce_logits",
            "forward returns pos_sigmoid(pos_logits), neg_sigmoid(neg_logits) (the lines commented out in the "
            "source) while the criterion stays BCEWithLogitsLoss: the scores are squashed twice",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/NVIDIA/pix2pixHD/issues/9", "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("final_train_loss", "mean training loss of the last epoch at least 0.2 above the healthy run's "
                    "(1.13 against 0.43 on seed 0: two BCE terms on sigmoid(sigmoid(x)) cannot go below 2 * 0.31; "
                    "the ranking survives, sigmoid being monotonic: test HR@10 0.75 against 0.77)",
                    lambda healthy, buggy: not buggy < healthy + 0.2),
        ),
    )
}

ARGS = {"batch_size": 64, "lr": 0.005, "maxlen": 20, "hidden_units": 32, "num_blocks": 2, "num_epochs": 60,
        "num_heads": 1, "dropout_rate": 0.2, "l2_emb": 0.0, "eval_every": 30}  # fmt: skip
USERS, ITEMS, SUCCESSORS, FOLLOW = 256, 200, 3, 0.8


# --------------------------------------------------------------------------- model.py


class PointWiseFeedForward(torch.nn.Module):
    def __init__(self, hidden_units: int, dropout_rate: float) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv1d(hidden_units, hidden_units, kernel_size=1)
        self.dropout1 = torch.nn.Dropout(p=dropout_rate)
        self.relu = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv1d(hidden_units, hidden_units, kernel_size=1)
        self.dropout2 = torch.nn.Dropout(p=dropout_rate)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout1(self.conv1(inputs.transpose(-1, -2)))
        outputs = self.dropout2(self.conv2(self.relu(hidden)))
        return outputs.transpose(-1, -2)  # Conv1d works on (N, C, L)


class SASRec(torch.nn.Module):
    def __init__(self, user_num: int, item_num: int, args: dict, causal: bool = True, sigmoid_out: bool = False):
        super().__init__()
        self.user_num, self.item_num = user_num, item_num
        self.norm_first = False
        self.causal, self.sigmoid_out = causal, sigmoid_out
        h = args["hidden_units"]
        self.item_emb = torch.nn.Embedding(item_num + 1, h, padding_idx=0)
        self.pos_emb = torch.nn.Embedding(args["maxlen"] + 1, h, padding_idx=0)
        self.emb_dropout = torch.nn.Dropout(p=args["dropout_rate"])
        self.attention_layernorms = torch.nn.ModuleList()
        self.attention_layers = torch.nn.ModuleList()
        self.forward_layernorms = torch.nn.ModuleList()
        self.forward_layers = torch.nn.ModuleList()
        self.last_layernorm = torch.nn.LayerNorm(h, eps=1e-8)
        for _ in range(args["num_blocks"]):
            self.attention_layernorms.append(torch.nn.LayerNorm(h, eps=1e-8))
            self.attention_layers.append(torch.nn.MultiheadAttention(h, args["num_heads"], args["dropout_rate"]))
            self.forward_layernorms.append(torch.nn.LayerNorm(h, eps=1e-8))
            self.forward_layers.append(PointWiseFeedForward(h, args["dropout_rate"]))
        self.pos_sigmoid = torch.nn.Sigmoid()
        self.neg_sigmoid = torch.nn.Sigmoid()

    def log2feats(self, log_seqs) -> torch.Tensor:
        log_seqs = torch.as_tensor(np.asarray(log_seqs) if not torch.is_tensor(log_seqs) else log_seqs, dtype=torch.long)
        seqs = self.item_emb(log_seqs)
        seqs = seqs * self.item_emb.embedding_dim**0.5
        positions = torch.arange(1, log_seqs.shape[1] + 1).expand(log_seqs.shape[0], -1)
        positions = positions * (log_seqs != 0)  # padding keeps position 0 (a zero row)
        seqs = seqs + self.pos_emb(positions)
        seqs = self.emb_dropout(seqs)

        tl = seqs.shape[1]
        attention_mask = ~torch.tril(torch.ones((tl, tl), dtype=torch.bool))
        for i in range(len(self.attention_layers)):
            seqs = torch.transpose(seqs, 0, 1)  # (T, N, C) for MultiheadAttention
            mask = attention_mask if self.causal else None  # the bug: no causal mask
            mha_outputs, _ = self.attention_layers[i](seqs, seqs, seqs, attn_mask=mask)
            seqs = self.attention_layernorms[i](seqs + mha_outputs)
            seqs = torch.transpose(seqs, 0, 1)
            seqs = self.forward_layernorms[i](seqs + self.forward_layers[i](seqs))
        return self.last_layernorm(seqs)

    def forward(self, user_ids, log_seqs, pos_seqs, neg_seqs):
        log_feats = self.log2feats(log_seqs)
        pos_embs = self.item_emb(torch.as_tensor(np.asarray(pos_seqs) if not torch.is_tensor(pos_seqs) else pos_seqs,
                                                 dtype=torch.long))  # fmt: skip
        neg_embs = self.item_emb(torch.as_tensor(np.asarray(neg_seqs) if not torch.is_tensor(neg_seqs) else neg_seqs,
                                                 dtype=torch.long))  # fmt: skip
        pos_logits = (log_feats * pos_embs).sum(dim=-1)
        neg_logits = (log_feats * neg_embs).sum(dim=-1)
        if self.sigmoid_out:  # the bug: probabilities handed to BCEWithLogitsLoss
            return self.pos_sigmoid(pos_logits), self.neg_sigmoid(neg_logits)
        return pos_logits, neg_logits

    def predict(self, user_ids, log_seqs, item_indices) -> torch.Tensor:
        log_feats = self.log2feats(log_seqs)
        final_feat = log_feats[:, -1, :]  # only the last position's feature
        item_embs = self.item_emb(torch.as_tensor(np.asarray(item_indices), dtype=torch.long))  # (I, C)
        return item_embs.matmul(final_feat.unsqueeze(-1)).squeeze(-1)


# --------------------------------------------------------------------------- utils.py


def interaction_log(seed: int) -> list[tuple[int, int]]:
    """The ``(user, item)`` lines of ``data/<name>.txt``, made up: each item has three likely
    next items; a user's sequence follows them 80% of the time and jumps at random otherwise."""
    rng = np.random.default_rng(seed + 29)
    successors = rng.integers(1, ITEMS + 1, size=(ITEMS + 1, SUCCESSORS))
    weights = np.array([0.6, 0.3, 0.1])
    lines = []
    for u in range(1, USERS + 1):
        length = int(rng.integers(12, 25))
        item = int(rng.integers(1, ITEMS + 1))
        for _ in range(length):
            lines.append((u, item))
            if rng.random() < FOLLOW:
                item = int(successors[item, rng.choice(SUCCESSORS, p=weights)])
            else:
                item = int(rng.integers(1, ITEMS + 1))
    return lines


def data_partition(lines: list[tuple[int, int]]):
    usernum, itemnum = 0, 0
    user_items: dict[int, list[int]] = {}
    for u, i in lines:
        usernum, itemnum = max(u, usernum), max(i, itemnum)
        user_items.setdefault(u, []).append(i)
    user_train, user_valid, user_test = {}, {}, {}
    for user, items in user_items.items():
        if len(items) < 4:
            user_train[user], user_valid[user], user_test[user] = items, [], []
        else:
            user_train[user], user_valid[user], user_test[user] = items[:-2], [items[-2]], [items[-1]]
    return [user_train, user_valid, user_test, usernum, itemnum]


def random_neq(rng: np.random.RandomState, l: int, r: int, s: set) -> int:  # noqa: E741 - the source's names
    t = rng.randint(l, r)
    while t in s:
        t = rng.randint(l, r)
    return t


class Sampler:
    """``WarpSampler`` without the worker processes: ``sample_function``'s batches, drawn in
    the caller's process from a ``RandomState`` seeded as a worker's would be."""

    def __init__(self, user_train, usernum: int, itemnum: int, batch_size: int, maxlen: int, seed: int) -> None:
        self.user_train, self.usernum, self.itemnum = user_train, usernum, itemnum
        self.batch_size, self.maxlen = batch_size, maxlen
        self.rng = np.random.RandomState(seed)
        self.uids = np.arange(1, usernum + 1, dtype=np.int32)
        self.counter = 0

    def sample(self, uid: int):
        while len(self.user_train[uid]) <= 1:
            uid = self.rng.randint(1, self.usernum + 1)
        seq = np.zeros([self.maxlen], dtype=np.int32)
        pos = np.zeros([self.maxlen], dtype=np.int32)
        neg = np.zeros([self.maxlen], dtype=np.int32)
        nxt = self.user_train[uid][-1]
        idx = self.maxlen - 1
        ts = set(self.user_train[uid])
        for i in reversed(self.user_train[uid][:-1]):
            seq[idx], pos[idx] = i, nxt
            neg[idx] = random_neq(self.rng, 1, self.itemnum + 1, ts)
            nxt = i
            idx -= 1
            if idx == -1:
                break
        return uid, seq, pos, neg

    def next_batch(self):
        one_batch = []
        for _ in range(self.batch_size):
            if self.counter % self.usernum == 0:
                self.rng.shuffle(self.uids)
            one_batch.append(self.sample(int(self.uids[self.counter % self.usernum])))
            self.counter += 1
        return zip(*one_batch)


def _rank_held_out(model, dataset, args, test: bool) -> tuple[float, float]:
    train, valid, test_items, usernum, itemnum = dataset
    ndcg, ht, valid_user = 0.0, 0.0, 0.0
    for u in range(1, usernum + 1):
        target = test_items[u] if test else valid[u]
        if len(train[u]) < 1 or len(target) < 1:
            continue
        seq = np.zeros([args["maxlen"]], dtype=np.int32)
        idx = args["maxlen"] - 1
        if test:  # the valid item is the last input when the test item is ranked
            seq[idx] = valid[u][0]
            idx -= 1
        for i in reversed(train[u]):
            seq[idx] = i
            idx -= 1
            if idx == -1:
                break
        rated = set(train[u])
        rated.add(0)
        item_idx = [target[0]]
        for _ in range(100):
            t = np.random.randint(1, itemnum + 1)
            while t in rated:
                t = np.random.randint(1, itemnum + 1)
            item_idx.append(t)
        with torch.no_grad():
            predictions = -model.predict(np.array([u]), np.array([seq]), item_idx)[0]
        rank = predictions.argsort().argsort()[0].item()
        valid_user += 1
        if rank < 10:
            ndcg += 1 / np.log2(rank + 2)
            ht += 1
    return ndcg / valid_user, ht / valid_user


def evaluate(model, dataset, args) -> tuple[float, float]:
    return _rank_held_out(model, dataset, args, test=True)


def evaluate_valid(model, dataset, args) -> tuple[float, float]:
    return _rank_held_out(model, dataset, args, test=False)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = data_partition(interaction_log(seed))
    user_train, _user_valid, _user_test, usernum, itemnum = dataset
    num_batch = (len(user_train) - 1) // args["batch_size"] + 1
    sampler = Sampler(user_train, usernum, itemnum, args["batch_size"], args["maxlen"], seed=np.random.randint(2e9))
    model = SASRec(usernum, itemnum, args, causal=variant != "no_causal_mask",
                   sigmoid_out=variant == "sigmoid_before_bce_logits")  # fmt: skip
    for _name, param in model.named_parameters():
        try:
            torch.nn.init.xavier_normal_(param.data)
        except ValueError:
            pass  # 1-D parameters (biases, LayerNorm) keep their init
    model.pos_emb.weight.data[0, :] = 0
    model.item_emb.weight.data[0, :] = 0
    model.train()

    bce_criterion = torch.nn.BCEWithLogitsLoss()
    adam_optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"], betas=(0.9, 0.98))

    def sasrec_loss(output, pos) -> torch.Tensor:
        """The loop's loss as a function of the model's output and the positives."""
        pos_logits, neg_logits = output
        indices = torch.where(torch.as_tensor(pos) != 0)
        loss = bce_criterion(pos_logits[indices], torch.ones_like(pos_logits[indices]))
        loss = loss + bce_criterion(neg_logits[indices], torch.zeros_like(neg_logits[indices]))
        for param in model.item_emb.parameters():
            loss = loss + args["l2_emb"] * torch.sum(param**2)
        return loss

    best = {"val_ndcg": 0.0, "val_hr": 0.0, "test_ndcg": 0.0, "test_hr": 0.0}
    probe_batch, mon = None, None
    t_valid, t_test, epoch_losses = (0.0, 0.0), (0.0, 0.0), []
    for epoch in range(1, args["num_epochs"] + 1):
        losses = []
        for _step in range(num_batch):
            u, seq, pos, neg = sampler.next_batch()
            u, seq, pos, neg = np.array(u), np.array(seq), np.array(pos), np.array(neg)
            if probe_batch is None:  # the author's preflight, on the first batch
                inputs = tuple(torch.as_tensor(a, dtype=torch.long) for a in (u, seq, pos, neg))
                probe_batch = (inputs, inputs[2])
                nx.preflight(model, probe_batch, sasrec_loss, optimizer=adam_optimizer)
                mon = nx.monitor(model, adam_optimizer, every=10)
            pos_logits, neg_logits = model(u, seq, pos, neg)
            pos_labels, neg_labels = torch.ones(pos_logits.shape), torch.zeros(neg_logits.shape)
            adam_optimizer.zero_grad()
            indices = np.where(pos != 0)
            loss = bce_criterion(pos_logits[indices], pos_labels[indices])
            loss += bce_criterion(neg_logits[indices], neg_labels[indices])
            for param in model.item_emb.parameters():
                loss += args["l2_emb"] * torch.sum(param**2)
            loss.backward()
            adam_optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        epoch_losses.append(float(np.mean(losses)))

        if epoch % args["eval_every"] == 0:
            model.eval()
            t_test = evaluate(model, dataset, args)
            t_valid = evaluate_valid(model, dataset, args)
            best["val_ndcg"], best["val_hr"] = max(t_valid[0], best["val_ndcg"]), max(t_valid[1], best["val_hr"])
            best["test_ndcg"], best["test_hr"] = max(t_test[0], best["test_ndcg"]), max(t_test[1], best["test_hr"])
            model.train()

    nx.finish(mon, model, probe_batch, sasrec_loss, optimizer=adam_optimizer)
    return {
        "test_ndcg": t_test[0], "test_hr": t_test[1], "val_ndcg": t_valid[0], "val_hr": t_valid[1],
        "best_test_hr": best["test_hr"], "best_val_hr": best["val_hr"], "final_train_loss": epoch_losses[-1],
    }  # fmt: skip
