"""Port of eriklindernoren's PyTorch-GAN InfoGAN (``infogan.py``): a generator fed noise, a
one-hot categorical code and two continuous codes; a discriminator with an adversarial
head, an auxiliary class head and a latent-code head; an LSGAN (MSE) adversarial loss and
an information loss stepped by a third optimizer over both networks.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/infogan/infogan.py`` at
commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik
Linder-Norén). Written anew from the facts of that file; no code copied.

Kept: ``weights_init_normal`` (N(0, 0.02) on every Conv weight, N(1, 0.02)/0 on BatchNorm);
``to_categorical`` (numpy one-hot as a float tensor); ``Generator`` = ``cat((noise,
labels, code), -1)`` -> ``Linear`` to 128-ish x (img_size/4)^2, ``view``, ``BatchNorm2d``,
``Upsample(2)``, 3x3 ``Conv2d``, ``BatchNorm2d(c, 0.8)`` (the 0.8 lands on ``eps``, as in
the original), ``LeakyReLU(0.2, inplace=True)``, ``Upsample(2)``, 3x3 conv, BN(0.8),
LeakyReLU, 3x3 conv to ``channels``, ``Tanh``; ``Discriminator`` = four blocks of 3x3
stride-2 ``Conv2d`` + ``LeakyReLU(0.2, inplace=True)`` + ``Dropout2d(0.25)`` (+
``BatchNorm2d(c, 0.8)`` from the second), flattened, then ``adv_layer`` (``Linear`` to 1),
``aux_layer`` (``Linear`` to ``n_classes`` + ``Softmax``: kept as published, fed to
``CrossEntropyLoss``, see the note below) and ``latent_layer`` (``Linear`` to
``code_dim``); ``adversarial_loss = MSELoss``, ``categorical_loss = CrossEntropyLoss``,
``continuous_loss = MSELoss``, ``lambda_cat = 1``, ``lambda_con = 0.1``; three
``Adam(lr=2e-4, betas=(0.5, 0.999))``: ``optimizer_G`` (generator), ``optimizer_D``
(discriminator), ``optimizer_info`` over ``itertools.chain`` of both; the loader
``shuffle=True`` with a short last batch; per batch: ``valid``/``fake`` (batch, 1)
targets, the real labels one-hot (unused, as in the original), the generator step
(noise ``N(0, 1)``, random one-hot labels, codes ``U(-1, 1)``, ``MSE(D(G(...))[0], valid)``),
the discriminator step (real vs ``gen_imgs.detach()``, ``(real + fake) / 2``), the
information step (``optimizer_info.zero_grad()``, new ``sampled_labels``, their one-hot
and ``gt_labels``, new noise and codes, ``lambda_cat * CE(pred_label, gt_labels) +
lambda_con * MSE(pred_code, code_input)``, backward, step); images through
``Resize`` + ``ToTensor`` + ``Normalize([0.5], [0.5])``.
The published ``aux_layer`` ends in ``nn.Softmax`` and its output goes to
``CrossEntropyLoss`` (a softmax applied twice; reported upstream as issue #84): this is
the program as published, so the healthy run keeps it.
Shrunk: scikit-learn's 8x8 digits at their own size (``img_size`` 8: the generator starts
at 2x2, and the discriminator has three blocks instead of four so it still ends at 1x1)
instead of MNIST resized to 32; latent_dim 62 and code_dim 2 kept; the channel widths
quartered/halved (generator 32-32-16, discriminator 8-16-32); 20 epochs of 29 batches of
64 instead of 200 epochs of 938; numpy's draws from a seeded ``RandomState`` instead of
the global one; ``sample_image``/``save_image`` and the print line left out (the three
losses kept as a record).
Measure only (after training): 500 samples, 50 per categorical code (noise N(0, 1),
continuous codes 0), read by a nearest-class-mean classifier of the real digits:
``code_nmi`` is the normalized mutual information between the code asked for and the
digit read (how much the categorical code controls the digit; ~0 when the generator
ignores it); ``nearest_real`` the mean per-pixel distance of each sample to its nearest
real digit.

nndx, as the author would add it: the info loss is the one loss of the program with
targets (the code the images were generated from), so the preflight ``nndx.probe`` is of
the discriminator on 64 images of the untrained generator with targets ``(gt_labels,
code_input)`` and the program's info loss written as a function of D's outputs; one
``nndx.Monitor({"G": generator, "D": discriminator}, [optimizer_G, optimizer_D,
optimizer_info])`` around the loop (the Monitor's documented form for a GAN), the
info loss logged as the train loss; after training ``nndx.probe(discriminator, ...,
monitor=mon)`` on the preflight batch, diagnosed.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "infogan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/infogan/infogan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

_NMI = Measure("code_nmi", "normalized mutual information between the categorical code asked for and the digit a "
               "classifier of real digits reads in 500 samples, at most half the healthy run's",
               lambda healthy, buggy: not buggy > 0.5 * healthy)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "optimizer_info_misses_generator",
            "optimizer_info = Adam(discriminator.parameters(), ...): the itertools.chain dropped, the info loss's "
            "gradient reaches the generator but no optimizer steps it before optimizer_G.zero_grad() clears it, so "
            "the generator never learns to put the codes in its images",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/Natsu6767/InfoGAN-PyTorch/issues/2",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/131",
             "https://github.com/JonathanRaiman/tensorflow-infogan/issues/13"),
            _NMI,
        ),
        Variant(
            "gt_labels_resampled",
            "gt_labels drawn by a second np.random.randint instead of from sampled_labels: the categorical target of "
            "the info loss is not the code the generator was given",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/mafda/generative_adversarial_networks_101/issues/2",
             "https://github.com/eriklindernoren/Keras-GAN/issues/105",
             "https://github.com/burness/tensorflow-101/issues/13"),
            _NMI,
        ),
    )
}

# the options, shrunk
n_epochs, batch_size, lr, b1, b2 = 20, 64, 0.0002, 0.5, 0.999
latent_dim, code_dim, n_classes, img_size, channels = 62, 2, 10, 8, 1
G_WIDTHS = (32, 32, 16)  # the original's 128, 128, 64
D_WIDTHS = (8, 16, 32)  # the original's 16, 32, 64, 128: one block fewer for 8x8 images
lambda_cat, lambda_con = 1, 0.1
N_PER_CODE = 50
PROBE = 64


def weights_init_normal(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


def to_categorical(y: np.ndarray, num_columns: int) -> torch.Tensor:
    """One-hot rows of ``y``, as a float tensor."""
    y_cat = np.zeros((y.shape[0], num_columns))
    y_cat[range(y.shape[0]), y] = 1.0
    return torch.as_tensor(y_cat, dtype=torch.float32)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        input_dim = latent_dim + n_classes + code_dim
        self.init_size = img_size // 4  # before the two upsamplings
        self.l1 = nn.Sequential(nn.Linear(input_dim, G_WIDTHS[0] * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(G_WIDTHS[0]),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_WIDTHS[0], G_WIDTHS[1], 3, stride=1, padding=1),
            nn.BatchNorm2d(G_WIDTHS[1], 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(G_WIDTHS[1], G_WIDTHS[2], 3, stride=1, padding=1),
            nn.BatchNorm2d(G_WIDTHS[2], 0.8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(G_WIDTHS[2], channels, 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, noise: torch.Tensor, labels: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        gen_input = torch.cat((noise, labels, code), -1)
        out = self.l1(gen_input)
        out = out.view(out.shape[0], G_WIDTHS[0], self.init_size, self.init_size)
        return self.conv_blocks(out)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def discriminator_block(in_filters: int, out_filters: int, bn: bool = True) -> list[nn.Module]:
            block: list[nn.Module] = [nn.Conv2d(in_filters, out_filters, 3, 2, 1), nn.LeakyReLU(0.2, inplace=True),
                                      nn.Dropout2d(0.25)]  # fmt: skip
            if bn:
                block.append(nn.BatchNorm2d(out_filters, 0.8))
            return block

        self.conv_blocks = nn.Sequential(
            *discriminator_block(channels, D_WIDTHS[0], bn=False),
            *discriminator_block(D_WIDTHS[0], D_WIDTHS[1]),
            *discriminator_block(D_WIDTHS[1], D_WIDTHS[2]),
        )
        ds_size = img_size // 2**3  # the side after three stride-2 blocks
        features = D_WIDTHS[2] * ds_size**2
        self.adv_layer = nn.Sequential(nn.Linear(features, 1))
        self.aux_layer = nn.Sequential(nn.Linear(features, n_classes), nn.Softmax(dim=1))  # as published
        self.latent_layer = nn.Sequential(nn.Linear(features, code_dim))

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.conv_blocks(img)
        out = out.view(out.shape[0], -1)
        return self.adv_layer(out), self.aux_layer(out), self.latent_layer(out)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)  # the original's np.random
    train_images, train_labels, _, _ = data.digit_images(seed=seed, test_size=0)
    dataset_x = (data.to_tensor(train_images) - 0.5) / 0.5  # ToTensor + Normalize([0.5], [0.5])
    dataset_y = train_labels
    loader_rng = torch.Generator().manual_seed(seed)  # DataLoader(shuffle=True)'s sampler

    adversarial_loss = torch.nn.MSELoss()
    categorical_loss = torch.nn.CrossEntropyLoss()
    continuous_loss = torch.nn.MSELoss()

    generator, discriminator = Generator(), Discriminator()
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))
    info_params = (discriminator.parameters() if variant == "optimizer_info_misses_generator"
                   else itertools.chain(generator.parameters(), discriminator.parameters()))  # fmt: skip
    optimizer_info = torch.optim.Adam(info_params, lr=lr, betas=(b1, b2))

    def info_criterion(outputs: tuple[torch.Tensor, ...], targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The program's info loss, as a function of D's outputs and (gt_labels, code_input)."""
        _, pred_label, pred_code = outputs
        gt, code = targets
        return lambda_cat * categorical_loss(pred_label, gt) + lambda_con * continuous_loss(pred_code, code)

    # the preflight batch: the untrained generator's images with the codes they were made from
    probe_rng = np.random.RandomState(seed + 1)
    with torch.no_grad():
        probe_labels = probe_rng.randint(0, n_classes, PROBE)
        probe_z = torch.as_tensor(probe_rng.normal(0, 1, (PROBE, latent_dim)), dtype=torch.float32)
        probe_code = torch.as_tensor(probe_rng.uniform(-1, 1, (PROBE, code_dim)), dtype=torch.float32)
        probe_imgs = generator(probe_z, to_categorical(probe_labels, n_classes), probe_code)
        probe_gt = torch.as_tensor(probe_labels if variant != "gt_labels_resampled"
                                   else probe_rng.randint(0, n_classes, PROBE), dtype=torch.long)  # fmt: skip
    probe_batch = (probe_imgs, (probe_gt, probe_code))
    nx.preflight(discriminator, probe_batch, info_criterion, optimizer=optimizer_info)
    mon = nx.monitor({"G": generator, "D": discriminator}, [optimizer_G, optimizer_D, optimizer_info], every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    info_losses: list[float] = []
    for epoch in range(n_epochs):
        order = torch.randperm(len(dataset_x), generator=loader_rng)
        for i in range(0, len(order), batch_size):
            imgs, labels = dataset_x[order[i : i + batch_size]], dataset_y[order[i : i + batch_size]]
            bs = imgs.shape[0]
            valid = torch.full((bs, 1), 1.0)  # adversarial ground truths
            fake = torch.full((bs, 1), 0.0)
            real_imgs = imgs.float()
            labels = to_categorical(labels.numpy(), num_columns=n_classes)  # unused, as in the original

            # train the generator
            optimizer_G.zero_grad()
            z = torch.as_tensor(rng.normal(0, 1, (bs, latent_dim)), dtype=torch.float32)
            label_input = to_categorical(rng.randint(0, n_classes, bs), num_columns=n_classes)
            code_input = torch.as_tensor(rng.uniform(-1, 1, (bs, code_dim)), dtype=torch.float32)
            gen_imgs = generator(z, label_input, code_input)
            validity, _, _ = discriminator(gen_imgs)
            g_loss = adversarial_loss(validity, valid)
            g_loss.backward()
            optimizer_G.step()

            # train the discriminator
            optimizer_D.zero_grad()
            real_pred, _, _ = discriminator(real_imgs)
            d_real_loss = adversarial_loss(real_pred, valid)
            fake_pred, _, _ = discriminator(gen_imgs.detach())
            d_fake_loss = adversarial_loss(fake_pred, fake)
            d_loss = (d_real_loss + d_fake_loss) / 2
            d_loss.backward()
            optimizer_D.step()

            # information loss
            optimizer_info.zero_grad()
            sampled_labels = rng.randint(0, n_classes, bs)
            if variant == "gt_labels_resampled":
                gt_labels = torch.as_tensor(rng.randint(0, n_classes, bs), dtype=torch.long)
            else:
                gt_labels = torch.as_tensor(sampled_labels, dtype=torch.long)
            z = torch.as_tensor(rng.normal(0, 1, (bs, latent_dim)), dtype=torch.float32)
            label_input = to_categorical(sampled_labels, num_columns=n_classes)
            code_input = torch.as_tensor(rng.uniform(-1, 1, (bs, code_dim)), dtype=torch.float32)
            gen_imgs = generator(z, label_input, code_input)
            _, pred_label, pred_code = discriminator(gen_imgs)
            info_loss = lambda_cat * categorical_loss(pred_label, gt_labels) + lambda_con * continuous_loss(
                pred_code, code_input)
            info_loss.backward()
            optimizer_info.step()
            mon.log(info_loss)

            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())
            info_losses.append(info_loss.item())

    nx.finish(mon, discriminator, probe_batch, info_criterion, optimizer=optimizer_info)

    # measure only: does the categorical code decide the digit? (a classifier of real digits reads the samples)
    from sklearn.metrics import normalized_mutual_info_score

    real_flat = dataset_x.reshape(len(dataset_x), -1)
    centroids = torch.stack([real_flat[dataset_y == k].mean(0) for k in range(n_classes)])
    sample_rng = np.random.RandomState(seed + 2)
    asked = np.repeat(np.arange(n_classes), N_PER_CODE)
    generator.eval()
    with torch.no_grad():
        z = torch.as_tensor(sample_rng.normal(0, 1, (len(asked), latent_dim)), dtype=torch.float32)
        samples = generator(z, to_categorical(asked, n_classes), torch.zeros(len(asked), code_dim))
        samples = samples.reshape(len(asked), -1)
        nearest = torch.cdist(samples, real_flat).min(1).values.mean() / samples.shape[1] ** 0.5
        read_as = torch.cdist(samples, centroids).argmin(1).numpy()
    tail = slice(-50, None)
    return {
        "code_nmi": float(normalized_mutual_info_score(asked, read_as)),
        "nearest_real": float(nearest),
        "late_d_loss": float(np.mean(d_losses[tail])),
        "late_g_loss": float(np.mean(g_losses[tail])),
        "late_info_loss": float(np.mean(info_losses[tail])),
    }
