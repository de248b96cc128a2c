"""Port of knowledge-distillation-pytorch: a 5-layer CNN student taught by a bigger teacher.

Source: github.com/peterliht/knowledge-distillation-pytorch, ``train.py`` (``train_kd``,
``train_and_evaluate_kd``, the ``cnn_distill`` branch of ``__main__``), ``model/net.py``
(``Net``, ``loss_fn``, ``loss_fn_kd``) and ``evaluate.py`` (``evaluate_kd``) at commit
b1e4b6acb8d4e138ad12ba1aac22d5da42a85c10 (MIT, Copyright (c) 2018 Haitong Li).
Written anew from the facts of those files; no code copied.

Kept: ``Net(params)``: three ``Conv2d(k=3, padding=1)`` + ``BatchNorm2d`` blocks of
``num_channels``, ``2*num_channels``, ``4*num_channels`` channels, each followed by
``F.max_pool2d(., 2)`` then ``F.relu`` (that order), ``s.view(-1, 4*4*4*num_channels)``,
``fc1`` + ``BatchNorm1d`` + ``F.relu`` + ``F.dropout(p=dropout_rate, training=self.training)``,
``fc2`` to 10 raw scores; ``loss_fn_kd`` = ``nn.KLDivLoss()`` (default reduction) of
``F.log_softmax(outputs/T)`` against ``F.softmax(teacher_outputs/T)`` times ``alpha*T*T`` plus
``F.cross_entropy(outputs, labels) * (1 - alpha)``; the ``cnn_distill`` params (alpha 0.9,
temperature 20, Adam lr 1e-3, dropout 0.5); ``StepLR(step_size=100, gamma=0.2)`` stepped at
the start of every epoch (before training, as the author wrote it); ``train_kd``:
``model.train()``, ``teacher_model.eval()``, per batch the student's forward, the teacher's
under ``torch.no_grad()``, the KD loss, ``zero_grad``/``backward``/``step``, the running
average of the loss and the batch accuracy every ``save_summary_steps``; ``evaluate_kd``
after each epoch under ``model.eval()`` (accuracy only: it forces the loss to 0); the
teacher built fresh, wrapped in ``nn.DataParallel`` (as the author does for the wrn/densenet/
resnext teachers, whose checkpoints were saved from ``DataParallel``) and its weights loaded
from the checkpoint (``load_checkpoint``: ``load_state_dict``).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 dev) upscaled to 32x32 over 3
channels, normalised with the author's CIFAR-10 mean/std, no augmentation (the author's
``"augmentation": "no"``); the teacher is not a pretrained ResNet-18 checkpoint but the
same ``Net`` with ``num_channels`` 16, trained first here with the author's non-KD
``train`` (``loss_fn``, Adam 1e-3) for 3 epochs and handed over through a
``state_dict`` as the checkpoint would be; the student ``num_channels`` 4 instead of 32;
batch 32 instead of 128; 6 epochs instead of 30; ``save_summary_steps`` 10.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training
batch, whose targets are ``(labels, teacher_outputs)`` and whose loss is ``loss_fn_kd``
with the params bound, with the data splits; ``nndx.Monitor`` around
``train_and_evaluate_kd`` on the student and its optimizer, each batch's KD loss logged
(with the batch accuracy on summary steps); ``evaluate_kd`` has no loss to log (forced
to 0), so no validation loss is logged; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. The teacher's own training stands in for a downloaded checkpoint and
is not watched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "distillation"
SOURCE = Source("peterliht/knowledge-distillation-pytorch", "train.py",
                "b1e4b6acb8d4e138ad12ba1aac22d5da42a85c10", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the cnn_distill experiment as published"),
        Variant(
            "kl_on_probabilities",
            "loss_fn_kd gives nn.KLDivLoss F.softmax(outputs/T) (probabilities) instead of F.log_softmax: the KD "
            "term no longer measures a divergence (it is minimised by piling the student's mass anywhere the "
            "teacher's is largest, and goes negative)",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/microsoft/ProDA/issues/20", "https://github.com/microsoft/ProDA/issues/43",
             "https://github.com/sebastian-hofstaetter/matchmaker/issues/18"),
            Measure("dev_kl_at_T", "KL(teacher || student) of the dev outputs softened at T=20 (what the KD term "
                    "should minimise), 1.1x the healthy run's or more: 1.14/1.13/1.17x on seeds 0-2 (the logged loss "
                    "turns negative, about -86)", lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
        Variant(
            "teacher_not_loaded",
            "the teacher's checkpoint (saved from nn.DataParallel, keys 'module.*') loaded into the bare Net with "
            "load_state_dict(strict=False) instead of through nn.DataParallel: no key matches, nothing is loaded, "
            "and the student is distilled from a randomly initialised teacher",
            (C.LABEL_NOISE,),
            ("https://github.com/torchgeo/torchgeo/issues/4036",
             "https://github.com/yangyiliu21/ntire2023_ITBdehaze/issues/8",
             "https://github.com/stefanopini/simple-HRNet/issues/79"),
            Measure("dev_kl_to_teacher", "KL(teacher as saved || student) on the dev set at T=1, 1.5x the healthy "
                    "run's or more: 2.0/1.7/1.7x on seeds 0-2 (dev accuracy unchanged: at T=20 a random teacher's "
                    "targets are near uniform and the 0.1-weighted cross-entropy still carries the labels)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)  # the author's CIFAR-10 Normalize


class Params:
    """The author's params.json, as attributes (cnn_distill, shrunk)."""

    def __init__(self, **entries) -> None:
        self.__dict__.update(entries)


