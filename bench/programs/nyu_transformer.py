"""Port of Atcold/NYU-DLSP20's ``15-transformer.ipynb``: a transformer encoder written from
scratch (``MultiHeadAttention``, the kernel-size-1 "CNN" feed-forward, ``Embeddings`` with
sinusoidal position embeddings, ``EncoderLayer``, ``Encoder``) under a
``TransformerClassifier`` (max over the sequence, one dense layer), trained with AdamW on
``f.cross_entropy`` for IMDB sentiment.

Source: github.com/Atcold/NYU-DLSP20, ``15-transformer.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (the repository's licence file, ``LICENSE.md``, is
CC BY-NC-SA 4.0). Written anew from the notebook's cells; the model classes follow it line by
line.

Kept: ``f.softargmax = f.softmax``; ``MultiHeadAttention(d_model, num_heads, p)`` with
``W_q``/``W_k``/``W_v`` (no bias), ``W_h``, ``Q / np.sqrt(d_k)``, ``split_heads`` as
``view(bs, -1, heads, d_k).transpose(1, 2)`` and ``group_heads`` as ``transpose(1, 2)
.contiguous().view(...)``; ``CNN`` (Linear, ReLU, Linear); ``EncoderLayer`` (post-norm:
``layernorm1(x + mha)``, ``layernorm2(out1 + cnn)``, eps 1e-6); ``Embeddings`` (word
embedding with ``padding_idx=1``, a 10,000-row position embedding filled by
``create_sinusoidal_embeddings`` and frozen, LayerNorm eps 1e-12); ``Encoder``;
``TransformerClassifier(num_layers=1, d_model=32, num_heads=2, conv_hidden_dim=128, ...,
num_answers=2)`` with ``maximum_position_encoding=10000``; ``torch.optim.AdamW(lr=0.001)``;
the loop (``model.train()`` per epoch, ``out = model(x)``, ``loss = f.cross_entropy(out,
y)``, ``model.zero_grad()``, ``loss.backward()``, ``optimizer.step()``, the running train
accuracy); ``evaluate`` with ``model.eval()`` on the valid split after each epoch and on the
test split at the end; batch size 164; the text field's ``fix_length`` padding/truncation with
the pad index 1 and unknown index 0 (torchtext's vocabulary order); ``ds_train.split(0.9)``
into train/valid; a ``BucketIterator``-like loader (shuffled, pools of batches sorted by
length, the batches shuffled).

Replaced: IMDB by synthetic "reviews": 200 words (ids 2..201, 0 ``<unk>``, 1 ``<pad>``), ten
positive and ten negative sentiment words; each review has 16..48 words, mostly neutral,
with 1..6 positive and 1..6 negative words (never equal counts) at random places; the label is
1 when it holds more positive than negative words. Both kinds are present in every review, so
the label depends on how many of each there are, not only on which occur. Shrunk: 2,000
train reviews (1,800 train / 200 valid after the split), 1,000 test, ``max_len`` 48 instead
of 200, a 202-word vocabulary instead of 50,002, 30 epochs instead of 10 (11 batches an epoch
instead of 137), CPU.
Port fix: ``create_sinusoidal_embeddings`` writes into ``position_embeddings.weight`` in place
before it sets ``E.requires_grad = False``; torch 2 refuses an in-place write into a leaf
that requires grad, so the port sets ``requires_grad = False`` first (the notebook's intent:
a frozen sinusoidal table).

nndx, as the author would add it: the loss is ``f.cross_entropy(model(x), y)``; a preflight
``nndx.probe(model, first_batch, f.cross_entropy, optimizer=optimizer, data=(train, valid
tokens and labels))``; ``nndx.Monitor(model, optimizer, every=10)`` around the loop, every
batch's loss logged (where the notebook sums ``losses``; ``evaluate`` computes no loss, so
nothing is logged for the valid split); after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as f
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_transformer"
SOURCE = Source("Atcold/NYU-DLSP20", "15-transformer.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: synthetic reviews, max_len 48, 30 epochs)"),
        Variant(
            "adamw_lr_0.1",
            "torch.optim.AdamW(model.parameters(), lr=0.1): the learning rate of an SGD recipe kept when the "
            "optimizer is AdamW (100x the notebook's 0.001), on a post-LayerNorm encoder trained without warmup",
            (C.LR_TOO_HIGH,),
            ("https://github.com/huggingface/transformers/issues/735 (same output for every input; lr 0.01 -> 5e-5 fixed it)",
             "https://github.com/OpenNMT/OpenNMT-py/issues/805 (Adam run with the SGD learning rate; ppl stays constant)",
             "https://github.com/rajveermalviya/language-modeling/issues/3",
             "https://arxiv.org/abs/2002.04745 (Xiong et al. 2020, On Layer Normalization in the Transformer "
             "Architecture: post-LN transformers fail to train at large learning rates without warmup)"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 10.0),
        ),
        Variant(
            "no_zero_grad",
            "model.zero_grad() (step 3 of the notebook's loop) left out: every backward adds to the gradients "
            "of all the steps before, and AdamW steps on the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://twitter.com/karpathy/status/1013244313327681536 (3: forgot to .zero_grad() before .backward())",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 10.0),
        ),
    )
}

MAX_LEN = 48
N_WORDS = 200
UNK, PAD = 0, 1
POSITIVE = range(2, 12)
NEGATIVE = range(12, 22)
BATCH_SIZE = 164
EPOCHS = 30


# --------------------------------------------------------------------------- the notebook's model

f.softargmax = f.softmax  # fix wrong name


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, p, d_input=None):
        super().__init__()
        self.num_heads = num_heads
        self.d_model = d_model
        if d_input is None:
            d_xq = d_xk = d_xv = d_model
        else:
            d_xq, d_xk, d_xv = d_input
        assert d_model % self.num_heads == 0
        self.d_k = d_model // self.num_heads
        self.W_q = nn.Linear(d_xq, d_model, bias=False)
        self.W_k = nn.Linear(d_xk, d_model, bias=False)
        self.W_v = nn.Linear(d_xv, d_model, bias=False)
        self.W_h = nn.Linear(d_model, d_model)

    def scaled_dot_product_attention(self, Q, K, V):
        Q = Q / np.sqrt(self.d_k)                   # (bs, n_heads, q_length, dim_per_head)
        scores = torch.matmul(Q, K.transpose(2, 3))  # (bs, n_heads, q_length, k_length)
        A = f.softargmax(scores, dim=-1)            # (bs, n_heads, q_length, k_length)
        H = torch.matmul(A, V)                      # (bs, n_heads, q_length, dim_per_head)
        return H, A

    def split_heads(self, x, batch_size):
        return x.view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)

    def group_heads(self, x, batch_size):
        return x.transpose(1, 2).contiguous().view(batch_size, -1, self.num_heads * self.d_k)

    def forward(self, X_q, X_k, X_v):
        batch_size, seq_length, dim = X_q.size()
        Q = self.split_heads(self.W_q(X_q), batch_size)
        K = self.split_heads(self.W_k(X_k), batch_size)
        V = self.split_heads(self.W_v(X_v), batch_size)
        H_cat, A = self.scaled_dot_product_attention(Q, K, V)
        H_cat = self.group_heads(H_cat, batch_size)
        H = self.W_h(H_cat)
        return H, A


class CNN(nn.Module):
    def __init__(self, d_model, hidden_dim, p):
        super().__init__()
        self.k1convL1 = nn.Linear(d_model, hidden_dim)
        self.k1convL2 = nn.Linear(hidden_dim, d_model)
        self.activation = nn.ReLU()

    def forward(self, x):
        x = self.k1convL1(x)
        x = self.activation(x)
        x = self.k1convL2(x)
        return x


class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, conv_hidden_dim, p=0.1):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, num_heads, p)
        self.cnn = CNN(d_model, conv_hidden_dim, p)
        self.layernorm1 = nn.LayerNorm(normalized_shape=d_model, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(normalized_shape=d_model, eps=1e-6)

    def forward(self, x):
        attn_output, _ = self.mha(x, x, x)
        out1 = self.layernorm1(x + attn_output)
        cnn_output = self.cnn(out1)
        out2 = self.layernorm2(out1 + cnn_output)
        return out2


def create_sinusoidal_embeddings(nb_p, dim, E):
    theta = np.array([
        [p / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
        for p in range(nb_p)
    ])
    E.requires_grad = False  # port fix: first (torch 2 refuses the in-place writes into a leaf needing grad)
    E[:, 0::2] = torch.FloatTensor(np.sin(theta[:, 0::2]))
    E[:, 1::2] = torch.FloatTensor(np.cos(theta[:, 1::2]))


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab_size, max_position_embeddings, p):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=1)
        self.position_embeddings = nn.Embedding(max_position_embeddings, d_model)
        create_sinusoidal_embeddings(nb_p=max_position_embeddings, dim=d_model, E=self.position_embeddings.weight)
        self.LayerNorm = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, input_ids):
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_ids.device)
        position_ids = position_ids.unsqueeze(0).expand_as(input_ids)
        word_embeddings = self.word_embeddings(input_ids)
        position_embeddings = self.position_embeddings(position_ids)
        embeddings = word_embeddings + position_embeddings
        embeddings = self.LayerNorm(embeddings)
        return embeddings


class Encoder(nn.Module):
    def __init__(self, num_layers, d_model, num_heads, ff_hidden_dim, input_vocab_size,
                 maximum_position_encoding, p=0.1):
        super().__init__()
        self.d_model = d_model
        self.num_layers = num_layers
        self.embedding = Embeddings(d_model, input_vocab_size, maximum_position_encoding, p)
        self.enc_layers = nn.ModuleList()
        for _ in range(num_layers):
            self.enc_layers.append(EncoderLayer(d_model, num_heads, ff_hidden_dim, p))

    def forward(self, x):
        x = self.embedding(x)
        for i in range(self.num_layers):
            x = self.enc_layers[i](x)
        return x


class TransformerClassifier(nn.Module):
    def __init__(self, num_layers, d_model, num_heads, conv_hidden_dim, input_vocab_size, num_answers):
        super().__init__()
        self.encoder = Encoder(num_layers, d_model, num_heads, conv_hidden_dim, input_vocab_size,
                               maximum_position_encoding=10000)
        self.dense = nn.Linear(d_model, num_answers)

    def forward(self, x):
        x = self.encoder(x)
        x, _ = torch.max(x, dim=1)
        x = self.dense(x)
        return x


# --------------------------------------------------------------------------- the data (IMDB's stand-in)


def reviews(n: int, rng: np.random.Generator) -> tuple[list[list[int]], list[int]]:
    neutral = np.arange(22, N_WORDS + 2)
    texts, labels = [], []
    for _ in range(n):
        length = int(rng.integers(16, MAX_LEN + 1))
        while True:
            n_pos, n_neg = int(rng.integers(1, 7)), int(rng.integers(1, 7))
            if n_pos != n_neg:
                break
        words = rng.choice(neutral, size=length).tolist()
        places = rng.choice(length, size=n_pos + n_neg, replace=False)
        for k, place in enumerate(places):
            words[place] = int(rng.choice(POSITIVE if k < n_pos else NEGATIVE))
        texts.append(words)
        labels.append(int(n_pos > n_neg))
    return texts, labels


def numericalize(texts: list[list[int]]) -> torch.Tensor:
    """torchtext's Field(fix_length=max_len, batch_first=True): truncate, pad with <pad> (1)."""
    out = torch.full((len(texts), MAX_LEN), PAD, dtype=torch.long)
    for i, words in enumerate(texts):
        words = words[:MAX_LEN]
        out[i, : len(words)] = torch.tensor(words)
    return out


