"""Port of facebookresearch's DeepSDF auto-decoder: one latent code per training shape in an
``nn.Embedding``, optimised jointly with a weight-normalised MLP decoder that maps
``[code, xyz]`` to a signed distance, trained with a clamped L1 loss.

Source: github.com/facebookresearch/DeepSDF, ``train_deep_sdf.py``,
``networks/deep_sdf_decoder.py`` and ``deep_sdf/data.py`` (``unpack_sdf_samples``,
``SDFSamples``), with ``examples/chairs/specs.json`` for the settings, at commit
48c19b8d49ed5293da4edd7da8c3941444bc5cd7 (the repository's HEAD; MIT, Copyright (c) 2019
Facebook). Written anew from the facts of those files; no code copied.

Kept: ``Decoder(latent_size, dims, dropout, dropout_prob, norm_layers, latent_in,
weight_norm)``: ``dims = [latent_size + 3] + dims + [1]``; the layer before each
``latent_in`` layer outputs ``dims[l + 1] - dims[0]`` so the concatenation with the input
restores the width; every layer in ``norm_layers`` an ``nn.utils.weight_norm(nn.Linear)``,
the last a plain ``nn.Linear``; in ``forward`` the input concatenated back in at the
``latent_in`` layer, ``ReLU`` and ``F.dropout(p, training=self.training)`` after every hidden
layer, and the unconditional final ``self.th`` (``nn.Tanh``) that the decoder applies
whatever ``use_tanh`` says. The chairs spec: every hidden layer weight-normed with dropout
0.2, ``latent_in`` in the middle, ``xyz_in_all``/``use_tanh``/``latent_dropout`` false,
``ClampingDistance`` 0.1, ``CodeRegularization`` with lambda 1e-4, ``CodeBound`` 1.0
(``Embedding(max_norm=code_bound)``), codes ``N(0, CodeInitStdDev / sqrt(latent_size))``
with the default std 1.0, two ``Step`` schedules (decoder 5e-4, codes 1e-3, halved every
``Interval`` epochs) applied by ``adjust_learning_rate`` to the two param groups of one
``Adam`` at the start of every epoch; ``SDFSamples`` (half the subsample drawn at random from
a shape's positive samples, half from its negative ones) in a ``DataLoader(batch_size=
ScenesPerBatch, shuffle=True, drop_last=True)``; per batch: ``sdf_data.reshape(-1, 4)``,
``xyz``/``sdf_gt``, ``sdf_gt`` clamped, ``indices.unsqueeze(-1).repeat(1,
num_samp_per_scene).view(-1)``, ``torch.chunk`` into ``batch_split`` (1) pieces,
``optimizer_all.zero_grad()``, per chunk ``lat_vecs(indices)``, ``cat([codes, xyz])``,
``decoder``, the prediction clamped, ``L1Loss(reduction="sum") / num_sdf_samples`` plus
``code_reg_lambda * min(1, epoch / ramp) * sum(norm(codes)) / num_sdf_samples``,
``backward``, then ``optimizer_all.step()``; ``decoder.train()`` at the start of every epoch.
Shrunk: 16 synthetic shapes (8 spheres, 8 axis-aligned boxes, inside the unit sphere) with
analytic signed distances instead of ShapeNet meshes; each shape's samples made the way
``PreprocessMesh`` makes them (surface points perturbed with variances 0.005 and 0.0005
plus a few uniform points in the bounding cube), 6,000 per shape, split into ``pos``/``neg``;
``CodeLength`` 16 instead of 256; ``dims`` [64] * 4 with ``latent_in`` [2] instead of
[512] * 8 with [4]; ``SamplesPerScene`` 512 instead of 16,384, ``ScenesPerBatch`` 8 instead
of 64 (two batches an epoch, 600 steps in all); 300 epochs with the step ``Interval`` 80
instead of 2,001 and 500; both initial learning rates ten times the spec's (decoder 5e-3,
codes 1e-2: at the spec's rates 600 steps leave the shapes barely fitted); the
code-regularisation ramp ``min(1, epoch / 15)`` instead of ``epoch / 100`` (the same
fraction of the run); no checkpoints, logs or meshes.
Measure only (not in the program): after training, the decoder in eval mode with each
shape's learned code on 2,000 fresh near-surface points per shape (variance 0.0005) and 500
uniform ones: the clamped L1 error of the signed distance (as the loss measures it) and the
inside/outside sign accuracy on points farther than 0.01 from the surface.

nndx, as the author would add it: nndx calls one model on a batch, and the program's model
is two modules (the code table and the decoder) under one optimizer, so the author hands
nndx a thin ``AutoDecoder`` holding both, whose ``forward(indices, xyz)`` is the loop's
``decoder(cat([lat_vecs(indices), xyz], 1))`` (the loop itself keeps calling the two
modules); the batch is the first loader batch as ``((indices, xyz), sdf_gt)`` and
``loss_fn`` the program's clamped L1 per sample (without the epoch-dependent code
regulariser); a preflight ``nndx.probe`` with the optimizer, ``nndx.Monitor(autodecoder,
optimizer_all, loss_fn=loss_l1)`` around the epochs with ``mon.loss_fn`` in place of
``loss_l1`` and each batch's loss logged, and after training ``nndx.probe(...,
monitor=mon)``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deepsdf"
SOURCE = Source("facebookresearch/DeepSDF", "train_deep_sdf.py", "48c19b8d49ed5293da4edd7da8c3941444bc5cd7", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16 analytic shapes, codes of 16, 4x64 decoder, 300 "
                           "epochs)"),  # fmt: skip
        Variant(
            "indices_repeat_not_interleaved",
            "the per-sample shape indices built as indices.repeat(num_samp_per_scene) instead of "
            "indices.unsqueeze(-1).repeat(1, num_samp_per_scene).view(-1): the codes are tiled batch-wise while "
            "the samples are laid out shape by shape, so almost every sample is paired with another shape's code",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/transformers/pull/25074",
             "https://github.com/fal-ai/text-to-image/pull/45"),
            Measure("sdf_l1", "clamped L1 SDF error on fresh samples of the training shapes at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "zero_grad_dropped",
            "optimizer_all.zero_grad() left out of the batch loop: the decoder's and the codes' .grad keep the sum "
            "of every earlier batch's gradient, so each Adam step follows the running sum, not the batch",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7",
             "https://github.com/wenet-e2e/wekws/pull/73"),
            Measure("sdf_l1", "clamped L1 SDF error on fresh samples of the training shapes at least 2x the healthy "
                    "run's", lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

# specs.json, shrunk
SPECS = {
    "NetworkSpecs": {"dims": [64, 64, 64, 64], "dropout": [0, 1, 2, 3], "dropout_prob": 0.2,
                     "norm_layers": [0, 1, 2, 3], "latent_in": [2], "xyz_in_all": False, "use_tanh": False,
                     "latent_dropout": False, "weight_norm": True},
    "CodeLength": 16,
    "NumEpochs": 300,
    "LearningRateSchedule": [{"Type": "Step", "Initial": 0.005, "Interval": 80, "Factor": 0.5},
                             {"Type": "Step", "Initial": 0.01, "Interval": 80, "Factor": 0.5}],
    "SamplesPerScene": 512,
    "ScenesPerBatch": 8,
    "ClampingDistance": 0.1,
    "CodeRegularization": True,
    "CodeRegularizationLambda": 1e-4,
    "CodeBound": 1.0,
}  # fmt: skip
CODE_REG_RAMP = 15  # epochs: the original's 100 of 2,001, scaled to the shorter run
N_SHAPES = 16
SAMPLES_PER_SHAPE = 6000
BATCH_SPLIT = 1


# --------------------------------------------------------------------------- networks/deep_sdf_decoder.py


class Decoder(nn.Module):
    def __init__(self, latent_size, dims, dropout=None, dropout_prob=0.0, norm_layers=(), latent_in=(),
                 weight_norm=False, xyz_in_all=None, use_tanh=False, latent_dropout=False) -> None:  # fmt: skip
        super().__init__()
        dims = [latent_size + 3] + dims + [1]
        self.num_layers = len(dims)
        self.norm_layers = norm_layers
        self.latent_in = latent_in
        self.latent_dropout = latent_dropout
        if self.latent_dropout:
            self.lat_dp = nn.Dropout(0.2)
        self.xyz_in_all = xyz_in_all
        self.weight_norm = weight_norm
        for layer in range(0, self.num_layers - 1):
            if layer + 1 in latent_in:
                out_dim = dims[layer + 1] - dims[0]
            else:
                out_dim = dims[layer + 1]
                if self.xyz_in_all and layer != self.num_layers - 2:
                    out_dim -= 3
            if weight_norm and layer in self.norm_layers:
                with warnings.catch_warnings():  # weight_norm's deprecation notice
                    warnings.simplefilter("ignore")
                    lin = nn.utils.weight_norm(nn.Linear(dims[layer], out_dim))
            else:
                lin = nn.Linear(dims[layer], out_dim)
            setattr(self, f"lin{layer}", lin)
            if (not weight_norm) and self.norm_layers is not None and layer in self.norm_layers:
                setattr(self, f"bn{layer}", nn.LayerNorm(out_dim))
        self.use_tanh = use_tanh
        if use_tanh:
            self.tanh = nn.Tanh()
        self.relu = nn.ReLU()
        self.dropout_prob = dropout_prob
        self.dropout = dropout
        self.th = nn.Tanh()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        xyz = input[:, -3:]
        if input.shape[1] > 3 and self.latent_dropout:
            latent_vecs = F.dropout(input[:, :-3], p=0.2, training=self.training)
            x = torch.cat([latent_vecs, xyz], 1)
        else:
            x = input
        for layer in range(0, self.num_layers - 1):
            lin = getattr(self, f"lin{layer}")
            if layer in self.latent_in:
                x = torch.cat([x, input], 1)
            elif layer != 0 and self.xyz_in_all:
                x = torch.cat([x, xyz], 1)
            x = lin(x)
            if layer == self.num_layers - 2 and self.use_tanh:
                x = self.tanh(x)
            if layer < self.num_layers - 2:
                if self.norm_layers is not None and layer in self.norm_layers and not self.weight_norm:
                    x = getattr(self, f"bn{layer}")(x)
                x = self.relu(x)
                if self.dropout is not None and layer in self.dropout:
                    x = F.dropout(x, p=self.dropout_prob, training=self.training)
        if hasattr(self, "th"):
            x = self.th(x)
        return x


class AutoDecoder(nn.Module):
    """Only for nndx (see the docstring): the code table and the decoder as one model."""

    def __init__(self, lat_vecs: nn.Embedding, decoder: Decoder) -> None:
        super().__init__()
        self.lat_vecs = lat_vecs
        self.decoder = decoder

    def forward(self, indices: torch.Tensor, xyz: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.cat([self.lat_vecs(indices), xyz], dim=1))


# --------------------------------------------------------------------------- data (PreprocessMesh stand-in)


def _shapes(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    shapes = []
    for i in range(N_SHAPES):
        if i % 2 == 0:
            shapes.append(("sphere", rng.uniform(-0.25, 0.25, 3), np.array([rng.uniform(0.25, 0.6)])))
        else:
            shapes.append(("box", rng.uniform(-0.2, 0.2, 3), rng.uniform(0.15, 0.45, 3)))
    return shapes


def _sdf(shape: tuple[str, np.ndarray, np.ndarray], p: np.ndarray) -> np.ndarray:
    kind, c, s = shape
    if kind == "sphere":
        return np.linalg.norm(p - c, axis=1) - s[0]
    q = np.abs(p - c) - s
    return np.linalg.norm(np.maximum(q, 0.0), axis=1) + np.minimum(q.max(axis=1), 0.0)


def _surface(shape: tuple[str, np.ndarray, np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    kind, c, s = shape
    if kind == "sphere":
        d = rng.normal(size=(n, 3))
        return c + s[0] * d / np.linalg.norm(d, axis=1, keepdims=True)
    p = rng.uniform(-1, 1, (n, 3)) * s
    axis = rng.integers(0, 3, n)
    p[np.arange(n), axis] = np.sign(p[np.arange(n), axis]) * s[axis]
    return c + p


def _samples(shape, n: int, rng: np.random.Generator, variances=(0.005, 0.0005), uniform=0.08) -> np.ndarray:
    n_uniform = int(n * uniform)
    per = (n - n_uniform) // len(variances)
    pts = [_surface(shape, per, rng) + rng.normal(scale=math.sqrt(v), size=(per, 3)) for v in variances]
    pts.append(rng.uniform(-1, 1, (n - per * len(variances), 3)))
    p = np.concatenate(pts)
    return np.concatenate([p, _sdf(shape, p)[:, None]], axis=1).astype(np.float32)


def unpack_sdf_samples(data: list[torch.Tensor], subsample: int) -> torch.Tensor:
    pos_tensor, neg_tensor = data
    half = int(subsample / 2)
    random_pos = (torch.rand(half) * pos_tensor.shape[0]).long()
    random_neg = (torch.rand(half) * neg_tensor.shape[0]).long()
    sample_pos = torch.index_select(pos_tensor, 0, random_pos)
    sample_neg = torch.index_select(neg_tensor, 0, random_neg)
    return torch.cat([sample_pos, sample_neg], 0)


class SDFSamples(torch.utils.data.Dataset):
    def __init__(self, npz: list[np.ndarray], subsample: int) -> None:
        self.subsample = subsample
        self.data = [[torch.from_numpy(s[s[:, 3] >= 0]), torch.from_numpy(s[s[:, 3] < 0])] for s in npz]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int):
        return unpack_sdf_samples(self.data[idx], self.subsample), idx


# --------------------------------------------------------------------------- train_deep_sdf.py


class StepLearningRateSchedule:
    def __init__(self, initial: float, interval: int, factor: float) -> None:
        self.initial, self.interval, self.factor = initial, interval, factor

    def get_learning_rate(self, epoch: int) -> float:
        return self.initial * (self.factor ** (epoch // self.interval))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    shapes = _shapes(rng)
    npz = [_samples(shape, SAMPLES_PER_SHAPE, rng) for shape in shapes]
    specs = SPECS
    latent_size = specs["CodeLength"]
    lr_schedules = [StepLearningRateSchedule(s["Initial"], s["Interval"], s["Factor"])
                    for s in specs["LearningRateSchedule"]]  # fmt: skip
    num_samp_per_scene = specs["SamplesPerScene"]
    scene_per_batch = specs["ScenesPerBatch"]
    clamp_dist = specs["ClampingDistance"]
    min_t, max_t = -clamp_dist, clamp_dist
    enforce_minmax = True
    do_code_regularization = specs["CodeRegularization"]
    code_reg_lambda = specs["CodeRegularizationLambda"]
    code_bound = specs["CodeBound"]

    def adjust_learning_rate(optimizer, epoch):
        for i, param_group in enumerate(optimizer.param_groups):
            param_group["lr"] = lr_schedules[i].get_learning_rate(epoch)

    decoder = Decoder(latent_size, **specs["NetworkSpecs"])
    sdf_dataset = SDFSamples(npz, num_samp_per_scene)
    sdf_loader = torch.utils.data.DataLoader(sdf_dataset, batch_size=scene_per_batch, shuffle=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
    num_scenes = len(sdf_dataset)
    lat_vecs = nn.Embedding(num_scenes, latent_size, max_norm=code_bound)
    nn.init.normal_(lat_vecs.weight.data, 0.0, 1.0 / math.sqrt(latent_size))
    loss_l1 = nn.L1Loss(reduction="sum")
    optimizer_all = torch.optim.Adam([
        {"params": decoder.parameters(), "lr": lr_schedules[0].get_learning_rate(0)},
        {"params": lat_vecs.parameters(), "lr": lr_schedules[1].get_learning_rate(0)},
    ])  # fmt: skip

    def per_sample_indices(indices: torch.Tensor) -> torch.Tensor:
        if variant == "indices_repeat_not_interleaved":
            return indices.repeat(num_samp_per_scene)
        return indices.unsqueeze(-1).repeat(1, num_samp_per_scene).view(-1)

    # nndx: the two modules as one model, the first batch, the program's clamped L1 per sample
    autodecoder = AutoDecoder(lat_vecs, decoder)
    with torch.random.fork_rng():
        first_data, first_idx = next(iter(torch.utils.data.DataLoader(sdf_dataset, batch_size=scene_per_batch)))
    first_data = first_data.reshape(-1, 4)
    probe_batch = ((per_sample_indices(first_idx), first_data[:, 0:3]), first_data[:, 3:4].clamp(min_t, max_t))

    def probe_loss(pred_sdf: torch.Tensor, sdf_gt: torch.Tensor) -> torch.Tensor:
        return loss_l1(torch.clamp(pred_sdf, min_t, max_t), sdf_gt) / sdf_gt.shape[0]

    nx.preflight(autodecoder, probe_batch, probe_loss, optimizer=optimizer_all)
    mon = nx.monitor(autodecoder, optimizer_all, every=5, loss_fn=loss_l1)

    loss_log: list[float] = []
    for epoch in range(1, specs["NumEpochs"] + 1):
        decoder.train()
        adjust_learning_rate(optimizer_all, epoch)
        for sdf_data, indices in sdf_loader:
            sdf_data = sdf_data.reshape(-1, 4)
            num_sdf_samples = sdf_data.shape[0]
            sdf_data.requires_grad = False
            xyz = sdf_data[:, 0:3]
            sdf_gt = sdf_data[:, 3].unsqueeze(1)
            if enforce_minmax:
                sdf_gt = torch.clamp(sdf_gt, min_t, max_t)
            xyz = torch.chunk(xyz, BATCH_SPLIT)
            indices = torch.chunk(per_sample_indices(indices), BATCH_SPLIT)
            sdf_gt = torch.chunk(sdf_gt, BATCH_SPLIT)
            batch_loss = 0.0
            if variant != "zero_grad_dropped":
                optimizer_all.zero_grad()
            for i in range(BATCH_SPLIT):
                batch_vecs = lat_vecs(indices[i])
                input = torch.cat([batch_vecs, xyz[i]], dim=1)
                pred_sdf = decoder(input)
                if enforce_minmax:
                    pred_sdf = torch.clamp(pred_sdf, min_t, max_t)
                chunk_loss = mon.loss_fn(pred_sdf, sdf_gt[i]) / num_sdf_samples
                if do_code_regularization:
                    l2_size_loss = torch.sum(torch.norm(batch_vecs, dim=1))
                    reg_loss = (code_reg_lambda * min(1, epoch / CODE_REG_RAMP) * l2_size_loss) / num_sdf_samples
                    chunk_loss = chunk_loss + reg_loss
                chunk_loss.backward()
                batch_loss += chunk_loss.item()
            loss_log.append(batch_loss)
            optimizer_all.step()
            nx.timed(lambda: mon.log(batch_loss))  # noqa: B023

    nx.finish(mon, autodecoder, probe_batch, probe_loss, optimizer=optimizer_all)
    return {"final_loss": float(np.mean(loss_log[-10:])), **measure(decoder, lat_vecs, shapes, seed, clamp_dist)}


# --------------------------------------------------------------------------- measure only


def measure(decoder: Decoder, lat_vecs: nn.Embedding, shapes, seed: int, clamp_dist: float) -> dict[str, float]:
    rng = np.random.default_rng(seed + 1000)
    decoder.eval()
    errors, signs = [], []
    with torch.no_grad():
        for idx, shape in enumerate(shapes):
            s = torch.from_numpy(_samples(shape, 2500, rng, variances=(0.0005,), uniform=0.2))
            code = lat_vecs(torch.full((len(s),), idx, dtype=torch.long))
            pred = decoder(torch.cat([code, s[:, :3]], dim=1))[:, 0]
            gt = s[:, 3]
            errors.append((pred.clamp(-clamp_dist, clamp_dist) - gt.clamp(-clamp_dist, clamp_dist)).abs())
            far = gt.abs() > 0.01
            signs.append((torch.sign(pred[far]) == torch.sign(gt[far])).float())
    return {"sdf_l1": float(torch.cat(errors).mean()), "sign_acc": float(torch.cat(signs).mean())}
