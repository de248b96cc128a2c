"""Port of d2l.ai's "Recurrent Neural Network Implementation from Scratch" (PyTorch tab): an RNN
with its own ``nn.Parameter``s (``W_xh``, ``W_hh``, ``b_h``, then ``W_hq``, ``b_q``), one-hot inputs,
the hidden state carried through the time steps by a Python loop, trained as a character
language model by d2l's ``Trainer`` (``torch.optim.SGD`` at lr 1, the gradients clipped by hand
to norm 1 in ``clip_gradients``), scored by perplexity.

Source: github.com/d2l-ai/d2l-en, ``chapter_recurrent-neural-networks/rnn-scratch.md`` and the
classes it builds on in ``d2l/torch.py`` (``Module``, ``DataModule.get_tensorloader``, ``Trainer``
(``fit``, ``fit_epoch``, ``clip_gradients``), ``Classifier.loss``, ``TimeMachine``, ``Vocab``) at
commit 23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0, text CC BY-SA 4.0). Written
anew from the facts of those files; no code copied.

Kept: ``RNNScratch(num_inputs, num_hiddens, sigma=0.01)`` (``randn * sigma`` weights, zero bias;
``forward`` transposed inputs ``(num_steps, batch, vocab)``, state zeros when None, per step
``state = tanh(X @ W_xh + state @ W_hh + b_h)``, the outputs listed); ``RNNLMScratch(rnn,
vocab_size, lr)`` (``W_hq = randn * sigma``, ``b_q`` zeros; ``one_hot`` = ``F.one_hot(X.T,
vocab_size).float()``; ``output_layer`` = ``stack([H @ W_hq + b_q], 1)``; ``forward``);
``Classifier.loss`` (``Y_hat`` reshaped to ``(-1, vocab)``, ``Y`` to ``(-1,)``,
``F.cross_entropy``, mean); ``training_step``/``validation_step`` (perplexity = ``exp(loss)``,
plotted); ``Module.configure_optimizers`` = ``torch.optim.SGD(self.parameters(), lr=self.lr)``;
``Trainer.fit``/``fit_epoch`` (``model.train()``; per batch ``loss = training_step(batch)``,
``optim.zero_grad()``, then under ``torch.no_grad()``: ``loss.backward()``, ``clip_gradients``
when ``gradient_clip_val > 0``, ``optim.step()``; then ``model.eval()`` and the validation
batches under ``no_grad``); ``clip_gradients`` (``norm = sqrt(sum(sum(p.grad ** 2)))``, and when
above the value ``param.grad[:] *= grad_clip_val / norm``); ``TimeMachine``'s pipeline
(``re.sub('[^A-Za-z]+', ' ', text).lower()``, characters as tokens, ``Vocab`` = sorted set of the
tokens and ``<unk>``, every window of ``num_steps + 1`` characters as one sample, ``X`` the first
``num_steps``, ``Y`` the last ``num_steps``, the first ``num_train`` windows for training and the
next ``num_val`` for validation, ``DataLoader(TensorDataset, batch_size, shuffle=train)``);
``num_hiddens`` 32, ``num_steps`` 32, ``lr`` 1, ``gradient_clip_val`` 1, as the section sets them.
Replaced: *The Time Machine* by a generated English-like text (sentences drawn from a small
grammar of ~60 words; about 62,000 characters after preprocessing), which has to be written
here since nothing may be downloaded. Shrunk: ``batch_size`` 256 (1024), ``num_train`` 4,096
(10,000), ``num_val`` 1,024 (5,000), 12 epochs (100); CPU; the ProgressBoard's plot replaced
by recording the same numbers.
Measure only (not in the program): nothing beyond the numbers the plot shows, the last
epoch's mean training and validation perplexity.

nndx, as the author would add it: the Trainer builds the optimizer in ``fit``, so the preflight
``nndx.probe(model, (X[:256], Y[:256]), model.loss, optimizer=trainer.optim)`` (the first
training windows, a batch's worth) runs there, after
``configure_optimizers``; ``nndx.Monitor(model, trainer.optim)`` is open for the epochs, each
batch's loss logged after the step (where the ProgressBoard draws the training perplexity) and
each epoch's mean validation loss logged as ``split="val"``; after ``fit``
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random
import re

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_rnn_scratch"
SOURCE = Source("d2l-ai/d2l-en", "chapter_recurrent-neural-networks/rnn-scratch.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section as published (shrunk: a generated text, 4,096 training windows, 12 epochs)"),
        Variant(
            "labels_not_transposed",
            "output_layer stacks the time steps first (stack(outputs, 0), the time-major order of the first "
            "edition's torch.cat(outputs, dim=0)) while the loss flattens Y batch-major (Y.reshape(-1), the first "
            "edition's Y.T left out): every prediction is scored against the character of another sequence "
            "and time step",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/apache/mxnet/issues/2702",
             "https://github.com/deeppavlov/deep-nlp-seminars/pull/4",
             "https://discuss.d2l.ai/t/486"),
            Measure("val_ppl", "validation perplexity at least 1.5x the healthy run's: 16.2 against 5.87 on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "softmax_in_output_layer",
            "output_layer returns F.softmax(H @ W_hq + b_q, dim=-1) (probabilities, for predict's argmax) while "
            "Classifier.loss still applies F.cross_entropy, which takes logits: the softmax is applied twice, the "
            "loss is bounded away from 0 and its gradient shrinks",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/NVIDIA/VariantWorks/pull/134",
             "https://github.com/bkitano/llama-from-scratch/issues/5",
             "https://github.com/ariecattan/SciCo/issues/2"),
            Measure("val_ppl", "validation perplexity at least 1.2x the healthy run's: 24.1 against 5.87 on seed 0",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

BATCH_SIZE, NUM_STEPS, NUM_TRAIN, NUM_VAL = 256, 32, 4096, 1024
NUM_HIDDENS, LR, GRAD_CLIP, MAX_EPOCHS = 32, 1.0, 1.0, 12


# --------------------------------------------------------------------------- the text (in place of The Time Machine)

SUBJECTS = ["the time traveller", "the psychologist", "the medical man", "filby", "the provincial mayor",
            "the very young man", "weena", "the morlocks", "i", "he", "we", "the eloi"]  # fmt: skip
VERBS = ["saw", "said", "looked at", "thought of", "went to", "came from", "told", "took", "found", "knew"]
OBJECTS = ["the machine", "the lamp", "the fire", "the little people", "the white sphinx", "the palace",
           "the future", "the dark", "the garden", "a match", "the lever", "the laboratory"]  # fmt: skip
ADVERBS = ["slowly", "again", "at last", "in the night", "with a smile", "for a moment", "very quietly"]


def generate_text(n_sentences: int, rng: random.Random) -> str:
    sentences = []
    for _ in range(n_sentences):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        if rng.random() < 0.5:
            s += f" {rng.choice(ADVERBS)}"
        if rng.random() < 0.3:
            s += f", and {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        sentences.append(s[0].upper() + s[1:] + ".")
    return "\n".join(sentences)


class Vocab:
    """d2l's Vocab: the sorted set of '<unk>' and the tokens."""

    def __init__(self, tokens: list[str]) -> None:
        self.idx_to_token = list(sorted(set(["<unk>"] + tokens)))
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, token: str) -> int:
        return self.token_to_idx.get(token, self.token_to_idx["<unk>"])


