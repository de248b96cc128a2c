"""The model families: each a correct, tiny training setup (data, model, loss, optimizer).

Tuned half (rules may be tuned on these): mlp, cnn_bn, lstm, regression.
Held-out half (reported separately; never tune on them): rescnn, char_lm, vae, binary,
seqconv. Each held-out family has a tuned relative (rescnn~cnn_bn, char_lm~lstm,
binary~mlp, vae~regression, seqconv~lstm) but differs in what matters to a diagnosis:
residual blocks and module activations, integer tokens and attention, a tuple output with
sampling and a composite loss, one logit with BCE and functional activations, 1-D
convolutions pooled over time. seqconv was added after the rule changes of 2026-12-03's
second session, for which the other held-out families' failures were looked at: it is
the one family no rule change has seen.

Data are synthetic or scikit-learn's ``load_digits`` (offline), seeded by the case
seed; sizes are tiny so a run takes well under a second on one CPU thread.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from . import models
from .spec import Data, Spec

TUNED = ("mlp", "cnn_bn", "lstm", "regression")
HELD_OUT = ("rescnn", "char_lm", "vae", "binary", "seqconv")


@dataclass(frozen=True)
class Family:
    name: str
    task: str  # "multiclass", "binary", "regression", "lm", "vae"
    inputs: str  # "tabular", "image", "sequence", "tokens"
    data: Callable[[int, Spec], Data]
    model: Callable[[Spec, Data], nn.Module]
    switches: frozenset[str]  # model-code bugs (spec.bugs) this family's code has a place for
    optimizer: str
    lr: float
    sgd_lr: float  # SGD (momentum 0.9) learning rate, for variants that need SGD
    manual_lr: float  # plain SGD written by hand, no optimizer object
    batch_size: int
    steps: int
    functional: bool  # how its code writes hidden activations
    dropout: float = 0.0
    has_batchnorm: bool = False
    dead_bias: Callable[[nn.Module], torch.Tensor] | None = None  # the bias feeding the first ReLU
    mlp_like: bool = False  # act/depth/width knobs of an MLP apply
    manual_clip: float | None = None  # the hand-written loop clips (as the word-language-model example does)

    @property
    def half(self) -> str:
        return "tuned" if self.name in TUNED else "held-out"

    @property
    def classification(self) -> bool:
        return self.task in ("multiclass", "binary", "lm")


def _gen(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * seed + salt)


def _split(x: torch.Tensor, y: torch.Tensor, n_val: int, classes: int | None) -> Data:
    return Data(x[n_val:], y[n_val:], x[:n_val], y[:n_val], classes)


# --------------------------------------------------------------------------- data


def clusters(seed: int, spec: Spec) -> Data:
    """4 classes, each the union of 3 Gaussian clusters in 16-D: not linearly separable."""
    gen = _gen(seed, 1)
    centers = torch.randn(12, 16, generator=gen)
    which = torch.randint(0, 12, (1024,), generator=gen)
    x = centers[which] + torch.randn(1024, 16, generator=gen)
    x = (x - x[256:].mean(0)) / x[256:].std(0)
    return _split(x, which % 4, 256, 4)


def xor(seed: int, spec: Spec) -> Data:
    """Binary XOR of the signs of two of 10 features, 5% of labels flipped."""
    gen = _gen(seed, 2)
    x = torch.randn(1024, 10, generator=gen)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).float()
    flip = torch.rand(1024, generator=gen) < 0.05
    y = torch.where(flip, 1 - y, y)
    return _split(x, y.unsqueeze(1), 256, 2)


def smooth_regression(seed: int, spec: Spec) -> Data:
    gen = _gen(seed, 3)
    x = torch.randn(1024, 8, generator=gen)
    w = torch.randn(8, generator=gen)
    y = torch.sin(x @ w / 2) + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(1024, generator=gen)
    y = (y - y[256:].mean()) / y[256:].std()
    return _split(x, y.unsqueeze(1), 256, None)


@functools.cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target, dtype=torch.long)


def digit_images(seed: int, spec: Spec) -> Data:
    """load_digits as 1×8×8 images scaled to [0, 1] and normalised by the global mean/std
    (like torchvision's Normalize): 800 for training, 400 held out."""
    x, y = _digits()
    order = torch.randperm(len(y), generator=_gen(seed, 4))[:1200]
    x = x[order].view(-1, 1, 8, 8) / 16.0
    x = (x - 0.30) / 0.37
    return _split(x, y[order], 400, 10)


def digit_vectors(seed: int, spec: Spec) -> Data:
    """load_digits as 64 pixels in [0, 1] (800 + 400 held out); the VAE's target is its input."""
    x, _ = _digits()
    x = x[torch.randperm(len(x), generator=_gen(seed, 5))[:1200]] / 16.0
    return _split(x, x, 400, None)


def spikes(seed: int, spec: Spec) -> Data:
    """Sequence classes: 12 steps × 4 noisy channels; the class is the channel that
    spikes (+2.5) at 3 random steps. With ``spec.token_inputs``: 12 tokens where the
    class's signature token appears 3 times."""
    gen = _gen(seed, 6)
    n = 1024
    y = torch.randint(0, 4, (n,), generator=gen)
    if spec.token_inputs:
        x = torch.randint(4, 12, (n, 12), generator=gen)
        for _ in range(3):
            x[torch.arange(n), torch.randint(0, 12, (n,), generator=gen)] = y
        return _split(x, y, 256, 4)
    x = torch.randn(n, 12, 4, generator=gen)
    for _ in range(3):
        x[torch.arange(n), torch.randint(0, 12, (n,), generator=gen), y] += 2.5
    return _split(x, y, 256, 4)


VOCAB, BLOCK = 12, 16


def markov_text(seed: int, spec: Spec) -> Data:
    """A character stream from a random second-order Markov chain whose transitions are
    peaked (each context mostly goes to two characters); windows of BLOCK characters,
    targets shifted by one."""
    gen = _gen(seed, 7)
    logits = torch.randn(VOCAB, VOCAB, VOCAB, generator=gen) * 2.5
    probs = logits.softmax(-1)
    length = 24000
    stream = torch.empty(length, dtype=torch.long)
    stream[:2] = torch.randint(0, VOCAB, (2,), generator=gen)
    u = torch.rand(length, generator=gen)
    cdf = probs.cumsum(-1)
    for i in range(2, length):
        stream[i] = min(int(torch.searchsorted(cdf[stream[i - 2], stream[i - 1]], u[i])), VOCAB - 1)
    cut = int(length * 0.8)

    def windows(lo: int, hi: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(lo, hi - BLOCK - 1, (n,), generator=gen)
        idx = starts[:, None] + torch.arange(BLOCK)
        return stream[idx], stream[idx + 1]

    x, y = windows(0, cut, 768)
    xv, yv = windows(cut, length, 256)
    return Data(x, y, xv, yv, VOCAB)


# --------------------------------------------------------------------------- models


def _mlp(outputs: int, width: int, depth: int, kind: str):
    def make(spec: Spec, data: Data) -> nn.Module:
        family = FAMILIES[spec.family]
        return models.MLP(spec, data.x.shape[1], outputs, spec.width or width, spec.depth or depth, kind,
                          _functional(spec, family), family.dropout if spec.dropout is None else spec.dropout)  # fmt: skip

    return make


def _functional(spec: Spec, family: Family) -> bool:
    return family.functional if spec.functional is None else spec.functional


def _dropout(spec: Spec, family: Family) -> float:
    return family.dropout if spec.dropout is None else spec.dropout


def _cnn(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    return models.SmallCNN(spec, spec.width or 8, _functional(spec, f), _dropout(spec, f))


def _rescnn(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    return models.ResCNN(spec, spec.width or 8, _functional(spec, f), _dropout(spec, f))


def _lstm(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    vocab = 12 if spec.token_inputs else None
    return models.SeqClassifier(spec, data.x.shape[-1], spec.width or 32, 4, _functional(spec, f), _dropout(spec, f), vocab)


def _char_lm(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    return models.CharLM(spec, VOCAB, BLOCK, spec.width or 24, 1, 4, _dropout(spec, f), _functional(spec, f))


def _seqconv(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    return models.SeqConv(spec, data.x.shape[-1], spec.width or 32, 4, _functional(spec, f), _dropout(spec, f))


def _vae(spec: Spec, data: Data) -> nn.Module:
    f = FAMILIES[spec.family]
    return models.VAE(spec, spec.width or 64, 8, _functional(spec, f), _dropout(spec, f))


HEAD_SWITCHES = frozenset({"relu_out", "detach_body", "dropout_always"})
HIDDEN_SWITCHES = frozenset({"no_activation", "broken_backward", "inplace", "std_no_eps", "std_eps"})

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("mlp", "multiclass", "tabular", clusters, _mlp(4, 64, 2, "relu"),
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"softmax_out"}, "adam", 3e-3, 0.05, 0.2, 64, 120,
               functional=False, dead_bias=lambda m: m.hidden[0].bias, mlp_like=True),
        Family("cnn_bn", "multiclass", "image", digit_images, _cnn,
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"softmax_out"}, "adam", 3e-3, 0.05, 0.2, 32, 100,
               functional=True, dropout=0.25, has_batchnorm=True, dead_bias=lambda m: m.bn1.bias),
        Family("lstm", "multiclass", "sequence", spikes, _lstm,
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"softmax_out", "batch_first", "time_major_view", "time_major"},
               "adam", 1e-2, 0.1, 1.0, 32, 120, functional=False, dropout=0.2, dead_bias=lambda m: m.fc.bias,
               manual_clip=1.0),
        Family("regression", "regression", "tabular", smooth_regression, _mlp(1, 64, 2, "relu"),
               HEAD_SWITCHES - {"relu_out"} | HIDDEN_SWITCHES | {"sigmoid_out"}, "adam", 3e-3, 0.02, 0.2, 64, 120,
               functional=False, dead_bias=lambda m: m.hidden[0].bias, mlp_like=True),
        Family("rescnn", "multiclass", "image", digit_images, _rescnn,
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"softmax_out"}, "adamw", 5e-3, 0.05, 1.0, 32, 80,
               functional=False, has_batchnorm=True, dead_bias=lambda m: m.stem_bn.bias),
        Family("char_lm", "lm", "tokens", markov_text, _char_lm,
               HEAD_SWITCHES | {"no_activation", "softmax_out", "heads_view"}, "adamw", 1e-2, 0.3, 1.0, 16, 100,
               functional=False, dropout=0.1, manual_clip=0.25),
        Family("vae", "vae", "tabular", digit_vectors, _vae,
               HIDDEN_SWITCHES | {"sigmoid_out", "detach_body", "dropout_always"}, "adam", 3e-3, 0.01, 0.05, 64, 120,
               functional=True, dead_bias=lambda m: m.fc1.bias),
        Family("seqconv", "multiclass", "sequence", spikes, _seqconv,
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"softmax_out"}, "adam", 3e-3, 0.05, 0.2, 32, 100,
               functional=True, dropout=0.1, dead_bias=lambda m: m.conv1.bias),
        Family("binary", "binary", "tabular", xor, _mlp(1, 32, 2, "relu"),
               HEAD_SWITCHES | HIDDEN_SWITCHES | {"sigmoid_out"}, "adam", 1e-2, 0.1, 1.0, 64, 100,
               functional=True, dead_bias=lambda m: m.hidden[0].bias, mlp_like=True),
    )
}  # fmt: skip


def base_spec(family: str, seed: int) -> Spec:
    """The family's correct script."""
    return Spec(family=family, seed=seed)
