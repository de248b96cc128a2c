"""Port of jakesnell/prototypical-networks: episodic few-shot training of a conv-4 Protonet.

Source: github.com/jakesnell/prototypical-networks, ``protonets/models/few_shot.py``,
``protonets/models/utils.py``, ``protonets/engine.py``, ``protonets/data/omniglot.py``,
``protonets/data/base.py``, ``protonets/utils/model.py`` and ``scripts/train/few_shot/train.py``
/ ``run_train.py`` at commit c9bb4d258267c11cb6e23f0a19242d24ca98ad8a (the repository's HEAD;
MIT, Copyright (c) 2017 Jake Snell). Written anew from the facts of those files; no code
copied.

Kept: ``load_protonet_conv``: four ``conv_block`` s (3x3 ``Conv2d(padding=1)``,
``BatchNorm2d``, ``ReLU``, ``MaxPool2d(2)``), the last to ``z_dim``, then ``Flatten``;
``Protonet.loss(sample)``: support ``xs`` (n_class, n_support, ...) and query ``xq``
(n_class, n_query, ...) flattened class-major and encoded in one ``cat``, ``target_inds =
arange(n_class).view(n_class, 1, 1).expand(n_class, n_query, 1)``, prototypes the support
embeddings ``.view(n_class, n_support, z_dim).mean(1)``, ``euclidean_dist`` (the squared
distances of the expanded pair), ``log_softmax(-dists)`` viewed (n_class, n_query, -1), the
loss ``-gather(2, target_inds)`` averaged, the accuracy from ``max(2)``; ``extract_episode``
(a ``randperm`` of the class's images, the first ``n_support`` the support, the next
``n_query`` the query); ``EpisodicBatchSampler`` (``randperm(n_classes)[:n_way]`` per
episode); ``Engine.train``: the optimizer built from ``optim_method`` (Adam, lr 1e-3,
weight_decay 0), per epoch ``model.train()``, the ``on_start_epoch`` hook that resets the
meters and steps ``StepLR(decay_every, gamma=0.5)`` (before the epoch, as written), per
episode ``zero_grad``, ``model.loss``, ``backward``, ``step``, the meters of loss and acc;
``on_end_epoch``: ``model_utils.evaluate`` (``model.eval()``, the val episodes through
``model.loss``), the best model by val loss kept (``torch.save`` here a copy in memory),
patience on the val loss; ``torch.manual_seed(1234)``; the defaults train shot 5 / query 5,
test way 5, test query 15, test shot = train shot.
Shrunk: scikit-learn's 8x8 digits upscaled to 28x28 (the ``x_dim`` 1,28,28 of Omniglot) in
[0, 1] instead of Omniglot's 1,623 characters; the classes 0-5 for training and the unseen
classes 6-9 for validation (so train way 5 instead of 60 and test way 4 instead of 5: only
four classes are held out); hid_dim and z_dim 16 instead of 64; 10 epochs of 20 episodes
instead of up to 10,000 of 100, with ``decay_every`` 3 instead of 20; 20 val episodes per
epoch instead of 100; no tqdm, trace file or opt.json.
Measure only (not in the program): the trained (last-epoch) model's accuracy on 100 episodes
(4-way 5-shot 15-query) of the held-out classes 6-9, with the correct class-major query
labels and nearest-prototype prediction, drawn from its own generator (the best-by-val-loss
model's is returned too, but a buggy run's "best" is its nearly untrained first epoch, and
random conv features already score ~0.67 on digits).

nndx, as the author would add it: the Protonet has no ``forward`` (training calls
``model.loss(sample)``), so nndx watches the encoder, which maps images to embeddings:
the preflight ``nndx.probe(model.encoder, ...)`` gets the first episode's support and query
images as the inputs and the query targets as built by ``loss``, with the prototypical loss
on the embeddings (prototypes, distances, log-softmax, gather) as ``loss_fn`` and the Adam
optimizer; ``nndx.Monitor(model.encoder, optimizer)`` around ``engine.train``, each
episode's loss and accuracy logged from ``on_update`` and each epoch's val loss and
accuracy as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim import lr_scheduler

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "protonet"
SOURCE = Source("jakesnell/prototypical-networks", "protonets/models/few_shot.py",
                "c9bb4d258267c11cb6e23f0a19242d24ca98ad8a", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: digits, 5-way 5-shot, width 16)"),
        Variant(
            "query_targets_query_major",
            "target_inds built as arange(n_class).repeat(n_query) (the query-major layout of other protonet code) "
            "while xq is flattened class-major: most queries are scored against another class's prototype",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/yinboc/prototypical-network-pytorch/issues/18",
             "https://github.com/Luoyadan/BGNN-AAAI/issues/1",
             "https://github.com/jmkim0309/fewshot-egnn/issues/20"),
            Measure("test_accuracy", "last-epoch model's 4-way 5-shot accuracy on the unseen classes at least "
                    "0.1 below the healthy run's: 0.55 against 0.74 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "prototypes_wrong_view",
            "z_proto = z[:n_class*n_support].view(n_support, n_class, z_dim).mean(0): the class-major support "
            "embeddings reshaped shot-major, so each 'prototype' averages one shot of every class",
            (C.WRONG_RESHAPE,),
            ("https://github.com/hieuvmphan/REMINDER/issues/6",
             "https://github.com/Sha-Lab/FEAT/issues/71",
             "https://github.com/orobix/Prototypical-Networks-for-Few-shot-Learning-PyTorch/issues/23"),
            Measure("test_accuracy", "last-epoch model's 4-way 5-shot accuracy on the unseen classes at least "
                    "0.1 below the healthy run's: 0.60 against 0.74 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

OPT = {"data.way": 5, "data.shot": 5, "data.query": 5, "data.test_way": 4, "data.test_shot": 0,
       "data.test_query": 15, "data.train_episodes": 20, "data.test_episodes": 20,
       "model.x_dim": (1, 28, 28), "model.hid_dim": 16, "model.z_dim": 16, "train.epochs": 10,
       "train.learning_rate": 1e-3, "train.decay_every": 3, "train.weight_decay": 0.0, "train.patience": 200}  # fmt: skip
TRAIN_CLASSES, VAL_CLASSES = (0, 1, 2, 3, 4, 5), (6, 7, 8, 9)
MEASURE_EPISODES = 100


# --------------------------------------------------------------------------- protonets/models


def euclidean_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    n, m, d = x.size(0), y.size(0), x.size(1)
    assert d == y.size(1)
    x = x.unsqueeze(1).expand(n, m, d)
    y = y.unsqueeze(0).expand(n, m, d)
    return torch.pow(x - y, 2).sum(2)


class Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1)


def query_targets(n_class: int, n_query: int, variant: str) -> torch.Tensor:
    """The query labels as ``loss`` builds them: (n_class, n_query, 1), class-major."""
    if variant == "query_targets_query_major":
        return torch.arange(n_class).repeat(n_query).view(n_class, n_query, 1).long()
    return torch.arange(0, n_class).view(n_class, 1, 1).expand(n_class, n_query, 1).long()


def protonet_loss(z: torch.Tensor, target_inds: torch.Tensor, n_support: int,
                  variant: str = "healthy") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``Protonet.loss`` after the encoder: the embeddings of the class-major support then
    query images and the (n_class, n_query, 1) targets -> (loss, accuracy)."""
    n_class, n_query = target_inds.size(0), target_inds.size(1)
    z_dim = z.size(-1)
    if variant == "prototypes_wrong_view":
        z_proto = z[: n_class * n_support].view(n_support, n_class, z_dim).mean(0)
    else:
        z_proto = z[: n_class * n_support].view(n_class, n_support, z_dim).mean(1)
    zq = z[n_class * n_support :]
    dists = euclidean_dist(zq, z_proto)
    log_p_y = F.log_softmax(-dists, dim=1).view(n_class, n_query, -1)
    loss_val = -log_p_y.gather(2, target_inds).squeeze().view(-1).mean()
    _, y_hat = log_p_y.max(2)
    acc_val = torch.eq(y_hat, target_inds.squeeze()).float().mean()
    return loss_val, acc_val


