"""Port of Shawn1993/cnn-text-classification-pytorch: Kim's CNN for sentence classification.

Source: github.com/Shawn1993/cnn-text-classification-pytorch, ``model.py``, ``train.py``,
``main.py`` and ``mydatasets.py`` at commit 93415f08168a1ae60635320569f6eca0ae3a40bb
(Apache-2.0). Written anew from the facts of those files; no code copied.

Kept: ``CNN_Text``: ``nn.Embedding(V, D, padding_idx=0)`` initialised uniform in
[-0.25, 0.25] with the padding row zeroed; one ``nn.Conv2d(1, Co, (K, D))`` per kernel
size 3, 4, 5 over the embedded sentence ``(N, 1, W, D)``; ReLU, ``squeeze(3)``,
``F.max_pool1d`` over the whole length (max-over-time), the pooled maps concatenated,
``nn.Dropout(0.5)``, ``fc1`` Linear to the classes. ``train``: ``Adam(lr=0.001)``; per
batch ``model.train()``, ``zero_grad``, forward, ``F.cross_entropy``, ``backward``,
``step``, then Kim's max-norm constraint (the rows of ``fc1.weight`` rescaled to L2 norm
at most ``max_norm`` 3.0); every ``test_interval`` steps ``eval`` on the dev set (one batch
of the whole set: ``model.eval()``, the summed cross-entropy averaged, the accuracy in
percent), the best dev accuracy kept (``save_best``: here a copy in memory) and early
stopping when ``early_stop`` steps pass without a better one; ``train`` returns the best
dev accuracy. ``MRDataset.splits``: the negative file's sentences then the positive
file's, shuffled together as (tokens, label) pairs, a ``Vocab`` with ``<pad>`` 0 and
``<unk>`` 1 then words by descending frequency, the last 10% as dev;
``DataLoader(batch_size=64, shuffle=True)`` with a ``collate_fn`` that pads each batch
with 0 to its longest sentence (at least the largest kernel).
Shrunk: a generated two-class corpus instead of rt-polarity (see ``corpus``: filler
words with one or two class key phrases of two or three words, built from a shared
pool of key words, so that a single word does not tell the class but the phrase does);
2,000 sentences (1,800 train / 200 dev) instead of 10,662; embed_dim 32 instead of 128,
kernel_num 16 instead of 100; 12 epochs instead of 256, ``test_interval`` 20 instead
of 100, ``early_stop`` 200 instead of 1,000 steps; no snapshot files, no ``predict``.
Measure only (not in the program): the best dev accuracy ``train`` returns, and the dev
loss of the last ``eval``.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with ``F.cross_entropy`` and the optimizer; ``nndx.Monitor(model, optimizer,
loss_fn=F.cross_entropy)`` around the epochs, the loss called as ``mon.loss_fn``, each
batch's loss logged with its batch accuracy, each ``eval`` logged as ``split="val"`` with
its accuracy; after training ``nndx.probe(..., monitor=mon)`` on the first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "textcnn"
SOURCE = Source("Shawn1993/cnn-text-classification-pytorch", "train.py",
                "93415f08168a1ae60635320569f6eca0ae3a40bb", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: embed 32, 16 kernels of each size, 12 epochs)"),
        Variant(
            "softmax_before_cross_entropy",
            "CNN_Text.forward returns F.softmax(self.fc1(x), dim=1) and train/eval pass it to F.cross_entropy, "
            "which applies log_softmax again: the loss is floored and its gradient shrinks as the model grows sure",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/gitabcworld/MatchingNetworks/issues/5",
             "https://github.com/DSKSD/DeepNLP-models-Pytorch/issues/11",
             "https://github.com/tflearn/tflearn/pull/562",
             "https://github.com/apple/turicreate/pull/2782"),
            Measure("dev_loss", "the last eval's dev cross-entropy at least 2x the healthy run's and 0.1 above it "
                    "(the softmax-of-probabilities floor is 0.31 for two classes): 0.316 against 0.005 healthy on "
                    "seed 0, "
                    "dev accuracy 100% in both",
                    lambda healthy, buggy: buggy >= 2 * healthy and buggy >= healthy + 0.1),
        ),
        Variant(
            "texts_shuffled_without_labels",
            "splits shuffles the sentences but not the labels with them (random.shuffle(texts) on the list read "
            "negative-file-then-positive-file, labels left in file order): every pair is a random pairing",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/abhi8893/tensorflow-deep-learning-mrdbourke/issues/2",
             "https://github.com/tkipf/gcn/issues/152"),
            Measure("best_dev_acc", "best dev accuracy at least 20 points below the healthy run's: 12.5% (the dev "
                    "tenth "
                    "holds only file-order 'positive' labels) against 100% healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
    )
}

ARGS = {"lr": 0.001, "epochs": 12, "batch_size": 64, "test_interval": 20, "early_stop": 200, "dropout": 0.5,
        "max_norm": 3.0, "embed_dim": 32, "kernel_num": 16, "kernel_sizes": [3, 4, 5], "static": False}  # fmt: skip
N_SENTENCES, DEV_RATIO = 2000, 0.1
N_FILLER, N_KEYWORDS, PHRASES_PER_CLASS = 300, 12, 8


# --------------------------------------------------------------------------- the data (the rt-polarity stand-in)


def corpus(seed: int) -> tuple[list[list[str]], list[list[str]]]:
    """(negative sentences, positive sentences) as the two files give them, tokenised.
    Each class has 8 key phrases of 2-3 words drawn from 12 key words shared by both
    classes; a sentence is 8-24 filler words with one or two of its class's phrases."""
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(N_FILLER)]
    keys = [f"k{i}" for i in range(N_KEYWORDS)]
    phrases: list[list[tuple[str, ...]]] = [[], []]
    seen: set[tuple[str, ...]] = set()
    for label in (0, 1):
        while len(phrases[label]) < PHRASES_PER_CLASS:
            p = tuple(rng.choice(keys, size=int(rng.integers(2, 4)), replace=False))
            if p not in seen:
                seen.add(p)
                phrases[label].append(p)
    zipf = 1.0 / np.arange(1, N_FILLER + 1) ** 0.8
    zipf /= zipf.sum()

    def sentence(label: int) -> list[str]:
        words = [filler[i] for i in rng.choice(N_FILLER, size=int(rng.integers(8, 25)), p=zipf)]
        for _ in range(int(rng.integers(1, 3))):
            p = phrases[label][int(rng.integers(0, PHRASES_PER_CLASS))]
            at = int(rng.integers(0, len(words) + 1))
            words[at:at] = list(p)
        return words

    half = N_SENTENCES // 2
    return [sentence(0) for _ in range(half)], [sentence(1) for _ in range(half)]


