"""Port of Dive into Deep Learning's "Gated Recurrent Units (GRU)" section, concise implementation
(PyTorch tab): ``GRU(d2l.RNN)`` wrapping ``nn.GRU(num_inputs, num_hiddens)`` inside
``d2l.RNNLM`` (one-hot inputs, a ``LazyLinear`` output layer), trained as a character language
model by d2l's ``Trainer`` with SGD at lr 4 and the gradients clipped to norm 1, scored by
perplexity.

Source: github.com/d2l-ai/d2l-en, ``chapter_recurrent-modern/gru.md`` (``GRU`` concise, ``model =
d2l.RNNLM(gru, vocab_size=len(data.vocab), lr=4)``, ``Trainer(max_epochs=50,
gradient_clip_val=1)``, ``TimeMachine(batch_size=1024, num_steps=32)``) and the ``d2l/torch.py``
pieces it calls (``RNN``, ``RNNLMScratch`` (``one_hot``, ``forward``, ``training_step``,
``validation_step``), ``RNNLM`` (``init_params`` = ``nn.LazyLinear(vocab_size)``,
``output_layer`` = ``swapaxes(self.linear(hiddens), 0, 1)``), ``Classifier.loss``,
``Module.configure_optimizers``, ``Trainer.fit``/``fit_epoch``/``clip_gradients``,
``TimeMachine``, ``Vocab``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0,
text CC BY-SA 4.0). Written anew from the facts of those files; no code copied. The text stand-in,
``Vocab``, ``TimeMachine`` and d2l's ``Trainer`` (with nndx wired into ``fit``) are
:mod:`bench.programs.d2l_rnn_scratch`'s (same commit, same library).

Kept: ``nn.GRU(len(vocab), 32)`` (time-major, as d2l calls it); ``RNNLM``: ``one_hot(X)`` =
``F.one_hot(X.T, vocab_size).float()`` (time-major ``(num_steps, batch, vocab)``), ``rnn(embs,
state)``, the ``LazyLinear`` on the hidden states and ``swapaxes(..., 0, 1)`` back to
``(batch, num_steps, vocab)``; ``Classifier.loss`` (reshape to ``(-1, vocab)`` and ``(-1,)``,
``F.cross_entropy``); ``torch.optim.SGD(parameters, lr=4)``; ``Trainer(gradient_clip_val=1)``:
per batch ``loss = training_step``, ``zero_grad``, then under ``no_grad`` ``backward``, d2l's
``clip_gradients`` (global norm, ``grad[:] *= clip / norm``) and ``step``; validation under
``no_grad``; ``num_steps`` 32, ``num_hiddens`` 32.
Replaced / shrunk: *The Time Machine* by the generated English-like text of
:mod:`bench.programs.d2l_rnn_scratch` (nothing may be downloaded); ``batch_size`` 256 (1024),
4,096 training / 1,024 validation windows (10,000 / 5,000), 12 epochs (50); the lazy output
layer materialised by one forward on the first batch before the optimizer is built (d2l's
``Trainer`` does the same through ``apply_init`` when it finds lazy modules); no plotting; CPU.
Measure only (not in the program): the last epoch's mean training and validation perplexity
(the numbers the section's plot shows) and the NLL of the predicted distribution on the
validation windows.

nndx, as the author would add it (in the shared ``Trainer.fit``): a preflight
``nndx.probe(model, first_windows, model.loss, optimizer=optim)``; ``nndx.Monitor(model,
optim)`` over the epochs with each batch's loss logged after the step and each epoch's mean
validation loss as ``split="val"``; after ``fit`` ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.d2l_rnn_scratch import TimeMachine, Trainer, generate_text
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_gru"
SOURCE = Source("d2l-ai/d2l-en", "chapter_recurrent-modern/gru.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (sample code)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section's concise GRU language model as published (shrunk: generated text, "
                "4,096 training windows, 12 epochs)"),
        Variant(
            "inputs_batch_major",
            "one_hot(X) takes F.one_hot(X, vocab) instead of F.one_hot(X.T, vocab): the (batch, num_steps, vocab) "
            "tensor reaches nn.GRU, which is time-major (batch_first=False), so the GRU runs its recurrence across "
            "the 256 sequences of the batch and treats the 32 time steps as the batch; the output layer's swapaxes "
            "then hands the loss the predictions in the wrong order",
            (C.WRONG_RESHAPE,),
            ("https://github.com/huyanxin/phasen/issues/13",
             "https://github.com/Svito-zar/gesticulator/issues/62",
             "https://github.com/pytorch/pytorch/issues/1538"),
            Measure("val_ppl", "validation perplexity at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "softmax_output_layer",
            "output_layer returns F.softmax(self.linear(hiddens), dim=-1), swapped (probabilities, as predict's "
            "argmax and sampling want them), while Classifier.loss still applies F.cross_entropy, which takes "
            "logits: the softmax is applied twice, the loss is bounded away from 0 and its gradient shrinks",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/bkitano/llama-from-scratch/issues/5",
             "https://github.com/NaJaeMin92/pytorch-DANN/issues/7",
             "https://github.com/MicrosoftDocs/ml-basics/issues/48"),
            Measure("val_nll", "validation NLL of the predicted distribution (the softmax's output with the bug) "
                    "at least 1.3x the healthy run's", lambda healthy, buggy: buggy > 1.3 * healthy),
        ),
    )
}

BATCH_SIZE, NUM_STEPS, NUM_TRAIN, NUM_VAL = 256, 32, 4096, 1024
NUM_HIDDENS, LR, GRAD_CLIP, MAX_EPOCHS = 32, 4.0, 1.0, 12


class RNN(nn.Module):  # d2l.RNN
    def __init__(self, num_inputs: int, num_hiddens: int) -> None:
        super().__init__()
        self.num_inputs, self.num_hiddens = num_inputs, num_hiddens
        self.rnn = nn.RNN(num_inputs, num_hiddens)

    def forward(self, inputs, H=None):
        return self.rnn(inputs, H)


class GRU(RNN):
    def __init__(self, num_inputs: int, num_hiddens: int) -> None:
        nn.Module.__init__(self)  # d2l.Module.__init__(self)
        self.num_inputs, self.num_hiddens = num_inputs, num_hiddens
        self.rnn = nn.GRU(num_inputs, num_hiddens)


class RNNLM(nn.Module):
    """d2l.RNNLMScratch's forward, loss and steps with d2l.RNNLM's init_params and output_layer."""

    def __init__(self, rnn: nn.Module, vocab_size: int, lr: float = 0.01, batch_major: bool = False,
                 softmax: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.rnn, self.vocab_size, self.lr, self.batch_major = rnn, vocab_size, lr, batch_major
        self.softmax = softmax
        self.history: dict[str, list[float]] = {"train_ppl": [], "val_ppl": []}
        self.init_params()

    def init_params(self):
        self.linear = nn.LazyLinear(self.vocab_size)

    def one_hot(self, X):
        if self.batch_major:  # the bug: X.T left out
            return F.one_hot(X, self.vocab_size).type(torch.float32)
        return F.one_hot(X.T, self.vocab_size).type(torch.float32)

    def output_layer(self, hiddens):
        if self.softmax:  # the bug: probabilities handed to a loss that takes logits
            return torch.swapaxes(F.softmax(self.linear(hiddens), dim=-1), 0, 1)
        return torch.swapaxes(self.linear(hiddens), 0, 1)

    def forward(self, X, state=None):
        embs = self.one_hot(X)
        rnn_outputs, _ = self.rnn(embs, state)
        return self.output_layer(rnn_outputs)

    def loss(self, Y_hat, Y, averaged=True):
        Y_hat = torch.reshape(Y_hat, (-1, Y_hat.shape[-1]))
        Y = torch.reshape(Y, (-1,))
        return F.cross_entropy(Y_hat, Y, reduction="mean" if averaged else "none")

    def training_step(self, batch):
        l = self.loss(self(*batch[:-1]), batch[-1])  # noqa: E741
        self.history["train_ppl"].append(math.exp(min(l.item(), 700.0)))  # self.plot('ppl', exp(l), train=True)
        return l

    def validation_step(self, batch):
        l = self.loss(self(*batch[:-1]), batch[-1])  # noqa: E741
        self.history["val_ppl"].append(math.exp(min(l.item(), 700.0)))  # self.plot('ppl', exp(l), train=False)
        return l

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    text = generate_text(1400, random.Random(1234 + seed))
    data = TimeMachine(text, batch_size=BATCH_SIZE, num_steps=NUM_STEPS, num_train=NUM_TRAIN, num_val=NUM_VAL)
    gru = GRU(num_inputs=len(data.vocab), num_hiddens=NUM_HIDDENS)
    model = RNNLM(gru, vocab_size=len(data.vocab), lr=LR, batch_major=variant == "inputs_batch_major",
                  softmax=variant == "softmax_output_layer")
    with torch.no_grad():  # materialise the LazyLinear (d2l's Trainer: apply_init on lazy modules)
        model(data.X[:BATCH_SIZE])
    trainer = Trainer(max_epochs=MAX_EPOCHS, gradient_clip_val=GRAD_CLIP, nx=nx)
    trainer.fit(model, data)

    model.eval()
    with torch.no_grad():  # the NLL of the distribution the model predicts, over the validation windows
        x_val = data.X[NUM_TRAIN : NUM_TRAIN + NUM_VAL]
        y_val = data.Y[NUM_TRAIN : NUM_TRAIN + NUM_VAL].reshape(-1)
        out = model(x_val).reshape(-1, model.vocab_size)
        log_p = out.clamp_min(1e-30).log() if model.softmax else F.log_softmax(out, dim=-1)
        val_nll = F.nll_loss(log_p, y_val).item()
    last_train = model.history["train_ppl"][-trainer.num_train_batches :]
    last_val = model.history["val_ppl"][-trainer.num_val_batches :]
    return {"train_ppl": sum(last_train) / len(last_train), "val_ppl": sum(last_val) / len(last_val),
            "max_train_ppl": max(model.history["train_ppl"]), "val_nll": val_nll}  # fmt: skip
