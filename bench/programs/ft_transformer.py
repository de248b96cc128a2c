"""Port of rtdl's FT-Transformer and the package's example training loop (``examples/rtdl.ipynb``).

Source: github.com/yandex-research/rtdl, ``examples/rtdl.ipynb`` (the training loop) and
``rtdl/modules.py`` (``FTTransformer``, ``FeatureTokenizer``, ``Transformer``,
``MultiheadAttention``) at commit b354b35d68f28b4f5bbebd2e6d5b1f6cfa91eed1 (the last commit
holding the example notebook; the next one removed it with the deprecated package's code;
Apache-2.0). Written anew from the facts of those files; no code copied.

Kept: the notebook's regression path: ``train_test_split`` 0.8 then 0.8 again (train / val /
test), ``StandardScaler`` fitted on train for the features, the targets standardised with
the train mean/std ("CRUCIAL for neural networks when solving regression problems"),
``FTTransformer.make_default(n_num_features, cat_cardinalities=None,
last_layer_query_idx=[-1], d_out=1)`` with ``make_default_optimizer()`` (AdamW lr 1e-4,
weight_decay 1e-5, no decay for the feature tokenizer, the normalisations and the biases),
``loss_fn = F.mse_loss``; per epoch, batches of 256 shuffled indices (``zero``'s
IndexLoader), per batch ``model.train()``, ``zero_grad``, ``loss_fn(apply_model(x).squeeze(1),
y)``, ``backward``, ``step``, the loss printed every ``report_frequency`` batches (kept as a
record); after each epoch ``evaluate`` on val and test (``model.eval()``, ``no_grad``,
chunks of 1024, RMSE times ``y_std``) and the ``ProgressTracker`` for early stopping
(score ``-val_rmse``). The model: ``FeatureTokenizer`` (a weight and a bias vector per
numerical feature, uniform(+-1/sqrt(d)) init), the [CLS] token appended last,
prenormalised blocks (no LayerNorm before the first block's attention), multi-head
attention with W_q/W_k/W_v (+ W_out, zero biases, 'kaiming' = torch's default init) and
attention-probability dropout, a ReGLU FFN, residual dropout, the last block queried at
the [CLS] token only, the head LayerNorm -> ReLU -> Linear on the [CLS] token.
Shrunk: a synthetic Friedman #1 regression (``sklearn.datasets.make_friedman1``, 2,000 rows,
8 features, noise 1; the target has mean ~14 and std ~5) instead of California housing
(downloaded; same number of features); ``make_default(n_blocks=1)`` (d_token 96, attention
dropout 0.1, FFN hidden 128) instead of 3 blocks of 192; 25 epochs and a patience of 10
instead of 1,000 and 100; lr 1e-3 instead of 1e-4 (25 epochs of 5 batches, not up to
1,000 epochs; at 1e-4 the healthy run is still far from fitted).
Measure only (not in the program): the notebook's own test score (RMSE in target units)
at the best validation epoch.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``((x_num, None), y)`` (the model's ``forward(x_num, x_cat)``) with the loss as the loop
computes it and the standardised splits as ``data``; ``nndx.Monitor`` around the epochs with
that loss called as ``mon.loss_fn``, each batch's loss logged, each epoch's validation MSE
(in the loss's units) logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ft_transformer"
SOURCE = Source("yandex-research/rtdl", "examples/rtdl.ipynb", "b354b35d68f28b4f5bbebd2e6d5b1f6cfa91eed1",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (regression task, FT-Transformer)"),
        Variant(
            "targets_not_standardized",
            "the 'CRUCIAL' target standardisation left out: the model regresses the raw target (mean ~14, std ~5) "
            "with y_mean = 0, y_std = 1 in evaluate",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/deeplearning4j/nd4j/issues/1150", "https://github.com/uw-cmg/MAST-ML/issues/72",
             "https://github.com/timeseriesAI/tsai/issues/483"),
            Measure("test_rmse", "test RMSE (target units) at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "no_squeeze",
            "loss_fn(apply_model(x_batch), y_batch) without .squeeze(1): an (N, 1) prediction against an (N,) "
            "target broadcasts to (N, N) in F.mse_loss, so every prediction is pulled to the batch mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/pull/18349", "https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/pytorch/pytorch/issues/4938"),
            Measure("test_rmse", "test RMSE (target units) at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

N_SAMPLES, N_FEATURES, N_BLOCKS, N_EPOCHS, PATIENCE, BATCH_SIZE, LR = 2000, 8, 1, 25, 10, 256, 1e-3


# --------------------------------------------------------------------------- rtdl/modules.py


def reglu(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return a * F.relu(b)


class ReGLU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return reglu(x)


def _uniform_token_init(x: Tensor, d: int) -> None:
    bound = 1 / math.sqrt(d)
    nn.init.uniform_(x, -bound, bound)


class NumericalFeatureTokenizer(nn.Module):
    def __init__(self, n_features: int, d_token: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_features, d_token))
        self.bias = nn.Parameter(torch.empty(n_features, d_token))
        for p in (self.weight, self.bias):
            _uniform_token_init(p, d_token)

    def forward(self, x: Tensor) -> Tensor:
        return self.weight[None] * x[..., None] + self.bias[None]


class FeatureTokenizer(nn.Module):
    """Numerical features only here (the notebook's task has no categorical ones)."""

    def __init__(self, n_num_features: int, d_token: int) -> None:
        super().__init__()
        self.initialization = "uniform"
        self.num_tokenizer = NumericalFeatureTokenizer(n_num_features, d_token)

    @property
    def d_token(self) -> int:
        return self.num_tokenizer.weight.shape[1]

    def forward(self, x_num: Tensor, x_cat: Tensor | None) -> Tensor:
        assert x_cat is None
        return self.num_tokenizer(x_num)


class CLSToken(nn.Module):
    def __init__(self, d_token: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_token))
        _uniform_token_init(self.weight, d_token)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.weight.view(1, 1, -1).expand(len(x), 1, -1)], dim=1)


