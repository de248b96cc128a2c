"""Port of the PyTorch language-translation example (an ``nn.Transformer`` encoder-decoder).

Source: github.com/pytorch/examples, ``language_translation/main.py``,
``language_translation/src/model.py`` and ``language_translation/src/data.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of those files; no code copied.

Kept: ``Translator`` = source and target ``nn.Embedding`` + a sinusoidal
``PositionalEncoding`` (a ``(maxlen, 1, emb)`` buffer added along the first dimension,
then ``Dropout``) + ``nn.Transformer`` in its default sequence-first layout + a ``Linear``
to the target vocabulary; Xavier-uniform init of every parameter with more than one
dimension; ``encode``/``decode`` for greedy decoding; the special symbols ``<unk>``=0,
``<pad>``=1, ``<bos>``=2, ``<eos>``=3, each sentence wrapped in ``<bos>``/``<eos>`` and a
batch padded with ``<pad>`` to ``(seq, batch)``; ``create_mask`` (an all-False source
mask, the float ``-inf`` upper-triangular subsequent mask for the target, key-padding
masks for source and target, the source one reused as the memory padding mask);
``tgt_input = tgt[:-1]`` into the decoder, ``tgt[1:]`` as targets; the forward pass
before ``optim.zero_grad()``; ``CrossEntropyLoss(ignore_index=<pad>)`` on the flattened
logits; Adam with betas (0.9, 0.98), eps 1e-9; ``validate`` under ``model.eval()``
every epoch; ``greedy_decode`` (one sentence at a time, the subsequent mask rebuilt at
each step, stop at ``<eos>``) as the inference path.
Shrunk: a synthetic parallel corpus (source sentences of 3-15 words from a fixed random
grammar; the "translation" maps each word through a fixed dictionary and swaps each
adjacent pair, a local reordering) instead of Multi30k de-en; 1,200 training and 200
validation pairs instead of 29,000 / 1,014; embeddings 32 wide, 4 heads, 2 encoder and
2 decoder layers, feed-forward 64 instead of 512 / 8 / 5 / 5 / 512; batches of 32
instead of 128; 15 epochs instead of 30, at ``--lr 2e-3`` instead of the default 1e-4
(a run of 570 steps instead of ~6,800; at 1e-3 the shrunk model is still at 0.34 greedy
token accuracy after 15 epochs); greedy decoding scored on 60 validation sentences.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch (the
model's seven inputs as a tuple, the flattening cross-entropy as the loss), the loop
under ``nndx.Monitor`` with the example's loss called through ``mon.loss_fn`` (the
README's style), the validation loss logged as ``split="val"``, then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "language_translation"
SOURCE = Source("pytorch/examples", "language_translation/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--lr 2e-3)"),
        Variant(
            "no_tgt_mask",
            "create_mask builds the target mask like the source one (all False) instead of the subsequent mask: "
            "the decoder attends to the very tokens it is trained to predict",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/pytorch/pytorch/issues/31567", "https://github.com/pytorch/tutorials/issues/719",
             "https://github.com/IpsumDominum/Pytorch-Simple-Transformer/issues/3"),
            Measure("greedy_token_accuracy", "token accuracy of greedy decoding (which builds its own subsequent "
                    "mask, as the example's inference does) at least 0.2 below the healthy run's, while the "
                    "teacher-forced validation loss looks far better (greedy 0.60/0.72/0.57 healthy, "
                    "0.14/0.18/0.12 buggy; val loss 0.66/0.52/0.75 healthy, 0.03/0.05/0.02 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "pad_not_ignored",
            "CrossEntropyLoss() without ignore_index=<pad>: the padding after <eos> counts as targets, "
            "so a third of the loss is the model learning to predict padding",
            (C.WRONG_LOSS,),
            ("https://github.com/MaximumEntropy/Seq2Seq-PyTorch/issues/11",
             "https://github.com/lucidrains/DALLE-pytorch/issues/57",
             "https://github.com/lukas-blecher/LaTeX-OCR/issues/305"),
            Measure("val_loss_understated", "the cross-entropy over the real (non-pad) validation tokens over the "
                    "validation loss the program reports, 1.3x the healthy run's ratio or more (1.03/1.00/1.00 "
                    "healthy, 1.64/1.57/1.59 buggy on seeds 0-2; the real-token loss itself is 1.04-1.18x the "
                    "healthy run's and greedy accuracy 0.01-0.03 lower: with Adam, the padding mostly misleads)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

UNK, PAD, BOS, EOS = 0, 1, 2, 3
N_WORDS = 40  # words per language, after the 4 special symbols
MIN_LEN, MAX_LEN = 3, 15  # words per sentence
EMBED, HEADS, ENC_LAYERS, DEC_LAYERS, FEEDFORWARD, DROPOUT = 32, 4, 2, 2, 64, 0.1
BATCH, EPOCHS, LR = 32, 15, 2e-3


# --------------------------------------------------------------------------- data


def parallel_corpus(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) pairs, without <bos>/<eos>: the tokenised sentence pairs."""
    rng = np.random.default_rng(seed)
    stream = data.word_tokens(n * MAX_LEN, vocab=N_WORDS, seed=seed).tolist()
    dictionary = np.random.default_rng(1234).permutation(N_WORDS)  # the same "language" on every seed
    pairs, at = [], 0
    for _ in range(n):
        length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        words = stream[at : at + length]
        at += length
        translated = [int(dictionary[w]) for w in words]
        for i in range(0, length - 1, 2):  # local reordering
            translated[i], translated[i + 1] = translated[i + 1], translated[i]
        pairs.append(([w + 4 for w in words], [w + 4 for w in translated]))
    return pairs


