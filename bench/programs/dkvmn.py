"""Port of hcnoh/knowledge-tracing-collection-pytorch's DKVMN: dynamic key-value memory
networks for knowledge tracing (Zhang et al. 2017, jennyzhang0215/DKVMN in MXNet) in PyTorch.

Source: github.com/hcnoh/knowledge-tracing-collection-pytorch, ``models/dkvmn.py``,
``models/utils.py``, ``train.py`` and ``config.json`` at commit
6151f490db17a290b0f4674c1a7c15a1a60c35f6 (MIT, Copyright (c) 2022 Hyungcheol Noh). Written
anew from the facts of those files; no code copied.

Kept: ``DKVMN``: ``k_emb_layer = Embedding(num_q, dim_s)`` (question embeddings, the
keys), ``v_emb_layer = Embedding(2 * num_q, dim_s)`` indexed by ``q + num_q * r`` (the
question-answer embeddings), a static key memory ``Mk`` and the initial value memory
``Mv0`` (``size_m x dim_s`` parameters, ``kaiming_normal_``); the correlation weights
``softmax(k @ Mk.T)`` over the memory slots; erase ``sigmoid(e_layer(v))`` and add
``tanh(a_layer(v))``; per time step the value memory written ``Mv * (1 - w e^T) + w a^T``
and every memory kept; the read content ``sum(w * Mv_t)`` from the memory *before* step t's
write, concatenated with the key and through ``f_layer`` + ``tanh`` (the summary),
``p_layer`` + ``sigmoid``; ``train_model``: per batch ``self.train()``, ``masked_select``
of the predictions and the responses with the padding mask, ``opt.zero_grad()``,
``binary_cross_entropy``, backward, step, the batch losses averaged per epoch; after each
epoch, under ``no_grad`` and ``self.eval()``, the test set as one batch, the same mask and
``sklearn.metrics.roc_auc_score``, the best AUC kept (the checkpoint kept in memory, not
``torch.save``). ``match_seq_len`` (each student's log cut into pieces of ``seq_len + 1``,
the last padded with -1), ``collate_fn`` (``q[:-1]``, ``r[:-1]``, ``q[1:]``, ``r[1:]``,
``pad_sequence`` with -1, the mask ``(q != -1) * (qshft != -1)``, every sequence
multiplied by it), ``random_split`` with ``train_ratio`` 0.9, a shuffled train loader and
a test loader of the whole test split; ``Adam(lr=learning_rate)``.
Shrunk: a generated interaction log (400 students, 40 questions over 5 hidden skills, 20
to 90 attempts each, worked in blocks of one skill; the chance of a correct answer is
``sigmoid(ability + 0.35 * practice on the skill - difficulty)``) instead of the
ASSIST2009 csv; ``dim_s`` 32 instead of 50, ``size_m`` 10 instead of 20, ``seq_len`` 50
instead of 100, batch 64 instead of 256, 12 epochs instead of 100, lr 0.005 instead of
0.001. (The MXNet original also clips the gradient norm; hcnoh's port does not, nor does
this one.)
Measure only (not in the program): besides the program's own AUCs, the AUC on the test
split computed the published way (memory read before the write, responses as targets,
padding masked) — ``clean_auc`` — for a variant that changed what the program evaluates.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(inputs ``(q, r)``, targets ``(r, m)``, the loop's masked BCE as a function of the model's
``(p, Mv)``) with the data splits (interaction ids and responses, -1 at padding),
``nndx.Monitor(model, opt)`` around the epochs, every batch loss logged, each epoch's test
AUC logged as ``split="val"`` accuracy; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn import metrics
from torch.nn import Embedding, Linear, Module, Parameter
from torch.nn.functional import binary_cross_entropy
from torch.nn.init import kaiming_normal_
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, random_split

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dkvmn"
SOURCE = Source("hcnoh/knowledge-tracing-collection-pytorch", "models/dkvmn.py",
                "6151f490db17a290b0f4674c1a7c15a1a60c35f6", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (dkvmn, shrunk sizes, a generated interaction log)"),
        Variant(
            "targets_shifted",
            "the targets taken from rshft (the next response, DKT's convention in the same toolkit) instead of r: "
            "the prediction made for question t from the memory before step t is scored against the answer to "
            "question t+1",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/bigdata-ustc/EduKTM/issues/37",),
            Measure("max_auc", "best test AUC as the program computes it at least 0.05 below the healthy run's: 0.723 "
                    "against 0.820 healthy on seed 0 (0.768 computed the published way)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "padding_not_masked",
            "the loss (and the test AUC) taken over every position of the padded batch instead of "
            "masked_select(..., m): each padded step, multiplied by the mask to q=0, r=0, counts as "
            "'question 0 answered wrong'",
            (C.LABEL_NOISE, C.SILENT_DATA_LOSS),
            ("https://github.com/lccasagrande/Deep-Knowledge-Tracing/issues/16",
             "https://github.com/pydaxing/Deep-Knowledge-Tracing-DKT-Pytorch/issues/2",
             "https://github.com/WindChimeRan/OpenJERE/issues/6",
             "https://github.com/voidism/DiffCSE/issues/25"),
            Measure("max_auc", "best test AUC as the program computes it at least 0.05 away from the healthy run's "
                    "(padding scored as easy negatives inflates it): 0.932 against 0.820 healthy on seed 0, while "
                    "the AUC computed the published way drops to 0.789",
                    lambda healthy, buggy: abs(buggy - healthy) >= 0.05),
        ),
    )
}

TRAIN_CONFIG = {"batch_size": 64, "num_epochs": 12, "train_ratio": 0.9, "learning_rate": 0.005, "seq_len": 50}
MODEL_CONFIG = {"dim_s": 32, "size_m": 10}
STUDENTS, QUESTIONS, SKILLS = 400, 40, 5


# --------------------------------------------------------------------------- the data (the ASSIST2009 loader's output)


def interaction_log(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One (question, correct) sequence per student, made up: each question belongs to a
    hidden skill; students work blocks of questions of one skill; practice on a skill raises
    the chance of a correct answer on all its questions."""
    rng = np.random.default_rng(seed + 77)
    skill_of = rng.integers(SKILLS, size=QUESTIONS)
    difficulty = rng.normal(0.0, 1.0, QUESTIONS)
    q_seqs, r_seqs = [], []
    for _ in range(STUDENTS):
        ability, practice = rng.normal(0.0, 1.0), np.zeros(SKILLS)
        attempts = int(rng.integers(20, 91))
        qs, rs = [], []
        while len(qs) < attempts:
            k = int(rng.integers(SKILLS))
            pool = np.flatnonzero(skill_of == k)
            if len(pool) == 0:
                continue
            for _ in range(min(attempts - len(qs), int(rng.integers(3, 9)))):
                q = int(rng.choice(pool))
                p = 1.0 / (1.0 + np.exp(-(ability + 0.35 * practice[k] - difficulty[q])))
                qs.append(q)
                rs.append(int(rng.random() < p))
                practice[k] += 1
        q_seqs.append(np.array(qs))
        r_seqs.append(np.array(rs))
    return q_seqs, r_seqs


