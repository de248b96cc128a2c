"""Port of bentrevett/pytorch-seq2seq's first tutorial (Sutskever et al.'s "Sequence to Sequence
Learning with Neural Networks"): a 2-layer LSTM encoder whose final hidden and cell states
start a 2-layer LSTM decoder, trained with teacher forcing on padded batches.

Source: github.com/bentrevett/pytorch-seq2seq, ``1 - Sequence to Sequence Learning with Neural
Networks.ipynb`` at commit b3cd54c72cd6e4e63f672d334c795b4fe744ef92 (MIT, Copyright (c) 2018 Ben
Trevett). Written anew from the facts of that notebook; no code copied.

Kept: ``random``/``numpy``/``torch`` seeded; every sentence as ``[<sos>] + tokens + [<eos>]``;
the vocabularies' specials ``<unk>``, ``<pad>``, ``<sos>``, ``<eos>`` at indices 0-3, so
``pad_index`` is 1; the ``collate_fn`` (``nn.utils.rnn.pad_sequence(ids,
padding_value=pad_index)``: time-major ``[length, batch]`` tensors) and ``get_data_loader``
(shuffled for train, not for valid/test); ``Encoder`` (``Embedding`` -> ``Dropout`` ->
``nn.LSTM(embedding_dim, hidden_dim, n_layers, dropout=dropout)``, returns ``hidden, cell``),
``Decoder`` (one step: ``input.unsqueeze(0)``, ``Embedding`` -> ``Dropout`` -> ``LSTM`` ->
``fc_out``), ``Seq2Seq.forward(src, trg, teacher_forcing_ratio)`` (a zero ``outputs`` tensor
filled from ``t = 1``, ``random.random() < teacher_forcing_ratio`` per step choosing ``trg[t]``
or the argmax as the next input); ``init_weights`` (every parameter uniform in [-0.08, 0.08]);
``optim.Adam(model.parameters())`` (lr 1e-3); ``nn.CrossEntropyLoss(ignore_index=pad_index)``;
``train_fn`` (``model.train()``, ``zero_grad``, forward with teacher forcing 0.5,
``output[1:].view(-1, output_dim)`` against ``trg[1:].view(-1)``, ``backward``,
``clip_grad_norm_(model.parameters(), 1.0)``, ``step``, the mean batch loss) and
``evaluate_fn`` (``model.eval()``, ``no_grad``, teacher forcing 0); the best-valid-loss
checkpoint reloaded for the test loss; ``translate_sentence`` (greedy decoding from
``<sos>``, one token at a time, stopping at ``<eos>`` or ``max_output_length``).
Replaced: Multi30k German->English (spaCy tokenizers, torchtext vocabularies, BLEU) by a
synthetic translation task of the same shape: "German" sentences of 2-4 words drawn from 10
words, whose "English" is the sentence reversed with every word mapped through a fixed
dictionary (so lengths vary within a batch and every batch is padded); 1,280 train / 128
valid / 200 test pairs. Shrunk: embedding 32 and hidden 64 instead of 256 and 512 (2
layers), dropout 0.1 instead of 0.5 (the small model hardly learns at 0.5 in the steps
here), batch size 32 instead of 128, 10 epochs (400 steps instead of ~2,270) with Adam at
lr 3e-3 instead of its default 1e-3 to make up for the fewer steps; CPU; the checkpoint
kept in memory instead of ``tut1-model.pt``; greedy token accuracy on the test set in
place of BLEU.
Measure only (not in the program): ``heldout_loss``, the notebook's test loss computed
on time-major test batches with the notebook's own slicing (``output[1:]`` against
``trg[1:]``), teacher forcing off, whatever the variant changed (the variants' own test
loss uses their own loader and slicing); the test set's greedy translations scored by token
accuracy (the share of reference tokens, ``<eos>`` included, that the translation has at
the same position) and exact-match rate.

nndx, as the author would add it: the model takes ``(src, trg, teacher_forcing_ratio)`` and
the loss is the notebook's slicing of ``output`` and ``trg`` before the criterion, so nndx
gets the batch ``((src, trg, 0.5), trg)`` (several inputs in a tuple, as nndx's message
asks) and ``loss_fn(output, trg)`` = that slicing + ``criterion``; a preflight
``nndx.probe`` on the first training batch with the optimizer; ``nndx.Monitor(model,
optimizer, every=10, loss_fn=loss_fn)`` around the epochs, the batch loss computed through
``mon.loss_fn`` and logged every batch (where ``epoch_loss`` accumulates it) and each
epoch's valid loss logged as ``split="val"``; after training ``nndx.probe(..., monitor=mon)``
on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
import torch.optim as optim
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bentrevett_seq2seq"
SOURCE = Source("bentrevett/pytorch-seq2seq", "1 - Sequence to Sequence Learning with Neural Networks.ipynb",
                "b3cd54c72cd6e4e63f672d334c795b4fe744ef92", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: a synthetic reverse-and-map translation task)"),
        Variant(
            "loss_shifted_by_one",
            "the loss compares output[:-1] with trg[1:] (the slicing proposed in the issue) instead of output[1:] "
            "with trg[1:]: the decoder's prediction at step t is scored against the token of step t+1 and the "
            "all-zero outputs[0] against the first word",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/bentrevett/pytorch-seq2seq/issues/46",
             "https://github.com/hkproj/pytorch-transformer/issues/5",
             "https://github.com/huggingface/transformers/issues/16940"),
            Measure("heldout_loss", "the notebook's test loss (time-major batches, output[1:] against trg[1:], no "
                    "teacher forcing) at least 0.3 above the healthy run's: 3.32 (shifted) / 2.70 (batch "
                    "first) against 1.12 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
        Variant(
            "batch_first_padding",
            "the collate_fn pads with pad_sequence(..., batch_first=True) while Encoder, Decoder and Seq2Seq "
            "take [length, batch] tensors: the LSTMs run along the batch and treat the word positions as the "
            "batch, and the loss slices off the first sentence instead of the <sos> row",
            (C.WRONG_RESHAPE,),
            ("https://github.com/salesforce/cove/issues/10",
             "https://github.com/facebookresearch/fairseq/issues/2449",
             "https://github.com/bentrevett/pytorch-seq2seq/issues/94"),
            Measure("heldout_loss", "the notebook's test loss (time-major batches, output[1:] against trg[1:], no "
                    "teacher forcing) at least 0.3 above the healthy run's: 3.32 (shifted) / 2.70 (batch "
                    "first) against 1.12 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

N_WORDS, MIN_LEN, MAX_LEN = 10, 2, 4
N_TRAIN, N_VALID, N_TEST = 1280, 128, 200

batch_size = 32
encoder_embedding_dim = 32
decoder_embedding_dim = 32
hidden_dim = 64
n_layers = 2
encoder_dropout = 0.1
decoder_dropout = 0.1
n_epochs = 10
clip = 1.0
learning_rate = 3e-3
teacher_forcing_ratio = 0.5

unk_token, pad_token, sos_token, eos_token = "<unk>", "<pad>", "<sos>", "<eos>"
special_tokens = [unk_token, pad_token, sos_token, eos_token]


# --------------------------------------------------------------------------- the data (Multi30k's stand-in)


def make_pairs(seed: int) -> list[dict[str, list[str]]]:
    """Tokenised pairs as the notebook's ``tokenize_example`` leaves them (lower case,
    ``<sos>``/``<eos>`` added): "de" a random sentence, "en" its reversed translation."""
    rng = np.random.default_rng(seed)
    de_words = [f"de{i}" for i in range(N_WORDS)]
    en_words = [f"en{i}" for i in rng.permutation(N_WORDS)]
    lexicon = dict(zip(de_words, en_words))
    pairs = []
    for _ in range(N_TRAIN + N_VALID + N_TEST):
        length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        de = [de_words[i] for i in rng.integers(0, N_WORDS, size=length)]
        en = [lexicon[w] for w in reversed(de)]
        pairs.append({"de_tokens": [sos_token] + de + [eos_token], "en_tokens": [sos_token] + en + [eos_token]})
    return pairs


class Vocab:
    """``torchtext.vocab.build_vocab_from_iterator(..., min_freq=2, specials=...)`` with
    ``set_default_index(unk_index)``: the specials first, then tokens by frequency."""

    def __init__(self, sentences: list[list[str]], min_freq: int, specials: list[str]) -> None:
        counts: dict[str, int] = {}
        for sentence in sentences:
            for token in sentence:
                counts[token] = counts.get(token, 0) + 1
        words = sorted((t for t, c in counts.items() if c >= min_freq and t not in specials),
                       key=lambda t: (-counts[t], t))  # fmt: skip
        self.itos = list(specials) + words
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.default_index = 0

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.default_index)

    def lookup_indices(self, tokens: list[str]) -> list[int]:
        return [self[t] for t in tokens]


def get_collate_fn(pad_index: int, batch_first: bool):
    def collate_fn(batch):
        batch_en_ids = [example["en_ids"] for example in batch]
        batch_de_ids = [example["de_ids"] for example in batch]
        batch_en_ids = nn.utils.rnn.pad_sequence(batch_en_ids, padding_value=pad_index, batch_first=batch_first)
        batch_de_ids = nn.utils.rnn.pad_sequence(batch_de_ids, padding_value=pad_index, batch_first=batch_first)
        return {"en_ids": batch_en_ids, "de_ids": batch_de_ids}

    return collate_fn


def get_data_loader(dataset, batch_size: int, pad_index: int, shuffle: bool = False, batch_first: bool = False):
    collate_fn = get_collate_fn(pad_index, batch_first)
    return torch.utils.data.DataLoader(dataset=dataset, batch_size=batch_size, collate_fn=collate_fn,
                                       shuffle=shuffle)  # fmt: skip


# --------------------------------------------------------------------------- the model


class Encoder(nn.Module):
    def __init__(self, input_dim: int, embedding_dim: int, hidden_dim: int, n_layers: int, dropout: float) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.n_layers = n_layers
        self.embedding = nn.Embedding(input_dim, embedding_dim)
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, n_layers, dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src):
        embedded = self.dropout(self.embedding(src))
        outputs, (hidden, cell) = self.rnn(embedded)
        return hidden, cell


class Decoder(nn.Module):
    def __init__(self, output_dim: int, embedding_dim: int, hidden_dim: int, n_layers: int, dropout: float) -> None:
        super().__init__()
        self.output_dim = output_dim
        self.hidden_dim = hidden_dim
        self.n_layers = n_layers
        self.embedding = nn.Embedding(output_dim, embedding_dim)
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, n_layers, dropout=dropout)
        self.fc_out = nn.Linear(hidden_dim, output_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, hidden, cell):
        input = input.unsqueeze(0)
        embedded = self.dropout(self.embedding(input))
        output, (hidden, cell) = self.rnn(embedded, (hidden, cell))
        prediction = self.fc_out(output.squeeze(0))
        return prediction, hidden, cell


class Seq2Seq(nn.Module):
    def __init__(self, encoder: Encoder, decoder: Decoder, device: torch.device) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.device = device
        assert encoder.hidden_dim == decoder.hidden_dim, "Hidden dimensions of encoder and decoder must be equal!"
        assert encoder.n_layers == decoder.n_layers, "Encoder and decoder must have equal number of layers!"

    def forward(self, src, trg, teacher_forcing_ratio):
        batch_size = trg.shape[1]
        trg_length = trg.shape[0]
        trg_vocab_size = self.decoder.output_dim
        outputs = torch.zeros(trg_length, batch_size, trg_vocab_size).to(self.device)
        hidden, cell = self.encoder(src)
        input = trg[0, :]
        for t in range(1, trg_length):
            output, hidden, cell = self.decoder(input, hidden, cell)
            outputs[t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            top1 = output.argmax(1)
            input = trg[t] if teacher_force else top1
        return outputs


def init_weights(m: nn.Module) -> None:
    for name, param in m.named_parameters():
        nn.init.uniform_(param.data, -0.08, 0.08)


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = torch.device("cpu")
    batch_first = variant == "batch_first_padding"
    shifted = variant == "loss_shifted_by_one"

    pairs = make_pairs(seed)
    train_data, valid_data, test_data = (pairs[:N_TRAIN], pairs[N_TRAIN:N_TRAIN + N_VALID],
                                         pairs[N_TRAIN + N_VALID:])  # fmt: skip
    en_vocab = Vocab([p["en_tokens"] for p in train_data], 2, special_tokens)
    de_vocab = Vocab([p["de_tokens"] for p in train_data], 2, special_tokens)
    assert en_vocab[unk_token] == de_vocab[unk_token]
    assert en_vocab[pad_token] == de_vocab[pad_token]
    pad_index = en_vocab[pad_token]

    def numericalize(data):
        return [{"en_ids": torch.tensor(en_vocab.lookup_indices(p["en_tokens"])),
                 "de_ids": torch.tensor(de_vocab.lookup_indices(p["de_tokens"]))} for p in data]  # fmt: skip

    train_ids, valid_ids, test_ids = numericalize(train_data), numericalize(valid_data), numericalize(test_data)
    train_data_loader = get_data_loader(train_ids, batch_size, pad_index, shuffle=True, batch_first=batch_first)
    valid_data_loader = get_data_loader(valid_ids, batch_size, pad_index, batch_first=batch_first)
    test_data_loader = get_data_loader(test_ids, batch_size, pad_index, batch_first=batch_first)

    input_dim, output_dim = len(de_vocab), len(en_vocab)
    encoder = Encoder(input_dim, encoder_embedding_dim, hidden_dim, n_layers, encoder_dropout)
    decoder = Decoder(output_dim, decoder_embedding_dim, hidden_dim, n_layers, decoder_dropout)
    model = Seq2Seq(encoder, decoder, device).to(device)
    model.apply(init_weights)
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)
    criterion = nn.CrossEntropyLoss(ignore_index=pad_index)

    def loss_fn(output, trg):
        output_dim = output.shape[-1]
        output = (output[:-1] if shifted else output[1:]).view(-1, output_dim)
        trg = trg[1:].view(-1)
        return criterion(output, trg)

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
        first = next(iter(train_data_loader))
    probe_batch = ((first["de_ids"], first["en_ids"], teacher_forcing_ratio), first["en_ids"])
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_fn)

    def train_fn(model, data_loader, optimizer, clip, teacher_forcing_ratio, device):
        model.train()
        epoch_loss = 0
        for i, batch in enumerate(data_loader):
            src = batch["de_ids"].to(device)
            trg = batch["en_ids"].to(device)
            optimizer.zero_grad()
            output = model(src, trg, teacher_forcing_ratio)
            loss = mon.loss_fn(output, trg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_loss += loss.item()
        return epoch_loss / len(data_loader)

    def evaluate_fn(model, data_loader, device):
        model.eval()
        epoch_loss = 0
        with torch.no_grad():
            for i, batch in enumerate(data_loader):
                src = batch["de_ids"].to(device)
                trg = batch["en_ids"].to(device)
                output = model(src, trg, 0)  # turn off teacher forcing
                epoch_loss += loss_fn(output, trg).item()
        return epoch_loss / len(data_loader)

    best_valid_loss, best_state = float("inf"), None
    train_loss = valid_loss = float("nan")
    for epoch in range(n_epochs):
        train_loss = train_fn(model, train_data_loader, optimizer, clip, teacher_forcing_ratio, device)
        valid_loss = evaluate_fn(model, valid_data_loader, device)
        nx.timed(lambda: mon.log(valid_loss, split="val"))  # noqa: B023
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), "tut1-model.pt")

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    model.load_state_dict(best_state)
    test_loss = evaluate_fn(model, test_data_loader, device)

    def translate_sentence(tokens, max_output_length=25):
        model.eval()
        with torch.no_grad():
            ids = de_vocab.lookup_indices(tokens)
            tensor = torch.LongTensor(ids).unsqueeze(-1).to(device)
            hidden, cell = model.encoder(tensor)
            inputs = en_vocab.lookup_indices([sos_token])
            for _ in range(max_output_length):
                inputs_tensor = torch.LongTensor([inputs[-1]]).to(device)
                output, hidden, cell = model.decoder(inputs_tensor, hidden, cell)
                predicted_token = output.argmax(-1).item()
                inputs.append(predicted_token)
                if predicted_token == en_vocab[eos_token]:
                    break
        return inputs

    # measure only: the notebook's test loss on time-major batches with its own slicing, whatever the variant
    heldout_loader = get_data_loader(test_ids, batch_size, pad_index)
    model.eval()
    with torch.no_grad():
        heldout = [criterion(model(b["de_ids"], b["en_ids"], 0)[1:].view(-1, output_dim), b["en_ids"][1:].view(-1))
                   .item() for b in heldout_loader]  # fmt: skip
    heldout_loss = sum(heldout) / len(heldout)

    hits = total = exact = 0
    for pair in test_data:
        predicted = translate_sentence(pair["de_tokens"])[1:]
        reference = en_vocab.lookup_indices(pair["en_tokens"])[1:]
        hits += sum(1 for i, token in enumerate(reference) if i < len(predicted) and predicted[i] == token)
        total += len(reference)
        exact += int(predicted == reference)
    return {"heldout_loss": heldout_loss, "test_token_acc": hits / total, "test_exact_match": exact / len(test_data),
            "test_loss": test_loss,
            "best_valid_loss": best_valid_loss, "final_train_loss": train_loss}  # fmt: skip
