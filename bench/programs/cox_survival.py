"""Port of havakv/pycox's CoxPH (DeepSurv): an MLP outputs a log-risk, trained on the Cox partial
log-likelihood over each batch's risk sets, scored by the concordance index.

Source: github.com/havakv/pycox, ``pycox/models/cox.py`` (``CoxPH``), ``pycox/models/loss.py``
(``cox_ph_loss``, ``cox_ph_loss_sorted``, ``CoxPHLoss``), ``pycox/simulations/relative_risk.py``
(``SimStudyNonLinearPH``) and ``examples/cox-ph.ipynb`` at commit
3eccdd7fd9844a060f50fdcc315659f33a2d2dc1 (BSD-2-Clause, Copyright (c) 2018 Haavard Kvamme); the
net and the loop are torchtuples' (github.com/havakv/torchtuples ``torchtuples/practical.py``
``MLPVanilla``/``DenseVanillaBlock``, ``torchtuples/base.py`` ``fit_dataloader``,
``torchtuples/callbacks.py`` ``EarlyStopping`` at a87a5aa1d7535fa2a5f86860e585ca183ef0584d,
BSD-2-Clause). Written anew from the facts of those files, without pycox or torchtuples; no
code copied.

Kept: the notebook's pipeline: ``np.random.seed`` / ``torch.manual_seed``; a test split of 20%
and a val split of 20% of the rest (``df.sample(frac=0.2)``); the numerical covariates
standardised with a ``StandardScaler`` fitted on train, float32; targets ``(durations,
events)``; ``MLPVanilla(in_features, [32, 32], 1, batch_norm=True, dropout=0.1,
output_bias=False)``: per hidden layer ``Linear`` (Kaiming-normal weights, ReLU gain) -> ReLU ->
``BatchNorm1d`` -> ``Dropout(0.1)``, then ``Linear(32, 1, bias=False)``; ``CoxPH(net,
tt.optim.Adam)`` with the lr set to 0.01 (the notebook's ``model.optimizer.set_lr(0.01)``
after the lr finder), i.e. ``torch.optim.Adam`` at 0.01; ``CoxPHLoss``: ``cox_ph_loss`` sorts
the batch by duration, descending, and ``cox_ph_loss_sorted`` flattens ``log_h`` and
``events``, takes ``gamma = log_h.max()``, ``log_cumsum_h = log(cumsum(exp(log_h - gamma)) +
eps) + gamma`` (eps 1e-7) and returns ``-sum((log_h - log_cumsum_h) * events) /
sum(events)``; ``fit(x_train, y_train, batch_size=256, epochs, [EarlyStopping()],
val_data=val, val_batch_size=256)``: a shuffled loader, per batch ``zero_grad``, ``out =
net(input)``, ``loss(out, *target)``, ``backward``, ``step``; per epoch the val loss (net in
eval mode, no grad, the mean of the val batches' losses); ``EarlyStopping`` (val loss,
``min_delta`` 0, patience 10, best weights kept and loaded at the end); evaluation on the test
split by the concordance index. The data: ``SimStudyNonLinearPH`` (three covariates uniform
on [-1, 1], ``g(x) = 0.44 x0 + 0.66 x1 + 0.88 x2 + 2/3 (x0^2 + x2^2 + x0 x1 + 2 x1 x2)``,
event times ``Exp(1) / (0.1 exp(g))``, censoring times ``30 Exp(1)``, everything censored at
30), the simulation pycox ships for non-linear proportional hazards.
Shrunk: 1,904 simulated patients (METABRIC's size, which the notebook uses) instead of
METABRIC; at most 100 epochs instead of 512 (early stopping ends every variant well before);
no lr finder (the notebook overrides its suggestion with 0.01 anyway); no plots; CPU.
Measure only (not in the program): the test concordance is Harrell's C on the predicted
log-risks, with pycox's comparable pairs (``t_i < t_j`` with an event at ``t_i``, or equal
times with an event at i and none at j) and ties in the prediction counted one half; the
notebook's ``EvalSurv(...).concordance_td()`` orders pairs by the survival curves, which for
a proportional-hazards model order as the log-risks do, so the baseline hazards (Breslow) it
needs are not computed here.

nndx, as the author would add it: the model computes no loss; the net is called on the
covariates and the loss on ``(durations, events)``, so nndx gets ``loss_fn(log_h, target) =
CoxPHLoss()(log_h, *target)`` and the first training batch ``(x, (durations, events))``; a
preflight ``nndx.probe`` with the optimizer; ``nndx.Monitor(net, optimizer,
loss_fn=loss_fn)`` around the fit, the batch loss computed as ``mon.loss_fn(net(input),
target)`` (where torchtuples calls its loss), every batch's loss logged and each epoch's val
loss logged as ``split="val"`` (a torchtuples callback's place); after the fit (best weights
loaded, as ``EarlyStopping`` does) ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import Tensor, nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cox_survival"
SOURCE = Source("havakv/pycox", "pycox/models/loss.py", "3eccdd7fd9844a060f50fdcc315659f33a2d2dc1", "BSD-2-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the CoxPH notebook as published (shrunk: simulated non-linear PH data, 1,904 patients)"),
        Variant(
            "sorted_ascending",
            "cox_ph_loss sorts the batch with durations.sort() (descending=True left out): the cumulative sum "
            "then runs over the patients who left the study before each event, not the risk set still at risk, "
            "so the loss rewards the reverse of the true risk ordering",
            (C.WRONG_LOSS,),
            ("https://github.com/jaredleekatzman/DeepSurv/issues/40",
             "https://github.com/UK-Digital-Heart-Project/4Dsurvival/issues/2",
             "https://github.com/jaredleekatzman/DeepSurv/issues/71"),
            Measure("test_concordance", "test concordance at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "censoring_flag_as_event",
            "the target's second column is the censoring flag (1 = censored, the TCGA-style 'censorship' column) "
            "passed where CoxPHLoss expects the event indicator (1 = event): the partial likelihood is taken "
            "over the censorings, and the patients who died only fill the risk sets",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED),
            ("https://github.com/sktime/skpro/pull/306",
             "https://github.com/som-shahlab/survlearners/pull/128",
             "https://github.com/mahmoodlab/Patch-GCN/issues/19"),
            Measure("test_concordance", "test concordance at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

N_PATIENTS, H0, RIGHT_C, C0 = 1904, 0.1, 30.0, 30.0
NUM_NODES, DROPOUT, LR, BATCH_SIZE, EPOCHS, PATIENCE = (32, 32), 0.1, 0.01, 256, 100, 10


# --------------------------------------------------------------------------- pycox/simulations/relative_risk.py


def g(x: np.ndarray) -> np.ndarray:
    x0, x1, x2 = x[:, 0], x[:, 1], x[:, 2]
    linear = 0.44 * x0 + 0.66 * x1 + 0.88 * x2
    return linear + 2 / 3 * (x0**2 + x2**2 + x0 * x1 + x1 * x2 + x1 * x2)


def simulate(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SimStudyNonLinearPH: covariates, durations, events (1.0 / 0.0)."""
    covs = rng.uniform(-1, 1, size=(n, 3)).astype("float32")
    t = rng.exponential(size=n) / (H0 * np.exp(g(covs)))
    c = C0 * rng.exponential(size=n)
    tt = t.copy()
    tt[c < t] = c[c < t]
    tt[tt > RIGHT_C] = RIGHT_C
    return covs, tt.astype("float32"), (tt == t).astype("float32")