class BucketIterator:
    """legacy.data.BucketIterator(sort_key=len, repeat=False) for training: shuffle, pool 100
    batches' worth, sort each pool by length, cut into batches, shuffle the batches."""

    def __init__(self, texts, labels, batch_size, train, rng):
        self.texts, self.labels, self.batch_size, self.train, self.rng = texts, labels, batch_size, train, rng
        self.x = numericalize(texts)
        self.y = torch.tensor(labels, dtype=torch.long)

    def __len__(self):
        return -(-len(self.texts) // self.batch_size)

    def __iter__(self):
        n = len(self.texts)
        if self.train:
            order = self.rng.permutation(n)
            batches = []
            for start in range(0, n, self.batch_size * 100):
                pool = sorted(order[start:start + self.batch_size * 100], key=lambda i: len(self.texts[i]))
                batches += [pool[i:i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
            self.rng.shuffle(batches)
        else:
            order = sorted(range(n), key=lambda i: len(self.texts[i]))
            batches = [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]
        for b in batches:
            idx = torch.as_tensor(np.asarray(b), dtype=torch.long)
            yield self.x[idx], self.y[idx]


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    texts, labels = reviews(2000, rng)
    test_texts, test_labels = reviews(1000, rng)
    split = int(0.9 * len(texts))  # ds_train.split(0.9)
    train_loader = BucketIterator(texts[:split], labels[:split], BATCH_SIZE, True, rng)
    valid_loader = BucketIterator(texts[split:], labels[split:], BATCH_SIZE, False, rng)
    test_loader = BucketIterator(test_texts, test_labels, BATCH_SIZE, False, rng)

    model = TransformerClassifier(num_layers=1, d_model=32, num_heads=2, conv_hidden_dim=128,
                                  input_vocab_size=N_WORDS + 2, num_answers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1 if variant == "adamw_lr_0.1" else 0.001)
    epochs = EPOCHS

    def evaluate(data_loader):
        nb_batches = len(data_loader)
        model.eval()
        acc = 0
        for x, y in iter(data_loader):
            out = model(x)
            acc += (out.argmax(1) == y).cpu().numpy().mean()
        return acc / nb_batches

    first_batch = (train_loader.x[:BATCH_SIZE], train_loader.y[:BATCH_SIZE])
    splits = (train_loader.x, train_loader.y, valid_loader.x, valid_loader.y)
    nx.preflight(model, first_batch, f.cross_entropy, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    first_loss = last_loss = float("nan")
    for epoch in range(epochs):
        nb_batches_train = len(train_loader)
        train_acc = 0
        model.train()
        losses = 0.0
        for x, y in iter(train_loader):
            out = model(x)  # 1
            loss = f.cross_entropy(out, y)  # 2
            if variant != "no_zero_grad":
                model.zero_grad()  # 3
            loss.backward()  # 4
            losses += loss.item()
            optimizer.step()  # 5
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_acc += (out.argmax(1) == y).cpu().numpy().mean()
        if epoch == 0:
            first_loss = losses / nb_batches_train
        last_loss = losses / nb_batches_train
        valid_acc = evaluate(valid_loader)
    nx.finish(mon, model, first_batch, f.cross_entropy, optimizer=optimizer, data=splits)

    test_acc = evaluate(test_loader)
    return {"test_acc": 100.0 * test_acc, "valid_acc": 100.0 * valid_acc, "train_acc": 100.0 * train_acc / nb_batches_train,
            "first_epoch_loss": first_loss, "last_epoch_loss": last_loss}
