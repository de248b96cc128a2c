"""Port of Andras7/word2vec-pytorch: skip-gram with negative sampling, sparse embeddings, SparseAdam.

Source: github.com/Andras7/word2vec-pytorch, ``word2vec/model.py``, ``word2vec/trainer.py``
and ``word2vec/data_reader.py`` at commit 36b93a503e8b3b5448abbc0e18f2a6bd3e017fc9 (the
repository's HEAD; no licence stated: the repository has no LICENSE file). Written anew
from the facts of those files; no code copied.

Kept: ``SkipGramModel``: ``u_embeddings`` (centre words) and ``v_embeddings`` (context
words), both ``nn.Embedding(emb_size, emb_dimension, sparse=True)``, ``u`` initialised
uniform in +-1/emb_dimension and ``v`` to the constant 0; ``forward(pos_u, pos_v, neg_v)``
returns the loss itself: the positive score ``sum(u * v, dim=1)`` clamped to [-10, 10]
through ``-F.logsigmoid``, the negative scores by ``torch.bmm(emb_neg_v,
emb_u.unsqueeze(2)).squeeze()`` clamped likewise, ``-sum(F.logsigmoid(-neg), dim=1)``,
and the mean of the two; ``save_embedding`` writes the ``u`` vectors (here: kept in
memory). ``DataReader``: word counts over lines of more than one word, words under
``min_count`` dropped, the negatives table of ``count ** 0.5`` (the author's power, not
0.75) shuffled once and read sequentially (``getNegatives`` ignores its target), the
subsampling keep-probability ``sqrt(t / f) + t / f``. ``Word2vecDataset``: each item
reads the next line (the index is ignored, the reader wraps at the end), keeps each word
with its keep-probability, draws ``boundary = randint(1, window_size)`` and pairs every
kept word with the kept words in ``[i - boundary, i + boundary)`` that differ from it,
5 negatives per pair; ``collate`` flattens a batch of lines into three ``LongTensor``s.
``Word2VecTrainer``: ``DataLoader(batch_size=32, shuffle=False, num_workers=0)``,
emb_dimension 100, window_size 5, iterations 3, initial_lr 0.001, min_count 12; per
iteration a new ``optim.SparseAdam(model.parameters(), lr)`` and
``CosineAnnealingLR(optimizer, len(dataloader))``; per batch of more than one pair
``scheduler.step()`` (before the optimizer's, as written), ``optimizer.zero_grad()``,
``loss = model.forward(pos_u, pos_v, neg_v)``, ``backward``, ``optimizer.step()``, the
running loss ``0.9 * running + 0.1 * loss``; the embeddings saved after each iteration;
``np.random.seed(12345)``.
Shrunk: a generated corpus of 1,200 lines (6 to 13 words; 20 topics of 10 words, a line's
words drawn from its topic, with 8 frequent "function" words mixed in everywhere) instead
of a text file; emb_dimension 32 instead of 100; the subsampling threshold ``t`` 1e-3
instead of 1e-4 and the negatives table 1e5 entries instead of 1e8 (the corpus has
~12,000 tokens, not billions: at 1e-4 nearly every token would be discarded); initial_lr
0.03 instead of 0.001 (38 batches an iteration instead of hundreds of thousands; at 0.01
the healthy run's neighbour precision is 0.33 on seed 0, at 0.03 it is 1.0).
Measure only (not in the program): for each topic word, the share of its 5 nearest
neighbours (cosine of the saved ``u`` vectors) that belong to its topic (chance: 0.05).

nndx, as the author would add it: the model returns its loss, so ``loss_fn`` is
``lambda loss, _: loss`` and a batch is ``((pos_u, pos_v, neg_v), None)``; the optimizer
is created anew each iteration, so the preflight ``nndx.probe`` runs on the first batch
of the first iteration, with that iteration's optimizer, and each iteration's loop has
its own ``nndx.Monitor(model, optimizer)``, every batch's loss logged; after each
iteration its Monitor's report is diagnosed, after the last with ``nndx.probe(...,
monitor=mon)`` on the first batch (the findings the author reads are the union).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn import init
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "word2vec"
SOURCE = Source("Andras7/word2vec-pytorch", "word2vec/trainer.py", "36b93a503e8b3b5448abbc0e18f2a6bd3e017fc9",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "negatives_sign_dropped",
            "neg_score = -torch.sum(F.logsigmoid(neg_score), dim=1): the minus inside logsigmoid(-neg_score) "
            "dropped, so the negative samples are pulled toward the centre word like the true context words",
            (C.WRONG_LOSS,),
            ("https://github.com/theeluwin/pytorch-sgns/issues/12",
             "https://github.com/kefirski/pytorch_NEG_loss/issues/5",
             "https://github.com/fanglanting/skip-gram-pytorch/issues/4"),
            Measure("neighbour_precision", "topic precision of the 5 nearest neighbours at least 0.2 below the "
                    "healthy run's (0.07-0.09 against 0.99-1.0 on seeds 0-2, while the running loss falls to 0.001)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: the sparse gradients of every batch so far are summed "
            "into each step (and SparseAdam updates every row seen so far)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175", "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/chainer/chainer/pull/616"),
            Measure("running_loss", "the program's running loss at the end 1.5x the healthy run's or more "
                    "(5.2-6.7 against 1.6-1.8 on seeds 0-2; neighbour precision 0.85-0.91 against 0.99-1.0)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

EMB_DIMENSION, BATCH_SIZE, WINDOW_SIZE, ITERATIONS, INITIAL_LR, MIN_COUNT = 32, 32, 5, 3, 0.03, 12
SUBSAMPLE_T, NEGATIVE_TABLE_SIZE = 1e-3, 1e5
N_LINES, TOPICS, PER_TOPIC, FUNCTION_WORDS = 1200, 20, 10, 8


# --------------------------------------------------------------------------- the corpus (the data)


def corpus(seed: int) -> list[str]:
    """Lines of words: each line draws its words from one topic (Zipf-like weights), with
    frequent function words mixed in; topics themselves are Zipf-like in frequency."""
    rng = np.random.default_rng(seed)
    topic_p = 1.0 / np.arange(1, TOPICS + 1) ** 0.5
    topic_p /= topic_p.sum()
    word_p = 1.0 / np.arange(1, PER_TOPIC + 1) ** 0.7
    word_p /= word_p.sum()
    func_p = 1.0 / np.arange(1, FUNCTION_WORDS + 1)
    func_p /= func_p.sum()
    lines = []
    for _ in range(N_LINES):
        topic = rng.choice(TOPICS, p=topic_p)
        words = [f"f{rng.choice(FUNCTION_WORDS, p=func_p)}" if rng.random() < 0.25
                 else f"t{topic}w{rng.choice(PER_TOPIC, p=word_p)}" for _ in range(rng.integers(6, 14))]  # fmt: skip
        lines.append(" ".join(words))
    return lines


# --------------------------------------------------------------------------- word2vec/data_reader.py


class DataReader:
    def __init__(self, lines: list[str], min_count: int) -> None:
        self.negatives: list[int] | np.ndarray = []
        self.discards: np.ndarray = np.empty(0)
        self.negpos = 0
        self.word2id: dict[str, int] = {}
        self.id2word: dict[int, str] = {}
        self.sentences_count = 0
        self.token_count = 0
        self.word_frequency: dict[int, int] = {}
        self.lines = lines  # the input file's lines
        self.read_words(min_count)
        self.init_table_negatives()
        self.init_table_discards()

    def read_words(self, min_count: int) -> None:
        word_frequency: dict[str, int] = {}
        for line in self.lines:
            words = line.split()
            if len(words) > 1:
                self.sentences_count += 1
                for word in words:
                    self.token_count += 1
                    word_frequency[word] = word_frequency.get(word, 0) + 1
        wid = 0
        for w, c in word_frequency.items():
            if c < min_count:
                continue
            self.word2id[w], self.id2word[wid], self.word_frequency[wid] = wid, w, c
            wid += 1

    def init_table_discards(self) -> None:
        f = np.array(list(self.word_frequency.values())) / self.token_count
        self.discards = np.sqrt(SUBSAMPLE_T / f) + (SUBSAMPLE_T / f)

    def init_table_negatives(self) -> None:
        pow_frequency = np.array(list(self.word_frequency.values())) ** 0.5
        ratio = pow_frequency / sum(pow_frequency)
        count = np.round(ratio * NEGATIVE_TABLE_SIZE)
        for wid, c in enumerate(count):
            self.negatives += [wid] * int(c)
        self.negatives = np.array(self.negatives)
        np.random.shuffle(self.negatives)

    def get_negatives(self, target: int, size: int) -> np.ndarray:  # target unused, as in the original
        response = self.negatives[self.negpos : self.negpos + size]
        self.negpos = (self.negpos + size) % len(self.negatives)
        if len(response) != size:
            return np.concatenate((response, self.negatives[0 : self.negpos]))
        return response


class Word2vecDataset(Dataset):
    def __init__(self, data: DataReader, window_size: int) -> None:
        self.data = data
        self.window_size = window_size
        self.position = 0  # the open file's read position

    def __len__(self) -> int:
        return self.data.sentences_count

    def readline(self) -> str:
        if self.position >= len(self.data.lines):
            self.position = 0  # seek(0) at the end of the file
        line = self.data.lines[self.position]
        self.position += 1
        return line

    def __getitem__(self, idx: int) -> list:
        while True:
            words = self.readline().split()
            if len(words) > 1:
                word_ids = [self.data.word2id[w] for w in words
                            if w in self.data.word2id and np.random.rand() < self.data.discards[self.data.word2id[w]]]  # fmt: skip
                boundary = np.random.randint(1, self.window_size)
                return [(u, v, self.data.get_negatives(v, 5)) for i, u in enumerate(word_ids)
                        for v in word_ids[max(i - boundary, 0) : i + boundary] if u != v]  # fmt: skip

    @staticmethod
    def collate(batches: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        all_u = [u for batch in batches for u, _, _ in batch if len(batch) > 0]
        all_v = [v for batch in batches for _, v, _ in batch if len(batch) > 0]
        all_neg_v = [neg_v for batch in batches for _, _, neg_v in batch if len(batch) > 0]
        return torch.LongTensor(all_u), torch.LongTensor(all_v), torch.LongTensor(np.array(all_neg_v))


# --------------------------------------------------------------------------- word2vec/model.py


class SkipGramModel(nn.Module):
    def __init__(self, emb_size: int, emb_dimension: int, negatives_sign: float = -1.0) -> None:
        super().__init__()
        self.emb_size, self.emb_dimension = emb_size, emb_dimension
        self.u_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        self.v_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        initrange = 1.0 / self.emb_dimension
        init.uniform_(self.u_embeddings.weight.data, -initrange, initrange)
        init.constant_(self.v_embeddings.weight.data, 0)
        self.negatives_sign = negatives_sign  # -1: logsigmoid(-neg_score), as published

    def forward(self, pos_u: torch.Tensor, pos_v: torch.Tensor, neg_v: torch.Tensor) -> torch.Tensor:
        emb_u = self.u_embeddings(pos_u)
        emb_v = self.v_embeddings(pos_v)
        emb_neg_v = self.v_embeddings(neg_v)

        score = torch.clamp(torch.sum(torch.mul(emb_u, emb_v), dim=1), max=10, min=-10)
        score = -F.logsigmoid(score)

        neg_score = torch.clamp(torch.bmm(emb_neg_v, emb_u.unsqueeze(2)).squeeze(), max=10, min=-10)
        neg_score = -torch.sum(F.logsigmoid(self.negatives_sign * neg_score), dim=1)

        return torch.mean(score + neg_score)

    def save_embedding(self, id2word: dict[int, str]) -> dict[str, np.ndarray]:
        embedding = self.u_embeddings.weight.cpu().data.numpy()
        return {w: embedding[wid].copy() for wid, w in id2word.items()}


# --------------------------------------------------------------------------- word2vec/trainer.py


def neighbour_precision(vectors: dict[str, np.ndarray], k: int = 5) -> float:
    """Measure only: the share of each topic word's k nearest neighbours (cosine) in its topic."""
    words = [w for w in vectors if w.startswith("t")]
    m = np.stack([vectors[w] for w in words])
    m = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    sim = m @ m.T
    np.fill_diagonal(sim, -np.inf)
    topic = np.array([w.split("w")[0] for w in words])
    nearest = np.argsort(-sim, axis=1)[:, :k]
    return float((topic[nearest] == topic[:, None]).mean())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(12345 + seed)
    torch.manual_seed(seed)
    data = DataReader(corpus(seed), MIN_COUNT)
    dataset = Word2vecDataset(data, WINDOW_SIZE)
    dataloader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=False, num_workers=0, collate_fn=dataset.collate)
    emb_size = len(data.word2id)
    skip_gram_model = SkipGramModel(emb_size, EMB_DIMENSION,
                                    negatives_sign=1.0 if variant == "negatives_sign_dropped" else -1.0)  # fmt: skip

    def loss_fn(loss: torch.Tensor, _targets) -> torch.Tensor:
        return loss  # SkipGramModel.forward returns the loss itself

    probe_batch = None
    running_loss, losses = 0.0, []
    vectors: dict[str, np.ndarray] = {}
    for iteration in range(ITERATIONS):
        optimizer = optim.SparseAdam(skip_gram_model.parameters(), lr=INITIAL_LR)
        t_max = ITERATIONS if variant == "cosine_t_max_in_iterations" else len(dataloader)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, t_max)
        mon = None
        for i, sample_batched in enumerate(dataloader):
            if len(sample_batched[0]) > 1:
                pos_u, pos_v, neg_v = sample_batched
                if probe_batch is None:  # the author's preflight, on the first batch there is
                    probe_batch = ((pos_u, pos_v, neg_v), None)
                    nx.preflight(skip_gram_model, probe_batch, loss_fn, optimizer=optimizer)
                if mon is None:
                    mon = nx.monitor(skip_gram_model, optimizer, every=10)
                scheduler.step()
                if variant != "no_zero_grad":
                    optimizer.zero_grad()
                loss = skip_gram_model.forward(pos_u, pos_v, neg_v)
                loss.backward()
                optimizer.step()
                mon.log(loss)
                running_loss = running_loss * 0.9 + loss.item() * 0.1
                losses.append(loss.item())
        if mon is not None:
            if iteration == ITERATIONS - 1:
                nx.finish(mon, skip_gram_model, probe_batch, loss_fn, optimizer=optimizer)
            else:
                nx.finish(mon)
        vectors = skip_gram_model.save_embedding(data.id2word)

    return {
        "neighbour_precision": neighbour_precision(vectors),
        "running_loss": running_loss,
        "last_iteration_loss": float(np.mean(losses[-len(dataloader) :])),
        "steps": float(len(losses)),
    }
