"""Port of Zalando Research's pytorch-vq-vae notebook: a VQ-VAE (van den Oord et al. 2017) with
a ResNet encoder/decoder, a vector-quantiser layer and the straight-through estimator.

Source: github.com/zalandoresearch/pytorch-vq-vae, ``vq-vae.ipynb`` at commit
b98fde9a8f8f65486dbfaf12958049e8d33184a1 (MIT, Copyright (c) 2018 Zalando Research).
Written anew from the facts of that notebook; no code copied.

Kept: ``VectorQuantizer``: inputs BCHW -> BHWC, flattened to (N, D); squared distances to an
``nn.Embedding(K, D)`` codebook initialised uniform(-1/K, 1/K) written as
``sum(x^2) + sum(e^2) - 2 x e^T``; ``argmin`` -> one-hot ``encodings`` by ``scatter_``;
``quantized = encodings @ weight``; ``e_latent_loss = mse(quantized.detach(), inputs)``,
``q_latent_loss = mse(quantized, inputs.detach())``, ``loss = q_latent + commitment_cost *
e_latent``; then the straight-through ``quantized = inputs + (quantized - inputs).detach()``;
the perplexity of the mean code usage; the tuple ``(loss, quantized BCHW, perplexity,
encodings)``. ``Residual`` (``ReLU(True)``, 3x3 conv, ``ReLU(True)``, 1x1 conv, both without
bias, ``x + block(x)``), ``ResidualStack`` (a ``ModuleList`` of separate blocks, the fix of
the repository's issue #2, then ``F.relu``); ``Encoder``: two 4x4 stride-2 convolutions
(``num_hiddens // 2``, ``num_hiddens``) each followed by ``F.relu``, a 3x3 convolution, the
residual stack; ``Decoder``: a 3x3 convolution, the residual stack, a 4x4 stride-2
``ConvTranspose2d`` + ``F.relu``, a last one to 3 channels (no output activation);
``Model``: encoder -> 1x1 ``_pre_vq_conv`` to ``embedding_dim`` -> quantiser -> decoder,
returning ``(loss, x_recon, perplexity)``; images through ``ToTensor`` +
``Normalize((0.5,) * 3, (1.0,) * 3)`` (pixels in [-0.5, 0.5]) and ``data_variance`` the
variance of the [0, 1] training pixels; ``commitment_cost = 0.25``; ``Adam(lr=1e-3,
amsgrad=False)``; a shuffled training loader from which each update takes
``next(iter(training_loader))``; ``optimizer.zero_grad()``, ``recon_error =
mse(data_recon, data) / data_variance``, ``loss = recon_error + vq_loss``, backward, step;
``recon_error``/``perplexity`` kept per update; the reconstructions viewed under
``model.eval()`` through ``_pre_vq_conv(_encoder(x))``, ``_vq_vae``, ``_decoder``.
The notebook's Model picks ``VectorQuantizerEMA`` when ``decay > 0`` and the plain
``VectorQuantizer`` otherwise; the port runs ``decay = 0`` (the loss-trained codebook the
notebook's text explains first; the EMA variant is not ported).
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 and repeated over 3 channels instead of
32x32 CIFAR-10 (1,437 training, 360 validation images); ``num_hiddens`` 16,
``num_residual_hiddens`` 8, ``embedding_dim`` 8, ``num_embeddings`` 32 instead of 128 / 32 /
64 / 512 (2 residual layers kept); batch 32 instead of 256; 500 updates instead of 15,000.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the notebook's loss written as ``loss_fn(output, target)`` (``mse(output[1], target) /
data_variance + output[0]``), ``nndx.Monitor`` around the training loop, each update's
loss logged (the notebook has no validation loss during training); then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "vqvae"
SOURCE = Source("zalandoresearch/pytorch-vq-vae", "vq-vae.ipynb", "b98fde9a8f8f65486dbfaf12958049e8d33184a1", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (decay = 0: the plain VectorQuantizer)"),
        Variant(
            "straight_through_detach_dropped",
            "quantized = inputs + (quantized - inputs) without .detach(): the forward value is the same, but "
            "the two paths to the encoder cancel, so the reconstruction loss no longer reaches the encoder "
            "(only the commitment term does)",
            (C.DETACHED_GRAPH,),
            ("https://github.com/NTU-AIoT-Lab/EfficientFi/issues/4",
             "https://github.com/zalandoresearch/pytorch-vq-vae/issues/6", "https://github.com/Biohub/esm/issues/92"),
            Measure("val_recon_error", "validation reconstruction error (MSE / data variance, model.eval()), "
                    "1.3x the healthy run's or more", lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "vq_loss_after_straight_through",
            "the straight-through line moved above the two latent losses: they are computed on inputs + "
            "(quantized - inputs).detach(), so the codebook gets no gradient at all and q_latent_loss pushes "
            "the encoder away from its code",
            (C.DETACHED_GRAPH,),
            ("https://github.com/andylolu2/jax-vqvae-gpt/issues/2",
             "https://github.com/EdoardoBotta/RQ-VAE-Recommender/issues/24",
             "https://github.com/EdoardoBotta/RQ-VAE-Recommender/pull/26"),
            Measure("val_recon_error", "validation reconstruction error (MSE / data variance, model.eval()), "
                    "1.3x the healthy run's or more", lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

SIDE = 16
batch_size = 32
num_training_updates = 500
num_hiddens = 16
num_residual_hiddens = 8
num_residual_layers = 2
embedding_dim = 8
num_embeddings = 32
commitment_cost = 0.25
decay = 0
learning_rate = 1e-3


class VectorQuantizer(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, commitment_cost: float, bug: str = "") -> None:
        super().__init__()
        self._embedding_dim = embedding_dim
        self._num_embeddings = num_embeddings
        self._embedding = nn.Embedding(self._num_embeddings, self._embedding_dim)
        self._embedding.weight.data.uniform_(-1 / self._num_embeddings, 1 / self._num_embeddings)
        self._commitment_cost = commitment_cost
        self._bug = bug

    def forward(self, inputs: torch.Tensor):
        inputs = inputs.permute(0, 2, 3, 1).contiguous()  # BCHW -> BHWC
        input_shape = inputs.shape
        flat_input = inputs.view(-1, self._embedding_dim)

        distances = (torch.sum(flat_input**2, dim=1, keepdim=True) + torch.sum(self._embedding.weight**2, dim=1)
                     - 2 * torch.matmul(flat_input, self._embedding.weight.t()))  # fmt: skip
        encoding_indices = torch.argmin(distances, dim=1).unsqueeze(1)
        encodings = torch.zeros(encoding_indices.shape[0], self._num_embeddings, device=inputs.device)
        encodings.scatter_(1, encoding_indices, 1)
        quantized = torch.matmul(encodings, self._embedding.weight).view(input_shape)

        if self._bug == "vq_loss_after_straight_through":
            quantized = inputs + (quantized - inputs).detach()
        e_latent_loss = F.mse_loss(quantized.detach(), inputs)
        q_latent_loss = F.mse_loss(quantized, inputs.detach())
        loss = q_latent_loss + self._commitment_cost * e_latent_loss

        if self._bug == "straight_through_detach_dropped":
            quantized = inputs + (quantized - inputs)
        elif self._bug != "vq_loss_after_straight_through":
            quantized = inputs + (quantized - inputs).detach()  # the straight-through estimator
        avg_probs = torch.mean(encodings, dim=0)
        perplexity = torch.exp(-torch.sum(avg_probs * torch.log(avg_probs + 1e-10)))
        return loss, quantized.permute(0, 3, 1, 2).contiguous(), perplexity, encodings


class Residual(nn.Module):
    def __init__(self, in_channels: int, num_hiddens: int, num_residual_hiddens: int) -> None:
        super().__init__()
        self._block = nn.Sequential(
            nn.ReLU(True),
            nn.Conv2d(in_channels, num_residual_hiddens, kernel_size=3, stride=1, padding=1, bias=False),
            nn.ReLU(True),
            nn.Conv2d(num_residual_hiddens, num_hiddens, kernel_size=1, stride=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._block(x)


class ResidualStack(nn.Module):
    def __init__(self, in_channels: int, num_hiddens: int, num_residual_layers: int, num_residual_hiddens: int) -> None:
        super().__init__()
        self._num_residual_layers = num_residual_layers
        self._layers = nn.ModuleList([Residual(in_channels, num_hiddens, num_residual_hiddens)
                                      for _ in range(self._num_residual_layers)])  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self._num_residual_layers):
            x = self._layers[i](x)
        return F.relu(x)


class Encoder(nn.Module):
    def __init__(self, in_channels: int, num_hiddens: int, num_residual_layers: int, num_residual_hiddens: int) -> None:
        super().__init__()
        self._conv_1 = nn.Conv2d(in_channels, num_hiddens // 2, kernel_size=4, stride=2, padding=1)
        self._conv_2 = nn.Conv2d(num_hiddens // 2, num_hiddens, kernel_size=4, stride=2, padding=1)
        self._conv_3 = nn.Conv2d(num_hiddens, num_hiddens, kernel_size=3, stride=1, padding=1)
        self._residual_stack = ResidualStack(num_hiddens, num_hiddens, num_residual_layers, num_residual_hiddens)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = F.relu(self._conv_1(inputs))
        x = F.relu(self._conv_2(x))
        x = self._conv_3(x)
        return self._residual_stack(x)


class Decoder(nn.Module):
    def __init__(self, in_channels: int, num_hiddens: int, num_residual_layers: int, num_residual_hiddens: int) -> None:
        super().__init__()
        self._conv_1 = nn.Conv2d(in_channels, num_hiddens, kernel_size=3, stride=1, padding=1)
        self._residual_stack = ResidualStack(num_hiddens, num_hiddens, num_residual_layers, num_residual_hiddens)
        self._conv_trans_1 = nn.ConvTranspose2d(num_hiddens, num_hiddens // 2, kernel_size=4, stride=2, padding=1)
        self._conv_trans_2 = nn.ConvTranspose2d(num_hiddens // 2, 3, kernel_size=4, stride=2, padding=1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self._conv_1(inputs)
        x = self._residual_stack(x)
        x = F.relu(self._conv_trans_1(x))
        return self._conv_trans_2(x)


class Model(nn.Module):
    def __init__(self, num_hiddens, num_residual_layers, num_residual_hiddens, num_embeddings, embedding_dim,
                 commitment_cost, decay=0, bug: str = "") -> None:  # fmt: skip
        super().__init__()
        self._encoder = Encoder(3, num_hiddens, num_residual_layers, num_residual_hiddens)
        self._pre_vq_conv = nn.Conv2d(num_hiddens, embedding_dim, kernel_size=1, stride=1)
        if decay > 0.0:
            raise NotImplementedError("the EMA quantiser is not ported")
        self._vq_vae = VectorQuantizer(num_embeddings, embedding_dim, commitment_cost, bug)
        self._decoder = Decoder(embedding_dim, num_hiddens, num_residual_layers, num_residual_hiddens)

    def forward(self, x: torch.Tensor):
        z = self._pre_vq_conv(self._encoder(x))
        loss, quantized, perplexity, _ = self._vq_vae(z)
        x_recon = self._decoder(quantized)
        return loss, x_recon, perplexity


def images(raw: torch.Tensor) -> torch.Tensor:
    """ToTensor'd digits at 16x16 on 3 channels, in [0, 1] (before Normalize)."""
    return digits.upscaled(raw, SIDE).repeat(1, 3, 1, 1)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, train_labels, val_raw, val_labels = digits.digit_images(seed=seed)
    train_01, val_01 = images(train_raw), images(val_raw)
    data_variance = float(np.var(train_01.numpy()))
    training_data = TensorDataset(train_01 - 0.5, train_labels)  # Normalize((0.5,)*3, (1.0,)*3)
    validation_data = TensorDataset(val_01 - 0.5, val_labels)
    training_loader = DataLoader(training_data, batch_size=batch_size, shuffle=True,
                                 generator=torch.Generator().manual_seed(seed))  # fmt: skip

    model = Model(num_hiddens, num_residual_layers, num_residual_hiddens, num_embeddings, embedding_dim,
                  commitment_cost, decay, bug=variant if variant != "healthy" else "")  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate, amsgrad=False)
    codebook_at_start = model._vq_vae._embedding.weight.detach().clone()

    def loss_fn(output, target):
        vq_loss, data_recon, _perplexity = output
        return F.mse_loss(data_recon, target) / data_variance + vq_loss

    first = training_data.tensors[0][:batch_size]
    nx.preflight(model, (first, first), loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    model.train()
    train_res_recon_error: list[float] = []
    train_res_perplexity: list[float] = []
    for i in range(num_training_updates):
        (data, _) = next(iter(training_loader))
        optimizer.zero_grad()
        vq_loss, data_recon, perplexity = model(data)
        recon_error = F.mse_loss(data_recon, data) / data_variance
        loss = recon_error + vq_loss
        loss.backward()
        optimizer.step()
        mon.log(loss)
        train_res_recon_error.append(recon_error.item())
        train_res_perplexity.append(perplexity.item())

    nx.finish(mon, model, (first, first), loss_fn, optimizer=optimizer)

    # the notebook's reconstructions, under model.eval(), over the whole validation split (measure only)
    model.eval()
    with torch.no_grad():
        originals = validation_data.tensors[0]
        vq_output_eval = model._pre_vq_conv(model._encoder(originals))
        _, valid_quantize, valid_perplexity, _ = model._vq_vae(vq_output_eval)
        valid_reconstructions = model._decoder(valid_quantize)
        val_recon_error = (F.mse_loss(valid_reconstructions, originals) / data_variance).item()
        codebook_moved = (model._vq_vae._embedding.weight - codebook_at_start).norm().item()
        latent_gap = (vq_output_eval.permute(0, 2, 3, 1) - valid_quantize.permute(0, 2, 3, 1)).pow(2).mean().item()
    return {
        "val_recon_error": val_recon_error,
        "late_train_recon_error": float(np.mean(train_res_recon_error[-50:])),
        "late_perplexity": float(np.mean(train_res_perplexity[-50:])),
        "val_perplexity": float(valid_perplexity),
        "codebook_moved": codebook_moved,
        "latent_gap": latent_gap,
    }
