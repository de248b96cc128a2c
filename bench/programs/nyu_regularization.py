"""Port of Atcold/NYU-DLSP20 ``12-regularization.ipynb``: a feed-forward text classifier
(embedding -> flattened -> Linear -> ReLU -> dropout -> Linear -> sigmoid) on IMDB with BCELoss and
Adam, regularised by the notebook's three toggles (L1 on ``fc1`` added to the loss, L2 as Adam's
``weight_decay``, dropout), evaluated on the validation set every N iterations.

Source: github.com/Atcold/NYU-DLSP20, ``12-regularization.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo Canziani and contributors).
Written anew from the facts of that notebook; no code copied.

Kept: ``torch.manual_seed(1337)``; ``max_len`` padded/truncated sequences
(``fix_length``), ``<unk>`` = 0 and ``<pad>`` = 1 as torchtext's vocabulary numbers them,
``input_dim = num_words + 2``, ``embedding_dim = max_len`` (the notebook's
``embedded.view(-1, embedding_dim*embedding_dim)`` only works because they are equal),
``hidden_dim = 32``, ``output_dim = 1``; ``FeedforwardNeuralNetModel`` (``nn.Embedding``,
``fc1``, ``torch.relu``, the dropout of toggle 3 at p = 0.8, ``fc2``, ``torch.sigmoid``);
``nn.BCELoss``; ``torch.optim.Adam(lr=1e-3, weight_decay=0.005)`` (toggle 2); the L1 term of
toggle 1 (``fc1_params = torch.cat([x.view(-1) for x in model.fc1.parameters()])``,
``loss += L1_FACTOR * torch.norm(fc1_params, 1)``); labels as float ``(N, 1)``; the train split
into train/valid 70/30 (``ds_train.split()``); ``BucketIterator``-like batches of 64 (the
train set shuffled in pools sorted by length, valid sorted by length); the loop:
``model.train()`` at every batch, ``samples.view(-1, max_len)``, ``labels.view(-1, 1)``,
``zero_grad``, forward, loss (+ L1), ``backward``, ``step``; every ``N`` iterations the train
loss, ``model.eval()`` and the valid pass (no ``no_grad``, as the notebook), the last batch's
val loss, accuracy by ``outputs.ge(0.5)``, the best accuracy's state dict kept; after training
the weight vector the notebook histograms.
Toggles: the notebook runs the toggles one at a time and compares weight histograms; this
port runs them all on at once as its healthy program (the dropout written as the working
``torch.dropout(out, DROPOUT, self.training)``, since the notebook's two-argument
``torch.dropout(out, 0.8)`` does not run).
Shrunk: synthetic reviews instead of IMDB: 4,000 train (2,800 / 1,200 after the split) and
1,000 test sequences of 10-40 tokens (``max_len = 40`` instead of 80, so ``embedding_dim = 40``)
from a 200-word Zipf-distributed vocabulary (``num_words = 200`` instead of 1000), each review
given 3-7 words of its polarity from 10 "positive" / 10 "negative" mid-frequency words, the
label 1 when it holds more positive than negative words; 10 epochs as the notebook, the
evaluation every 20 iterations instead of 100; CPU; no plots. (At max_len 80 with 1,400
training reviews the three toggles together kept the model at chance; the sizes were chosen,
before nndx was run, so that the regularised healthy program learns: 89.7% test accuracy.)
Measure only (not in the program): the test accuracy of the last model (eval mode, same
threshold), and from the notebook's weight vector the mean ``|w|`` of ``fc1.weight`` and the
fraction of its weights with ``|w| < 0.01`` (the notebook's histogram, as numbers).

nndx, as the author would add it (README): a preflight ``nndx.probe`` on the first training
batch with ``criterion`` and the optimizer, the train/valid tensors as ``data``;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, the loss logged each batch
(after ``step``) and the val loss with the accuracy (``split="val"``) at each evaluation;
after training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_regularization"
SOURCE = Source("Atcold/NYU-DLSP20", "12-regularization.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook with its three regularisation toggles on (shrunk: synthetic reviews)"),
        Variant(
            "functional_dropout_in_eval",
            "toggle 3 written as F.dropout(out, 0.8), whose training flag defaults to True: model.eval() does "
            "not switch it off, so every validation/test pass drops 80% of the hidden units at random",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/pytorch/issues/26338",
             "https://github.com/pytorch/pytorch/issues/11999",
             "https://github.com/Coderx7/SimpleNet/issues/2",
             "https://github.com/rixwew/pytorch-fm/issues/21"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "l1_term_detached",
            "toggle 1's L1 term built from x.data (torch.cat([x.data.view(-1) ...])): it is added to the loss "
            "value but outside autograd, so no gradient shrinks fc1 and the L1 regularisation does nothing",
            (C.DETACHED_GRAPH,),
            ("https://discuss.pytorch.org/t/how-does-one-implement-weight-regularization-l1-or-l2-manually-without-optimum/7951",
             "https://discuss.pytorch.org/t/simple-l2-regularization/139"),
            Measure("fc1_small_fraction", "fraction of fc1 weights with |w| < 0.01 (the notebook's histogram) "
                    "at most 0.6x the healthy run's",
                    lambda healthy, buggy: not buggy > 0.6 * healthy),
        ),
    )
}

MAX_LEN = 40
NUM_WORDS = 200
N_TRAIN, N_TEST = 4000, 1000
BATCH_SIZE = 64
NUM_EPOCHS = 10
EVAL_EVERY = 20
UNK, PAD = 0, 1
WEIGHT_DECAY = 0.005  # toggle 2
L1_FACTOR = 0.001  # toggle 1
DROPOUT = 0.8  # toggle 3


# --------------------------------------------------------------------------- synthetic IMDB


def reviews(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (n, MAX_LEN) int64 padded with PAD, labels (n,) float, lengths (n,))."""
    rng = np.random.default_rng(seed)
    words = np.arange(2, NUM_WORDS + 2)
    pos_words, neg_words = words[40:50], words[50:60]
    freq = 1.0 / np.arange(1, len(words) + 1) ** 0.8
    freq /= freq.sum()
    tokens = np.full((n, MAX_LEN), PAD, dtype=np.int64)
    labels = np.zeros(n, dtype=np.float32)
    lengths = rng.integers(10, MAX_LEN + 1, size=n)
    for i in range(n):
        seq = rng.choice(words, size=lengths[i], p=freq)
        label = rng.random() < 0.5
        k = rng.integers(3, 8)  # a few sentiment words of the label's polarity
        at = rng.choice(lengths[i], size=k, replace=False)
        seq[at] = rng.choice(pos_words if label else neg_words, size=k)
        n_pos, n_neg = np.isin(seq, pos_words).sum(), np.isin(seq, neg_words).sum()
        labels[i] = float(n_pos > n_neg) if n_pos != n_neg else float(label)
        tokens[i, : lengths[i]] = seq
    return torch.from_numpy(tokens), torch.from_numpy(labels), torch.from_numpy(lengths)


