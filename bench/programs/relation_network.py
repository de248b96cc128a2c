"""Port of floodsung/LearningToCompare_FSL: episodic few-shot training of a Relation Network.

Source: github.com/floodsung/LearningToCompare_FSL, ``omniglot/omniglot_train_few_shot.py``
and ``omniglot/task_generator.py`` at commit b74e6366c7e7208a9d0fc82f7bedb9e1000199e4 (the
repository's HEAD; MIT, Copyright (c) 2018 Flood Sung). Written anew from the facts of
those files; no code copied.

Kept: ``CNNEncoder``: four conv blocks (3x3 ``Conv2d``, the first two unpadded,
``BatchNorm2d(momentum=1, affine=True)``, ``ReLU``, a ``MaxPool2d(2)`` after the first two),
28x28 inputs to FEATURE_DIM x 5 x 5 maps; ``RelationNetwork``: two conv blocks (padded 3x3
conv on the concatenated 2*FEATURE_DIM channels, BN momentum 1, ReLU, MaxPool2d(2)), then
``fc1`` + ReLU and ``fc2`` + sigmoid (the relation score); ``weights_init`` (conv weights
normal(0, sqrt(2 / (k*k*out))) with zero bias, BN weight 1 bias 0, Linear normal(0, 0.01)
with the bias set to ones); per episode a task of CLASS_NUM classes, SAMPLE_NUM_PER_CLASS
support images per class in class order (``ClassBalancedSampler(shuffle=False)``) and
BATCH_NUM_PER_CLASS query images per class shuffled (``shuffle=True``), the whole episode
rotated by a ``random.choice([0, 90, 180, 270])``; the 5-shot support features
``view(CLASS_NUM, SAMPLE_NUM_PER_CLASS, FEATURE_DIM, 5, 5)`` summed over the shots; the
relation pairs ``cat`` of the support features repeated per query and the query features
repeated per class and ``transpose(0, 1)``, ``view(-1, 2*FEATURE_DIM, 5, 5)``, relations
``view(-1, CLASS_NUM)``; ``MSELoss`` against the one-hot of the (shuffled) query labels
(``scatter_``); both modules ``zero_grad``, ``backward``, ``clip_grad_norm`` 0.5 on each,
both Adam optimizers (lr 1e-3) stepped; ``StepLR(gamma=0.5)`` for each, stepped with the
episode number before the episode (``scheduler.step(episode)``, as written); the test:
CLASS_NUM x SAMPLE_NUM_PER_CLASS support and as many query images of the held-out classes,
the modules left in train mode (no ``eval()``, as published), the argmax of the relations
against the query labels.
Shrunk: scikit-learn's 8x8 digits upscaled to 28x28 (Omniglot's size) in [0, 1] instead of
Omniglot's characters, no per-dataset ``Normalize``; digits 0-4 are the meta-training
classes (so every training episode holds the same five classes, their labels permuted) and
the unseen digits 5-9 the meta-test classes; FEATURE_DIM 16 instead of 64 (so the relation
``fc1`` takes 16 instead of 64), RELATION_DIM 8 as published; BATCH_NUM_PER_CLASS 10
instead of 15; 300 episodes instead of 1,000,000, StepLR step_size 100 instead of 100,000;
one test at the end of 100 episodes instead of every 5,000 of 1,000; no model files.
Measure only: the program's own test accuracy (5-way 5-shot on the unseen digits 5-9, with
its own labels) is the metric; nothing is added.

nndx, as the author would add it: the two modules are run by one function (the encoder on
the support and query images, the pairs, the relation module), so the author wraps them in
one ``nn.Module`` (``FewShotRelation``, the two modules as children, ``forward(samples,
batches)`` -> relations) that the training loop itself calls; the preflight
``nndx.probe(wrapper, ((samples, batches), one_hot_labels), mse)`` on the first episode
(no optimizer passed: there are two, and ``probe`` takes one), ``nndx.Monitor(wrapper,
[feature_encoder_optim, relation_network_optim])`` around the loop, every episode's loss
logged, and ``nndx.probe(..., monitor=mon)`` + ``nndx.diagnose`` after training.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "relation_network"
SOURCE = Source("floodsung/LearningToCompare_FSL", "omniglot/omniglot_train_few_shot.py",
                "b74e6366c7e7208a9d0fc82f7bedb9e1000199e4", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: digits, 5-way 5-shot, width 16)"),
        Variant(
            "query_labels_unshuffled",
            "the one-hot targets built from the class-ordered labels (arange(CLASS_NUM).repeat_interleave("
            "BATCH_NUM_PER_CLASS)) while the query images come shuffled (shuffle=True): targets no longer "
            "match the query images",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/amanbasu/ECG-Authentication/issues/3",
             "https://github.com/Luvata/CS330-Stanford-Deep-Multi-Task-and-Meta-Learning/issues/3",
             "https://github.com/jmkim0309/fewshot-egnn/issues/20"),
            Measure("test_accuracy", "5-way 5-shot test accuracy on the unseen digits at least 0.1 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "support_wrong_view",
            "sample_features.view(SAMPLE_NUM_PER_CLASS, CLASS_NUM, ...).sum(0): the class-ordered support "
            "features reshaped shot-major, so each class's summed feature mixes one shot of every class",
            (C.WRONG_RESHAPE,),
            ("https://github.com/hieuvmphan/REMINDER/issues/6",
             "https://github.com/Sha-Lab/FEAT/issues/71",
             "https://github.com/orobix/Prototypical-Networks-for-Few-shot-Learning-PyTorch/issues/23"),
            Measure("test_accuracy", "5-way 5-shot test accuracy on the unseen digits at least 0.1 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

FEATURE_DIM, RELATION_DIM, CLASS_NUM, SAMPLE_NUM_PER_CLASS, BATCH_NUM_PER_CLASS = 16, 8, 5, 5, 10
EPISODE, TEST_EPISODE, LEARNING_RATE, STEP_SIZE = 300, 100, 0.001, 100
TRAIN_CLASSES, TEST_CLASSES = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)


# --------------------------------------------------------------------------- the networks


def conv_block(cin: int, cout: int, padding: int, pool: bool) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel_size=3, padding=padding), nn.BatchNorm2d(cout, momentum=1, affine=True),
              nn.ReLU()]  # fmt: skip
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class CNNEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = conv_block(1, FEATURE_DIM, 0, True)
        self.layer2 = conv_block(FEATURE_DIM, FEATURE_DIM, 0, True)
        self.layer3 = conv_block(FEATURE_DIM, FEATURE_DIM, 1, False)
        self.layer4 = conv_block(FEATURE_DIM, FEATURE_DIM, 1, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (n, FEATURE_DIM, 5, 5)


class RelationNetwork(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.layer1 = conv_block(2 * FEATURE_DIM, FEATURE_DIM, 1, True)
        self.layer2 = conv_block(FEATURE_DIM, FEATURE_DIM, 1, True)
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer2(self.layer1(x))
        out = out.view(out.size(0), -1)
        out = F.relu(self.fc1(out))
        return torch.sigmoid(self.fc2(out))


def weights_init(m: nn.Module) -> None:
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
        m.weight.data.normal_(0, math.sqrt(2.0 / n))
        if m.bias is not None:
            m.bias.data.zero_()
    elif name.find("BatchNorm") != -1:
        m.weight.data.fill_(1)
        m.bias.data.zero_()
    elif name.find("Linear") != -1:
        m.weight.data.normal_(0, 0.01)
        m.bias.data = torch.ones(m.bias.data.size())


class FewShotRelation(nn.Module):
    """The author's wrapper for nndx: the episode's forward through both modules."""

    def __init__(self, feature_encoder: CNNEncoder, relation_network: RelationNetwork, variant: str) -> None:
        super().__init__()
        self.feature_encoder, self.relation_network, self.variant = feature_encoder, relation_network, variant

    def forward(self, samples: torch.Tensor, batches: torch.Tensor) -> torch.Tensor:
        sample_features = self.feature_encoder(samples)  # (CLASS_NUM*SAMPLE_NUM, F, 5, 5), class order
        if self.variant == "support_wrong_view":
            sample_features = sample_features.view(SAMPLE_NUM_PER_CLASS, CLASS_NUM, FEATURE_DIM, 5, 5)
            sample_features = torch.sum(sample_features, 0).squeeze(0)
        else:
            sample_features = sample_features.view(CLASS_NUM, SAMPLE_NUM_PER_CLASS, FEATURE_DIM, 5, 5)
            sample_features = torch.sum(sample_features, 1).squeeze(1)
        batch_features = self.feature_encoder(batches)
        n_query = batch_features.size(0)
        sample_features_ext = sample_features.unsqueeze(0).repeat(n_query, 1, 1, 1, 1)
        batch_features_ext = batch_features.unsqueeze(0).repeat(CLASS_NUM, 1, 1, 1, 1)
        batch_features_ext = torch.transpose(batch_features_ext, 0, 1)
        relation_pairs = torch.cat((sample_features_ext, batch_features_ext), 2).view(-1, FEATURE_DIM * 2, 5, 5)
        return self.relation_network(relation_pairs).view(-1, CLASS_NUM)


# --------------------------------------------------------------------------- task_generator.py (digits)


def digits_by_class(seed: int) -> dict[int, torch.Tensor]:
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    images = data.upscaled(torch.cat([train_images, test_images]), 28)
    labels = torch.cat([train_labels, test_labels])
    return {c: images[labels == c] for c in range(10)}


def task(by_class: dict[int, torch.Tensor], folders: tuple[int, ...], train_num: int, test_num: int,
         rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``OmniglotTask`` + the two loaders: (samples, sample_labels) in class order, (batches,
    batch_labels) shuffled; the episode rotated by one of 0/90/180/270 degrees."""
    degrees = rng.choice([0, 90, 180, 270])
    class_folders = rng.sample(list(folders), CLASS_NUM)
    samples, sample_labels, batches, batch_labels = [], [], [], []
    for label, c in enumerate(class_folders):
        pool = by_class[c]
        order = rng.sample(range(pool.size(0)), pool.size(0))
        samples.append(pool[order[:train_num]])
        batches.append(pool[order[train_num : train_num + test_num]])
        sample_labels += [label] * train_num
        batch_labels += [label] * test_num
    samples_t, batches_t = torch.cat(samples), torch.cat(batches)
    batch_labels_t = torch.tensor(batch_labels)
    shuffle = torch.tensor(rng.sample(range(batches_t.size(0)), batches_t.size(0)))
    batches_t, batch_labels_t = batches_t[shuffle], batch_labels_t[shuffle]
    k = degrees // 90
    return (torch.rot90(samples_t, k, (2, 3)), torch.tensor(sample_labels), torch.rot90(batches_t, k, (2, 3)),
            batch_labels_t)  # fmt: skip


