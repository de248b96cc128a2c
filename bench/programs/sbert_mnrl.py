"""Port of UKPLab/sentence-transformers: a SentenceTransformer (BERT + mean pooling) trained on
(anchor, positive) pairs with MultipleNegativesRankingLoss, in-batch negatives.

Source: github.com/UKPLab/sentence-transformers, ``sentence_transformers/losses/
MultipleNegativesRankingLoss.py`` with ``sentence_transformers/models/Pooling.py`` and the training
example ``examples/sentence_transformer/training/nli/training_nli_v2.py`` at commit
85ec64559f4414aa536eca4bf53538291e0a333f (Apache-2.0, Copyright 2019 Nils Reimers / UKP Lab). The
trainer is ``SentenceTransformerTrainer``, a ``transformers.Trainer``; its default optimizer and
schedule are written out. Written anew from the facts of those files; no code copied.

Kept: the model ``SentenceTransformer(model_name)`` for a plain transformer: a ``Transformer`` module
(``BertModel``, its ``last_hidden_state`` as ``token_embeddings``) then ``Pooling`` in ``mean`` mode
(token embeddings times the attention mask expanded, summed over the tokens, divided by the mask's
sum clamped at 1e-9); the loss ``MultipleNegativesRankingLoss(model)`` (``scale=20.0``,
``similarity_fct=cos_sim``): every column through the model, the anchors against the concatenated
candidates, ``scores = cos_sim(anchors, candidates) * scale``, ``CrossEntropyLoss`` with
``labels = arange(batch_size)``; ``training_nli_v2.py``'s arguments (1 epoch would be too few here,
see below; ``warmup_ratio=0.1``) with the ``Trainer`` defaults: ``AdamW`` (betas 0.9/0.999, eps 1e-8,
weight decay 0), ``get_linear_schedule_with_warmup`` stepped after every optimizer step,
``max_grad_norm=1.0``, ``model.train()``, ``zero_grad`` after each step, the loss logged every
``logging_steps``; the tokenizer pads each column to its longest text in the batch
(``padding=True``), with an attention mask; a shuffled train loader.
Shrunk: synthetic pairs instead of AllNLI: 64 latent topics (two attributes of 8 values, each value
with 4 words of its own), a text is ``[CLS]`` + 2-3 words of each of its topic's attributes + 0-4
filler words (12) in random order + ``[SEP]``, padded with ``[PAD]``; a pair is two texts drawn
independently from one topic; 2,048 train pairs, 256 held out. ``BertModel(BertConfig)`` from scratch
(no download): 2 layers, width 64, 4 heads, FFN 128, vocabulary 80, instead of
``distilroberta-base``; batch 32 instead of 128; 3 epochs; lr 1e-3 instead of 5e-5 (a model trained
from scratch, not fine-tuned); fp32 on the CPU instead of fp16; the ``NO_DUPLICATES`` batch sampler
replaced by the plain shuffled sampler (the texts are generated, duplicates are rare); no evaluator,
no checkpoints.

Measure only (not in the program): held-out retrieval accuracy@1: each held-out anchor's nearest
candidate (cosine) among the 256 held-out positives, a hit when it has the anchor's topic (chance
about 1/64).

nndx, as the author would add it: the loss module holds the model and returns the loss (the
Trainer's ``compute_loss`` calls ``loss(features, labels)``), so the preflight ``nndx.probe`` is run
on the ``MultipleNegativesRankingLoss`` module with the first batch as ``((features, labels), None)``
and ``loss_fn = lambda loss, _: loss``, with the AdamW optimizer; ``nndx.Monitor(loss_module,
optimizer)`` around the loop with every step's loss logged; then ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel, get_linear_schedule_with_warmup

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sbert_mnrl"
SOURCE = Source("UKPLab/sentence-transformers", "sentence_transformers/losses/MultipleNegativesRankingLoss.py",
                "85ec64559f4414aa536eca4bf53538291e0a333f", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (training_nli_v2.py with the Trainer defaults, shrunk)"),
        Variant(
            "scheduler_never_stepped",
            "a hand-written loop creates get_linear_schedule_with_warmup but never calls scheduler.step(): the "
            "warmup's first factor is 0/warmup_steps, so the LR stays 0 for the whole run and the printed "
            "loss stays at log(batch)",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/huggingface/transformers/issues/2331",
             "https://github.com/pytorch/text/issues/671",
             "https://github.com/pytorch/torchtitan/pull/1261"),
            Measure("retrieval_acc1", "held-out retrieval accuracy@1 at least 0.2 below the healthy run's "
                    "(0.40 against 1.00 on seed 0; the loss stays at 3.2, log(32) = 3.47)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "positives_misaligned",
            "the collate function sorts each column of the batch by length on its own (a 'smart batching' "
            "shortcut): row i of the positives is no longer anchor i's positive, yet the loss still uses "
            "labels = arange(batch_size)",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/OpenTabular/DeepTab/issues/414",
             "https://github.com/huggingface/sentence-transformers/issues/100",
             "https://github.com/philschmid/deep-learning-pytorch-huggingface/pull/66"),
            Measure("retrieval_acc1", "held-out retrieval accuracy@1 at least 0.2 below the healthy run's "
                    "(0.20 against 1.00 on seed 0; final loss 2.59 against 0.35)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

N_TRAIN, N_TEST, BATCH, EPOCHS, LR, WARMUP_RATIO, MAX_GRAD_NORM, LOGGING_STEPS = 2048, 256, 32, 3, 1e-3, 0.1, 1.0, 10
ATTR_VALUES, WORDS_PER_VALUE, FILLERS = 8, 4, 12
PAD, CLS, SEP = 0, 1, 2
FIRST_WORD = 3
VOCAB = FIRST_WORD + 2 * ATTR_VALUES * WORDS_PER_VALUE + FILLERS + 1  # 80


# --------------------------------------------------------------------------- the data and the tokenizer


def make_text(topic: int, rng: random.Random) -> list[int]:
    a, b = divmod(topic, ATTR_VALUES)
    words = [FIRST_WORD + a * WORDS_PER_VALUE + rng.randrange(WORDS_PER_VALUE) for _ in range(rng.randint(2, 3))]
    words += [FIRST_WORD + (ATTR_VALUES + b) * WORDS_PER_VALUE + rng.randrange(WORDS_PER_VALUE)
              for _ in range(rng.randint(2, 3))]  # fmt: skip
    words += [FIRST_WORD + 2 * ATTR_VALUES * WORDS_PER_VALUE + rng.randrange(FILLERS) for _ in range(rng.randint(0, 4))]
    rng.shuffle(words)
    return [CLS] + words + [SEP]


def make_pairs(n: int, rng: random.Random) -> list[tuple[list[int], list[int], int]]:
    pairs = []
    for _ in range(n):
        topic = rng.randrange(ATTR_VALUES * ATTR_VALUES)
        pairs.append((make_text(topic, rng), make_text(topic, rng), topic))
    return pairs


def tokenize(texts: list[list[int]]) -> dict[str, torch.Tensor]:
    """``model.tokenize``: pad to the longest text of the batch, with the attention mask."""
    longest = max(len(t) for t in texts)
    ids = torch.full((len(texts), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(texts), longest), dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = torch.tensor(t)
        mask[i, : len(t)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def collate(batch, sort_columns: bool = False):
    """The data collator: one features dict per column, and dummy labels (MNRL ignores them)."""
    anchors, positives = [a for a, _, _ in batch], [p for _, p, _ in batch]
    if sort_columns:  # the positives_misaligned bug: each column sorted by length on its own
        anchors, positives = sorted(anchors, key=len), sorted(positives, key=len)
    return [tokenize(anchors), tokenize(positives)], torch.zeros(len(batch), dtype=torch.long)


# --------------------------------------------------------------------------- the SentenceTransformer


class Transformer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.auto_model = BertModel(config, add_pooling_layer=False)

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.auto_model(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        return dict(features, token_embeddings=out.last_hidden_state)


class Pooling(nn.Module):
    """``pooling_mode_mean_tokens``."""

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        token_embeddings = features["token_embeddings"]
        mask = features["attention_mask"].unsqueeze(-1).expand(token_embeddings.size()).to(token_embeddings.dtype)
        summed = torch.sum(token_embeddings * mask, 1)
        counts = torch.clamp(mask.sum(1), min=1e-9)
        return dict(features, sentence_embedding=summed / counts)


class SentenceTransformer(nn.Sequential):
    def encode(self, texts: list[list[int]]) -> torch.Tensor:
        self.eval()
        with torch.no_grad():
            return self(tokenize(texts))["sentence_embedding"]


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a, p=2, dim=1) @ F.normalize(b, p=2, dim=1).T


class MultipleNegativesRankingLoss(nn.Module):
    def __init__(self, model: SentenceTransformer, scale: float = 20.0, similarity_fct=cos_sim) -> None:
        super().__init__()
        self.model, self.scale, self.similarity_fct = model, scale, similarity_fct
        self.cross_entropy_loss = nn.CrossEntropyLoss()

    def forward(self, sentence_features: list[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        embeddings = [self.model(f)["sentence_embedding"] for f in sentence_features]
        anchors, candidates = embeddings[0], torch.cat(embeddings[1:], dim=0)
        range_labels = torch.arange(0, anchors.size(0), device=anchors.device)
        scores = self.similarity_fct(anchors, candidates) * self.scale
        return self.cross_entropy_loss(scores, range_labels)


# --------------------------------------------------------------------------- measure only


def retrieval_acc1(model: SentenceTransformer, pairs) -> float:
    a = model.encode([p[0] for p in pairs])
    b = model.encode([p[1] for p in pairs])
    topics = torch.tensor([p[2] for p in pairs])
    nearest = cos_sim(a, b).argmax(dim=1)
    return float((topics[nearest] == topics).float().mean())


# --------------------------------------------------------------------------- the training


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    train_pairs, test_pairs = make_pairs(N_TRAIN, rng), make_pairs(N_TEST, rng)

    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32, pad_token_id=PAD)  # fmt: skip
    model = SentenceTransformer(Transformer(config), Pooling())
    train_loss = MultipleNegativesRankingLoss(model)

    loader_gen = torch.Generator().manual_seed(seed + 1)
    steps_per_epoch = N_TRAIN // BATCH
    total_steps = EPOCHS * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(WARMUP_RATIO * total_steps), total_steps)
    sort_columns = variant == "positives_misaligned"

    def batches():
        order = torch.randperm(N_TRAIN, generator=loader_gen).tolist()
        for i in range(steps_per_epoch):
            yield collate([train_pairs[j] for j in order[i * BATCH : (i + 1) * BATCH]], sort_columns)

    probe_batch = (collate(train_pairs[:BATCH], sort_columns), None)

    def mnrl_loss(loss, _target):
        return loss

    nx.preflight(train_loss, probe_batch, mnrl_loss, optimizer=optimizer)
    mon = nx.monitor(train_loss, optimizer, every=10)

    losses, log = [], []
    step = 0
    for _epoch in range(EPOCHS):
        for features, labels in batches():
            model.train()
            loss = train_loss(features, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            if variant != "scheduler_never_stepped":
                scheduler.step()
            optimizer.zero_grad()
            mon.log(loss)
            losses.append(loss.item())
            step += 1
            if step % LOGGING_STEPS == 0:
                log.append({"loss": float(np.mean(losses[-LOGGING_STEPS:])), "learning_rate": scheduler.get_last_lr()[0]})
    nx.finish(mon, train_loss, probe_batch, mnrl_loss, optimizer=optimizer)

    return {
        "retrieval_acc1": retrieval_acc1(model, test_pairs),
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-steps_per_epoch:])),
    }
