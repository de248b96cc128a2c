"""Port of eriklindernoren/PyTorch-GAN's Context Encoder: inpainting with an encoder-decoder
generator that fills a square hole, trained with a pixelwise L1 loss on the hole plus a
least-squares adversarial loss from a PatchGAN discriminator.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/context_encoder/context_encoder.py``,
``models.py`` and ``datasets.py`` at commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e (MIT, Copyright (c)
2018 Erik Linder-Norén). Written anew from the facts of those files; no code copied.

Kept: ``Generator`` (``downsample`` = ``Conv2d(4, stride 2, padding 1)`` [+ ``BatchNorm2d(out, 0.8)``]
+ ``LeakyReLU(0.2)``, five of them, the first without norm; a 1x1 ``Conv2d`` bottleneck;
``upsample`` = ``ConvTranspose2d(4, stride 2, padding 1)`` + ``BatchNorm2d(out, 0.8)`` + ``ReLU``,
four of them; ``Conv2d(3, 1, 1)`` + ``Tanh``); ``Discriminator`` (``Conv2d(3, stride, 1)`` blocks
with strides 2, 2, 2, 1, ``InstanceNorm2d`` on all but the first, ``LeakyReLU(0.2, inplace=True)``,
a final ``Conv2d(3, 1, 1)``: a patch of ``mask_size / 2**3`` per side); ``weights_init_normal``
(Conv N(0, 0.02), BatchNorm2d weight N(1, 0.02), bias 0); ``adversarial_loss = MSELoss``,
``pixelwise_loss = L1Loss``; Adam for both at ``lr`` 0.0002, ``betas`` (0.5, 0.999); the
``ImageDataset`` masking (train: a random ``mask_size`` square at ``randint(0, img_size -
mask_size)``, the part cut out as a view, the image cloned and the square set to 1; test: the
centre square); ``Normalize((0.5,), (0.5,))`` to [-1, 1]; the loop (``valid``/``fake`` patch
targets, ``optimizer_G.zero_grad()``, ``g_adv`` on ``discriminator(gen_parts)``, ``g_pixel`` on
the hole, ``g_loss = 0.001 * g_adv + 0.999 * g_pixel``, backward, step; then
``optimizer_D.zero_grad()``, ``real_loss`` on ``masked_parts``, ``fake_loss`` on
``gen_parts.detach()``, ``d_loss = 0.5 * (real_loss + fake_loss)``, backward, step); the test set
centre-masked in batches of 12 and fed to the generator as ``save_sample`` does (no
``generator.eval()``).
Replaced / shrunk: CelebA 128x128 RGB -> scikit-learn's 8x8 digits upsampled (bilinear) to 32x32,
one channel (1,437 train / 360 test); ``img_size`` 32 and ``mask_size`` 16 (the original's
ratio 1/2), so five downsamples reach 1x1 and four upsamples give the 16x16 hole; widths 16, 16,
32, 64, 128, bottleneck 256 instead of 64, 64, 128, 256, 512, 4000 (decoder 128, 64, 32, 16
instead of 512, 256, 128, 64); discriminator widths 16, 32, 64, 128 instead of 64, 128, 256, 512;
``batch_size`` 8 kept; 3 epochs instead of 200; CPU, ``num_workers`` 0; no image saving.
Measure only (not in the program): the discriminator's loss over the last tenth of the batches,
and the mean L1 between the generated and the true centre hole
over the whole test set (what ``save_sample`` shows as a picture).

nndx, as the author would add it (README): a preflight ``nndx.probe`` of the generator on the
first training batch ``(masked_imgs, masked_parts)`` with the pixelwise ``L1Loss`` and
``optimizer_G``; one ``nndx.Monitor`` per network (``Monitor(generator, optimizer_G)`` and
``Monitor(discriminator, optimizer_D)``, ``every=10``) logging ``g_loss`` and ``d_loss`` where
the script prints them; after training, ``nndx.probe(generator, ..., monitor=mon_G)`` on the
same batch, and the discriminator's Monitor report alone.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "context_encoder"
SOURCE = Source(
    "eriklindernoren/PyTorch-GAN", "implementations/context_encoder/context_encoder.py",
    "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT",
)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 32x32 digits, 16x16 hole, narrow nets, 3 epochs)"),
        Variant(
            "d_step_uses_optimizer_G",
            "the discriminator step is written with the generator's optimizer (optimizer_G.zero_grad() ... "
            "d_loss.backward(); optimizer_G.step()): optimizer_D is built but never stepped, so the discriminator "
            "keeps its initial weights while its gradients are computed every batch",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/85",
             "https://github.com/Lornatang/ESRGAN-PyTorch/issues/39"),
            Measure("final_d_loss", "discriminator loss over the last tenth of the batches at least 5x the healthy "
                    "run's: 0.736 against 0.002 healthy on seed 0", lambda healthy, buggy: buggy > 5.0 * healthy),
        ),
        Variant(
            "loss_weights_swapped",
            "g_loss = 0.999 * g_adv + 0.001 * g_pixel: the reconstruction and adversarial weights of the "
            "Context Encoder (lambda_rec 0.999, lambda_adv 0.001) swapped, so the generator is trained almost "
            "only to fool the discriminator and barely to reproduce the hole",
            (C.WRONG_LOSS,),
            ("https://github.com/eriklindernoren/PyTorch-GAN/issues/117",
             "https://github.com/BoyuanJiang/context_encoder_pytorch/issues/6",
             "https://github.com/pclubiitk/model-zoo/pull/29"),
            Measure("test_hole_l1", "mean L1 on the test set's centre holes at least 1.1x the healthy run's: "
                    "0.690 against 0.587 healthy on seed 0 (train pixel L1 0.691 against 0.445)",
                    lambda healthy, buggy: buggy > 1.1 * healthy),
        ),
    )
}

OPT = {"n_epochs": 3, "batch_size": 8, "lr": 0.0002, "b1": 0.5, "b2": 0.999, "img_size": 32, "mask_size": 16,
       "channels": 1}  # fmt: skip
G_WIDTHS = (16, 16, 32, 64, 128)
BOTTLENECK = 256
D_WIDTHS = (16, 32, 64, 128)


# --------------------------------------------------------------------------- models.py


class Generator(nn.Module):
    def __init__(self, channels=3):
        super().__init__()

        def downsample(in_feat, out_feat, normalize=True):
            layers = [nn.Conv2d(in_feat, out_feat, 4, stride=2, padding=1)]
            if normalize:
                layers.append(nn.BatchNorm2d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2))
            return layers

        def upsample(in_feat, out_feat, normalize=True):
            layers = [nn.ConvTranspose2d(in_feat, out_feat, 4, stride=2, padding=1)]
            if normalize:
                layers.append(nn.BatchNorm2d(out_feat, 0.8))
            layers.append(nn.ReLU())
            return layers

        w = G_WIDTHS
        self.model = nn.Sequential(
            *downsample(channels, w[0], normalize=False),
            *downsample(w[0], w[1]),
            *downsample(w[1], w[2]),
            *downsample(w[2], w[3]),
            *downsample(w[3], w[4]),
            nn.Conv2d(w[4], BOTTLENECK, 1),
            *upsample(BOTTLENECK, w[4]),
            *upsample(w[4], w[3]),
            *upsample(w[3], w[2]),
            *upsample(w[2], w[1]),
            nn.Conv2d(w[1], channels, 3, 1, 1),
            nn.Tanh(),
        )

    def forward(self, x):
        return self.model(x)


class Discriminator(nn.Module):
    def __init__(self, channels=3):
        super().__init__()

        def discriminator_block(in_filters, out_filters, stride, normalize):
            layers = [nn.Conv2d(in_filters, out_filters, 3, stride, 1)]
            if normalize:
                layers.append(nn.InstanceNorm2d(out_filters))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        layers = []
        in_filters = channels
        for out_filters, stride, normalize in zip(D_WIDTHS, (2, 2, 2, 1), (False, True, True, True)):
            layers.extend(discriminator_block(in_filters, out_filters, stride, normalize))
            in_filters = out_filters
        layers.append(nn.Conv2d(out_filters, 1, 3, 1, 1))
        self.model = nn.Sequential(*layers)

    def forward(self, img):
        return self.model(img)


# --------------------------------------------------------------------------- datasets.py


class ImageDataset(Dataset):
    def __init__(self, images, img_size=128, mask_size=64, mode="train"):
        self.images = images  # already through Resize + ToTensor + Normalize
        self.img_size = img_size
        self.mask_size = mask_size
        self.mode = mode

    def apply_random_mask(self, img):
        y1, x1 = np.random.randint(0, self.img_size - self.mask_size, 2)
        y2, x2 = y1 + self.mask_size, x1 + self.mask_size
        masked_part = img[:, y1:y2, x1:x2]
        masked_img = img.clone()
        masked_img[:, y1:y2, x1:x2] = 1
        return masked_img, masked_part

    def apply_center_mask(self, img):
        i = (self.img_size - self.mask_size) // 2
        masked_img = img.clone()
        masked_img[:, i : i + self.mask_size, i : i + self.mask_size] = 1
        return masked_img, i

    def __getitem__(self, index):
        img = self.images[index % len(self.images)]
        if self.mode == "train":
            masked_img, aux = self.apply_random_mask(img)
        else:
            masked_img, aux = self.apply_center_mask(img)
        return img, masked_img, aux

    def __len__(self):
        return len(self.images)


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


# --------------------------------------------------------------------------- context_encoder.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    optimizer_for_D = "G" if variant == "d_step_uses_optimizer_G" else "D"
    w_adv, w_pixel = (0.999, 0.001) if variant == "loss_weights_swapped" else (0.001, 0.999)
    torch.manual_seed(seed)
    np.random.seed(seed)

    patch_h, patch_w = int(opt["mask_size"] / 2**3), int(opt["mask_size"] / 2**3)
    patch = (1, patch_h, patch_w)

    adversarial_loss = torch.nn.MSELoss()
    pixelwise_loss = torch.nn.L1Loss()

    generator = Generator(channels=opt["channels"])
    discriminator = Discriminator(channels=opt["channels"])
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)

    tr_raw, _, te_raw, _ = digits.digit_images(seed=seed)
    # transforms: Resize((img_size, img_size)) + ToTensor + Normalize((0.5,), (0.5,))
    x_train = (digits.upscaled(tr_raw, opt["img_size"]) - 0.5) / 0.5
    x_test = (digits.upscaled(te_raw, opt["img_size"]) - 0.5) / 0.5
    dataloader = DataLoader(ImageDataset(x_train, opt["img_size"], opt["mask_size"]),
                            batch_size=opt["batch_size"], shuffle=True)  # fmt: skip
    test_set = ImageDataset(x_test, opt["img_size"], opt["mask_size"], mode="val")

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt["lr"], betas=(opt["b1"], opt["b2"]))

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random streams alone
        state = np.random.get_state()
        _, probe_masked, probe_parts = next(iter(dataloader))
        np.random.set_state(state)
    g_batch = (probe_masked, probe_parts)
    nx.preflight(generator, g_batch, pixelwise_loss, optimizer=optimizer_G)
    mon_G = nx.monitor(generator, optimizer_G, every=10)
    mon_D = nx.monitor(discriminator, optimizer_D, every=10)

    d_losses, g_pixels, g_advs = [], [], []
    for _epoch in range(opt["n_epochs"]):
        for _i, (imgs, masked_imgs, masked_parts) in enumerate(dataloader):
            valid = torch.FloatTensor(imgs.shape[0], *patch).fill_(1.0)
            fake = torch.FloatTensor(imgs.shape[0], *patch).fill_(0.0)

            # -----------------  Train Generator
            optimizer_G.zero_grad()
            gen_parts = generator(masked_imgs)
            g_adv = adversarial_loss(discriminator(gen_parts), valid)
            g_pixel = pixelwise_loss(gen_parts, masked_parts)
            g_loss = w_adv * g_adv + w_pixel * g_pixel
            g_loss.backward()
            optimizer_G.step()

            # ---------------------  Train Discriminator
            opt_d = optimizer_G if optimizer_for_D == "G" else optimizer_D
            opt_d.zero_grad()
            real_loss = adversarial_loss(discriminator(masked_parts), valid)
            fake_loss = adversarial_loss(discriminator(gen_parts.detach()), fake)
            d_loss = 0.5 * (real_loss + fake_loss)
            d_loss.backward()
            opt_d.step()

            nx.timed(lambda: mon_G.log(g_loss))
            nx.timed(lambda: mon_D.log(d_loss))
            d_losses.append(d_loss.item())
            g_advs.append(g_adv.item())
            g_pixels.append(g_pixel.item())

    nx.finish(mon_G, generator, g_batch, pixelwise_loss, optimizer=optimizer_G)
    nx.finish(mon_D)

    # what save_sample shows, over the whole test set: centre hole filled by the generator
    # (batches of 12, the generator left in train mode as the script leaves it)
    total, n = 0.0, 0
    i = (opt["img_size"] - opt["mask_size"]) // 2
    with torch.no_grad():
        for samples, masked_samples, _ in DataLoader(test_set, batch_size=12):
            gen_mask = generator(masked_samples)
            true_hole = samples[:, :, i : i + opt["mask_size"], i : i + opt["mask_size"]]
            total += (gen_mask - true_hole).abs().mean().item() * samples.shape[0]
            n += samples.shape[0]
    tail = max(1, len(g_pixels) // 10)
    return {"test_hole_l1": total / n, "final_g_pixel": float(np.mean(g_pixels[-tail:])),
            "final_g_adv": float(np.mean(g_advs[-tail:])), "final_d_loss": float(np.mean(d_losses[-tail:]))}  # fmt: skip
