"""Port of Udacity's Deep Learning (PyTorch) nanodegree "Character-Level LSTM" solution notebook:
``CharRNN`` (one-hot characters into a 2-layer ``nn.LSTM`` with dropout 0.5 and
``batch_first=True``, a dropout layer, ``out.contiguous().view(-1, n_hidden)``, a Linear layer to
the character logits), ``get_batches`` (the encoded text reshaped into ``batch_size`` rows, cut
into ``seq_length`` windows, targets shifted by one), trained by the notebook's ``train``: Adam
(lr 0.001), ``nn.CrossEntropyLoss``, ``net.zero_grad()``, the hidden state re-wrapped as
``tuple([each.data for each in h])`` every batch and reset every epoch,
``nn.utils.clip_grad_norm_(net.parameters(), 5)``, and every ``print_every`` steps a validation
pass over the last 10% of the text in ``net.eval()`` followed by ``net.train()``.

Source: github.com/udacity/deep-learning-v2-pytorch,
``recurrent-neural-networks/char-rnn/Character_Level_RNN_Solution.ipynb`` at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT licence, Copyright (c) 2018 Udacity). Written anew
from the facts of that notebook; no code copied.

Shrunk / replaced: a synthetic character corpus (:func:`bench.programs.data.char_text`: words
strung by a sparse Markov grammar into lines, 40k characters) instead of Anna Karenina
(~2M characters); ``n_hidden`` 64 instead of 512; ``batch_size`` 16 and ``seq_length`` 50
instead of 128 and 100; 8 epochs instead of 20; CPU. The characters are sorted before
numbering (the notebook's ``tuple(set(text))`` order changes with Python's hash seed).
Measure only (not in the program): the validation loss the notebook prints at the last
``print_every`` step (``reported_val_loss``), and after training one more pass over the
validation text in eval mode (``eval_val_loss``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_char_rnn"
SOURCE = Source("udacity/deep-learning-v2-pytorch",
                "recurrent-neural-networks/char-rnn/Character_Level_RNN_Solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's CharRNN and train() as published (shrunk)"),
        Variant(
            "no_eval_in_validation",
            "net.eval() left out before the validation loop: the validation loss is computed with both "
            "dropouts (LSTM inter-layer and the output dropout, p=0.5) still active",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/nelson-liu/paraphrase-id-tensorflow/pull/52",
             "https://github.com/wenwenyu/PICK-pytorch/issues/77"),
            Measure("reported_val_loss", "the validation loss the loop prints at least 0.05 above the healthy run's",
                    lambda healthy, buggy: buggy > healthy + 0.05),
        ),
        Variant(
            "no_zero_grad",
            "net.zero_grad() left out of the training loop: every backward adds to the gradients of all earlier "
            "batches, and clip_grad_norm_ + Adam step along that running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1"),
            Measure("eval_val_loss", "validation loss (eval mode) at least 0.1 above the healthy run's",
                    lambda healthy, buggy: buggy > healthy + 0.1),
        ),
    )
}

N_WORDS, N_HIDDEN, N_LAYERS, DROP_PROB = 7000, 64, 2, 0.5
BATCH_SIZE, SEQ_LENGTH, N_EPOCHS, LR, CLIP, VAL_FRAC, PRINT_EVERY = 16, 50, 8, 0.001, 5, 0.1, 10


# --------------------------------------------------------------------------- the notebook


def one_hot_encode(arr: np.ndarray, n_labels: int) -> np.ndarray:
    one_hot = np.zeros((arr.size, n_labels), dtype=np.float32)
    one_hot[np.arange(one_hot.shape[0]), arr.flatten()] = 1.0
    return one_hot.reshape((*arr.shape, n_labels))


def get_batches(arr: np.ndarray, batch_size: int, seq_length: int):
    """Batches of size batch_size x seq_length from arr; targets shifted by one."""
    batch_size_total = batch_size * seq_length
    n_batches = len(arr) // batch_size_total
    arr = arr[: n_batches * batch_size_total]
    arr = arr.reshape((batch_size, -1))
    for n in range(0, arr.shape[1], seq_length):
        x = arr[:, n : n + seq_length]
        y = np.zeros_like(x)
        try:
            y[:, :-1], y[:, -1] = x[:, 1:], arr[:, n + seq_length]
        except IndexError:
            y[:, :-1], y[:, -1] = x[:, 1:], arr[:, 0]
        yield x, y


class CharRNN(nn.Module):
    def __init__(self, tokens, n_hidden: int = 256, n_layers: int = 2, drop_prob: float = 0.5,
                 lr: float = 0.001) -> None:  # fmt: skip
        super().__init__()
        self.drop_prob = drop_prob
        self.n_layers = n_layers
        self.n_hidden = n_hidden
        self.lr = lr
        self.chars = tokens
        self.int2char = dict(enumerate(self.chars))
        self.char2int = {ch: ii for ii, ch in self.int2char.items()}
        self.lstm = nn.LSTM(len(self.chars), n_hidden, n_layers, dropout=drop_prob, batch_first=True)
        self.dropout = nn.Dropout(drop_prob)
        self.fc = nn.Linear(n_hidden, len(self.chars))

    def forward(self, x, hidden):
        r_output, hidden = self.lstm(x, hidden)
        out = self.dropout(r_output)
        out = out.contiguous().view(-1, self.n_hidden)
        out = self.fc(out)
        return out, hidden

    def init_hidden(self, batch_size: int):
        weight = next(self.parameters()).data
        return (weight.new(self.n_layers, batch_size, self.n_hidden).zero_(),
                weight.new(self.n_layers, batch_size, self.n_hidden).zero_())  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    text = data.char_text(N_WORDS, seed=seed)
    chars = tuple(sorted(set(text)))
    char2int = {ch: ii for ii, ch in enumerate(chars)}
    encoded = np.array([char2int[ch] for ch in text])

    net = CharRNN(chars, N_HIDDEN, N_LAYERS, drop_prob=DROP_PROB)
    batch_size, seq_length = BATCH_SIZE, SEQ_LENGTH

    # train(net, encoded, epochs, batch_size, seq_length, lr, clip, val_frac, print_every)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    criterion = nn.CrossEntropyLoss()
    val_idx = int(len(encoded) * (1 - VAL_FRAC))
    train_data, val_data = encoded[:val_idx], encoded[val_idx:]
    n_chars = len(net.chars)

    def loss_fn(output, targets):  # the notebook's loss line, on the (out, hidden) the net returns
        return criterion(output[0], targets.view(batch_size * seq_length).long())

    x0, y0 = next(get_batches(train_data, batch_size, seq_length))
    probe_batch = ((torch.from_numpy(one_hot_encode(x0, n_chars)), net.init_hidden(batch_size)), torch.from_numpy(y0))
    nx.preflight(net, probe_batch, loss_fn, optimizer=opt)
    mon = nx.monitor(net, opt, every=10)

    counter = 0
    reported_val_loss = float("nan")
    for _e in range(N_EPOCHS):
        h = net.init_hidden(batch_size)
        for x, y in get_batches(train_data, batch_size, seq_length):
            counter += 1
            x = one_hot_encode(x, n_chars)
            inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
            h = tuple([each.data for each in h])
            if variant != "no_zero_grad":
                net.zero_grad()
            output, h = net(inputs, h)
            loss = criterion(output, targets.view(batch_size * seq_length).long())
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023

            if counter % PRINT_EVERY == 0:
                val_h = net.init_hidden(batch_size)
                val_losses = []
                if variant != "no_eval_in_validation":
                    net.eval()
                for x, y in get_batches(val_data, batch_size, seq_length):
                    x = one_hot_encode(x, n_chars)
                    x, y = torch.from_numpy(x), torch.from_numpy(y)
                    val_h = tuple([each.data for each in val_h])
                    inputs, targets = x, y
                    output, val_h = net(inputs, val_h)
                    val_loss = criterion(output, targets.view(batch_size * seq_length).long())
                    val_losses.append(val_loss.item())
                net.train()
                reported_val_loss = float(np.mean(val_losses))
                nx.timed(lambda: mon.log(reported_val_loss, split="val"))  # noqa: B023

    nx.finish(mon, net, probe_batch, loss_fn, optimizer=opt)

    net.eval()  # measure only: the validation text once more, in eval mode
    with torch.no_grad():
        val_h, losses = net.init_hidden(batch_size), []
        for x, y in get_batches(val_data, batch_size, seq_length):
            output, val_h = net(torch.from_numpy(one_hot_encode(x, n_chars)), val_h)
            losses.append(criterion(output, torch.from_numpy(y).view(-1).long()).item())
    return {"reported_val_loss": reported_val_loss, "eval_val_loss": float(np.mean(losses)),
            "final_train_loss": float(loss.item()), "steps": float(counter)}  # fmt: skip