class MultiheadAttention(nn.Module):
    def __init__(self, d_token: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.W_q, self.W_k, self.W_v = (nn.Linear(d_token, d_token) for _ in range(3))
        self.W_out = nn.Linear(d_token, d_token) if n_heads > 1 else None
        self.n_heads = n_heads
        self.dropout = nn.Dropout(dropout) if dropout else None
        for m in (self.W_q, self.W_k, self.W_v):  # 'kaiming': torch's default weights, zero biases
            nn.init.zeros_(m.bias)
        if self.W_out is not None:
            nn.init.zeros_(self.W_out.bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        return x.reshape(b, t, self.n_heads, d // self.n_heads).transpose(1, 2).reshape(b * self.n_heads, t, -1)

    def forward(self, x_q: Tensor, x_kv: Tensor) -> Tensor:
        q, k, v = self.W_q(x_q), self.W_k(x_kv), self.W_v(x_kv)
        b, n_q, d = q.shape
        d_head = d // self.n_heads
        logits = self._split_heads(q) @ self._split_heads(k).transpose(1, 2) / math.sqrt(d_head)
        probs = F.softmax(logits, dim=-1)
        if self.dropout is not None:
            probs = self.dropout(probs)
        x = probs @ self._split_heads(v)
        x = x.reshape(b, self.n_heads, n_q, d_head).transpose(1, 2).reshape(b, n_q, d)
        return self.W_out(x) if self.W_out is not None else x


class FFN(nn.Module):
    def __init__(self, d_token: int, d_hidden: int, dropout: float) -> None:
        super().__init__()
        self.linear_first = nn.Linear(d_token, 2 * d_hidden)  # ReGLU halves it
        self.activation = ReGLU()
        self.dropout = nn.Dropout(dropout)
        self.linear_second = nn.Linear(d_hidden, d_token)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_second(self.dropout(self.activation(self.linear_first(x))))


class Head(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.normalization = nn.LayerNorm(d_in)
        self.activation = nn.ReLU()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.activation(self.normalization(x[:, -1])))


class Transformer(nn.Module):
    """Prenormalisation; the first block has no attention normalisation."""

    def __init__(self, d_token: int, n_blocks: int, n_heads: int, attention_dropout: float, ffn_d_hidden: int,
                 ffn_dropout: float, residual_dropout: float, last_layer_query_idx: list[int] | None,
                 d_out: int) -> None:  # fmt: skip
        super().__init__()
        self.last_layer_query_idx = last_layer_query_idx
        self.blocks = nn.ModuleList()
        for layer_idx in range(n_blocks):
            layer = nn.ModuleDict({
                "attention": MultiheadAttention(d_token, n_heads, attention_dropout),
                "ffn": FFN(d_token, ffn_d_hidden, ffn_dropout),
                "attention_residual_dropout": nn.Dropout(residual_dropout),
                "ffn_residual_dropout": nn.Dropout(residual_dropout),
                "output": nn.Identity(),
            })  # fmt: skip
            if layer_idx:
                layer["attention_normalization"] = nn.LayerNorm(d_token)
            layer["ffn_normalization"] = nn.LayerNorm(d_token)
            self.blocks.append(layer)
        self.head = Head(d_token, d_out)

    def forward(self, x: Tensor) -> Tensor:
        for layer_idx, layer in enumerate(self.blocks):
            query_idx = self.last_layer_query_idx if layer_idx + 1 == len(self.blocks) else None
            residual = layer["attention_normalization"](x) if "attention_normalization" in layer else x
            residual = layer["attention"](residual if query_idx is None else residual[:, query_idx], residual)
            if query_idx is not None:
                x = x[:, query_idx]
            x = x + layer["attention_residual_dropout"](residual)
            residual = layer["ffn"](layer["ffn_normalization"](x))
            x = x + layer["ffn_residual_dropout"](residual)
            x = layer["output"](x)
        return self.head(x)


class FTTransformer(nn.Module):
    def __init__(self, feature_tokenizer: FeatureTokenizer, transformer: Transformer) -> None:
        super().__init__()
        self.feature_tokenizer = feature_tokenizer
        self.cls_token = CLSToken(feature_tokenizer.d_token)
        self.transformer = transformer

    @classmethod
    def make_default(cls, *, n_num_features: int, n_blocks: int = 3, last_layer_query_idx: list[int] | None = None,
                     d_out: int) -> FTTransformer:  # fmt: skip
        d_token = [96, 128, 192, 256, 320, 384][n_blocks - 1]
        attention_dropout = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35][n_blocks - 1]
        ffn_dropout = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25][n_blocks - 1]
        transformer = Transformer(d_token, n_blocks, 8, attention_dropout, int(d_token * 4 / 3), ffn_dropout, 0.0,
                                  last_layer_query_idx, d_out)  # fmt: skip
        return cls(FeatureTokenizer(n_num_features, d_token), transformer)

    def optimization_param_groups(self) -> list[dict]:
        no_wd_names = ["feature_tokenizer", "normalization", ".bias"]

        def needs_wd(name: str) -> bool:
            return all(x not in name for x in no_wd_names)

        return [
            {"params": [v for k, v in self.named_parameters() if needs_wd(k)]},
            {"params": [v for k, v in self.named_parameters() if not needs_wd(k)], "weight_decay": 0.0},
        ]

    def make_default_optimizer(self, lr: float = 1e-4) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.optimization_param_groups(), lr=lr, weight_decay=1e-5)

    def forward(self, x_num: Tensor, x_cat: Tensor | None) -> Tensor:
        return self.transformer(self.cls_token(self.feature_tokenizer(x_num, x_cat)))