# --------------------------------------------------------------------------- torchtuples/practical.py


class DenseVanillaBlock(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, batch_norm: bool = True,
                 dropout: float = 0.0, activation=nn.ReLU) -> None:  # fmt: skip
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias)
        nn.init.kaiming_normal_(self.linear.weight.data, nonlinearity="relu")
        self.activation = activation()
        self.batch_norm = nn.BatchNorm1d(out_features) if batch_norm else None
        self.dropout = nn.Dropout(dropout) if dropout else None

    def forward(self, input: Tensor) -> Tensor:
        input = self.activation(self.linear(input))
        if self.batch_norm:
            input = self.batch_norm(input)
        if self.dropout:
            input = self.dropout(input)
        return input


class MLPVanilla(nn.Module):
    def __init__(self, in_features: int, num_nodes, out_features: int, batch_norm: bool = True,
                 dropout: float | None = None, output_bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        nodes = [in_features, *num_nodes]
        net: list[nn.Module] = [DenseVanillaBlock(n_in, n_out, True, batch_norm, dropout)
                                for n_in, n_out in zip(nodes[:-1], nodes[1:])]  # fmt: skip
        net.append(nn.Linear(nodes[-1], out_features, output_bias))
        self.net = nn.Sequential(*net)

    def forward(self, input: Tensor) -> Tensor:
        return self.net(input)


# --------------------------------------------------------------------------- pycox/models/loss.py


def cox_ph_loss_sorted(log_h: Tensor, events: Tensor, eps: float = 1e-7) -> Tensor:
    if events.dtype is torch.bool:
        events = events.float()
    events = events.view(-1)
    log_h = log_h.view(-1)
    gamma = log_h.max()
    log_cumsum_h = log_h.sub(gamma).exp().cumsum(0).add(eps).log().add(gamma)
    return -log_h.sub(log_cumsum_h).mul(events).sum().div(events.sum())


def cox_ph_loss(log_h: Tensor, durations: Tensor, events: Tensor, eps: float = 1e-7,
                descending: bool = True) -> Tensor:
    idx = durations.sort(descending=descending)[1]
    events = events[idx]
    log_h = log_h[idx]
    return cox_ph_loss_sorted(log_h, events, eps)


class CoxPHLoss(nn.Module):
    def __init__(self, descending: bool = True) -> None:
        super().__init__()
        self.descending = descending

    def forward(self, log_h: Tensor, durations: Tensor, events: Tensor) -> Tensor:
        return cox_ph_loss(log_h, durations, events, descending=self.descending)


# --------------------------------------------------------------------------- evaluation (measure only)


def concordance(log_h: np.ndarray, durations: np.ndarray, events: np.ndarray) -> float:
    t_i, t_j = durations[:, None], durations[None, :]
    d_i, d_j = events[:, None] == 1, events[None, :] == 1
    comparable = ((t_i < t_j) & d_i) | ((t_i == t_j) & d_i & ~d_j)
    r_i, r_j = log_h[:, None], log_h[None, :]
    score = np.where(r_i > r_j, 1.0, np.where(r_i == r_j, 0.5, 0.0))
    return float((score * comparable).sum() / comparable.sum())


# --------------------------------------------------------------------------- examples/cox-ph.ipynb


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(1234 + seed)
    torch.manual_seed(123 + seed)
    covs, durations, events = simulate(N_PATIENTS, rng)
    order = rng.permutation(N_PATIENTS)
    n_test = round(0.2 * N_PATIENTS)
    test_idx, rest = order[:n_test], order[n_test:]
    n_val = round(0.2 * len(rest))
    val_idx, train_idx = rest[:n_val], rest[n_val:]

    mean, std = covs[train_idx].mean(0), covs[train_idx].std(0)  # StandardScaler fitted on train
    x_all = torch.from_numpy(((covs - mean) / std).astype("float32"))
    dur_all, ev_all = torch.from_numpy(durations), torch.from_numpy(events)
    # get_target: (durations, events); the bug hands the censoring flag, 1 - event, as the events
    flag = 1 - ev_all if variant == "censoring_flag_as_event" else ev_all
    x_train, y_train = x_all[train_idx], (dur_all[train_idx], flag[train_idx])
    x_val, y_val = x_all[val_idx], (dur_all[val_idx], flag[val_idx])
    x_test, durations_test, events_test = x_all[test_idx], durations[test_idx], events[test_idx]

    net = MLPVanilla(x_train.shape[1], NUM_NODES, 1, batch_norm=True, dropout=DROPOUT, output_bias=False)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    criterion = CoxPHLoss(descending=variant != "sorted_ascending")

    def loss_fn(log_h: Tensor, target: tuple[Tensor, Tensor]) -> Tensor:
        return criterion(log_h, *target)

    first_batch = (x_train[:BATCH_SIZE], (y_train[0][:BATCH_SIZE], y_train[1][:BATCH_SIZE]))
    nx.preflight(net, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5, loss_fn=loss_fn)
    shuffle_gen = torch.Generator().manual_seed(seed)

    n_train = len(x_train)
    cur_best, best_state, since_best = np.inf, None, 0
    train_loss = val_loss = float("nan")
    epochs_run = 0
    for _epoch in range(EPOCHS):
        net.train()
        perm = torch.randperm(n_train, generator=shuffle_gen)
        batch_losses = []
        for start in range(0, n_train, BATCH_SIZE):
            idx = perm[start : start + BATCH_SIZE]
            input, target = x_train[idx], (y_train[0][idx], y_train[1][idx])
            optimizer.zero_grad()
            batch_loss = mon.loss_fn(net(input), target)
            batch_loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(batch_loss))  # noqa: B023
            batch_losses.append(batch_loss.item())
        train_loss = float(np.mean(batch_losses))
        net.eval()
        with torch.no_grad():
            val_losses = [loss_fn(net(x_val[s : s + BATCH_SIZE]), (y_val[0][s : s + BATCH_SIZE],
                                                                 y_val[1][s : s + BATCH_SIZE])).item()
                          for s in range(0, len(x_val), BATCH_SIZE)]  # fmt: skip
        net.train()
        val_loss = float(np.mean(val_losses))
        nx.timed(lambda: mon.log(val_loss, split="val"))  # noqa: B023
        epochs_run += 1
        if val_loss < cur_best:  # EarlyStopping(min_delta=0, patience=10), checkpointing the best
            cur_best, best_state, since_best = val_loss, copy.deepcopy(net.state_dict()), 0
        else:
            since_best += 1
        if since_best >= PATIENCE:
            break
    if best_state is not None:  # load_best=True
        net.load_state_dict(best_state)

    nx.finish(mon, net, first_batch, loss_fn, optimizer=optimizer)

    net.eval()
    with torch.no_grad():
        log_h_test = net(x_test).view(-1).numpy()
    return {"test_concordance": concordance(log_h_test, durations_test, events_test), "best_val_loss": cur_best,
            "final_train_loss": train_loss, "epochs": float(epochs_run),
            "censored_fraction": float(1 - events.mean())}  # fmt: skip
