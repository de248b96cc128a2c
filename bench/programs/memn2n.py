"""Port of nmhkahn/MemN2N-pytorch: an end-to-end memory network (adjacent weight tying, position
encoding, temporal encoding by time words, K = 3 hops of softmax attention over the story's
sentences) trained with summed cross-entropy and SGD on bAbI task 1.

Source: github.com/nmhkahn/MemN2N-pytorch, ``memn2n/model.py``, ``memn2n/trainer.py``,
``memn2n/dataset.py``, ``memn2n/data_utils.py`` and ``memn2n/train.py`` at commit
a28dd9245b978fe577a7535797dcf2cce3d2dde4 (no licence file in the repository; the data
utilities are credited there to domluna/memn2n, MIT). Written anew from the facts of those
files; no code copied. The bAbI files (downloaded) are replaced by a generator of task 1
("single supporting fact") stories in the same form (the data, not the program): four
people, six places, five movement verbs; a story is five rounds of two "<person> <verb>
the <place>" sentences and one "where is <person>" question whose answer is the place of
that person's last move; each question sees every sentence of its story before it.

Kept: ``parse_stories``' lower-casing, full-stop and question-mark removal and one-word
answers, each question with all the story's sentences before it; ``bAbIDataset``: the
vocabulary of train + test sorted and indexed from 1 (0 the nil word), ``memory_size``
min(50, the longest story), time words added to the index, ``sentence_size`` the longest
sentence or query plus 1 for the time word, ``num_vocab`` the index's size plus 1;
``vectorize_data``: sentences padded with 0, the last ``memory_size`` sentences kept, the
last slot of each sentence overwritten by its time word (the most recent sentence the
lowest), empty memories padded, the one-hot answer's argmax as the label; ``MemN2N``: hops+1
embeddings ``C_0``..``C_K`` (``padding_idx=0``, ``normal_(0, 0.1)``), ``C_0`` embedding the
query and ``C_k``/``C_k+1`` the input/output memories of hop k (adjacent tying), the position
encoding ``1 + 4 * (i - (d+1)/2) * (j - (J+1)/2) / d / J`` with the time-word column 1, the
query ``u`` the encoded sum of its word embeddings, per hop the softmax over memories of
``m_A . u``, ``o = sum(p * m_C)``, ``u = u + o``, the answer ``u @ C_K.weight.T``, returning the
logits and their softmax; ``Trainer``: ``CrossEntropyLoss(size_average=False)`` (a sum),
``SGD(lr=0.01)``, per batch ``zero_grad``, the loss on the logits, ``backward``,
``clip_grad_norm(max_clip=40)`` then Gaussian gradient noise of std 1e-3, ``step``; per epoch
the learning rate set to ``lr * 0.5 ** (epoch // decay_interval)``; train and test accuracy
(argmax of the softmax output) every 10 epochs; batch 32, shuffled train loader, unshuffled
test loader; 3 hops, embedding 20.
Shrunk: 1,000 train questions (200 stories, bAbI's 1k size) and 500 test questions instead
of 1,000; 30 epochs with ``decay_interval`` 10 instead of 100 with 25.
Measure only (not in the program): the test accuracy of the last evaluation (as
``evaluate("test")`` computes it) and the final train accuracy.

nndx, as the author would add it: the model takes ``(story, query)`` and returns ``(logits,
probabilities)``; a batch is ``((story, query), answer)`` and the loss function the trainer's
``ce_fn`` on the first output; a preflight ``nndx.probe`` on the first training batch before
``fit``, ``nndx.Monitor(mem_n2n, opt)`` around the epochs, every batch's loss logged, and every
10 epochs the test loss (``ce_fn`` per batch, averaged; computed in ``evaluate`` for this) and
test accuracy as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "memn2n"
SOURCE = Source("nmhkahn/MemN2N-pytorch", "memn2n/trainer.py", "a28dd9245b978fe577a7535797dcf2cce3d2dde4",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 30 epochs, decay every 10)"),
        Variant(
            "ce_on_softmax",
            "loss = ce_fn(mem_n2n(story, query)[1], answer): the cross-entropy is given the model's second "
            "output, the softmax probabilities, instead of the logits (a softmax applied twice)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/gitabcworld/MatchingNetworks/issues/5",
             "https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/jaehong31/CGES/issues/1",
             "https://github.com/tflearn/tflearn/pull/562"),
            Measure("test_acc", "last test accuracy at least 0.1 below the healthy run's: 0.144 against 0.976 "
                    "healthy on seed 0 (train 0.20 against 1.0)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "attention_softmax_missing",
            "the softmax over the memories left out of each hop: the raw match scores m_A . u weight the output "
            "memories (the bug of the Keras bAbI memory-network example)",
            (C.MISSING_ACTIVATION,),
            ("https://github.com/keras-team/keras/pull/3706",
             "https://github.com/therne/dmn-tensorflow/issues/6"),
            Measure("test_acc", "last test accuracy at least 0.1 below the healthy run's: 0.162 against 0.976 "
                    "healthy on seed 0 (train 0.18 against 1.0; gradient norms ~4e5 before the clip at 40)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = {"task": 1, "max_hops": 3, "batch_size": 32, "max_epochs": 30, "lr": 0.01, "decay_interval": 10,
        "decay_ratio": 0.5, "max_clip": 40.0, "embedding_dim": 20, "memory_size": 50}  # fmt: skip
N_TRAIN_STORIES, N_TEST_STORIES = 200, 100
PEOPLE = ("mary", "john", "sandra", "daniel")
PLACES = ("bathroom", "hallway", "office", "kitchen", "garden", "bedroom")
VERBS = (("moved", "to"), ("went", "to"), ("journeyed", "to"), ("travelled", "to"), ("went", "back", "to"))


# --------------------------------------------------------------------------- the bAbI stand-in (the data)


def babi_task1_lines(n_stories: int, rng: np.random.Generator) -> list[str]:
    """Lines in bAbI's file format: ``<id> <sentence>.`` and ``<id> <question>?\\t<answer>\\t<support>``."""
    lines = []
    for _ in range(n_stories):
        where: dict[str, tuple[str, int]] = {}
        nid = 1
        for _round in range(5):
            for _ in range(2):
                person, place = PEOPLE[rng.integers(len(PEOPLE))], PLACES[rng.integers(len(PLACES))]
                verb = " ".join(VERBS[rng.integers(len(VERBS))])
                lines.append(f"{nid} {person.capitalize()} {verb} the {place}.")
                where[person] = (place, nid)
                nid += 1
            person = list(where)[rng.integers(len(where))]
            place, support = where[person]
            lines.append(f"{nid} Where is {person.capitalize()}? \t{place}\t{support}")
            nid += 1
    return lines


