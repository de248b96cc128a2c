"""Port of karpathy/pytorch-made: MADE, an MLP made autoregressive by masks on its weights, trained on binarised images.

Source: github.com/karpathy/pytorch-made, ``made.py`` and ``run.py`` at commit
81886ccc8270cdf3a2b32cbbca5c7feab422f907 (MIT, stated in the README; Andrej Karpathy).
Written anew from the facts of those files; no code copied.

Kept: ``MaskedLinear``, an ``nn.Linear`` with a ``mask`` buffer (out x in) set from a
boolean (in x out) numpy matrix transposed, and ``F.linear(input, mask * weight, bias)``;
``MADE(nin, hidden_sizes, nout, num_masks, natural_ordering)``: ``MaskedLinear`` layers
over ``[nin] + hidden_sizes + [nout]`` with ReLUs between them (none after the last);
``update_masks`` (skipped after the first call when ``num_masks == 1``): a
``np.random.RandomState`` seeded with the model's cycling seed, the input order ``m[-1]``
(a random permutation unless natural ordering), each hidden layer's connectivity numbers
``randint(m[l-1].min(), nin - 1)``, the hidden masks ``m[l-1][:, None] <= m[l][None, :]``
and the output mask ``m[L-1][:, None] < m[-1][None, :]`` (strict), replicated when ``nout``
is a multiple of ``nin``. ``run.py``: seeds 42 (numpy and torch); ``MADE(D, hiddens, D,
num_masks=1)`` with one hidden layer; ``Adam(lr=1e-3, weight_decay=1e-4)``; ``StepLR(step_size=45,
gamma=0.1)`` stepped with the epoch number at the start of each epoch; per epoch
``run_epoch('test', upto=5)`` then ``run_epoch('train')``, and a full ``run_epoch('test')``
at the end; ``run_epoch``: grad enabled only for train, batches of B=100 in order (no
shuffling), ``update_masks`` every ``resample_every`` (20) steps in training and for every
sample in test, the logits averaged over ``samples`` (1) forward passes, the loss
``binary_cross_entropy_with_logits(summed) / B``, ``zero_grad``/``backward``/``step`` in
training, the epoch's mean loss printed.
Shrunk: scikit-learn's 8x8 digits binarised (pixel > 8 of 16; 64 dims, 1,437 train / 360
test) instead of binarised MNIST (784 dims, 50,000 / 10,000); hidden layer 256 instead of
500 (the 100 epochs and ``step_size`` 45 kept: 14 batches an epoch here); CPU.
Measure only (not in the program): the full test loss (nats per image, the program's last
line) and ``sample_on_gap``: 200 images sampled one dimension at a time in the model's
input order (``bernoulli(sigmoid(logit))``), the mean of their pixels against the test
images' (a model that peeks at the pixel it predicts samples near-blank images).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch,
``(xb, xb)`` scored by the program's loss, with the optimizer; ``nndx.Monitor(model,
opt)`` around the epochs, every training batch's loss logged and each epoch's quick test
loss as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "made"
SOURCE = Source("karpathy/pytorch-made", "run.py", "81886ccc8270cdf3a2b32cbbca5c7feab422f907", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 64 dims, hidden 256)"),
        Variant(
            "output_mask_not_strict",
            "the output layer's mask built with <= like the hidden ones instead of the strict <: an output may "
            "now depend on its own input dimension, so the model learns to copy it; the test loss falls far "
            "below what any autoregressive model reaches and sampling yields near-blank images",
            (C.DATA_LEAKAGE,),
            ("https://github.com/rll/deepul/issues/4", "https://github.com/j-min/PixelCNN/issues/3",
             "https://github.com/rosinality/vq-vae-2-pytorch/issues/31",
             "https://github.com/o-tawab/Video-Pixel-Networks/issues/1"),
            Measure("test_loss", "full test loss (nats/image) at least 5 below the healthy run's (impossibly "
                    "good for an autoregressive model): 9.48/9.73/9.89 against 18.86/18.36/18.87 healthy on "
                    "seeds 0-2; the samples' pixel mean off by 0.08-0.09 against 0.004-0.005",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "sigmoid_before_bce_with_logits",
            "the net ends in a sigmoid (the probabilities) while the loss stays "
            "binary_cross_entropy_with_logits: the sigmoid is applied twice and every pixel's probability is "
            "squeezed into [0.5, 0.73]",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/yudi-mars/daisyRec/pull/15", "https://github.com/avBuffer/UNet3plus_pth/issues/23",
             "https://github.com/itakurah/focal-loss-pytorch/pull/5",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_loss", "full test loss (nats/image) at least 5 above the healthy run's: 41.03/40.94/41.21 "
                    "against 18.86/18.36/18.87 on seeds 0-2",
                    lambda healthy, buggy: not buggy < healthy + 5.0),
        ),
    )
}

HIDDENS, EPOCHS, STEP_SIZE, B, NUM_MASKS, RESAMPLE_EVERY, SAMPLES, N_GENERATED = [256], 100, 45, 100, 1, 20, 1, 200


class MaskedLinear(nn.Linear):
    """nn.Linear whose weight is multiplied by a fixed 0/1 mask in every forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("mask", torch.ones(out_features, in_features))

    def set_mask(self, mask: np.ndarray) -> None:
        self.mask.data.copy_(torch.from_numpy(mask.astype(np.uint8).T))

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the source's name
        return F.linear(input, self.mask * self.weight, self.bias)


