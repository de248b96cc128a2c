"""Port of fastai/fastbook chapter 4, "Under the Hood: Training a Digit Classifier" (3s vs 7s):
the chapter's model trained end to end by hand, with its own loss, gradient step, optimizer
class, metric and validation loop.

Source: github.com/fastai/fastbook, ``clean/04_mnist_basics.ipynb`` (the code cells of
``04_mnist_basics.ipynb``) at commit 098e12df996461ec607c774cf4e601ed716796a6 (code GPL-3.0,
Copyright fast.ai). Written anew from the notebook's cells; no fastai import.

Kept: the data pipeline: the 3s and the 7s stacked (``torch.stack(...).float()/255``), ``train_x =
torch.cat([stacked_threes, stacked_sevens]).view(-1, side*side)``, ``train_y = tensor([1]*len(threes)
+ [0]*len(sevens)).unsqueeze(1)``, the same for the valid set, ``dset = list(zip(train_x, train_y))``,
``DataLoader(dset, batch_size=256)`` (no shuffle: the notebook's loaders do not shuffle, so the
training order is the stored order, 3s then 7s), ``valid_dl`` likewise; ``mnist_loss``
(``predictions.sigmoid()`` then ``torch.where(targets==1, 1-predictions, predictions).mean()``);
``calc_grad`` (predict, ``mnist_loss``, ``backward``); ``BasicOptim`` (``p.data -= p.grad.data *
self.lr``; ``zero_grad`` sets ``p.grad = None``); ``train_epoch`` (``calc_grad``, ``opt.step()``,
``opt.zero_grad()`` per batch); ``batch_accuracy`` (``xb.sigmoid() > 0.5`` against the targets);
``validate_epoch`` (the mean of the valid batches' accuracies, rounded to 4 digits);
``train_model`` (``train_epoch`` then ``validate_epoch`` each epoch); the model ``simple_net =
nn.Sequential(nn.Linear(side*side, 30), nn.ReLU(), nn.Linear(30, 1))`` at ``lr`` 0.1, the
notebook's ``learn.fit(40, 0.1)`` for ``simple_net`` run through the chapter's own hand-written
``BasicOptim`` / ``train_model`` (which the chapter shows to be what ``Learner`` with ``SGD`` does).
Shrunk/replaced: scikit-learn's ``load_digits`` 3s and 7s (8x8, pixels 0..16 rescaled to 0..255,
then ``/255``; 280 train / 82 valid after ``bench.programs.data.digit_images``' split) instead of
MNIST_SAMPLE (28x28, 12,396 / 2,038), so ``side*side`` is 64; batch size 256 kept, which here is 2
batches an epoch (one mixed batch, then one of 7s only), so 250 epochs (500 steps) instead of 40
(about 1,960 steps); CPU; no fastai ``Learner``/``Recorder``, no plots.
Measure only (not in the program): nothing beyond ``validate_epoch``'s accuracy and the training
loss the loop computes.

nndx, as the author would add it after reading nndx's README: ``calc_grad`` returns its loss so
the loop can log it; a preflight ``nndx.probe(simple_net, first(dl), mnist_loss, optimizer=opt,
data=(train_x, train_y, valid_x, valid_y))``; ``nndx.Monitor(simple_net, opt, every=10)`` around
``train_model`` with every batch's loss logged in ``train_epoch``; after training
``nndx.probe(..., monitor=mon)`` on the same batch with the same options, then ``nndx.diagnose``.
``opt`` is the notebook's ``BasicOptim``, not a ``torch.optim`` optimizer: that is what this
program has to give.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fastbook_mnist_basics"
SOURCE = Source("fastai/fastbook", "clean/04_mnist_basics.ipynb", "098e12df996461ec607c774cf4e601ed716796a6",
                "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's simple_net trained by hand as published (shrunk: 8x8 digits 3 vs 7, "
                "280 train images, 250 epochs of 2 batches)"),
        Variant(
            "train_y_not_unsqueezed",
            "train_y built as tensor([1]*len(threes) + [0]*len(sevens)) without .unsqueeze(1): the targets are "
            "(N,) against predictions (N, 1), so torch.where in mnist_loss broadcasts them to (N, N) and every "
            "prediction is pulled toward the batch's share of 3s instead of its own label",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/MorvanZhou/PyTorch-Tutorial/issues/46",
             "https://github.com/yuji-roh/fairbatch/pull/2",
             "https://hk.javashuo.com/article/p-mrjxlmph-gd.html"),
            Measure("valid_acc", "final validate_epoch accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "zero_grad_dropped",
            "train_epoch calls calc_grad and opt.step() but no opt.zero_grad(): backward() adds each batch's "
            "gradient to .grad, so every hand-written step applies the sum of all gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/jcjohnson/pytorch-examples/issues/31",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/alisiahkoohi/Langevin-dynamics/issues/1",
             "https://github.com/llSourcell/pytorch_in_5_minutes/issues/1"),
            Measure("valid_acc", "final validate_epoch accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

BS, LR, EPOCHS, HIDDEN = 256, 0.1, 250, 30


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_img, tr_lbl, va_img, va_lbl = digits.digit_images(seed=seed)
    side = tr_img.shape[-1]

    # ## First Try: Pixel Similarity / Computing Metrics Using Broadcasting
    stacked_threes = tr_img[tr_lbl == 3].float() / 255
    stacked_sevens = tr_img[tr_lbl == 7].float() / 255
    valid_3_tens = va_img[va_lbl == 3].float() / 255
    valid_7_tens = va_img[va_lbl == 7].float() / 255

    # ## The MNIST Loss Function
    train_x = torch.cat([stacked_threes, stacked_sevens]).view(-1, side * side)
    train_y = torch.tensor([1] * len(stacked_threes) + [0] * len(stacked_sevens))
    if variant != "train_y_not_unsqueezed":
        train_y = train_y.unsqueeze(1)
    dset = list(zip(train_x, train_y))
    valid_x = torch.cat([valid_3_tens, valid_7_tens]).view(-1, side * side)
    valid_y = torch.tensor([1] * len(valid_3_tens) + [0] * len(valid_7_tens)).unsqueeze(1)
    valid_dset = list(zip(valid_x, valid_y))

    def mnist_loss(predictions, targets):
        predictions = predictions.sigmoid()
        return torch.where(targets == 1, 1 - predictions, predictions).mean()

    # ## Putting It All Together
    dl = DataLoader(dset, batch_size=BS)
    valid_dl = DataLoader(valid_dset, batch_size=BS)

    def calc_grad(xb, yb, model):
        preds = model(xb)
        loss = mnist_loss(preds, yb)
        loss.backward()
        return loss

    def batch_accuracy(xb, yb):
        preds = xb.sigmoid()
        correct = (preds > 0.5) == yb
        return correct.float().mean()

    def validate_epoch(model):
        accs = [batch_accuracy(model(xb), yb) for xb, yb in valid_dl]
        return round(torch.stack(accs).mean().item(), 4)

    # ### Creating an Optimizer
    class BasicOptim:
        def __init__(self, params, lr):
            self.params, self.lr = list(params), lr

        def step(self, *args, **kwargs):
            for p in self.params:
                p.data -= p.grad.data * self.lr

        def zero_grad(self, *args, **kwargs):
            for p in self.params:
                p.grad = None

    # ## Adding a Nonlinearity
    simple_net = nn.Sequential(nn.Linear(side * side, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    opt = BasicOptim(simple_net.parameters(), LR)

    first_batch = next(iter(dl))
    splits = (train_x, train_y, valid_x, valid_y)
    nx.preflight(simple_net, first_batch, mnist_loss, optimizer=opt, data=splits)
    mon = nx.monitor(simple_net, opt, every=10)

    epoch_losses: list[float] = []

    def train_epoch(model):
        losses = []
        for xb, yb in dl:
            loss = calc_grad(xb, yb, model)
            opt.step()
            if variant != "zero_grad_dropped":
                opt.zero_grad()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())
        epoch_losses.append(sum(losses) / len(losses))

    accs: list[float] = []

    def train_model(model, epochs):
        for _ in range(epochs):
            train_epoch(model)
            accs.append(validate_epoch(model))  # print(validate_epoch(model), end=' ')

    train_model(simple_net, EPOCHS)

    nx.finish(mon, simple_net, first_batch, mnist_loss, optimizer=opt, data=splits)

    return {"valid_acc": accs[-1], "best_valid_acc": max(accs), "final_train_loss": epoch_losses[-1],
            "first_epoch_train_loss": epoch_losses[0], "n_train": float(len(train_x))}  # fmt: skip
