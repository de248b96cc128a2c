"""Port of bentrevett/pytorch-seq2seq's tutorial 5, Convolutional Sequence to Sequence Learning:
a ConvS2S encoder (token + position embeddings, GLU convolution blocks with scaled residuals)
and decoder (causally padded GLU convolutions, one attention per block), trained with teacher
forcing on ``trg[:, :-1]`` against ``trg[:, 1:]``, ``CrossEntropyLoss(ignore_index=pad)``,
``clip_grad_norm_`` at 0.1 and Adam.

Source: github.com/bentrevett/pytorch-seq2seq, ``legacy/5 - Convolutional Sequence to Sequence
Learning.ipynb`` at commit b3cd54c72cd6e4e63f672d334c795b4fe744ef92 (MIT, Copyright (c) 2018 Ben
Trevett); the repository's current top level keeps only tutorials 1-3, so the ConvS2S notebook
lives under ``legacy/``. Written anew from the facts of that notebook; no code copied.

Kept: ``Encoder`` (``tok_embedding`` + ``pos_embedding`` (``max_length`` 100) summed, dropout,
``emb2hid``, permute, per block ``conv(dropout(x))`` with ``Conv1d(hid, 2*hid, k, padding=(k-1)//2)``,
``F.glu(dim=1)``, ``(conved + conv_input) * sqrt(0.5)``; ``hid2emb``; returns ``conved`` and
``combined = (conved + embedded) * scale``); ``Decoder`` (same embeddings, per block dropout, a
left padding of ``k - 1`` columns built as ``torch.zeros(...).fill_(trg_pad_idx)`` (the
notebook's own idiom: the pad *index* is the fill value) concatenated before the input, a
``Conv1d(hid, 2*hid, k)`` without padding, GLU, ``calculate_attention`` (``attn_hid2emb``,
combined with the embedding, ``energy = combined @ encoder_conved^T``, softmax over the source,
``attention @ encoder_combined``, ``attn_emb2hid``, scaled residual), scaled residual;
``hid2emb``, ``fc_out(dropout(.))``); ``Seq2Seq``; ``optim.Adam(model.parameters())`` (lr 1e-3);
``nn.CrossEntropyLoss(ignore_index=TRG_PAD_IDX)``; ``train`` (``model.train()``, per batch
``zero_grad``, ``model(src, trg[:, :-1])``, ``output.contiguous().view(-1, output_dim)``
against ``trg[:, 1:].contiguous().view(-1)``, ``backward``, ``clip_grad_norm_(params, CLIP=0.1)``,
``step``, the mean batch loss); ``evaluate`` (``model.eval()``, ``no_grad``, the same loss);
keeping the state of the best valid loss and loading it for the test loss; greedy decoding in
``translate_sentence``'s shape (encode once, feed the growing target, take the argmax of the
last position, stop at ``<eos>``). The fields' shape: ``<sos>``/``<eos>`` around every
sentence, batch-first, ``<unk>``=0 and ``<pad>``=1 as torchtext's vocab builds them;
``BucketIterator``'s shape: batches of similar lengths (sorted by source length within pools of
batches), shuffled for training.
Replaced: Multi30k (de->en) by a synthetic translation task: a source sentence of 4-12 tokens
drawn from 24 "source words"; its translation maps every word through a fixed random dictionary
(18 words to one target word, 6 to two, 3 to none, so source and target lengths differ as in
Multi30k and the target batches carry padding) and swaps each adjacent pair of words (a local
reordering, so attention must look off the diagonal). Shrunk: EMB_DIM 32, HID_DIM 64, 3 encoder and 3 decoder blocks (10 and 10
in the notebook), kernel 3, dropout 0.25 as published; 2,000 train / 300 valid / 300 test pairs;
BATCH_SIZE 64 (128); 8 epochs (10); CPU; no spaCy, no plots, no BLEU.
Measure only (not in the program): token accuracy and exact-match rate of the greedy translations
of the test set against the reference (in place of the notebook's BLEU), and the test loss taken
with the healthy criterion (``ignore_index`` set) whatever criterion the variant trains with.

nndx, as the author would add it: the model takes ``(src, trg_in)`` and the loss is taken on the
flattened output, so nndx gets a ``loss_fn(output, trg_out)`` that flattens as ``train`` does
(``output.contiguous().view(-1, output_dim)`` against ``trg_out.contiguous().view(-1)``), the
model wrapped to return the output only (``model(src, trg_in)[0]``; the model returns
``(output, attention)``), and the batch ``((src, trg[:, :-1]), trg[:, 1:])`` of the first training
batch; a preflight ``nndx.probe`` with the optimizer; ``nndx.Monitor(model, optimizer)`` around
the epochs, each batch's loss logged after the step and each epoch's valid loss logged as
``split="val"``; after training (best state loaded) ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "convs2s"
SOURCE = Source("bentrevett/pytorch-seq2seq", "legacy/5 - Convolutional Sequence to Sequence Learning.ipynb",
                "b3cd54c72cd6e4e63f672d334c795b4fe744ef92", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: synthetic word-mapping + pair-swap translation, "
                "3+3 blocks of width 64, 8 epochs)"),
        Variant(
            "decoder_not_causal",
            "the decoder's convolutions are padded like the encoder's (padding=(k-1)//2 on both sides, no left "
            "padding of k-1): each target position sees the next target token, so teacher-forced training "
            "learns to copy it and greedy decoding, which has no next token, fails",
            (C.DATA_LEAKAGE,),
            ("https://github.com/bentrevett/pytorch-seq2seq/issues/30",
             "https://github.com/bentrevett/pytorch-seq2seq/issues/14",
             "https://github.com/mit-han-lab/lite-transformer/issues/39"),
            Measure("test_token_acc", "greedy-decoded test token accuracy at least 0.2 below the healthy run's: 0.03 "
                    "against 0.50 on seed 0, with a training loss of 0.15 against 1.66",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "no_ignore_index",
            "criterion = nn.CrossEntropyLoss() without ignore_index=TRG_PAD_IDX: every <pad> position after a "
            "short sentence's <eos> is a target, the loss and the perplexity the notebook reports are averaged "
            "over the padding, and the gradient is spent on predicting <pad>",
            (C.WRONG_LOSS,),
            ("https://github.com/MaximumEntropy/Seq2Seq-PyTorch/issues/11",
             "https://github.com/lucidrains/DALLE-pytorch/issues/57",
             "https://github.com/lukas-blecher/LaTeX-OCR/issues/305"),
            Measure("test_ppl", "test perplexity over the real tokens (pad ignored, measure only) at least 1.05x the "
                    "healthy run's: 3.48/3.52 against 3.13/3.10 on seeds 0/1, while the perplexity the program "
                    "prints, padding included, is 0.83x/0.82x",
                    lambda healthy, buggy: not buggy < 1.05 * healthy),
        ),
    )
}

N_WORDS, MIN_LEN, MAX_LEN = 24, 4, 12
N_TRAIN, N_VALID, N_TEST = 2000, 300, 300
BATCH_SIZE, EMB_DIM, HID_DIM, ENC_LAYERS, DEC_LAYERS = 64, 32, 64, 3, 3
ENC_KERNEL_SIZE, DEC_KERNEL_SIZE, ENC_DROPOUT, DEC_DROPOUT = 3, 3, 0.25, 0.25
N_EPOCHS, CLIP = 8, 0.1


# --------------------------------------------------------------------------- data (in place of Multi30k)


class Vocab:
    """torchtext's legacy vocab as ``Field.build_vocab`` makes it: <unk>, <pad>, <sos>, <eos>, then
    the tokens by frequency (ties alphabetical)."""

    def __init__(self, sentences: list[list[str]]) -> None:
        counts: dict[str, int] = {}
        for sentence in sentences:
            for tok in sentence:
                counts[tok] = counts.get(tok, 0) + 1
        self.itos = ["<unk>", "<pad>", "<sos>", "<eos>"] + sorted(counts, key=lambda t: (-counts[t], t))
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)


def make_pairs(n: int, rng: random.Random, mapping: dict[str, list[str]]) -> list[tuple[list[str], list[str]]]:
    pairs = []
    for _ in range(n):
        length = rng.randint(MIN_LEN, MAX_LEN)
        src = [f"s{rng.randrange(N_WORDS)}" for _ in range(length)]
        words = [mapping[w] for w in src]
        for i in range(0, length - 1, 2):  # a local reordering: swap each adjacent pair
            words[i], words[i + 1] = words[i + 1], words[i]
        trg = [tok for word in words for tok in word]  # some words translate to two tokens, some to none
        pairs.append((src, trg))
    return pairs


def numericalize(sentences: list[list[str]], vocab: Vocab) -> torch.Tensor:
    """Field.process: <sos> + tokens + <eos>, padded with <pad> to the longest, batch-first."""
    longest = max(len(s) for s in sentences) + 2
    rows = []
    for s in sentences:
        ids = [vocab.stoi["<sos>"]] + [vocab.stoi.get(t, 0) for t in s] + [vocab.stoi["<eos>"]]
        rows.append(ids + [vocab.stoi["<pad>"]] * (longest - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


def bucket_batches(pairs, src_vocab: Vocab, trg_vocab: Vocab, batch_size: int, shuffle: bool,
                   rng: random.Random) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """BucketIterator's shape: pools of 100 batches sorted by length, cut into batches, the batches
    shuffled when training."""
    order = list(range(len(pairs)))
    if shuffle:
        rng.shuffle(order)
    batches = []
    pool = batch_size * 100
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        for b in range(0, len(chunk), batch_size):
            idx = chunk[b : b + batch_size]
            batches.append((numericalize([pairs[i][0] for i in idx], src_vocab),
                            numericalize([pairs[i][1] for i in idx], trg_vocab)))  # fmt: skip
    if shuffle:
        rng.shuffle(batches)
    return batches


# --------------------------------------------------------------------------- the notebook's model


class Encoder(nn.Module):
    def __init__(self, input_dim, emb_dim, hid_dim, n_layers, kernel_size, dropout, device, max_length=100):
        super().__init__()
        assert kernel_size % 2 == 1, "Kernel size must be odd!"
        self.device = device
        self.scale = torch.sqrt(torch.FloatTensor([0.5])).to(device)
        self.tok_embedding = nn.Embedding(input_dim, emb_dim)
        self.pos_embedding = nn.Embedding(max_length, emb_dim)
        self.emb2hid = nn.Linear(emb_dim, hid_dim)
        self.hid2emb = nn.Linear(hid_dim, emb_dim)
        self.convs = nn.ModuleList([nn.Conv1d(in_channels=hid_dim, out_channels=2 * hid_dim,
                                              kernel_size=kernel_size, padding=(kernel_size - 1) // 2)
                                    for _ in range(n_layers)])  # fmt: skip
        self.dropout = nn.Dropout(dropout)

    def forward(self, src):
        batch_size, src_len = src.shape[0], src.shape[1]
        pos = torch.arange(0, src_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)
        tok_embedded = self.tok_embedding(src)
        pos_embedded = self.pos_embedding(pos)
        embedded = self.dropout(tok_embedded + pos_embedded)
        conv_input = self.emb2hid(embedded)
        conv_input = conv_input.permute(0, 2, 1)
        for conv in self.convs:
            conved = conv(self.dropout(conv_input))
            conved = F.glu(conved, dim=1)
            conved = (conved + conv_input) * self.scale
            conv_input = conved
        conved = self.hid2emb(conved.permute(0, 2, 1))
        combined = (conved + embedded) * self.scale
        return conved, combined


class Decoder(nn.Module):
    def __init__(self, output_dim, emb_dim, hid_dim, n_layers, kernel_size, dropout, trg_pad_idx, device,
                 max_length=100, causal=True):  # fmt: skip
        super().__init__()
        self.kernel_size = kernel_size
        self.trg_pad_idx = trg_pad_idx
        self.device = device
        self.causal = causal
        self.scale = torch.sqrt(torch.FloatTensor([0.5])).to(device)
        self.tok_embedding = nn.Embedding(output_dim, emb_dim)
        self.pos_embedding = nn.Embedding(max_length, emb_dim)
        self.emb2hid = nn.Linear(emb_dim, hid_dim)
        self.hid2emb = nn.Linear(hid_dim, emb_dim)
        self.attn_hid2emb = nn.Linear(hid_dim, emb_dim)
        self.attn_emb2hid = nn.Linear(emb_dim, hid_dim)
        self.fc_out = nn.Linear(emb_dim, output_dim)
        # the bug: the decoder's convolutions padded like the encoder's, on both sides
        self.convs = nn.ModuleList([nn.Conv1d(in_channels=hid_dim, out_channels=2 * hid_dim, kernel_size=kernel_size,
                                              padding=0 if causal else (kernel_size - 1) // 2)
                                    for _ in range(n_layers)])  # fmt: skip
        self.dropout = nn.Dropout(dropout)

    def calculate_attention(self, embedded, conved, encoder_conved, encoder_combined):
        conved_emb = self.attn_hid2emb(conved.permute(0, 2, 1))
        combined = (conved_emb + embedded) * self.scale
        energy = torch.matmul(combined, encoder_conved.permute(0, 2, 1))
        attention = F.softmax(energy, dim=2)
        attended_encoding = torch.matmul(attention, encoder_combined)
        attended_encoding = self.attn_emb2hid(attended_encoding)
        attended_combined = (conved + attended_encoding.permute(0, 2, 1)) * self.scale
        return attention, attended_combined

    def forward(self, trg, encoder_conved, encoder_combined):
        batch_size, trg_len = trg.shape[0], trg.shape[1]
        pos = torch.arange(0, trg_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)
        tok_embedded = self.tok_embedding(trg)
        pos_embedded = self.pos_embedding(pos)
        embedded = self.dropout(tok_embedded + pos_embedded)
        conv_input = self.emb2hid(embedded)
        conv_input = conv_input.permute(0, 2, 1)
        batch_size, hid_dim = conv_input.shape[0], conv_input.shape[1]
        for conv in self.convs:
            conv_input = self.dropout(conv_input)
            if self.causal:  # need to pad so decoder can't "cheat"
                padding = torch.zeros(batch_size, hid_dim, self.kernel_size - 1).fill_(self.trg_pad_idx).to(self.device)
                padded_conv_input = torch.cat((padding, conv_input), dim=2)
            else:
                padded_conv_input = conv_input
            conved = conv(padded_conv_input)
            conved = F.glu(conved, dim=1)
            attention, conved = self.calculate_attention(embedded, conved, encoder_conved, encoder_combined)
            conved = (conved + conv_input) * self.scale
            conv_input = conved
        conved = self.hid2emb(conved.permute(0, 2, 1))
        output = self.fc_out(self.dropout(conved))
        return output, attention


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, src, trg):
        encoder_conved, encoder_combined = self.encoder(src)
        output, attention = self.decoder(trg, encoder_conved, encoder_combined)
        return output, attention


class OutputOnly(nn.Module):
    """What nndx is handed: the Seq2Seq whose forward returns the output alone."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, src, trg):
        return self.model(src, trg)[0]


