"""Port of gpleiss/temperature_scaling: train a DenseNet-BC classifier (``train.py``), then
calibrate it post hoc (``demo.py`` + ``temperature_scaling.py``): one temperature, the logits
divided by it, fitted on the held-out validation logits by minimising the NLL with
``torch.optim.LBFGS`` and a closure; NLL and ECE printed before and after.

Source: github.com/gpleiss/temperature_scaling, ``temperature_scaling.py`` with ``demo.py``,
``train.py`` and ``models/densenet.py`` at commit ce1154ec7d5235eee046f28875c3dd8421f11d45
(MIT, Copyright (c) 2017 Geoff Pleiss). Written anew from the facts of those files; no code
copied.

Kept: ``models/densenet.py``'s DenseNet-BC: ``_DenseLayer`` (``norm1`` -> ``ReLU(inplace=True)``
-> 1x1 ``conv1`` to ``bn_size * growth_rate`` channels through ``_bn_function_factory``'s
closure over the concatenated features, then ``norm2`` -> ``relu2`` -> 3x3 ``conv2``, no biases,
no dropout), ``_DenseBlock`` (each layer sees every earlier feature map, the block returns
their ``cat``), ``_Transition`` (norm, ReLU, 1x1 conv to ``compression`` x the channels,
``AvgPool2d(2)``), the ``small_inputs`` stem (one 3x3 conv), ``norm_final``, then in
``forward`` ``F.relu(inplace=True)``, a global ``F.avg_pool2d`` and the ``Linear`` classifier;
its init (convs ``normal_() * sqrt(2 / (out_channels * k * k))``, norm weights 1 and biases 0,
the classifier's bias 0). ``train.py``: a validation split taken from the training set by
``torch.randperm`` (its indices kept for calibration), the training transform (random crop
with padding, then normalisation) and the test transform (normalisation only),
``SubsetRandomSampler`` loaders, ``nn.CrossEntropyLoss``, ``optim.SGD(lr=0.1, momentum=0.9,
nesterov=True)`` (``train``'s ``wd`` argument is never passed to the optimizer, so no weight
decay), ``MultiStepLR`` at 50% and 75% of the epochs with gamma 0.1, stepped at the *start*
of every epoch as the script does, ``run_epoch`` (``model.train()``, ``model.zero_grad()`` and
``optimizer.zero_grad()``, forward, loss, backward, step; evaluation under ``torch.no_grad()``
in ``model.eval()``), the model with the best validation error kept. ``demo.py``: the best
model reloaded into a fresh ``DenseNet`` (``load_state_dict``), wrapped in
``ModelWithTemperature`` (``temperature = nn.Parameter(torch.ones(1) * 1.5)``,
``temperature_scale`` dividing the logits by the temperature expanded to their shape) and
``set_temperature(valid_loader)`` over the validation indices with the test transform:
``self.eval()`` (remembering the mode), the validation logits and labels collected under
``torch.no_grad()``, ``nn.CrossEntropyLoss`` and ``_ECELoss`` (15 equal-width confidence
bins) before, ``optim.LBFGS([self.temperature], lr=0.01, max_iter=200)`` stepped once with the
closure (``zero_grad``, NLL of the scaled logits, ``backward``, return the loss), NLL and ECE
after, the training mode restored.
Shrunk: scikit-learn's 8x8 digits (1 channel, 10 classes; 1,437 training images of which 300
are the validation split, 360 test images) instead of CIFAR-100 (32x32x3, 100 classes, 5,000
validation images), normalised by the training images' own mean and std; a random crop of 8
with padding 1 instead of 32 with 4, and no horizontal flip (digits are not mirror images of
themselves); DenseNet depth 16 (2 layers a block) with growth rate 6 and 12 initial features
instead of depth 40 with 12 and 24, the final map 2x2 under a 2x2 average pool (the
original's 8x8 under 8: a global average either way); 16 epochs with the steps at 8 and 12
instead of 300 at 150 and 225; batch 64 kept, the demo's validation batch 256 kept; no
``.cuda()`` (the CPU), no files saved (the best state dict and the validation indices kept in
memory), no ``fire`` command line.
On the digits this shrunk DenseNet ends slightly under-confident (fitted temperatures about
0.8-0.87, below 1), not over-confident as the CIFAR-100 DenseNet is; the calibration still
lowers the NLL and the ECE, and the temperature still has to travel from its start at 1.5.
Measure only (not in the program): the calibrated model's NLL and ECE on the 360 test images
(the temperature applied to their eval-mode logits), the validation NLL/ECE ``set_temperature``
prints, the temperature, the test error.

nndx, as the author would add it, to both phases: training as in the other classifier
ports (a preflight ``nndx.probe`` on the first training batch with ``nn.CrossEntropyLoss``,
the optimizer and the data splits; ``nndx.Monitor(model, optimizer)`` around the epochs with
the criterion called as ``mon.loss_fn``, each batch's loss and accuracy logged, each
validation pass's loss and accuracy logged as ``split="val"``; ``nndx.probe(...,
monitor=mon)`` after). Calibration: the temperature lives on ``ModelWithTemperature`` whose
``forward`` runs the whole DenseNet, while the closure only calls ``temperature_scale`` on
precomputed logits, so the author hands nndx a thin ``TemperatureScale`` module that holds the
same ``temperature`` parameter and whose ``forward`` is ``temperature_scale`` (the closure
calls it; the numbers are the same), with the validation ``(logits, labels)`` as the batch: a
preflight ``nndx.probe`` with the LBFGS optimizer before ``optimizer.step(eval)``,
``nndx.Monitor(scaler, optimizer)`` around it with every closure's loss logged, and
``nndx.probe(..., monitor=mon)`` after. The author reads the two phases' diagnoses ranked
together.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.sampler import SubsetRandomSampler

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "temperature_scaling"
SOURCE = Source("gpleiss/temperature_scaling", "temperature_scaling.py", "ce1154ec7d5235eee046f28875c3dd8421f11d45",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the programs as published (shrunk: digits, DenseNet-BC depth 16, 16 epochs)"),
        Variant(
            "closure_no_zero_grad",
            "optimizer.zero_grad() missing from set_temperature's LBFGS closure (the code before the repository's "
            "commit 126a509): every evaluation adds its gradient of the temperature to the previous ones, so "
            "LBFGS steers by a running sum of stale gradients and the temperature lands away from the NLL minimum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/gpleiss/temperature_scaling/issues/13",
             "https://github.com/gpleiss/temperature_scaling/issues/20"),
            Measure("valid_nll_after", "the validation NLL set_temperature prints after fitting (the objective LBFGS "
                    "minimises) at least 0.01 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.01),
        ),
        Variant(
            "max_iter_50",
            "optim.LBFGS([self.temperature], lr=0.01, max_iter=50), the setting before the repository's commit "
            "e888e9e: with lr 0.01 each iteration moves the temperature a hundredth of the quasi-Newton step, so 50 "
            "iterations stop it far short of the NLL minimum (from its start at 1.5)",
            (C.LR_TOO_LOW, C.UNDERFITTING),
            ("https://github.com/gpleiss/temperature_scaling/issues/34",
             "https://github.com/gpleiss/temperature_scaling/issues/28"),
            Measure("test_nll_after", "calibrated test NLL at least 0.01 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.01),
        ),
    )
}

VALID_SIZE, N_EPOCHS, BATCH_SIZE, LR, MOMENTUM = 300, 16, 64, 0.1, 0.9
GROWTH_RATE, BLOCK_CONFIG, NUM_INIT_FEATURES, DEMO_BATCH_SIZE = 6, (2, 2, 2), 12, 256
SIDE, PAD = 8, 1


# --------------------------------------------------------------------------- models/densenet.py


def _bn_function_factory(norm: nn.Module, relu: nn.Module, conv: nn.Module):
    def bn_function(*inputs: torch.Tensor) -> torch.Tensor:
        concated_features = torch.cat(inputs, 1)
        return conv(relu(norm(concated_features)))

    return bn_function


class _DenseLayer(nn.Module):
    def __init__(self, num_input_features: int, growth_rate: int, bn_size: int, drop_rate: float) -> None:
        super().__init__()
        self.add_module("norm1", nn.BatchNorm2d(num_input_features))
        self.add_module("relu1", nn.ReLU(inplace=True))
        self.add_module("conv1", nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1,
                                           bias=False))  # fmt: skip
        self.add_module("norm2", nn.BatchNorm2d(bn_size * growth_rate))
        self.add_module("relu2", nn.ReLU(inplace=True))
        self.add_module("conv2", nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1,
                                           bias=False))  # fmt: skip
        self.drop_rate = drop_rate

    def forward(self, *prev_features: torch.Tensor) -> torch.Tensor:
        bn_function = _bn_function_factory(self.norm1, self.relu1, self.conv1)
        bottleneck_output = bn_function(*prev_features)
        new_features = self.conv2(self.relu2(self.norm2(bottleneck_output)))
        if self.drop_rate > 0:
            new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
        return new_features


class _Transition(nn.Sequential):
    def __init__(self, num_input_features: int, num_output_features: int) -> None:
        super().__init__()
        self.add_module("norm", nn.BatchNorm2d(num_input_features))
        self.add_module("relu", nn.ReLU(inplace=True))
        self.add_module("conv", nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1,
                                          bias=False))  # fmt: skip
        self.add_module("pool", nn.AvgPool2d(kernel_size=2, stride=2))


class _DenseBlock(nn.Module):
    def __init__(self, num_layers: int, num_input_features: int, bn_size: int, growth_rate: int,
                 drop_rate: float) -> None:  # fmt: skip
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate=growth_rate, bn_size=bn_size,
                                drop_rate=drop_rate)  # fmt: skip
            self.add_module("denselayer%d" % (i + 1), layer)

    def forward(self, init_features: torch.Tensor) -> torch.Tensor:
        features = [init_features]
        for _name, layer in self.named_children():
            features.append(layer(*features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, growth_rate: int = 12, block_config=(16, 16, 16), compression: float = 0.5,
                 num_init_features: int = 24, bn_size: int = 4, drop_rate: float = 0, num_classes: int = 10,
                 in_channels: int = 3, avgpool_size: int = 8) -> None:  # fmt: skip
        super().__init__()
        assert 0 < compression <= 1, "compression of densenet should be between 0 and 1"
        self.avgpool_size = avgpool_size
        self.features = nn.Sequential(OrderedDict([
            ("conv0", nn.Conv2d(in_channels, num_init_features, kernel_size=3, stride=1, padding=1, bias=False)),
        ]))  # fmt: skip
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers=num_layers, num_input_features=num_features, bn_size=bn_size,
                                growth_rate=growth_rate, drop_rate=drop_rate)  # fmt: skip
            self.features.add_module("denseblock%d" % (i + 1), block)
            num_features = num_features + num_layers * growth_rate
            if i != len(block_config) - 1:
                trans = _Transition(num_input_features=num_features,
                                    num_output_features=int(num_features * compression))  # fmt: skip
                self.features.add_module("transition%d" % (i + 1), trans)
                num_features = int(num_features * compression)
        self.features.add_module("norm_final", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)

        for name, param in self.named_parameters():
            if "conv" in name and "weight" in name:
                n = param.size(0) * param.size(2) * param.size(3)
                param.data.normal_().mul_(math.sqrt(2.0 / n))
            elif "norm" in name and "weight" in name:
                param.data.fill_(1)
            elif "norm" in name and "bias" in name:
                param.data.fill_(0)
            elif "classifier" in name and "bias" in name:
                param.data.fill_(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        out = F.relu(features, inplace=True)
        out = F.avg_pool2d(out, kernel_size=self.avgpool_size).view(features.size(0), -1)
        return self.classifier(out)


def make_densenet() -> DenseNet:
    return DenseNet(growth_rate=GROWTH_RATE, block_config=BLOCK_CONFIG, num_init_features=NUM_INIT_FEATURES,
                    num_classes=10, in_channels=1, avgpool_size=2)  # fmt: skip


# --------------------------------------------------------------------------- temperature_scaling.py


class ModelWithTemperature(nn.Module):
    """A thin decorator that wraps a classifier (which outputs logits) with temperature scaling."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.temperature = nn.Parameter(torch.ones(1) * 1.5)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        logits = self.model(input)
        return self.temperature_scale(logits)

    def temperature_scale(self, logits: torch.Tensor) -> torch.Tensor:
        temperature = self.temperature.unsqueeze(1).expand(logits.size(0), logits.size(1))
        return logits / temperature

    def set_temperature(self, valid_loader: DataLoader, nx: Nndx, variant: str = "healthy") -> dict[str, float]:
        nll_criterion = nn.CrossEntropyLoss()
        ece_criterion = _ECELoss()

        logits_list, labels_list = [], []
        training_mode = self.training
        self.eval()  # prevent batchnorm statistics from changing
        with torch.no_grad():
            for input, label in valid_loader:  # noqa: A001
                logits_list.append(self.model(input))
                labels_list.append(label)
            logits = torch.cat(logits_list)
            labels = torch.cat(labels_list)

        before_temperature_nll = nll_criterion(logits, labels).item()
        before_temperature_ece = ece_criterion(logits, labels).item()

        optimizer = optim.LBFGS([self.temperature], lr=0.01, max_iter=50 if variant == "max_iter_50" else 200)
        scaler = TemperatureScale(self)
        nx.preflight(scaler, (logits, labels), nll_criterion, optimizer=optimizer)
        mon = nx.monitor(scaler, optimizer, every=10)

        def eval() -> torch.Tensor:  # noqa: A001 - the original's name
            if variant != "closure_no_zero_grad":
                optimizer.zero_grad()
            loss = nll_criterion(scaler(logits), labels)
            loss.backward()
            nx.timed(lambda: mon.log(loss))
            return loss

        optimizer.step(eval)
        nx.finish(mon, scaler, (logits, labels), nll_criterion, optimizer=optimizer)

        after_temperature_nll = nll_criterion(self.temperature_scale(logits), labels).item()
        after_temperature_ece = ece_criterion(self.temperature_scale(logits), labels).item()
        self.train(training_mode)
        return {"valid_nll_before": before_temperature_nll, "valid_ece_before": before_temperature_ece,
                "valid_nll_after": after_temperature_nll, "valid_ece_after": after_temperature_ece}  # fmt: skip


