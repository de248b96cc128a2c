"""Port of princeton-nlp/SimCSE: unsupervised SimCSE, a sentence encoder trained by contrasting
each sentence with itself, dropout the only augmentation.

Source: github.com/princeton-nlp/SimCSE, ``simcse/models.py`` (``MLPLayer``, ``Similarity``,
``Pooler``, ``cl_init``, ``cl_forward``, ``sentemb_forward``, ``BertForCL``) with ``train.py``
(``ModelArguments``, ``prepare_features``, the collator), ``simcse/trainers.py`` (``CLTrainer.evaluate``)
and ``run_unsup_example.sh`` at commit 49fa580a853752ede55b8c76d9debf748e214d3f (MIT, Copyright (c)
2021 Princeton Natural Language Processing). Written anew from the facts of those files; no code
copied.

Kept: the unsupervised setup of ``run_unsup_example.sh`` (``--pooler_type cls --mlp_only_train
--temp 0.05``, batch 64, ``max_seq_length 32``, ``--evaluation_strategy steps
--metric_for_best_model stsb_spearman --load_best_model_at_end``); ``prepare_features`` with one
text column (``sent0 = sent1``): every sentence tokenised twice, the features of instance i the pair
``[s_i, s_i]``, so the collator gives ``input_ids`` of shape (bs, 2, len) padded to the longest in
the batch, with the attention mask; ``cl_forward``: the input viewed as (bs * 2, len), one encoder
pass (dropout draws a different mask for the two copies), the ``cls`` pooler (the first token of the
last hidden state), viewed back to (bs, 2, hidden), ``MLPLayer`` (``Linear`` + ``Tanh``) over it,
``z1, z2 = [:, 0], [:, 1]``, ``Similarity`` = ``CosineSimilarity(dim=-1)`` of ``z1.unsqueeze(1)``
and ``z2.unsqueeze(0)`` divided by ``temp``, ``CrossEntropyLoss`` against ``arange(bs)``; the model
computes its own loss and returns a ``SequenceClassifierOutput`` (``loss``, ``logits = cos_sim``);
``sentemb_forward`` for evaluation (``sent_emb=True``: the ``cls`` token without the MLP, as
``mlp_only_train`` says); ``CLTrainer.evaluate``: ``model.eval()``, sentence embeddings, the STS-B
dev Spearman correlation (it does not switch the model back to train mode; the ``Trainer``'s
``training_step`` calls ``model.train()`` at every step); the ``transformers.Trainer`` defaults written
out as a loop: ``AdamW`` (betas 0.9/0.999, eps 1e-8, weight decay 0), a linear decay to 0 with no
warm-up stepped after every optimizer step, ``max_grad_norm = 1.0``, ``model.train()`` at every step,
``zero_grad`` after each step, evaluation every ``eval_steps`` and the best checkpoint by
``stsb_spearman`` loaded at the end.
Shrunk: ``BertModel`` (bert-base-uncased, pretrained) replaced by a small encoder trained from scratch:
token + learned position embeddings, ``LayerNorm``, ``Dropout(0.1)``, a 2-layer
``nn.TransformerEncoder`` (width 64, 4 heads, FFN 128, GELU, dropout 0.1, post-norm like BERT) with
the padding mask; ``wiki1m_for_simcse.txt`` replaced by 6,144 synthetic sentences from templates with
paraphrase structure: a meaning is (subject, verb, object, place), each slot one of 12 words (61 tokens
in all), said in one of 4 templates that put the slots at the same places and change the function words
around them (``[CLS] the S V the O in the P [SEP]``, ``a S V a O at a P``, ``this S V that O near the
P``, ``one S V some O on this P``); the STS-B dev and test sets replaced by 256 dev and 512 test pairs of
sentences, each sentence in its own random template, whose gold score is the number of slots their
meanings share (0-4): the score is the Spearman correlation of the cosine of the two embeddings with
that gold score, as SentEval scores STS-B; 3 epochs (288 steps) instead of 1, lr 5e-4 instead of 3e-5
(a model trained from scratch, not fine-tuned), eval_steps 24 instead of 125, fp32 on the CPU instead
of fp16; the best checkpoint kept in memory. (A corpus whose paraphrases move the slots, or with
filler words inserted at random, was tried first: there the from-scratch encoder learns to tell the
sentences apart by the fillers' positions and its test Spearman ends below its initial one.)

Measure only (not in the program): the test pairs' Spearman correlation after training (the best
checkpoint loaded), and the same at initialisation.

nndx, as the author would add it: the model computes its own loss (``BertForCL`` returns it), so the
preflight ``nndx.probe`` is run on the model with the first batch as ``((input_ids,
attention_mask), None)`` and ``loss_fn = lambda out, _: out.loss``, with the AdamW optimizer;
``nndx.Monitor(model, optimizer)`` around the loop with every step's loss logged; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
from scipy.stats import spearmanr
from torch import nn
from transformers import get_linear_schedule_with_warmup
from transformers.modeling_outputs import SequenceClassifierOutput

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "simcse"
SOURCE = Source("princeton-nlp/SimCSE", "simcse/models.py", "49fa580a853752ede55b8c76d9debf748e214d3f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (run_unsup_example.sh's arguments, shrunk)"),
        Variant(
            "batch_repeated_not_interleaved",
            "each sentence is tokenised once and the pair dimension is made at training time with "
            "input_ids.repeat(2, 1).view(bs, 2, -1) (the whole batch repeated) instead of each sentence "
            "twice in a row: instance i becomes the pair (s_2i, s_2i+1) of two different sentences, yet "
            "the labels stay arange(bs)",
            (C.LABELS_MISALIGNED, C.WRONG_RESHAPE),
            ("https://github.com/zhengyanzhao1997/NLP-model/issues/2",
             "https://github.com/xxxsssyyy/SimCSE-tensorflow/issues/1",
             "https://github.com/lucidrains/rotary-embedding-torch/issues/23"),
            Measure("test_spearman", "held-out Spearman correlation at least 0.1 below the healthy run's "
                    "(0.58/0.52/0.39 against 0.82/0.77/0.79 on seeds 0-2; the loss stays at log(64) = 4.16)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "temperature_multiplied",
            "Similarity.forward multiplies the cosine by temp (0.05) instead of dividing by it: the logits "
            "lie in [-0.05, 0.05], the softmax over the batch stays nearly uniform and the loss stays at "
            "log(bs) (a temperature read as a scale, as sentence-transformers' scale=20 is)",
            (C.WRONG_LOSS,),
            ("https://github.com/bowang-lab/BLEEP/issues/5",
             "https://github.com/lightonai/pylate/pull/115",
             "https://github.com/drboog/Lafite/issues/25"),
            Measure("test_spearman", "held-out Spearman correlation at least 0.1 below the healthy run's "
                    "(0.11/0.10/0.00 against 0.82/0.77/0.79 on seeds 0-2; the loss stays at 4.11)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

N_TRAIN, N_DEV, N_TEST = 6144, 256, 512
BATCH, EPOCHS, LR, MAX_GRAD_NORM, EVAL_STEPS, TEMP, MAX_SEQ_LENGTH = 64, 3, 5e-4, 1.0, 24, 0.05, 32
HIDDEN, LAYERS, HEADS, FFN, DROPOUT = 64, 2, 4, 128, 0.1

# --------------------------------------------------------------------------- the synthetic corpus

SLOT_WORDS, N_SLOTS = 12, 4
PAD, CLS, SEP = 0, 1, 2
THE, A, THIS, THAT, ONE, SOME, IN, AT, NEAR, ON = range(3, 13)
# four ways of saying a meaning: the same slots at the same places, other function words around them
TEMPLATES = ((THE, THE, IN, THE), (A, A, AT, A), (THIS, THAT, NEAR, THE), (ONE, SOME, ON, THIS))
FIRST_SLOT = 13
VOCAB = FIRST_SLOT + N_SLOTS * SLOT_WORDS  # 61


def slot_word(slot: int, value: int) -> int:
    return FIRST_SLOT + slot * SLOT_WORDS + value


def render(meaning: tuple[int, ...], rng: random.Random) -> list[int]:
    """One sentence for a meaning (subject, verb, object, place) in a random template:
    ``[CLS] det1 S V det2 O prep det3 P [SEP]`` ("the S V the O in the P", "a S V a O at a P", ...)."""
    s, v, o, p = (slot_word(i, m) for i, m in enumerate(meaning))
    det1, det2, prep, det3 = TEMPLATES[rng.randrange(len(TEMPLATES))]
    return [CLS, det1, s, v, det2, o, prep, det3, p, SEP]


def random_meaning(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(SLOT_WORDS) for _ in range(N_SLOTS))


def sts_pairs(n: int, rng: random.Random) -> list[tuple[list[int], list[int], float]]:
    """Sentence pairs with a graded gold score: how many slots the two meanings share (0-4)."""
    pairs = []
    for _ in range(n):
        a = random_meaning(rng)
        shared = rng.randint(0, N_SLOTS)
        keep = set(rng.sample(range(N_SLOTS), shared))
        b = tuple(a[i] if i in keep else rng.choice([w for w in range(SLOT_WORDS) if w != a[i]]) for i in range(N_SLOTS))
        pairs.append((render(a, rng), render(b, rng), float(shared)))
    return pairs


def pad(texts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokenizer with ``padding`` to the longest in the batch: ids and attention mask."""
    longest = max(len(t) for t in texts)
    ids = torch.full((len(texts), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(texts), longest), dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = torch.tensor(t)
        mask[i, : len(t)] = 1
    return ids, mask


def collate(sentences: list[list[int]], repeat_batch: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``prepare_features`` (one column: sent0 = sent1) + the collator: (bs, 2, len) ids and mask."""
    bs = len(sentences)
    if repeat_batch:  # the bug: each sentence once, the batch repeated, then viewed as pairs
        ids, mask = pad(sentences)
        return ids.repeat(2, 1).view(bs, 2, -1), mask.repeat(2, 1).view(bs, 2, -1)
    ids, mask = pad([s for s in sentences for _ in range(2)])
    return ids.view(bs, 2, -1), mask.view(bs, 2, -1)


# --------------------------------------------------------------------------- the model (simcse/models.py)


class Encoder(nn.Module):
    """Stands in for ``BertModel``: embeddings, LayerNorm, dropout, a post-norm transformer encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(MAX_SEQ_LENGTH, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.dropout = nn.Dropout(DROPOUT)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, FFN, DROPOUT, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.dropout(self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions)))
        return self.encoder(x, src_key_padding_mask=attention_mask == 0)  # last_hidden_state


class MLPLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.activation = nn.Tanh()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(features))