class TimeMachine:
    def __init__(self, raw_text: str, batch_size: int, num_steps: int, num_train: int, num_val: int) -> None:
        self.batch_size, self.num_steps, self.num_train, self.num_val = batch_size, num_steps, num_train, num_val
        tokens = list(re.sub("[^A-Za-z]+", " ", raw_text).lower())  # _preprocess, _tokenize
        self.vocab = Vocab(tokens)
        corpus = [self.vocab[t] for t in tokens]
        array = torch.tensor([corpus[i : i + num_steps + 1] for i in range(len(corpus) - num_steps)])
        self.X, self.Y = array[:, :-1], array[:, 1:]

    def get_dataloader(self, train: bool):
        idx = slice(0, self.num_train) if train else slice(self.num_train, self.num_train + self.num_val)
        dataset = torch.utils.data.TensorDataset(self.X[idx], self.Y[idx])
        return torch.utils.data.DataLoader(dataset, self.batch_size, shuffle=train)

    def train_dataloader(self):
        return self.get_dataloader(train=True)

    def val_dataloader(self):
        return self.get_dataloader(train=False)


# --------------------------------------------------------------------------- the section's model


class RNNScratch(nn.Module):
    def __init__(self, num_inputs: int, num_hiddens: int, sigma: float = 0.01) -> None:
        super().__init__()
        self.num_inputs, self.num_hiddens, self.sigma = num_inputs, num_hiddens, sigma
        self.W_xh = nn.Parameter(torch.randn(num_inputs, num_hiddens) * sigma)
        self.W_hh = nn.Parameter(torch.randn(num_hiddens, num_hiddens) * sigma)
        self.b_h = nn.Parameter(torch.zeros(num_hiddens))

    def forward(self, inputs, state=None):
        if state is None:
            state = torch.zeros((inputs.shape[1], self.num_hiddens), device=inputs.device)
        else:
            (state,) = state
        outputs = []
        for X in inputs:  # Shape of inputs: (num_steps, batch_size, num_inputs)
            state = torch.tanh(torch.matmul(X, self.W_xh) + torch.matmul(state, self.W_hh) + self.b_h)
            outputs.append(state)
        return outputs, state