def tokenize(sent: str) -> list[str]:
    import re

    return [x.strip() for x in re.split(r"(\W+)", sent) if x and x.strip()]


def parse_stories(lines: list[str]) -> list[tuple[list[list[str]], list[str], list[str]]]:
    data, story = [], []
    for line in lines:
        line = line.lower()
        nid_text, line = line.split(" ", 1)
        if int(nid_text) == 1:
            story = []
        if "\t" in line:  # a question
            q, a, _supporting = line.split("\t")
            q = tokenize(q)
            if q[-1] == "?":
                q = q[:-1]
            data.append(([x for x in story if x], q, [a]))
            story.append("")
        else:
            sent = tokenize(line)
            if sent[-1] == ".":
                sent = sent[:-1]
            story.append(sent)
    return data


def vectorize_data(data, word_idx: dict, sentence_size: int, memory_size: int):
    S, Q, A = [], [], []
    for story, query, answer in data:
        ss = [[word_idx[w] for w in sentence] + [0] * max(0, sentence_size - len(sentence)) for sentence in story]
        ss = ss[::-1][:memory_size][::-1]  # the most recent sentences that fit
        for i in range(len(ss)):  # the time word in each sentence's last slot
            ss[i][-1] = len(word_idx) - memory_size - i + len(ss)
        ss += [[0] * sentence_size for _ in range(max(0, memory_size - len(ss)))]
        q = [word_idx[w] for w in query] + [0] * max(0, sentence_size - len(query))
        y = np.zeros(len(word_idx) + 1)
        for a in answer:
            y[word_idx[a]] = 1
        S.append(ss)
        Q.append(q)
        A.append(y)
    return np.array(S), np.array(Q), np.array(A)


