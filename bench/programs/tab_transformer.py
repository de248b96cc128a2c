"""Port of lucidrains/tab-transformer-pytorch: TabTransformer trained as the paper and README set it up.

Source: github.com/lucidrains/tab-transformer-pytorch, ``tab_transformer_pytorch/tab_transformer_pytorch.py``
at commit a85dfa9a623d5d7ee18d8b85f2ff3eb3fc9e8b29 (the last version with plain residual
connections, before the hyper-connection and external-embedding dependencies; MIT,
Copyright (c) 2020 Phil Wang) and the README's usage; the training setup follows the
TabTransformer paper (Huang et al. 2020, arXiv:2012.06678: binary targets, cross-entropy,
AdamW, batch 256, AUC on held-out data). The repository has no training script: the loop
here is the one the README and the paper describe. Written anew from the facts of those
files; no code copied (einops' ``rearrange``/``repeat`` written as reshapes).

Kept: ``TabTransformer``: one ``nn.Embedding`` over all columns' categories plus
``num_special_tokens`` = 2, each column's ids shifted by the buffer ``categories_offset``
(the cumulative cardinalities after the special tokens); a shared per-column embedding of
``dim // 8`` (``use_shared_categ_embed``, normal(std 0.02)) concatenated to each token;
``Transformer`` of ``depth`` blocks, each ``PreNorm(Attention)`` and ``PreNorm(FeedForward)``
with residuals (``x = x + attn_out``, ``x = ff(x) + x``); ``Attention``: one bias-free
``to_qkv`` linear, ``heads`` heads of ``dim_head``, scaled dot product, softmax, dropout on
the attention map, ``to_out``; ``FeedForward``: Linear(dim, dim*4*2) -> GEGLU -> Dropout ->
Linear(dim*4, dim); the flattened contextual embeddings concatenated with the continuous
features, optionally standardised by the ``continuous_mean_std`` buffer and then
``nn.LayerNorm(num_continuous)``; the ``MLP`` head (input size ``dim * n_categ +
num_continuous``, hidden sizes ``mlp_hidden_mults`` = (4, 2) times it, ReLU, ``dim_out``).
The README's arguments (dim 32, heads 8, attn/ff dropout 0.1, ``mlp_act=nn.ReLU()``,
``continuous_mean_std`` from the training data, ``dim_out=1`` for a binary target) and the
paper's: ``nn.BCEWithLogitsLoss`` on the single logit, AdamW, batch 256, shuffled batches,
``model.eval()`` + ``no_grad`` for validation each epoch, the best-validation-AUC model
kept for the test score.
Shrunk: a synthetic table (4,000 rows: 5 categorical columns of cardinalities
(10, 5, 6, 5, 8) as in the README, 4 continuous columns in raw units: an age ~ 40 +- 12,
an income ~ 5e4 (log-normal), hours ~ 40 +- 10, a ratio ~ 0.5 +- 0.2; the label is
Bernoulli(sigmoid) of a sum of per-category effects, one categorical interaction and terms
in age, hours and ratio) instead of the paper's UCI/Kaggle sets; split 60/20/20;
depth 2 instead of 6, dim_head 8 instead of 16, 8 epochs with lr 1e-3.
Measure only (not in the program): test accuracy and AUC of the best-validation model
(the author's own evaluation).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``((x_categ, x_cont), y)`` with the loss as the loop computes it and the splits (the
``(x_categ, x_cont)`` pairs) as ``data``; ``nndx.Monitor`` around the epochs with the
criterion called as ``mon.loss_fn``, each batch's loss logged, each epoch's validation
loss and accuracy logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "tab_transformer"
SOURCE = Source("lucidrains/tab-transformer-pytorch", "tab_transformer_pytorch/tab_transformer_pytorch.py",
                "a85dfa9a623d5d7ee18d8b85f2ff3eb3fc9e8b29", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the README's model with continuous_mean_std from the training data, BCEWithLogitsLoss"),
        Variant(
            "train_labels_unshuffled",
            "the rows are shuffled before the split but the training labels are sliced from the unshuffled label "
            "column (y[:n_train] instead of y[perm[:n_train]]): every training row carries another row's label; "
            "val and test are indexed correctly",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/udacity/sdc-issue-reports/issues/1326",
             "https://github.com/ageron/handson-ml/issues/533"),
            Measure("test_auc", "test AUC at least 0.03 below the healthy run's: 0.521 against 0.814 healthy on "
                    "seed 0", lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
        Variant(
            "continuous_not_standardized",
            "continuous_mean_std left out (the README marks it optional) and the raw columns fed in: the model's "
            "LayerNorm(num_continuous) normalises across the 4 columns of a row, where the income (~5e4) swamps "
            "age, hours and ratio",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/lucidrains/tab-transformer-pytorch/pull/2",
             "https://github.com/NVIDIA-Merlin/Transformers4Rec/pull/151",
             "https://github.com/deeplearning4j/nd4j/issues/1150"),
            Measure("test_auc", "test AUC at least 0.03 below the healthy run's: 0.695 against 0.814 healthy on "
                    "seed 0", lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
    )
}

CATEGORIES = (10, 5, 6, 5, 8)
N_ROWS, DIM, DEPTH, HEADS, DIM_HEAD, EPOCHS, BATCH_SIZE, LR, WEIGHT_DECAY = 4000, 32, 2, 8, 8, 8, 256, 1e-3, 1e-2


# --------------------------------------------------------------------------- tab_transformer_pytorch.py


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor, **kwargs):
        return self.fn(self.norm(x), **kwargs)


class GEGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * mult * 2), GEGLU(), nn.Dropout(dropout),
                                 nn.Linear(dim * mult, dim))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int = 8, dim_head: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head**-0.5
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Linear(inner_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        h = self.heads
        q, k, v = (t.reshape(b, n, h, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        sim = (q @ k.transpose(-1, -2)) * self.scale
        attn = sim.softmax(dim=-1)
        out = self.dropout(attn) @ v
        out = out.transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out), attn


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, attn_dropout: float,
                 ff_dropout: float) -> None:  # fmt: skip
        super().__init__()
        self.layers = nn.ModuleList([
            nn.ModuleList([PreNorm(dim, Attention(dim, heads=heads, dim_head=dim_head, dropout=attn_dropout)),
                           PreNorm(dim, FeedForward(dim, dropout=ff_dropout))])
            for _ in range(depth)
        ])  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn, ff in self.layers:
            attn_out, _ = attn(x)
            x = x + attn_out
            x = ff(x) + x
        return x


class MLP(nn.Module):
    def __init__(self, dims: list[int], act: nn.Module | None = None) -> None:
        super().__init__()
        pairs = list(zip(dims[:-1], dims[1:]))
        layers: list[nn.Module] = []
        for ind, (dim_in, dim_out) in enumerate(pairs):
            layers.append(nn.Linear(dim_in, dim_out))
            if ind < len(pairs) - 1:
                layers.append(act if act is not None else nn.ReLU())
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class TabTransformer(nn.Module):
    def __init__(self, *, categories, num_continuous: int, dim: int, depth: int, heads: int, dim_head: int = 16,
                 dim_out: int = 1, mlp_hidden_mults=(4, 2), mlp_act: nn.Module | None = None,
                 num_special_tokens: int = 2, continuous_mean_std: torch.Tensor | None = None,
                 attn_dropout: float = 0.0, ff_dropout: float = 0.0, use_shared_categ_embed: bool = True,
                 shared_categ_dim_divisor: float = 8.0) -> None:  # fmt: skip
        super().__init__()
        self.num_categories = len(categories)
        self.num_unique_categories = sum(categories)
        self.num_special_tokens = num_special_tokens
        total_tokens = self.num_unique_categories + num_special_tokens
        shared_embed_dim = 0 if not use_shared_categ_embed else int(dim // shared_categ_dim_divisor)
        self.category_embed = nn.Embedding(total_tokens, dim - shared_embed_dim)
        self.use_shared_categ_embed = use_shared_categ_embed
        if use_shared_categ_embed:
            self.shared_category_embed = nn.Parameter(torch.zeros(self.num_categories, shared_embed_dim))
            nn.init.normal_(self.shared_category_embed, std=0.02)
        offset = F.pad(torch.tensor(list(categories)), (1, 0), value=num_special_tokens).cumsum(dim=-1)[:-1]
        self.register_buffer("categories_offset", offset)
        self.num_continuous = num_continuous
        self.register_buffer("continuous_mean_std", continuous_mean_std)
        self.norm = nn.LayerNorm(num_continuous)
        self.transformer = Transformer(dim, depth, heads, dim_head, attn_dropout, ff_dropout)
        input_size = dim * self.num_categories + num_continuous
        self.mlp = MLP([input_size, *[input_size * t for t in mlp_hidden_mults], dim_out], act=mlp_act)

    def forward(self, x_categ: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
        assert x_categ.shape[-1] == self.num_categories
        categ_embed = self.category_embed(x_categ + self.categories_offset)
        if self.use_shared_categ_embed:
            shared = self.shared_category_embed.unsqueeze(0).expand(categ_embed.shape[0], -1, -1)
            categ_embed = torch.cat((categ_embed, shared), dim=-1)
        x = self.transformer(categ_embed)
        flat_categ = x.reshape(x.shape[0], -1)
        assert x_cont.shape[1] == self.num_continuous
        if self.continuous_mean_std is not None:
            mean, std = self.continuous_mean_std.unbind(dim=-1)
            x_cont = (x_cont - mean) / std
        normed_cont = self.norm(x_cont)
        return self.mlp(torch.cat((flat_categ, normed_cont), dim=-1))


# --------------------------------------------------------------------------- the data (a synthetic table)


def make_table(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Categorical ids, raw continuous columns and a binary label depending on both."""
    rng = np.random.RandomState(1234 + seed)
    x_categ = np.stack([rng.randint(0, c, size=N_ROWS) for c in CATEGORIES], axis=1)
    age = rng.normal(40, 12, N_ROWS)
    income = np.exp(rng.normal(np.log(5e4), 0.5, N_ROWS))
    hours = rng.normal(40, 10, N_ROWS)
    ratio = rng.normal(0.5, 0.2, N_ROWS)
    x_cont = np.stack([age, income, hours, ratio], axis=1)
    effects = [rng.normal(0, 1.0, c) for c in CATEGORIES]
    logit = sum(effects[j][x_categ[:, j]] for j in range(len(CATEGORIES)))
    logit = logit + 1.5 * ((x_categ[:, 0] % 2) == (x_categ[:, 3] % 2))  # an interaction of two columns
    z = (x_cont - x_cont.mean(0)) / x_cont.std(0)
    logit = logit + 1.8 * z[:, 0] - 1.8 * z[:, 2] + 1.2 * z[:, 3] * z[:, 0] + 0.3 * z[:, 1]
    logit = logit - logit.mean()
    y = (rng.uniform(size=N_ROWS) < 1 / (1 + np.exp(-2.0 * logit / logit.std()))).astype(np.float32)
    return (torch.tensor(x_categ, dtype=torch.long), torch.tensor(x_cont, dtype=torch.float32),
            torch.tensor(y, dtype=torch.float32))  # fmt: skip


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The area under the ROC curve (Mann-Whitney, ties counted half)."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).float().mean()
    ties = (pos[:, None] == neg[None, :]).float().mean()
    return float(greater + 0.5 * ties)