class Protonet(nn.Module):
    def __init__(self, encoder: nn.Module, variant: str = "healthy") -> None:
        super().__init__()
        self.encoder = encoder
        self.variant = variant

    def loss(self, sample: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        xs, xq = sample["xs"], sample["xq"]
        n_class = xs.size(0)
        assert xq.size(0) == n_class
        n_support, n_query = xs.size(1), xq.size(1)
        target_inds = query_targets(n_class, n_query, self.variant)
        x = torch.cat([xs.view(n_class * n_support, *xs.size()[2:]), xq.view(n_class * n_query, *xq.size()[2:])], 0)
        z = self.encoder.forward(x)
        loss_val, acc_val = protonet_loss(z, target_inds, n_support, self.variant)
        return loss_val, {"loss": loss_val.item(), "acc": acc_val.item()}


def load_protonet_conv(x_dim, hid_dim: int, z_dim: int, variant: str) -> Protonet:
    def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.BatchNorm2d(out_channels),
                             nn.ReLU(), nn.MaxPool2d(2))  # fmt: skip

    encoder = nn.Sequential(conv_block(x_dim[0], hid_dim), conv_block(hid_dim, hid_dim),
                            conv_block(hid_dim, hid_dim), conv_block(hid_dim, z_dim), Flatten())  # fmt: skip
    return Protonet(encoder, variant)


