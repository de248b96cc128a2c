"""Port of AntixK/PyTorch-VAE: the Wasserstein auto-encoder with an MMD penalty (``WAE_MMD``),
trained by the repository's experiment (Adam, ExponentialLR, the model's ``loss_function``).

Source: github.com/AntixK/PyTorch-VAE at commit a6896b944c918dd7030e7d795a8c13e5c6345ec7:
``models/wae_mmd.py`` (the model and its loss), ``experiment.py`` (``VAEXperiment``:
``training_step``/``validation_step`` calling ``loss_function(*results, M_N=kld_weight)``,
``configure_optimizers``: ``Adam(lr=LR, weight_decay)`` + ``ExponentialLR(gamma=scheduler_gamma)``),
``configs/wae_mmd_imq.yaml`` (latent 128, reg_weight 100, kernel ``imq``, batch 64, LR 0.005,
weight_decay 0, scheduler_gamma 0.95, 10 epochs), ``dataset.py`` (``RandomHorizontalFlip``,
``CenterCrop``, ``Resize(64)``, ``ToTensor`` without normalisation: pixels in [0, 1]); Apache-2.0.
Written anew from those files.

Kept: ``WAE_MMD`` as written: an encoder of ``Conv2d(3x3, stride 2, padding 1)`` + ``BatchNorm2d``
+ ``LeakyReLU`` blocks, ``fc_z`` to the latent code (deterministic encoder), ``decoder_input``,
``ConvTranspose2d`` + ``BatchNorm2d`` + ``LeakyReLU`` blocks, the final transposed conv + BN +
LeakyReLU + ``Conv2d(3 channels)`` + ``Tanh``; ``loss_function``: ``F.mse_loss`` (mean) plus
``compute_mmd`` with ``reg_weight / (N (N - 1))``, the prior drawn by ``torch.randn_like``,
``compute_kernel`` expanding to (N, N, D), the IMQ kernel ``C / (eps + C + ||x1 - x2||^2)`` with
``C = 2 D latent_var`` summed without its diagonal, and each kernel term's ``.mean()`` (of a
scalar); the training step (forward, ``loss_function``, backward, Adam step; Lightning's
``zero_grad``), ``ExponentialLR`` stepped every epoch, validation each epoch with ``M_N=1.0``;
``model.sample`` for generation.
Shrunk / replaced: CelebA (64x64 RGB, downloaded) replaced by scikit-learn's 8x8 digits upsampled
(bilinear) to 16x16 and repeated over 3 channels (1,437 train / 360 validation), random
horizontal flips kept, no crop; ``hidden_dims`` [16, 32, 64] instead of [32, 64, 128, 256, 512]
(so 16x16 reaches the same 2x2 map; ``decode``'s ``view(-1, 512, 2, 2)`` becomes
``view(-1, 64, 2, 2)``), latent 16 instead of 128; 10 epochs as the config; CPU; Lightning
replaced by the plain loop it runs; no image saving or TensorBoard.
Measure only (not in the program): on the validation set in eval mode, the reconstruction MSE and
the MMD between the encoded codes and a fixed N(0, I) sample (unbiased IMQ estimate with the
model's C), the quantity the WAE's penalty exists to make small; the mean latent norm.

nndx, as the author would add it: the model returns ``[recons, input, z]`` and its loss is
``model.loss_function(*results, M_N=...)['loss']``, so nndx gets ``loss_fn(output, target) =
model.loss_function(*output, M_N=kld_weight)['loss']`` and the batch ``(images, images)``; a
preflight ``nndx.probe`` with the optimizer on the first training batch; ``nndx.Monitor(model,
optimizer)`` around the epochs, each step's loss logged (where ``training_step`` calls
``self.log_dict``) and each epoch's validation loss logged with ``split="val"`` (where
``validation_step`` logs it); ``nndx.probe(..., monitor=mon)`` on the same batch after training,
then ``nndx.diagnose``.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "wae_mmd"
SOURCE = Source("AntixK/PyTorch-VAE", "models/wae_mmd.py", "a6896b944c918dd7030e7d795a8c13e5c6345ec7", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digits, hidden_dims [16, 32, 64], latent 16)"),
        Variant(
            "mmd_sign_flipped",
            "the total loss subtracts the MMD penalty (loss = recons_loss - mmd_loss) instead of adding it: "
            "the optimizer maximises the discrepancy between the codes and the prior, so the latent codes move "
            "away from N(0, I) and samples drawn from the prior decode to nothing the decoder saw",
            (C.WRONG_LOSS,),
            ("https://github.com/schelotto/Wasserstein-AutoEncoders/issues/6",
             "https://github.com/schelotto/Wasserstein-AutoEncoders/pull/10"),
            Measure("latent_mmd", "validation codes' MMD to N(0, I) at least 3x the healthy run's: 1.66 against "
                    "0.017 healthy on seed 0 (mean latent norm 111.7 against 4.6)",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
        Variant(
            "imq_unsquared",
            "the IMQ kernel sums the coordinate differences without squaring them "
            "(C / (eps + C + (x1 - x2).sum(-1)) instead of .pow(2).sum(-1)): the 'distance' is signed, the "
            "kernel is not a kernel, its denominator crosses zero (the training loss spikes to 1.9e4 on seed 0) and "
            "the penalty no longer pulls the codes toward the prior",
            (C.WRONG_LOSS, C.DIVISION_BY_ZERO),
            ("https://github.com/schelotto/Wasserstein-AutoEncoders/issues/3",
             "https://github.com/schelotto/Wasserstein-AutoEncoders/issues/5"),
            Measure("latent_mmd", "validation codes' MMD to N(0, I) at least 3x the healthy run's: 1.43 against "
                    "0.017 healthy on seed 0 (validation MSE 0.044 against 0.017)",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
    )
}

MODEL_PARAMS = {"in_channels": 3, "latent_dim": 16, "reg_weight": 100, "kernel_type": "imq",
                "hidden_dims": [16, 32, 64]}  # fmt: skip
DATA_PARAMS = {"train_batch_size": 64, "val_batch_size": 64, "patch_size": 16}
EXP_PARAMS = {"LR": 0.005, "weight_decay": 0.0, "scheduler_gamma": 0.95, "kld_weight": 0.00025}
MAX_EPOCHS = 10


# --------------------------------------------------------------------------- models/wae_mmd.py


class WAE_MMD(nn.Module):
    def __init__(self, in_channels: int, latent_dim: int, hidden_dims: List = None, reg_weight: int = 100,
                 kernel_type: str = "imq", latent_var: float = 2.0, variant: str = "healthy", **kwargs) -> None:  # fmt: skip
        super(WAE_MMD, self).__init__()
        self.variant = variant  # the port's switch for the planted bug
        self.latent_dim = latent_dim
        self.reg_weight = reg_weight
        self.kernel_type = kernel_type
        self.z_var = latent_var

        modules = []
        if hidden_dims is None:
            hidden_dims = [32, 64, 128, 256, 512]

        # Build Encoder
        for h_dim in hidden_dims:
            modules.append(
                nn.Sequential(
                    nn.Conv2d(in_channels, out_channels=h_dim, kernel_size=3, stride=2, padding=1),
                    nn.BatchNorm2d(h_dim),
                    nn.LeakyReLU())
            )
            in_channels = h_dim

        self.encoder = nn.Sequential(*modules)
        self.fc_z = nn.Linear(hidden_dims[-1] * 4, latent_dim)

        # Build Decoder
        modules = []
        self.decoder_input = nn.Linear(latent_dim, hidden_dims[-1] * 4)
        hidden_dims.reverse()
        for i in range(len(hidden_dims) - 1):
            modules.append(
                nn.Sequential(
                    nn.ConvTranspose2d(hidden_dims[i], hidden_dims[i + 1], kernel_size=3, stride=2, padding=1,
                                       output_padding=1),
                    nn.BatchNorm2d(hidden_dims[i + 1]),
                    nn.LeakyReLU())
            )
        self.decoder = nn.Sequential(*modules)
        self.final_layer = nn.Sequential(
            nn.ConvTranspose2d(hidden_dims[-1], hidden_dims[-1], kernel_size=3, stride=2, padding=1,
                               output_padding=1),
            nn.BatchNorm2d(hidden_dims[-1]),
            nn.LeakyReLU(),
            nn.Conv2d(hidden_dims[-1], out_channels=3, kernel_size=3, padding=1),
            nn.Tanh())

    def encode(self, input: Tensor) -> Tensor:
        result = self.encoder(input)
        result = torch.flatten(result, start_dim=1)
        z = self.fc_z(result)
        return z

    def decode(self, z: Tensor) -> Tensor:
        result = self.decoder_input(z)
        result = result.view(-1, 64, 2, 2)
        result = self.decoder(result)
        result = self.final_layer(result)
        return result

    def forward(self, input: Tensor, **kwargs) -> List[Tensor]:
        z = self.encode(input)
        return [self.decode(z), input, z]

    def loss_function(self, *args, **kwargs) -> dict:
        recons = args[0]
        input = args[1]
        z = args[2]

        batch_size = input.size(0)
        bias_corr = batch_size * (batch_size - 1)
        reg_weight = self.reg_weight / bias_corr

        recons_loss = F.mse_loss(recons, input)
        mmd_loss = self.compute_mmd(z, reg_weight)

        if self.variant == "mmd_sign_flipped":
            loss = recons_loss - mmd_loss  # the bug
        else:
            loss = recons_loss + mmd_loss
        return {"loss": loss, "Reconstruction_Loss": recons_loss, "MMD": mmd_loss}

    def compute_kernel(self, x1: Tensor, x2: Tensor) -> Tensor:
        D = x1.size(1)
        N = x1.size(0)
        x1 = x1.unsqueeze(-2)  # Make it into a column tensor
        x2 = x2.unsqueeze(-3)  # Make it into a row tensor
        x1 = x1.expand(N, N, D)
        x2 = x2.expand(N, N, D)
        if self.kernel_type == "rbf":
            result = self.compute_rbf(x1, x2)
        elif self.kernel_type == "imq":
            result = self.compute_inv_mult_quad(x1, x2)
        else:
            raise ValueError("Undefined kernel type.")
        return result

    def compute_rbf(self, x1: Tensor, x2: Tensor, eps: float = 1e-7) -> Tensor:
        z_dim = x2.size(-1)
        sigma = 2.0 * z_dim * self.z_var
        result = torch.exp(-((x1 - x2).pow(2).mean(-1) / sigma))
        return result

    def compute_inv_mult_quad(self, x1: Tensor, x2: Tensor, eps: float = 1e-7) -> Tensor:
        z_dim = x2.size(-1)
        C = 2 * z_dim * self.z_var
        if self.variant == "imq_unsquared":
            kernel = C / (eps + C + (x1 - x2).sum(dim=-1))  # the bug: differences not squared
        else:
            kernel = C / (eps + C + (x1 - x2).pow(2).sum(dim=-1))
        # Exclude diagonal elements
        result = kernel.sum() - kernel.diag().sum()
        return result

    def compute_mmd(self, z: Tensor, reg_weight: float) -> Tensor:
        # Sample from prior (Gaussian) distribution
        prior_z = torch.randn_like(z)
        prior_z__kernel = self.compute_kernel(prior_z, prior_z)
        z__kernel = self.compute_kernel(z, z)
        priorz_z__kernel = self.compute_kernel(prior_z, z)
        mmd = reg_weight * prior_z__kernel.mean() + \
            reg_weight * z__kernel.mean() - \
            2 * reg_weight * priorz_z__kernel.mean()
        return mmd

    def sample(self, num_samples: int, current_device, **kwargs) -> Tensor:
        z = torch.randn(num_samples, self.latent_dim)
        z = z.to(current_device)
        return self.decode(z)

    def generate(self, x: Tensor, **kwargs) -> Tensor:
        return self.forward(x)[0]


# --------------------------------------------------------------------------- dataset.py (digits for CelebA)


class Digits(Dataset):
    """The images as ``transforms.Compose([RandomHorizontalFlip(), ..., ToTensor()])`` leaves them:
    (3, 16, 16) in [0, 1], flipped left-right with probability 0.5; the label as CelebA's target."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int):
        img = self.images[idx]
        if torch.rand(1) < 0.5:
            img = img.flip(-1)
        return img, self.labels[idx]