class Similarity(nn.Module):
    def __init__(self, temp: float, multiply: bool = False) -> None:
        super().__init__()
        self.temp, self.multiply = temp, multiply
        self.cos = nn.CosineSimilarity(dim=-1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.multiply:  # the temperature_multiplied bug
            return self.cos(x, y) * self.temp
        return self.cos(x, y) / self.temp


class ModelForCL(nn.Module):
    """``BertForCL`` with ``pooler_type='cls'``, ``mlp_only_train=True``, ``temp=0.05``."""

    def __init__(self, multiply_temp: bool = False) -> None:
        super().__init__()
        self.bert = Encoder()
        self.mlp = MLPLayer()
        self.sim = Similarity(TEMP, multiply_temp)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sent_emb: bool = False):
        if sent_emb:  # sentemb_forward: cls without the MLP (mlp_only_train)
            return self.bert(input_ids, attention_mask)[:, 0]
        batch_size, num_sent = input_ids.size(0), input_ids.size(1)
        input_ids = input_ids.view((-1, input_ids.size(-1)))
        attention_mask = attention_mask.view((-1, attention_mask.size(-1)))
        last_hidden = self.bert(input_ids, attention_mask)
        pooler_output = last_hidden[:, 0]
        pooler_output = pooler_output.view((batch_size, num_sent, pooler_output.size(-1)))
        pooler_output = self.mlp(pooler_output)
        z1, z2 = pooler_output[:, 0], pooler_output[:, 1]
        cos_sim = self.sim(z1.unsqueeze(1), z2.unsqueeze(0))
        labels = torch.arange(cos_sim.size(0)).long()
        loss = nn.CrossEntropyLoss()(cos_sim, labels)
        return SequenceClassifierOutput(loss=loss, logits=cos_sim)


