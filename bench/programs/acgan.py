"""Port of eriklindernoren's PyTorch-GAN auxiliary classifier GAN (``acgan.py``): a generator
fed noise multiplied by a label embedding; a discriminator with an adversarial sigmoid head
and an auxiliary softmax class head; BCELoss + CrossEntropyLoss; two Adam optimizers.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/acgan/acgan.py`` at commit
36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c) 2018 Erik Linder-Norén).
Written anew from the facts of that file; no code copied.

Kept: ``weights_init_normal`` (N(0, 0.02) on every Conv weight, N(1, 0.02)/0 on
``BatchNorm2d``); ``Generator`` = ``nn.Embedding(n_classes, latent_dim)`` of the label
multiplied elementwise with the noise (``torch.mul``), ``Linear`` to ``c * (img_size/4)^2``,
``view``, ``BatchNorm2d``, ``Upsample(2)``, 3x3 ``Conv2d``, ``BatchNorm2d(c, 0.8)`` (the 0.8
lands on ``eps``, as in the original), ``LeakyReLU(0.2, inplace=True)``, ``Upsample(2)``, 3x3
conv, ``BatchNorm2d(c, 0.8)``, ``LeakyReLU``, 3x3 conv to ``channels``, ``Tanh``;
``Discriminator`` = four blocks of 3x3 stride-2 ``Conv2d`` + ``LeakyReLU(0.2, inplace=True)``
+ ``Dropout2d(0.25)`` (+ ``BatchNorm2d(c, 0.8)`` from the second), flattened, then
``adv_layer`` = ``Linear`` to 1 + ``Sigmoid`` and ``aux_layer`` = ``Linear`` to
``n_classes`` + ``nn.Softmax()`` (no dim, as published; its output goes to
``CrossEntropyLoss``: a softmax applied twice, reported upstream as PR #98, issues #141 and
#150; this is the program as published, so every variant keeps it); ``adversarial_loss =
BCELoss()``, ``auxiliary_loss = CrossEntropyLoss()``; ``Adam(lr=2e-4, betas=(0.5, 0.999))``
per model; the loader ``shuffle=True`` with a short last batch; per batch ``valid``/``fake``
targets of shape (batch, 1); the generator step (``optimizer_G.zero_grad()``, noise
``N(0, 1)`` and ``gen_labels`` ``randint(0, n_classes)`` from numpy, ``g_loss = 0.5 *
(BCE(validity, valid) + CE(pred_label, gen_labels))``, backward, step); the discriminator
step (``optimizer_D.zero_grad()``, ``d_real_loss = (BCE(real_pred, valid) + CE(real_aux,
labels)) / 2``, ``d_fake_loss`` the same on ``gen_imgs.detach()`` with ``fake`` and
``gen_labels``, ``d_loss = (d_real_loss + d_fake_loss) / 2``, the class accuracy ``d_acc``
over both halves, backward, step); ``sample_image(n_row=10, ...)`` every ``sample_interval``
batches (``batches_done % sample_interval == 0``: the first batch too), drawing a 10 x 10 grid,
one row per class, from the generator as it is (the program never calls ``eval()``); images
through ``Resize`` + ``ToTensor`` + ``Normalize([0.5], [0.5])``.
Shrunk: scikit-learn's 8x8 digits (1,797 images) resized (bilinear) to ``img_size`` 16 instead
of MNIST resized to 32, so the discriminator's four stride-2 blocks still end at 1x1 and the
generator starts at 4x4; latent_dim 100 kept; the generator's widths quartered (32-32-16
instead of 128-128-64), the discriminator's halved (8-16-32-64 instead of 16-32-64-128); 15
epochs of 29 batches of 64 (435 steps) instead of 200 of 938, at the published lr; ``sample_interval`` 100 instead of 400 (the grid is drawn, not saved);
numpy's draws from a seeded ``RandomState`` instead of the global one; the print line left
out (the losses and ``d_acc`` kept as a record).
Measure only (after training): 1,000 samples, 100 per class, drawn as ``sample_image`` draws
them (the generator in training mode), read by a small CNN classifier trained on the fly on
the real 16x16 digits, correctly paired (the same for every variant of a seed; 94-99%
held-out accuracy): ``cond_acc`` is the share read as the class asked for,
``sample_confidence`` the classifier's mean top probability, ``frechet`` the Frechet distance
between the classifier's penultimate features of the samples and of the real digits.
The healthy run reaches ``cond_acc`` 0.56/0.45/0.50 (chance 0.1) and ``frechet``
235/295/156 on seeds 0-2: far from a converged ACGAN, but its samples are read as the class
asked for five times as often as chance.

nndx, as the author would add it (as in the CGAN port): a preflight ``nndx.probe`` of the
discriminator, the one model whose loss has targets, on 32 real digits with the labels the
loop gives them and 32 images of the untrained generator with their ``gen_labels``, the
targets ``(validity, class)`` = ((batch, 1) ones then zeros, labels), and the
discriminator's loss on such a mixed batch written as ``loss_fn`` (``(BCE + CE) / 2``: the
program's ``d_loss`` when the halves are equal); one ``nndx.Monitor`` per model/optimizer
pair, ``g_loss``/``d_loss`` logged to them where they are computed; after training
``nndx.probe(discriminator, ..., monitor=monD)`` and the generator Monitor's report, each
diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "acgan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/acgan/acgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digits, narrower nets, 15 epochs)"),
        Variant(
            "d_zero_grad_dropped",
            "optimizer_D.zero_grad() left out: the discriminator's .grad keeps summing every earlier d_loss "
            "gradient and every g_loss gradient (g_loss.backward() runs through the discriminator), which "
            "optimizer_D.step() then follows",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/Project-MONAI/GenerativeModels/issues/102"),
            Measure("frechet", "Frechet distance between the penultimate features (a CNN classifier of real digits) "
                    "of 1,000 samples and of the real digits, 1.5x the healthy run's or more: 630/649/313 against "
                    "235/295/156 healthy on seeds 0-2", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "images_shuffled_apart_from_labels",
            "the image array shuffled on its own (np.random.shuffle; here a seeded permutation) before the dataset is built, the labels left "
            "in their order: the auxiliary class loss on real images is trained on labels that are not theirs",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/udacity/sdc-issue-reports/issues/1326",
             "https://github.com/caicloud/tensorflow-tutorial/issues/114"),
            Measure("cond_acc", "share of 1,000 samples (100 per class) a CNN classifier of real digits reads as the "
                    "class they were generated for, at least 0.2 below the healthy run's: 0.21/0.13/0.09 against "
                    "0.56/0.45/0.50 healthy on seeds 0-2", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

# the options, shrunk
n_epochs, batch_size, lr, b1, b2 = 15, 64, 0.0002, 0.5, 0.999
latent_dim, n_classes, img_size, channels = 100, 10, 16, 1
sample_interval = 100
G_WIDTHS = (32, 32, 16)  # the original's 128, 128, 64
D_WIDTHS = (8, 16, 32, 64)  # the original's 16, 32, 64, 128
PROBE = 32
N_PER_CLASS = 100


def weights_init_normal(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.label_emb = nn.Embedding(n_classes, latent_dim)
        self.init_size = img_size // 4  # before the two upsamplings
        self.l1 = nn.Sequential(nn.Linear(latent_dim, G_WIDTHS[0] * self.init_size**2))
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

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        gen_input = torch.mul(self.label_emb(labels), noise)
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
            *discriminator_block(D_WIDTHS[2], D_WIDTHS[3]),
        )
        ds_size = img_size // 2**4  # the side after four stride-2 blocks
        self.adv_layer = nn.Sequential(nn.Linear(D_WIDTHS[3] * ds_size**2, 1), nn.Sigmoid())
        self.aux_layer = nn.Sequential(nn.Linear(D_WIDTHS[3] * ds_size**2, n_classes), nn.Softmax())  # as published

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.conv_blocks(img)
        out = out.view(out.shape[0], -1)
        return self.adv_layer(out), self.aux_layer(out)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)  # the original's np.random
    raw, labels_all, _, _ = data.digit_images(seed=seed, test_size=0)
    images = (data.upscaled(raw, img_size) - 0.5) / 0.5  # Resize + ToTensor + Normalize([0.5], [0.5])
    if variant == "images_shuffled_apart_from_labels":
        images = images[torch.from_numpy(np.random.RandomState(seed + 10).permutation(len(images)))]
    dataset = TensorDataset(images, labels_all)
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))

    adversarial_loss = torch.nn.BCELoss()
    auxiliary_loss = torch.nn.CrossEntropyLoss()

    generator, discriminator = Generator(), Discriminator()
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))

    def d_loss_fn(outputs: tuple[torch.Tensor, torch.Tensor], targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The discriminator's loss on a batch of real and generated images, as loss_fn(output, target)."""
        validity, aux = outputs
        is_real, cls = targets
        return (adversarial_loss(validity, is_real) + auxiliary_loss(aux, cls)) / 2

    def sample_image(n_row: int, sample_rng: np.random.RandomState) -> torch.Tensor:
        """A grid of generated digits, one row per class (saved to a png in the original)."""
        z = torch.as_tensor(sample_rng.normal(0, 1, (n_row**2, latent_dim)), dtype=torch.float32)
        grid_labels = torch.as_tensor(np.array([num for _ in range(n_row) for num in range(n_row)]), dtype=torch.long)
        return generator(z, grid_labels)

    # the preflight batch: real digits with the labels the loop gives them, the untrained generator's with theirs
    probe_rng = np.random.RandomState(seed + 1)
    with torch.no_grad():
        probe_gen_labels = torch.as_tensor(probe_rng.randint(0, n_classes, PROBE), dtype=torch.long)
        probe_z = torch.as_tensor(probe_rng.normal(0, 1, (PROBE, latent_dim)), dtype=torch.float32)
        probe_fake = generator(probe_z, probe_gen_labels)
    probe_batch = (torch.cat([dataset.tensors[0][:PROBE], probe_fake]),
                   (torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]),
                    torch.cat([dataset.tensors[1][:PROBE], probe_gen_labels])))  # fmt: skip
    nx.preflight(discriminator, probe_batch, d_loss_fn, optimizer=optimizer_D)
    monD = nx.monitor(discriminator, optimizer_D, every=10)
    monG = nx.monitor(generator, optimizer_G, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    d_accs: list[float] = []
    for epoch in range(n_epochs):
        for i, (imgs, labels) in enumerate(dataloader):
            bs = imgs.shape[0]
            valid = torch.full((bs, 1), 1.0)  # adversarial ground truths
            fake = torch.full((bs, 1), 0.0)
            real_imgs = imgs.float()
            labels = labels.long()

            # train the generator
            optimizer_G.zero_grad()
            z = torch.as_tensor(rng.normal(0, 1, (bs, latent_dim)), dtype=torch.float32)
            gen_labels = torch.as_tensor(rng.randint(0, n_classes, bs), dtype=torch.long)
            gen_imgs = generator(z, gen_labels)
            validity, pred_label = discriminator(gen_imgs)
            g_loss = 0.5 * (adversarial_loss(validity, valid) + auxiliary_loss(pred_label, gen_labels))
            g_loss.backward()
            optimizer_G.step()
            monG.log(g_loss)

            # train the discriminator
            if variant != "d_zero_grad_dropped":
                optimizer_D.zero_grad()
            real_pred, real_aux = discriminator(real_imgs)
            d_real_loss = (adversarial_loss(real_pred, valid) + auxiliary_loss(real_aux, labels)) / 2
            fake_pred, fake_aux = discriminator(gen_imgs.detach())
            d_fake_loss = (adversarial_loss(fake_pred, fake) + auxiliary_loss(fake_aux, gen_labels)) / 2
            d_loss = (d_real_loss + d_fake_loss) / 2
            pred = np.concatenate([real_aux.data.numpy(), fake_aux.data.numpy()], axis=0)
            gt = np.concatenate([labels.data.numpy(), gen_labels.data.numpy()], axis=0)
            d_acc = np.mean(np.argmax(pred, axis=1) == gt)
            d_loss.backward()
            optimizer_D.step()
            monD.log(d_loss, accuracy=float(d_acc))

            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())
            d_accs.append(float(d_acc))
            batches_done = epoch * len(dataloader) + i
            if batches_done % sample_interval == 0:
                sample_image(n_row=10, sample_rng=rng)

    nx.finish(monD, discriminator, probe_batch, d_loss_fn, optimizer=optimizer_D)
    nx.finish(monG)

    # measure only: samples drawn as sample_image draws them, read by a classifier of real digits
    measure_rng = np.random.RandomState(seed + 2)
    with torch.no_grad():
        samples = torch.cat([sample_image(n_row=10, sample_rng=measure_rng) for _ in range(N_PER_CLASS // 10)])
    asked = np.tile(np.arange(n_classes), N_PER_CLASS)  # sample_image's labels: 0..9 in every row
    return {
        **measure(samples, asked, seed),
        "late_d_loss": float(np.mean(d_losses[-50:])),
        "late_g_loss": float(np.mean(g_losses[-50:])),
        "late_d_acc": float(np.mean(d_accs[-50:])),
    }


# --------------------------------------------------------------------------- measure only


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Linear(64, n_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(x)
        return self.head(f), f


@functools.lru_cache(maxsize=4)
def _judge(seed: int) -> tuple[_Classifier, torch.Tensor, torch.Tensor, float]:
    """A small CNN trained on the real 16x16 digits in [-1, 1] (correctly paired), its held-out
    accuracy, and the mean and covariance of its penultimate features on the real digits."""
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1000)
        tr_x, tr_y, te_x, te_y = data.digit_images(seed=seed + 1000, test_size=300)
        tr = (data.upscaled(tr_x, img_size) - 0.5) / 0.5
        te = (data.upscaled(te_x, img_size) - 0.5) / 0.5
        clf = _Classifier()
        opt = torch.optim.Adam(clf.parameters(), lr=2e-3)
        for _ in range(8):
            perm = torch.randperm(len(tr))
            for i in range(0, len(tr), 64):
                idx = perm[i : i + 64]
                opt.zero_grad()
                nn.functional.cross_entropy(clf(tr[idx])[0], tr_y[idx]).backward()
                opt.step()
        clf.eval()
        with torch.no_grad():
            acc = (clf(te)[0].argmax(1) == te_y).float().mean().item()
            feats = clf(torch.cat([tr, te]))[1].double()
        return clf, feats.mean(0), torch.cov(feats.T), acc


def _sqrtm_psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def measure(samples: torch.Tensor, asked: np.ndarray, seed: int) -> dict[str, float]:
    """The classifier's reading of the samples against the class asked for, and the Frechet
    distance between the samples' and the real digits' penultimate features."""
    clf, mu_r, cov_r, acc = _judge(seed)
    with torch.no_grad():
        logits, f = clf(samples)
        p = torch.softmax(logits.double(), dim=1)
        f = f.double()
    mu_g, cov_g = f.mean(0).numpy(), torch.cov(f.T).numpy()
    mu_r, cov_r = mu_r.numpy(), cov_r.numpy()
    s = _sqrtm_psd(cov_r)
    frechet = float(((mu_g - mu_r) ** 2).sum() + np.trace(cov_g) + np.trace(cov_r) - 2 * np.trace(_sqrtm_psd(s @ cov_g @ s)))
    return {
        "cond_acc": float((p.argmax(1).numpy() == asked).mean()),
        "sample_confidence": float(p.max(1).values.mean()),
        "frechet": frechet,
        "judge_acc": acc,
    }
