"""Port of alexis-jacq/Pytorch-Sketch-RNN: Sketch-RNN (Ha & Eck), a sequence-to-sequence VAE over
pen strokes: a bidirectional LSTM encoder, a latent code with a KL term held above a floor,
an LSTM decoder emitting a mixture of bivariate Gaussians for the pen offsets and a softmax
over the three pen states.

Source: github.com/alexis-jacq/Pytorch-Sketch-RNN, ``sketch_rnn.py`` at commit
5c3e21375dfe7695c1c37a0acccf6da17c049f77 (MIT, Copyright (c) 2017 Alexis David Jacq).
Written anew from the facts of that file; no code copied.

Kept: ``HParams`` (``eta_min`` 0.01, ``R`` 0.99995, ``KL_min`` 0.2, ``wKL`` 0.5, ``lr`` 1e-3,
``lr_decay`` 0.9999, ``min_lr`` 1e-5, ``grad_clip`` 1.0, ``max_seq_length`` 200, dropout 0.9
given to single-layer LSTMs, where PyTorch ignores it); the data pipeline: ``purify`` (sequences
of more than 10 and at most ``max_seq_length`` points, offsets clipped to +-1000, float32),
``normalize`` (offsets divided by the standard deviation of all offsets), ``Nmax``,
``make_batch`` (``np.random.choice`` with replacement, stroke-3 to stroke-5 in an ``Nmax x 5``
array, the sequences stacked time-major, ``np.stack(strokes, 1)``), ``lr_decay`` (each
param group's lr times ``lr_decay`` while above ``min_lr``); ``EncoderRNN`` (``nn.LSTM(5,
enc_hidden, bidirectional=True)`` from zero states, the last forward and backward hidden
states concatenated, ``fc_mu`` and ``fc_sigma``, ``sigma = exp(sigma_hat / 2)``, ``z = mu +
sigma * N(0, 1)``); ``DecoderRNN`` (``fc_hc`` of ``z`` through ``tanh`` for the initial
hidden and cell states, ``nn.LSTM(Nz + 5, dec_hidden)``, ``fc_params`` to ``6M + 3``
outputs split in chunks of 6: the M mixture parameter rows stacked, then ``pi`` by softmax
over the M components, ``sigma_x``/``sigma_y`` by ``exp``, ``rho_xy`` by ``tanh``, and the pen
logits by softmax; the softmaxes' ``dim`` written out as the implicit one PyTorch picks);
``Model`` with one ``Adam(lr)`` per network, ``make_target`` (an end-of-sequence row
appended, the mask over the true lengths, ``dx``/``dy`` repeated over the M components),
``train`` (the batch, the encoder, a start-of-sequence row ``[0, 0, 1, 0, 0]``, ``z``
repeated along time and concatenated to the inputs, the decoder, both ``zero_grad``, the
source's ``eta_step = 1 - (1 - eta_min) * R`` (a constant: the annealing never advances,
as published), ``LKL = wKL * eta_step * max(KL, KL_min)``, ``LR = LS + LP`` with the
mixture density of ``bivariate_normal_pdf``, ``LS`` masked and ``LP`` not, both divided by
``Nmax * batch_size``, ``backward``, ``clip_grad_norm_`` of each network to ``grad_clip``,
both steps, then ``lr_decay`` of both optimizers every epoch (an epoch is one batch here,
as in the source's ``__main__``).
Shrunk: a generated dataset of 800 sketches in stroke-3 format (600 train, 200 held out):
noisy circles, squares (half with a second stroke, a diagonal) and triangles of random
size, 17-41 points, instead of ``cat.npz``; ``enc_hidden_size`` 32, ``dec_hidden_size`` 64,
``Nz`` 16, ``M`` 5, ``batch_size`` 32 instead of 256/512/128/20/100; 500 epochs instead
of 50,001; ``lr_decay`` 0.999 instead of 0.9999 (500 epochs, not 50,001); no printing,
image generation (``conditional_generation``, matplotlib) or model saving.
Measure only (not in the program): the reconstruction loss ``LS + LP`` of the trained
model on the 200 held-out sketches (batched correctly, time-major, the ``z`` noise seeded).

nndx, as the author would add it: the program holds two networks with two optimizers
and no module over both, so the author wraps them in one ``nn.Module`` (``SketchRNN``,
``forward(batch)`` = the train step's encode/decode, returning the decoder's parameters
with ``mu`` and ``sigma_hat``) whose loss is the program's ``LR + LKL`` against ``(mask, dx,
dy, p)``; a preflight ``nndx.probe`` on the first batch (no ``optimizer=``: there are two);
``nndx.Monitor(sketch_rnn, [encoder_optimizer, decoder_optimizer])`` around the loop, every
epoch's loss logged; after training ``nndx.probe(..., monitor=mon)`` on the first batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sketch_rnn"
SOURCE = Source("alexis-jacq/Pytorch-Sketch-RNN", "sketch_rnn.py", "5c3e21375dfe7695c1c37a0acccf6da17c049f77", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: hidden 32/64, Nz 16, M 5, 500 epochs)"),
        Variant(
            "pi_softmax_wrong_dim",
            "pi = F.softmax(pi, dim=0) over the (Nmax+1)*batch rows instead of the M mixture components: the "
            "mixture weights of each step no longer sum to one, the mixture density is squeezed toward 1e-5",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/ctallec/world-models/issues/10", "https://github.com/sksq96/pytorch-mdn/issues/1",
             "https://github.com/perone/euclidesdb/issues/2"),
            Measure("heldout_recon", "held-out LS + LP at least 0.5 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "strokes_view_not_transpose",
            "make_batch stacks the sequences batch-first (np.stack(strokes, 0)) and makes them time-major with "
            ".view(Nmax, batch, 5) instead of a transpose: every 'sequence' the LSTMs see is a scramble of points "
            "from several sketches",
            (C.WRONG_RESHAPE,),
            ("https://github.com/jessicayung/blog-code-snippets/issues/6",
             "https://github.com/HHTseng/video-classification/issues/42",
             "https://github.com/zy1996code/nlp_basic_model/issues/1"),
            Measure("heldout_recon", "held-out LS + LP (correctly batched sketches) at least 0.5 above the "
                    "healthy run's", lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
    )
}


class HParams:
    def __init__(self) -> None:
        self.enc_hidden_size = 32
        self.dec_hidden_size = 64
        self.Nz = 16
        self.M = 5
        self.dropout = 0.9
        self.batch_size = 32
        self.eta_min = 0.01
        self.R = 0.99995
        self.KL_min = 0.2
        self.wKL = 0.5
        self.lr = 0.001
        self.lr_decay = 0.999
        self.min_lr = 0.00001
        self.grad_clip = 1.0
        self.temperature = 0.4
        self.max_seq_length = 200


hp = HParams()
EPOCHS, N_TRAIN, N_TEST = 500, 600, 200


# --------------------------------------------------------------------------- the sketches (the data)


def sketches(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Stroke-3 sketches (dx, dy, pen lifted after this point): circles, squares (half of them
    with a diagonal as a second stroke) and triangles, jittered, in pixel-like units."""
    out = []
    for _ in range(n):
        kind = rng.integers(3)
        size = rng.uniform(20.0, 60.0)
        strokes: list[np.ndarray] = []
        if kind == 0:
            k = int(rng.integers(18, 30))
            t = np.linspace(0, 2 * np.pi, k) + rng.uniform(0, 2 * np.pi)
            strokes.append(np.stack([size * np.cos(t), size * np.sin(t)], 1))
        else:
            corners = ([(0, 0), (1, 0), (1, 1), (0, 1), (0, 0)] if kind == 1
                       else [(0, 0), (1, 0), (0.5, 0.9), (0, 0)])  # fmt: skip
            per_side = int(rng.integers(4, 7))
            pts = []
            for (x0, y0), (x1, y1) in zip(corners[:-1], corners[1:]):
                for s in np.linspace(0, 1, per_side, endpoint=False):
                    pts.append((x0 + s * (x1 - x0), y0 + s * (y1 - y0)))
            pts.append(corners[-1])
            strokes.append(size * np.array(pts))
            if kind == 1 and rng.random() < 0.5:
                strokes.append(size * np.stack([np.linspace(0, 1, 5), np.linspace(0, 1, 5)], 1))
        points, pen = [], []
        for stroke in strokes:
            stroke = stroke + rng.normal(0, 0.03 * size, stroke.shape)
            points.append(stroke)
            pen.append(np.r_[np.zeros(len(stroke) - 1), 1.0])
        absolute = np.concatenate(points)
        deltas = np.diff(np.concatenate([[[0.0, 0.0]], absolute]), axis=0)
        out.append(np.concatenate([np.round(deltas), np.concatenate(pen)[:, None]], 1))
    return out