def _imq_mmd(z: Tensor, prior: Tensor, C: float) -> float:
    """Unbiased MMD^2 estimate with the IMQ kernel (measure only)."""
    def k(a, b):
        return C / (C + torch.cdist(a, b).pow(2))
    n = z.size(0)
    kzz, kpp, kzp = k(z, z), k(prior, prior), k(z, prior)
    off = 1.0 - torch.eye(n)
    return float((kzz * off).sum() / (n * (n - 1)) + (kpp * off).sum() / (n * (n - 1)) - 2 * kzp.mean())


# --------------------------------------------------------------------------- experiment.py, as a plain loop


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    side = DATA_PARAMS["patch_size"]
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train = digits.upscaled(tr_raw, side).repeat(1, 3, 1, 1)
    x_val = digits.upscaled(te_raw, side).repeat(1, 3, 1, 1)
    train_loader = DataLoader(Digits(x_train, tr_y), batch_size=DATA_PARAMS["train_batch_size"], shuffle=True)
    val_loader = DataLoader(Digits(x_val, te_y), batch_size=DATA_PARAMS["val_batch_size"], shuffle=False)

    params = dict(MODEL_PARAMS, hidden_dims=list(MODEL_PARAMS["hidden_dims"]))
    model = WAE_MMD(**params, variant=variant)
    optimizer = torch.optim.Adam(model.parameters(), lr=EXP_PARAMS["LR"], weight_decay=EXP_PARAMS["weight_decay"])
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=EXP_PARAMS["scheduler_gamma"])

    def loss_fn(output, target):
        return model.loss_function(*output, M_N=EXP_PARAMS["kld_weight"])["loss"]

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first_img, _ = next(iter(train_loader))
    probe_batch = (first_img, first_img)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    val_loss = float("nan")
    for _epoch in range(MAX_EPOCHS):
        model.train()
        for batch_idx, (real_img, labels) in enumerate(train_loader):  # training_step
            results = model(real_img, labels=labels)
            train_loss = model.loss_function(*results, M_N=EXP_PARAMS["kld_weight"], optimizer_idx=0,
                                             batch_idx=batch_idx)  # fmt: skip
            optimizer.zero_grad()
            train_loss["loss"].backward()
            optimizer.step()
            nx.timed(lambda: mon.log(train_loss["loss"]))  # noqa: B023 - where self.log_dict logs
        scheduler.step()
        model.eval()
        with torch.no_grad():  # validation_step
            losses = []
            for batch_idx, (real_img, labels) in enumerate(val_loader):
                results = model(real_img, labels=labels)
                losses.append(model.loss_function(*results, M_N=1.0, optimizer_idx=0, batch_idx=batch_idx)["loss"])
            val_loss = float(torch.stack(losses).mean())
        nx.timed(lambda: mon.log(val_loss, split="val"))  # noqa: B023
    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # measure only: reconstructions and codes of the validation images, eval mode, no flips
    model.eval()
    with torch.no_grad():
        recons, _, z = model(x_val)
        recon_mse = float(F.mse_loss(recons, x_val))
        prior = torch.randn(z.shape, generator=torch.Generator().manual_seed(1234))
        latent_mmd = _imq_mmd(z, prior, 2.0 * z.size(1) * model.z_var)
        z_norm = float(z.norm(dim=1).mean())
    return {"val_recon_mse": recon_mse, "latent_mmd": latent_mmd, "latent_norm": z_norm, "val_loss": val_loss}