class MADE(nn.Module):
    def __init__(self, nin: int, hidden_sizes: list[int], nout: int, num_masks: int = 1,
                 natural_ordering: bool = False, strict_output: bool = True, sigmoid_out: bool = False,
                 ) -> None:
        super().__init__()
        self.nin, self.nout, self.hidden_sizes = nin, nout, hidden_sizes
        assert self.nout % self.nin == 0, "nout must be integer multiple of nin"
        sizes = [nin] + hidden_sizes + [nout]
        layers: list[nn.Module] = []
        for h0, h1 in zip(sizes, sizes[1:]):
            layers += [MaskedLinear(h0, h1), nn.ReLU()]
        layers.pop()  # no ReLU on the output layer
        if sigmoid_out:
            layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)
        self.natural_ordering, self.num_masks, self.seed = natural_ordering, num_masks, 0
        self.strict_output = strict_output
        self.m: dict[int, np.ndarray] = {}
        self.update_masks()

    def update_masks(self) -> None:
        if self.m and self.num_masks == 1:
            return
        n_hidden = len(self.hidden_sizes)
        rng = np.random.RandomState(self.seed)
        self.seed = (self.seed + 1) % self.num_masks
        self.m[-1] = np.arange(self.nin) if self.natural_ordering else rng.permutation(self.nin)
        for layer in range(n_hidden):
            self.m[layer] = rng.randint(self.m[layer - 1].min(), self.nin - 1, size=self.hidden_sizes[layer])
        masks = [self.m[layer - 1][:, None] <= self.m[layer][None, :] for layer in range(n_hidden)]
        if self.strict_output:
            masks.append(self.m[n_hidden - 1][:, None] < self.m[-1][None, :])
        else:
            masks.append(self.m[n_hidden - 1][:, None] <= self.m[-1][None, :])
        if self.nout > self.nin:
            masks[-1] = np.concatenate([masks[-1]] * (self.nout // self.nin), axis=1)
        for layer, mask in zip([m for m in self.net.modules() if isinstance(m, MaskedLinear)], masks):
            layer.set_mask(mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def bce_loss(xbhat: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(xbhat, xb, reduction="sum") / B


def binarised(images: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 digits (N, 8, 8) -> (N, 64) floats in {0, 1}: pixel > 8 of 16."""
    return (images.float() > 255.0 * 8 / 16).float().reshape(len(images), -1)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(42 + seed)
    torch.manual_seed(42 + seed)
    train_raw, _, test_raw, _ = data.digit_images(seed=seed)
    xtr, xte = binarised(train_raw), binarised(test_raw)

    model = MADE(xtr.size(1), list(HIDDENS), xtr.size(1), num_masks=NUM_MASKS,
                 strict_output=variant != "output_mask_not_strict",
                 sigmoid_out=variant == "sigmoid_before_bce_with_logits")  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), 1e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=STEP_SIZE, gamma=0.1)

    first_batch = (xtr[:B], xtr[:B])
    nx.preflight(model, first_batch, bce_loss, optimizer=opt)
    mon = nx.monitor(model, opt, every=5)
    printed: list[str] = []

    def run_epoch(split: str, upto: int | None = None) -> float:
        torch.set_grad_enabled(split == "train")
        model.train() if split == "train" else model.eval()
        nsamples = 1 if split == "train" else SAMPLES
        x = xtr if split == "train" else xte
        n = x.size(0)
        nsteps = n // B if upto is None else min(n // B, upto)
        lossfs = []
        for step in range(nsteps):
            xb = x[step * B : step * B + B]
            xbhat = torch.zeros_like(xb)
            for _ in range(nsamples):
                if step % RESAMPLE_EVERY == 0 or split == "test":
                    model.update_masks()
                xbhat += model(xb)
            xbhat /= nsamples
            loss = bce_loss(xbhat, xb)
            lossf = loss.item()
            lossfs.append(lossf)
            if split == "train":
                opt.zero_grad()
                loss.backward()
                opt.step()
                nx.timed(lambda: mon.log(loss))
        torch.set_grad_enabled(True)
        mean = float(np.mean(lossfs))
        printed.append(f"{split} epoch average loss: {mean:f}")
        return mean

    import warnings

    quick_test = float("nan")
    for epoch in range(EPOCHS):
        printed.append(f"epoch {epoch}")
        with warnings.catch_warnings():  # scheduler.step(epoch) is deprecated; run.py calls it so
            warnings.simplefilter("ignore")
            scheduler.step(epoch)
        quick_test = run_epoch("test", upto=5)
        nx.timed(lambda: mon.log(quick_test, split="val"))
        train_loss = run_epoch("train")
    test_loss = run_epoch("test")

    nx.finish(mon, model, first_batch, bce_loss, optimizer=opt)

    # Measure only: sample in the model's input order
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sample = torch.zeros(N_GENERATED, model.nin)
        for d in np.argsort(model.m[-1]):  # the dimension whose order number is 0, then 1, ...
            out = model(sample)[:, d]
            p = out if variant == "sigmoid_before_bce_with_logits" else torch.sigmoid(out)
            sample[:, d] = torch.bernoulli(p, generator=gen)
    return {
        "test_loss": test_loss,
        "quick_test_loss": quick_test,
        "train_loss": train_loss,
        "sample_on_gap": abs(float(sample.mean()) - float(xte.mean())),
    }