# --------------------------------------------------------------------------- load and prepare data


def max_size(data: list[np.ndarray]) -> int:
    return max(len(seq) for seq in data)


def purify(strokes: list[np.ndarray]) -> list[np.ndarray]:
    data = []
    for seq in strokes:
        if 10 < seq.shape[0] <= hp.max_seq_length:
            seq = np.maximum(np.minimum(seq, 1000), -1000)
            data.append(np.array(seq, dtype=np.float32))
    return data


def calculate_normalizing_scale_factor(strokes: list[np.ndarray]) -> float:
    return float(np.std(np.concatenate([s[:, 0:2].reshape(-1) for s in strokes])))


def normalize(strokes: list[np.ndarray], scale_factor: float) -> list[np.ndarray]:
    data = []
    for seq in strokes:
        seq[:, 0:2] /= scale_factor
        data.append(seq)
    return data


def make_batch(data: list[np.ndarray], nmax: int, batch_idx, batch_first_view: bool = False):
    strokes, lengths = [], []
    for seq in [data[idx] for idx in batch_idx]:
        len_seq = len(seq[:, 0])
        new_seq = np.zeros((nmax, 5))
        new_seq[:len_seq, :2] = seq[:, :2]
        new_seq[: len_seq - 1, 2] = 1 - seq[:-1, 2]
        new_seq[:len_seq, 3] = seq[:, 2]
        new_seq[(len_seq - 1) :, 4] = 1
        new_seq[len_seq - 1, 2:4] = 0
        lengths.append(len_seq)
        strokes.append(new_seq)
    if batch_first_view:  # the bug: batch-first, then "made time-major" by a view
        batch = torch.from_numpy(np.stack(strokes, 0)).float().view(nmax, len(strokes), 5)
    else:
        batch = torch.from_numpy(np.stack(strokes, 1)).float()
    return batch, lengths


