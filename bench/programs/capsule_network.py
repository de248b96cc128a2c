"""Port of gram-ai's capsule-networks (``capsule_network.py``): a CapsNet with dynamic routing,
the margin loss and a reconstruction decoder, trained by a torchnet ``Engine``.

Source: github.com/gram-ai/capsule-networks, ``capsule_network.py`` at commit
6eeda0882bff819b2e788be40cf87fe69f20f26a (no licence stated: no LICENSE file, none in the
README). Written anew from the facts of that file (and torchnet's ``Engine`` loop it
relies on); no code copied.

Kept: the module-level ``softmax(input, dim)`` (transpose ``dim`` last, softmax, transpose
back); ``augmentation`` (one random shift of up to 2 pixels for the whole batch, zero fill,
numpy's ``randint``), applied by the processor to training *and* test batches;
``CapsuleLayer``: primary capsules = ``num_capsules`` separate ``Conv2d``s in an
``nn.ModuleList``, each output ``view(batch, -1, 1)``, concatenated on the last axis and
squashed; routed capsules = ``route_weights`` ``nn.Parameter(torch.randn(num_capsules,
route_nodes, in, out))`` (std 1), priors ``x[None, :, :, None, :] @ route_weights[:, None]``,
logits zeros, 3 routing iterations of ``softmax(logits, dim=2)`` (over the route nodes, as
published), ``squash((probs * priors).sum(dim=2, keepdim=True))`` and, except the last,
``logits + (priors * outputs).sum(-1, keepdim=True)`` (no detach); ``squash`` =
``|s|^2 / (1 + |s|^2) * s / sqrt(|s|^2)``; ``CapsuleNet``: ``relu(conv1)``, primary capsules
(8, no activation), digit capsules (10 x 16), ``.squeeze().transpose(0, 1)``, class lengths
through ``F.softmax(dim=-1)`` (as published), the decoder ``Linear`` + ``ReLU(inplace)`` x2 +
``Linear`` + ``Sigmoid`` on the capsules masked by the one-hot label (the true one in
training, the longest capsule's otherwise); ``CapsuleLoss``: ``labels * relu(0.9 - c)^2 +
0.5 * (1 - labels) * relu(c - 0.1)^2`` summed, plus ``0.0005 x`` the summed squared
reconstruction error (``MSELoss(size_average=False)``, here ``reduction="sum"``), over the batch
size; ``Adam`` with its defaults; the processor: ``augmentation(data.float() / 255.0)``,
labels one-hot through ``torch.eye(10).index_select``, ``model(data, labels)`` in training and
``model(data)`` in test; torchnet's ``Engine.train`` per batch: ``optimizer.zero_grad()``,
then ``optimizer.step(closure)`` with the closure running the processor, ``loss.backward()``
and the ``on_forward`` hook (accuracy and loss meters); per epoch a shuffled train pass, the
meters reset, ``engine.test`` on the unshuffled test set through the same processor.
Shrunk: scikit-learn's 8x8 digits upscaled to 12x12 (1,437 train / 360 test) instead of
MNIST's 28x28, so the shift is at most 1 pixel instead of 2; conv1 32 channels 5x5 instead of
256 9x9; primary capsules 8 convolutions of 8 channels 4x4 stride 2 (a 3x3 map, 72 route
nodes) instead of 32 channels 9x9 (6x6, 1,152 nodes); the decoder 160-128-256-144 instead
of 160-512-1024-784; batch 32 instead of 100 (more steps in the CPU budget); 8 epochs instead
of 500; the priors' broadcast ``@`` computed as one ``einsum`` (the same numbers, 3x faster on
a CPU); numpy's shifts from a seeded ``RandomState``; the test pass under ``torch.no_grad``;
the Visdom loggers, the confusion meter, the checkpoint saves and the reconstruction images
left out. Measured only, each epoch: the decoder's reconstruction of the unshifted test
digits (masked by the predicted class) against their [0, 1] pixels.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(through the processor's scaling, unshifted), the inputs ``(data, labels)`` as the model is
called in training, the loss ``capsule_loss`` of (images, one-hot labels) and the model's
``(classes, reconstructions)``, with the data splits; ``nndx.Monitor`` around the epochs, each
batch's loss and accuracy logged in the ``on_forward`` hook where the meters get them, each
test pass's loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "capsule_network"
SOURCE = Source("gram-ai/capsule-networks", "capsule_network.py", "6eeda0882bff819b2e788be40cf87fe69f20f26a",
                "none stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "pixels_not_scaled",
            "the processor's / 255.0 dropped: the 0..255 pixels go into conv1 and are the reconstruction "
            "target of a Sigmoid decoder",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51",
             "https://github.com/XifengGuo/CapsNet-Keras/issues/75",
             "https://github.com/tensorpack/tensorpack/issues/1261"),
            Measure("test_recon_mse", "the decoder's reconstruction of the test digits against their [0, 1] "
                    "pixels (measure only), mean squared error 3x the healthy run's or more "
                    "(the test accuracy is not hurt: the squash normalises the capsules)",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
        Variant(
            "zero_grad_missing",
            "the loop written out without torchnet's optimizer.zero_grad(): every backward adds to the "
            "gradients of all the batches before it",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7",
             "https://github.com/IDEA-Research/DN-DETR/issues/19"),
            Measure("test_acc", "final test accuracy at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

BATCH_SIZE = 32
NUM_CLASSES = 10
NUM_EPOCHS = 8
NUM_ROUTING_ITERATIONS = 3
SIDE = 12
CONV1, CONV1_KERNEL, PRIMARY_CHANNELS, PRIMARY_KERNEL = 32, 5, 8, 4
ROUTE_NODES = PRIMARY_CHANNELS * 3 * 3


def softmax(input: torch.Tensor, dim: int = 1) -> torch.Tensor:
    transposed = input.transpose(dim, input.dim() - 1)
    flat = F.softmax(transposed.contiguous().view(-1, transposed.size(-1)), dim=-1)
    return flat.view(*transposed.size()).transpose(dim, input.dim() - 1)


def augmentation(x: torch.Tensor, rng: np.random.RandomState, max_shift: int = 1) -> torch.Tensor:
    _, _, height, width = x.size()
    h_shift, w_shift = rng.randint(-max_shift, max_shift + 1, size=2)
    src_h = slice(max(0, h_shift), h_shift + height)
    src_w = slice(max(0, w_shift), w_shift + width)
    tgt_h = slice(max(0, -h_shift), -h_shift + height)
    tgt_w = slice(max(0, -w_shift), -w_shift + width)
    shifted = torch.zeros(*x.size())
    shifted[:, :, src_h, src_w] = x[:, :, tgt_h, tgt_w]
    return shifted.float()


class CapsuleLayer(nn.Module):
    def __init__(self, num_capsules: int, num_route_nodes: int, in_channels: int, out_channels: int,
                 kernel_size: int | None = None, stride: int | None = None,
                 num_iterations: int = NUM_ROUTING_ITERATIONS) -> None:  # fmt: skip
        super().__init__()
        self.num_route_nodes = num_route_nodes
        self.num_iterations = num_iterations
        self.num_capsules = num_capsules
        if num_route_nodes != -1:
            self.route_weights = nn.Parameter(torch.randn(num_capsules, num_route_nodes, in_channels, out_channels))
        else:
            self.capsules = nn.ModuleList([nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride,
                                                     padding=0) for _ in range(num_capsules)])  # fmt: skip

    def squash(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        squared_norm = (tensor**2).sum(dim=dim, keepdim=True)
        scale = squared_norm / (1 + squared_norm)
        return scale * tensor / torch.sqrt(squared_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.num_route_nodes != -1:
            # x[None, :, :, None, :] @ route_weights[:, None, :, :, :], as one einsum (the same numbers)
            priors = torch.einsum("bni,cnio->cbno", x, self.route_weights)[:, :, :, None, :]
            logits = torch.zeros(*priors.size())
            for i in range(self.num_iterations):
                probs = softmax(logits, dim=2)
                outputs = self.squash((probs * priors).sum(dim=2, keepdim=True))
                if i != self.num_iterations - 1:
                    logits = logits + (priors * outputs).sum(dim=-1, keepdim=True)
        else:
            outputs = torch.cat([capsule(x).view(x.size(0), -1, 1) for capsule in self.capsules], dim=-1)
            outputs = self.squash(outputs)
        return outputs


class CapsuleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=CONV1, kernel_size=CONV1_KERNEL, stride=1)
        self.primary_capsules = CapsuleLayer(num_capsules=8, num_route_nodes=-1, in_channels=CONV1,
                                             out_channels=PRIMARY_CHANNELS, kernel_size=PRIMARY_KERNEL, stride=2)
        self.digit_capsules = CapsuleLayer(num_capsules=NUM_CLASSES, num_route_nodes=ROUTE_NODES, in_channels=8,
                                           out_channels=16)
        self.decoder = nn.Sequential(
            nn.Linear(16 * NUM_CLASSES, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, SIDE * SIDE),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.conv1(x), inplace=True)
        x = self.primary_capsules(x)
        x = self.digit_capsules(x).squeeze().transpose(0, 1)
        classes = (x**2).sum(dim=-1) ** 0.5
        classes = F.softmax(classes, dim=-1)
        if y is None:  # the most active capsule of each sample
            _, max_length_indices = classes.max(dim=1)
            y = torch.eye(NUM_CLASSES).index_select(dim=0, index=max_length_indices.data)
        reconstructions = self.decoder((x * y[:, :, None]).reshape(x.size(0), -1))
        return classes, reconstructions


class CapsuleLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.reconstruction_loss = nn.MSELoss(reduction="sum")  # size_average=False

    def forward(self, images: torch.Tensor, labels: torch.Tensor, classes: torch.Tensor,
                reconstructions: torch.Tensor) -> torch.Tensor:  # fmt: skip
        left = F.relu(0.9 - classes, inplace=True) ** 2
        right = F.relu(classes - 0.1, inplace=True) ** 2
        margin_loss = (labels * left + 0.5 * (1.0 - labels) * right).sum()
        assert torch.numel(images) == torch.numel(reconstructions)
        images = images.view(reconstructions.size()[0], -1)
        reconstruction_loss = self.reconstruction_loss(reconstructions, images)
        return (margin_loss + 0.0005 * reconstruction_loss) / images.size(0)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)  # augmentation's np.random
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    # the dataset's uint8 pixels, at 16x16
    train_pixels = (data.upscaled(train_raw, SIDE) * 255.0).round()
    test_pixels = (data.upscaled(test_raw, SIDE) * 255.0).round()

    model = CapsuleNet()
    optimizer = torch.optim.Adam(model.parameters())
    capsule_loss = CapsuleLoss()

    def scaled(pixels: torch.Tensor) -> torch.Tensor:
        """The processor's ``data.float() / 255.0``."""
        return pixels.float() if variant == "pixels_not_scaled" else pixels.float() / 255.0

    def processor(pixels: torch.Tensor, labels: torch.Tensor, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images = augmentation(scaled(pixels), rng)
        onehot = torch.eye(NUM_CLASSES).index_select(dim=0, index=labels)
        if training:
            classes, reconstructions = model(images, onehot)
        else:
            classes, reconstructions = model(images)
        return capsule_loss(images, onehot, classes, reconstructions), classes

    def loss_on_batch(output: tuple[torch.Tensor, torch.Tensor], target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return capsule_loss(target[0], target[1], output[0], output[1])

    first_images = scaled(train_pixels[:BATCH_SIZE])
    first_onehot = torch.eye(NUM_CLASSES).index_select(dim=0, index=train_labels[:BATCH_SIZE])
    first_batch = ((first_images, first_onehot), (first_images, first_onehot))
    splits = (scaled(train_pixels), train_labels, scaled(test_pixels), test_labels)
    nx.preflight(model, first_batch, loss_on_batch, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5)

    loader_rng = torch.Generator().manual_seed(seed)  # shuffle=mode
    history: list[dict[str, float]] = []
    for epoch in range(NUM_EPOCHS):
        # engine.train: one epoch
        meter_loss, correct, seen = [], 0, 0
        order = torch.randperm(len(train_pixels), generator=loader_rng)
        for i in range(0, len(order), BATCH_SIZE):
            index = order[i : i + BATCH_SIZE]
            pixels, labels = train_pixels[index], train_labels[index]

            def closure() -> torch.Tensor:
                nonlocal correct, seen
                loss, output = processor(pixels, labels, True)
                loss.backward()
                # on_forward: the meters
                batch_correct = int((output.argmax(1) == labels).sum())
                correct, seen = correct + batch_correct, seen + len(labels)
                meter_loss.append(loss.item())
                mon.log(loss, accuracy=batch_correct / len(labels))
                return loss

            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            optimizer.step(closure)
        train_loss, train_acc = float(np.mean(meter_loss)), correct / seen

        # engine.test, the meters reset
        test_losses, test_correct, recon_errors = [], 0, []
        with torch.no_grad():
            for i in range(0, len(test_pixels), BATCH_SIZE):
                pixels, labels = test_pixels[i : i + BATCH_SIZE], test_labels[i : i + BATCH_SIZE]
                loss, output = processor(pixels, labels, False)
                test_losses.append(loss.item())
                # measure only: the reconstruction of the unshifted test image, in [0, 1] pixels
                _, reconstructions = model(scaled(pixels))
                recon_errors.append(F.mse_loss(reconstructions, (pixels / 255.0).reshape(len(pixels), -1)).item())
                test_correct += int((output.argmax(1) == labels).sum())
        test_loss, test_acc = float(np.mean(test_losses)), test_correct / len(test_pixels)  # the meters' means
        mon.log(test_loss, split="val", accuracy=test_acc)
        history.append({"train_loss": train_loss, "train_acc": train_acc, "test_loss": test_loss, "test_acc": test_acc,
                        "test_recon_mse": float(np.mean(recon_errors))})  # fmt: skip

    nx.finish(mon, model, first_batch, loss_on_batch, optimizer=optimizer, data=splits)
    last = history[-1]
    return {
        "train_loss": last["train_loss"],
        "train_acc": last["train_acc"],
        "test_loss": last["test_loss"],
        "test_acc": last["test_acc"],
        "best_test_acc": max(h["test_acc"] for h in history),
        "test_recon_mse": last["test_recon_mse"],
    }
