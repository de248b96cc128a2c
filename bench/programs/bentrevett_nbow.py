"""Port of bentrevett/pytorch-sentiment-analysis, ``1 - Neural Bag of Words.ipynb``: ``NBoW``
(an ``nn.Embedding`` with ``padding_idx``, the mean over the tokens, an ``nn.Linear`` to two
classes), initialised from pretrained word vectors, trained with ``CrossEntropyLoss`` and Adam on
padded batches of token ids, the best epoch by validation loss kept and tested.

Source: github.com/bentrevett/pytorch-sentiment-analysis, ``1 - Neural Bag of Words.ipynb`` at
commit 329f654b2cfaed22fee432569ebd7a2674584f79 (MIT, Copyright (c) 2018 Ben Trevett). Written
anew from the facts of that notebook; no code copied.

Kept: ``seed = 1234`` for ``np.random`` and ``torch``; tokens truncated to ``max_length = 256``;
a train/valid split of the training set with ``test_size = 0.25`` (shuffled, as
``train_test_split`` does); a vocabulary built from the train split's tokens with ``min_freq =
5`` and the specials ``["<unk>", "<pad>"]`` first (``<unk>`` = 0, the default index, ``<pad>`` =
1); ids by lookup; ``collate_fn``: ``nn.utils.rnn.pad_sequence(batch_ids,
padding_value=pad_index, batch_first=True)`` and ``torch.stack`` of the labels, as a dict
``{"ids", "label"}``; ``DataLoader(batch_size=512, collate_fn=..., shuffle=True)`` for train,
unshuffled for valid and test; ``NBoW(vocab_size, embedding_dim=300, output_dim=2, pad_index)``:
``embedding(ids).mean(dim=1)`` (the pad positions included in the mean, as published) then
``fc``; the pretrained vectors assigned with ``model.embedding.weight.data =
pretrained_embedding`` (zero vectors for the specials and for words the vectors lack);
``optim.Adam(model.parameters())`` (lr 1e-3); ``nn.CrossEntropyLoss()``; the notebook's
``train`` (``model.train()``, per batch: forward, loss, ``get_accuracy``, ``zero_grad``,
``backward``, ``step``) and ``evaluate`` (``model.eval()``, ``torch.no_grad()``); ``n_epochs =
10``, the state dict with the best valid loss saved (a deep copy here, not ``nbow.pt``) and
loaded before the test; ``predict_sentiment`` (softmax of the logits of one unpadded review,
argmax, its probability).
Shrunk / replaced: IMDB (25,000 + 25,000 reviews) by a synthetic two-class corpus of 8,000
train and 2,000 test reviews, 10-60 tokens each, over 2,000 word types (Zipf-distributed
neutral words; each token is one of 100 positive or 100 negative words with probability 0.20
for the review's own class and 0.05 for the other class); the ``basic_english`` tokenizer is not
needed (the reviews are token lists already); GloVe (840B, 300-d) by a fixed random 300-d vector
(std 0.4) for 90% of the word types, zeros for the rest, carrying no sentiment; no tqdm, no
plots.
Measure only (not in the program): the test accuracy and the mean predicted probability of
the notebook's ``predict_sentiment``, applied to each test review on its own (batch of one, no
padding), next to the notebook's own ``evaluate`` on the test loader.

nndx, as the author would add it after the README: the model takes the padded ids and
``criterion(prediction, label)`` is the loss, so nndx gets ``criterion`` and the first training
batch ``(ids, label)``; a preflight ``nndx.probe`` with the optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the epochs, each batch's loss logged in
``train`` where the notebook appends it (after the step), each epoch's valid loss logged as
``split="val"`` with its accuracy; after the epochs (best state loaded) ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import collections
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bentrevett_nbow"
SOURCE = Source("bentrevett/pytorch-sentiment-analysis", "1 - Neural Bag of Words.ipynb",
                "329f654b2cfaed22fee432569ebd7a2674584f79", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the NBoW notebook as published (shrunk: a synthetic two-class corpus for IMDB)"),
        Variant(
            "sorted_ids_not_labels",
            "collate_fn sorts the reviews of a batch by length, longest first (the habit pack_padded_sequence "
            "taught), before padding them, but stacks the labels in the batch's original order: inside every "
            "batch the labels no longer belong to the reviews beside them",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/facebookresearch/InferSent/issues/51",
             "https://github.com/pytorch/pytorch/issues/3584"),
            Measure("test_acc_unbatched", "accuracy of predict_sentiment on the test reviews at least 0.15 below "
                    "the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "softmax_in_forward",
            "NBoW.forward returns torch.softmax(self.fc(pooled), dim=-1) (the softmax of predict_sentiment moved "
            "into the model) while CrossEntropyLoss applies log_softmax again: the loss sees probabilities as "
            "logits, its gradient shrinks and no prediction can be confident",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/Lightning-Universe/lightning-bolts/issues/654",
             "https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10",
             "https://github.com/ariecattan/SciCo/issues/2"),
            Measure("mean_predicted_probability", "mean probability predict_sentiment gives its predicted class "
                    "on the test reviews at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SEED = 1234
N_TRAIN, N_TEST, N_TYPES, N_SENT = 8000, 2000, 2000, 100
MAX_LENGTH, TEST_SIZE, MIN_FREQ, BATCH_SIZE, EMBEDDING_DIM, N_EPOCHS = 256, 0.25, 5, 512, 300, 10


# --------------------------------------------------------------------------- the corpus (replaces IMDB)


def make_corpus(rng: np.random.Generator, n: int) -> tuple[list[list[str]], list[int]]:
    """Reviews as token lists, labels 0 (neg) / 1 (pos), half each, in a shuffled order."""
    neutral = np.arange(2 * N_SENT, N_TYPES)
    zipf = 1.0 / np.arange(1, len(neutral) + 1)
    zipf /= zipf.sum()
    labels = rng.permutation(np.repeat([0, 1], n // 2))
    reviews = []
    for label in labels:
        length = int(rng.integers(10, 61))
        u = rng.random(length)
        own = N_SENT * label + rng.integers(0, N_SENT, length)  # pos words 100-199, neg words 0-99
        other = N_SENT * (1 - label) + rng.integers(0, N_SENT, length)
        words = np.where(u < 0.20, own, np.where(u < 0.25, other, rng.choice(neutral, length, p=zipf)))
        reviews.append([f"w{w}" for w in words])
    return reviews, labels.tolist()


class Vocab:
    """torchtext's build_vocab_from_iterator(min_freq=5, specials=[...]) + set_default_index."""

    def __init__(self, token_lists: list[list[str]], min_freq: int, specials: list[str]) -> None:
        counts = collections.Counter(t for tokens in token_lists for t in tokens)
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        self.itos = specials + [t for t, c in ordered if c >= min_freq and t not in specials]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.default = 0

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.default)

    def lookup_indices(self, tokens: list[str]) -> list[int]:
        return [self[t] for t in tokens]


