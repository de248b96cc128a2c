"""Port of shaoxiongji/federated-learning: FedAvg. A global CNN is copied to a fraction of the
clients every round; each client trains it for a few local epochs with its own SGD on its
own shard of the data; the server averages the clients' ``state_dict``s into the global
model; the global model's test accuracy is the result.

Source: github.com/shaoxiongji/federated-learning, ``main_fed.py``, ``models/Update.py``,
``models/Fed.py``, ``models/Nets.py``, ``models/test.py`` and ``utils/sampling.py`` at commit
5a9da1acd210aef030ff3841665c6d0cc0c8be23 (MIT, Copyright (c) 2019 Shaoxiong Ji). Written anew
from the facts of those files; no code copied.

Kept: ``CNNMnist`` (``Conv2d(1, 10, 5)``, max-pool 2, ReLU; ``Conv2d(10, 20, 5)``,
``Dropout2d``, max-pool 2, ReLU; flatten to 320; ``Linear(320, 50)``, ReLU, ``F.dropout`` with
``training=self.training``; ``Linear(50, 10)``), built once as ``net_glob`` and put in
``train()`` mode; images through ``ToTensor`` + ``Normalize((0.1307,), (0.3081,))``;
``mnist_iid`` (each user draws ``len(train) // num_users`` indices without replacement from the
ones left, as a set); ``DatasetSplit`` (a dataset view that maps item ``i`` to the user's
``idxs[i]``); ``LocalUpdate`` (``nn.CrossEntropyLoss``, a shuffling ``DataLoader`` of
``local_bs`` over the user's split; ``train(net)``: ``net.train()``, a fresh
``SGD(net.parameters(), lr, momentum)``, ``local_ep`` epochs of ``net.zero_grad()``, forward,
loss, ``backward``, ``optimizer.step()``; returns ``net.state_dict()`` and the mean epoch loss);
the round loop of ``main_fed.py`` (``m = max(int(frac * num_users), 1)`` users drawn by
``np.random.choice`` without replacement, each trained on ``copy.deepcopy(net_glob)``, the
weights and losses deep-copied into ``w_locals``/``loss_locals``, ``FedAvg`` = the unweighted
mean of the state dicts key by key, ``net_glob.load_state_dict(w_glob)``, the average local
loss per round); ``test_img`` after training (``net_glob.eval()``, batches of ``bs``, summed
cross-entropy over the set, argmax accuracy in percent) on the train and the test set.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360 test)
instead of MNIST; 10 users instead of 100 with ``frac`` 0.3 (3 users a round instead of 10),
15 rounds instead of 10-50; ``local_ep`` 5, ``local_bs`` 10, ``lr`` 0.01, ``momentum`` 0.5
and ``bs`` 128 as the defaults; the iid split of the README's command
(``--iid --model cnn``); CPU; no plot.
Measure only (not in the program): nothing; the variants are measured by ``test_img``'s test
accuracy and test loss of the global model.

nndx, as the author would add it: the only training loop is a client's local update, so each
``LocalUpdate.train`` is wrapped in ``nndx.Monitor(net, optimizer)`` (the client's copy of the
global model and the SGD that steps it), each batch's loss logged; a client's Monitor is
closed and diagnosed from its own report once the client has returned; a preflight
``nndx.probe`` of ``net_glob`` before the first round on the first batch of user 0's loader
with the ``CrossEntropyLoss``, an SGD built as a client builds it and the train/test sets as
``data``; the last client's Monitor is folded into ``nndx.probe(..., monitor=mon)`` on the
same batch as the preflight; the author reads them all, ranked together.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fedavg"
SOURCE = Source("shaoxiongji/federated-learning", "main_fed.py", "5a9da1acd210aef030ff3841665c6d0cc0c8be23", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 28x28 digits, 10 iid users, 3 a round, 15 rounds)"),
        Variant(
            "optimizer_over_global_model",
            "the client's SGD is built over net_glob.parameters() while the client trains its deepcopy of net_glob: "
            "the copy's gradients are computed but no optimizer steps them, so every client returns the global "
            "weights unchanged and FedAvg never moves the model",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/OpenMined/PySyft/issues/2207",
             "https://github.com/AshwinRJ/Federated-Learning-PyTorch/issues/41",
             "https://github.com/OpenMined/PySyft/pull/2648"),
            Measure("test_acc", "test accuracy of the global model at least 30 points below the healthy run's: "
                    "8.6 against 95.0 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "split_ignores_user_idxs",
            "DatasetSplit.__getitem__ reads self.dataset[item] instead of self.dataset[self.idxs[item]]: every "
            "user trains on the same first len(idxs) samples of the train set, so nine tenths of the data never "
            "reach any client",
            (C.SILENT_DATA_LOSS, C.DUPLICATE_SAMPLES),
            ("https://github.com/zenghui9977/FAFI_ICML25/issues/1",
             "https://github.com/AshwinRJ/Federated-Learning-PyTorch/issues/44",
             "https://github.com/FedML-AI/FedML/issues/45"),
            Measure("test_loss", "test loss of the global model at least 1.4x the healthy run's: 0.27/0.37/0.35 "
                    "against 0.17/0.12/0.15 healthy on seeds 0/1/2 (test accuracy 91.9/91.4/92.2 against "
                    "95.0/96.1/94.4)", lambda healthy, buggy: not buggy < 1.4 * healthy),
        ),
    )
}

ARGS = {"epochs": 15, "num_users": 10, "frac": 0.3, "local_ep": 5, "local_bs": 10, "bs": 128, "lr": 0.01,
        "momentum": 0.5, "num_channels": 1, "num_classes": 10}  # fmt: skip
SIDE = 28


# --------------------------------------------------------------------------- models/Nets.py


class CNNMnist(nn.Module):
    def __init__(self, num_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(num_channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, x.shape[1] * x.shape[2] * x.shape[3])
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return self.fc2(x)


# --------------------------------------------------------------------------- utils/sampling.py


def mnist_iid(n_items: int, num_users: int) -> dict[int, set[int]]:
    num_items = int(n_items / num_users)
    dict_users, all_idxs = {}, list(range(n_items))
    for i in range(num_users):
        dict_users[i] = set(np.random.choice(all_idxs, num_items, replace=False).tolist())
        all_idxs = list(set(all_idxs) - dict_users[i])
    return dict_users


# --------------------------------------------------------------------------- models/Fed.py


def FedAvg(w: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    w_avg = copy.deepcopy(w[0])
    for k in w_avg.keys():
        for i in range(1, len(w)):
            w_avg[k] += w[i][k]
        w_avg[k] = torch.div(w_avg[k], len(w))
    return w_avg


# --------------------------------------------------------------------------- models/test.py


def test_img(net_g: nn.Module, datatest: Dataset, bs: int) -> tuple[float, float]:
    net_g.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in DataLoader(datatest, batch_size=bs):
            log_probs = net_g(data)
            test_loss += F.cross_entropy(log_probs, target, reduction="sum").item()
            y_pred = log_probs.max(1, keepdim=True)[1]
            correct += y_pred.eq(target.view_as(y_pred)).long().sum().item()
    n = len(datatest)
    return 100.0 * correct / n, test_loss / n


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    ignore_idxs = variant == "split_ignores_user_idxs"
    optimizer_on_global = variant == "optimizer_over_global_model"

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train = (digits.upscaled(tr_raw, SIDE) - 0.1307) / 0.3081  # ToTensor + Normalize((0.1307,), (0.3081,))
    x_test = (digits.upscaled(te_raw, SIDE) - 0.1307) / 0.3081
    dataset_train, dataset_test = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    dict_users = mnist_iid(len(dataset_train), args["num_users"])

    # models/Update.py
    class DatasetSplit(Dataset):
        def __init__(self, dataset: Dataset, idxs) -> None:
            self.dataset, self.idxs = dataset, list(idxs)

        def __len__(self) -> int:
            return len(self.idxs)

        def __getitem__(self, item: int):
            image, label = self.dataset[item] if ignore_idxs else self.dataset[self.idxs[item]]
            return image, label

    class LocalUpdate:
        def __init__(self, dataset: Dataset, idxs) -> None:
            self.loss_func = nn.CrossEntropyLoss()
            self.ldr_train = DataLoader(DatasetSplit(dataset, idxs), batch_size=args["local_bs"], shuffle=True)

        def train(self, net: nn.Module) -> tuple[dict[str, torch.Tensor], float]:
            net.train()
            params = net_glob.parameters() if optimizer_on_global else net.parameters()
            optimizer = torch.optim.SGD(params, lr=args["lr"], momentum=args["momentum"])
            mon = nx.monitor(net, optimizer, every=5)
            epoch_loss = []
            for _ in range(args["local_ep"]):
                batch_loss = []
                for images, labels in self.ldr_train:
                    net.zero_grad()
                    log_probs = net(images)
                    loss = self.loss_func(log_probs, labels)
                    loss.backward()
                    optimizer.step()
                    nx.timed(lambda: mon.log(loss))
                    batch_loss.append(loss.item())
                epoch_loss.append(sum(batch_loss) / len(batch_loss))
            self.watched = (mon, net, optimizer)
            return net.state_dict(), sum(epoch_loss) / len(epoch_loss)

    # main_fed.py
    net_glob = CNNMnist(args["num_channels"], args["num_classes"])
    net_glob.train()
    w_glob = net_glob.state_dict()

    probe_loader = LocalUpdate(dataset_train, dict_users[0]).ldr_train
    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_batch = next(iter(probe_loader))
    probe_opt = torch.optim.SGD(net_glob.parameters(), lr=args["lr"], momentum=args["momentum"])
    splits = (x_train, tr_y, x_test, te_y)
    nx.preflight(net_glob, probe_batch, nn.CrossEntropyLoss(), optimizer=probe_opt, data=splits)

    loss_train = []
    last = None
    for _ in range(args["epochs"]):
        loss_locals, w_locals = [], []
        m = max(int(args["frac"] * args["num_users"]), 1)
        idxs_users = np.random.choice(range(args["num_users"]), m, replace=False)
        for idx in idxs_users:
            local = LocalUpdate(dataset_train, dict_users[idx])
            w, loss = local.train(net=copy.deepcopy(net_glob))
            w_locals.append(copy.deepcopy(w))
            loss_locals.append(copy.deepcopy(loss))
            if last is not None:  # the client before: its Monitor closed and diagnosed on its own
                nx.finish(last[0])
            last = local.watched
        w_glob = FedAvg(w_locals)
        net_glob.load_state_dict(w_glob)
        loss_train.append(sum(loss_locals) / len(loss_locals))

    last_mon, last_net, last_opt = last
    nx.finish(last_mon, last_net, probe_batch, nn.CrossEntropyLoss(), optimizer=last_opt, data=splits)

    net_glob.eval()
    acc_train, loss_tr = test_img(net_glob, dataset_train, args["bs"])
    acc_test, loss_test = test_img(net_glob, dataset_test, args["bs"])
    return {"test_acc": acc_test, "test_loss": loss_test, "train_acc": acc_train, "train_loss": loss_tr,
            "last_round_local_loss": loss_train[-1], "first_round_local_loss": loss_train[0]}  # fmt: skip