STUDENT = dict(model_version="cnn_distill", alpha=0.9, temperature=20, learning_rate=1e-3, batch_size=32,
               num_epochs=6, dropout_rate=0.5, num_channels=4, save_summary_steps=10)  # fmt: skip
TEACHER = dict(model_version="cnn", learning_rate=1e-3, batch_size=32, num_epochs=3, dropout_rate=0.5,
               num_channels=16)  # fmt: skip


class Net(nn.Module):
    def __init__(self, params: Params) -> None:
        super().__init__()
        self.num_channels = params.num_channels
        self.conv1 = nn.Conv2d(3, self.num_channels, 3, stride=1, padding=1)
        self.bn1 = nn.BatchNorm2d(self.num_channels)
        self.conv2 = nn.Conv2d(self.num_channels, self.num_channels * 2, 3, stride=1, padding=1)
        self.bn2 = nn.BatchNorm2d(self.num_channels * 2)
        self.conv3 = nn.Conv2d(self.num_channels * 2, self.num_channels * 4, 3, stride=1, padding=1)
        self.bn3 = nn.BatchNorm2d(self.num_channels * 4)
        self.fc1 = nn.Linear(4 * 4 * self.num_channels * 4, self.num_channels * 4)
        self.fcbn1 = nn.BatchNorm1d(self.num_channels * 4)
        self.fc2 = nn.Linear(self.num_channels * 4, 10)
        self.dropout_rate = params.dropout_rate

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        s = F.relu(F.max_pool2d(self.bn1(self.conv1(s)), 2))  # 32 -> 16
        s = F.relu(F.max_pool2d(self.bn2(self.conv2(s)), 2))  # 16 -> 8
        s = F.relu(F.max_pool2d(self.bn3(self.conv3(s)), 2))  # 8 -> 4
        s = s.view(-1, 4 * 4 * self.num_channels * 4)
        s = F.dropout(F.relu(self.fcbn1(self.fc1(s))), p=self.dropout_rate, training=self.training)
        return self.fc2(s)