# --------------------------------------------------------------------------- models/utils.py


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


def collate_fn(batch, pad_val: int = -1):
    q_seqs, r_seqs, qshft_seqs, rshft_seqs = [], [], [], []
    for q_seq, r_seq in batch:
        q_seqs.append(torch.FloatTensor(q_seq[:-1]))
        r_seqs.append(torch.FloatTensor(r_seq[:-1]))
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


class InteractionLog(Dataset):
    def __init__(self, seq_len: int, seed: int) -> None:
        super().__init__()
        self.q_seqs, self.r_seqs = match_seq_len(*interaction_log(seed), seq_len)
        self.num_q = QUESTIONS
        self.len = len(self.q_seqs)

    def __getitem__(self, index):
        return self.q_seqs[index], self.r_seqs[index]

    def __len__(self) -> int:
        return self.len


# --------------------------------------------------------------------------- models/dkvmn.py


class DKVMN(Module):
    def __init__(self, num_q: int, dim_s: int, size_m: int, variant: str = "healthy") -> None:
        super().__init__()
        self.num_q, self.dim_s, self.size_m = num_q, dim_s, size_m
        self.variant = variant
        self.k_emb_layer = Embedding(self.num_q, self.dim_s)
        self.Mk = Parameter(torch.empty(self.size_m, self.dim_s))
        self.Mv0 = Parameter(torch.empty(self.size_m, self.dim_s))
        kaiming_normal_(self.Mk)
        kaiming_normal_(self.Mv0)
        self.v_emb_layer = Embedding(self.num_q * 2, self.dim_s)
        self.f_layer = Linear(self.dim_s * 2, self.dim_s)
        self.p_layer = Linear(self.dim_s, 1)
        self.e_layer = Linear(self.dim_s, self.dim_s)
        self.a_layer = Linear(self.dim_s, self.dim_s)

    def forward(self, q: torch.Tensor, r: torch.Tensor):
        x = q + self.num_q * r
        batch_size = x.shape[0]
        Mvt = self.Mv0.unsqueeze(0).repeat(batch_size, 1, 1)  # noqa: N806
        Mv = [Mvt]  # noqa: N806
        k = self.k_emb_layer(q)
        v = self.v_emb_layer(x)
        w = torch.softmax(torch.matmul(k, self.Mk.T), dim=-1)
        e = torch.sigmoid(self.e_layer(v))
        a = torch.tanh(self.a_layer(v))
        for et, at, wt in zip(e.permute(1, 0, 2), a.permute(1, 0, 2), w.permute(1, 0, 2)):
            Mvt = Mvt * (1 - (wt.unsqueeze(-1) * et.unsqueeze(1))) + (wt.unsqueeze(-1) * at.unsqueeze(1))  # noqa: N806
            Mv.append(Mvt)
        Mv = torch.stack(Mv, dim=1)  # noqa: N806
        f = torch.tanh(self.f_layer(torch.cat([(w.unsqueeze(-1) * Mv[:, :-1]).sum(-2), k], dim=-1)))
        p = torch.sigmoid(self.p_layer(f)).squeeze()
        return p, Mv

    # the variants change what the loop selects as predictions and targets
    def select(self, p: torch.Tensor, r: torch.Tensor, rshft: torch.Tensor, m: torch.Tensor):
        target = rshft if self.variant == "targets_shifted" else r
        if self.variant == "padding_not_masked":
            return p.reshape(-1), target.reshape(-1).float()
        return torch.masked_select(p, m), torch.masked_select(target, m).float()

    def train_model(self, train_loader, test_loader, num_epochs: int, opt, nx: Nndx, splits):
        aucs, loss_means = [], []
        max_auc, best_state = 0.0, None
        mon, probe_batch = None, None

        def dkvmn_loss(output, targets) -> torch.Tensor:
            """The loop's loss as a function of the model's (p, Mv) and (r, rshft, m)."""
            r, rshft, m = targets
            p, t = self.select(output[0], r, rshft, m)
            return binary_cross_entropy(p, t)

        for _epoch in range(1, num_epochs + 1):
            loss_mean = []
            for data in train_loader:
                q, r, _qshft, rshft, m = data
                if probe_batch is None:  # the author's preflight, on the first batch
                    probe_batch = ((q.long(), r.long()), (r, rshft, m))
                    nx.preflight(self, probe_batch, dkvmn_loss, optimizer=opt, data=splits)
                    mon = nx.monitor(self, opt, every=5)
                self.train()
                p, _ = self(q.long(), r.long())
                p, t = self.select(p, r, rshft, m)
                opt.zero_grad()
                loss = binary_cross_entropy(p, t)
                loss.backward()
                opt.step()
                nx.timed(lambda: mon.log(loss))  # noqa: B023
                loss_mean.append(loss.detach().cpu().numpy())

            with torch.no_grad():
                for data in test_loader:
                    q, r, _qshft, rshft, m = data
                    self.eval()
                    p, _ = self(q.long(), r.long())
                    p, t = self.select(p, r, rshft, m)
                    auc = metrics.roc_auc_score(y_true=t.numpy(), y_score=p.numpy())
                    test_loss = float(binary_cross_entropy(p, t))
                    loss_mean = np.mean(loss_mean)
                    nx.timed(lambda: mon.log(test_loss, split="val", accuracy=auc))  # noqa: B023
                    if auc > max_auc:
                        best_state = copy.deepcopy(self.state_dict())  # torch.save(..., "model.ckpt")
                        max_auc = auc
                    aucs.append(auc)
                    loss_means.append(loss_mean)
        nx.finish(mon, self, probe_batch, dkvmn_loss, optimizer=opt, data=splits)
        return aucs, loss_means, best_state


