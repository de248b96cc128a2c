"""Port of juho-lee/set_transformer ``run.py``: amortized clustering of 2-D mixtures of Gaussians
with a Set Transformer (ISAB encoder, PMA + SAB decoder), trained by maximum likelihood.

Source: github.com/juho-lee/set_transformer, ``run.py``, ``models.py``, ``modules.py``,
``mixture_of_mvns.py`` and ``mvn_diag.py`` at commit
73432c640ac78140496d6738416c54d32c686d65 (MIT, Copyright (c) 2020 Juho Lee). Written anew
from the facts of those files; no code copied.

Kept: ``MAB`` (``fc_q``, ``fc_k``, ``fc_v``, ``fc_o``; the heads made by splitting the last
dimension into ``dim_V // num_heads`` chunks and concatenating them along the batch
dimension, ``softmax(Q_ K_^T / sqrt(dim_V))`` over the keys, the residual ``Q_ + A V_``,
the heads put back by splitting along the batch and concatenating along the features,
``O + relu(fc_o(O))``, the optional LayerNorms ``ln0``/``ln1`` off as ``run.py`` builds the
net); ``SAB``; ``ISAB`` (inducing points ``I`` of shape ``(1, num_inds, dim_out)``,
``xavier_uniform_``, ``mab0(I, X)`` then ``mab1(X, H)``); ``PMA`` (seeds ``S``,
``xavier_uniform_``); ``SetTransformer`` (``ISAB``, ``ISAB`` / ``PMA`` with ``K`` seeds,
``SAB``, ``SAB``, ``Linear(dim_hidden, dim_output)``); ``MultivariateNormalDiag`` (means
uniform in [-4, 4], sigma 0.3, ``log_prob`` summed over the dimensions, ``parse``:
``softmax`` of channel 0 for the mixing weights, channels 1..D the means, ``softplus`` of
the rest the scale); ``MixtureOfMVNs`` (``Dirichlet(ones(K))`` weights, ``Categorical``
labels, ``log_prob``: per-component log density plus ``log(pi + 1e-10)``, ``logsumexp``
over the components, mean); ``run.py``'s ``train``: ``D = 2``, ``K = 4``, ``dim_output =
2 * D``, ``Adam(lr=1e-3)``, the LR times 0.1 at half the steps, per step ``net.train()``,
``zero_grad``, a set size ``N`` drawn in ``[N_min, N_max)``, ``B`` sets sampled, ``loss =
-log_prob(X, *parse(net(X)))``, ``backward``, ``step``; ``test`` every ``test_freq`` steps:
the mean log likelihood over a fixed benchmark of sampled batches against the oracle's
(the true parameters').
Shrunk: ``dim_hidden`` 32 instead of 128, ``num_inds`` 8 instead of 32 (``num_heads`` 4
kept), ``N`` in [50, 100) instead of [300, 600), 600 steps instead of 50,000 (LR drop at
300), ``test_freq`` 150, a benchmark of 10 batches instead of 100 (kept in memory instead
of ``benchmark/mog_4.pkl``); ``B`` = 10 kept; no log files, checkpoints or plots; CPU.
Measure only (not in the program): the final ``test`` log likelihood (the number the
program logs), and its gap to the oracle.

nndx, as the author would add it: the net's output is scored against its own input, so a
batch is ``(X, X)`` and ``loss_fn(raw, X) = -mog.log_prob(X, *mvn.parse(raw))``; a
preflight ``nndx.probe`` on the first training batch with the optimizer,
``nndx.Monitor(net, optimizer, loss_fn=...)`` around the steps with the loss computed as
``mon.loss_fn`` and logged every step, each ``test`` logged as ``split="val"`` (its loss,
minus the log likelihood); then ``nndx.probe(..., monitor=mon)`` on that first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions import Categorical, Dirichlet

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "set_transformer"
SOURCE = Source("juho-lee/set_transformer", "run.py", "73432c640ac78140496d6738416c54d32c686d65", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: width 32, 8 inducing points, sets of 50-100, 600 steps)"),
        Variant(
            "heads_merged_by_view",
            "MAB puts the heads back with O.view(B, N, dim_V) instead of splitting along the batch and "
            "concatenating along the features: the (heads*B, N, d) tensor is reinterpreted row-major, so each "
            "set's output rows are made of other sets' and other heads' rows",
            (C.WRONG_RESHAPE,),
            ("https://github.com/reczoo/FuxiCTR/issues/30",
             "https://github.com/jsbaan/transformer-from-scratch/pull/6",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/7",
             "https://github.com/649453932/Chinese-Text-Classification-Pytorch/issues/10"),
            Measure("test_ll", "final test log likelihood at least 0.3 nats below the healthy run's (-4.50 "
                    "against -3.85 on seed 0; oracle -1.46)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the step: every step's gradient is added to all the previous "
            "ones, and Adam follows the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/chainer/chainer/pull/616"),
            Measure("test_ll", "final test log likelihood at least 0.3 nats below the healthy run's (-31.1 "
                    "against -3.85 on seed 0)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
    )
}

B, N_MIN, N_MAX, K, D = 10, 50, 100, 4, 2
DIM_HIDDEN, NUM_INDS, NUM_HEADS = 32, 8, 4
LR, NUM_STEPS, TEST_FREQ, NUM_BENCH = 1e-3, 600, 150, 10


# --------------------------------------------------------------------------- modules.py


class MAB(nn.Module):
    def __init__(self, dim_Q: int, dim_K: int, dim_V: int, num_heads: int, ln: bool = False,  # noqa: N803
                 merge_by_view: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.dim_V, self.num_heads = dim_V, num_heads
        self.fc_q = nn.Linear(dim_Q, dim_V)
        self.fc_k = nn.Linear(dim_K, dim_V)
        self.fc_v = nn.Linear(dim_K, dim_V)
        if ln:
            self.ln0 = nn.LayerNorm(dim_V)
            self.ln1 = nn.LayerNorm(dim_V)
        self.fc_o = nn.Linear(dim_V, dim_V)
        self.merge_by_view = merge_by_view

    def forward(self, Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:  # noqa: N803
        Q = self.fc_q(Q)
        K, V = self.fc_k(K), self.fc_v(K)
        dim_split = self.dim_V // self.num_heads
        Q_ = torch.cat(Q.split(dim_split, 2), 0)
        K_ = torch.cat(K.split(dim_split, 2), 0)
        V_ = torch.cat(V.split(dim_split, 2), 0)
        A = torch.softmax(Q_.bmm(K_.transpose(1, 2)) / math.sqrt(self.dim_V), 2)
        heads = Q_ + A.bmm(V_)
        if self.merge_by_view:
            O = heads.reshape(Q.size(0), Q.size(1), self.dim_V)  # the bug: row-major reinterpretation
        else:
            O = torch.cat(heads.split(Q.size(0), 0), 2)
        O = O if getattr(self, "ln0", None) is None else self.ln0(O)
        O = O + F.relu(self.fc_o(O))
        O = O if getattr(self, "ln1", None) is None else self.ln1(O)
        return O


class SAB(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, num_heads: int, ln: bool = False, **kw) -> None:
        super().__init__()
        self.mab = MAB(dim_in, dim_in, dim_out, num_heads, ln=ln, **kw)

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return self.mab(X, X)


class ISAB(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, num_heads: int, num_inds: int, ln: bool = False, **kw) -> None:
        super().__init__()
        self.I = nn.Parameter(torch.Tensor(1, num_inds, dim_out))
        nn.init.xavier_uniform_(self.I)
        self.mab0 = MAB(dim_out, dim_in, dim_out, num_heads, ln=ln, **kw)
        self.mab1 = MAB(dim_in, dim_out, dim_out, num_heads, ln=ln, **kw)

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        H = self.mab0(self.I.repeat(X.size(0), 1, 1), X)
        return self.mab1(X, H)


class PMA(nn.Module):
    def __init__(self, dim: int, num_heads: int, num_seeds: int, ln: bool = False, **kw) -> None:
        super().__init__()
        self.S = nn.Parameter(torch.Tensor(1, num_seeds, dim))
        nn.init.xavier_uniform_(self.S)
        self.mab = MAB(dim, dim, dim, num_heads, ln=ln, **kw)

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return self.mab(self.S.repeat(X.size(0), 1, 1), X)


# --------------------------------------------------------------------------- models.py


class SetTransformer(nn.Module):
    def __init__(self, dim_input: int, num_outputs: int, dim_output: int, num_inds: int = 32, dim_hidden: int = 128,
                 num_heads: int = 4, ln: bool = False, **kw) -> None:  # fmt: skip
        super().__init__()
        self.enc = nn.Sequential(
            ISAB(dim_input, dim_hidden, num_heads, num_inds, ln=ln, **kw),
            ISAB(dim_hidden, dim_hidden, num_heads, num_inds, ln=ln, **kw))  # fmt: skip
        self.dec = nn.Sequential(
            PMA(dim_hidden, num_heads, num_outputs, ln=ln, **kw),
            SAB(dim_hidden, dim_hidden, num_heads, ln=ln, **kw),
            SAB(dim_hidden, dim_hidden, num_heads, ln=ln, **kw),
            nn.Linear(dim_hidden, dim_output))  # fmt: skip

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return self.dec(self.enc(X))


# --------------------------------------------------------------------------- mvn_diag.py, mixture_of_mvns.py


class MultivariateNormalDiag:
    def __init__(self, dim: int) -> None:
        self.dim = dim

    def sample(self, B: int, K: int, labels: torch.Tensor):  # noqa: N803
        N = labels.shape[-1]
        mu = -4 + 8 * torch.rand(B, K, self.dim)
        sigma = 0.3 * torch.ones(B, K, self.dim)
        eps = torch.randn(B, N, self.dim)
        rlabels = labels.unsqueeze(-1).repeat(1, 1, self.dim)
        X = torch.gather(mu, 1, rlabels) + eps * torch.gather(sigma, 1, rlabels)
        return X, (mu, sigma)

    def log_prob(self, X: torch.Tensor, params) -> torch.Tensor:  # noqa: N803
        mu, sigma = params
        diff = X.unsqueeze(2) - mu.unsqueeze(1)
        sigma = sigma.unsqueeze(1)
        ll = -0.5 * math.log(2 * math.pi) - sigma.log() - 0.5 * (diff.pow(2) / sigma.pow(2))
        return ll.sum(-1)

    def parse(self, raw: torch.Tensor):
        pi = torch.softmax(raw[..., 0], -1)
        mu = raw[..., 1 : 1 + self.dim]
        sigma = F.softplus(raw[..., 1 + self.dim :])
        return pi, (mu, sigma)


class MixtureOfMVNs:
    def __init__(self, mvn: MultivariateNormalDiag) -> None:
        self.mvn = mvn

    def sample(self, B: int, N: int, K: int, return_gt: bool = False):  # noqa: N803
        pi = Dirichlet(torch.ones(K)).sample(torch.Size([B]))
        labels = Categorical(probs=pi).sample(torch.Size([N])).transpose(0, 1).contiguous()
        X, params = self.mvn.sample(B, K, labels)
        return (X, labels, pi, params) if return_gt else X

    def log_prob(self, X: torch.Tensor, pi: torch.Tensor, params) -> torch.Tensor:  # noqa: N803
        ll = self.mvn.log_prob(X, params)
        ll = ll + (pi + 1e-10).log().unsqueeze(-2)
        return ll.logsumexp(-1).mean()


# --------------------------------------------------------------------------- run.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    mvn = MultivariateNormalDiag(D)
    mog = MixtureOfMVNs(mvn)
    dim_output = 2 * D

    # generate_benchmark(): fixed batches and the oracle's log likelihood
    bench_data, oracle = [], 0.0
    for n in np.random.randint(N_MIN, N_MAX, NUM_BENCH):
        X, _labels, pi, params = mog.sample(B, int(n), K, return_gt=True)
        oracle += mog.log_prob(X, pi, params).item()
        bench_data.append(X)
    oracle /= NUM_BENCH

    net = SetTransformer(D, K, dim_output, num_inds=NUM_INDS, dim_hidden=DIM_HIDDEN, num_heads=NUM_HEADS,
                         merge_by_view=variant == "heads_merged_by_view")  # fmt: skip

    def loss_fn(raw: torch.Tensor, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return -mog.log_prob(X, *mvn.parse(raw))

    def test() -> float:
        net.eval()
        avg_ll = 0.0
        with torch.no_grad():
            for X in bench_data:
                avg_ll += mog.log_prob(X, *mvn.parse(net(X))).item()
        return avg_ll / len(bench_data)

    optimizer = optim.Adam(net.parameters(), lr=LR)
    first_X = mog.sample(B, int(np.random.randint(N_MIN, N_MAX)), K)
    probe_batch = (first_X, first_X)
    nx.preflight(net, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5, loss_fn=loss_fn)
    tests, losses = [], []
    for t in range(1, NUM_STEPS + 1):
        if t == int(0.5 * NUM_STEPS):
            optimizer.param_groups[0]["lr"] *= 0.1
        net.train()
        if variant != "no_zero_grad":
            optimizer.zero_grad()
        X = first_X if t == 1 else mog.sample(B, int(np.random.randint(N_MIN, N_MAX)), K)
        loss = mon.loss_fn(net(X), X)
        loss.backward()
        optimizer.step()
        mon.log(loss)
        losses.append(loss.item())
        if t % TEST_FREQ == 0:
            tests.append(test())
            mon.log(-tests[-1], split="val")
    nx.finish(mon, net, probe_batch, loss_fn, optimizer=optimizer)
    return {
        "test_ll": tests[-1],
        "oracle_ll": oracle,
        "gap_to_oracle": oracle - tests[-1],
        "last_train_loss": float(np.mean(losses[-50:])),
    }
