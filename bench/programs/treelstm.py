"""Port of dasguptar's treelstm.pytorch (Tai et al. 2015, Child-Sum Tree-LSTM for semantic
relatedness on SICK): both sentences of a pair encoded by a recursion over their dependency
trees, a similarity module on ``[h_l * h_r, |h_l - h_r|]`` giving a log-distribution over the
scores 1..5, ``nn.KLDivLoss`` against the sparse target distribution of the gold score,
Adagrad with weight decay, per-tree backward with an optimizer step every ``batchsize`` trees.

Source: github.com/dasguptar/treelstm.pytorch, ``main.py``, ``config.py``, ``treelstm/model.py``,
``treelstm/trainer.py``, ``treelstm/utils.py``, ``treelstm/metrics.py``, ``treelstm/tree.py`` and
``treelstm/dataset.py`` at commit 228a314add09fc7f39ea752aa7b1fcf756cfe277 (the repository's
HEAD; MIT, Copyright (c) 2017 Riddhiman Dasgupta). Written anew from the facts of those files;
no code copied.

Kept: ``Tree`` (parent, children, ``num_children``, ``idx``) and ``SICKDataset.read_tree`` (a
tree built from a 1-based parents array, 0 marking the root), items ``(ltree, lsent, rtree,
rsent, label)`` deep-copied in ``__getitem__``; ``ChildSumTreeLSTM`` (``ioux``, ``iouh``,
``fx``, ``fh`` linear layers; ``node_forward`` summing the children's ``h``, sigmoid
``i``/``o``, tanh ``u``, one forget gate per child, ``c = i*u + sum(f*c_child)``, ``h =
o*tanh(c)``; ``forward`` recursing into the children first, leaves given zero child states,
the state stored on the tree node); ``Similarity`` (``wh`` = Linear(2*mem, hidden) + sigmoid,
``wp`` = Linear(hidden, 5) + ``log_softmax``); ``SimilarityTreeLSTM`` (``nn.Embedding`` with
``padding_idx`` PAD, ``freeze_embed`` off, so the embeddings train with the rest);
the embedding matrix copied from "GloVe" vectors, the special words' rows zeroed;
``nn.KLDivLoss()`` (default reduction); ``Adagrad(filter(requires_grad), lr, weight_decay=1e-4)``;
``map_label_to_target`` (the score's mass split between its floor and ceiling classes);
``Trainer.train`` (``model.train()``, one ``zero_grad`` at the start, a ``randperm`` over the
pairs, per pair forward, loss, ``backward``, and every ``batchsize`` pairs (``idx %
batchsize == 0 and idx > 0``) ``step`` + ``zero_grad``; the epoch's mean loss) and
``Trainer.test`` (``model.eval()``, ``no_grad``, the prediction ``sum_k k * exp(output_k)``);
``main``'s epoch loop testing on dev and test after each epoch (its re-test of the train split left out: it only feeds a log line); ``Metrics.pearson`` and
``Metrics.mse``.
Shrunk: a generated relatedness task instead of SICK (see ``make_split``: a vocabulary of
40 words in 10 synonym groups whose "GloVe" vectors share a group direction; a sentence of 4-8
words with a random dependency tree; its partner keeps a share of the words (swapped for a
synonym half of the time) and draws the rest afresh, on its own random tree; the gold score is
1 + 4 x that share, rounded to 0.2, like SICK's averaged ratings); 500 training, 100 dev and
200 test pairs instead of 4,500/500/4,927; ``input_dim`` 24, ``mem_dim`` 24, ``hidden_dim`` 16
instead of 300/150/50; 6 epochs instead of 15; ``lr`` 0.05 instead of 0.01 (two orders of
magnitude fewer updates); no checkpoints or log files.
Measure only (not in the program): the last epoch's test Pearson and MSE (the numbers
``main`` logs). Seed 0 (without nndx): healthy test Pearson 0.883, MSE 0.42; child states
detached Pearson 0.857, MSE 0.51.

nndx, as the author would add it: the model is called ``model(ltree, linput, rtree, rinput)``
on one pair, so the probe batch is the first training pair as ``((ltree, linput, rtree,
rinput), target)`` with the program's ``KLDivLoss``; a preflight ``nndx.probe`` with the
optimizer; ``nndx.Monitor(model, optimizer)`` around the epochs, the mean loss of the trees of
each optimizer step logged after the step and the dev loss logged as
``split="val"`` after each epoch; after training ``nndx.probe(..., monitor=mon)`` on the same
pair and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from copy import deepcopy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "treelstm"
SOURCE = Source("dasguptar/treelstm.pytorch", "treelstm/trainer.py", "228a314add09fc7f39ea752aa7b1fcf756cfe277", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: generated relatedness pairs, 24-dim, 6 epochs)"),
        Variant(
            "softmax_into_kldiv",
            "Similarity ends in F.softmax instead of F.log_softmax: nn.KLDivLoss is handed probabilities where it "
            "expects log-probabilities (and test() takes exp of them)",
            (C.WRONG_LOSS, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/sebastian-hofstaetter/matchmaker/issues/18",
             "https://github.com/lightly-ai/lightly/pull/1341",
             "https://github.com/baudm/MONet-pytorch/issues/10"),
            Measure("test_mse", "test MSE of the program's prediction sum_k k*exp(output_k) at least 2x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "child_states_detached",
            "the children's (c, h) detached where node_forward gathers them (torch.cat of x.state[0].detach(), "
            "x.state[1].detach()): each tree is trained as if it had depth one, no gradient reaches a child "
            "node or the words below the root",
            (C.DETACHED_GRAPH,),
            ("https://github.com/yhs968/pyGRU4REC/issues/8",
             "https://github.com/lucidrains/block-recurrent-transformer-pytorch/issues/4"),
            Measure("test_mse", "test MSE at least 1.1x the healthy run's (a small task: the words' bag already "
                    "says much of the score; seed 0: 0.51 against 0.42, Pearson 0.857 against 0.883)",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
    )
}

ARGS = dict(input_dim=24, mem_dim=24, hidden_dim=16, num_classes=5, freeze_embed=False, epochs=6, batchsize=25,
            lr=0.05, wd=1e-4, optim="adagrad")  # fmt: skip
PAD, UNK, BOS, EOS = 0, 1, 2, 3  # Constants
GROUPS, PER_GROUP, LENGTH = 10, 4, (4, 8)
N_TRAIN, N_DEV, N_TEST = 500, 100, 200


# --------------------------------------------------------------------------- treelstm/tree.py, dataset.py


class Tree:
    def __init__(self):
        self.parent = None
        self.num_children = 0
        self.children = []

    def add_child(self, child):
        child.parent = self
        self.num_children += 1
        self.children.append(child)


def read_tree(parents):
    trees, root = {}, None
    for i in range(1, len(parents) + 1):
        if i - 1 not in trees and parents[i - 1] != -1:
            idx, prev = i, None
            while True:
                parent = parents[idx - 1]
                if parent == -1:
                    break
                tree = Tree()
                if prev is not None:
                    tree.add_child(prev)
                trees[idx - 1] = tree
                tree.idx = idx - 1
                if parent - 1 in trees:
                    trees[parent - 1].add_child(tree)
                    break
                elif parent == 0:
                    root = tree
                    break
                else:
                    prev, idx = tree, parent
    return root


class SICKDataset:
    def __init__(self, split, num_classes):
        self.num_classes = num_classes
        self.lsentences = [torch.tensor(s, dtype=torch.long) for s in split["a"]]
        self.rsentences = [torch.tensor(s, dtype=torch.long) for s in split["b"]]
        self.ltrees = [read_tree(p) for p in split["a_parents"]]
        self.rtrees = [read_tree(p) for p in split["b_parents"]]
        self.labels = torch.tensor(split["sim"], dtype=torch.float)
        self.size = self.labels.size(0)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return (deepcopy(self.ltrees[index]), deepcopy(self.lsentences[index]), deepcopy(self.rtrees[index]),
                deepcopy(self.rsentences[index]), deepcopy(self.labels[index]))  # fmt: skip


def random_parents(n, rng):
    """A random dependency tree over n words as a 1-based parents array (0: the root)."""
    order = rng.permutation(n)
    parents = [0] * n
    for k in range(1, n):
        parents[order[k]] = int(order[rng.integers(0, k)]) + 1
    return parents


def make_split(n, rng):
    first = 4  # after PAD, UNK, BOS, EOS
    out = {"a": [], "b": [], "a_parents": [], "b_parents": [], "sim": []}
    for _ in range(n):
        length = int(rng.integers(LENGTH[0], LENGTH[1] + 1))
        groups = rng.choice(GROUPS, size=length, replace=False)
        a = [first + int(g) * PER_GROUP + int(rng.integers(PER_GROUP)) for g in groups]
        keep = int(rng.integers(0, length + 1))
        kept = rng.choice(length, size=keep, replace=False)
        b = []
        for j in kept:  # kept words: the same word or a synonym
            g = (a[j] - first) // PER_GROUP
            b.append(a[j] if rng.random() < 0.5 else first + g * PER_GROUP + int(rng.integers(PER_GROUP)))
        others = [g for g in range(GROUPS) if g not in set(int(x) for x in groups)]
        fresh = rng.choice(others, size=min(length - keep, len(others)), replace=False)
        b += [first + int(g) * PER_GROUP + int(rng.integers(PER_GROUP)) for g in fresh]
        b = [b[i] for i in rng.permutation(len(b))]
        share = keep / length
        out["a"].append(a)
        out["b"].append(b)
        out["a_parents"].append(random_parents(len(a), rng))
        out["b_parents"].append(random_parents(len(b), rng))
        out["sim"].append(round((1.0 + 4.0 * share) * 5) / 5)
    return out


def glove_vectors(dim, rng):
    """The stand-in for the GloVe rows: synonyms share a group direction."""
    vocab = 4 + GROUPS * PER_GROUP
    centres = rng.normal(0, 0.4, size=(GROUPS, dim))
    emb = np.zeros((vocab, dim), dtype=np.float32)
    for w in range(4, vocab):
        emb[w] = centres[(w - 4) // PER_GROUP] + rng.normal(0, 0.1, size=dim)
    return torch.from_numpy(emb), vocab


# --------------------------------------------------------------------------- treelstm/model.py


class ChildSumTreeLSTM(nn.Module):
    def __init__(self, in_dim, mem_dim, detach_children=False):
        super().__init__()
        self.in_dim, self.mem_dim, self.detach_children = in_dim, mem_dim, detach_children
        self.ioux = nn.Linear(self.in_dim, 3 * self.mem_dim)
        self.iouh = nn.Linear(self.mem_dim, 3 * self.mem_dim)
        self.fx = nn.Linear(self.in_dim, self.mem_dim)
        self.fh = nn.Linear(self.mem_dim, self.mem_dim)

    def node_forward(self, inputs, child_c, child_h):
        child_h_sum = torch.sum(child_h, dim=0, keepdim=True)
        iou = self.ioux(inputs) + self.iouh(child_h_sum)
        i, o, u = torch.split(iou, iou.size(1) // 3, dim=1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)
        f = torch.sigmoid(self.fh(child_h) + self.fx(inputs).repeat(len(child_h), 1))
        fc = torch.mul(f, child_c)
        c = torch.mul(i, u) + torch.sum(fc, dim=0, keepdim=True)
        h = torch.mul(o, torch.tanh(c))
        return c, h

    def forward(self, tree, inputs):
        for idx in range(tree.num_children):
            self.forward(tree.children[idx], inputs)
        if tree.num_children == 0:
            child_c = inputs[0].detach().new(1, self.mem_dim).fill_(0.0).requires_grad_()
            child_h = inputs[0].detach().new(1, self.mem_dim).fill_(0.0).requires_grad_()
        else:
            child_c, child_h = zip(*(x.state for x in tree.children))
            if self.detach_children:  # the bug
                child_c, child_h = [c.detach() for c in child_c], [h.detach() for h in child_h]
            child_c, child_h = torch.cat(child_c, dim=0), torch.cat(child_h, dim=0)
        tree.state = self.node_forward(inputs[tree.idx].unsqueeze(0), child_c, child_h)
        return tree.state


class Similarity(nn.Module):
    def __init__(self, mem_dim, hidden_dim, num_classes, log_output=True):
        super().__init__()
        self.mem_dim, self.hidden_dim, self.num_classes = mem_dim, hidden_dim, num_classes
        self.wh = nn.Linear(2 * self.mem_dim, self.hidden_dim)
        self.wp = nn.Linear(self.hidden_dim, self.num_classes)
        self.log_output = log_output

    def forward(self, lvec, rvec):
        mult_dist = torch.mul(lvec, rvec)
        abs_dist = torch.abs(torch.add(lvec, -rvec))
        vec_dist = torch.cat((mult_dist, abs_dist), 1)
        out = torch.sigmoid(self.wh(vec_dist))
        if not self.log_output:  # the bug: probabilities into KLDivLoss
            return F.softmax(self.wp(out), dim=1)
        return F.log_softmax(self.wp(out), dim=1)


class SimilarityTreeLSTM(nn.Module):
    def __init__(self, vocab_size, in_dim, mem_dim, hidden_dim, num_classes, freeze, log_output=True,
                 detach_children=False):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, in_dim, padding_idx=PAD)
        if freeze:
            self.emb.weight.requires_grad = False
        self.childsumtreelstm = ChildSumTreeLSTM(in_dim, mem_dim, detach_children)
        self.similarity = Similarity(mem_dim, hidden_dim, num_classes, log_output)

    def forward(self, ltree, linputs, rtree, rinputs):
        linputs = self.emb(linputs)
        rinputs = self.emb(rinputs)
        lstate, lhidden = self.childsumtreelstm(ltree, linputs)
        rstate, rhidden = self.childsumtreelstm(rtree, rinputs)
        return self.similarity(lstate, rstate)


# --------------------------------------------------------------------------- utils.py, metrics.py, trainer.py


def map_label_to_target(label, num_classes):
    target = torch.zeros(1, num_classes, dtype=torch.float)
    ceil, floor = int(math.ceil(label)), int(math.floor(label))
    if ceil == floor:
        target[0, floor - 1] = 1
    else:
        target[0, floor - 1] = ceil - label
        target[0, ceil - 1] = label - floor
    return target


def pearson(predictions, labels):
    x = (predictions - predictions.mean()) / predictions.std()
    y = (labels - labels.mean()) / labels.std()
    return torch.mean(torch.mul(x, y)).item()


def mse(predictions, labels):
    return torch.mean((predictions - labels) ** 2).item()


class Trainer:
    def __init__(self, args, model, criterion, optimizer, nx, mon):
        self.args, self.model, self.criterion, self.optimizer = args, model, criterion, optimizer
        self.nx, self.mon = nx, mon
        self.epoch = 0

    def train(self, dataset):
        self.model.train()
        self.optimizer.zero_grad()
        total_loss, batch_losses = 0.0, []
        indices = torch.randperm(len(dataset), dtype=torch.long)
        for idx in range(len(dataset)):
            ltree, linput, rtree, rinput, label = dataset[indices[idx]]
            target = map_label_to_target(label, dataset.num_classes)
            output = self.model(ltree, linput, rtree, rinput)
            loss = self.criterion(output, target)
            total_loss += loss.item()
            batch_losses.append(loss.item())
            loss.backward()
            if idx % self.args["batchsize"] == 0 and idx > 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
                step_loss = float(np.mean(batch_losses))
                self.nx.timed(lambda: self.mon.log(step_loss))  # noqa: B023
                batch_losses = []
        self.epoch += 1
        return total_loss / len(dataset)

    def test(self, dataset):
        self.model.eval()
        with torch.no_grad():
            total_loss = 0.0
            predictions = torch.zeros(len(dataset), dtype=torch.float)
            indices = torch.arange(1, dataset.num_classes + 1, dtype=torch.float)
            for idx in range(len(dataset)):
                ltree, linput, rtree, rinput, label = dataset[idx]
                target = map_label_to_target(label, dataset.num_classes)
                output = self.model(ltree, linput, rtree, rinput)
                total_loss += self.criterion(output, target).item()
                predictions[idx] = torch.dot(indices, torch.exp(output.squeeze()))
        return total_loss / len(dataset), predictions


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_dataset = SICKDataset(make_split(N_TRAIN, rng), args["num_classes"])
    dev_dataset = SICKDataset(make_split(N_DEV, rng), args["num_classes"])
    test_dataset = SICKDataset(make_split(N_TEST, rng), args["num_classes"])
    emb, vocab_size = glove_vectors(args["input_dim"], rng)

    model = SimilarityTreeLSTM(vocab_size, args["input_dim"], args["mem_dim"], args["hidden_dim"],
                               args["num_classes"], args["freeze_embed"],
                               log_output=variant != "softmax_into_kldiv",
                               detach_children=variant == "child_states_detached")  # fmt: skip
    criterion = nn.KLDivLoss()
    model.emb.weight.data.copy_(emb)
    optimizer = optim.Adagrad(filter(lambda p: p.requires_grad, model.parameters()), lr=args["lr"],
                              weight_decay=args["wd"])  # fmt: skip

    ltree, linput, rtree, rinput, label = train_dataset[0]
    probe_batch = ((ltree, linput, rtree, rinput), map_label_to_target(label, args["num_classes"]))
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)
    trainer = Trainer(args, model, criterion, optimizer, nx, mon)

    best = -float("inf")
    test_pearson = test_mse = dev_pearson = train_loss = float("nan")
    for _epoch in range(args["epochs"]):
        train_loss = trainer.train(train_dataset)
        dev_loss, dev_pred = trainer.test(dev_dataset)
        test_loss, test_pred = trainer.test(test_dataset)
        dev_pearson = pearson(dev_pred, dev_dataset.labels)
        test_pearson, test_mse = pearson(test_pred, test_dataset.labels), mse(test_pred, test_dataset.labels)
        nx.timed(lambda: mon.log(dev_loss, split="val"))  # noqa: B023
        best = max(best, test_pearson)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    return {"test_pearson": test_pearson, "test_mse": test_mse, "dev_pearson": dev_pearson,
            "best_test_pearson": best, "train_loss": train_loss}  # fmt: skip
