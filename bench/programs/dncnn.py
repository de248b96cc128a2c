"""Port of SaoYan/DnCNN-PyTorch: DnCNN image denoising. A plain stack of 3x3 convolutions with
batch norm and ReLU predicts the noise of a noisy patch (residual learning); the loss is the
summed squared error against the added Gaussian noise over twice the batch size; Adam with the
learning rate cut tenfold at a milestone epoch; PSNR of ``clamp(noisy - model(noisy), 0, 1)``
against the clean image on the training batch and on the validation images.

Source: github.com/SaoYan/DnCNN-PyTorch, ``train.py``, ``models.py`` and ``utils.py`` at commit
6b0804951484eadb7f1ea24e8e5c9ede9bea485b (GPL-3.0). Written anew from the facts of those
files; no code copied.

Kept: ``DnCNN`` (``Conv2d(channels, features, 3, padding=1, bias=False)`` + ``ReLU``, then
``num_of_layers - 2`` blocks of ``Conv2d(features, features, 3, padding=1, bias=False)`` +
``BatchNorm2d`` + ``ReLU``, then ``Conv2d(features, channels, 3, padding=1, bias=False)``, all
in one ``nn.Sequential``; ``forward`` returns the predicted noise); ``weights_init_kaiming``
(``kaiming_normal_`` fan-in on the convolutions, the batch-norm weights drawn from
``N(0, sqrt(2/9/64))`` clamped to +-0.025, the batch-norm biases 0) applied with
``net.apply``; ``nn.MSELoss`` with summed reduction (``size_average=False``); ``Adam(lr=1e-3)``;
per epoch the learning rate set by hand on every param group (``lr`` before ``milestone``,
``lr / 10`` from it on); mode S (one known noise level, ``noiseL`` 25 on the 0-255 scale, so
``std = 25 / 255`` on the [0, 1] images); per batch: ``model.train()``, ``model.zero_grad()``,
``optimizer.zero_grad()``, Gaussian noise drawn with ``normal_``, ``imgn = img + noise``,
``loss = criterion(model(imgn), noise) / (2 * batch)``, ``backward``, ``step``, then
``model.eval()`` and the training PSNR of ``clamp(imgn - model(imgn), 0, 1)``; after each epoch
``model.eval()`` and the validation PSNR image by image with fresh noise at ``val_noiseL`` 25;
``batch_PSNR`` = the mean over images of ``10 log10(data_range^2 / mse)`` (skimage's
``compare_psnr``).
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 16x16 and used as the training
patches (1,437) and 40 validation images, instead of 40x40 patches cut from 400 BSD images
and Set12; ``features`` 16 instead of 64 (17 layers kept); batch 32 instead of 128; 5 epochs
with the milestone at 3 instead of 50 and 30; no DataParallel/CUDA, tensorboard, image grids
or checkpoints.
Measure only (not in the program): nothing; the variants are measured by the last epoch's
validation PSNR.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch made
noisy as the loop makes it (the noisy patches and the loop's target) with the loop's loss
(``criterion(out, target) / (2 * batch)``) and the Adam; ``nndx.Monitor(model, optimizer)``
around the epochs with the criterion as ``mon.loss_fn``, each batch's loss logged; then
``nndx.probe(..., monitor=mon)`` on the preflight batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn, optim
from torch.utils.data import DataLoader

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dncnn"
SOURCE = Source("SaoYan/DnCNN-PyTorch", "train.py", "6b0804951484eadb7f1ea24e8e5c9ede9bea485b", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digit patches, 16 features, 5 epochs)"),
        Variant(
            "train_mode_once_per_epoch",
            "model.train() moved from the top of each step to the top of each epoch, while the training-PSNR "
            "model.eval() stays after each step: from the second step on every update is made with batch norm in "
            "eval mode, on running statistics that no longer move",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/princeton-vl/CER-MVS/issues/2",
             "https://github.com/facebookresearch/FixRes/issues/9",
             "https://github.com/ShengcaiLiao/QAConv/issues/16"),
            Measure("psnr_val", "validation PSNR at least 1 dB below the healthy run's: 21.25/21.39/21.31 dB "
                    "against 25.76/26.39/25.76 healthy on seeds 0/1/2 (the noisy input is at about 20.2 dB)",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
        Variant(
            "clean_image_target",
            "the loss compares the model's output with the clean patch (criterion(out_train, img_train)) instead "
            "of the noise, while the denoised image is still imgn - model(imgn): the residual net is trained to "
            "output the image it is meant to subtract",
            (C.WRONG_LOSS,),
            ("https://github.com/SaoYan/DnCNN-PyTorch/issues/12",
             "https://github.com/SaoYan/DnCNN-PyTorch/issues/11",
             "https://github.com/cszn/DnCNN/issues/67"),
            Measure("psnr_val", "validation PSNR at least 3 dB below the healthy run's: 7.43/7.60/7.51 dB against "
                    "25.76/26.39/25.76 healthy on seeds 0/1/2, below the noisy input's 20.2 dB",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
    )
}

OPT = {"batchSize": 32, "num_of_layers": 17, "epochs": 5, "milestone": 3, "lr": 1e-3, "noiseL": 25.0,
       "val_noiseL": 25.0}  # fmt: skip
FEATURES = 16
SIDE = 16
N_VAL = 40


# --------------------------------------------------------------------------- models.py


class DnCNN(nn.Module):
    def __init__(self, channels: int, num_of_layers: int = 17) -> None:
        super().__init__()
        kernel_size, padding, features = 3, 1, FEATURES
        layers: list[nn.Module] = [
            nn.Conv2d(channels, features, kernel_size=kernel_size, padding=padding, bias=False),
            nn.ReLU(inplace=True),
        ]
        for _ in range(num_of_layers - 2):
            layers += [nn.Conv2d(features, features, kernel_size=kernel_size, padding=padding, bias=False),
                       nn.BatchNorm2d(features), nn.ReLU(inplace=True)]  # fmt: skip
        layers.append(nn.Conv2d(features, channels, kernel_size=kernel_size, padding=padding, bias=False))
        self.dncnn = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dncnn(x)


# --------------------------------------------------------------------------- utils.py


def weights_init_kaiming(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.kaiming_normal_(m.weight.data, a=0, mode="fan_in")
    elif classname.find("Linear") != -1:
        nn.init.kaiming_normal_(m.weight.data, a=0, mode="fan_in")
    elif classname.find("BatchNorm") != -1:
        m.weight.data.normal_(mean=0, std=math.sqrt(2.0 / 9.0 / 64.0)).clamp_(-0.025, 0.025)
        nn.init.constant_(m.bias.data, 0.0)


def batch_PSNR(img: torch.Tensor, imclean: torch.Tensor, data_range: float) -> float:
    Img = img.detach().numpy().astype(np.float64)
    Iclean = imclean.detach().numpy().astype(np.float64)
    psnr = 0.0
    for i in range(Img.shape[0]):
        mse = np.mean((Iclean[i] - Img[i]) ** 2)
        psnr += 10.0 * np.log10(data_range**2 / mse)
    return psnr / Img.shape[0]


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_once = variant == "train_mode_once_per_epoch"
    clean_target = variant == "clean_image_target"

    tr_raw, _, te_raw, _ = digits.digit_images(seed=seed)
    dataset_train = digits.upscaled(tr_raw, SIDE)  # (N, 1, 16, 16) in [0, 1]: the training patches
    dataset_val = digits.upscaled(te_raw[:N_VAL], SIDE)
    loader_train = DataLoader(dataset=dataset_train, batch_size=opt["batchSize"], shuffle=True)

    net = DnCNN(channels=1, num_of_layers=opt["num_of_layers"])
    net.apply(weights_init_kaiming)
    criterion = nn.MSELoss(reduction="sum")  # size_average=False
    model = net
    optimizer = optim.Adam(model.parameters(), lr=opt["lr"])

    def loop_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(out, target) / (out.size()[0] * 2)

    with torch.random.fork_rng():  # the preflight batch, made as the loop makes one
        probe_img = dataset_train[: opt["batchSize"]]
        probe_noise = torch.FloatTensor(probe_img.size()).normal_(mean=0, std=opt["noiseL"] / 255.0)
    probe_batch = (probe_img + probe_noise, probe_img if clean_target else probe_noise)
    nx.preflight(model, probe_batch, loop_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    step = 0
    psnr_val = psnr_train = loss_value = float("nan")
    for epoch in range(opt["epochs"]):
        current_lr = opt["lr"] if epoch < opt["milestone"] else opt["lr"] / 10.0
        for param_group in optimizer.param_groups:
            param_group["lr"] = current_lr
        if train_once:
            model.train()
        for i, data in enumerate(loader_train, 0):
            if not train_once:
                model.train()
            model.zero_grad()
            optimizer.zero_grad()
            img_train = data
            noise = torch.FloatTensor(img_train.size()).normal_(mean=0, std=opt["noiseL"] / 255.0)
            imgn_train = img_train + noise
            out_train = model(imgn_train)
            target = img_train if clean_target else noise
            loss = mon.loss_fn(out_train, target) / (imgn_train.size()[0] * 2)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            model.eval()
            with torch.no_grad():
                out_train = torch.clamp(imgn_train - model(imgn_train), 0.0, 1.0)
            psnr_train = batch_PSNR(out_train, img_train, 1.0)
            loss_value = loss.item()
            step += 1
        model.eval()
        psnr_val = 0.0
        with torch.no_grad():
            for k in range(len(dataset_val)):
                img_val = torch.unsqueeze(dataset_val[k], 0)
                noise = torch.FloatTensor(img_val.size()).normal_(mean=0, std=opt["val_noiseL"] / 255.0)
                imgn_val = img_val + noise
                out_val = torch.clamp(imgn_val - model(imgn_val), 0.0, 1.0)
                psnr_val += batch_PSNR(out_val, img_val, 1.0)
        psnr_val /= len(dataset_val)

    nx.finish(mon, model, probe_batch, loop_loss, optimizer=optimizer)
    return {"psnr_val": psnr_val, "psnr_train": psnr_train, "loss": loss_value, "final_lr": current_lr}
