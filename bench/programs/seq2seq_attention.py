"""Port of bentrevett/pytorch-seq2seq, notebook 3 "Neural Machine Translation by Jointly
Learning to Align and Translate" (a bidirectional GRU encoder, Bahdanau attention, a GRU
decoder fed half the time its own argmax, ``CrossEntropyLoss(ignore_index=pad)``, Adam,
gradient clipping at 1, time-major ``[length, batch]`` tensors).

Source: github.com/bentrevett/pytorch-seq2seq, ``3 - Neural Machine Translation by Jointly
Learning to Align and Translate.ipynb`` at commit b3cd54c72cd6e4e63f672d334c795b4fe744ef92
(MIT, Copyright (c) 2018 Ben Trevett). Written anew from the facts of that notebook; no
code copied.

Kept: the special tokens ``<unk>``, ``<pad>``, ``<sos>``, ``<eos>`` (ids 0-3, the same in
both vocabularies) and every sentence wrapped in ``<sos>`` ... ``<eos>``; ``collate_fn``:
``pad_sequence(padding_value=pad_index)`` (time-major); a shuffled train loader and
unshuffled valid/test loaders; ``Encoder`` = ``Embedding`` -> ``Dropout`` ->
``GRU(bidirectional=True)``, its initial decoder state ``tanh(fc(cat(h_fwd, h_bwd)))``;
``Attention`` = ``v_fc(tanh(attn_fc(cat(hidden repeated over the source, encoder
outputs))))`` (``v_fc`` without bias), softmax over the source positions; ``Decoder`` =
``Embedding`` + ``Dropout``, ``bmm`` of the attention with the encoder outputs, ``GRU``
over ``cat(embedded, weighted)``, ``fc_out(cat(output, weighted, embedded))``;
``Seq2Seq.forward(src, trg, teacher_forcing_ratio)`` filling ``outputs[1:]`` (``outputs[0]``
stays zero), the next input the target token when ``random.random() <
teacher_forcing_ratio`` else the argmax; ``init_weights`` (every weight N(0, 0.01), every
bias 0); ``optim.Adam(model.parameters())``; ``train_fn`` (``model.train()``,
``zero_grad``, ``output[1:]`` / ``trg[1:]`` flattened into the criterion, ``backward``,
``clip_grad_norm_(clip=1.0)``, ``step``); ``evaluate_fn`` (``model.eval()``, ``no_grad``,
teacher forcing 0); the best valid loss's weights kept and reloaded for the test loss;
``translate_sentence`` (greedy, one sentence at a time, ``max_output_length`` 25, stop at
``<eos>``, after ``model.eval()``); teacher forcing ratio 0.5, dropout 0.5.
Shrunk: a synthetic "translation" instead of Multi30k (no download): source sentences of
3-6 words from a fixed random grammar over 20 words; the target is the source reversed,
each word mapped through a fixed dictionary into a second 20-word vocabulary; 1,280 train,
128 valid and 200 test pairs; embedding 32 instead of 256, hidden 48 instead of 512 (both
directions and the decoder), batch 64 instead of 128, 12 epochs instead of 10 and Adam's
lr 5e-3 instead of its default 1e-3 (240 steps instead of ~2,300: at 1e-3 the task is not
learnt in them). No BLEU (no ``evaluate`` package): measure only (not in the program),
``translate_sentence`` on the 200 test sentences, token accuracy of its output (without
``<sos>``) against the reference words + ``<eos>``.
Not planted: ``model.eval()`` left out of ``evaluate_fn`` and ``translate_sentence`` (a
much-reported bug): with dropout on the embeddings only, the model trained under dropout
0.5 translates as well with it on (greedy accuracy 0.819 against 0.829 healthy on seed 0),
so no measure shows it doing harm.

nndx, as the author would add it: a preflight ``nndx.probe(model, ((src, trg, 0.5), trg),
loss)`` on the first training batch with the optimizer, where ``loss`` is ``train_fn``'s
own slicing and flattening around ``criterion``; ``nndx.Monitor(model, optimizer,
loss_fn=criterion)`` around the epoch loop, the criterion called through ``mon.loss_fn``,
each training loss logged and each ``evaluate_fn`` batch loss logged as ``split="val"``;
then ``nndx.probe(model, ..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "seq2seq_attention"
SOURCE = Source("bentrevett/pytorch-seq2seq",
                "3 - Neural Machine Translation by Jointly Learning to Align and Translate.ipynb",
                "b3cd54c72cd6e4e63f672d334c795b4fe744ef92", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: hidden 48, batch 64, 12 epochs at lr 5e-3)"),
        Variant(
            "targets_shifted",
            "the loss compares output[:-1] with trg[1:] (the fix proposed in bentrevett/pytorch-seq2seq#46) instead "
            "of output[1:] with trg[1:]: outputs[0] is the zero row, and the prediction made at step t is scored "
            "against the token of step t + 1",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/bentrevett/pytorch-seq2seq/issues/46",
             "https://github.com/bentrevett/pytorch-seq2seq/issues/45",
             "https://github.com/huggingface/transformers/issues/16940"),
            Measure("greedy_token_accuracy", "test greedy token accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "attention_softmax_over_batch",
            "Attention normalises its scores with softmax(dim=0) instead of dim=1: on the [batch, src len] scores "
            "that is a softmax over the sentences of the batch, so each sentence's attention depends on the others "
            "(and, at translate_sentence's batch of one, every weight is 1)",
            (C.WRONG_RESHAPE,),
            ("https://github.com/PetrochukM/PyTorch-NLP/issues/2",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52",
             "https://github.com/ssw-nlp-study-group/nlp_study/pull/2"),
            Measure("greedy_token_accuracy", "test greedy token accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

unk_index, pad_index, sos_index, eos_index = 0, 1, 2, 3
N_WORDS = 20
MIN_WORDS, MAX_WORDS = 3, 6
N_TRAIN, N_VALID, N_TEST = 1280, 128, 200
embedding_dim, hidden_dim, dropout = 32, 48, 0.5
batch_size, n_epochs, clip, teacher_forcing_ratio = 64, 12, 1.0, 0.5
learning_rate = 5e-3


# --------------------------------------------------------------------------- data


def sentence_pairs(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(de ids, en ids) with <sos>/<eos>: the en sentence is the de one reversed, word by
    word through a fixed dictionary (the same two "languages" on every seed)."""
    rng = np.random.default_rng(seed)
    stream = data.word_tokens(n * MAX_WORDS, vocab=N_WORDS, seed=seed).tolist()
    dictionary = np.random.default_rng(1234).permutation(N_WORDS)
    pairs, at = [], 0
    for _ in range(n):
        length = int(rng.integers(MIN_WORDS, MAX_WORDS + 1))
        words = stream[at : at + length]
        at += length
        de = [sos_index] + [w + 4 for w in words] + [eos_index]
        en = [sos_index] + [int(dictionary[w]) + 4 for w in reversed(words)] + [eos_index]
        pairs.append((de, en))
    return pairs