def one_hot(labels: torch.Tensor) -> torch.Tensor:
    return torch.zeros(labels.size(0), CLASS_NUM).scatter_(1, labels.view(-1, 1), 1)


# --------------------------------------------------------------------------- omniglot_train_few_shot.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = random.Random(1 + seed)
    by_class = digits_by_class(seed)

    feature_encoder = CNNEncoder()
    relation_network = RelationNetwork(FEATURE_DIM, RELATION_DIM)
    feature_encoder.apply(weights_init)
    relation_network.apply(weights_init)
    model = FewShotRelation(feature_encoder, relation_network, variant)

    feature_encoder_optim = torch.optim.Adam(feature_encoder.parameters(), lr=LEARNING_RATE)
    feature_encoder_scheduler = StepLR(feature_encoder_optim, step_size=STEP_SIZE, gamma=0.5)
    relation_network_optim = torch.optim.Adam(relation_network.parameters(), lr=LEARNING_RATE)
    relation_network_scheduler = StepLR(relation_network_optim, step_size=STEP_SIZE, gamma=0.5)
    mse = nn.MSELoss()

    def targets_for(batch_labels: torch.Tensor) -> torch.Tensor:
        if variant == "query_labels_unshuffled":
            return one_hot(torch.arange(CLASS_NUM).repeat_interleave(BATCH_NUM_PER_CLASS))
        return one_hot(batch_labels)

    # the author's preflight: the first episode the loop will draw (a copy of the generator's state)
    first = task(by_class, TRAIN_CLASSES, SAMPLE_NUM_PER_CLASS, BATCH_NUM_PER_CLASS, random.Random(1 + seed))
    probe_batch = ((first[0], first[2]), targets_for(first[3]))
    nx.preflight(model, probe_batch, mse)
    mon = nx.monitor(model, [feature_encoder_optim, relation_network_optim], every=5)

    losses: list[float] = []
    for episode in range(EPISODE):
        feature_encoder_scheduler.step(episode)
        relation_network_scheduler.step(episode)
        samples, _sample_labels, batches, batch_labels = task(by_class, TRAIN_CLASSES, SAMPLE_NUM_PER_CLASS,
                                                              BATCH_NUM_PER_CLASS, rng)  # fmt: skip
        relations = model(samples, batches)
        one_hot_labels = targets_for(batch_labels)
        loss = mse(relations, one_hot_labels)

        feature_encoder.zero_grad()
        relation_network.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(feature_encoder.parameters(), 0.5)
        torch.nn.utils.clip_grad_norm_(relation_network.parameters(), 0.5)
        feature_encoder_optim.step()
        relation_network_optim.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        losses.append(loss.item())

    nx.finish(mon, model, probe_batch, mse)

    # the test, as the script runs it: unseen classes, modules left in train mode
    test_rng = random.Random(10_000 + seed)
    total_rewards = 0
    with torch.no_grad():
        for _ in range(TEST_EPISODE):
            sample_images, _, test_images, test_labels = task(by_class, TEST_CLASSES, SAMPLE_NUM_PER_CLASS,
                                                              SAMPLE_NUM_PER_CLASS, test_rng)  # fmt: skip
            relations = model(sample_images, test_images)
            _, predict_labels = torch.max(relations.data, 1)
            total_rewards += int((predict_labels == test_labels).sum())
    test_accuracy = total_rewards / 1.0 / CLASS_NUM / SAMPLE_NUM_PER_CLASS / TEST_EPISODE
    return {
        "test_accuracy": test_accuracy,
        "first_loss": float(np.mean(losses[:20])),
        "final_loss": float(np.mean(losses[-20:])),
    }
