"""Port of hcnoh/knowledge-tracing-collection-pytorch's DKT: deep knowledge tracing, an LSTM
over (skill, correct) interactions predicting the correctness of the next question.

Source: github.com/hcnoh/knowledge-tracing-collection-pytorch, ``models/dkt.py``,
``models/utils.py``, ``data_loaders/assist2009.py``, ``train.py`` and ``config.json`` at
commit 6151f490db17a290b0f4674c1a7c15a1a60c35f6 (MIT, Copyright (c) 2022 Hyungcheol Noh).
Written anew from the facts of those files; no code copied.

Kept: ``DKT``: ``interaction_emb = Embedding(num_q * 2, emb_size)`` indexed by ``q + num_q
* r``, one batch-first ``LSTM(emb_size, hidden_size)``, ``out_layer = Linear(hidden_size,
num_q)``, ``Dropout()`` (p 0.5) on the output layer's values and then ``sigmoid``;
``train_model``: per batch ``self.train()``, the predictions gathered for the next
question's skill (``(y * one_hot(qshft, num_q)).sum(-1)``), ``masked_select`` of
predictions and next responses with the padding mask, ``opt.zero_grad()``,
``binary_cross_entropy``, backward, step, the batch losses averaged per epoch; after each
epoch, under ``no_grad`` and ``self.eval()``, the whole test set as one batch, the same
gather and mask and ``sklearn.metrics.roc_auc_score``, the best AUC kept (the checkpoint
kept in memory, not ``torch.save``). ``ASSIST2009.preprocess``: rows without a skill
dropped, duplicates on ``(order_id, skill_name)`` dropped, sorted by ``order_id``, skills
and users indexed in sorted order, one (skill, correct) sequence per user;
``match_seq_len``: each sequence cut into pieces of ``seq_len + 1``, the last piece padded
with -1; ``collate_fn``: inputs the first ``seq_len`` steps, targets the last ``seq_len``
(``qshft``, ``rshft``), padded with -1, ``mask = (q != -1) * (qshft != -1)``, every
sequence multiplied by the mask. ``train.py``: ``random_split`` 0.9/0.1, a shuffled
train loader, the test loader one batch of the whole test split, ``Adam(lr=0.001)``.
Shrunk: synthetic skill-builder logs instead of ASSISTments 2009 (no pandas here: the
preprocessing's ``dropna``/``drop_duplicates``/``sort_values`` done on numpy arrays):
400 students, 12 skills, 40-90 attempts each, worked in blocks of 3-8 on one skill (as
skill-builder problem sets are); a student answers correctly with probability
``sigmoid(ability + 0.35 * practice on the skill - difficulty)``; the raw export repeats
25% of its rows (same ``order_id`` and skill), as the ASSISTments 2009 file does;
``seq_len`` 50 instead of 100, ``emb_size``/``hidden_size`` 32 instead of 100,
``batch_size`` 64 instead of 256, 15 epochs instead of 100; lr 0.005 instead of 0.001
(the shrunk run has ~130 steps); CPU; no pickles or checkpoint files.
Measure only (not in the program): ``clean_auc``, the AUC of the final model on the test
students' pieces collated and gathered correctly (current responses in, next question's
skill out).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(inputs ``(q, r)``, targets ``(qshft, rshft, mask)``) with the loop's loss written as a
function of them and the optimizer, and ``data=`` the padded interaction ids (``q + num_q
* r``, -1 for padding) and next responses of the train and test splits; ``nndx.Monitor``
around the epochs with every batch loss logged (the program keeps them for its epoch
mean); the program computes no test loss (AUC only), so none is logged; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import torch
from sklearn import metrics
from torch.nn import LSTM, Dropout, Embedding, Linear, Module
from torch.nn.functional import binary_cross_entropy, one_hot
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, random_split

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dkt"
SOURCE = Source("hcnoh/knowledge-tracing-collection-pytorch", "models/dkt.py", "6151f490db17a290b0f4674c1a7c15a1a60c35f6",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (dkt on the ASSIST2009 loader, shrunk sizes)"),
        Variant(
            "responses_shifted_twice",
            "collate_fn takes the input responses from r_seq[1:] (the targets' slice) instead of r_seq[:-1]: the "
            "interaction fed at step t carries the answer to question t+1, the very response the model is asked "
            "to predict",
            (C.DATA_LEAKAGE,),
            ("https://github.com/pykt-team/pykt-toolkit/issues/182", "https://github.com/xiaopengguo/ATKT/issues/1",
             "https://github.com/UncertaintyForKnowledgeTracing/UKT/issues/1",
             "https://github.com/karin0018/GenAL/issues/10"),
            Measure("max_auc", "best test AUC (as the program computes it) at least 0.1 above the healthy run's: an "
                    "inflated score",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
        Variant(
            "skill_not_shifted",
            "the predictions gathered with one_hot(q) (the current question's skill) instead of one_hot(qshft) while "
            "the target stays rshft: each next response is scored against the probability for the wrong skill",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/karin0018/GenAL/issues/10",
             "https://github.com/pydaxing/Deep-Knowledge-Tracing-DKT-Pytorch/issues/2"),
            Measure("max_auc", "best test AUC at least 0.04 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.04),
        ),
    )
}

TRAIN_CONFIG = {"batch_size": 64, "num_epochs": 15, "train_ratio": 0.9, "learning_rate": 0.005, "seq_len": 50}
MODEL_CONFIG = {"emb_size": 32, "hidden_size": 32}
STUDENTS, SKILLS, REPEATED = 400, 12, 0.25


# --------------------------------------------------------------------------- data_loaders/assist2009.py


def skill_builder_export(seed: int) -> dict[str, np.ndarray]:
    """The columns of ``skill_builder_data.csv`` the loader reads, made up: students with an
    ability work problem sets of one skill at a time; practice raises the chance of a
    correct answer on that skill; some rows have no skill and 25% are exported twice."""
    rng = np.random.default_rng(seed + 41)
    difficulty = rng.normal(0.0, 1.0, SKILLS)
    names = np.array([f"skill_{k:02d}" for k in range(SKILLS)], dtype=object)
    order_id, user_id, skill, correct = [], [], [], []
    next_order = 1000
    for s in range(STUDENTS):
        ability = rng.normal(0.0, 1.0)
        practice = np.zeros(SKILLS)
        attempts = int(rng.integers(40, 91))
        while attempts > 0:
            k = int(rng.integers(SKILLS))
            for _ in range(min(attempts, int(rng.integers(3, 9)))):
                p = 1.0 / (1.0 + np.exp(-(ability + 0.35 * practice[k] - difficulty[k])))
                order_id.append(next_order)
                user_id.append(70000 + s)
                skill.append(names[k] if rng.random() > 0.02 else None)  # a few rows without a skill
                correct.append(int(rng.random() < p))
                practice[k] += 1
                next_order += int(rng.integers(1, 4))
                attempts -= 1
    rows = np.arange(len(order_id))
    repeated = rows[rng.random(len(rows)) < REPEATED]
    rows = np.sort(np.concatenate([rows, repeated]), kind="stable")  # a repeat sits next to its original
    table = {"order_id": np.array(order_id), "user_id": np.array(user_id), "skill_name": np.array(skill, dtype=object),
             "correct": np.array(correct)}  # fmt: skip
    return {key: column[rows] for key, column in table.items()}


def preprocess(df: dict[str, np.ndarray], drop_duplicates: bool = True):
    has_skill = np.array([name is not None for name in df["skill_name"]])
    df = {key: column[has_skill] for key, column in df.items()}  # dropna(subset=["skill_name"])
    if drop_duplicates:  # drop_duplicates(subset=["order_id", "skill_name"]): the first row of each pair kept
        seen, keep = set(), []
        for i, pair in enumerate(zip(df["order_id"], df["skill_name"])):
            keep.append(pair not in seen)
            seen.add(pair)
        df = {key: column[np.array(keep)] for key, column in df.items()}
    order = np.argsort(df["order_id"], kind="stable")  # sort_values(by=["order_id"])
    df = {key: column[order] for key, column in df.items()}

    u_list = np.unique(df["user_id"])
    q_list = np.unique(df["skill_name"].astype(str))
    q2idx = {q: idx for idx, q in enumerate(q_list)}
    u2idx = {u: idx for idx, u in enumerate(u_list)}
    q_seqs, r_seqs = [], []
    for u in u_list:
        rows = df["user_id"] == u
        q_seqs.append(np.array([q2idx[q] for q in df["skill_name"][rows]]))
        r_seqs.append(df["correct"][rows])
    return q_seqs, r_seqs, q_list, u_list, q2idx, u2idx


def match_seq_len(q_seqs, r_seqs, seq_len: int, pad_val: int = -1):
    proc_q_seqs, proc_r_seqs = [], []
    for q_seq, r_seq in zip(q_seqs, r_seqs):
        i = 0
        while i + seq_len + 1 < len(q_seq):
            proc_q_seqs.append(q_seq[i : i + seq_len + 1])
            proc_r_seqs.append(r_seq[i : i + seq_len + 1])
            i += seq_len + 1
        padding = np.array([pad_val] * (i + seq_len + 1 - len(q_seq)))
        proc_q_seqs.append(np.concatenate([q_seq[i:], padding]))
        proc_r_seqs.append(np.concatenate([r_seq[i:], padding]))
    return proc_q_seqs, proc_r_seqs


class ASSIST2009(Dataset):
    def __init__(self, seq_len: int, export: dict[str, np.ndarray], drop_duplicates: bool = True) -> None:
        super().__init__()
        self.q_seqs, self.r_seqs, self.q_list, self.u_list, self.q2idx, self.u2idx = preprocess(export, drop_duplicates)
        self.num_u, self.num_q = self.u_list.shape[0], self.q_list.shape[0]
        if seq_len:
            self.q_seqs, self.r_seqs = match_seq_len(self.q_seqs, self.r_seqs, seq_len)
        self.len = len(self.q_seqs)

    def __getitem__(self, index):
        return self.q_seqs[index], self.r_seqs[index]

    def __len__(self) -> int:
        return self.len


# --------------------------------------------------------------------------- models/utils.py


def collate_fn(batch, pad_val: int = -1, leak: bool = False):
    q_seqs, r_seqs, qshft_seqs, rshft_seqs = [], [], [], []
    for q_seq, r_seq in batch:
        q_seqs.append(torch.FloatTensor(q_seq[:-1]))
        r_seqs.append(torch.FloatTensor(r_seq[1:] if leak else r_seq[:-1]))  # the bug: the next responses
        qshft_seqs.append(torch.FloatTensor(q_seq[1:]))
        rshft_seqs.append(torch.FloatTensor(r_seq[1:]))
    q_seqs = pad_sequence(q_seqs, batch_first=True, padding_value=pad_val)
    r_seqs = pad_sequence(r_seqs, batch_first=True, padding_value=pad_val)
    qshft_seqs = pad_sequence(qshft_seqs, batch_first=True, padding_value=pad_val)
    rshft_seqs = pad_sequence(rshft_seqs, batch_first=True, padding_value=pad_val)
    mask_seqs = (q_seqs != pad_val) * (qshft_seqs != pad_val)
    q_seqs, r_seqs = q_seqs * mask_seqs, r_seqs * mask_seqs
    qshft_seqs, rshft_seqs = qshft_seqs * mask_seqs, rshft_seqs * mask_seqs
    return q_seqs, r_seqs, qshft_seqs, rshft_seqs, mask_seqs


# --------------------------------------------------------------------------- models/dkt.py


class DKT(Module):
    def __init__(self, num_q: int, emb_size: int, hidden_size: int, shifted: bool = True) -> None:
        super().__init__()
        self.num_q, self.emb_size, self.hidden_size = num_q, emb_size, hidden_size
        self.shifted = shifted
        self.interaction_emb = Embedding(self.num_q * 2, self.emb_size)
        self.lstm_layer = LSTM(self.emb_size, self.hidden_size, batch_first=True)
        self.out_layer = Linear(self.hidden_size, self.num_q)
        self.dropout_layer = Dropout()

    def forward(self, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        x = q + self.num_q * r
        h, _ = self.lstm_layer(self.interaction_emb(x))
        y = self.out_layer(h)
        y = self.dropout_layer(y)
        return torch.sigmoid(y)

    def gather(self, y: torch.Tensor, q: torch.Tensor, qshft: torch.Tensor) -> torch.Tensor:
        """The prediction for the skill each target is about (the bug: the current one)."""
        skills = qshft if self.shifted else q
        return (y * one_hot(skills.long(), self.num_q)).sum(-1)

    def train_model(self, train_loader, test_loader, num_epochs: int, opt, nx: Nndx, splits):
        aucs, loss_means = [], []
        max_auc, best_state = 0.0, None
        mon, probe_batch = None, None

        def dkt_loss(y: torch.Tensor, targets) -> torch.Tensor:
            """The loop's loss as a function of the model's output and (qshft, rshft, m)."""
            q, qshft, rshft, m = targets
            y = self.gather(y, q, qshft)
            return binary_cross_entropy(torch.masked_select(y, m), torch.masked_select(rshft, m))

        for _epoch in range(1, num_epochs + 1):
            loss_mean = []
            for data in train_loader:
                q, r, qshft, rshft, m = data
                if probe_batch is None:  # the author's preflight, on the first batch
                    probe_batch = ((q.long(), r.long()), (q, qshft, rshft, m))
                    nx.preflight(self, probe_batch, dkt_loss, optimizer=opt, data=splits)
                    mon = nx.monitor(self, opt, every=5)
                self.train()
                y = self(q.long(), r.long())
                y = self.gather(y, q, qshft)
                y = torch.masked_select(y, m)
                t = torch.masked_select(rshft, m)
                opt.zero_grad()
                loss = binary_cross_entropy(y, t)
                loss.backward()
                opt.step()
                mon.log(loss)
                loss_mean.append(loss.detach().cpu().numpy())

            with torch.no_grad():
                for data in test_loader:
                    q, r, qshft, rshft, m = data
                    self.eval()
                    y = self(q.long(), r.long())
                    y = self.gather(y, q, qshft)
                    y = torch.masked_select(y, m).detach().cpu()
                    t = torch.masked_select(rshft, m).detach().cpu()
                    auc = metrics.roc_auc_score(y_true=t.numpy(), y_score=y.numpy())
                    loss_mean = np.mean(loss_mean)
                    if auc > max_auc:
                        best_state = copy.deepcopy(self.state_dict())  # torch.save(..., "model.ckpt")
                        max_auc = auc
                    aucs.append(auc)
                    loss_means.append(loss_mean)
        nx.finish(mon, self, probe_batch, dkt_loss, optimizer=opt, data=splits)
        return aucs, loss_means, best_state


# --------------------------------------------------------------------------- train.py


def padded_splits(dataset, indices, num_q: int, collate) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (interaction ids ``q + num_q * r``, -1 for padding) and next responses (-1 for
    padding) of a split, as the program's collate_fn makes them, for nndx's data checks."""
    q, r, _qshft, rshft, m = collate([dataset[i] for i in indices])
    x = torch.where(m, q + num_q * r, torch.full_like(q, -1.0))
    return x, torch.where(m, rshft, torch.full_like(rshft, -1.0))