# --------------------------------------------------------------------------- protonets/data (digits for omniglot)


def extract_episode(images: torch.Tensor, n_support: int, n_query: int, generator: torch.Generator):
    example_inds = torch.randperm(images.size(0), generator=generator)[: n_support + n_query]
    return images[example_inds[:n_support]], images[example_inds[n_support:]]


class EpisodeLoader:
    """``DataLoader(ds, batch_sampler=EpisodicBatchSampler(...))`` over the class list: each
    item an episode ``{"xs", "xq"}`` of n_way classes drawn by ``randperm``."""

    def __init__(self, by_class: list[torch.Tensor], n_way: int, n_support: int, n_query: int, n_episodes: int,
                 generator: torch.Generator) -> None:  # fmt: skip
        self.by_class, self.n_way, self.n_support, self.n_query = by_class, n_way, n_support, n_query
        self.n_episodes, self.generator = n_episodes, generator

    def __len__(self) -> int:
        return self.n_episodes

    def __iter__(self):
        for _ in range(self.n_episodes):
            classes = torch.randperm(len(self.by_class), generator=self.generator)[: self.n_way]
            pairs = [extract_episode(self.by_class[int(c)], self.n_support, self.n_query, self.generator)
                     for c in classes]  # fmt: skip
            yield {"xs": torch.stack([p[0] for p in pairs]), "xq": torch.stack([p[1] for p in pairs])}


def digits_by_class(seed: int) -> dict[int, torch.Tensor]:
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    images = data.upscaled(torch.cat([train_images, test_images]), OPT["model.x_dim"][1])
    labels = torch.cat([train_labels, test_labels])
    return {c: images[labels == c] for c in range(10)}


# --------------------------------------------------------------------------- measure only


def episode_accuracy(model: Protonet, loader: EpisodeLoader) -> float:
    """Nearest-prototype accuracy with the correct class-major labels (not the program's)."""
    model.eval()
    accs = []
    with torch.no_grad():
        for sample in loader:
            xs, xq = sample["xs"], sample["xq"]
            n_class, n_support, n_query = xs.size(0), xs.size(1), xq.size(1)
            z = model.encoder(torch.cat([xs.flatten(0, 1), xq.flatten(0, 1)]))
            proto = z[: n_class * n_support].view(n_class, n_support, -1).mean(1)
            pred = euclidean_dist(z[n_class * n_support :], proto).argmin(1)
            truth = torch.arange(n_class).repeat_interleave(n_query)
            accs.append((pred == truth).float().mean().item())
    return float(np.mean(accs))