def lr_decay(optimizer: optim.Optimizer) -> optim.Optimizer:
    for param_group in optimizer.param_groups:
        if param_group["lr"] > hp.min_lr:
            param_group["lr"] *= hp.lr_decay
    return optimizer


# --------------------------------------------------------------------------- encoder and decoder modules


class EncoderRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, hp.enc_hidden_size, dropout=hp.dropout, bidirectional=True)
        self.fc_mu = nn.Linear(2 * hp.enc_hidden_size, hp.Nz)
        self.fc_sigma = nn.Linear(2 * hp.enc_hidden_size, hp.Nz)
        self.train()

    def forward(self, inputs: torch.Tensor, batch_size: int, hidden_cell=None):
        if hidden_cell is None:
            hidden_cell = (torch.zeros(2, batch_size, hp.enc_hidden_size), torch.zeros(2, batch_size, hp.enc_hidden_size))
        _, (hidden, _cell) = self.lstm(inputs.float(), hidden_cell)
        hidden_forward, hidden_backward = torch.split(hidden, 1, 0)
        hidden_cat = torch.cat([hidden_forward.squeeze(0), hidden_backward.squeeze(0)], 1)
        mu = self.fc_mu(hidden_cat)
        sigma_hat = self.fc_sigma(hidden_cat)
        sigma = torch.exp(sigma_hat / 2.0)
        z_size = mu.size()
        N = torch.normal(torch.zeros(z_size), torch.ones(z_size))  # noqa: N806
        z = mu + sigma * N
        return z, mu, sigma_hat


class DecoderRNN(nn.Module):
    def __init__(self, nmax: int, pi_dim: int = 1) -> None:
        super().__init__()
        self.fc_hc = nn.Linear(hp.Nz, 2 * hp.dec_hidden_size)
        self.lstm = nn.LSTM(hp.Nz + 5, hp.dec_hidden_size, dropout=hp.dropout)
        self.fc_params = nn.Linear(hp.dec_hidden_size, 6 * hp.M + 3)
        self.nmax = nmax
        self.pi_dim = pi_dim  # 1: over the M components (the implicit dim of a 2-D softmax), as published

    def forward(self, inputs: torch.Tensor, z: torch.Tensor, hidden_cell=None):
        if hidden_cell is None:
            hidden, cell = torch.split(torch.tanh(self.fc_hc(z)), hp.dec_hidden_size, 1)
            hidden_cell = (hidden.unsqueeze(0).contiguous(), cell.unsqueeze(0).contiguous())
        outputs, (hidden, cell) = self.lstm(inputs, hidden_cell)
        if self.training:
            y = self.fc_params(outputs.view(-1, hp.dec_hidden_size))
        else:
            y = self.fc_params(hidden.view(-1, hp.dec_hidden_size))
        params = torch.split(y, 6, 1)
        params_mixture = torch.stack(params[:-1])  # trajectory
        params_pen = params[-1]  # pen up/down
        pi, mu_x, mu_y, sigma_x, sigma_y, rho_xy = torch.split(params_mixture, 1, 2)
        len_out = self.nmax + 1 if self.training else 1
        pi = F.softmax(pi.transpose(0, 1).squeeze(), dim=self.pi_dim).view(len_out, -1, hp.M)
        sigma_x = torch.exp(sigma_x.transpose(0, 1).squeeze()).view(len_out, -1, hp.M)
        sigma_y = torch.exp(sigma_y.transpose(0, 1).squeeze()).view(len_out, -1, hp.M)
        rho_xy = torch.tanh(rho_xy.transpose(0, 1).squeeze()).view(len_out, -1, hp.M)
        mu_x = mu_x.transpose(0, 1).squeeze().contiguous().view(len_out, -1, hp.M)
        mu_y = mu_y.transpose(0, 1).squeeze().contiguous().view(len_out, -1, hp.M)
        q = F.softmax(params_pen, dim=1).view(len_out, -1, 3)
        return pi, mu_x, mu_y, sigma_x, sigma_y, rho_xy, q, hidden, cell


