"""Port of rasbt/deeplearning-models' fully connected GAN on MNIST: one ``GAN`` module holding
a generator (``Linear(LATENT_DIM, 128)``, LeakyReLU, Dropout 0.5, ``Linear(128, 784)``, Tanh)
and a discriminator (``Linear(784, 128)``, LeakyReLU, Dropout 0.5, ``Linear(128, 1)``,
Sigmoid), each with its own Adam, trained with ``F.binary_cross_entropy`` on the
discriminator's probabilities: each batch first the generator step, then the discriminator
step on the real images and the detached generated ones.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/gan/gan.ipynb`` at commit
18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian Raschka).
Written anew from the facts of that notebook; no code copied.

Kept: the settings (``random_seed`` 123 replaced by the bench seed, ``generator_learning_rate``
and ``discriminator_learning_rate`` 0.001, ``BATCH_SIZE`` 128, ``LATENT_DIM`` 75, ``IMG_SHAPE``
(1, 28, 28), ``IMG_SIZE`` 784); the ``GAN`` class as written, including
``discriminator_forward`` calling the global ``model.discriminator`` and returning
``pred.view(-1)``; ``optim_gener = Adam(model.generator.parameters())``, ``optim_discr =
Adam(model.discriminator.parameters())``; the loop: ``model.train()`` each epoch, ``features
= (features - 0.5)*2.`` then ``.view(-1, IMG_SIZE)``, ``valid``/``fake`` as ones/zeros of the
batch size, ``z`` uniform in [-1, 1] (``torch.zeros(...).uniform_(-1.0, 1.0)``), generator
loss ``F.binary_cross_entropy(discr_pred, valid)`` with ``optim_gener.zero_grad()``,
``backward``, ``step``; discriminator loss ``0.5*(real_loss + fake_loss)`` on
``generated_features.detach()`` with ``optim_discr.zero_grad()``, ``backward``, ``step``;
``discr_costs``/``gener_costs`` appended the loss tensors themselves; the printed losses every
100 batches; ``model.eval()`` before generating images from new ``z``.
Shrunk or replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 through
``ToTensor``'s [0, 1] scaling (1,437 train / 360 test images) instead of MNIST's 60,000, in
a shuffling ``DataLoader`` of 128; 120 epochs (1,440 steps) instead of 100 epochs of 469
batches; no plots; CPU.
Measure only (not in the program): after training, 360 images generated as the notebook's
visualisation cell does (``model.eval()``, uniform ``z``), compared with the 360 test images
(scaled to [-1, 1] as in training) by the Frechet distance of their projections on the first
20 principal components of the training images (an FID computed in pixel-PCA space; 0 is the
test set itself).

nndx, as a GAN author would add it after reading the README: a preflight ``nndx.probe`` of
``model.discriminator`` (the model whose loss has a target) on 64 real and 64 generated images
against ones and zeros shaped as its output, with ``F.binary_cross_entropy`` and
``optim_discr``; one ``nndx.Monitor`` per sub-model/optimizer pair, ``discr_loss`` and
``gener_loss`` logged every batch to their Monitors; after training ``nndx.probe(
model.discriminator, ..., monitor=mon_d)`` on the same batch and the generator Monitor's report,
each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import linalg
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_gan"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/gan/gan.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 upsampled digits, 120 epochs of 12 batches)"),
        Variant(
            "gener_loss_fake_labels",
            "the generator's loss is computed against the fake labels (F.binary_cross_entropy(discr_pred, fake)) "
            "instead of valid: the generator is trained to make the discriminator call its images fake, so it "
            "helps the discriminator instead of fooling it",
            (C.WRONG_LOSS,),
            ("https://github.com/ptran1203/pytorch-animeGAN/issues/17",
             "https://github.com/yunjey/pytorch-tutorial/issues/45",
             "https://github.com/NVIDIA/pix2pixHD/issues/233",
             "https://github.com/keras-team/keras-io/issues/361"),
            Measure("frechet_pca", "PCA-space Frechet distance of generated to test images at least 2x the "
                    "healthy run's: 331/326 against 109/119 healthy on seeds 0/1 (the test set vs 360 training "
                    "images: 3.1)", lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "no_discr_zero_grad",
            "optim_discr.zero_grad() is left out: the discriminator's gradients accumulate over all steps, "
            "including the gradients gener_loss.backward() leaves in its weights (which push it to call the fakes "
            "real)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Project-MONAI/GenerativeModels/issues/102",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25"),
            Measure("frechet_pca", "PCA-space Frechet distance of generated to test images at least 1.2x the "
                    "healthy run's: 146/159 against 109/119 healthy on seeds 0/1 (1.34x both; the discriminator "
                    "ends broken, its loss stuck at 50 against 0.27/0.22 healthy; at 60 epochs the two distances "
                    "are equal, 146 and 147)", lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

generator_learning_rate = 0.001
discriminator_learning_rate = 0.001
NUM_EPOCHS = 120
BATCH_SIZE = 128
LATENT_DIM = 75
IMG_SHAPE = (1, 28, 28)
IMG_SIZE = 1
for _x in IMG_SHAPE:
    IMG_SIZE *= _x


def frechet_pca(generated: np.ndarray, real: np.ndarray, basis: np.ndarray, mean: np.ndarray) -> float:
    a, b = (generated - mean) @ basis, (real - mean) @ basis
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(cov_a @ cov_b)
    covmean = covmean.real if np.iscomplexobj(covmean) else covmean
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2.0 * covmean))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_dataset = TensorDataset(digits.upscaled(tr_raw, 28), tr_y)  # transforms.ToTensor(): 0-1 range
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)

    model = None

    class GAN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = nn.Sequential(
                nn.Linear(LATENT_DIM, 128),
                nn.LeakyReLU(inplace=True),
                nn.Dropout(p=0.5),
                nn.Linear(128, IMG_SIZE),
                nn.Tanh(),
            )
            self.discriminator = nn.Sequential(
                nn.Linear(IMG_SIZE, 128),
                nn.LeakyReLU(inplace=True),
                nn.Dropout(p=0.5),
                nn.Linear(128, 1),
                nn.Sigmoid(),
            )

        def generator_forward(self, z):
            img = self.generator(z)
            return img

        def discriminator_forward(self, img):
            pred = model.discriminator(img)  # the notebook's global ``model``
            return pred.view(-1)

    model = GAN()
    optim_gener = torch.optim.Adam(model.generator.parameters(), lr=generator_learning_rate)
    optim_discr = torch.optim.Adam(model.discriminator.parameters(), lr=discriminator_learning_rate)

    # nndx: the discriminator on real and generated images (drawn without touching the program's RNG)
    with torch.random.fork_rng():
        real = (train_dataset.tensors[0][:64] - 0.5) * 2.0
        with torch.no_grad():
            gen = model.generator_forward(torch.zeros((64, LATENT_DIM)).uniform_(-1.0, 1.0))
    probe_batch = (torch.cat([real.view(-1, IMG_SIZE), gen]), torch.cat([torch.ones(64, 1), torch.zeros(64, 1)]))
    nx.preflight(model.discriminator, probe_batch, F.binary_cross_entropy, optimizer=optim_discr)
    mon_d = nx.monitor(model.discriminator, optim_discr)
    mon_g = nx.monitor(model.generator, optim_gener)

    discr_costs = []
    gener_costs = []
    printed = []
    for epoch in range(NUM_EPOCHS):
        model = model.train()
        for batch_idx, (features, targets) in enumerate(train_loader):
            features = (features - 0.5) * 2.0
            features = features.view(-1, IMG_SIZE)
            valid = torch.ones(targets.size(0)).float()
            fake = torch.zeros(targets.size(0)).float()

            # Train Generator
            z = torch.zeros((targets.size(0), LATENT_DIM)).uniform_(-1.0, 1.0)
            generated_features = model.generator_forward(z)
            discr_pred = model.discriminator_forward(generated_features)
            gener_target = fake if variant == "gener_loss_fake_labels" else valid
            gener_loss = F.binary_cross_entropy(discr_pred, gener_target)
            optim_gener.zero_grad()
            gener_loss.backward()
            optim_gener.step()

            # Train Discriminator
            discr_pred_real = model.discriminator_forward(features.view(-1, IMG_SIZE))
            real_loss = F.binary_cross_entropy(discr_pred_real, valid)
            discr_pred_fake = model.discriminator_forward(generated_features.detach())
            fake_loss = F.binary_cross_entropy(discr_pred_fake, fake)
            discr_loss = 0.5 * (real_loss + fake_loss)
            if variant != "no_discr_zero_grad":
                optim_discr.zero_grad()
            discr_loss.backward()
            optim_discr.step()

            discr_costs.append(discr_loss)
            gener_costs.append(gener_loss)
            nx.timed(lambda: mon_d.log(discr_loss))  # noqa: B023
            nx.timed(lambda: mon_g.log(gener_loss))  # noqa: B023

            if not batch_idx % 100:
                printed.append((float(gener_loss), float(discr_loss)))

    nx.finish(mon_d, model.discriminator, probe_batch, F.binary_cross_entropy, optimizer=optim_discr)
    nx.finish(mon_g)

    # measure only: images generated as the visualisation cell does, against the test images
    model.eval()
    with torch.no_grad():
        z = torch.zeros((len(te_raw), LATENT_DIM)).uniform_(-1.0, 1.0)
        generated = model.generator_forward(z).numpy().astype(np.float64)
    train_px = ((digits.upscaled(tr_raw, 28) - 0.5) * 2.0).view(-1, IMG_SIZE).numpy().astype(np.float64)
    test_px = ((digits.upscaled(te_raw, 28) - 0.5) * 2.0).view(-1, IMG_SIZE).numpy().astype(np.float64)
    mean = train_px.mean(0)
    _, _, vt = np.linalg.svd(train_px - mean, full_matrices=False)
    basis = vt[:20].T
    return {
        "frechet_pca": frechet_pca(generated, test_px, basis, mean),
        "frechet_pca_train_vs_test": frechet_pca(train_px[:360], test_px, basis, mean),
        "last_gener_loss": float(np.mean([float(c) for c in gener_costs[-12:]])),
        "last_discr_loss": float(np.mean([float(c) for c in discr_costs[-12:]])),
    }
