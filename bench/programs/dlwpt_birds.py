"""Port of Deep Learning with PyTorch (Stevens, Antiga, Viehmann), chapter 7: telling birds from
airplanes. CIFAR-10 cut down to two classes (``cifar2``), each 3x32x32 image flattened to 3,072
inputs of a fully connected ``Linear(3072, 512) -> Tanh -> Linear(512, 2) -> LogSoftmax``
trained with ``NLLLoss`` and SGD over a shuffling ``DataLoader``, then judged by its accuracy
on the training and the validation images.

Source: github.com/deep-learning-with-pytorch/dlwpt-code, ``p1ch7/2_birds_airplanes.ipynb``
(``label_map``, ``cifar2``/``cifar2_val``, the models of cells 5, 10, 29-35, ``nn.NLLLoss``, the
``DataLoader`` training loop of cell 35, the accuracy cells 36-37) and ``p1ch7/1_datasets.ipynb``
(``ToTensor`` + ``Normalize`` with the per-channel mean and std of the training images) at
commit d6c0210143daa133bbdeddaffc8993b1e17b5174 (the repository carries no licence file; cited,
not copied: the code is written anew from the facts of those notebooks).

Kept: ``torch.manual_seed(123)``; ``label_map`` from the two kept classes to 0 and 1 for the
train and the validation sets; ``transforms.Normalize(mean, std)`` per channel with the
training set's statistics (``imgs.view(3, -1).mean(dim=1)`` / ``.std(dim=1)``); the model of
cell 35, ``nn.Sequential(nn.Linear(3072, 512), nn.Tanh(), nn.Linear(512, 2),
nn.LogSoftmax(dim=1))``, built after cell 32's model of the same shape (the notebook builds that
one first and trains it sample by sample; here it is only built); ``learning_rate = 1e-2``,
``optim.SGD(model.parameters(), lr=learning_rate)``, ``loss_fn = nn.NLLLoss()``;
``DataLoader(cifar2, batch_size=64, shuffle=True)``; per epoch, per batch ``outputs =
model(imgs.view(imgs.shape[0], -1))``, ``loss_fn(outputs, labels)``, ``zero_grad``,
``backward``, ``step``, the last batch's loss printed; the accuracy of ``torch.max(outputs,
dim=1)`` over unshuffled loaders of batch 64 under ``torch.no_grad()`` on the train and the
validation sets.
Replaced: CIFAR-10 (not downloadable here) by scikit-learn's 8x8 digits, the classes 3 and 8
standing for airplane and bird (``label_map = {3: 0, 8: 1}``): each image upsampled (bilinear)
to 32x32 and repeated over 3 channels so the model keeps its 3,072 inputs; 285 train and 72
validation images (the digits' 360-image test split) instead of 10,000 and 2,000.
Shrunk: nothing else (the notebook's 100 epochs; with 5 batches an epoch that is 500 steps);
CPU; no plots, no prints.
Measure only (not in the program): the mean training loss of the last epoch; the validation
negative log-likelihood of the class probabilities the model outputs (``exp`` of its
log-probabilities, or its probabilities as they are when the output is a softmax).

nndx, as the author would add it after README.md: ``nndx.probe(model, (imgs.view(n, -1),
labels), loss_fn, optimizer=optimizer, data=(train inputs, train labels, val inputs, val
labels))`` (flattened, as the model takes them) on the first batch of the loader before the
epochs; ``nndx.Monitor(model, optimizer, every=10, loss_fn=loss_fn)`` around them, the batch
loss computed through ``mon.loss_fn`` and logged every batch; after them ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.optim as optim
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dlwpt_birds"
SOURCE = Source("deep-learning-with-pytorch/dlwpt-code", "p1ch7/2_birds_airplanes.ipynb",
                "d6c0210143daa133bbdeddaffc8993b1e17b5174", "none stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's DataLoader training of the LogSoftmax + NLLLoss model (shrunk: digits "
                "3 vs 8 as 3x32x32 images)"),
        Variant(
            "softmax_into_nllloss",
            "the model ends in cell 10's nn.Softmax(dim=1) while the loss is cell 30's nn.NLLLoss: NLLLoss takes "
            "the probabilities for log-probabilities, so it minimises -p(label) (a negative 'loss'), whose "
            "gradient vanishes on confident mistakes",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/clvrai/ACGAN-PyTorch/issues/3",
             "https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9",
             "https://github.com/yanx27/Pointnet_Pointnet2_pytorch/issues/30"),
            Measure("final_epoch_loss", "the last epoch's mean training NLLLoss is negative (an impossible "
                    "negative log-likelihood) while the healthy run's is positive",
                    lambda healthy, buggy: not (buggy >= 0) and healthy > 0),
        ),
        Variant(
            "optimizer_from_earlier_model",
            "cell 35's model is rebuilt but the optimizer line is not re-run: optim.SGD still holds the "
            "parameters of the model built in an earlier cell, so the trained model's gradients are computed "
            "and never applied, and it stays at its random initialisation",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/spro/practical-pytorch/issues/9",
             "https://github.com/pytorch/pytorch/issues/14467"),
            Measure("val_acc", "validation accuracy at least 20 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.20),
        ),
    )
}

KEEP = {3: 0, 8: 1}  # label_map: the two classes kept (airplane, bird in the notebook)
N_EPOCHS, LEARNING_RATE, BATCH_SIZE = 100, 1e-2, 64


def cifar2_like(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_imgs, train_labels, val_imgs, val_labels): 3x32x32 float images in [0, 1], labels 0/1."""
    x_train, y_train, x_val, y_val = digits.digit_images(seed)

    def keep(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (y == 3) | (y == 8)
        imgs = digits.upscaled(x[mask], 32).repeat(1, 3, 1, 1)  # ToTensor, (N, 3, 32, 32)
        return imgs, torch.tensor([KEEP[int(label)] for label in y[mask]])

    return *keep(x_train, y_train), *keep(x_val, y_val)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(123 + seed)
    imgs_train, labels_train, imgs_val, labels_val = cifar2_like(seed)
    # 1_datasets: the per-channel statistics of the training images, then Normalize(mean, std)
    mean = imgs_train.permute(1, 0, 2, 3).reshape(3, -1).mean(dim=1)
    std = imgs_train.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1)
    imgs_train = (imgs_train - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    imgs_val = (imgs_val - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    cifar2 = list(zip(imgs_train, labels_train.tolist()))
    cifar2_val = list(zip(imgs_val, labels_val.tolist()))

    learning_rate = LEARNING_RATE
    # cell 32: the model trained sample by sample, with its optimizer (built, not trained, here)
    earlier_model = nn.Sequential(nn.Linear(3072, 512), nn.Tanh(), nn.Linear(512, 2), nn.LogSoftmax(dim=1))
    optimizer = optim.SGD(earlier_model.parameters(), lr=learning_rate)

    # cell 35
    train_loader = torch.utils.data.DataLoader(cifar2, batch_size=BATCH_SIZE, shuffle=True,
                                               generator=torch.Generator().manual_seed(seed))  # fmt: skip
    last = nn.Softmax(dim=1) if variant == "softmax_into_nllloss" else nn.LogSoftmax(dim=1)
    model = nn.Sequential(nn.Linear(3072, 512), nn.Tanh(), nn.Linear(512, 2), last)
    learning_rate = 1e-2
    if variant != "optimizer_from_earlier_model":
        optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.NLLLoss()
    n_epochs = N_EPOCHS

    first_imgs, first_labels = next(iter(torch.utils.data.DataLoader(cifar2, batch_size=BATCH_SIZE, shuffle=True,
                                                                     generator=torch.Generator().manual_seed(seed))))
    batch = (first_imgs.view(first_imgs.shape[0], -1), first_labels)
    nndx_data = (imgs_train.view(imgs_train.shape[0], -1), labels_train, imgs_val.view(imgs_val.shape[0], -1),
                 labels_val)  # fmt: skip
    nx.preflight(model, batch, loss_fn, optimizer=optimizer, data=nndx_data)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_fn)

    epoch_losses: list[float] = []
    for epoch in range(n_epochs):
        epoch_loss = []
        for imgs, labels in train_loader:
            outputs = model(imgs.view(imgs.shape[0], -1))
            loss = mon.loss_fn(outputs, labels)

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_loss.append(float(loss))

        # print("Epoch: %d, Loss: %f" % (epoch, float(loss)))
        epoch_losses.append(sum(epoch_loss) / len(epoch_loss))

    nx.finish(mon, model, batch, loss_fn, optimizer=optimizer, data=nndx_data)

    def accuracy(dataset) -> float:  # cells 36-37
        loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=False)
        correct = 0
        total = 0
        with torch.no_grad():
            for imgs, labels in loader:
                outputs = model(imgs.view(imgs.shape[0], -1))
                _, predicted = torch.max(outputs, dim=1)
                total += labels.shape[0]
                correct += int((predicted == labels).sum())
        return correct / total

    with torch.no_grad():  # measure only
        out = model(imgs_val.view(imgs_val.shape[0], -1))
        probs = out if variant == "softmax_into_nllloss" else out.exp()
        val_nll = float(-torch.log(probs.gather(1, labels_val.view(-1, 1)).clamp_min(1e-12)).mean())
    return {"train_acc": accuracy(cifar2), "val_acc": accuracy(cifar2_val), "final_epoch_loss": epoch_losses[-1],
            "first_epoch_loss": epoch_losses[0], "val_nll": val_nll}  # fmt: skip