class SketchRNN(nn.Module):
    """nndx only: the author's wrapper over the two networks, one forward = the train step's
    encode + decode of a time-major batch."""

    def __init__(self, encoder: EncoderRNN, decoder: DecoderRNN) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, batch: torch.Tensor):
        batch_size = batch.size(1)
        z, mu, sigma_hat = self.encoder(batch, batch_size)
        sos = torch.stack([torch.Tensor([0, 0, 1, 0, 0])] * batch_size).unsqueeze(0)
        batch_init = torch.cat([sos, batch], 0)
        z_stack = torch.stack([z] * (self.decoder.nmax + 1))
        inputs = torch.cat([batch_init, z_stack], 2)
        return self.decoder(inputs, z)[:7] + (mu, sigma_hat)


def bivariate_normal_pdf(dx, dy, mu_x, mu_y, sigma_x, sigma_y, rho_xy) -> torch.Tensor:
    z_x = ((dx - mu_x) / sigma_x) ** 2
    z_y = ((dy - mu_y) / sigma_y) ** 2
    z_xy = (dx - mu_x) * (dy - mu_y) / (sigma_x * sigma_y)
    z = z_x + z_y - 2 * rho_xy * z_xy
    exp = torch.exp(-z / (2 * (1 - rho_xy**2)))
    norm = 2 * np.pi * sigma_x * sigma_y * torch.sqrt(1 - rho_xy**2)
    return exp / norm


def reconstruction_loss(out, mask, dx, dy, p, nmax: int, batch_size: int) -> torch.Tensor:
    pi, mu_x, mu_y, sigma_x, sigma_y, rho_xy, q = out[:7]
    pdf = bivariate_normal_pdf(dx, dy, mu_x, mu_y, sigma_x, sigma_y, rho_xy)
    LS = -torch.sum(mask * torch.log(1e-5 + torch.sum(pi * pdf, 2))) / float(nmax * batch_size)  # noqa: N806
    LP = -torch.sum(p * torch.log(q)) / float(nmax * batch_size)  # noqa: N806
    return LS + LP


def kullback_leibler_loss(mu, sigma_hat, eta_step: float, batch_size: int) -> torch.Tensor:
    LKL = -0.5 * torch.sum(1 + sigma_hat - mu**2 - torch.exp(sigma_hat)) / float(hp.Nz * batch_size)  # noqa: N806
    KL_min = torch.Tensor([hp.KL_min]).detach()  # noqa: N806
    return hp.wKL * eta_step * torch.max(LKL, KL_min)


def make_target(batch: torch.Tensor, lengths: list[int], nmax: int):
    eos = torch.stack([torch.Tensor([0, 0, 0, 0, 1])] * batch.size()[1]).unsqueeze(0)
    batch = torch.cat([batch, eos], 0)
    mask = torch.zeros(nmax + 1, batch.size()[1])
    for indice, length in enumerate(lengths):
        mask[:length, indice] = 1
    dx = torch.stack([batch.data[:, :, 0]] * hp.M, 2)
    dy = torch.stack([batch.data[:, :, 1]] * hp.M, 2)
    p = torch.stack([batch.data[:, :, 2], batch.data[:, :, 3], batch.data[:, :, 4]], 2)
    return mask, dx, dy, p