# --------------------------------------------------------------------------- train / evaluate / translate


def train_epoch(model, iterator, optimizer, criterion, clip, mon, nx):
    model.train()
    epoch_loss = 0
    for batch in iterator:
        src, trg = batch
        optimizer.zero_grad()
        output, _ = model(src, trg[:, :-1])
        output_dim = output.shape[-1]
        output = output.contiguous().view(-1, output_dim)
        trg = trg[:, 1:].contiguous().view(-1)
        loss = criterion(output, trg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        epoch_loss += loss.item()
    return epoch_loss / len(iterator)


def evaluate(model, iterator, criterion):
    model.eval()
    epoch_loss = 0
    with torch.no_grad():
        for batch in iterator:
            src, trg = batch
            output, _ = model(src, trg[:, :-1])
            output_dim = output.shape[-1]
            output = output.contiguous().view(-1, output_dim)
            trg = trg[:, 1:].contiguous().view(-1)
            loss = criterion(output, trg)
            epoch_loss += loss.item()
    return epoch_loss / len(iterator)


def translate_batch(model, src_tensor, trg_vocab, max_len):
    """translate_sentence for several sources of one length at once (no padding in the batch, so each
    row decodes exactly as it would alone)."""
    model.eval()
    with torch.no_grad():
        encoder_conved, encoder_combined = model.encoder(src_tensor)
    trg_indexes = torch.full((src_tensor.shape[0], 1), trg_vocab.stoi["<sos>"], dtype=torch.long)
    for _ in range(max_len):
        with torch.no_grad():
            output, _ = model.decoder(trg_indexes, encoder_conved, encoder_combined)
        pred_token = output.argmax(2)[:, -1:]
        trg_indexes = torch.cat((trg_indexes, pred_token), dim=1)
    results = []
    for row in trg_indexes[:, 1:].tolist():
        tokens = [trg_vocab.itos[i] for i in row]
        results.append(tokens[: tokens.index("<eos>")] if "<eos>" in tokens else tokens)
    return results


def greedy_scores(model, pairs, src_vocab, trg_vocab) -> tuple[float, float]:
    by_len: dict[int, list[int]] = {}
    for i, (src, _) in enumerate(pairs):
        by_len.setdefault(len(src), []).append(i)
    correct = total = exact = 0
    for length, idx in by_len.items():
        src_tensor = numericalize([pairs[i][0] for i in idx], src_vocab)
        preds = translate_batch(model, src_tensor, trg_vocab, max_len=2 * length + 2)
        for i, pred in zip(idx, preds):
            ref = pairs[i][1]
            correct += sum(p == r for p, r in zip(pred, ref))
            total += len(ref)
            exact += pred == ref
    return correct / total, exact / len(pairs)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    SEED = 1234 + seed
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    device = torch.device("cpu")
    data_rng = random.Random(SEED)
    targets = [f"t{i}" for i in range(N_WORDS)]
    data_rng.shuffle(targets)
    # a fixed random dictionary: 6 source words translate to two target words, 3 to none
    mapping = {f"s{i}": [targets[i]] for i in range(N_WORDS)}
    for i in range(6):
        mapping[f"s{i}"] = [targets[i], targets[(i + 7) % N_WORDS]]
    for i in range(6, 9):
        mapping[f"s{i}"] = []
    train_data = make_pairs(N_TRAIN, data_rng, mapping)
    valid_data = make_pairs(N_VALID, data_rng, mapping)
    test_data = make_pairs(N_TEST, data_rng, mapping)
    SRC = Vocab([s for s, _ in train_data])
    TRG = Vocab([t for _, t in train_data])
    iter_rng = random.Random(SEED + 1)
    valid_iterator = bucket_batches(valid_data, SRC, TRG, BATCH_SIZE, False, iter_rng)
    test_iterator = bucket_batches(test_data, SRC, TRG, BATCH_SIZE, False, iter_rng)

    INPUT_DIM, OUTPUT_DIM = len(SRC), len(TRG)
    TRG_PAD_IDX = TRG.stoi["<pad>"]
    enc = Encoder(INPUT_DIM, EMB_DIM, HID_DIM, ENC_LAYERS, ENC_KERNEL_SIZE, ENC_DROPOUT, device)
    dec = Decoder(OUTPUT_DIM, EMB_DIM, HID_DIM, DEC_LAYERS, DEC_KERNEL_SIZE, DEC_DROPOUT, TRG_PAD_IDX, device,
                  causal=variant != "decoder_not_causal")  # fmt: skip
    model = Seq2Seq(enc, dec).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    if variant == "no_ignore_index":
        criterion = nn.CrossEntropyLoss()
    else:
        criterion = nn.CrossEntropyLoss(ignore_index=TRG_PAD_IDX)
    healthy_criterion = nn.CrossEntropyLoss(ignore_index=TRG_PAD_IDX)

    def loss_fn(output, trg_out):
        return criterion(output.contiguous().view(-1, output.shape[-1]), trg_out.contiguous().view(-1))

    first_src, first_trg = bucket_batches(train_data, SRC, TRG, BATCH_SIZE, True, random.Random(SEED + 2))[0]
    nndx_batch = ((first_src, first_trg[:, :-1]), first_trg[:, 1:])
    nndx_model = OutputOnly(model)
    nx.preflight(nndx_model, nndx_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(nndx_model, optimizer)

    best_valid_loss, best_state = float("inf"), None
    train_loss = valid_loss = float("nan")
    for _epoch in range(N_EPOCHS):
        train_iterator = bucket_batches(train_data, SRC, TRG, BATCH_SIZE, True, iter_rng)
        train_loss = train_epoch(model, train_iterator, optimizer, criterion, CLIP, mon, nx)
        valid_loss = evaluate(model, valid_iterator, criterion)
        nx.timed(lambda: mon.log(valid_loss, split="val"))  # noqa: B023
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), 'tut5-model.pt')
    model.load_state_dict(best_state)

    nx.finish(mon, nndx_model, nndx_batch, loss_fn, optimizer=optimizer)

    test_loss = evaluate(model, test_iterator, criterion)
    true_test_loss = evaluate(model, test_iterator, healthy_criterion)
    token_acc, exact = greedy_scores(model, test_data, SRC, TRG)
    return {"reported_test_ppl": math.exp(test_loss), "test_ppl": math.exp(true_test_loss),
            "test_token_acc": token_acc, "test_exact_match": exact, "final_train_loss": train_loss,
            "best_valid_loss": best_valid_loss}  # fmt: skip