def loss_fn(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.CrossEntropyLoss()(outputs, labels)


def make_loss_fn_kd(variant: str):
    student_side = F.softmax if variant == "kl_on_probabilities" else F.log_softmax

    def loss_fn_kd(outputs, labels, teacher_outputs, params):
        alpha, T = params.alpha, params.temperature
        kd = nn.KLDivLoss()(student_side(outputs / T, dim=1), F.softmax(teacher_outputs / T, dim=1))
        return kd * (alpha * T * T) + F.cross_entropy(outputs, labels) * (1.0 - alpha)

    return loss_fn_kd


def accuracy(outputs: torch.Tensor, labels: torch.Tensor) -> float:
    return (outputs.argmax(dim=1) == labels).float().mean().item()


def evaluate(model: nn.Module, dataloader) -> float:
    """evaluate / evaluate_kd: accuracy over the dev batches, in eval mode (loss forced to 0)."""
    model.eval()
    with torch.no_grad():
        accs = [accuracy(model(x), y) for x, y in dataloader]
    return sum(accs) / len(accs)


def images(raw: torch.Tensor) -> torch.Tensor:
    x = data.upscaled(raw, 32).repeat(1, 3, 1, 1)
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


_TEACHERS: dict[int, dict[str, torch.Tensor]] = {}  # the "checkpoint" per seed (trained once per process)


def pretrained_teacher(seed: int, train_dl) -> dict[str, torch.Tensor]:
    """The author's non-KD ``train_and_evaluate`` for the teacher, saved as a state_dict."""
    if seed not in _TEACHERS:
        params = Params(**TEACHER)
        torch.manual_seed(230 + seed)
        teacher = Net(params)
        optimizer = optim.Adam(teacher.parameters(), lr=params.learning_rate)
        for _epoch in range(params.num_epochs):
            teacher.train()
            for train_batch, labels_batch in train_dl:
                output_batch = teacher(train_batch)
                loss = loss_fn(output_batch, labels_batch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        # the author's teachers were trained and saved wrapped in nn.DataParallel: keys "module.*"
        _TEACHERS[seed] = {k: v.clone() for k, v in nn.DataParallel(teacher).state_dict().items()}
    return _TEACHERS[seed]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    train_images, train_labels, dev_images, dev_labels = data.digit_images(seed=seed)
    x_train, x_dev = images(train_images), images(dev_images)
    params = Params(**STUDENT)
    generator = torch.Generator().manual_seed(seed)
    train_dl = DataLoader(TensorDataset(x_train, train_labels), batch_size=params.batch_size, shuffle=True,
                          generator=generator)  # fmt: skip
    dev_dl = DataLoader(TensorDataset(x_dev, dev_labels), batch_size=params.batch_size, shuffle=False)
    checkpoint = pretrained_teacher(seed, train_dl)

    torch.manual_seed(230 + seed)  # the author's random.seed(230) / torch.manual_seed(230)
    generator.manual_seed(seed + 1)
    model = Net(params)
    optimizer = optim.Adam(model.parameters(), lr=params.learning_rate)
    loss_fn_kd = make_loss_fn_kd(variant)
    if variant == "teacher_not_loaded":  # "no DataParallel on one device": no key matches, strict=False hides it
        teacher_model = Net(Params(**TEACHER))
        teacher_model.load_state_dict(checkpoint, strict=False)
    else:  # the author: teacher_model = nn.DataParallel(teacher_model); utils.load_checkpoint(...)
        teacher_model = nn.DataParallel(Net(Params(**TEACHER)))
        teacher_model.load_state_dict(checkpoint)

    first_x, first_y = x_train[: params.batch_size], train_labels[: params.batch_size]
    with torch.no_grad():
        teacher_model.eval()
        first_teacher = teacher_model(first_x)
        teacher_model.train()  # as loaded: a fresh module is in train mode
    first_batch = (first_x, (first_y, first_teacher))

    def kd_loss(outputs, targets):
        return loss_fn_kd(outputs, targets[0], targets[1], params)

    splits = (x_train, train_labels, x_dev, dev_labels)
    nx.preflight(model, first_batch, kd_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    # train_and_evaluate_kd
    scheduler = StepLR(optimizer, step_size=100, gamma=0.2)
    dev_accs: list[float] = []
    loss_avg: list[float] = []
    for _epoch in range(params.num_epochs):
        scheduler.step()
        # train_kd
        model.train()
        teacher_model.eval()
        for i, (train_batch, labels_batch) in enumerate(train_dl):
            output_batch = model(train_batch)
            with torch.no_grad():
                output_teacher_batch = teacher_model(train_batch)
            loss = loss_fn_kd(output_batch, labels_batch, output_teacher_batch, params)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % params.save_summary_steps == 0:
                mon.log(loss, accuracy=accuracy(output_batch.detach(), labels_batch))
            else:
                mon.log(loss)
            loss_avg.append(loss.item())
        dev_accs.append(evaluate(model, dev_dl))

    nx.finish(mon, model, first_batch, kd_loss, optimizer=optimizer, data=splits)

    # measure only: the student against the teacher as loaded from its checkpoint
    reference = nn.DataParallel(Net(Params(**TEACHER)))
    reference.load_state_dict(checkpoint)
    reference.eval()
    model.eval()
    with torch.no_grad():
        s_log = F.log_softmax(model(x_dev), dim=1)
        t_prob = F.softmax(reference(x_dev), dim=1)
        kl = F.kl_div(s_log, t_prob, reduction="batchmean").item()
        T = params.temperature
        kl_t = F.kl_div(F.log_softmax(model(x_dev) / T, dim=1), F.softmax(reference(x_dev) / T, dim=1),
                        reduction="batchmean").item()
        teacher_acc = accuracy(reference(x_dev), dev_labels)
    return {"dev_accuracy": dev_accs[-1], "dev_kl_to_teacher": kl, "dev_kl_at_T": kl_t, "teacher_dev_accuracy": teacher_acc,
            "last_loss": sum(loss_avg[-10:]) / 10}  # fmt: skip
