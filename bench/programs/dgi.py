"""Port of PetarV-/DGI: Deep Graph Infomax (a one-layer GCN encoder trained by mutual information).

Source: github.com/PetarV-/DGI, ``execute.py``, ``models/dgi.py``, ``models/logreg.py``,
``layers/gcn.py``, ``layers/readout.py``, ``layers/discriminator.py`` and
``utils/process.py`` at commit 61baf67d7052905c77bdeb28c22926f04e182362 (MIT). Written
anew from the facts of those files; no code copied.

Kept: ``GCN`` (``nn.Linear(in, out, bias=False)`` with ``xavier_uniform_``, a separate
zero-initialised bias added after the propagation, ``nn.PReLU`` for ``nonlinearity =
'prelu'``; input ``(batch, nodes, features)``, the dense path ``torch.bmm(adj,
seq_fts)``); ``AvgReadout`` (mean over the nodes, no mask); ``Discriminator``
(``nn.Bilinear(n_h, n_h, 1)``, ``xavier_uniform_`` weight, zero bias; the summary
expanded over the nodes, scores of the real and of the corrupted nodes concatenated:
raw logits); ``DGI.forward``: h_1 = GCN(features), summary c = sigmoid(readout(h_1)),
h_2 = GCN(shuffled features), logits = disc(c, h_1, h_2); ``DGI.embed`` returns h_1
detached. ``execute.py``: features row-normalised (``preprocess_features``), adjacency
D^-1/2 (A + I) D^-1/2 (``normalize_adj(adj + eye)``); batch_size 1, lr 0.001, l2_coef
0.0, patience 20, Adam; per epoch ``model.train()``, ``zero_grad``, a fresh
``np.random.permutation`` of the nodes as the corruption (``features[:, idx, :]``),
labels ones for the real nodes then zeros for the corrupted, ``BCEWithLogitsLoss``; the
early stopping on the training loss itself (the best loss's weights saved, the counter
reset; ``patience`` epochs without improvement stop it; the check comes before
``backward``/``step``, as written); the best weights reloaded, embeddings of the whole
graph taken, then 50 ``LogReg`` probes (``nn.Linear`` with ``xavier_uniform_``, zero
bias), each 100 full-batch Adam steps (lr 0.01, no weight decay) with
``CrossEntropyLoss`` on the training nodes' embeddings, scored by accuracy on the test
nodes; the mean accuracy reported.
Shrunk: Cora (2,708 nodes, 1,433 words, 7 classes; files in the repository) is replaced
by a graph made at run time with a fixed seed: a stochastic block model of 600 nodes in 6
classes, about 2 undirected edges a node, each inside the source's class with
probability 0.7, and 300-word binary bag-of-words features (about 15 words a node, 25%
from the class's own 20-word topic); the public Planetoid-style split kept in shape: 20
training nodes a class, 120 validation, 240 test. hid_units 512 -> 256; nb_epochs 10000
-> 300 (the early stopping ends the healthy run before that); 50 probes -> 10.
The dense adjacency is used (``sparse = False``), but normalised as the sparse path
normalises it (the published dense path adds the identity a second time).
Measure only (not in the program): the same probe on the untrained encoder's embeddings
(``random_encoder_accuracy``), to show what training added.

nndx, as the author would add it: a preflight ``nndx.probe`` on the untrained DGI with
the first epoch's batch ``((features, shuf_fts, adj, False, None, None, None), lbl)`` and
``BCEWithLogitsLoss``, the unsupervised loop under ``nndx.Monitor`` with the criterion
called through ``mon.loss_fn``, every epoch's loss logged; after training (before the
best weights are reloaded) ``nndx.probe(..., monitor=mon)`` on that batch and
``nndx.diagnose``. The logistic-regression probes are evaluation, not watched.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dgi"
SOURCE = Source("PetarV-/DGI", "execute.py", "61baf67d7052905c77bdeb28c22926f04e182362", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (Cora settings, dense adjacency)"),
        Variant(
            "sigmoid_before_bce_logits",
            "a sigmoid put on the discriminator's scores (the paper's 'logistic sigmoid') while the loss stays "
            "nn.BCEWithLogitsLoss: the sigmoid is applied twice, every logit is squeezed into (0, 1)",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/PetarV-/DGI/issues/6",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/avBuffer/UNet3plus_pth/issues/23",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_accuracy", "the probes' mean test accuracy at least 0.05 below the healthy run's (the "
                    "loss sits at log 2 and the early stopping ends training near the untrained encoder; seed 0: "
                    "0.56 against 0.86)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "no_zero_grad",
            "optimiser.zero_grad() left out of the epoch loop: each step applies the sum of every epoch's "
            "gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch"),
            Measure("test_accuracy", "the probes' mean test accuracy at least 0.05 below the healthy run's (the "
                    "summed gradients overshoot, the loss stops improving and the early stopping fires; seed 0: "
                    "0.80 against 0.86)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

N_NODES, N_CLASSES, N_WORDS = 500, 6, 300
BATCH_SIZE = 1
NB_EPOCHS = 250
PATIENCE = 20
LR = 0.001
L2_COEF = 0.0
HID_UNITS = 64
N_PROBES = 10
PROBE_STEPS = 100


# --------------------------------------------------------------------------- layers/ and models/


class GCN(nn.Module):
    def __init__(self, in_ft: int, out_ft: int, act: str, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(in_ft, out_ft, bias=False)
        self.act = nn.PReLU() if act == "prelu" else act
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_ft))
        else:
            self.register_parameter("bias", None)
        nn.init.xavier_uniform_(self.fc.weight.data)

    def forward(self, seq: torch.Tensor, adj: torch.Tensor, sparse: bool = False) -> torch.Tensor:
        seq_fts = self.fc(seq)
        if sparse:
            out = torch.spmm(adj, seq_fts.squeeze(0)).unsqueeze(0)
        else:
            out = torch.bmm(adj, seq_fts)
        if self.bias is not None:
            out = out + self.bias
        return self.act(out)


class AvgReadout(nn.Module):
    def forward(self, seq: torch.Tensor, msk: torch.Tensor | None) -> torch.Tensor:
        if msk is None:
            return seq.mean(1)
        msk = msk.unsqueeze(-1)
        return (seq * msk).sum(1) / msk.sum()


class Discriminator(nn.Module):
    def __init__(self, n_h: int, squash: bool = False) -> None:
        super().__init__()
        self.f_k = nn.Bilinear(n_h, n_h, 1)
        nn.init.xavier_uniform_(self.f_k.weight.data)
        self.f_k.bias.data.fill_(0.0)
        self.squash = squash  # the bug: a sigmoid on the scores the loss takes as logits

    def forward(self, c, h_pl, h_mi, s_bias1=None, s_bias2=None) -> torch.Tensor:
        c_x = c.unsqueeze(1).expand_as(h_pl)
        sc_1 = self.f_k(h_pl, c_x).squeeze(2)
        sc_2 = self.f_k(h_mi, c_x).squeeze(2)
        if s_bias1 is not None:
            sc_1 = sc_1 + s_bias1
        if s_bias2 is not None:
            sc_2 = sc_2 + s_bias2
        logits = torch.cat((sc_1, sc_2), 1)
        return torch.sigmoid(logits) if self.squash else logits


class DGI(nn.Module):
    def __init__(self, n_in: int, n_h: int, activation: str, squash: bool = False) -> None:
        super().__init__()
        self.gcn = GCN(n_in, n_h, activation)
        self.read = AvgReadout()
        self.sigm = nn.Sigmoid()
        self.disc = Discriminator(n_h, squash=squash)

    def forward(self, seq1, seq2, adj, sparse, msk, samp_bias1, samp_bias2) -> torch.Tensor:
        h_1 = self.gcn(seq1, adj, sparse)
        c = self.sigm(self.read(h_1, msk))
        h_2 = self.gcn(seq2, adj, sparse)
        return self.disc(c, h_1, h_2, samp_bias1, samp_bias2)

    def embed(self, seq, adj, sparse, msk) -> tuple[torch.Tensor, torch.Tensor]:
        h_1 = self.gcn(seq, adj, sparse)
        c = self.read(h_1, msk)
        return h_1.detach(), c.detach()


class LogReg(nn.Module):
    def __init__(self, ft_in: int, nb_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(ft_in, nb_classes)
        nn.init.xavier_uniform_(self.fc.weight.data)
        self.fc.bias.data.fill_(0.0)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return self.fc(seq)


# --------------------------------------------------------------------------- the data (utils/process.py, synthetic)


def synthetic_graph(seed: int, n: int = N_NODES, classes: int = N_CLASSES, words: int = N_WORDS,
                    topic_words: int = 20, words_per_node: float = 15.0, topic_share: float = 0.25,
                    edges_per_node: float = 2.0, homophily: float = 0.7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(binary features (n, words), labels (n,), symmetric adjacency (n, n)) of a
    stochastic block model standing in for Cora."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(classes, size=n)
    topics = np.stack([rng.choice(words, size=topic_words, replace=False) for _ in range(classes)])
    features = np.zeros((n, words), dtype=np.float64)
    for i in range(n):
        count = max(1, rng.poisson(words_per_node))
        own = rng.random(count) < topic_share
        drawn = np.where(own, topics[labels[i]][rng.integers(topic_words, size=count)], rng.integers(words, size=count))
        features[i, drawn] = 1.0
    by_class = [np.flatnonzero(labels == c) for c in range(classes)]
    adj = np.zeros((n, n))
    edges = 0
    while edges < int(edges_per_node * n):
        src = int(rng.integers(n))
        dst = int(rng.choice(by_class[labels[src]])) if rng.random() < homophily else int(rng.integers(n))
        if src != dst and adj[src, dst] == 0:
            adj[src, dst] = adj[dst, src] = 1.0
            edges += 1
    return features, labels, adj


def preprocess_features(features: np.ndarray) -> np.ndarray:
    rowsum = features.sum(1)
    r_inv = np.power(rowsum, -1.0, where=rowsum > 0, out=np.zeros_like(rowsum))
    return features * r_inv[:, None]


def normalize_adj(adj: np.ndarray) -> np.ndarray:
    rowsum = adj.sum(1)
    d_inv_sqrt = np.power(rowsum, -0.5, where=rowsum > 0, out=np.zeros_like(rowsum))
    return adj * d_inv_sqrt[:, None] * d_inv_sqrt[None, :]


def split(labels: np.ndarray, seed: int, per_class: int = 20, n_val: int = 120, n_test: int = 240):
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(len(labels))
    idx_train = np.concatenate([order[labels[order] == c][:per_class] for c in range(labels.max() + 1)])
    rest = np.setdiff1d(order, idx_train, assume_unique=True)
    rest = rest[rng.permutation(len(rest))]
    return idx_train, rest[:n_val], rest[n_val : n_val + n_test]


# --------------------------------------------------------------------------- execute.py


def probe_accuracy(embeds: torch.Tensor, labels: torch.Tensor, idx_train, idx_test, nb_classes: int) -> float:
    """The program's evaluation: LogReg probes on frozen embeddings, mean test accuracy."""
    xent = nn.CrossEntropyLoss()
    train_embs, test_embs = embeds[0, idx_train], embeds[0, idx_test]
    train_lbls, test_lbls = torch.argmax(labels[0, idx_train], dim=1), torch.argmax(labels[0, idx_test], dim=1)
    accs = []
    for _ in range(N_PROBES):
        log = LogReg(train_embs.shape[1], nb_classes)
        opt = torch.optim.Adam(log.parameters(), lr=0.01, weight_decay=0.0)
        for _ in range(PROBE_STEPS):
            log.train()
            opt.zero_grad()
            loss = xent(log(train_embs), train_lbls)
            loss.backward()
            opt.step()
        preds = torch.argmax(log(test_embs), dim=1)
        accs.append((preds == test_lbls).float().mean().item())
    return float(np.mean(accs))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    raw_features, raw_labels, raw_adj = synthetic_graph(seed)
    idx_train, idx_val, idx_test = split(raw_labels, seed)
    features = preprocess_features(raw_features)
    nb_nodes, ft_size = features.shape
    nb_classes = int(raw_labels.max()) + 1
    adj = normalize_adj(raw_adj + np.eye(nb_nodes))
    sparse = False

    features = torch.FloatTensor(features[np.newaxis])
    adj = torch.FloatTensor(adj[np.newaxis])
    labels = torch.FloatTensor(np.eye(nb_classes)[raw_labels][np.newaxis])
    idx_train, idx_val, idx_test = (torch.LongTensor(i) for i in (idx_train, idx_val, idx_test))

    model = DGI(ft_size, HID_UNITS, "prelu", squash=variant == "sigmoid_before_bce_logits")
    optimiser = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=L2_COEF)
    random_embeds, _ = model.embed(features, adj, sparse, None)

    b_xent = nn.BCEWithLogitsLoss()
    cnt_wait, best, best_t = 0, 1e9, 0
    best_state = copy.deepcopy(model.state_dict())
    lbl = torch.cat((torch.ones(BATCH_SIZE, nb_nodes), torch.zeros(BATCH_SIZE, nb_nodes)), 1)

    mon = None
    first_batch = None
    losses = []
    epoch = 0
    for epoch in range(NB_EPOCHS):
        model.train()
        if variant != "no_zero_grad":
            optimiser.zero_grad()
        idx = np.random.permutation(nb_nodes)
        shuf_fts = features[:, idx, :]
        if first_batch is None:
            first_batch = ((features, shuf_fts, adj, sparse, None, None, None), lbl)
            nx.preflight(model, first_batch, b_xent, optimizer=optimiser)
            mon = nx.monitor(model, optimiser, every=10, loss_fn=b_xent)
        logits = model(features, shuf_fts, adj, sparse, None, None, None)
        loss = mon.loss_fn(logits, lbl)
        losses.append(loss.item())
        if loss.item() < best:
            best, best_t, cnt_wait = loss.item(), epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            cnt_wait += 1
        if cnt_wait == PATIENCE:
            break  # 'Early stopping!'
        loss.backward()
        optimiser.step()
        mon.log(loss)

    nx.finish(mon, model, first_batch, b_xent, optimizer=optimiser)
    model.load_state_dict(best_state)
    embeds, _ = model.embed(features, adj, sparse, None)
    test_accuracy = probe_accuracy(embeds, labels, idx_train, idx_test, nb_classes)
    random_accuracy = probe_accuracy(random_embeds, labels, idx_train, idx_test, nb_classes)
    return {
        "test_accuracy": test_accuracy,
        "random_encoder_accuracy": random_accuracy,
        "best_loss": float(best),
        "best_epoch": float(best_t),
        "epochs": float(epoch + 1),
        "last_loss": losses[-1],
    }