def tensor_transform(ids: list[int]) -> torch.Tensor:
    return torch.cat((torch.tensor([BOS]), torch.tensor(ids, dtype=torch.long), torch.tensor([EOS])))


def pad_sequence(seqs: list[torch.Tensor]) -> torch.Tensor:
    """``nn.utils.rnn.pad_sequence`` with its default layout: (max_len, batch)."""
    return nn.utils.rnn.pad_sequence(seqs, padding_value=PAD)


def collate(batch: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_sequence([tensor_transform(s) for s, _ in batch]), pad_sequence([tensor_transform(t) for _, t in batch])


def generate_square_subsequent_mask(size: int) -> torch.Tensor:
    mask = (torch.triu(torch.ones((size, size))) == 1).transpose(0, 1)
    return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, float(0.0))


def create_mask(src: torch.Tensor, tgt: torch.Tensor, variant: str):
    src_seq_len, tgt_seq_len = src.shape[0], tgt.shape[0]
    if variant == "no_tgt_mask":
        tgt_mask = torch.zeros((tgt_seq_len, tgt_seq_len)).type(torch.bool)
    else:
        tgt_mask = generate_square_subsequent_mask(tgt_seq_len)
    src_mask = torch.zeros((src_seq_len, src_seq_len)).type(torch.bool)
    src_padding_mask = (src == PAD).transpose(0, 1)
    tgt_padding_mask = (tgt == PAD).transpose(0, 1)
    return src_mask, tgt_mask, src_padding_mask, tgt_padding_mask


# --------------------------------------------------------------------------- the model


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int = 5000) -> None:
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding.unsqueeze(-2))

    def forward(self, token_embedding: torch.Tensor) -> torch.Tensor:
        return self.dropout(token_embedding + self.pos_embedding[: token_embedding.size(0), :])


