"""Port of Atcold/NYU-DLSP20 ``06-convnet.ipynb``: a small fully connected net (``FC2Layer``) and a
ConvNet (``CNN``) with about the same number of parameters, both ending in log-softmax and
trained with ``F.nll_loss`` by SGD with momentum 0.5, first on the images and then on the
same images with their pixels permuted by one fixed random permutation.

Source: github.com/Atcold/NYU-DLSP20, ``06-convnet.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo Canziani). Written anew
from the facts of the notebook; no code copied.

Kept: ``FC2Layer(input_size, n_hidden, output_size)`` (``x.view(-1, input_size)``,
``Linear -> ReLU -> Linear -> ReLU -> Linear -> LogSoftmax(dim=1)``, ``n_hidden`` 8);
``CNN(input_size, n_feature, output_size)`` (``Conv2d(1, n_feature, 5)``, ReLU, max-pool 2,
``Conv2d(n_feature, n_feature, 5)``, ReLU, max-pool 2, ``view(-1, n_feature*4*4)``,
``Linear(n_feature*16, 50)``, ReLU, ``Linear(50, 10)``, ``F.log_softmax(dim=1)``, ``n_features``
6); images through ``ToTensor`` + ``Normalize((0.1307,), (0.3081,))``; a shuffling train loader
of batch 64 and a shuffling test loader of batch 1000; the notebook's ``train(epoch, model,
perm)`` (``model.train()``, per batch: flatten to 784, index the columns by ``perm``, view back
to ``(-1, 1, 28, 28)``, the global ``optimizer``'s ``zero_grad``, ``F.nll_loss``, ``backward``,
``step``, a print every 100 batches) and ``test(model, perm)`` (``model.eval()``, the same
permutation, summed ``nll_loss``, argmax accuracy in percent appended to ``accuracy_list``); the
four cells in order: FC on images, CNN on images, ``perm = torch.randperm(784)``, CNN on permuted
pixels, FC on permuted pixels, each building its model and then its global
``optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)``.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360 test)
instead of MNIST; 15 epochs per cell instead of 1 (the digits set has 1/40 of MNIST's
images); CPU; no plots.
Measure only (not in the program): nothing; the variants are measured by ``test``'s
accuracies (``accuracy_list``).

nndx, as the author would add it after reading the README: every cell trains its own model,
so each cell gets a preflight ``nndx.probe(model, batch, F.nll_loss, optimizer=optimizer,
data=...)`` on the cell's first training batch (permuted as ``train`` permutes it) with the
train/test tensors as ``data``, ``nndx.Monitor(model, optimizer, every=10)`` around the cell's
epochs (the loss logged every batch inside ``train``, where the notebook prints), and after
training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``; the author
reads the four cells' diagnoses ranked together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_convnet"
SOURCE = Source("Atcold/NYU-DLSP20", "06-convnet.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 upsampled digits, 15 epochs a cell)"),
        Variant(
            "softmax_into_nll_loss",
            "CNN.forward ends with F.softmax(x, dim=1) instead of F.log_softmax(x, dim=1) while the loss stays "
            "F.nll_loss: the loss is -p[target], bounded in [-1, 0], with vanishing gradients near 0 and 1",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://forums.fast.ai/t/05-pet-breeds-understanding-nll-loss-function/84873",),
            Measure("cnn_image_acc", "CNN test accuracy on the images at least 20 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
        Variant(
            "optimizer_from_fc_cell",
            "the CNN cell builds model_cnn but its optimizer line still reads "
            "optim.SGD(model_fnn.parameters(), ...) (copied from the FC cell): train(epoch, model_cnn) steps "
            "the FC net's parameters, the CNN's gradients are computed and never applied",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/spro/practical-pytorch/issues/9",
             "https://github.com/pytorch/pytorch/issues/14467"),
            Measure("cnn_image_acc", "CNN test accuracy on the images at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

input_size = 28 * 28
output_size = 10
EPOCHS = 15


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    softmax_bug = variant == "softmax_into_nll_loss"
    optimizer_bug = variant == "optimizer_from_fc_cell"

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train = (digits.upscaled(tr_raw, 28) - 0.1307) / 0.3081  # ToTensor + Normalize((0.1307,), (0.3081,))
    x_test = (digits.upscaled(te_raw, 28) - 0.1307) / 0.3081
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size=64, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, te_y), batch_size=1000, shuffle=True)
    splits = (x_train, tr_y, x_test, te_y)

    class FC2Layer(nn.Module):
        def __init__(self, input_size, n_hidden, output_size):
            super().__init__()
            self.input_size = input_size
            self.network = nn.Sequential(
                nn.Linear(input_size, n_hidden),
                nn.ReLU(),
                nn.Linear(n_hidden, n_hidden),
                nn.ReLU(),
                nn.Linear(n_hidden, output_size),
                nn.LogSoftmax(dim=1),
            )

        def forward(self, x):
            x = x.view(-1, self.input_size)
            return self.network(x)

    class CNN(nn.Module):
        def __init__(self, input_size, n_feature, output_size):
            super().__init__()
            self.n_feature = n_feature
            self.conv1 = nn.Conv2d(in_channels=1, out_channels=n_feature, kernel_size=5)
            self.conv2 = nn.Conv2d(n_feature, n_feature, kernel_size=5)
            self.fc1 = nn.Linear(n_feature * 4 * 4, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x, verbose=False):
            x = self.conv1(x)
            x = F.relu(x)
            x = F.max_pool2d(x, kernel_size=2)
            x = self.conv2(x)
            x = F.relu(x)
            x = F.max_pool2d(x, kernel_size=2)
            x = x.view(-1, self.n_feature * 4 * 4)
            x = self.fc1(x)
            x = F.relu(x)
            x = self.fc2(x)
            x = F.softmax(x, dim=1) if softmax_bug else F.log_softmax(x, dim=1)
            return x

    accuracy_list: list[float] = []
    state: dict = {}  # the notebook's globals: optimizer, the cell's Monitor

    def permuted(data, perm):
        data = data.view(-1, 28 * 28)
        data = data[:, perm]
        return data.view(-1, 1, 28, 28)

    def train_epoch(epoch, model, perm=torch.arange(0, 784).long()):
        optimizer, mon = state["optimizer"], state["mon"]
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            data = permuted(data, perm)
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            if batch_idx % 100 == 0:
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_loader.dataset),
                    100.0 * batch_idx / len(train_loader), loss.item()))  # fmt: skip

    def test(model, perm=torch.arange(0, 784).long()):
        model.eval()
        test_loss, correct = 0.0, 0
        for data, target in test_loader:
            data = permuted(data, perm)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.data.max(1, keepdim=True)[1]
            correct += pred.eq(target.data.view_as(pred)).cpu().sum().item()
        test_loss /= len(test_loader.dataset)
        accuracy = 100.0 * correct / len(test_loader.dataset)
        accuracy_list.append(accuracy)

    def cell(model, optimizer, perm=None):
        """One notebook cell: the model and optimizer built, then ``for epoch in range(...)``."""
        state["optimizer"] = optimizer
        extra = () if perm is None else (perm,)
        with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
            data0, target0 = next(iter(train_loader))
        probe_batch = (permuted(data0, perm if perm is not None else torch.arange(0, 784).long()), target0)
        nx.preflight(model, probe_batch, F.nll_loss, optimizer=optimizer, data=splits)
        state["mon"] = nx.monitor(model, optimizer, every=10)
        for epoch in range(0, EPOCHS):
            train_epoch(epoch, model, *extra)
        nx.finish(state["mon"], model, probe_batch, F.nll_loss, optimizer=optimizer, data=splits)
        test(model, *extra)

    # Train a small fully-connected network
    n_hidden = 8
    model_fnn = FC2Layer(input_size, n_hidden, output_size)
    optimizer = optim.SGD(model_fnn.parameters(), lr=0.01, momentum=0.5)
    cell(model_fnn, optimizer)

    # Train a ConvNet with the same number of parameters
    n_features = 6
    model_cnn = CNN(input_size, n_features, output_size)
    optimizer = optim.SGD((model_fnn if optimizer_bug else model_cnn).parameters(), lr=0.01, momentum=0.5)
    cell(model_cnn, optimizer)

    perm = torch.randperm(784)

    # ConvNet with permuted pixels
    model_cnn = CNN(input_size, n_features, output_size)
    optimizer = optim.SGD(model_cnn.parameters(), lr=0.01, momentum=0.5)
    cell(model_cnn, optimizer, perm)

    # Fully-connected with permuted pixels
    model_fnn = FC2Layer(input_size, n_hidden, output_size)
    optimizer = optim.SGD(model_fnn.parameters(), lr=0.01, momentum=0.5)
    cell(model_fnn, optimizer, perm)

    return {"fc_image_acc": accuracy_list[0], "cnn_image_acc": accuracy_list[1],
            "cnn_scrambled_acc": accuracy_list[2], "fc_scrambled_acc": accuracy_list[3]}  # fmt: skip
