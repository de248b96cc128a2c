"""Port of torchtext's fastText-style supervised classifier (``examples/text_classification``).

Source: github.com/pytorch/text, ``examples/text_classification/train.py`` and
``examples/text_classification/model.py`` at commit
95ffe821175bc266c667f489477d5183fb102ac6 (BSD-3-Clause, Copyright (c) James Bradbury and
Soumith Chintala 2016, torchtext contributors), with the bag of word and bigram ids built
as ``torchtext/datasets/text_classification.py`` of the same commit builds them (the
tokens and ``ngrams_iterator``'s word n-grams of each text in one vocabulary, unknown ids
mapped to 0). The example reproduces fastText's supervised mode (Joulin et al., "Bag of
Tricks"): a mean of word and bigram embeddings, a linear classifier and SGD whose learning
rate decays linearly to zero over the whole run, fastText's own schedule. Written anew
from the facts of those files; no code copied.

Kept: ``TextSentiment`` = ``nn.EmbeddingBag(vocab_size, embed_dim, sparse=True)`` (mode
"mean") + ``nn.Linear(embed_dim, num_class)``, the embedding and the linear weight uniform
in +-0.5, the bias zero; ``generate_batch``: the labels as one tensor, the texts'
id tensors concatenated, ``offsets`` = ``[0]`` + the lengths, the last dropped,
``cumsum``; ``criterion = CrossEntropyLoss()``; ``train``: a shuffled ``DataLoader``,
``num_lines = num_epochs * len(data)``, per batch forward, loss, ``backward``, then the
hand-written SGD: ``progress = processed_lines / num_lines``, ``lr = lr_ * (1 -
progress)``, for every parameter ``p.data.add_(p.grad.data * -lr)``, ``p.grad.detach_()``,
``p.grad.zero_()`` (no optimizer object); ``test``: an unshuffled ``DataLoader``,
``torch.no_grad()``, the mean over batches of each batch's accuracy; defaults
``--num-epochs 3``, ``--batch-size 64``, ``--ngrams 2``.
Shrunk: a synthetic 6-class corpus instead of AG_NEWS / DBpedia / Yelp (no download):
texts of 14-39 words from a 400-word Zipf background, 15% of the words from the class
pair's 25-word keyword cluster (classes come in three pairs, each pair sharing a cluster),
and, inserted twice in each text, a cue of two words whose order tells the two classes of
a pair apart (``u v`` for one, ``v u`` for the other): unigram counts cannot separate the
pair, only the bigram ids can; 4,000 training texts instead of 120,000+, 800 test texts;
``--embed-dim`` 32 instead of 128; ``--lr`` 4.0 (the example's default from its next
revisions on) instead of 64.0: at 64 the loss of the healthy run is NaN within the first
epoch on this corpus.
Measure only (not in the program): ``test`` accuracy, as the example prints it.

nndx, as the author would add it: the model is called as ``model(text, offsets)``, so the
probes get the first training batch as ``((text, offsets), cls)``; a preflight
``nndx.probe`` on it, ``nndx.Monitor(model, None, loss_fn=criterion)`` around the loop
(``None``: the update is written by hand, there is no optimizer object), the criterion
called through ``mon.loss_fn`` and every batch's loss logged; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``. The example has no validation split, so nothing is
logged as ``split="val"``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fasttext"
SOURCE = Source("pytorch/text", "examples/text_classification/train.py", "95ffe821175bc266c667f489477d5183fb102ac6",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (linear LR decay to 0 over all epochs, ngrams 2)"),
        Variant(
            "lr_decay_over_one_epoch",
            "num_lines = len(data) instead of num_epochs * len(data): progress reaches 1 at the end of the first "
            "epoch, so lr = lr_ * (1 - progress) turns negative and the last two epochs climb the loss",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/huggingface/transformers/issues/132",
             "https://github.com/WANG-Chaoyue/EvolutionaryGAN-pytorch/issues/8",
             "https://github.com/EleutherAI/gpt-neox/pull/1039"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "unshuffled_by_class",
            "the training DataLoader built with shuffle=False over a dataset stored class by class (as corpora "
            "split into per-class files come): every batch holds one class and the run ends on the last class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/PaddlePaddle/models/pull/589", "https://github.com/QData/TextAttack/issues/628"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

NUM_EPOCHS, EMBED_DIM, BATCH_SIZE, LR, NGRAMS = 3, 32, 64, 4.0, 2
NUM_CLASS, BACKGROUND, CLUSTER, KEYWORD_SHARE = 6, 400, 25, 0.15
N_TRAIN, N_TEST = 4000, 800


# --------------------------------------------------------------------------- the corpus (the data)


def corpus(seed: int) -> tuple[list[tuple[int, list[str]]], list[tuple[int, list[str]]]]:
    """(train, test) of (label, tokens); see the module docstring."""
    rng = np.random.default_rng(seed)
    background_p = 1.0 / np.arange(1, BACKGROUND + 1)
    background_p /= background_p.sum()
    cues = [(f"cue{pair}a", f"cue{pair}b") for pair in range(NUM_CLASS // 2)]

    def text(label: int) -> list[str]:
        pair = label // 2
        length = int(rng.integers(14, 40))
        words = [f"k{pair}_{rng.integers(CLUSTER)}" if rng.random() < KEYWORD_SHARE
                 else f"w{rng.choice(BACKGROUND, p=background_p)}" for _ in range(length)]  # fmt: skip
        u, v = cues[pair] if label % 2 == 0 else cues[pair][::-1]
        for _ in range(2):
            at = int(rng.integers(0, len(words) + 1))
            words[at:at] = [u, v]
        return words

    train = [(int(c), text(int(c))) for c in rng.integers(0, NUM_CLASS, size=N_TRAIN)]
    test = [(int(c), text(int(c))) for c in rng.integers(0, NUM_CLASS, size=N_TEST)]
    return train, test


def ngrams_iterator(tokens: list[str], ngrams: int):
    """The tokens, then every run of 2..ngrams consecutive tokens joined by a space."""
    yield from tokens
    for n in range(2, ngrams + 1):
        for i in range(len(tokens) - n + 1):
            yield " ".join(tokens[i : i + n])


def build_vocab(texts: list[tuple[int, list[str]]], ngrams: int) -> dict[str, int]:
    """Every token and n-gram of the training texts, most frequent first; 0 is "<unk>"."""
    counts: dict[str, int] = {}
    for _, tokens in texts:
        for tok in ngrams_iterator(tokens, ngrams):
            counts[tok] = counts.get(tok, 0) + 1
    ordered = sorted(counts, key=lambda t: (-counts[t], t))
    return {"<unk>": 0, **{tok: i + 1 for i, tok in enumerate(ordered)}}


def to_dataset(texts: list[tuple[int, list[str]]], vocab: dict[str, int], ngrams: int) -> list:
    return [(label, torch.tensor([vocab.get(t, 0) for t in ngrams_iterator(tokens, ngrams)], dtype=torch.long))
            for label, tokens in texts]  # fmt: skip


def generate_batch(batch: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    label = torch.tensor([entry[0] for entry in batch])
    text = [entry[1] for entry in batch]
    offsets = torch.tensor([0] + [len(entry) for entry in text][:-1]).cumsum(dim=0)
    return torch.cat(text), offsets, label


def loader(dataset: list, shuffle: bool, generator: torch.Generator):
    """``DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=..., collate_fn=generate_batch)``."""
    order = torch.randperm(len(dataset), generator=generator).tolist() if shuffle else list(range(len(dataset)))
    return [generate_batch([dataset[j] for j in order[i : i + BATCH_SIZE]]) for i in range(0, len(order), BATCH_SIZE)]


# --------------------------------------------------------------------------- model.py


class TextSentiment(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, num_class: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=True)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(text, offsets))


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_texts, test_texts = corpus(seed)
    shuffle_train = True
    if variant == "unshuffled_by_class":  # stored class by class, read in storage order
        train_texts = sorted(train_texts, key=lambda entry: entry[0])
        shuffle_train = False
    vocab = build_vocab(train_texts, NGRAMS)
    train_dataset = to_dataset(train_texts, vocab, NGRAMS)
    test_dataset = to_dataset(test_texts, vocab, NGRAMS)

    model = TextSentiment(len(vocab), EMBED_DIM, NUM_CLASS)
    criterion = torch.nn.CrossEntropyLoss()

    first = loader(train_dataset, shuffle_train, torch.Generator().manual_seed(seed + 1))[0]
    probe_batch = ((first[0], first[1]), first[2])
    nx.preflight(model, probe_batch, criterion)
    mon = nx.monitor(model, None, every=10, loss_fn=criterion)  # the SGD step is written by hand

    losses: list[float] = []
    lr_ = LR
    n_batches = (len(train_dataset) + BATCH_SIZE - 1) // BATCH_SIZE
    num_lines = n_batches if variant == "lr_decay_over_one_epoch" else NUM_EPOCHS * n_batches
    lr = lr_
    for epoch in range(NUM_EPOCHS):
        for i, (text, offsets, cls) in enumerate(loader(train_dataset, shuffle_train, generator)):
            output = model(text, offsets)
            loss = mon.loss_fn(output, cls)
            loss.backward()
            processed_lines = i + n_batches * epoch
            progress = processed_lines / float(num_lines)
            lr = lr_ * (1 - progress)
            for p in model.parameters():  # SGD
                p.data.add_(p.grad.data * -lr)
                p.grad.detach_()
                p.grad.zero_()
            mon.log(loss)
            losses.append(loss.item())

    def test(data_: list) -> float:
        total_accuracy = []
        for text, offsets, cls in loader(data_, False, generator):
            with torch.no_grad():
                output = model(text, offsets)
                total_accuracy.append((output.argmax(1) == cls).float().mean().item())
        return sum(total_accuracy) / len(total_accuracy) if total_accuracy else 0.0

    accuracy = test(test_dataset)
    nx.finish(mon, model, probe_batch, criterion)
    per_epoch = [float(np.mean(losses[e * n_batches : (e + 1) * n_batches])) for e in range(NUM_EPOCHS)]
    return {
        "test_accuracy": accuracy,
        "first_epoch_loss": per_epoch[0],
        "last_epoch_loss": per_epoch[-1],
        "final_lr": lr,
    }
