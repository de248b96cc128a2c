"""Port of aladdinpersson/Machine-Learning-Collection's Seq2Seq: a 2-layer LSTM encoder whose
final hidden and cell states start a 2-layer LSTM decoder that is fed, one step at a time,
either the reference word (teacher forcing, ratio 0.5) or its own best guess; trained with
Adam, ``CrossEntropyLoss(ignore_index=pad_idx)`` and gradient clipping on padded,
length-bucketed, time-major batches.

Source: github.com/aladdinpersson/Machine-Learning-Collection,
``ML/Pytorch/more_advanced/Seq2Seq/seq2seq.py`` (and ``utils.py``'s ``translate_sentence`` and
``bleu``) at commit 2ab899f274f54c5cd35f485007b18a0950365a1c (MIT, Copyright (c) 2020 Aladdin
Persson). Written anew from the facts of those files; no code copied.

Kept: ``Encoder`` (``Embedding`` -> ``Dropout(p)`` -> ``nn.LSTM(embedding_size, hidden_size,
num_layers, dropout=p)``, returns ``hidden, cell``); ``Decoder`` (``x.unsqueeze(0)``,
``Embedding`` -> ``Dropout`` -> ``LSTM`` -> ``fc``, ``predictions.squeeze(0)``);
``Seq2Seq.forward(source, target, teacher_force_ratio=0.5)`` (a zero ``outputs`` tensor of
``(target_len, batch, len(english.vocab))`` filled from ``t = 1``, the first decoder input
``target[0]`` (``<sos>``), ``random.random() < teacher_force_ratio`` per step choosing
``target[t]`` or ``output.argmax(1)``); torchtext ``Field`` conventions (lower-cased tokens,
``<sos>``/``<eos>`` added, vocabularies with ``<unk>``=0, ``<pad>``=1 first, ``min_freq=2``);
``BucketIterator`` batches (examples of similar source length batched together, sorted
within the batch, the batch order reshuffled every epoch, each batch padded with ``<pad>``
to its longest sentence, time-major ``(seq_len, N)``); ``num_layers`` 2; ``optim.Adam(model.parameters())``; ``pad_idx =
english.vocab.stoi['<pad>']``; ``nn.CrossEntropyLoss(ignore_index=pad_idx)``; the epoch
loop (``model.eval()``, ``translate_sentence`` of a fixed example, ``model.train()``;
then per batch forward, ``output[1:].reshape(-1, output.shape[2])`` against
``target[1:].reshape(-1)``, ``zero_grad``, loss, ``backward``,
``clip_grad_norm_(model.parameters(), max_norm=1)``, ``step``, the loss written where
TensorBoard's ``add_scalar`` was); ``translate_sentence`` (greedy decoding from ``<sos>``,
one token at a time, stopping at ``<eos>`` or ``max_length=50``).
Replaced: Multi30k German->English (spaCy tokenizers, torchtext fields and iterators) by a
synthetic translation task of the same shape: "German" sentences of 2-6 words drawn from 10
words; their "English" maps each word through a fixed dictionary in which 3 words become
two words (so source and target lengths differ and target batches are padded); 2,000
train / 200 test pairs; the ``Field``/``BucketIterator`` behaviour written out in a few
lines; BLEU on the test set replaced by greedy-translation token accuracy (the share of
reference tokens, ``<eos>`` included, that ``translate_sentence`` puts at the same
position) and the exact-match rate. Shrunk: embedding 32 and hidden 64 instead of 300 and
1024, 12 epochs instead of 100 (~380 steps), with Adam at lr 3e-3 instead of 1e-3 and dropout
0.2 instead of 0.5 in both (at the script's values, on a harder 3-8-word version of this task, the
small model reached 29% token accuracy in these steps); CPU; no checkpoint files, no TensorBoard writer.
Measure only (not in the program): nothing beyond the BLEU stand-in above.

nndx, as the author would add it: ``Seq2Seq`` takes ``(source, target)`` and the loss is the
script's slicing of ``output`` and ``target`` before the criterion, so nndx gets the batch
``((inp_data, target), target)`` and ``loss_fn(output, target)`` = that slicing +
``criterion``; a preflight ``nndx.probe`` on a training batch drawn the same way (from its own
random stream) with the optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the epochs, each batch loss logged where
the script writes it to TensorBoard; after training ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.optim as optim
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "persson_seq2seq"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/more_advanced/Seq2Seq/seq2seq.py",
                "2ab899f274f54c5cd35f485007b18a0950365a1c", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: a synthetic word-mapping translation task)"),
        Variant(
            "no_ignore_index",
            "criterion = nn.CrossEntropyLoss() without ignore_index=pad_idx: the <pad> positions of every "
            "padded target batch are scored as words the decoder must predict",
            (C.WRONG_LOSS,),
            ("https://github.com/MaximumEntropy/Seq2Seq-PyTorch/issues/11",
             "https://github.com/lucidrains/DALLE-pytorch/issues/57",
             "https://github.com/lukas-blecher/LaTeX-OCR/issues/305"),
            Measure("token_acc", "greedy-translation token accuracy on the test set at least 5 points below the "
                    "healthy run's: 74.3 against 83.2 healthy on seed 0 (exact match 51.5 against 63.5)",
                    lambda healthy, buggy: buggy < healthy - 5.0),
        ),
        Variant(
            "view_not_transpose",
            "the batches are padded batch-first (pad_sequence(..., batch_first=True)) and turned time-major with "
            ".reshape(seq_len, N) instead of .t(): the shape is right but the words of different sentences are "
            "interleaved, so source and target rows no longer hold one sentence each",
            (C.WRONG_RESHAPE,),
            ("https://github.com/HHTseng/video-classification/issues/42",
             "https://github.com/timbmg/Sentence-VAE/issues/15",
             "https://github.com/yunjey/pytorch-tutorial/issues/89"),
            Measure("token_acc", "greedy-translation token accuracy on the test set at least 20 points below the "
                    "healthy run's: 0.0 against 83.2 healthy on seed 0",
                    lambda healthy, buggy: buggy < healthy - 20.0),
        ),
    )
}

N_WORDS, MIN_LEN, MAX_LEN, N_SPLIT = 10, 2, 6, 3
N_TRAIN, N_TEST = 2000, 200

# Training hyperparameters
num_epochs = 12
learning_rate = 0.003
batch_size = 64
# Model hyperparameters
encoder_embedding_size = 32
decoder_embedding_size = 32
hidden_size = 64
num_layers = 2
enc_dropout = 0.2
dec_dropout = 0.2


# --------------------------------------------------------------------------- the synthetic language pair


def make_pairs(seed: int) -> tuple[list[tuple[list[str], list[str]]], list[tuple[list[str], list[str]]]]:
    rng = np.random.default_rng(1000 + seed)
    de_words = [f"d{i}" for i in range(N_WORDS)]
    en_of = {w: [f"e{i}"] for i, w in enumerate(de_words)}
    for i in range(N_SPLIT):  # a few words translate to two words
        en_of[de_words[i]] = [f"e{i}", f"x{i}"]
    pairs = []
    for _ in range(N_TRAIN + N_TEST):
        n = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        src = [de_words[int(k)] for k in rng.integers(0, N_WORDS, size=n)]
        trg = [t for w in src for t in en_of[w]]
        pairs.append((src, trg))
    return pairs[:N_TRAIN], pairs[N_TRAIN:]


class Field:
    """torchtext's Field as the script configures it: lower-cased, <sos>/<eos> added, a
    vocabulary with <unk>, <pad>, <sos>, <eos> first and words seen at least min_freq times."""

    init_token, eos_token = "<sos>", "<eos>"

    def build_vocab(self, sentences, min_freq=2):
        counts = {}
        for s in sentences:
            for tok in s:
                counts[tok] = counts.get(tok, 0) + 1
        self.itos = ["<unk>", "<pad>", "<sos>", "<eos>"] + sorted(
            (t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.vocab = self

    def __len__(self):
        return len(self.itos)

    def numericalize(self, tokens):
        return [self.stoi[self.init_token]] + [self.stoi.get(t.lower(), 0) for t in tokens] + [self.stoi[self.eos_token]]


def bucket_batches(examples, batch_size, pad_src, pad_trg, rng, batch_first_reshape):
    """BucketIterator(train=True, sort_within_batch=True, sort_key=len(src)): pools of 100
    batches sorted by source length, cut into batches, the batch order shuffled; each batch
    padded to its longest sentence, time-major."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    pool = batch_size * 100
    for p in range(0, len(order), pool):
        chunk = sorted(order[p:p + pool], key=lambda i: len(examples[i][0]))
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    for idx in batches:
        idx = sorted(idx, key=lambda i: -len(examples[i][0]))
        srcs = [torch.tensor(examples[i][0]) for i in idx]
        trgs = [torch.tensor(examples[i][1]) for i in idx]
        if batch_first_reshape:  # the bug: batch-first padding, then a reshape to (seq_len, N)
            src = nn.utils.rnn.pad_sequence(srcs, batch_first=True, padding_value=pad_src)
            trg = nn.utils.rnn.pad_sequence(trgs, batch_first=True, padding_value=pad_trg)
            src = src.reshape(src.shape[1], src.shape[0])
            trg = trg.reshape(trg.shape[1], trg.shape[0])
        else:
            src = nn.utils.rnn.pad_sequence(srcs, padding_value=pad_src)
            trg = nn.utils.rnn.pad_sequence(trgs, padding_value=pad_trg)
        yield src, trg


