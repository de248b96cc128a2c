"""Port of Facebook Research's DLRM (Deep Learning Recommendation Model, Naumov et al. 2019):
dense features through a bottom MLP, each categorical feature through its own
``nn.EmbeddingBag`` table, the pairwise dot products of all those vectors (the "dot"
interaction), a top MLP ending in a sigmoid, ``BCELoss``, plain SGD with the program's
warm-up / polynomial-decay ``LRPolicyScheduler``.

Source: github.com/facebookresearch/dlrm, ``dlrm_s_pytorch.py`` (``DLRM_Net``,
``LRPolicyScheduler``, ``run``, ``inference``), ``data_utils.py`` (``getCriteoAdData``: the
negative integer features set to 0; ``transformCriteoAdData``: ``log(x + 1)`` on the
integer features), ``dlrm_data_pytorch.py`` (``collate_wrapper_criteo_offset``: one index
per lookup, offsets ``arange(batch)``, the per-table offsets and indices stacked) and
``bench/dlrm_s_criteo_kaggle.sh`` at commit 090956ee2319ddd349a42232958aefccfe3f7b0a
(MIT, Copyright (c) Facebook, Inc. and its affiliates). Written anew from the facts of
those files; no code copied.

Kept: ``DLRM_Net`` with ``create_mlp`` (``nn.Linear`` layers, weights drawn from numpy
``normal(0, sqrt(2 / (m + n)))`` and biases from ``normal(0, sqrt(1 / m))``, ``nn.ReLU``
after each, ``nn.Sigmoid`` after the top MLP's last layer, wrapped in ``nn.Sequential``),
``create_emb`` (``nn.EmbeddingBag(n, m, mode="sum", sparse=True)``, weights drawn from
numpy ``uniform(-sqrt(1 / n), sqrt(1 / n))``), ``apply_emb`` (one bag lookup per table with
its offsets), ``interact_features`` with ``arch_interaction_op="dot"`` and
``arch_interaction_itself=False`` (the bottom-MLP output and the embeddings stacked to
``(batch, tables + 1, d)``, ``bmm`` with its transpose, the strictly lower triangle
gathered with the program's own index lists, concatenated after the dense vector),
``sequential_forward`` (no ``loss_threshold`` clamp: 0.0 as in the default),
``loss_fn = BCELoss(reduction="mean")`` (``--loss-function=bce``), the top MLP's input size
``num_int = num_fea * (num_fea - 1) / 2 + m_den_out`` prepended to ``--arch-mlp-top``;
``torch.optim.SGD(dlrm.parameters(), lr=args.learning_rate)`` (``--learning-rate=0.1``,
``--mini-batch-size=128`` as the Kaggle script); ``LRPolicyScheduler`` (linear warm-up over
``num_warmup_steps`` from ``_step_count``, then after ``decay_start_step`` a quadratic
decay over ``num_decay_steps`` floored at 1e-7, frozen in between); the training loop
(per batch: forward, ``loss_fn_wrap``, ``optimizer.zero_grad()``, ``E.backward()``,
``optimizer.step()``, ``lr_scheduler.step()``; the loss accumulated times the batch size
for the printout) and ``inference`` at the end of each epoch (``np.round`` of the
predicted click probability against the target: the test accuracy; the mlperf branch's
``roc_auc_score``); the Criteo preprocessing (negative counts set to 0, then ``log(x + 1)``
on the dense counts; categorical values as contiguous indices).
Shrunk: a synthetic click log instead of Criteo Kaggle: 13 count-like dense features
(rounded log-normal, the second one with negative values like Criteo's I2, -3 to -1 on 5%
of the rows) and 8 categorical features with 6 to 120 values drawn Zipf-like instead of
26; the click drawn from a logistic model with a weight per categorical value, the
log counts, two crossed-field effects and a count-category product (28-45% clicks by
seed); 8,192 training rows ("days" 1-7, in file order) and 2,048 test rows (the last
"day"), no validation half; ``--arch-sparse-feature-size`` 8 instead of 16,
``--arch-mlp-bot`` 13-64-8 instead of 13-512-256-64-16, ``--arch-mlp-top`` 64-32-1
instead of 512-256-1; 24 epochs of 64 batches (1,536 steps) instead of 1 epoch over 45M
rows; the scheduler's ``--lr-num-warmup-steps 100 --lr-decay-start-step 768
--lr-num-decay-steps 768`` (the flags exist with default 0; the port turns the policy on);
no quantization, ONNX, mlperf logging, tensorboard, checkpoints or multi-device paths.
Measure only (not in the program): the last ``inference`` pass's test accuracy, ROC AUC
and log loss. Seeds 0/1/2 without nndx: healthy AUC 0.844/0.837/0.883 (a logistic
regression on one-hot categories and log counts: 0.847/0.814/0.889), log loss
0.425/0.495/0.404; train_labels_unshuffled AUC 0.557/0.507/0.433;
warmup_stepped_per_epoch log loss 0.481/0.589/0.435.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
as ``((X, lS_o, lS_i), T)`` (the loader's stacked offsets and indices, the forward's three
arguments) with ``dlrm.loss_fn`` and the optimizer, the preprocessed dense matrix and the
clicks of the train and test splits as ``data``; ``nndx.Monitor(dlrm, optimizer,
loss_fn=dlrm.loss_fn)`` around the epochs, ``loss_fn_wrap`` calling ``mon.loss_fn``, each
batch's loss logged and each ``inference`` pass logged as ``split="val"`` with its
accuracy (the test loss computed alongside); then ``nndx.probe(..., monitor=mon)`` on the
first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import roc_auc_score
from torch.optim.lr_scheduler import _LRScheduler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dlrm"
SOURCE = Source("facebookresearch/dlrm", "dlrm_s_pytorch.py", "090956ee2319ddd349a42232958aefccfe3f7b0a", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published with the Kaggle script's flags (shrunk: synthetic clicks, "
                "small MLPs, 24 epochs, warm-up/decay on)"),
        Variant(
            "train_labels_unshuffled",
            "transformCriteoAdData's randomize='total' applied to X_cat and X_int of the training days (X[train_indices] "
            "after the permutation) but the clicks taken with the day-ordered indices from before it: every training "
            "row carries another row's click",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/DrexelChatbotGroup/DrexelChatbot/issues/15",
             "https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/udacity/nd320-c1-emr-data-starter/issues/4"),
            Measure("test_auc", "final test ROC AUC at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "warmup_stepped_per_epoch",
            "lr_scheduler.step() moved from the batch loop to the end of each epoch: the 100-step linear warm-up "
            "counts epochs, so SGD runs at 1-24% of its learning rate for the whole training",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/Tony-Y/pytorch_warmup/issues/14",
             "https://github.com/crowsonkb/k-diffusion/issues/50",
             "https://github.com/y0ast/Glow-PyTorch/issues/3"),
            Measure("test_logloss", "final test log loss at least 0.02 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.02),
        ),
    )
}

N_TRAIN, N_TEST, N_DENSE = 8192, 2048, 13
VOCAB = (6, 10, 16, 24, 40, 64, 90, 120)
M_SPA, ARCH_MLP_BOT, ARCH_MLP_TOP = 8, "13-64-8", "64-32-1"
LEARNING_RATE, MINI_BATCH_SIZE, NEPOCHS = 0.1, 128, 24
LR_NUM_WARMUP_STEPS, LR_DECAY_START_STEP, LR_NUM_DECAY_STEPS = 100, 768, 768


# --------------------------------------------------------------------------- the click log (Criteo stand-in)


def make_click_log(seed: int) -> dict[str, np.ndarray]:
    """Raw integer counts (negatives in column 1, like Criteo's I2), categorical indices and
    clicks of 8 "days" in file order; the last day is held out."""
    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_TEST
    mu = rng.uniform(0.5, 4.0, N_DENSE)
    sigma = rng.uniform(0.8, 1.6, N_DENSE)
    counts = np.floor(np.exp(mu + sigma * rng.standard_normal((n, N_DENSE)))).astype(np.int64)
    negative = rng.random(n) < 0.05
    counts[negative, 1] = -rng.integers(1, 4, negative.sum())
    cats = np.zeros((n, len(VOCAB)), dtype=np.int64)
    for k, size in enumerate(VOCAB):
        p = 1.0 / np.arange(1, size + 1) ** 1.1
        cats[:, k] = rng.choice(size, n, p=p / p.sum())
    logc = np.log1p(np.maximum(counts, 0))
    z = (logc - logc.mean(0)) / logc.std(0)
    logit = -1.3 + z @ (rng.normal(0, 0.5, N_DENSE))
    for k, size in enumerate(VOCAB):
        logit += rng.normal(0, 0.7, size)[cats[:, k]]
    for a, b in ((0, 3), (2, 5)):  # crossed-field effects: rank-2 latent products
        ua, ub = rng.normal(0, 0.9, (VOCAB[a], 2)), rng.normal(0, 0.9, (VOCAB[b], 2))
        logit += (ua[cats[:, a]] * ub[cats[:, b]]).sum(1)
    logit += 0.8 * z[:, 0] * rng.normal(0, 1, VOCAB[4])[cats[:, 4]]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return {"X_int": counts, "X_cat": cats, "y": y}


def transform_criteo_ad_data(raw: dict[str, np.ndarray], rng: np.random.Generator, labels_unshuffled: bool):
    """getCriteoAdData's clean-up (negative counts to 0), then transformCriteoAdData with
    data_split='train', randomize='total': the training days' indices permuted, the last day
    the test split, log(x + 1) on the counts."""
    X_int, X_cat, y = raw["X_int"].copy(), raw["X_cat"], raw["y"]
    X_int[X_int < 0] = 0
    indices = np.arange(len(y))
    train_indices, test_indices = indices[:N_TRAIN], indices[N_TRAIN:]
    day_ordered = train_indices
    train_indices = rng.permutation(train_indices)
    X_cat_train, X_int_train = X_cat[train_indices], X_int[train_indices]
    y_train = y[day_ordered] if labels_unshuffled else y[train_indices]
    X_cat_test, X_int_test, y_test = X_cat[test_indices], X_int[test_indices], y[test_indices]
    return (X_cat_train.astype(int), np.log(X_int_train.astype(np.float32) + 1), y_train.astype(np.float32),
            X_cat_test.astype(int), np.log(X_int_test.astype(np.float32) + 1), y_test.astype(np.float32))


def batches(X_int: np.ndarray, X_cat: np.ndarray, y: np.ndarray, order: np.ndarray, size: int):
    """collate_wrapper_criteo_offset: dense, stacked offsets, stacked indices, targets (B, 1)."""
    for i in range(0, len(order), size):
        idx = order[i : i + size]
        X = torch.tensor(X_int[idx], dtype=torch.float)
        lS_i = torch.tensor(X_cat[idx].T.copy(), dtype=torch.long)
        lS_o = torch.arange(len(idx)).unsqueeze(0).repeat(len(VOCAB), 1)
        T = torch.tensor(y[idx], dtype=torch.float32).view(-1, 1)
        yield X, lS_o, lS_i, T


# --------------------------------------------------------------------------- dlrm_s_pytorch.py


class LRPolicyScheduler(_LRScheduler):
    def __init__(self, optimizer, num_warmup_steps: int, decay_start_step: int, num_decay_steps: int) -> None:
        self.num_warmup_steps = num_warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_end_step = decay_start_step + num_decay_steps
        self.num_decay_steps = num_decay_steps
        if self.decay_start_step < self.num_warmup_steps:
            raise SystemExit("Learning rate warmup must finish before the decay starts")
        super().__init__(optimizer)

    def get_lr(self):
        step_count = self._step_count
        if step_count < self.num_warmup_steps:
            scale = 1.0 - (self.num_warmup_steps - step_count) / self.num_warmup_steps
            lr = [base_lr * scale for base_lr in self.base_lrs]
            self.last_lr = lr
        elif self.decay_start_step <= step_count < self.decay_end_step:
            decayed_steps = step_count - self.decay_start_step
            scale = ((self.num_decay_steps - decayed_steps) / self.num_decay_steps) ** 2
            lr = [max(0.0000001, base_lr * scale) for base_lr in self.base_lrs]
            self.last_lr = lr
        elif self.num_decay_steps > 0:
            lr = self.last_lr
        else:
            lr = self.base_lrs
        return lr


class DLRM_Net(nn.Module):
    def create_mlp(self, ln: np.ndarray, sigmoid_layer: int) -> nn.Sequential:
        layers = nn.ModuleList()
        for i in range(0, ln.size - 1):
            n, m = int(ln[i]), int(ln[i + 1])
            LL = nn.Linear(n, m, bias=True)
            W = self.np_rng.normal(0.0, np.sqrt(2 / (m + n)), size=(m, n)).astype(np.float32)
            bt = self.np_rng.normal(0.0, np.sqrt(1 / m), size=m).astype(np.float32)
            LL.weight.data = torch.tensor(W, requires_grad=True)
            LL.bias.data = torch.tensor(bt, requires_grad=True)
            layers.append(LL)
            layers.append(nn.Sigmoid() if i == sigmoid_layer else nn.ReLU())
        return nn.Sequential(*layers)

    def create_emb(self, m: int, ln: np.ndarray) -> nn.ModuleList:
        emb_l = nn.ModuleList()
        for i in range(0, ln.size):
            n = int(ln[i])
            EE = nn.EmbeddingBag(n, m, mode="sum", sparse=True)
            W = self.np_rng.uniform(low=-np.sqrt(1 / n), high=np.sqrt(1 / n), size=(n, m)).astype(np.float32)
            EE.weight.data = torch.tensor(W, requires_grad=True)
            emb_l.append(EE)
        return emb_l

    def __init__(self, m_spa: int, ln_emb: np.ndarray, ln_bot: np.ndarray, ln_top: np.ndarray,
                 arch_interaction_op: str = "dot", arch_interaction_itself: bool = False, sigmoid_bot: int = -1,
                 sigmoid_top: int = -1, loss_threshold: float = 0.0, np_rng: np.random.Generator | None = None) -> None:  # fmt: skip
        super().__init__()
        self.np_rng = np_rng if np_rng is not None else np.random.default_rng(123)
        self.arch_interaction_op = arch_interaction_op
        self.arch_interaction_itself = arch_interaction_itself
        self.loss_threshold = loss_threshold
        self.emb_l = self.create_emb(m_spa, ln_emb)
        self.bot_l = self.create_mlp(ln_bot, sigmoid_bot)
        self.top_l = self.create_mlp(ln_top, sigmoid_top)
        self.loss_fn = torch.nn.BCELoss(reduction="mean")

    def apply_mlp(self, x, layers):
        return layers(x)

    def apply_emb(self, lS_o, lS_i, emb_l):
        ly = []
        for k, sparse_index_group_batch in enumerate(lS_i):
            sparse_offset_group_batch = lS_o[k]
            E = emb_l[k]
            V = E(sparse_index_group_batch, sparse_offset_group_batch, per_sample_weights=None)
            ly.append(V)
        return ly

    def interact_features(self, x, ly):
        if self.arch_interaction_op == "dot":
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, nj = Z.shape
            offset = 1 if self.arch_interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            R = torch.cat([x] + [Zflat], dim=1)
        elif self.arch_interaction_op == "cat":
            R = torch.cat([x] + ly, dim=1)
        else:
            raise SystemExit("ERROR: --arch-interaction-op=" + self.arch_interaction_op + " is not supported")
        return R

    def forward(self, dense_x, lS_o, lS_i):
        return self.sequential_forward(dense_x, lS_o, lS_i)

    def sequential_forward(self, dense_x, lS_o, lS_i):
        x = self.apply_mlp(dense_x, self.bot_l)
        ly = self.apply_emb(lS_o, lS_i, self.emb_l)
        z = self.interact_features(x, ly)
        p = self.apply_mlp(z, self.top_l)
        if 0.0 < self.loss_threshold < 1.0:
            z = torch.clamp(p, min=self.loss_threshold, max=(1.0 - self.loss_threshold))
        else:
            z = p
        return z


# --------------------------------------------------------------------------- run()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    raw = make_click_log(seed)
    X_cat_tr, X_int_tr, y_tr, X_cat_te, X_int_te, y_te = transform_criteo_ad_data(
        raw, np.random.default_rng(seed + 1), labels_unshuffled=variant == "train_labels_unshuffled")

    ln_emb = np.array(VOCAB)
    ln_bot = np.fromstring(ARCH_MLP_BOT, dtype=int, sep="-")
    num_fea = ln_emb.size + 1
    m_den_out = ln_bot[ln_bot.size - 1]
    num_int = (num_fea * (num_fea - 1)) // 2 + m_den_out
    ln_top = np.fromstring(str(num_int) + "-" + ARCH_MLP_TOP, dtype=int, sep="-")
    dlrm = DLRM_Net(M_SPA, ln_emb, ln_bot, ln_top, arch_interaction_op="dot", arch_interaction_itself=False,
                    sigmoid_bot=-1, sigmoid_top=ln_top.size - 2, loss_threshold=0.0,
                    np_rng=np.random.default_rng(seed + 123))  # fmt: skip

    optimizer = torch.optim.SGD(dlrm.parameters(), lr=LEARNING_RATE)
    lr_scheduler = LRPolicyScheduler(optimizer, LR_NUM_WARMUP_STEPS, LR_DECAY_START_STEP, LR_NUM_DECAY_STEPS)

    X0, lS_o0, lS_i0, T0 = next(batches(X_int_tr, X_cat_tr, y_tr, np.arange(N_TRAIN), MINI_BATCH_SIZE))
    probe_batch = ((X0, lS_o0, lS_i0), T0)
    splits = (torch.tensor(X_int_tr), torch.tensor(y_tr), torch.tensor(X_int_te), torch.tensor(y_te))
    nx.preflight(dlrm, probe_batch, dlrm.loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(dlrm, optimizer, every=10, loss_fn=dlrm.loss_fn)

    def loss_fn_wrap(Z, T):
        return mon.loss_fn(Z, T)

    def inference() -> tuple[float, float, float]:
        scores, targets = [], []
        with torch.no_grad():
            for X_test, lS_o_test, lS_i_test, T_test in batches(X_int_te, X_cat_te, y_te, np.arange(N_TEST), 1024):
                Z_test = dlrm(X_test, lS_o_test, lS_i_test)
                scores.append(Z_test.detach().numpy())
                targets.append(T_test.numpy())
        S, T = np.concatenate(scores).ravel(), np.concatenate(targets).ravel()
        acc = float(np.sum((np.round(S, 0) == T).astype(np.uint8)) / len(T))
        finite = np.isfinite(S).all()
        auc = float(roc_auc_score(T, S)) if finite else float("nan")
        Sc = np.clip(S, 1e-7, 1 - 1e-7)
        logloss = float(-np.mean(T * np.log(Sc) + (1 - T) * np.log(1 - Sc))) if finite else float("nan")
        return acc, auc, logloss

    train_losses, acc, auc, logloss = [], 0.0, 0.0, 0.0
    for _k in range(NEPOCHS):
        total_loss, total_samp = 0.0, 0
        for X, lS_o, lS_i, T in batches(X_int_tr, X_cat_tr, y_tr, np.arange(N_TRAIN), MINI_BATCH_SIZE):
            mbs = T.shape[0]
            Z = dlrm(X, lS_o, lS_i)
            E = loss_fn_wrap(Z, T)
            L = E.detach().cpu().numpy()
            optimizer.zero_grad()
            E.backward()
            optimizer.step()
            if variant != "warmup_stepped_per_epoch":
                lr_scheduler.step()
            mon.log(E)
            total_loss += float(L) * mbs
            total_samp += mbs
        if variant == "warmup_stepped_per_epoch":
            lr_scheduler.step()
        train_losses.append(total_loss / total_samp)
        acc, auc, logloss = inference()
        mon.log(logloss, split="val", accuracy=acc)

    nx.finish(mon, dlrm, probe_batch, dlrm.loss_fn, optimizer=optimizer, data=splits)
    return {"test_accuracy": acc, "test_auc": auc, "test_logloss": logloss, "first_loss": train_losses[0],
            "final_loss": train_losses[-1], "click_rate": float(y_te.mean())}