# --------------------------------------------------------------------------- examples/rtdl.ipynb


class ProgressTracker:
    """``zero.ProgressTracker``: the best score so far, success on a new best, fail after
    ``patience`` epochs without one."""

    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.bad_updates, self.success = patience, -math.inf, 0, False

    def update(self, score: float) -> None:
        self.success = score > self.best
        if self.success:
            self.best, self.bad_updates = score, 0
        else:
            self.bad_updates += 1

    @property
    def fail(self) -> bool:
        return self.bad_updates > self.patience


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    import sklearn.datasets
    import sklearn.model_selection
    import sklearn.preprocessing

    torch.manual_seed(123456 + seed)  # zero.improve_reproducibility(seed=123456)
    np.random.seed(123456 + seed)
    device = torch.device("cpu")

    X_all, y_all = sklearn.datasets.make_friedman1(n_samples=N_SAMPLES, n_features=N_FEATURES, noise=1.0,
                                                   random_state=seed)  # fmt: skip
    X_all, y_all = X_all.astype("float32"), y_all.astype("float32")
    X, y = {}, {}
    X["train"], X["test"], y["train"], y["test"] = sklearn.model_selection.train_test_split(
        X_all, y_all, train_size=0.8, random_state=seed)  # fmt: skip
    X["train"], X["val"], y["train"], y["val"] = sklearn.model_selection.train_test_split(
        X["train"], y["train"], train_size=0.8, random_state=seed)  # fmt: skip
    preprocess = sklearn.preprocessing.StandardScaler().fit(X["train"])
    X = {k: torch.tensor(preprocess.transform(v), device=device, dtype=torch.float32) for k, v in X.items()}
    y = {k: torch.tensor(v, device=device) for k, v in y.items()}
    if variant == "targets_not_standardized":  # the CRUCIAL block left out
        y_mean, y_std = 0.0, 1.0
    else:
        y_mean = y["train"].mean().item()
        y_std = y["train"].std().item()
        y = {k: (v - y_mean) / y_std for k, v in y.items()}

    model = FTTransformer.make_default(n_num_features=X_all.shape[1], n_blocks=N_BLOCKS, last_layer_query_idx=[-1],
                                       d_out=1)  # fmt: skip
    model.to(device)
    optimizer = model.make_default_optimizer(lr=LR)
    loss_fn = F.mse_loss

    def criterion(output: Tensor, target: Tensor) -> Tensor:  # the loop's loss expression
        if variant == "no_squeeze":
            return loss_fn(output, target)
        return loss_fn(output.squeeze(1), target)

    def apply_model(x_num: Tensor, x_cat: Tensor | None = None) -> Tensor:
        return model(x_num, x_cat)

    @torch.no_grad()
    def evaluate(part: str) -> float:
        model.eval()
        prediction = torch.cat([apply_model(batch) for batch in torch.split(X[part], 1024)]).squeeze(1).cpu().numpy()
        target = y[part].cpu().numpy()
        return float(np.mean((target - prediction) ** 2) ** 0.5 * y_std)

    n_train = len(X["train"])
    generator = torch.Generator().manual_seed(seed)
    progress = ProgressTracker(PATIENCE)
    log: list[str] = [f"Test score before training: {evaluate('test'):.4f}"]

    first_idx = torch.arange(BATCH_SIZE)
    first_batch = ((X["train"][first_idx], None), y["train"][first_idx])
    splits = (X["train"], y["train"], X["val"], y["val"])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    report_frequency = max(1, n_train // BATCH_SIZE // 5)
    best_test = val_score = test_score = float("nan")
    for epoch in range(1, N_EPOCHS + 1):
        for iteration, batch_idx in enumerate(torch.randperm(n_train, generator=generator).split(BATCH_SIZE)):
            model.train()
            optimizer.zero_grad()
            x_batch = X["train"][batch_idx]
            y_batch = y["train"][batch_idx]
            loss = mon.loss_fn(apply_model(x_batch), y_batch)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            if iteration % report_frequency == 0:
                log.append(f"(epoch) {epoch} (batch) {iteration} (loss) {loss.item():.4f}")
        val_score = evaluate("val")
        test_score = evaluate("test")
        nx.timed(lambda: mon.log((val_score / y_std) ** 2, split="val"))
        progress.update(-val_score)
        if progress.success:
            best_test = test_score
        if progress.fail:
            break

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_rmse": best_test, "best_val_rmse": -progress.best, "last_val_rmse": val_score,
            "last_test_rmse": test_score, "y_std_train": float(y_std)}  # fmt: skip