# --------------------------------------------------------------------------- training


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    x_categ, x_cont, y = make_table(seed)
    perm = torch.randperm(N_ROWS, generator=torch.Generator().manual_seed(seed))
    n_train, n_val = int(0.6 * N_ROWS), int(0.2 * N_ROWS)
    parts = {"train": perm[:n_train], "val": perm[n_train:n_train + n_val], "test": perm[n_train + n_val:]}
    X = {k: (x_categ[i], x_cont[i]) for k, i in parts.items()}
    Y = {k: y[i] for k, i in parts.items()}
    if variant == "train_labels_unshuffled":  # the label column sliced by position, not by the shuffled index
        Y["train"] = y[:n_train]

    cont_train = X["train"][1]
    cont_mean_std = torch.stack([cont_train.mean(0), cont_train.std(0)], dim=-1)
    tab = TabTransformer(
        categories=CATEGORIES, num_continuous=x_cont.shape[1], dim=DIM, dim_out=1, depth=DEPTH, heads=HEADS,
        dim_head=DIM_HEAD, attn_dropout=0.1, ff_dropout=0.1, mlp_hidden_mults=(4, 2), mlp_act=nn.ReLU(),
        continuous_mean_std=None if variant == "continuous_not_standardized" else cont_mean_std,
    )  # fmt: skip
    model = tab
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loss_fn = nn.BCEWithLogitsLoss()

    def criterion(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output.squeeze(-1), target)

    def probabilities(output: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(output.squeeze(-1))

    @torch.no_grad()
    def evaluate(part: str) -> tuple[float, float, float]:
        model.eval()
        xc, xn = X[part]
        output = model(xc, xn)
        loss = criterion(output, Y[part]).item()
        prob = probabilities(output)
        acc = ((prob > 0.5).float() == Y[part]).float().mean().item()
        return loss, acc, roc_auc(prob, Y[part])

    first = torch.arange(BATCH_SIZE)
    first_batch = ((X["train"][0][first], X["train"][1][first]), Y["train"][first])
    splits = (X["train"], Y["train"], X["val"], Y["val"])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    generator = torch.Generator().manual_seed(seed)
    best_auc, best_state, history = -1.0, copy.deepcopy(model.state_dict()), []
    for epoch in range(EPOCHS):
        model.train()
        for idx in torch.randperm(n_train, generator=generator).split(BATCH_SIZE):
            xc, xn = X["train"][0][idx], X["train"][1][idx]
            loss = mon.loss_fn(model(xc, xn), Y["train"][idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
        val_loss, val_acc, val_auc = evaluate("val")
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc))
        history.append(f"epoch {epoch} loss {loss.item():.4f} val_loss {val_loss:.4f} val_auc {val_auc:.4f}")
        if val_auc > best_auc:
            best_auc, best_state = val_auc, copy.deepcopy(model.state_dict())

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    last_loss = loss.item()
    model.load_state_dict(best_state)
    test_loss, test_acc, test_auc = evaluate("test")
    return {"test_auc": test_auc, "test_acc": test_acc, "test_loss": test_loss, "best_val_auc": best_auc,
            "train_loss": last_loss}  # fmt: skip
