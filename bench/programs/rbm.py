"""Port of GabrielBianconi/pytorch-rbm: a Bernoulli restricted Boltzmann machine trained by
contrastive divergence (CD-k), its parameters updated by hand, then its hidden features fed to a
logistic-regression classifier.

Source: github.com/GabrielBianconi/pytorch-rbm, ``rbm.py`` and ``mnist_example.py`` at commit
cdb42b30c690709dcfd3b51250d8c90128ec6f11 (MIT, Copyright (c) 2017 Gabriel M. Bianconi). Written anew
from the facts of those files; no code copied.

Kept: ``RBM(num_visible, num_hidden, k, learning_rate, momentum_coefficient=0.5, weight_decay=1e-4)``:
weights ``randn * 0.1``, visible bias ``0.5``, hidden bias ``0``, three momentum tensors at zero;
``sample_hidden`` / ``sample_visible`` = the sigmoid (written ``1 / (1 + exp(-x))``) of
``v @ W + b_h`` / ``h @ W.T + b_v``; ``contrastive_divergence``: positive phase on the hidden
probabilities, hidden states by comparing them with ``torch.rand(num_hidden)`` (one random vector
for the whole batch, as the original draws it), ``k`` Gibbs steps from those states, the negative
associations from the last visible and hidden *probabilities*, the momentum updates
(``m = momentum * m + (positive - negative)``), each parameter moved by ``m * learning_rate /
batch_size``, then the weights shrunk by ``weights * weight_decay``; the summed squared
reconstruction error of the batch returned; no torch optimizer and no autograd. ``mnist_example.py``:
``BATCH_SIZE = 64``, ``HIDDEN_UNITS = 128``, ``CD_K = 2``, an unshuffled train loader, the epoch
error summed and printed per epoch, the hidden probabilities of the train and test sets extracted
batch by batch as features, ``LogisticRegression()`` fitted on the train features and scored on the
test features (``Result: correct/total``).
Shrunk: scikit-learn's digits (8x8, values 0-16) instead of MNIST (no download): scaled to [0, 1]
(``/ 16``, where ``ToTensor`` scales MNIST by 1/255) and binarised at 0.5 for this Bernoulli RBM,
shuffled once (seeded) and split 1,400 train / 397 test; ``VISIBLE_UNITS = 64``; 30 epochs instead of
10 and ``learning_rate = 0.1`` instead of the default 1e-3 (22 CD updates an epoch here against 938
on MNIST: at 1e-3 the shrunk run is far from done, held-out reconstruction error 7.3 against 2.3 pixels
per digit and test accuracy 0.90 against 0.93 on seed 0); CPU only (``use_cuda`` dropped).

The one change made to let nndx attach, as the program's author would make it: nndx watches an
``nn.Module``, so ``RBM`` subclasses ``nn.Module``, its weights and biases are ``nn.Parameter`` and its
momentum tensors buffers, ``contrastive_divergence`` runs under ``torch.no_grad()`` (in-place updates of
parameters), and ``forward(v)`` is the one-step mean-field reconstruction
``sample_visible(sample_hidden(v))``; the features are extracted under ``torch.no_grad()``.

Measure only (not in the program): the classifier's test accuracy (the program's printed result as a
fraction) and the held-out reconstruction error per digit.

nndx, as the author would add it: a preflight ``nndx.probe`` on the RBM with the first training batch as
``(batch, batch)`` and the program's reconstruction error ``sum((v - recon) ** 2)`` as ``loss_fn``, no
optimizer (there is none); ``nndx.Monitor(rbm, None)`` around the epochs (``None``: the update is by
hand), every batch's reconstruction error logged; then ``nndx.probe(..., monitor=mon)`` on the same batch
and ``nndx.diagnose``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rbm"
SOURCE = Source("GabrielBianconi/pytorch-rbm", "rbm.py", "cdb42b30c690709dcfd3b51250d8c90128ec6f11", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (mnist_example.py on binarised digits, shrunk)"),
        Variant(
            "pixels_not_scaled",
            "the digits go into the Bernoulli RBM as their raw 0-16 intensities: the scaling to [0, 1] "
            "(ToTensor's job in the original) and the binarisation are left out",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/GabrielBianconi/pytorch-rbm/issues/1",
             "https://stats.stackexchange.com/questions/258273/basic-confusion-about-restricted-boltzmann-machines-rbm",
             "https://stackoverflow.com/questions/29162697/restricted-boltzmann-machine-preprocessing-data"),
            Measure("test_accuracy", "logistic-regression test accuracy on the hidden features at least 0.1 "
                    "below the healthy run's (0.08/0.08/0.09, chance, against 0.93/0.91/0.92 on seeds 0-2: "
                    "the hidden units saturate, every digit gets the same features)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "update_not_divided_by_batch",
            "the CD update adds momentum * learning_rate without dividing by batch_size: the summed "
            "(not averaged) statistics make every step 64 times larger",
            (C.LR_TOO_HIGH,),
            ("https://github.com/meownoid/tensorfow-rbm/issues/10",
             "https://github.com/gabrieleangeletti/Deep-Learning-TensorFlow/pull/1",
             "https://github.com/omimo/xRBM/issues/1"),
            Measure("test_accuracy", "logistic-regression test accuracy on the hidden features at least 0.1 "
                    "below the healthy run's (0.08/0.08/0.09, chance, against 0.93/0.91/0.92 on seeds 0-2; "
                    "held-out reconstruction error 9.9-13.0 against 2.3 pixels per digit)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

BATCH_SIZE, VISIBLE_UNITS, HIDDEN_UNITS, CD_K, EPOCHS, LEARNING_RATE = 64, 64, 128, 2, 30, 0.1
N_TRAIN = 1400


class RBM(nn.Module):
    def __init__(self, num_visible: int, num_hidden: int, k: int, learning_rate: float = 1e-3,
                 momentum_coefficient: float = 0.5, weight_decay: float = 1e-4,
                 divide_by_batch: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.num_visible, self.num_hidden, self.k = num_visible, num_hidden, k
        self.learning_rate, self.momentum_coefficient, self.weight_decay = learning_rate, momentum_coefficient, weight_decay
        self.divide_by_batch = divide_by_batch

        self.weights = nn.Parameter(torch.randn(num_visible, num_hidden) * 0.1)
        self.visible_bias = nn.Parameter(torch.ones(num_visible) * 0.5)
        self.hidden_bias = nn.Parameter(torch.zeros(num_hidden))

        self.register_buffer("weights_momentum", torch.zeros(num_visible, num_hidden))
        self.register_buffer("visible_bias_momentum", torch.zeros(num_visible))
        self.register_buffer("hidden_bias_momentum", torch.zeros(num_hidden))

    def sample_hidden(self, visible_probabilities: torch.Tensor) -> torch.Tensor:
        return self._sigmoid(torch.matmul(visible_probabilities, self.weights) + self.hidden_bias)

    def sample_visible(self, hidden_probabilities: torch.Tensor) -> torch.Tensor:
        return self._sigmoid(torch.matmul(hidden_probabilities, self.weights.t()) + self.visible_bias)

    def forward(self, visible: torch.Tensor) -> torch.Tensor:
        """Added for nndx: the one-step mean-field reconstruction of the visible units."""
        return self.sample_visible(self.sample_hidden(visible))

    @torch.no_grad()
    def contrastive_divergence(self, input_data: torch.Tensor) -> torch.Tensor:
        # positive phase
        positive_hidden_probabilities = self.sample_hidden(input_data)
        positive_hidden_activations = (positive_hidden_probabilities >= self._random_probabilities(self.num_hidden)).float()
        positive_associations = torch.matmul(input_data.t(), positive_hidden_activations)

        # negative phase: k Gibbs steps
        hidden_activations = positive_hidden_activations
        for _step in range(self.k):
            visible_probabilities = self.sample_visible(hidden_activations)
            hidden_probabilities = self.sample_hidden(visible_probabilities)
            hidden_activations = (hidden_probabilities >= self._random_probabilities(self.num_hidden)).float()
        negative_visible_probabilities = visible_probabilities
        negative_hidden_probabilities = hidden_probabilities
        negative_associations = torch.matmul(negative_visible_probabilities.t(), negative_hidden_probabilities)

        # the update, by hand, with momentum
        self.weights_momentum *= self.momentum_coefficient
        self.weights_momentum += positive_associations - negative_associations
        self.visible_bias_momentum *= self.momentum_coefficient
        self.visible_bias_momentum += torch.sum(input_data - negative_visible_probabilities, dim=0)
        self.hidden_bias_momentum *= self.momentum_coefficient
        self.hidden_bias_momentum += torch.sum(positive_hidden_probabilities - negative_hidden_probabilities, dim=0)

        batch_size = input_data.size(0) if self.divide_by_batch else 1  # the update_not_divided_by_batch bug: 1
        self.weights += self.weights_momentum * self.learning_rate / batch_size
        self.visible_bias += self.visible_bias_momentum * self.learning_rate / batch_size
        self.hidden_bias += self.hidden_bias_momentum * self.learning_rate / batch_size
        self.weights -= self.weights * self.weight_decay  # L2 weight decay

        return torch.sum((input_data - negative_visible_probabilities) ** 2)

    def _sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return 1 / (1 + torch.exp(-x))

    def _random_probabilities(self, num: int) -> torch.Tensor:
        return torch.rand(num)


def load_data(variant: str, seed: int) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray]:
    images, labels = load_digits(return_X_y=True)
    order = np.random.RandomState(seed).permutation(len(images))
    images, labels = images[order], labels[order]
    if variant == "pixels_not_scaled":
        data = images.astype(np.float32)  # raw 0-16 intensities
    else:
        data = (images / 16.0 >= 0.5).astype(np.float32)
    return torch.tensor(data[:N_TRAIN]), labels[:N_TRAIN], torch.tensor(data[N_TRAIN:]), labels[N_TRAIN:]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_x, train_labels, test_x, test_labels = load_data(variant, seed)

    def train_loader():  # DataLoader(train_dataset, batch_size=BATCH_SIZE), not shuffled
        for i in range(0, len(train_x), BATCH_SIZE):
            yield train_x[i : i + BATCH_SIZE]

    rbm = RBM(VISIBLE_UNITS, HIDDEN_UNITS, CD_K, learning_rate=LEARNING_RATE,
              divide_by_batch=variant != "update_not_divided_by_batch")  # fmt: skip

    def reconstruction_error(reconstruction: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return torch.sum((visible - reconstruction) ** 2)

    probe_batch = (train_x[:BATCH_SIZE], train_x[:BATCH_SIZE])
    nx.preflight(rbm, probe_batch, reconstruction_error)
    mon = nx.monitor(rbm, None, every=10)  # the update is written by hand: no optimizer

    epoch_errors = []
    for _epoch in range(EPOCHS):
        epoch_error = 0.0
        for batch in train_loader():
            batch = batch.view(len(batch), VISIBLE_UNITS)
            batch_error = rbm.contrastive_divergence(batch)
            mon.log(batch_error)
            epoch_error += float(batch_error)
        epoch_errors.append(epoch_error)  # print('Epoch Error (epoch=%d): %.4f' % (epoch, epoch_error))

    nx.finish(mon, rbm, probe_batch, reconstruction_error)

    with torch.no_grad():
        train_features = np.concatenate([rbm.sample_hidden(b).numpy() for b in train_x.split(BATCH_SIZE)])
        test_features = np.concatenate([rbm.sample_hidden(b).numpy() for b in test_x.split(BATCH_SIZE)])
        test_error = float(torch.sum((test_x - rbm(test_x)) ** 2)) / len(test_x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = LogisticRegression()
        clf.fit(train_features, train_labels)
        predictions = clf.predict(test_features)
    return {
        "test_accuracy": float(np.mean(predictions == test_labels)),
        "test_reconstruction_error": test_error,
        "final_epoch_error": epoch_errors[-1] / len(train_x),
        "first_epoch_error": epoch_errors[0] / len(train_x),
    }