# --------------------------------------------------------------------------- train.py


def padded_splits(dataset, indices, num_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A split's interaction ids ``q + num_q * r`` and responses, -1 at padding, for nndx's data checks."""
    q, r, _qshft, _rshft, m = collate_fn([dataset[i] for i in indices])
    x = torch.where(m, q + num_q * r, torch.full_like(q, -1.0))
    return x, torch.where(m, r, torch.full_like(r, -1.0))


def clean_auc(model: DKVMN, loader) -> float:
    """Measure only: the test AUC the published way (targets r, padding masked)."""
    model.eval()
    with torch.no_grad():
        q, r, _qshft, _rshft, m = next(iter(loader))
        p, _ = model(q.long(), r.long())
        return float(metrics.roc_auc_score(torch.masked_select(r, m).numpy(), torch.masked_select(p, m).numpy()))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = InteractionLog(TRAIN_CONFIG["seq_len"], seed)
    model = DKVMN(dataset.num_q, **MODEL_CONFIG, variant=variant)
    train_size = int(len(dataset) * TRAIN_CONFIG["train_ratio"])
    test_size = len(dataset) - train_size
    train_dataset, test_dataset = random_split(dataset, [train_size, test_size],
                                               generator=torch.Generator().manual_seed(seed))  # fmt: skip
    train_loader = DataLoader(train_dataset, batch_size=TRAIN_CONFIG["batch_size"], shuffle=True,
                              collate_fn=collate_fn, generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    test_loader = DataLoader(test_dataset, batch_size=test_size, shuffle=True, collate_fn=collate_fn,
                             generator=torch.Generator().manual_seed(seed + 2))  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), TRAIN_CONFIG["learning_rate"])

    x_train, y_train = padded_splits(dataset, train_dataset.indices, dataset.num_q)
    x_test, y_test = padded_splits(dataset, test_dataset.indices, dataset.num_q)
    splits = (x_train, y_train, x_test, y_test)

    aucs, loss_means, _best_state = model.train_model(train_loader, test_loader, TRAIN_CONFIG["num_epochs"], opt, nx,
                                                      splits)  # fmt: skip
    return {"final_auc": float(aucs[-1]), "max_auc": float(max(aucs)), "final_loss_mean": float(loss_means[-1]),
            "clean_auc": clean_auc(model, test_loader)}  # fmt: skip