class TemperatureScale(nn.Module):
    """For nndx only: the calibration as the closure runs it, ``temperature_scale`` of the logits,
    holding the very ``temperature`` parameter of the ``ModelWithTemperature``."""

    def __init__(self, wrapped: ModelWithTemperature) -> None:
        super().__init__()
        self.temperature = wrapped.temperature

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return ModelWithTemperature.temperature_scale(self, logits)  # type: ignore[arg-type]


class _ECELoss(nn.Module):
    """Expected calibration error over ``n_bins`` equal-width confidence bins (takes logits)."""

    def __init__(self, n_bins: int = 15) -> None:
        super().__init__()
        bin_boundaries = torch.linspace(0, 1, n_bins + 1)
        self.bin_lowers = bin_boundaries[:-1]
        self.bin_uppers = bin_boundaries[1:]

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        softmaxes = F.softmax(logits, dim=1)
        confidences, predictions = torch.max(softmaxes, 1)
        accuracies = predictions.eq(labels)
        ece = torch.zeros(1, device=logits.device)
        for bin_lower, bin_upper in zip(self.bin_lowers, self.bin_uppers):
            in_bin = confidences.gt(bin_lower.item()) * confidences.le(bin_upper.item())
            prop_in_bin = in_bin.float().mean()
            if prop_in_bin.item() > 0:
                accuracy_in_bin = accuracies[in_bin].float().mean()
                avg_confidence_in_bin = confidences[in_bin].mean()
                ece += torch.abs(avg_confidence_in_bin - accuracy_in_bin) * prop_in_bin
        return ece


