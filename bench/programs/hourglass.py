"""Port of princeton-vl/pytorch_stacked_hourglass: single-person pose estimation with a stack
of hourglass networks, heatmap MSE with intermediate supervision on every stack, Adam and a
one-step learning-rate decay, trained through the repository's ``Trainer`` wrapper (the
model computes its own loss).

Source: github.com/princeton-vl/pytorch_stacked_hourglass, ``train.py``, ``task/pose.py``,
``task/loss.py``, ``models/posenet.py``, ``models/layers.py`` and ``data/MPII/dp.py`` at commit
ceedc14b9b8814ba641f4a00baa5d0af153588a9 (BSD-3-Clause, Copyright (c) 2019 princeton-vl).
Written anew from the facts of those files; no code copied.

Kept: ``layers.Conv`` (a ``Conv2d`` with ``(k - 1) // 2`` padding and bias, optional
``BatchNorm2d`` then optional ``ReLU``; the input-width assertion), ``Residual`` (pre-activation
bottleneck: BN, ReLU, 1x1 conv to half width, BN, ReLU, 3x3 conv, BN, ReLU, 1x1 conv back,
plus the input or a 1x1 skip conv when the widths differ, added in place), ``Hourglass``
(recursive: ``up1`` residual; max-pool, ``low1``, the inner hourglass (a residual at the
bottom), ``low3``, nearest 2x upsampling, ``up1 + up2``); ``PoseNet`` (NHWC images permuted
to NCHW; ``pre``: 7x7 stride-2 Conv+BN+ReLU, Residual, 2x2 max-pool, two Residuals; per stack
an hourglass, a Residual and a 1x1 Conv+BN+ReLU as ``features``, a 1x1 conv to
the part heatmaps as ``outs``, and between stacks ``x + merge_preds(preds) +
merge_features(feature)``; the stacked predictions ``(N, nstack, parts, H, W)``;
``calc_loss``: ``HeatmapLoss`` (squared error averaged over parts and pixels, one value per
sample) for every stack against the same heatmaps, stacked to ``(N, nstack)``);
``task/pose.py``'s ``Trainer`` (in training mode it runs the model and returns the
predictions followed by the loss from ``calc_loss``; in eval mode the predictions only) over
``DataParallel(poseNet)``; ``Adam`` over the trainable parameters at ``learning_rate``
1e-3; ``make_train`` (``net.train()`` at every call; in the valid phase every
``BatchNorm2d`` put in eval mode; the loss ``torch.mean`` of the ``combined_hm_loss`` output
times its weight 1; in the train phase ``zero_grad``, ``backward``, ``step``; the learning
rate set to ``decay_lr`` 2e-4 when ``batch_id == decay_iters``; the valid phase computes the
loss with the graph built and takes no step, as published); ``train.py``'s loop (epochs of
``train_iters`` train batches then ``valid_iters`` valid batches, ``batch_id = num_step *
epoch`` and the stop when it passes ``max_iters``); ``dp.py``'s ``GenerateHeatmap`` (a
Gaussian of ``6 * sigma + 3`` pixels pasted with ``np.maximum`` at the integer keypoint,
skipped when the keypoint is off the map or has ``x <= 0``), its ``Dataset`` (keypoints taken
to the output resolution for the heatmaps; a random horizontal flip half of the time, with
the colour jitter of ``preprocess`` applied to the flipped images only, the image reversed
along its width, the parts permuted by ``flipped_parts`` and ``x`` mirrored as ``output_res -
x``; images as float32 in [0, 1]) and ``init``'s shuffled DataLoaders wrapped by ``gen``,
which restarts an exhausted loader.
Shrunk: MPII (downloaded images and annotations) replaced by synthetic 64x64 "people"
rendered at run time (``render_person``: a stick figure facing the camera on a smooth random
background, 8 parts in MPII's order convention -- right ankle, right hip, left hip, left
ankle, pelvis, head top, right wrist, left wrist -- left and right parts drawn identically,
so only the body's layout tells them apart, as in MPII); 400 training and 128 validation
images; ``input_res`` 64 and ``output_res`` 16 instead of 256 and 64 (the same factor 4),
``sigma`` 1 pixel (the original's ``output_res / 64`` at its 64-pixel maps); 2 stacks (the
README's 2HG model) instead of 8; hourglasses of depth 2 instead of 4 (the original's
64x64 maps bottom out at 4x4, and so do these 16x16 ones); ``inp_dim`` 32 instead of 256
and the stem 16/32 instead of 64/128; ``batchsize`` 16 (kept); ``train_iters`` 25 and
``valid_iters`` 4 instead of 1,000 and 10; 12 epochs (300 steps: ``max_iters`` 275
iterations instead of 250k); ``learning_rate`` 2.5e-3 instead of 1e-3 and ``decay_lr``
5e-4 instead of 2e-4 (the same factor 5) at ``decay_iters`` 250 instead of 100,000 (far
fewer steps); no crop/rotation/scale augmentation and no hue/saturation jitter (they need
OpenCV); brightness and contrast jitter kept; ``num_workers`` 0; no checkpoint files, no
log file, no tqdm.
Measure only (not in the program): the keypoint accuracy of the last model on the
validation images as ``test.py`` scores it in spirit (eval mode, the last stack's heatmaps,
the argmax of each part's map taken back to input pixels; a keypoint is correct within 6
input pixels): ``val_pck`` over all parts and ``lr_pck`` over the six left/right parts; the
mean valid-phase loss of the last epoch is returned too. Without nndx, seeds 0/1/2: healthy
``val_pck`` 0.94/0.94/0.92 (``lr_pck`` 0.92/0.93/0.90); flip_parts_not_swapped ``lr_pck``
0.67/0.61/0.55; heatmaps_at_input_res ``val_pck`` 0.03/0.02/0.03.

nndx, as the author would add it: the ``Trainer`` computes the loss itself from keyword
labels, so nndx is given the network it wraps: a preflight ``nndx.probe`` on ``PoseNet`` with
the first training batch ``(imgs, heatmaps)``, the loop's loss written as a function of the
predictions (``calc_loss`` on them, averaged as ``make_train`` does), the optimizer and the
train/valid images and heatmaps (drawn through the datasets) as ``data``;
``nndx.Monitor(poseNet, optimizer)`` around the loop, each train step's loss logged and each
valid batch's loss logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.nn import DataParallel

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "hourglass"
SOURCE = Source("princeton-vl/pytorch_stacked_hourglass", "task/pose.py",
                "ceedc14b9b8814ba641f4a00baa5d0af153588a9", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (2 stacks, Adam, flip augmentation with part swapping)"),
        Variant(
            "flip_parts_not_swapped",
            "the flip augmentation mirrors the image and the keypoints' x but leaves out "
            "keypoints[:, flipped_parts]: on every flipped image the left parts are labelled as the right ones "
            "and the right as the left, so half the training heatmaps say the opposite of the other half",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED),
            ("https://github.com/princeton-vl/pytorch_stacked_hourglass/issues/43",
             "https://github.com/ildoonet/tf-pose-estimation/issues/33",
             "https://github.com/open-mmlab/mmpose/issues/1114"),
            Measure("lr_pck", "validation PCK of the left/right parts at least 0.15 below the healthy run's "
                    "(0.92/0.93/0.90 healthy, 0.67/0.61/0.55 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "heatmaps_at_input_res",
            "the keypoints handed to GenerateHeatmap are the input-resolution ones (the image transform 'mat' "
            "instead of 'mat_mask'): the Gaussians land at 4x their coordinates on the 16x16 maps, and every "
            "keypoint beyond the map's first quarter is dropped, leaving its heatmap empty",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/HRNet/HigherHRNet-Human-Pose-Estimation/issues/83",
             "https://github.com/chenyilun95/tf-cpn/issues/4",
             "https://github.com/princeton-vl/pytorch_stacked_hourglass/issues/27"),
            Measure("val_pck", "validation PCK of all parts at least 0.2 below the healthy run's (0.94/0.94/0.92 "
                    "healthy, 0.03/0.02/0.03 buggy on seeds 0-2; the valid loss falls below the healthy run's)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

PARTS = ("r_ankle", "r_hip", "l_hip", "l_ankle", "pelvis", "head_top", "r_wrist", "l_wrist")
FLIPPED_PARTS = [3, 2, 1, 0, 4, 5, 7, 6]  # ds.flipped_parts['mpii'] for these parts
LR_PARTS = [0, 1, 2, 3, 6, 7]
N_TRAIN, N_VALID = 400, 128
PCK_PIXELS = 6.0

__config__ = {
    "inference": {"nstack": 2, "inp_dim": 32, "oup_dim": len(PARTS), "num_parts": len(PARTS), "increase": 0,
                  "keys": ["imgs"]},
    "train": {"batchsize": 16, "input_res": 64, "output_res": 16, "train_iters": 25, "valid_iters": 4,
              "learning_rate": 2.5e-3, "max_num_people": 1, "loss": [["combined_hm_loss", 1]], "decay_iters": 250,
              "decay_lr": 5e-4, "num_workers": 0, "use_data_loader": True},
    "max_iters": 275,  # opt.max_iters (in thousands in the original), here in iterations: 12 epochs
}
STEM = (16, 32)  # the original's 64 and 128
HG_DEPTH = 2  # the original's 4: its 64x64 maps bottom out at 4x4, and so do these 16x16 ones


# --------------------------------------------------------------------------- models/layers.py

Pool = nn.MaxPool2d


class Conv(nn.Module):
    def __init__(self, inp_dim: int, out_dim: int, kernel_size: int = 3, stride: int = 1, bn: bool = False,
                 relu: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.inp_dim = inp_dim
        self.conv = nn.Conv2d(inp_dim, out_dim, kernel_size, stride, padding=(kernel_size - 1) // 2, bias=True)
        self.relu = nn.ReLU() if relu else None
        self.bn = nn.BatchNorm2d(out_dim) if bn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.size()[1] == self.inp_dim, f"{x.size()[1]} {self.inp_dim}"
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        if self.relu is not None:
            x = self.relu(x)
        return x


class Residual(nn.Module):
    def __init__(self, inp_dim: int, out_dim: int) -> None:
        super().__init__()
        half = int(out_dim / 2)
        self.relu = nn.ReLU()
        self.bn1 = nn.BatchNorm2d(inp_dim)
        self.conv1 = Conv(inp_dim, half, 1, relu=False)
        self.bn2 = nn.BatchNorm2d(half)
        self.conv2 = Conv(half, half, 3, relu=False)
        self.bn3 = nn.BatchNorm2d(half)
        self.conv3 = Conv(half, out_dim, 1, relu=False)
        self.skip_layer = Conv(inp_dim, out_dim, 1, relu=False)
        self.need_skip = inp_dim != out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.skip_layer(x) if self.need_skip else x
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.conv2(self.relu(self.bn2(out)))
        out = self.conv3(self.relu(self.bn3(out)))
        out += residual
        return out


class Hourglass(nn.Module):
    def __init__(self, n: int, f: int, bn=None, increase: int = 0) -> None:
        super().__init__()
        nf = f + increase
        self.up1 = Residual(f, f)
        self.pool1 = Pool(2, 2)
        self.low1 = Residual(f, nf)
        self.n = n
        self.low2 = Hourglass(n - 1, nf, bn=bn) if self.n > 1 else Residual(nf, nf)
        self.low3 = Residual(nf, f)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up1 = self.up1(x)
        low1 = self.low1(self.pool1(x))
        low3 = self.low3(self.low2(low1))
        return up1 + self.up2(low3)


# --------------------------------------------------------------------------- task/loss.py, models/posenet.py


class HeatmapLoss(nn.Module):
    def forward(self, pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        sq = (pred - gt) ** 2
        return sq.mean(dim=3).mean(dim=2).mean(dim=1)  # one value per sample


class Merge(nn.Module):
    def __init__(self, x_dim: int, y_dim: int) -> None:
        super().__init__()
        self.conv = Conv(x_dim, y_dim, 1, relu=False, bn=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class PoseNet(nn.Module):
    def __init__(self, nstack: int, inp_dim: int, oup_dim: int, bn: bool = False, increase: int = 0, **kwargs) -> None:
        super().__init__()
        self.nstack = nstack
        self.pre = nn.Sequential(
            Conv(3, STEM[0], 7, 2, bn=True, relu=True),
            Residual(STEM[0], STEM[1]),
            Pool(2, 2),
            Residual(STEM[1], STEM[1]),
            Residual(STEM[1], inp_dim),
        )
        self.hgs = nn.ModuleList([nn.Sequential(Hourglass(HG_DEPTH, inp_dim, bn, increase)) for _ in range(nstack)])
        self.features = nn.ModuleList([
            nn.Sequential(Residual(inp_dim, inp_dim), Conv(inp_dim, inp_dim, 1, bn=True, relu=True))
            for _ in range(nstack)])  # fmt: skip
        self.outs = nn.ModuleList([Conv(inp_dim, oup_dim, 1, relu=False, bn=False) for _ in range(nstack)])
        self.merge_features = nn.ModuleList([Merge(inp_dim, inp_dim) for _ in range(nstack - 1)])
        self.merge_preds = nn.ModuleList([Merge(oup_dim, inp_dim) for _ in range(nstack - 1)])
        self.heatmapLoss = HeatmapLoss()

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        x = imgs.permute(0, 3, 1, 2)  # NHWC -> NCHW
        x = self.pre(x)
        combined_hm_preds = []
        for i in range(self.nstack):
            hg = self.hgs[i](x)
            feature = self.features[i](hg)
            preds = self.outs[i](feature)
            combined_hm_preds.append(preds)
            if i < self.nstack - 1:
                x = x + self.merge_preds[i](preds) + self.merge_features[i](feature)
        return torch.stack(combined_hm_preds, 1)

    def calc_loss(self, combined_hm_preds, heatmaps: torch.Tensor) -> torch.Tensor:
        combined_loss = [self.heatmapLoss(combined_hm_preds[0][:, i], heatmaps) for i in range(self.nstack)]
        return torch.stack(combined_loss, dim=1)


# --------------------------------------------------------------------------- task/pose.py


class Trainer(nn.Module):
    """Training mode: predictions then the loss; eval mode: the predictions only."""

    def __init__(self, model: nn.Module, inference_keys, calc_loss=None) -> None:
        super().__init__()
        self.model = model
        self.keys = inference_keys
        self.calc_loss = calc_loss

    def forward(self, imgs: torch.Tensor, **inputs):
        inps, labels = {}, {}
        for i in inputs:
            if i in self.keys:
                inps[i] = inputs[i]
            else:
                labels[i] = inputs[i]
        if not self.training:
            return self.model(imgs, **inps)
        combined_hm_preds = self.model(imgs, **inps)
        if not isinstance(combined_hm_preds, (list, tuple)):
            combined_hm_preds = [combined_hm_preds]
        loss = self.calc_loss(**labels, combined_hm_preds=combined_hm_preds)
        return list(combined_hm_preds) + [loss]


# --------------------------------------------------------------------------- the data (data/MPII/dp.py, synthetic)


def _segment_distance(px: np.ndarray, py: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = b - a
    t = np.clip(((px - a[0]) * d[0] + (py - a[1]) * d[1]) / max(float(d @ d), 1e-9), 0.0, 1.0)
    return np.hypot(px - (a[0] + t * d[0]), py - (a[1] + t * d[1]))


def render_person(rng: np.random.Generator, res: int) -> tuple[np.ndarray, np.ndarray]:
    """One 'MPII image' already cropped to the input resolution: (res, res, 3) uint8 and its
    keypoints (1, parts, 3) as (x, y, visible) in input pixels. The person faces the camera:
    their right side is on the image's left."""
    pelvis = np.array([rng.uniform(24, 40), rng.uniform(30, 36)])
    torso = rng.uniform(13, 17)
    lean = rng.uniform(-0.25, 0.25)
    thorax = pelvis + torso * np.array([np.sin(lean), -np.cos(lean)])
    head_top = thorax + rng.uniform(6, 8) * np.array([np.sin(lean), -np.cos(lean)])
    half_hip, half_sh = rng.uniform(3, 5), rng.uniform(4, 6)
    side = np.array([np.cos(lean), np.sin(lean)])  # toward the image's right
    r_hip, l_hip = pelvis - half_hip * side, pelvis + half_hip * side
    r_sh, l_sh = thorax - half_sh * side, thorax + half_sh * side

    def limb(start: np.ndarray, length: float, angle: float) -> np.ndarray:  # angle from straight down
        return start + length * np.array([np.sin(angle), np.cos(angle)])

    r_ankle = limb(r_hip, rng.uniform(13, 17), -rng.uniform(0.0, 0.6))
    l_ankle = limb(l_hip, rng.uniform(13, 17), rng.uniform(0.0, 0.6))
    r_wrist = limb(r_sh, rng.uniform(10, 14), -rng.uniform(0.2, 2.6))
    l_wrist = limb(l_sh, rng.uniform(10, 14), rng.uniform(0.2, 2.6))
    joints = np.stack([r_ankle, r_hip, l_hip, l_ankle, pelvis, head_top, r_wrist, l_wrist])

    yy, xx = np.mgrid[0:res, 0:res].astype(np.float64) + 0.5
    # a smooth random background: a few low-frequency colour waves plus pixel noise
    img = np.zeros((res, res, 3))
    for _ in range(3):
        fx, fy, ph = rng.uniform(0.02, 0.12), rng.uniform(0.02, 0.12), rng.uniform(0, 2 * np.pi)
        img += rng.uniform(0.05, 0.25, size=3) * np.sin(fx * xx + fy * yy + ph)[..., None]
    img = 0.45 + img + rng.normal(0, 0.04, size=img.shape)
    colour = rng.uniform(0.55, 1.0, size=3) * rng.choice([-1.0, 1.0])
    bones = [(r_ankle, r_hip), (l_ankle, l_hip), (r_hip, l_hip), (pelvis, thorax), (r_sh, l_sh),
             (r_sh, r_wrist), (l_sh, l_wrist)]  # fmt: skip
    dist = np.min([_segment_distance(xx, yy, a, b) for a, b in bones], axis=0)
    body = np.clip(1.6 - dist, 0, 1)
    head = np.clip(3.8 - np.hypot(xx - (thorax[0] + head_top[0]) / 2, yy - (thorax[1] + head_top[1]) / 2), 0, 1)
    ends = np.max([np.clip(2.4 - np.hypot(xx - p[0], yy - p[1]), 0, 1) for p in (r_ankle, l_ankle, r_wrist, l_wrist)],
                  axis=0)  # fmt: skip
    mask = np.maximum(np.maximum(body, head), ends)[..., None]
    img = img * (1 - mask) + (0.5 + 0.5 * colour) * mask
    img = np.clip(img, 0, 1)
    keypoints = np.concatenate([joints, np.ones((len(joints), 1))], axis=1)[None]
    return np.round(img * 255).astype(np.uint8), keypoints.astype(np.float64)