def stsb_spearman(model: ModelForCL, pairs) -> float:
    """``CLTrainer.evaluate``'s STS score: model.eval() (left so), embeddings, Spearman of the cosines."""
    model.eval()
    with torch.no_grad():
        a = model(*pad([p[0] for p in pairs]), sent_emb=True)
        b = model(*pad([p[1] for p in pairs]), sent_emb=True)
    cos = nn.functional.cosine_similarity(a, b, dim=-1).numpy()
    return float(spearmanr(cos, [p[2] for p in pairs]).correlation)


# --------------------------------------------------------------------------- the training


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    sentences = [render(random_meaning(rng), rng) for _ in range(N_TRAIN)]
    dev_pairs, test_pairs = sts_pairs(N_DEV, rng), sts_pairs(N_TEST, rng)

    model = ModelForCL(multiply_temp=variant == "temperature_multiplied")
    init_spearman = stsb_spearman(model, test_pairs)
    model.train()

    repeat_batch = variant == "batch_repeated_not_interleaved"
    steps_per_epoch = N_TRAIN // BATCH
    total_steps = EPOCHS * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)
    loader_gen = torch.Generator().manual_seed(seed + 1)

    probe_batch = (collate(sentences[:BATCH], repeat_batch), None)

    def model_loss(output, _target):
        return output.loss

    nx.preflight(model, probe_batch, model_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    losses, best, best_state, step = [], -2.0, None, 0
    for _epoch in range(EPOCHS):
        order = torch.randperm(N_TRAIN, generator=loader_gen).tolist()
        for i in range(steps_per_epoch):
            input_ids, attention_mask = collate([sentences[j] for j in order[i * BATCH : (i + 1) * BATCH]], repeat_batch)
            model.train()  # the Trainer's training_step
            loss = model(input_ids, attention_mask).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            mon.log(loss)
            losses.append(loss.item())
            step += 1
            if step % EVAL_STEPS == 0:
                score = stsb_spearman(model, dev_pairs)
                if score > best:  # metric_for_best_model stsb_spearman
                    best, best_state = score, copy.deepcopy(model.state_dict())
    nx.finish(mon, model, probe_batch, model_loss, optimizer=optimizer)

    if best_state is not None:  # load_best_model_at_end
        model.load_state_dict(best_state)
    return {
        "test_spearman": stsb_spearman(model, test_pairs),
        "init_spearman": init_spearman,
        "best_dev_spearman": best,
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
    }