def get_collate_fn(pad_index: int):
    def collate_fn(batch):
        batch_de_ids = [torch.tensor(de) for de, _ in batch]
        batch_en_ids = [torch.tensor(en) for _, en in batch]
        return {
            "de_ids": nn.utils.rnn.pad_sequence(batch_de_ids, padding_value=pad_index),
            "en_ids": nn.utils.rnn.pad_sequence(batch_en_ids, padding_value=pad_index),
        }

    return collate_fn


def get_data_loader(pairs, batch_size, pad_index, shuffle=False, generator=None):
    return torch.utils.data.DataLoader(pairs, batch_size=batch_size, shuffle=shuffle, generator=generator,
                                       collate_fn=get_collate_fn(pad_index))


# --------------------------------------------------------------------------- the model


class Encoder(nn.Module):
    def __init__(self, input_dim, embedding_dim, encoder_hidden_dim, decoder_hidden_dim, dropout):
        super().__init__()
        self.embedding = nn.Embedding(input_dim, embedding_dim)
        self.rnn = nn.GRU(embedding_dim, encoder_hidden_dim, bidirectional=True)
        self.fc = nn.Linear(encoder_hidden_dim * 2, decoder_hidden_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src):
        embedded = self.dropout(self.embedding(src))  # [src len, batch, emb]
        outputs, hidden = self.rnn(embedded)
        hidden = torch.tanh(self.fc(torch.cat((hidden[-2], hidden[-1]), dim=1)))  # last fwd + last bwd
        return outputs, hidden