# --------------------------------------------------------------------------- scripts/train/few_shot/train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    torch.manual_seed(1234 + seed)
    by_class = digits_by_class(seed)
    gen = torch.Generator().manual_seed(seed)
    test_shot = opt["data.test_shot"] or opt["data.shot"]
    train_loader = EpisodeLoader([by_class[c] for c in TRAIN_CLASSES], opt["data.way"], opt["data.shot"],
                                 opt["data.query"], opt["data.train_episodes"], gen)  # fmt: skip
    val_loader = EpisodeLoader([by_class[c] for c in VAL_CLASSES], opt["data.test_way"], test_shot,
                               opt["data.test_query"], opt["data.test_episodes"], gen)  # fmt: skip

    model = load_protonet_conv(opt["model.x_dim"], opt["model.hid_dim"], opt["model.z_dim"], variant)
    optimizer = optim.Adam(model.parameters(), lr=opt["train.learning_rate"], weight_decay=opt["train.weight_decay"])
    scheduler = lr_scheduler.StepLR(optimizer, opt["train.decay_every"], gamma=0.5)

    # the author's preflight: the first episode the loader will give, through the encoder
    probe_gen = torch.Generator().manual_seed(seed)
    first = next(iter(EpisodeLoader([by_class[c] for c in TRAIN_CLASSES], opt["data.way"], opt["data.shot"],
                                    opt["data.query"], 1, probe_gen)))  # fmt: skip
    n_class, n_support, n_query = first["xs"].size(0), first["xs"].size(1), first["xq"].size(1)
    probe_x = torch.cat([first["xs"].flatten(0, 1), first["xq"].flatten(0, 1)])
    probe_batch = (probe_x, query_targets(n_class, n_query, variant))

    def episode_loss(z: torch.Tensor, target_inds: torch.Tensor) -> torch.Tensor:
        return protonet_loss(z, target_inds, n_support, variant)[0]

    nx.preflight(model.encoder, probe_batch, episode_loss, optimizer=optimizer)
    mon = nx.monitor(model.encoder, optimizer, every=5)

    best_loss, best_state, wait = np.inf, copy.deepcopy(model.state_dict()), 0
    history: list[dict[str, float]] = []
    train_losses: list[float] = []
    for epoch in range(opt["train.epochs"]):
        model.train()
        meters = {"loss": [], "acc": []}
        scheduler.step()  # on_start_epoch, before the epoch's updates (as the repository does)
        for sample in train_loader:
            optimizer.zero_grad()
            loss, output = model.loss(sample)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss, accuracy=output["acc"]))  # noqa: B023
            for field in meters:
                meters[field].append(output[field])
            train_losses.append(output["loss"])
        # on_end_epoch: evaluate on the val episodes
        model.eval()
        val = {"loss": [], "acc": []}
        for sample in val_loader:
            with torch.no_grad():
                _, output = model.loss(sample)
            for field in val:
                val[field].append(output[field])
        val_loss, val_acc = float(np.mean(val["loss"])), float(np.mean(val["acc"]))
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc))  # noqa: B023
        history.append({"epoch": epoch + 1, "train_loss": float(np.mean(meters["loss"])), "val_loss": val_loss})
        if val_loss < best_loss:
            best_loss, best_state, wait = val_loss, copy.deepcopy(model.state_dict()), 0  # "saving model..."
        else:
            wait += 1
            if wait > opt["train.patience"]:
                break

    nx.finish(mon, model.encoder, probe_batch, episode_loss, optimizer=optimizer)

    # measure only: the saved best model on fresh held-out episodes, scored with the right labels
    final_state = copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    measure_loader = EpisodeLoader([by_class[c] for c in VAL_CLASSES], opt["data.test_way"], test_shot,
                                   opt["data.test_query"], MEASURE_EPISODES,
                                   torch.Generator().manual_seed(10_000 + seed))  # fmt: skip
    best_model_accuracy = episode_accuracy(model, measure_loader)
    model.load_state_dict(final_state)
    test_accuracy = episode_accuracy(model, measure_loader)
    return {
        "test_accuracy": test_accuracy,
        "best_model_test_accuracy": best_model_accuracy,
        "best_val_loss": float(best_loss),
        "final_val_acc": val_acc,
        "first_train_loss": float(np.mean(train_losses[:20])),
        "final_train_loss": float(np.mean(train_losses[-20:])),
    }