class bAbIDataset(Dataset):
    def __init__(self, train_data, test_data, memory_size: int = 50, train: bool = True) -> None:
        data = train_data + test_data
        vocab: set[str] = set()
        for story, query, answer in data:
            vocab |= set(list(chain.from_iterable(story)) + query + answer)
        self.vocab = sorted(vocab)
        word_idx: dict = {word: i + 1 for i, word in enumerate(self.vocab)}
        self.max_story_size = max(len(story) for story, _, _ in data)
        self.query_size = max(len(query) for _, query, _ in data)
        self.sentence_size = max(len(row) for row in chain.from_iterable(story for story, _, _ in data))
        self.memory_size = min(memory_size, self.max_story_size)
        for i in range(self.memory_size):  # the time words
            word_idx[f"time{i + 1}"] = f"time{i + 1}"
        self.num_vocab = len(word_idx) + 1
        self.sentence_size = max(self.query_size, self.sentence_size) + 1  # +1 for the time word
        self.word_idx = word_idx
        story, query, answer = vectorize_data(train_data if train else test_data, word_idx, self.sentence_size,
                                              self.memory_size)  # fmt: skip
        self.data_story = torch.LongTensor(story)
        self.data_query = torch.LongTensor(query)
        self.data_answer = torch.LongTensor(np.argmax(answer, axis=1))

    def __getitem__(self, idx: int):
        return self.data_story[idx], self.data_query[idx], self.data_answer[idx]

    def __len__(self) -> int:
        return len(self.data_story)


# --------------------------------------------------------------------------- memn2n/model.py


def position_encoding(sentence_size: int, embedding_dim: int) -> np.ndarray:
    encoding = np.ones((embedding_dim, sentence_size), dtype=np.float32)
    for i in range(1, embedding_dim + 1):
        for j in range(1, sentence_size + 1):
            encoding[i - 1, j - 1] = (i - (embedding_dim + 1) / 2) * (j - (sentence_size + 1) / 2)
    encoding = 1 + 4 * encoding / embedding_dim / sentence_size
    encoding[:, -1] = 1.0  # time words left as they are
    return np.transpose(encoding)