class Translator(nn.Module):
    def __init__(self, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(src_vocab_size, EMBED)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, EMBED)
        self.pos_enc = PositionalEncoding(EMBED, DROPOUT)
        self.transformer = nn.Transformer(
            d_model=EMBED, nhead=HEADS, num_encoder_layers=ENC_LAYERS, num_decoder_layers=DEC_LAYERS,
            dim_feedforward=FEEDFORWARD, dropout=DROPOUT,
        )  # fmt: skip
        self.ff = nn.Linear(EMBED, tgt_vocab_size)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):
        src_emb = self.pos_enc(self.src_embedding(src))
        tgt_emb = self.pos_enc(self.tgt_embedding(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                memory_key_padding_mask)  # fmt: skip
        return self.ff(outs)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.pos_enc(self.src_embedding(src)), src_mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer.decoder(self.pos_enc(self.tgt_embedding(tgt)), memory, tgt_mask)


def greedy_decode(model: Translator, src: torch.Tensor, max_len: int) -> torch.Tensor:
    src_mask = torch.zeros(src.shape[0], src.shape[0]).type(torch.bool)
    memory = model.encode(src, src_mask)
    ys = torch.ones(1, 1).fill_(BOS).type(torch.long)
    for _ in range(max_len - 1):
        tgt_mask = generate_square_subsequent_mask(ys.size(0)).type(torch.bool)
        out = model.decode(ys, memory, tgt_mask).transpose(0, 1)
        next_word = torch.max(model.ff(out[:, -1]), dim=1)[1].item()
        ys = torch.cat([ys, torch.ones(1, 1).type_as(src).fill_(next_word)], dim=0)
        if next_word == EOS:
            break
    return ys.flatten()


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = EPOCHS) -> dict[str, float]:
    torch.manual_seed(seed)
    pairs = parallel_corpus(1400, seed=seed)
    train_pairs, valid_pairs = pairs[:1200], pairs[1200:]
    vocab_size = N_WORDS + 4
    # the DataLoader (no shuffle, as in the example), as a list of collated batches
    train_dl = [collate(train_pairs[i : i + BATCH]) for i in range(0, len(train_pairs), BATCH)]
    valid_dl = [collate(valid_pairs[i : i + BATCH]) for i in range(0, len(valid_pairs), BATCH)]

    model = Translator(vocab_size, vocab_size)
    if variant == "pad_not_ignored":
        loss_fn = nn.CrossEntropyLoss()
    else:
        loss_fn = nn.CrossEntropyLoss(ignore_index=PAD)
    optim = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-9)

    def model_inputs(src: torch.Tensor, tgt: torch.Tensor):
        tgt_input = tgt[:-1, :]
        src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input, variant)
        return (src, tgt_input, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, src_padding_mask), tgt[1:, :]

    def flat_loss(logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))

    probe_batch = model_inputs(*train_dl[0])
    nx.preflight(model, probe_batch, flat_loss, optimizer=optim)
    mon = nx.monitor(model, optim, every=10, loss_fn=loss_fn)

    def validate() -> tuple[float, float]:
        """The example's validate(), plus the cross-entropy over real tokens only (the measure)."""
        model.eval()
        losses, real_nll, real_count = 0.0, 0.0, 0
        with torch.no_grad():
            for src, tgt in valid_dl:
                inputs, tgt_out = model_inputs(src, tgt)
                logits = model(*inputs)
                losses += flat_loss(logits, tgt_out).item()
                real_nll += nn.functional.cross_entropy(logits.reshape(-1, vocab_size), tgt_out.reshape(-1),
                                                        ignore_index=PAD, reduction="sum").item()  # fmt: skip
                real_count += int((tgt_out != PAD).sum())
        return losses / len(valid_dl), real_nll / real_count

    train_loss = val_loss = val_real = math.nan
    for _epoch in range(1, epochs + 1):
        model.train()
        losses = 0.0
        for src, tgt in train_dl:
            inputs, tgt_out = model_inputs(src, tgt)
            logits = model(*inputs)
            optim.zero_grad()
            loss = mon.loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
            loss.backward()
            optim.step()
            mon.log(loss)
            losses += loss.item()
        train_loss = losses / len(train_dl)
        val_loss, val_real = validate()
        mon.log(val_loss, split="val")

    nx.finish(mon, model, probe_batch, flat_loss, optimizer=optim)

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for src_ids, tgt_ids in valid_pairs[:60]:
            src = tensor_transform(src_ids).view(-1, 1)
            reference = tgt_ids + [EOS]
            decoded = greedy_decode(model, src, max_len=src.shape[0] + 5).tolist()[1:]
            decoded += [PAD] * max(0, len(reference) - len(decoded))
            correct += sum(int(a == b) for a, b in zip(decoded, reference))
            total += len(reference)
    return {
        "train_loss": train_loss,
        "val_loss": val_loss,
        "val_loss_real_tokens": val_real,
        "val_loss_understated": val_real / val_loss,
        "greedy_token_accuracy": correct / total,
    }