# --------------------------------------------------------------------------- the script's model


class Encoder(nn.Module):
    def __init__(self, input_size, embedding_size, hidden_size, num_layers, p):
        super(Encoder, self).__init__()
        self.dropout = nn.Dropout(p)
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.embedding = nn.Embedding(input_size, embedding_size)
        self.rnn = nn.LSTM(embedding_size, hidden_size, num_layers, dropout=p)

    def forward(self, x):
        embedding = self.dropout(self.embedding(x))
        outputs, (hidden, cell) = self.rnn(embedding)
        return hidden, cell


class Decoder(nn.Module):
    def __init__(self, input_size, embedding_size, hidden_size, output_size, num_layers, p):
        super(Decoder, self).__init__()
        self.dropout = nn.Dropout(p)
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.embedding = nn.Embedding(input_size, embedding_size)
        self.rnn = nn.LSTM(embedding_size, hidden_size, num_layers, dropout=p)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, hidden, cell):
        x = x.unsqueeze(0)
        embedding = self.dropout(self.embedding(x))
        outputs, (hidden, cell) = self.rnn(embedding, (hidden, cell))
        predictions = self.fc(outputs)
        predictions = predictions.squeeze(0)
        return predictions, hidden, cell


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder, target_vocab_size):
        super(Seq2Seq, self).__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.target_vocab_size = target_vocab_size  # the script reads len(english.vocab) here

    def forward(self, source, target, teacher_force_ratio=0.5):
        batch_size = source.shape[1]
        target_len = target.shape[0]
        target_vocab_size = self.target_vocab_size
        outputs = torch.zeros(target_len, batch_size, target_vocab_size)
        hidden, cell = self.encoder(source)
        x = target[0]
        for t in range(1, target_len):
            output, hidden, cell = self.decoder(x, hidden, cell)
            outputs[t] = output
            best_guess = output.argmax(1)
            x = target[t] if random.random() < teacher_force_ratio else best_guess
        return outputs