# --------------------------------------------------------------------------- the notebook


def get_collate_fn(pad_index: int, sort_by_length: bool):
    def collate_fn(batch):
        batch_ids = [i["ids"] for i in batch]
        if sort_by_length:  # the bug: the ids sorted, the labels not
            batch_ids = sorted(batch_ids, key=len, reverse=True)
        batch_ids = nn.utils.rnn.pad_sequence(batch_ids, padding_value=pad_index, batch_first=True)
        batch_label = [i["label"] for i in batch]
        batch_label = torch.stack(batch_label)
        batch = {"ids": batch_ids, "label": batch_label}
        return batch

    return collate_fn


def get_data_loader(dataset, batch_size: int, pad_index: int, sort_by_length: bool, shuffle: bool = False):
    collate_fn = get_collate_fn(pad_index, sort_by_length)
    return torch.utils.data.DataLoader(dataset=dataset, batch_size=batch_size, collate_fn=collate_fn,
                                       shuffle=shuffle)  # fmt: skip


class NBoW(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int, output_dim: int, pad_index: int,
                 softmax_out: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.fc = nn.Linear(embedding_dim, output_dim)
        self.softmax_out = softmax_out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(ids)
        pooled = embedded.mean(dim=1)
        prediction = self.fc(pooled)
        if self.softmax_out:  # the bug
            return torch.softmax(prediction, dim=-1)
        return prediction


def get_accuracy(prediction: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    batch_size, _ = prediction.shape
    predicted_classes = prediction.argmax(dim=-1)
    correct_predictions = predicted_classes.eq(label).sum()
    return correct_predictions / batch_size


def predict_sentiment(ids: torch.Tensor, model: nn.Module) -> tuple[int, float]:
    tensor = ids.unsqueeze(dim=0)
    prediction = model(tensor).squeeze(dim=0)
    probability = torch.softmax(prediction, dim=-1)
    predicted_class = prediction.argmax(dim=-1).item()
    return predicted_class, probability[predicted_class].item()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(SEED + seed)
    torch.manual_seed(SEED + seed)
    rng = np.random.default_rng(SEED + seed)
    sort_by_length = variant == "sorted_ids_not_labels"

    train_tokens, train_labels = make_corpus(rng, N_TRAIN)
    test_tokens, test_labels = make_corpus(rng, N_TEST)
    train_tokens = [t[:MAX_LENGTH] for t in train_tokens]
    test_tokens = [t[:MAX_LENGTH] for t in test_tokens]

    order = rng.permutation(N_TRAIN)  # train_test_split(test_size=0.25), shuffled
    n_valid = int(TEST_SIZE * N_TRAIN)
    valid_idx, train_idx = order[:n_valid], order[n_valid:]
    vocab = Vocab([train_tokens[i] for i in train_idx], MIN_FREQ, ["<unk>", "<pad>"])
    unk_index, pad_index = vocab["<unk>"], vocab["<pad>"]

    def dataset(tokens, labels, idx):
        return [{"ids": torch.tensor(vocab.lookup_indices(tokens[i]), dtype=torch.long),
                 "label": torch.tensor(labels[i], dtype=torch.long)} for i in idx]  # fmt: skip

    train_data = dataset(train_tokens, train_labels, train_idx)
    valid_data = dataset(train_tokens, train_labels, valid_idx)
    test_data = dataset(test_tokens, test_labels, range(N_TEST))
    assert unk_index == 0

    shuffle_gen = torch.Generator().manual_seed(SEED + seed)
    train_data_loader = torch.utils.data.DataLoader(
        dataset=train_data, batch_size=BATCH_SIZE, collate_fn=get_collate_fn(pad_index, sort_by_length),
        shuffle=True, generator=shuffle_gen,
    )  # fmt: skip
    valid_data_loader = get_data_loader(valid_data, BATCH_SIZE, pad_index, sort_by_length)
    test_data_loader = get_data_loader(test_data, BATCH_SIZE, pad_index, sort_by_length)

    model = NBoW(len(vocab), EMBEDDING_DIM, 2, pad_index, softmax_out=variant == "softmax_in_forward")

    # GloVe stand-in: vectors.get_vecs_by_tokens(vocab.get_itos()), zeros for tokens it lacks
    vec_rng = np.random.default_rng(42)
    table = vec_rng.normal(0.0, 0.4, size=(N_TYPES, EMBEDDING_DIM)).astype("float32")
    known = vec_rng.random(N_TYPES) < 0.9
    pretrained_embedding = torch.zeros(len(vocab), EMBEDDING_DIM)
    for i, token in enumerate(vocab.itos):
        if token.startswith("w") and known[int(token[1:])]:
            pretrained_embedding[i] = torch.from_numpy(table[int(token[1:])])
    model.embedding.weight.data = pretrained_embedding

    optimizer = optim.Adam(model.parameters())
    criterion = nn.CrossEntropyLoss()

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's stream alone
        first = next(iter(get_data_loader(train_data, BATCH_SIZE, pad_index, sort_by_length)))
    probe_batch = (first["ids"], first["label"])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def train_epoch(data_loader, model, criterion, optimizer):
        model.train()
        epoch_losses, epoch_accs = [], []
        for batch in data_loader:
            ids = batch["ids"]
            label = batch["label"]
            prediction = model(ids)
            loss = criterion(prediction, label)
            accuracy = get_accuracy(prediction, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_losses.append(loss.item())
            epoch_accs.append(accuracy.item())
            nx.timed(lambda: mon.log(loss))  # noqa: B023
        return np.mean(epoch_losses), np.mean(epoch_accs)

    def evaluate(data_loader, model, criterion):
        model.eval()
        epoch_losses, epoch_accs = [], []
        with torch.no_grad():
            for batch in data_loader:
                ids = batch["ids"]
                label = batch["label"]
                prediction = model(ids)
                loss = criterion(prediction, label)
                accuracy = get_accuracy(prediction, label)
                epoch_losses.append(loss.item())
                epoch_accs.append(accuracy.item())
        return np.mean(epoch_losses), np.mean(epoch_accs)

    best_valid_loss = float("inf")
    best_state = None
    metrics = collections.defaultdict(list)
    for _epoch in range(N_EPOCHS):
        train_loss, train_acc = train_epoch(train_data_loader, model, criterion, optimizer)
        valid_loss, valid_acc = evaluate(valid_data_loader, model, criterion)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))  # noqa: B023
        metrics["train_losses"].append(train_loss)
        metrics["train_accs"].append(train_acc)
        metrics["valid_losses"].append(valid_loss)
        metrics["valid_accs"].append(valid_acc)
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), "nbow.pt")

    model.load_state_dict(best_state)
    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    test_loss, test_acc = evaluate(test_data_loader, model, criterion)

    # measure only: predict_sentiment on each test review alone
    model.eval()
    correct, probs = 0, []
    with torch.no_grad():
        for item in test_data:
            cls, prob = predict_sentiment(item["ids"], model)
            correct += int(cls == int(item["label"]))
            probs.append(prob)
    return {"test_acc_unbatched": correct / len(test_data), "mean_predicted_probability": float(np.mean(probs)),
            "test_loss": float(test_loss), "test_acc": float(test_acc), "best_valid_loss": float(best_valid_loss),
            "final_train_loss": float(metrics["train_losses"][-1]),
            "final_train_acc": float(metrics["train_accs"][-1])}  # fmt: skip