class MemN2N(nn.Module):
    def __init__(self, settings: dict, attention_softmax: bool = True) -> None:
        super().__init__()
        self.max_hops = settings["max_hops"]
        for hop in range(self.max_hops + 1):
            emb = nn.Embedding(settings["num_vocab"], settings["embedding_dim"], padding_idx=0)
            emb.weight.data.normal_(0, 0.1)
            self.add_module(f"C_{hop}", emb)
        self.softmax = nn.Softmax(dim=1)  # nn.Softmax() on 2-D input: dim 1
        self.register_buffer("encoding", torch.FloatTensor(position_encoding(settings["sentence_size"],
                                                                             settings["embedding_dim"])))  # fmt: skip
        self.attention_softmax = attention_softmax

    def C(self, hop: int) -> nn.Embedding:
        return getattr(self, f"C_{hop}")

    def forward(self, story: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        story_size = story.size()
        u = []
        query_embed = self.C(0)(query)
        u.append(torch.sum(query_embed * self.encoding.unsqueeze(0).expand_as(query_embed), 1))
        for hop in range(self.max_hops):
            embed_A = self.C(hop)(story.view(story.size(0), -1)).view(story_size + (-1,))
            encoding = self.encoding.unsqueeze(0).unsqueeze(1).expand_as(embed_A)
            m_A = torch.sum(embed_A * encoding, 2)
            scores = torch.sum(m_A * u[-1].unsqueeze(1).expand_as(m_A), 2)
            prob = self.softmax(scores) if self.attention_softmax else scores
            embed_C = self.C(hop + 1)(story.view(story.size(0), -1)).view(story_size + (-1,))
            m_C = torch.sum(embed_C * encoding, 2)
            o_k = torch.sum(m_C * prob.unsqueeze(2).expand_as(m_C), 1)
            u.append(u[-1] + o_k)
        a_hat = u[-1] @ self.C(self.max_hops).weight.transpose(0, 1)
        return a_hat, self.softmax(a_hat)


# --------------------------------------------------------------------------- memn2n/trainer.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    config = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_data = parse_stories(babi_task1_lines(N_TRAIN_STORIES, rng))
    test_data = parse_stories(babi_task1_lines(N_TEST_STORIES, rng))
    train_set = bAbIDataset(train_data, test_data, config["memory_size"], train=True)
    test_set = bAbIDataset(train_data, test_data, config["memory_size"], train=False)
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_set, batch_size=config["batch_size"], shuffle=False)
    settings = {"num_vocab": train_set.num_vocab, "embedding_dim": config["embedding_dim"],
                "sentence_size": train_set.sentence_size, "max_hops": config["max_hops"]}  # fmt: skip
    mem_n2n = MemN2N(settings, attention_softmax=variant != "attention_softmax_missing")
    ce_fn = nn.CrossEntropyLoss(reduction="sum")  # size_average=False
    opt = torch.optim.SGD(mem_n2n.parameters(), lr=config["lr"])
    output_used = 1 if variant == "ce_on_softmax" else 0

    def loss_fn(outputs: tuple[torch.Tensor, torch.Tensor], answer: torch.Tensor) -> torch.Tensor:
        return ce_fn(outputs[output_used], answer)

    first = next(iter(DataLoader(train_set, batch_size=config["batch_size"], shuffle=False)))
    probe_batch = ((first[0], first[1]), first[2])
    nx.preflight(mem_n2n, probe_batch, loss_fn, optimizer=opt)
    mon = nx.monitor(mem_n2n, opt, every=10)

    def evaluate(split: str) -> tuple[float, float]:
        correct, batch_losses = 0, []
        loader = train_loader if split == "train" else test_loader
        with torch.no_grad():
            for story, query, answer in loader:
                outputs = mem_n2n(story, query)
                pred = outputs[1].max(1)[1]
                correct += int(pred.eq(answer).sum())
                batch_losses.append(float(loss_fn(outputs, answer)))  # for the Monitor's val curve
        return correct / len(loader.dataset), float(np.mean(batch_losses))

    def gradient_noise_and_clip(parameters, noise_stddev: float = 1e-3, max_clip: float = 40.0) -> None:
        parameters = [p for p in parameters if p.grad is not None]
        nn.utils.clip_grad_norm_(parameters, max_clip)
        for p in parameters:
            p.grad.data.add_(torch.randn(p.size()) * noise_stddev)

    def train_single_epoch() -> float:
        loss = torch.tensor(float("nan"))
        for story, query, answer in train_loader:
            opt.zero_grad()
            loss = loss_fn(mem_n2n(story, query), answer)
            loss.backward()
            gradient_noise_and_clip(mem_n2n.parameters(), noise_stddev=1e-3, max_clip=config["max_clip"])
            opt.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
        return float(loss.detach())

    printed: list[str] = []
    loss = train_acc = test_acc = float("nan")
    for epoch in range(config["max_epochs"]):
        loss = train_single_epoch()
        lr = config["lr"] * (config["decay_ratio"] ** max(0, epoch // config["decay_interval"]))
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        if (epoch + 1) % 10 == 0:
            train_acc, _ = evaluate("train")
            test_acc, test_loss = evaluate("test")
            nx.timed(lambda: mon.log(test_loss, split="val", accuracy=test_acc))  # noqa: B023
            printed.append(f"{epoch + 1} {loss} {train_acc} {test_acc}")

    nx.finish(mon, mem_n2n, probe_batch, loss_fn, optimizer=opt)
    return {"test_acc": test_acc, "train_acc": train_acc, "last_loss": loss}