def bucket_batches(lengths: torch.Tensor, batch_size: int, train: bool, gen: torch.Generator) -> list[torch.Tensor]:
    """torchtext's BucketIterator: the train set shuffled, sorted by length within pools of
    100 batches, cut into batches, the batches shuffled; other sets sorted by length."""
    if not train:
        order = torch.argsort(lengths, stable=True)
        return list(order.split(batch_size))
    perm = torch.randperm(len(lengths), generator=gen)
    batches = []
    for pool in perm.split(batch_size * 100):
        pool = pool[torch.argsort(lengths[pool], stable=True)]
        batches.extend(pool.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


class FixBatchGenerator:
    """The notebook's wrapper: yields ``(X, y)`` per batch."""

    def __init__(self, tokens, labels, lengths, train: bool, gen: torch.Generator) -> None:
        self.tokens, self.labels, self.lengths, self.train, self.gen = tokens, labels, lengths, train, gen

    def __len__(self) -> int:
        return (len(self.labels) + BATCH_SIZE - 1) // BATCH_SIZE

    def __iter__(self):
        for idx in bucket_batches(self.lengths, BATCH_SIZE, self.train, self.gen):
            yield self.tokens[idx], self.labels[idx]


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1337 + seed)
    functional_dropout = variant == "functional_dropout_in_eval"
    l1_detached = variant == "l1_term_detached"

    tokens, labels, lengths = reviews(N_TRAIN, seed=seed)
    te_tokens, te_labels, te_lengths = reviews(N_TEST, seed=seed + 100)
    split = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(1337 + seed))
    n_tr = int(0.7 * N_TRAIN)
    tr_idx, va_idx = split[:n_tr], split[n_tr:]
    gen = torch.Generator().manual_seed(seed)
    train_loader = FixBatchGenerator(tokens[tr_idx], labels[tr_idx], lengths[tr_idx], True, gen)
    valid_loader = FixBatchGenerator(tokens[va_idx], labels[va_idx], lengths[va_idx], False, gen)
    test_loader = FixBatchGenerator(te_tokens, te_labels, te_lengths, False, gen)

    max_len = MAX_LEN
    input_dim = NUM_WORDS + 2
    embedding_dim = max_len
    hidden_dim = 32
    output_dim = 1

    class FeedforwardNeuralNetModel(nn.Module):
        def __init__(self, input_dim, embedding_dim, hidden_dim, output_dim):
            super(FeedforwardNeuralNetModel, self).__init__()
            self.embedding = nn.Embedding(input_dim, embedding_dim)
            self.fc1 = nn.Linear(embedding_dim * embedding_dim, hidden_dim)
            self.fc2 = nn.Linear(hidden_dim, output_dim)

        def forward(self, x):
            embedded = self.embedding(x)
            embedded = embedded.view(-1, embedding_dim * embedding_dim)
            out = self.fc1(embedded)
            out = torch.relu(out)
            # Toggle 3: Dropout
            if functional_dropout:
                out = nn.functional.dropout(out, DROPOUT)
            else:
                out = torch.dropout(out, DROPOUT, self.training)
            out = self.fc2(out)
            out = torch.sigmoid(out)
            return out

    model = FeedforwardNeuralNetModel(input_dim, embedding_dim, hidden_dim, output_dim)
    criterion = nn.BCELoss()
    # Toggle 2: L2 Norm option - this is called weight decay
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=WEIGHT_DECAY)

    probe_x, probe_y = next(iter(FixBatchGenerator(tokens[tr_idx], labels[tr_idx], lengths[tr_idx], True,
                                                   torch.Generator().manual_seed(seed + 7))))  # fmt: skip
    probe_batch = (probe_x.view(-1, max_len), probe_y.view(-1, 1))
    splits = (tokens[tr_idx], labels[tr_idx].view(-1, 1), tokens[va_idx], labels[va_idx].view(-1, 1))
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    iter_ = 0
    history_train_acc, history_val_acc, history_train_loss, history_val_loss = [], [], [], []
    best_accuracy = 0
    best_state = None
    accuracy = float("nan")
    for epoch in range(NUM_EPOCHS):
        for i, (samples, labels_b) in enumerate(train_loader):
            model.train()
            samples = samples.view(-1, max_len)
            labels_b = labels_b.view(-1, 1)
            optimizer.zero_grad()
            outputs = model(samples)
            loss = criterion(outputs, labels_b)
            # Toggle 1: L1 norm, add to original loss
            if l1_detached:
                fc1_params = torch.cat([x.data.view(-1) for x in model.fc1.parameters()])
            else:
                fc1_params = torch.cat([x.view(-1) for x in model.fc1.parameters()])
            loss += L1_FACTOR * torch.norm(fc1_params, 1)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            iter_ += 1

            if iter_ % EVAL_EVERY == 0:
                train_loss = loss.data.item()
                model.eval()
                correct = 0
                total = 0
                for samples, labels_v in valid_loader:
                    samples = samples.view(-1, max_len)
                    labels_v = labels_v.view(-1)
                    outputs = model(samples)
                    val_loss = criterion(outputs.view(-1, 1), labels_v.view(-1, 1))
                    predicted = outputs.ge(0.5).view(-1)
                    total += labels_v.size(0)
                    correct += (predicted.type(torch.FloatTensor).cpu() == labels_v.type(torch.FloatTensor)).sum().item()
                accuracy = 100.0 * correct / total
                nx.timed(lambda: mon.log(val_loss, split="val", accuracy=accuracy / 100.0))
                history_val_loss.append(val_loss.data.item())
                history_val_acc.append(round(accuracy, 2))
                history_train_loss.append(train_loss)
                if accuracy > best_accuracy:
                    best_accuracy = accuracy
                    best_state = copy.deepcopy(model.state_dict())  # torch.save(..., 'best_model.pth')

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    # the notebook's weight vector (for the histograms)
    weights = torch.Tensor()
    for param_group in list(model.parameters()):
        weights = torch.cat((param_group.view(-1), weights))
    fc1_w = model.fc1.weight.detach()

    # measure only: the test accuracy of the last model
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for samples, labels_t in test_loader:
            outputs = model(samples.view(-1, max_len))
            correct += (outputs.ge(0.5).view(-1).float() == labels_t).sum().item()
            total += labels_t.size(0)
    return {"test_acc": 100.0 * correct / total, "best_val_acc": best_accuracy, "last_val_acc": accuracy,
            "last_val_loss": history_val_loss[-1], "fc1_mean_abs": fc1_w.abs().mean().item(),
            "fc1_small_fraction": (fc1_w.abs() < 0.01).float().mean().item(),
            "weights_mean_abs": weights.detach().abs().mean().item()}  # fmt: skip