class Attention(nn.Module):
    def __init__(self, encoder_hidden_dim, decoder_hidden_dim, softmax_dim=1):
        super().__init__()
        self.attn_fc = nn.Linear(encoder_hidden_dim * 2 + decoder_hidden_dim, decoder_hidden_dim)
        self.v_fc = nn.Linear(decoder_hidden_dim, 1, bias=False)
        self.softmax_dim = softmax_dim  # 1: over the source positions; 0 is the bug (over the batch)

    def forward(self, hidden, encoder_outputs):
        src_length = encoder_outputs.shape[0]
        hidden = hidden.unsqueeze(1).repeat(1, src_length, 1)
        encoder_outputs = encoder_outputs.permute(1, 0, 2)
        energy = torch.tanh(self.attn_fc(torch.cat((hidden, encoder_outputs), dim=2)))
        return torch.softmax(self.v_fc(energy).squeeze(2), dim=self.softmax_dim)


class Decoder(nn.Module):
    def __init__(self, output_dim, embedding_dim, encoder_hidden_dim, decoder_hidden_dim, dropout, attention):
        super().__init__()
        self.output_dim = output_dim
        self.attention = attention
        self.embedding = nn.Embedding(output_dim, embedding_dim)
        self.rnn = nn.GRU(encoder_hidden_dim * 2 + embedding_dim, decoder_hidden_dim)
        self.fc_out = nn.Linear(encoder_hidden_dim * 2 + decoder_hidden_dim + embedding_dim, output_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(input.unsqueeze(0)))  # [1, batch, emb]
        a = self.attention(hidden, encoder_outputs).unsqueeze(1)  # [batch, 1, src len]
        weighted = torch.bmm(a, encoder_outputs.permute(1, 0, 2)).permute(1, 0, 2)  # [1, batch, 2 * enc hid]
        output, hidden = self.rnn(torch.cat((embedded, weighted), dim=2), hidden.unsqueeze(0))
        prediction = self.fc_out(torch.cat((output.squeeze(0), weighted.squeeze(0), embedded.squeeze(0)), dim=1))
        return prediction, hidden.squeeze(0), a.squeeze(1)


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, src, trg, teacher_forcing_ratio):
        batch_size, trg_length = src.shape[1], trg.shape[0]
        outputs = torch.zeros(trg_length, batch_size, self.decoder.output_dim)
        encoder_outputs, hidden = self.encoder(src)
        input = trg[0, :]
        for t in range(1, trg_length):
            output, hidden, _ = self.decoder(input, hidden, encoder_outputs)
            outputs[t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            input = trg[t] if teacher_force else output.argmax(1)
        return outputs


def init_weights(m):
    for name, param in m.named_parameters():
        if "weight" in name:
            nn.init.normal_(param.data, mean=0, std=0.01)
        else:
            nn.init.constant_(param.data, 0)


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pairs = sentence_pairs(N_TRAIN + N_VALID + N_TEST, seed=seed)
    train_data, valid_data = pairs[:N_TRAIN], pairs[N_TRAIN : N_TRAIN + N_VALID]
    test_data = pairs[N_TRAIN + N_VALID :]
    generator = torch.Generator().manual_seed(seed)
    train_data_loader = get_data_loader(train_data, batch_size, pad_index, shuffle=True, generator=generator)
    valid_data_loader = get_data_loader(valid_data, batch_size, pad_index)
    test_data_loader = get_data_loader(test_data, batch_size, pad_index)

    vocab = N_WORDS + 4
    attention = Attention(hidden_dim, hidden_dim, softmax_dim=0 if variant == "attention_softmax_over_batch" else 1)
    encoder = Encoder(vocab, embedding_dim, hidden_dim, hidden_dim, dropout)
    decoder = Decoder(vocab, embedding_dim, hidden_dim, hidden_dim, dropout, attention)
    model = Seq2Seq(encoder, decoder)
    model.apply(init_weights)
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)
    criterion = nn.CrossEntropyLoss(ignore_index=pad_index)

    def sequence_loss(output, trg, loss_fn=criterion):
        output_dim = output.shape[-1]
        if variant == "targets_shifted":  # the bug
            return loss_fn(output[:-1].view(-1, output_dim), trg[1:].view(-1))
        return loss_fn(output[1:].view(-1, output_dim), trg[1:].view(-1))

    first = get_collate_fn(pad_index)(train_data[:batch_size])
    probe_batch = ((first["de_ids"], first["en_ids"], teacher_forcing_ratio), first["en_ids"])
    nx.preflight(model, probe_batch, sequence_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    def train_fn():
        model.train()
        epoch_loss = 0.0
        for batch in train_data_loader:
            src, trg = batch["de_ids"], batch["en_ids"]
            optimizer.zero_grad()
            output = model(src, trg, teacher_forcing_ratio)
            loss = sequence_loss(output, trg, loss_fn=mon.loss_fn)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            mon.log(loss)
            epoch_loss += loss.item()
        return epoch_loss / len(train_data_loader)

    def evaluate_fn(data_loader, log=True):
        model.eval()
        epoch_loss = 0.0
        with torch.no_grad():
            for batch in data_loader:
                src, trg = batch["de_ids"], batch["en_ids"]
                output = model(src, trg, 0)  # no teacher forcing
                loss = sequence_loss(output, trg)
                if log:
                    mon.log(loss, split="val")
                epoch_loss += loss.item()
        return epoch_loss / len(data_loader)

    best_valid_loss, best_state = float("inf"), None
    for _epoch in range(n_epochs):
        train_loss = train_fn()
        valid_loss = evaluate_fn(valid_data_loader)
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(..., "tut3-model.pt")

    nx.finish(mon, model, probe_batch, sequence_loss, optimizer=optimizer)

    model.load_state_dict(best_state)
    test_loss = evaluate_fn(test_data_loader, log=False)

    def translate_sentence(ids, max_output_length=25):
        model.eval()
        with torch.no_grad():
            tensor = torch.LongTensor(ids).unsqueeze(-1)
            encoder_outputs, hidden = model.encoder(tensor)
            inputs = [sos_index]
            for _ in range(max_output_length):
                output, hidden, _ = model.decoder(torch.LongTensor([inputs[-1]]), hidden, encoder_outputs)
                predicted_token = output.argmax(-1).item()
                inputs.append(predicted_token)
                if predicted_token == eos_index:
                    break
        return inputs

    # measure only: token accuracy of the greedy translations of the test set
    correct = total = 0
    for de, en in test_data:
        produced, reference = translate_sentence(de)[1:], en[1:]
        produced += [-1] * max(0, len(reference) - len(produced))
        correct += sum(int(a == b) for a, b in zip(produced, reference))
        total += len(reference)
    return {
        "final_train_loss": train_loss,
        "best_valid_loss": best_valid_loss,
        "test_loss": test_loss,
        "greedy_token_accuracy": correct / total,
    }