class Model:
    def __init__(self, nmax: int, variant: str) -> None:
        self.nmax, self.variant = nmax, variant
        self.encoder = EncoderRNN()
        self.decoder = DecoderRNN(nmax, pi_dim=0 if variant == "pi_softmax_wrong_dim" else 1)
        self.encoder_optimizer = optim.Adam(self.encoder.parameters(), hp.lr)
        self.decoder_optimizer = optim.Adam(self.decoder.parameters(), hp.lr)
        self.eta_step = hp.eta_min

    def train(self, epoch: int, data: list[np.ndarray], mon) -> float:
        self.encoder.train()
        self.decoder.train()
        batch_idx = np.random.choice(len(data), hp.batch_size)
        batch, lengths = make_batch(data, self.nmax, batch_idx,
                                    batch_first_view=self.variant == "strokes_view_not_transpose")  # fmt: skip
        z, self.mu, self.sigma = self.encoder(batch, hp.batch_size)
        sos = torch.stack([torch.Tensor([0, 0, 1, 0, 0])] * hp.batch_size).unsqueeze(0)
        batch_init = torch.cat([sos, batch], 0)
        z_stack = torch.stack([z] * (self.nmax + 1))
        inputs = torch.cat([batch_init, z_stack], 2)
        out = self.decoder(inputs, z)
        mask, dx, dy, p = make_target(batch, lengths, self.nmax)
        self.encoder_optimizer.zero_grad()
        self.decoder_optimizer.zero_grad()
        self.eta_step = 1 - (1 - hp.eta_min) * hp.R  # as published: constant
        LKL = kullback_leibler_loss(self.mu, self.sigma, self.eta_step, hp.batch_size)  # noqa: N806
        LR = reconstruction_loss(out, mask, dx, dy, p, self.nmax, hp.batch_size)  # noqa: N806
        loss = LR + LKL
        loss.backward()
        nn.utils.clip_grad_norm_(self.encoder.parameters(), hp.grad_clip)
        nn.utils.clip_grad_norm_(self.decoder.parameters(), hp.grad_clip)
        self.encoder_optimizer.step()
        self.decoder_optimizer.step()
        mon.log(loss)
        if epoch % 1 == 0:  # the source prints here
            self.encoder_optimizer = lr_decay(self.encoder_optimizer)
            self.decoder_optimizer = lr_decay(self.decoder_optimizer)
        return float(LR.item())


def heldout_loss(model: Model, test: list[np.ndarray]) -> float:
    """Measure only: LS + LP on the held-out sketches, batched as make_batch does (time-major)."""
    torch.manual_seed(12345)
    net = SketchRNN(model.encoder, model.decoder).train()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(test), 50):
            idx = np.arange(start, min(start + 50, len(test)))
            batch, lengths = make_batch(test, model.nmax, idx)
            mask, dx, dy, p = make_target(batch, lengths, model.nmax)
            total += reconstruction_loss(net(batch), mask, dx, dy, p, model.nmax, len(idx)).item() * len(idx)
            count += len(idx)
    return total / count


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(seed)
    torch.manual_seed(seed)
    raw = sketches(N_TRAIN + N_TEST, np.random.default_rng(100 + seed))
    data = purify(raw[:N_TRAIN])
    scale = calculate_normalizing_scale_factor(data)
    data = normalize(data, scale)
    test = normalize(purify(raw[N_TRAIN:]), scale)
    nmax = max(max_size(data), max_size(test))

    model = Model(nmax, variant)
    net = SketchRNN(model.encoder, model.decoder)
    probe_b, probe_lengths = make_batch(data, nmax, np.arange(hp.batch_size),
                                        batch_first_view=variant == "strokes_view_not_transpose")  # fmt: skip
    eta = 1 - (1 - hp.eta_min) * hp.R

    def loss_fn(out, target) -> torch.Tensor:
        mask, dx, dy, p = target
        n = mask.size(1)
        return reconstruction_loss(out, mask, dx, dy, p, nmax, n) + kullback_leibler_loss(out[7], out[8], eta, n)

    probe_batch = (probe_b, make_target(probe_b, probe_lengths, nmax))
    nx.preflight(net, probe_batch, loss_fn)
    mon = nx.monitor(net, [model.encoder_optimizer, model.decoder_optimizer], every=10)

    recon = []
    for epoch in range(EPOCHS):
        recon.append(model.train(epoch, data, mon))
    nx.finish(mon, net, probe_batch, loss_fn)

    late = recon[-50:]
    return {
        "heldout_recon": heldout_loss(model, test),
        "late_train_recon": float(sum(late) / len(late)),
    }