def translate_sentence(model, sentence, german, english, max_length=50):
    tokens = [token.lower() for token in sentence]
    tokens.insert(0, german.init_token)
    tokens.append(german.eos_token)
    text_to_indices = [german.vocab.stoi.get(token, 0) for token in tokens]
    sentence_tensor = torch.LongTensor(text_to_indices).unsqueeze(1)
    with torch.no_grad():
        hidden, cell = model.encoder(sentence_tensor)
    outputs = [english.vocab.stoi["<sos>"]]
    for _ in range(max_length):
        previous_word = torch.LongTensor([outputs[-1]])
        with torch.no_grad():
            output, hidden, cell = model.decoder(previous_word, hidden, cell)
            best_guess = output.argmax(1).item()
        outputs.append(best_guess)
        if output.argmax(1).item() == english.vocab.stoi["<eos>"]:
            break
    translated_sentence = [english.vocab.itos[idx] for idx in outputs]
    return translated_sentence[1:]


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    reshape_bug = variant == "view_not_transpose"

    train_pairs, test_pairs = make_pairs(seed)
    german, english = Field(), Field()
    german.build_vocab([s for s, _ in train_pairs], min_freq=2)
    english.build_vocab([t for _, t in train_pairs], min_freq=2)
    train_examples = [(german.numericalize(s), english.numericalize(t)) for s, t in train_pairs]
    pad_src, pad_idx = german.vocab.stoi["<pad>"], english.vocab.stoi["<pad>"]
    batch_rng = random.Random(seed)

    input_size_encoder = len(german.vocab)
    input_size_decoder = len(english.vocab)
    output_size = len(english.vocab)
    encoder_net = Encoder(input_size_encoder, encoder_embedding_size, hidden_size, num_layers, enc_dropout)
    decoder_net = Decoder(input_size_decoder, decoder_embedding_size, hidden_size, output_size, num_layers,
                          dec_dropout)  # fmt: skip
    model = Seq2Seq(encoder_net, decoder_net, len(english.vocab))
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)

    if variant == "no_ignore_index":
        criterion = nn.CrossEntropyLoss()
    else:
        criterion = nn.CrossEntropyLoss(ignore_index=pad_idx)

    def loss_fn(output, target):
        output = output[1:].reshape(-1, output.shape[2])
        target = target[1:].reshape(-1)
        return criterion(output, target)

    first_src, first_trg = next(bucket_batches(train_examples, batch_size, pad_src, pad_idx,
                                               random.Random(seed + 77), reshape_bug))  # fmt: skip
    probe_batch = ((first_src, first_trg), first_trg)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    sentence = train_pairs[0][0]
    step = 0
    losses = []
    for epoch in range(num_epochs):
        model.eval()
        translate_sentence(model, sentence, german, english, max_length=50)
        model.train()
        for batch_idx, (inp_data, target) in enumerate(
                bucket_batches(train_examples, batch_size, pad_src, pad_idx, batch_rng, reshape_bug)):
            output = model(inp_data, target)
            output = output[1:].reshape(-1, output.shape[2])
            target = target[1:].reshape(-1)
            optimizer.zero_grad()
            loss = criterion(output, target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1)
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - writer.add_scalar('Training loss', loss, step)
            losses.append(loss.item())
            step += 1

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # score = bleu(test_data[1:100], model, german, english, device): its stand-in
    model.eval()
    hits = total = exact = 0
    for src, trg in test_pairs:
        prediction = translate_sentence(model, src, german, english)
        reference = trg + ["<eos>"]
        hits += sum(1 for i, tok in enumerate(reference) if i < len(prediction) and prediction[i] == tok)
        total += len(reference)
        exact += int(prediction == reference)
    return {"token_acc": 100.0 * hits / total, "exact_match": 100.0 * exact / len(test_pairs),
            "first_loss": float(np.mean(losses[:10])), "last_loss": float(np.mean(losses[-10:]))}  # fmt: skip