class RNNLMScratch(nn.Module):
    """d2l.Classifier's loss, d2l.Module's optimizer, the section's parameters and forward."""

    def __init__(self, rnn: RNNScratch, vocab_size: int, lr: float = 0.01, time_major: bool = False,
                 softmax: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.rnn, self.vocab_size, self.lr = rnn, vocab_size, lr
        self.time_major, self.softmax = time_major, softmax
        self.history: dict[str, list[float]] = {"train_ppl": [], "val_ppl": []}
        self.init_params()

    def init_params(self):
        self.W_hq = nn.Parameter(torch.randn(self.rnn.num_hiddens, self.vocab_size) * self.rnn.sigma)
        self.b_q = nn.Parameter(torch.zeros(self.vocab_size))

    def one_hot(self, X):
        return F.one_hot(X.T, self.vocab_size).type(torch.float32)

    def output_layer(self, rnn_outputs):
        outputs = [torch.matmul(H, self.W_hq) + self.b_q for H in rnn_outputs]
        if self.softmax:  # the bug: probabilities handed to a loss that takes logits
            outputs = [F.softmax(O, dim=-1) for O in outputs]
        return torch.stack(outputs, 0 if self.time_major else 1)  # the bug: time-major

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
        self.history["train_ppl"].append(math.exp(l.item()))  # self.plot('ppl', d2l.exp(l), train=True)
        return l

    def validation_step(self, batch):
        l = self.loss(self(*batch[:-1]), batch[-1])  # noqa: E741
        self.history["val_ppl"].append(math.exp(l.item()))  # self.plot('ppl', d2l.exp(l), train=False)
        return l

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


# --------------------------------------------------------------------------- d2l.Trainer


class Trainer:
    def __init__(self, max_epochs: int, gradient_clip_val: float = 0, nx: Nndx | None = None) -> None:
        self.max_epochs, self.gradient_clip_val, self.nx = max_epochs, gradient_clip_val, nx
        self.mon = None

    def prepare_data(self, data):
        self.train_dataloader = data.train_dataloader()
        self.val_dataloader = data.val_dataloader()
        self.num_train_batches = len(self.train_dataloader)
        self.num_val_batches = len(self.val_dataloader) if self.val_dataloader is not None else 0

    def prepare_model(self, model):
        model.trainer = self
        self.model = model

    def fit(self, model, data):
        self.prepare_data(data)
        self.prepare_model(model)
        self.optim = model.configure_optimizers()
        # nndx: preflight on the first training batch, then the Monitor around the epochs
        self.nndx_batch = (data.X[: data.batch_size], data.Y[: data.batch_size])  # the first training windows
        self.nx.preflight(model, self.nndx_batch, model.loss, optimizer=self.optim)
        self.mon = self.nx.monitor(model, self.optim)
        self.epoch = 0
        self.train_batch_idx = 0
        self.val_batch_idx = 0
        for self.epoch in range(self.max_epochs):
            self.fit_epoch()
        self.nx.finish(self.mon, model, self.nndx_batch, model.loss, optimizer=self.optim)

    def prepare_batch(self, batch):
        return batch

    def fit_epoch(self):
        self.model.train()
        for batch in self.train_dataloader:
            loss = self.model.training_step(self.prepare_batch(batch))
            self.optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                if self.gradient_clip_val > 0:
                    self.clip_gradients(self.gradient_clip_val, self.model)
                self.optim.step()
            self.nx.timed(lambda: self.mon.log(loss))  # noqa: B023
            self.train_batch_idx += 1
        if self.val_dataloader is None:
            return
        self.model.eval()
        val_losses = []
        for batch in self.val_dataloader:
            with torch.no_grad():
                val_losses.append(self.model.validation_step(self.prepare_batch(batch)).item())
            self.val_batch_idx += 1
        val_loss = sum(val_losses) / len(val_losses)
        self.nx.timed(lambda: self.mon.log(val_loss, split="val"))

    def clip_gradients(self, grad_clip_val, model):
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.sqrt(sum(torch.sum((p.grad**2)) for p in params))
        if norm > grad_clip_val:
            for param in params:
                param.grad[:] *= grad_clip_val / norm


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    text = generate_text(1400, random.Random(1234 + seed))
    data = TimeMachine(text, batch_size=BATCH_SIZE, num_steps=NUM_STEPS, num_train=NUM_TRAIN, num_val=NUM_VAL)
    rnn = RNNScratch(num_inputs=len(data.vocab), num_hiddens=NUM_HIDDENS)
    model = RNNLMScratch(rnn, vocab_size=len(data.vocab), lr=LR, time_major=variant == "labels_not_transposed",
                         softmax=variant == "softmax_in_output_layer")  # fmt: skip
    trainer = Trainer(max_epochs=MAX_EPOCHS, gradient_clip_val=GRAD_CLIP, nx=nx)
    trainer.fit(model, data)

    per_epoch_train = trainer.num_train_batches
    per_epoch_val = trainer.num_val_batches
    last_train = model.history["train_ppl"][-per_epoch_train:]
    last_val = model.history["val_ppl"][-per_epoch_val:]
    return {"train_ppl": sum(last_train) / len(last_train), "val_ppl": sum(last_val) / len(last_val),
            "max_train_ppl": max(model.history["train_ppl"]), "corpus_chars": float(len(data.X) + NUM_STEPS)}  # fmt: skip