def clean_auc(model: DKT, export: dict[str, np.ndarray], test_users: set) -> float:
    """Measure only: the AUC of ``model`` on the test students' logs preprocessed correctly."""
    q_seqs, r_seqs, _q_list, u_list, _q2idx, _u2idx = preprocess(export, drop_duplicates=True)
    q_seqs = [s for s, u in zip(q_seqs, u_list) if u in test_users]
    r_seqs = [s for s, u in zip(r_seqs, u_list) if u in test_users]
    q_seqs, r_seqs = match_seq_len(q_seqs, r_seqs, TRAIN_CONFIG["seq_len"])
    q, r, qshft, rshft, m = collate_fn(list(zip(q_seqs, r_seqs)))
    model.eval()
    with torch.no_grad():
        y = model(q.long(), r.long())
        y = (y * one_hot(qshft.long(), model.num_q)).sum(-1)
    return float(metrics.roc_auc_score(torch.masked_select(rshft, m).numpy(), torch.masked_select(y, m).numpy()))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    export = skill_builder_export(seed)
    dataset = ASSIST2009(TRAIN_CONFIG["seq_len"], export)
    collate = partial(collate_fn, leak=variant == "responses_shifted_twice")
    model = DKT(dataset.num_q, **MODEL_CONFIG, shifted=variant != "skill_not_shifted")

    train_size = int(len(dataset) * TRAIN_CONFIG["train_ratio"])
    test_size = len(dataset) - train_size
    train_dataset, test_dataset = random_split(dataset, [train_size, test_size],
                                               generator=torch.Generator().manual_seed(seed))  # fmt: skip
    train_loader = DataLoader(train_dataset, batch_size=TRAIN_CONFIG["batch_size"], shuffle=True, collate_fn=collate,
                              generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    test_loader = DataLoader(test_dataset, batch_size=test_size, shuffle=True, collate_fn=collate,
                             generator=torch.Generator().manual_seed(seed + 2))  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), TRAIN_CONFIG["learning_rate"])

    x_train, y_train = padded_splits(dataset, train_dataset.indices, dataset.num_q, collate)
    x_test, y_test = padded_splits(dataset, test_dataset.indices, dataset.num_q, collate)
    splits = (x_train, y_train, x_test, y_test)

    aucs, loss_means, _best_state = model.train_model(train_loader, test_loader, TRAIN_CONFIG["num_epochs"], opt, nx,
                                                      splits)  # fmt: skip

    # the test students: the users whose pieces fell in the test split
    piece_user = []
    for q_seq, u in zip(ASSIST2009(0, export).q_seqs, dataset.u_list):
        piece_user += [u] * len(match_seq_len([q_seq], [q_seq], TRAIN_CONFIG["seq_len"])[0])
    test_users = {piece_user[i] for i in test_dataset.indices}
    return {
        "final_auc": float(aucs[-1]), "max_auc": float(max(aucs)), "final_loss_mean": float(loss_means[-1]),
        "clean_auc": clean_auc(model, export, test_users),
    }  # fmt: skip