class Vocab:
    def __init__(self, counter: dict[str, int], specials: tuple[str, ...] = ("<pad>", "<unk>")) -> None:
        self.itos = list(specials)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        for word, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])):
            if word not in self.stoi:
                self.stoi[word] = len(self.itos)
                self.itos.append(word)

    def __len__(self) -> int:
        return len(self.itos)


class MRDataset(Dataset):
    def __init__(self, examples: list[tuple[list[str], str]], text_vocab: Vocab, label_vocab: Vocab) -> None:
        self.examples, self.text_vocab, self.label_vocab = examples, text_vocab, label_vocab

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, label = self.examples[idx]
        text = torch.tensor([self.text_vocab.stoi.get(t, 1) for t in tokens], dtype=torch.long)
        return text, torch.tensor(self.label_vocab.stoi[label], dtype=torch.long)

    @classmethod
    def splits(cls, neg: list[list[str]], pos: list[list[str]], variant: str, dev_ratio: float = DEV_RATIO):
        examples = [(t, "negative") for t in neg] + [(t, "positive") for t in pos]
        if variant == "texts_shuffled_without_labels":
            texts, labels = [t for t, _ in examples], [lab for _, lab in examples]
            random.shuffle(texts)  # the labels stay in file order
            examples = list(zip(texts, labels))
        else:
            random.shuffle(examples)
        text_counter: dict[str, int] = {}
        label_counter: dict[str, int] = {}
        for tokens, label in examples:
            for t in tokens:
                text_counter[t] = text_counter.get(t, 0) + 1
            label_counter[label] = label_counter.get(label, 0) + 1
        text_vocab, label_vocab = Vocab(text_counter), Vocab(label_counter, specials=())
        dev_index = -1 * int(dev_ratio * len(examples))
        return (cls(examples[:dev_index], text_vocab, label_vocab), cls(examples[dev_index:], text_vocab, label_vocab),
                text_vocab, label_vocab)  # fmt: skip