def make_split(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    res = __config__["train"]["input_res"]
    pairs = [render_person(rng, res) for _ in range(count)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


class GenerateHeatmap:
    def __init__(self, output_res: int, num_parts: int, sigma: float = 1.0) -> None:
        self.output_res, self.num_parts, self.sigma = output_res, num_parts, sigma
        size = 6 * sigma + 3
        x = np.arange(0, size, 1, float)
        y = x[:, np.newaxis]
        x0 = y0 = 3 * sigma + 1
        self.g = np.exp(-((x - x0) ** 2 + (y - y0) ** 2) / (2 * sigma**2))

    def __call__(self, keypoints: np.ndarray) -> np.ndarray:
        hms = np.zeros((self.num_parts, self.output_res, self.output_res), dtype=np.float32)
        sigma, res = self.sigma, self.output_res
        for p in keypoints:
            for idx, pt in enumerate(p):
                if pt[0] <= 0:
                    continue
                x, y = int(pt[0]), int(pt[1])
                if x < 0 or y < 0 or x >= res or y >= res:
                    continue
                ul = int(x - 3 * sigma - 1), int(y - 3 * sigma - 1)
                br = int(x + 3 * sigma + 2), int(y + 3 * sigma + 2)
                c, d = max(0, -ul[0]), min(br[0], res) - ul[0]
                a, b = max(0, -ul[1]), min(br[1], res) - ul[1]
                cc, dd = max(0, ul[0]), min(br[0], res)
                aa, bb = max(0, ul[1]), min(br[1], res)
                hms[idx, aa:bb, cc:dd] = np.maximum(hms[idx, aa:bb, cc:dd], self.g[a:b, c:d])
        return hms


class Dataset(torch.utils.data.Dataset):
    def __init__(self, config: dict, images: np.ndarray, keypoints: np.ndarray, variant: str,
                 augment: bool = True) -> None:  # fmt: skip
        self.input_res = config["train"]["input_res"]
        self.output_res = config["train"]["output_res"]
        self.generateHeatmap = GenerateHeatmap(self.output_res, config["inference"]["num_parts"])
        self.images, self.keypoints, self.variant, self.augment = images, keypoints, variant, augment

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int):
        return self.loadImage(idx % len(self.images))

    def loadImage(self, idx: int):
        orig_keypoints = self.keypoints[idx].copy()  # (1, parts, 3), already in input pixels
        inp = self.images[idx].astype(np.float32) / 255
        if self.variant == "heatmaps_at_input_res":
            keypoints = orig_keypoints.copy()  # the bug: the input transform's keypoints
        else:
            keypoints = orig_keypoints.copy()
            keypoints[:, :, 0:2] *= self.output_res / self.input_res  # mat_mask: to the output resolution
        if self.augment and np.random.randint(2) == 0:
            inp = self.preprocess(inp)
            inp = inp[:, ::-1]
            if self.variant != "flip_parts_not_swapped":
                keypoints = keypoints[:, FLIPPED_PARTS]
            keypoints[:, :, 0] = self.output_res - keypoints[:, :, 0]
        heatmaps = self.generateHeatmap(keypoints)
        return np.ascontiguousarray(inp).astype(np.float32), heatmaps.astype(np.float32)

    def preprocess(self, data: np.ndarray) -> np.ndarray:
        """Brightness and contrast jitter (the hue/saturation part needs OpenCV's HSV)."""
        data = data + (np.random.random() * 2 - 1) * 0.3
        mean = data.mean(axis=2, keepdims=True)
        data = (data - mean) * (np.random.random() + 0.5) + mean
        return np.minimum(np.maximum(data, 0), 1).astype(np.float32)


def data_init(config: dict, datasets: dict, seed: int):
    batchsize = config["train"]["batchsize"]
    loaders = {key: torch.utils.data.DataLoader(ds, batch_size=batchsize, shuffle=True, num_workers=0,
                                                generator=torch.Generator().manual_seed(seed + n))
               for n, (key, ds) in enumerate(datasets.items())}  # fmt: skip

    def gen(phase: str):
        batchnum = config["train"][f"{phase}_iters"]
        loader = iter(loaders[phase])  # a fresh pass at every call, as published
        for _ in range(batchnum):
            try:
                imgs, heatmaps = next(loader)
            except StopIteration:  # to avoid no data provided by the dataloader
                loader = iter(loaders[phase])
                imgs, heatmaps = next(loader)
            yield {"imgs": imgs, "heatmaps": heatmaps}

    return gen


# --------------------------------------------------------------------------- train.py


def pck(poseNet: nn.Module, images: np.ndarray, keypoints: np.ndarray, config: dict) -> tuple[float, float]:
    """Measure only: last stack's argmax per part, back to input pixels, within PCK_PIXELS."""
    scale = config["train"]["input_res"] / config["train"]["output_res"]
    poseNet.eval()
    with torch.no_grad():
        preds = poseNet(torch.from_numpy(images.astype(np.float32) / 255))[:, -1]  # (N, parts, H, W)
    n, parts, h, w = preds.shape
    flat = preds.reshape(n, parts, -1).argmax(-1)
    px = ((flat % w).float() + 0.5) * scale
    py = ((flat // w).float() + 0.5) * scale
    true = torch.from_numpy(keypoints[:, 0, :, :2]).float()
    hit = (torch.hypot(px - true[..., 0], py - true[..., 1]) <= PCK_PIXELS).float()
    return hit.mean().item(), hit[:, LR_PARTS].mean().item()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in __config__.items()}
    train_cfg, inf_cfg = config["train"], config["inference"]

    train_images, train_kps = make_split(N_TRAIN, seed)
    valid_images, valid_kps = make_split(N_VALID, seed + 1000)
    datasets = {"train": Dataset(config, train_images, train_kps, variant),
                "valid": Dataset(config, valid_images, valid_kps, variant)}  # fmt: skip

    # make_network
    poseNet = PoseNet(**inf_cfg)
    forward_net = DataParallel(poseNet)  # on a CPU, DataParallel calls the module itself
    net = Trainer(forward_net, inf_cfg["keys"], lambda *a, **k: poseNet.calc_loss(*a, **k))
    optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, net.parameters()), train_cfg["learning_rate"])

    def loss_fn(preds: torch.Tensor, heatmaps: torch.Tensor) -> torch.Tensor:
        """The loop's loss on the network's predictions (for the probes)."""
        return torch.mean(poseNet.calc_loss(combined_hm_preds=[preds], heatmaps=heatmaps) * 1)

    # what the author hands to nndx (drawn in both runs: the datasets draw from np.random)
    first = [datasets["train"][i] for i in range(train_cfg["batchsize"])]
    first_batch = (torch.from_numpy(np.stack([f[0] for f in first])), torch.from_numpy(np.stack([f[1] for f in first])))
    splits = []
    for key in ("train", "valid"):
        items = [datasets[key][i] for i in range(len(datasets[key]))]
        splits += [torch.from_numpy(np.stack([it[0] for it in items])),
                   torch.from_numpy(np.stack([it[1] for it in items]))]
    nx.preflight(poseNet, first_batch, loss_fn, optimizer=optimizer, data=tuple(splits))
    mon = nx.monitor(poseNet, optimizer, every=5)

    valid_losses: list[float] = []

    def make_train(batch_id: int, phase: str, **inputs) -> None:
        nonlocal net
        net = net.train()
        if phase == "valid":  # keep the running statistics out of the validation batches
            for module in net.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.eval()
        result = net(inputs["imgs"], **{i: inputs[i] for i in inputs if i != "imgs"})
        num_loss = len(train_cfg["loss"])
        losses = {name: result[-num_loss + idx] * weight for idx, (name, weight) in enumerate(train_cfg["loss"])}
        loss = 0
        for name in losses:
            loss = loss + torch.mean(losses[name])
        if phase == "train":
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
        else:
            valid_losses.append(loss.item())
            mon.log(loss.item(), split="val")
        if batch_id == train_cfg["decay_iters"]:
            for param_group in optimizer.param_groups:
                param_group["lr"] = train_cfg["decay_lr"]

    data_func = data_init(config, datasets, seed)
    epoch = 0
    finished = False
    while not finished:
        for phase in ("train", "valid"):
            num_step = train_cfg[f"{phase}_iters"]
            generator = data_func(phase)
            batch_id = num_step * epoch
            if batch_id > config["max_iters"]:
                finished = True
                break
            for i in range(num_step):
                make_train(batch_id + i, phase, **next(generator))
        if not finished:
            epoch += 1

    nx.finish(mon, poseNet, first_batch, loss_fn, optimizer=optimizer, data=tuple(splits))
    val_pck, lr_pck = pck(poseNet, valid_images, valid_kps, config)
    last = valid_losses[-train_cfg["valid_iters"]:]
    return {"val_pck": val_pck, "lr_pck": lr_pck, "valid_loss": float(np.mean(last)), "epochs": float(epoch)}