# --------------------------------------------------------------------------- the data (torchvision's role)


class Digits(Dataset):
    """The 8x8 digits as a torchvision dataset with a transform: (random crop,) normalise."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float, train: bool,
                 generator: torch.Generator | None = None) -> None:  # fmt: skip
        self.images, self.labels = data.to_tensor(images), labels
        self.mean, self.std, self.train, self.generator = mean, std, train, generator

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if self.train:  # RandomCrop(SIDE, padding=PAD)
            padded = F.pad(image, (PAD, PAD, PAD, PAD))
            top, left = torch.randint(0, 2 * PAD + 1, (2,), generator=self.generator).tolist()
            image = padded[:, top : top + SIDE, left : left + SIDE]
        return (image - self.mean) / self.std, self.labels[i]


# --------------------------------------------------------------------------- train.py


def run_epoch(loader, model, criterion, optimizer, train: bool, mon) -> tuple[float, float]:
    losses, errors = [], []
    model.train() if train else model.eval()
    for input, target in loader:  # noqa: A001
        if train:
            model.zero_grad()
            optimizer.zero_grad()
            output = model(input)
            loss = mon.loss_fn(output, target)
            loss.backward()
            optimizer.step()
        else:
            with torch.no_grad():
                output = model(input)
                loss = criterion(output, target)
        _, predictions = torch.topk(output, 1)
        error = 1 - torch.eq(predictions.view(-1), target).float().mean()
        if train:
            mon.log(loss, accuracy=1.0 - error.item())
        losses.append(loss.item())
        errors.append(error.item())
    return sum(losses) / len(losses), sum(errors) / len(errors)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    pixels = data.to_tensor(train_raw)
    mean, std = pixels.mean().item(), pixels.std().item()

    train_set = Digits(train_raw, train_labels, mean, std, train=True, generator=torch.Generator().manual_seed(seed))
    valid_set = Digits(train_raw, train_labels, mean, std, train=False)
    indices = torch.randperm(len(train_set))
    train_indices = indices[: len(indices) - VALID_SIZE]
    valid_indices = indices[len(indices) - VALID_SIZE :]
    sampler_gen = torch.Generator().manual_seed(seed + 1)
    train_loader = DataLoader(train_set, batch_size=BATCH_SIZE, sampler=SubsetRandomSampler(train_indices,
                                                                                            generator=sampler_gen))
    valid_loader = DataLoader(valid_set, batch_size=BATCH_SIZE, sampler=SubsetRandomSampler(valid_indices,
                                                                                            generator=sampler_gen))

    model = make_densenet()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
    scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=[0.5 * N_EPOCHS, 0.75 * N_EPOCHS], gamma=0.1)

    x_all = torch.stack([valid_set[i][0] for i in range(len(valid_set))])  # the normalised images, no crop
    splits = (x_all[train_indices], train_labels[train_indices], x_all[valid_indices], train_labels[valid_indices])
    first_batch = (splits[0][:BATCH_SIZE], splits[1][:BATCH_SIZE])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    best_error, best_state = 1.0, None
    for _epoch in range(1, N_EPOCHS + 1):
        scheduler.step()
        run_epoch(train_loader, model, criterion, optimizer, train=True, mon=mon)
        valid_loss, valid_error = run_epoch(valid_loader, model, criterion, optimizer, train=False, mon=mon)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=1.0 - valid_error))
        if valid_error < best_error:
            best_error = valid_error
            best_state = {k: v.clone() for k, v in model.state_dict().items()}  # torch.save(model.state_dict())
    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)

    # demo.py: reload the best model, wrap it, tune the temperature on the validation indices
    demo_valid_loader = DataLoader(valid_set, batch_size=DEMO_BATCH_SIZE,
                                   sampler=SubsetRandomSampler(valid_indices, generator=sampler_gen))
    orig_model = make_densenet()
    orig_model.load_state_dict(best_state)
    scaled = ModelWithTemperature(orig_model)
    printed = scaled.set_temperature(demo_valid_loader, nx, variant)

    # measure only: the calibrated model on the held-out test images
    scaled.eval()
    test_set = Digits(test_raw, test_labels, mean, std, train=False)
    x_test = torch.stack([test_set[i][0] for i in range(len(test_set))])
    with torch.no_grad():
        test_logits = scaled.model(x_test)
        test_scaled = scaled.temperature_scale(test_logits)
    ece = _ECELoss()
    return {
        "test_nll_after": F.cross_entropy(test_scaled, test_labels).item(),
        "test_ece_after": ece(test_scaled, test_labels).item(),
        "test_nll_before": F.cross_entropy(test_logits, test_labels).item(),
        "test_ece_before": ece(test_logits, test_labels).item(),
        "test_error": 1.0 - (test_logits.argmax(1) == test_labels).float().mean().item(),
        "temperature": scaled.temperature.item(),
        "best_valid_error": best_error,
        **printed,
    }