def collate_fn(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    texts, labels = zip(*batch)
    max_len = max(max(len(t) for t in texts), max(ARGS["kernel_sizes"]))
    padded = torch.zeros(len(texts), max_len, dtype=torch.long)
    for i, t in enumerate(texts):
        padded[i, : len(t)] = t
    return padded, torch.stack(labels)


# --------------------------------------------------------------------------- model.py


class CNN_Text(nn.Module):  # noqa: N801 - the source's name
    def __init__(self, args: dict, softmax_output: bool = False) -> None:
        super().__init__()
        V, D, Cn = args["embed_num"], args["embed_dim"], args["class_num"]  # noqa: N806
        Ci, Co, Ks = 1, args["kernel_num"], args["kernel_sizes"]  # noqa: N806
        self.embed = nn.Embedding(V, D, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.25, 0.25)
        self.embed.weight.data[0].fill_(0)
        self.convs = nn.ModuleList([nn.Conv2d(Ci, Co, (K, D)) for K in Ks])
        self.dropout = nn.Dropout(args["dropout"])
        self.fc1 = nn.Linear(len(Ks) * Co, Cn)
        if args["static"]:
            self.embed.weight.requires_grad = False
        self.softmax_output = softmax_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).unsqueeze(1)  # (N, 1, W, D)
        xs = [F.relu(conv(x)).squeeze(3) for conv in self.convs]  # (N, Co, W - K + 1) each
        xs = [F.max_pool1d(i, i.size(2)).squeeze(2) for i in xs]  # (N, Co) each
        x = self.dropout(torch.cat(xs, 1))
        logit = self.fc1(x)
        return F.softmax(logit, dim=1) if self.softmax_output else logit


# --------------------------------------------------------------------------- train.py / main.py


def evaluate(data_iter: DataLoader, model: nn.Module) -> tuple[float, float]:
    model.eval()
    corrects, avg_loss, total = 0, 0.0, 0
    with torch.no_grad():
        for feature, target in data_iter:
            logit = model(feature)
            avg_loss += F.cross_entropy(logit, target, reduction="sum").item()
            corrects += int((torch.max(logit, 1)[1] == target).sum())
            total += target.size(0)
    return avg_loss / total, 100.0 * corrects / total


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(seed)
    torch.manual_seed(seed)
    neg, pos = corpus(seed)
    train_dataset, dev_dataset, text_vocab, label_vocab = MRDataset.splits(neg, pos, variant)
    train_iter = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True, collate_fn=collate_fn,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip
    dev_iter = DataLoader(dev_dataset, batch_size=len(dev_dataset), shuffle=False, collate_fn=collate_fn)
    args["embed_num"], args["class_num"] = len(text_vocab), len(label_vocab)

    model = CNN_Text(args, softmax_output=variant == "softmax_before_cross_entropy")
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])

    probe_batch = collate_fn([train_dataset[i] for i in range(args["batch_size"])])
    nx.preflight(model, probe_batch, F.cross_entropy, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.cross_entropy)

    steps, best_acc, last_step = 0, 0.0, 0
    best_state = None
    dev_loss = dev_acc = train_loss = float("nan")
    stopped = False
    model.train()
    for _epoch in range(1, args["epochs"] + 1):
        for feature, target in train_iter:
            model.train()
            optimizer.zero_grad()
            logit = model(feature)
            loss = mon.loss_fn(logit, target)
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # Kim's L2 constraint on the rows of fc1's weight
                for name, param in model.named_parameters():
                    if "fc1.weight" in name:
                        norms = param.norm(2, dim=-1, keepdim=True)
                        param.mul_(torch.clamp(norms, max=args["max_norm"]) / (norms + 1e-8))
            steps += 1
            accuracy = float((torch.max(logit, 1)[1] == target).float().mean())
            nx.timed(lambda: mon.log(loss, accuracy=accuracy))  # noqa: B023
            train_loss = loss.item()
            if steps % args["test_interval"] == 0:
                dev_loss, dev_acc = evaluate(dev_iter, model)
                nx.timed(lambda: mon.log(dev_loss, split="val", accuracy=dev_acc / 100.0))  # noqa: B023
                if dev_acc > best_acc:
                    best_acc, last_step = dev_acc, steps
                    best_state = copy.deepcopy(model.state_dict())
                elif steps - last_step >= args["early_stop"]:
                    stopped = True
                    break
        if stopped:
            break

    nx.finish(mon, model, probe_batch, F.cross_entropy, optimizer=optimizer)
    del best_state
    return {"best_dev_acc": best_acc, "dev_acc": dev_acc, "dev_loss": dev_loss, "train_loss": train_loss,
            "steps": float(steps)}  # fmt: skip
