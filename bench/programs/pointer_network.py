"""Port of ast0414/pointer-networks-pytorch: a Pointer Network (Vinyals et al. 2015) that learns
to sort a sequence of integers by pointing at the input positions in sorted order.

Source: github.com/ast0414/pointer-networks-pytorch, ``train_sort.py``, ``model.py`` and
``dataset.py`` at commit 27aec4e011a37f96270e3d6ac7423225d4c40ef3 (MIT, Copyright (c) 2019
Sungtae An). Written anew from the facts of those files; no code copied.

Kept: ``IntegerSortDataset`` (integers drawn from ``[low, high)`` by a seeded
``RandomState``, a random length in ``[min_len, max_len]``, the label the argsort of the
sequence, each sample a one-hot ``(len, high)`` matrix); ``sparse_seq_collate_fn`` (the
batch sorted by length, descending, the one-hot rows padded to the longest, the labels
padded with -1); ``masked_log_softmax`` (``vector + log(mask + 1e-45)`` then
``log_softmax``) and ``masked_max`` (masked positions filled with -1e7 before ``max``);
``Encoder`` = a bidirectional one-layer ``LSTM`` over ``pack_padded_sequence`` /
``pad_packed_sequence``; ``Attention`` = ``vt(tanh(W1 e + W2 d))`` (no biases) through
``masked_log_softmax``; ``PointerNet``: a bias-free ``Linear`` embedding of the one-hot
numbers, the two directions' encoder outputs summed, an ``LSTMCell`` decoder started
from the forward direction's last ``(h, c)`` with a zero first input, at each step the
pointer's log-scores masked to the sequence's own length, the argmax pointer, and the
encoder output at that pointer fed back as the next decoder input (the repository feeds
its own argmax back, not the target: no teacher forcing; and it masks only padding, not
the positions already chosen); all ``Linear`` biases zeroed; ``train_sort.py``:
``Adam(lr=1e-3, weight_decay=1e-5)``, per batch ``zero_grad``, ``F.nll_loss`` of the
unrolled log-scores with ``ignore_index=-1``, the NaN assert, ``backward``, ``step``,
``AverageMeter`` s of loss and ``masked_accuracy`` (pointer equality over the valid
positions), a test pass after each epoch on a second dataset (seed 2); ``--emb-dim 8``
used for both the embedding and the hidden size, ``--min-length 5 --max-length 10``,
``--high 100``, ``random.seed``/``torch.manual_seed``.
Shrunk: 3,072 training sequences instead of 100,000 and 512 test instead of 1,000; batch
128 instead of 256; 10 epochs instead of 100; ``high`` 30 instead of 100 (fewer one-hot
columns); emb/hidden 32 instead of 8 (at 8 the shrunk run learns to sort too slowly to
show anything); lr 3e-3 instead of 1e-3 (10 epochs of 24 batches, not 100 of 391).
No CUDA, one process (``num_workers`` 0).
Measure only (not in the program): the exact-sequence accuracy on the test set (every
pointer of a sequence right), against the test labels aligned with their sequences.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(inputs ``(seq, length)``, target the padded labels, the program's ``nll_loss`` over the
unrolled log-scores) with the optimizer; ``nndx.Monitor(model, optimizer)`` around the
epochs, every batch's loss and masked accuracy logged, each test pass's loss and accuracy
logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pointer_network"
SOURCE = Source("ast0414/pointer-networks-pytorch", "train_sort.py", "27aec4e011a37f96270e3d6ac7423225d4c40ef3", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 3,072 sequences, width 32, 10 epochs)"),
        Variant(
            "softmax_into_cross_entropy",
            "the attention returns the masked softmax probabilities (as shirgur/PointerNet's Attention does) and "
            "the loop scores them with CrossEntropyLoss: a second softmax over numbers in [0, 1], so the "
            "pointer's target probability can never be pushed toward 1 and the gradient is squashed",
            (C.DOUBLE_SOFTMAX, C.WRONG_LOSS),
            ("https://github.com/shirgur/PointerNet/blob/c7ed050/Train.py",
             "https://github.com/GiorgiaD/PEPITA/issues/1",
             "https://github.com/mjc92/GetToThePoint/issues/8",
             "https://github.com/PingYu-iris/SA-GCN/pull/4"),
            Measure("test_exact", "test exact-sequence accuracy at least 0.15 below the healthy run's (0.0 "
                    "against 0.30 on seed 0; masked pointer accuracy 0.13 against 0.61)", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "labels_not_sorted_with_batch",
            "the collate function sorts the sequences by length for pack_padded_sequence but pads the labels "
            "in the loader's original order: within each batch the targets belong to other sequences",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/fartashf/vsepp/pull/36", "https://github.com/pytorch/pytorch/issues/4927",
             "https://github.com/pytorch/pytorch/issues/2615"),
            Measure("test_exact", "test exact-sequence accuracy (labels aligned) at least 0.15 below the "
                    "healthy run's (0.0 against 0.30 on seed 0)", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

ARGS = {"low": 0, "high": 30, "min_length": 5, "max_length": 10, "train_samples": 3072, "test_samples": 512,
        "emb_dim": 32, "batch_size": 128, "epochs": 10, "lr": 3e-3, "wd": 1e-5, "seed": 1}  # fmt: skip


# --------------------------------------------------------------------------- dataset.py


class IntegerSortDataset(Dataset):
    def __init__(self, num_samples: int, low: int, high: int, min_len: int, max_len: int, seed: int) -> None:
        self.prng = np.random.RandomState(seed=seed)
        self.input_dim = high
        self.seqs = [[[x] for x in self.prng.choice(np.arange(low, high), size=self.prng.randint(min_len, max_len + 1))
                      .tolist()] for _ in range(num_samples)]  # fmt: skip
        self.labels = [sorted(range(len(seq)), key=seq.__getitem__) for seq in self.seqs]

    def __getitem__(self, index: int):
        seq, label = self.seqs[index], self.labels[index]
        data = torch.zeros(len(seq), self.input_dim)  # the one-hot rows (sparse in the original)
        for i, numbers in enumerate(seq):
            for number in numbers:
                data[i, number] = 1.0
        return data, len(seq), label

    def __len__(self) -> int:
        return len(self.seqs)


def make_collate(keep_label_order: bool = False):
    """``sparse_seq_collate_fn``; ``keep_label_order`` is the bug: labels left unsorted."""

    def collate(batch):
        batch_size = len(batch)
        ordered = sorted(batch, key=lambda x: x[1], reverse=True)
        sorted_seqs, sorted_lengths, sorted_labels = zip(*ordered)
        if keep_label_order:
            sorted_labels = tuple(b[2] for b in batch)
        longest = sorted_seqs[0].size(0)
        padded = [F.pad(seq, (0, 0, 0, longest - seq.size(0))) for seq in sorted_seqs]
        seq_tensor = torch.stack(padded)
        length_tensor = torch.LongTensor(sorted_lengths)
        padded_labels = list(zip(*itertools.zip_longest(*sorted_labels, fillvalue=-1)))
        label_tensor = torch.LongTensor(padded_labels).view(batch_size, -1)
        return seq_tensor, length_tensor, label_tensor

    return collate


# --------------------------------------------------------------------------- model.py


def masked_log_softmax(vector: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if mask is not None:
        mask = mask.float()
        while mask.dim() < vector.dim():
            mask = mask.unsqueeze(1)
        vector = vector + (mask + 1e-45).log()
    return F.log_softmax(vector, dim=dim)


def masked_max(vector: torch.Tensor, mask: torch.Tensor, dim: int, keepdim: bool = False, min_val: float = -1e7):
    replaced = vector.masked_fill((1.0 - mask).bool(), min_val)
    return replaced.max(dim=dim, keepdim=keepdim)


class Encoder(nn.Module):
    def __init__(self, embedding_dim: int, hidden_size: int, num_layers: int = 1, batch_first: bool = True,
                 bidirectional: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.batch_first = batch_first
        self.rnn = nn.LSTM(input_size=embedding_dim, hidden_size=hidden_size, num_layers=num_layers,
                           batch_first=batch_first, bidirectional=bidirectional)  # fmt: skip

    def forward(self, embedded_inputs: torch.Tensor, input_lengths: torch.Tensor):
        packed = nn.utils.rnn.pack_padded_sequence(embedded_inputs, input_lengths.cpu(), batch_first=self.batch_first)
        outputs, hidden = self.rnn(packed)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=self.batch_first)
        return outputs, hidden


class Attention(nn.Module):
    def __init__(self, hidden_size: int, probabilities: bool = False) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.W1 = nn.Linear(hidden_size, hidden_size, bias=False)
        self.W2 = nn.Linear(hidden_size, hidden_size, bias=False)
        self.vt = nn.Linear(hidden_size, 1, bias=False)
        self.probabilities = probabilities  # the bug: return softmax probabilities, as shirgur's Attention does

    def forward(self, decoder_state: torch.Tensor, encoder_outputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        encoder_transform = self.W1(encoder_outputs)
        decoder_transform = self.W2(decoder_state).unsqueeze(1)
        u_i = self.vt(torch.tanh(encoder_transform + decoder_transform)).squeeze(-1)
        log_score = masked_log_softmax(u_i, mask, dim=-1)
        return log_score.exp() if self.probabilities else log_score


class PointerNet(nn.Module):
    def __init__(self, input_dim: int, embedding_dim: int, hidden_size: int, bidirectional: bool = True,
                 batch_first: bool = True, probabilities: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.embedding_dim, self.hidden_size = embedding_dim, hidden_size
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.num_layers = 1
        self.batch_first = batch_first
        self.embedding = nn.Linear(in_features=input_dim, out_features=embedding_dim, bias=False)
        self.encoder = Encoder(embedding_dim=embedding_dim, hidden_size=hidden_size, num_layers=self.num_layers,
                               bidirectional=bidirectional, batch_first=batch_first)  # fmt: skip
        self.decoding_rnn = nn.LSTMCell(input_size=hidden_size, hidden_size=hidden_size)
        self.attn = Attention(hidden_size=hidden_size, probabilities=probabilities)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_seq: torch.Tensor, input_lengths: torch.Tensor):
        batch_size, max_seq_len = input_seq.size(0), input_seq.size(1)
        embedded = self.embedding(input_seq)
        encoder_outputs, encoder_hidden = self.encoder(embedded, input_lengths)
        if self.bidirectional:  # the two directions' outputs summed
            encoder_outputs = encoder_outputs[:, :, : self.hidden_size] + encoder_outputs[:, :, self.hidden_size :]
        h_n, c_n = encoder_hidden
        h_n = h_n.view(self.num_layers, self.num_directions, batch_size, self.hidden_size)
        c_n = c_n.view(self.num_layers, self.num_directions, batch_size, self.hidden_size)
        decoder_input = encoder_outputs.new_zeros(torch.Size((batch_size, self.hidden_size)))
        decoder_hidden = (h_n[-1, 0, :, :].squeeze(), c_n[-1, 0, :, :].squeeze())

        range_tensor = torch.arange(max_seq_len, dtype=input_lengths.dtype).expand(batch_size, max_seq_len, max_seq_len)
        each_len_tensor = input_lengths.view(-1, 1, 1).expand(batch_size, max_seq_len, max_seq_len)
        row_mask = range_tensor < each_len_tensor
        mask_tensor = row_mask * row_mask.transpose(1, 2)

        pointer_log_scores, pointer_argmaxs = [], []
        for i in range(max_seq_len):
            sub_mask = mask_tensor[:, i, :].float()
            h_i, c_i = self.decoding_rnn(decoder_input, decoder_hidden)
            decoder_hidden = (h_i, c_i)
            log_pointer_score = self.attn(h_i, encoder_outputs, sub_mask)
            pointer_log_scores.append(log_pointer_score)
            _, masked_argmax = masked_max(log_pointer_score, sub_mask, dim=1, keepdim=True)
            pointer_argmaxs.append(masked_argmax)
            index_tensor = masked_argmax.unsqueeze(-1).expand(batch_size, 1, self.hidden_size)
            decoder_input = torch.gather(encoder_outputs, dim=1, index=index_tensor).squeeze(1)

        return torch.stack(pointer_log_scores, 1), torch.cat(pointer_argmaxs, 1), mask_tensor


# --------------------------------------------------------------------------- train_sort.py


class AverageMeter:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def masked_accuracy(output: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.masked_select(output, mask).eq(torch.masked_select(target, mask)).float().mean()


def exact_accuracy(model: PointerNet, dataset: IntegerSortDataset, batch_size: int) -> float:
    """Measure only: the share of test sequences whose every pointer is right (labels aligned)."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=make_collate())
    right = total = 0
    with torch.no_grad():
        for seq, length, target in loader:
            _, argmax_pointer, mask = model(seq, length)
            valid = mask[:, 0, :]
            ok = (argmax_pointer.eq(target) | ~valid).all(dim=1)
            right += int(ok.sum())
            total += seq.size(0)
    return right / total


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(args["seed"] + seed)
    torch.manual_seed(args["seed"] + seed)
    train_set = IntegerSortDataset(args["train_samples"], args["low"], args["high"], args["min_length"],
                                   args["max_length"], seed=1 + 10 * seed)  # fmt: skip
    test_set = IntegerSortDataset(args["test_samples"], args["low"], args["high"], args["min_length"],
                                  args["max_length"], seed=2 + 10 * seed)  # fmt: skip
    collate = make_collate(keep_label_order=variant == "labels_not_sorted_with_batch")
    train_loader = DataLoader(train_set, batch_size=args["batch_size"], shuffle=True, collate_fn=collate,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_set, batch_size=args["batch_size"], shuffle=False, collate_fn=collate)

    probabilities = variant == "softmax_into_cross_entropy"
    model = PointerNet(input_dim=args["high"], embedding_dim=args["emb_dim"], hidden_size=args["emb_dim"],
                       probabilities=probabilities)  # fmt: skip
    optimizer = Adam(model.parameters(), lr=args["lr"], weight_decay=args["wd"])

    def criterion(output, target: torch.Tensor) -> torch.Tensor:
        pointer_scores = output[0]
        unrolled = pointer_scores.view(-1, pointer_scores.size(-1))
        if probabilities:  # shirgur's CrossEntropyLoss on the attention's softmax
            return F.cross_entropy(unrolled, target.view(-1), ignore_index=-1)
        return F.nll_loss(unrolled, target.view(-1), ignore_index=-1)

    first_seq, first_len, first_target = next(iter(DataLoader(train_set, batch_size=args["batch_size"],
                                                              shuffle=False, collate_fn=collate)))  # fmt: skip
    probe_batch = ((first_seq, first_len), first_target)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    train_loss, train_accuracy = AverageMeter(), AverageMeter()
    test_loss, test_accuracy = AverageMeter(), AverageMeter()
    log: list[str] = []
    for epoch in range(args["epochs"]):
        model.train()
        for batch_idx, (seq, length, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(seq, length)
            loss = mon.loss_fn(output, target)
            assert not np.isnan(loss.item()), "Model diverged with loss = NaN"
            loss.backward()
            optimizer.step()
            train_loss.update(loss.item(), seq.size(0))
            _, argmax_pointer, mask = output
            mask = mask[:, 0, :]
            acc = masked_accuracy(argmax_pointer, target, mask).item()
            train_accuracy.update(acc, mask.int().sum().item())
            mon.log(loss, accuracy=acc)
            if batch_idx % 20 == 0:
                log.append(f"Epoch {epoch}: Train [{batch_idx * len(seq)}/{len(train_loader.dataset)}]\t"
                           f"Loss: {train_loss.avg:.6f}\tAccuracy: {train_accuracy.avg:.6f}")  # fmt: skip
        model.eval()
        with torch.no_grad():  # (the original evaluates with autograd on; the numbers are the same)
            for seq, length, target in test_loader:
                output = model(seq, length)
                loss = criterion(output, target)
                assert not np.isnan(loss.item()), "Model diverged with loss = NaN"
                test_loss.update(loss.item(), seq.size(0))
                _, argmax_pointer, mask = output
                mask = mask[:, 0, :]
                test_accuracy.update(masked_accuracy(argmax_pointer, target, mask).item(), mask.int().sum().item())
        mon.log(test_loss.avg, split="val", accuracy=test_accuracy.avg)
        log.append(f"Epoch {epoch}: Test\tLoss: {test_loss.avg:.6f}\tAccuracy: {test_accuracy.avg:.6f}")

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    model.eval()
    return {
        "test_exact": exact_accuracy(model, test_set, args["batch_size"]),
        "test_accuracy": test_accuracy.avg,
        "test_loss": test_loss.avg,
        "train_loss": train_loss.avg,
        "train_accuracy": train_accuracy.avg,
    }
