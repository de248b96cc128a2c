"""Port of xingyizhou/CenterNet, ``ctdet`` (Objects as Points): a ResNet with three deconvolution
layers to a stride-4 feature map and three heads (a per-class centre heatmap through a clamped
sigmoid, the box width/height and the centre's sub-pixel offset), trained with the CornerNet
focal loss on Gaussian-splatted heatmaps and L1 losses gathered at the object centres; Adam,
the lr dropped tenfold at the ``lr_step`` epochs.

Source: github.com/xingyizhou/CenterNet, ``src/lib/models/losses.py``, ``src/lib/trains/ctdet.py``,
``src/lib/trains/base_trainer.py``, ``src/lib/datasets/sample/ctdet.py``, ``src/lib/utils/image.py``,
``src/lib/models/networks/msra_resnet.py``, ``src/lib/models/utils.py``, ``src/lib/models/decode.py``,
``src/lib/opts.py`` and ``src/main.py`` at commit 4c50fd3a46bdf63dbf2082c5cbb3458d39579e6c (MIT,
Copyright (c) 2019 Xingyi Zhou; the focal loss from CornerNet, BSD-3-Clause). Written anew
from the facts of those files; no code copied.

Kept: ``PoseResNet`` (7x7 stride-2 ``conv1`` without bias, ``bn1``, ReLU, 3x3 stride-2 max-pool,
four stages of ``BasicBlock``s with 1x1 downsample convs, BatchNorm momentum 0.1; three
``ConvTranspose2d(4, stride 2, padding 1, no bias)`` + BatchNorm + ReLU; per head a 3x3 conv of
``head_conv`` channels with bias, ReLU and a 1x1 conv to the head's outputs; ``forward`` returning
``[{'hm', 'wh', 'reg'}]``); ``init_weights``' part that does not load ImageNet weights (the
deconvolutions N(0, 0.001), their BatchNorms 1/0, the heatmap head's last bias -2.19, the other
heads' last weights N(0, 0.001) and biases 0); ``losses.py``'s ``_neg_loss`` (positives where the
target is exactly 1, negatives weighted by (1 - gt)^4, the sum divided by the number of
positives) and ``RegL1Loss`` (``_transpose_and_gather_feat`` at ``ind``, masked by ``reg_mask``,
summed L1 divided by the mask's sum + 1e-4); ``utils._sigmoid`` (in-place sigmoid clamped to
[1e-4, 1 - 1e-4]); ``CtdetLoss`` (``hm_weight`` 1, ``wh_weight`` 0.1, ``off_weight`` 1, one stack)
and ``ModelWithLoss``; ``CTDetDataset.__getitem__`` (pixels / 255, the mean/std normalisation,
the horizontal flip with probability 0.5 that mirrors the boxes with ``width - x - 1``, the boxes
mapped to the output resolution and clipped, ``gaussian_radius`` with min overlap 0.7,
``draw_umich_gaussian`` at the integer centre, ``wh``, ``ind = y * output_w + x``, ``reg`` = the
centre's fractional part, ``reg_mask``, ``max_objs``); ``run_epoch``'s training step
(``model_with_loss.train()``, forward, ``loss.mean()``, ``zero_grad``, ``backward``, ``step``);
``main.py``'s ``Adam(model.parameters(), lr)``, the shuffled ``drop_last`` train loader and the
lr set to ``lr * 0.1 ** (i + 1)`` at the ``lr_step`` epochs; ``decode.ctdet_decode`` (3x3
max-pool NMS, top-K over all classes, the offsets added, boxes from wh) for the measure.
Shrunk: COCO/Pascal at 512x512 becomes synthetic 64x64 images (a noisy grey background with one
to three objects: a red square, a green disc or a blue square, 10 to 24 pixels across, their class
given by shape and colour), 512 for training and 128 held out, drawn anew with numpy per seed;
the ResNet-18 (ImageNet-pretrained, which would be downloaded) becomes one ``BasicBlock`` per stage
at widths 16-32-64-64 trained from scratch, the deconvolutions 64 wide instead of 256,
``head_conv`` 32 instead of 64; the random crop/scale affine and the colour augmentation are left
out (``not_rand_crop`` with ``scale`` = ``shift`` = 0, ``no_color_aug``: the flip is kept); batch 32
as the default; Adam lr 5e-4 instead of 1.25e-4 (a 20-epoch budget instead of 140) with
``lr_step`` 14,18 (90,120 of 140, scaled); K = 20 detections; no DataParallel, logger, checkpoints or
debugger.

Measure only (not in the program): on the held-out images (``model.eval()``, no grad), the
detections of ``ctdet_decode`` with score >= 0.3 matched greedily (by score) to the ground-truth
boxes of the same class at IoU >= 0.5; precision, recall and their F1.

nndx, as the author would add it: the network is ``model`` (``ModelWithLoss`` wraps it with the
loss), so a preflight ``nndx.probe(model, (batch['input'], batch), loss_fn)`` on the first 32
training images (not flipped) with ``CtdetLoss``'s total as ``loss_fn`` and the optimizer;
``nndx.Monitor(model, optimizer)`` around the epochs, each step's loss logged; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "centernet"
SOURCE = Source("xingyizhou/CenterNet", "src/lib/trains/ctdet.py", "4c50fd3a46bdf63dbf2082c5cbb3458d39579e6c", "MIT")

_F1 = Measure("test_f1", "held-out detection F1 (score >= 0.3, IoU >= 0.5) at least 0.1 below the healthy run's",
              lambda healthy, buggy: not buggy > healthy - 0.1)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 64x64 synthetic shapes, small ResNet from scratch)"),
        Variant(
            "flip_without_boxes",
            "the training image mirrored with probability 0.5 but the line that mirrors its boxes "
            "(bbox[[0, 2]] = width - bbox[[2, 0]] - 1) left out: on half the images the heatmap, size and offset "
            "targets sit at the mirror image of the objects",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/yhenon/keras-frcnn/issues/175", "https://github.com/ifzhang/FairMOT/issues/279",
             "https://github.com/xingyizhou/CenterNet/issues/198"),
            _F1,
        ),
        Variant(
            "hm_bias_not_initialised",
            "the heatmap head's last conv left at PyTorch's default bias instead of -2.19 (prior 0.1): every "
            "heatmap pixel starts near p = 0.5, so the thousands of background pixels swamp the focal loss, "
            "normalised by the few objects, at the start",
            (C.BAD_INIT,),
            ("https://github.com/xingyizhou/CenterNet/issues/841",
             "https://github.com/JIA-Lab-research/PanopticFCN/issues/6",
             "https://github.com/xingyizhou/CenterNet/issues/826"),
            _F1,
        ),
    )
}

IMG, DOWN_RATIO, NUM_CLASSES, MAX_OBJS = 64, 4, 3, 8
N_TRAIN, N_TEST, SIDE = 512, 128, (10, 25)
WIDTHS, DECONV, HEAD_CONV = (16, 32, 64, 64), 64, 32
LR, LR_STEP, NUM_EPOCHS, BATCH_SIZE, K = 5e-4, (14, 18), 20, 32, 20
HM_WEIGHT, WH_WEIGHT, OFF_WEIGHT = 1.0, 0.1, 1.0
MEAN = np.array([0.408, 0.447, 0.470], dtype=np.float32).reshape(1, 1, 3)
STD = np.array([0.289, 0.274, 0.278], dtype=np.float32).reshape(1, 1, 3)
COLOURS = np.array([[220, 40, 40], [40, 200, 60], [50, 70, 230]], dtype=np.float32)
BN_MOMENTUM = 0.1


# --------------------------------------------------------------------------- the images, drawn anew


def make_images(n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """n uint8 images (n, IMG, IMG, 3) and per image its annotations (m, 5): x1, y1, x2, y2, class."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:IMG, 0:IMG]
    images = np.zeros((n, IMG, IMG, 3), dtype=np.uint8)
    annots = []
    for i in range(n):
        img = np.clip(rng.normal(120, 25, size=(IMG, IMG, 1)) + rng.normal(0, 8, size=(IMG, IMG, 3)), 0, 255)
        rows = []
        for _ in range(rng.integers(1, 4)):
            cls = int(rng.integers(NUM_CLASSES))
            side = int(rng.integers(*SIDE))
            x1, y1 = int(rng.integers(0, IMG - side)), int(rng.integers(0, IMG - side))
            if cls == 1:  # a disc
                r = side / 2
                inside = (xx + 0.5 - (x1 + r)) ** 2 + (yy + 0.5 - (y1 + r)) ** 2 <= r * r
            else:  # a square
                inside = (xx >= x1) & (xx < x1 + side) & (yy >= y1) & (yy < y1 + side)
            img[inside] = COLOURS[cls] + rng.normal(0, 10, size=(int(inside.sum()), 3))
            rows.append([x1, y1, x1 + side, y1 + side, cls])
        images[i] = np.clip(img, 0, 255).astype(np.uint8)
        annots.append(np.array(rows, dtype=np.float32))
    return images, annots


# --------------------------------------------------------------------------- utils/image.py


def gaussian_radius(det_size: tuple[float, float], min_overlap: float = 0.7) -> float:
    height, width = det_size
    b1, c1 = height + width, width * height * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(b1**2 - 4 * c1)) / 2
    b2, c2 = 2 * (height + width), (1 - min_overlap) * width * height
    r2 = (b2 + math.sqrt(b2**2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * (height + width), (min_overlap - 1) * width * height
    r3 = (b3 + math.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


def gaussian2d(shape: tuple[int, int], sigma: float = 1) -> np.ndarray:
    m, n = [(ss - 1.0) / 2.0 for ss in shape]
    y, x = np.ogrid[-m : m + 1, -n : n + 1]
    h = np.exp(-(x * x + y * y) / (2 * sigma * sigma))
    h[h < np.finfo(h.dtype).eps * h.max()] = 0
    return h


def draw_umich_gaussian(heatmap: np.ndarray, center: np.ndarray, radius: int, k: float = 1) -> np.ndarray:
    diameter = 2 * radius + 1
    gaussian = gaussian2d((diameter, diameter), sigma=diameter / 6)
    x, y = int(center[0]), int(center[1])
    height, width = heatmap.shape[0:2]
    left, right = min(x, radius), min(width - x, radius + 1)
    top, bottom = min(y, radius), min(height - y, radius + 1)
    masked_heatmap = heatmap[y - top : y + bottom, x - left : x + right]
    masked_gaussian = gaussian[radius - top : radius + bottom, radius - left : radius + right]
    if min(masked_gaussian.shape) > 0 and min(masked_heatmap.shape) > 0:
        np.maximum(masked_heatmap, masked_gaussian * k, out=masked_heatmap)
    return heatmap


# --------------------------------------------------------------------------- datasets/sample/ctdet.py


class CTDetDataset(Dataset):
    def __init__(self, images: np.ndarray, annots: list[np.ndarray], split: str, flip: float = 0.5,
                 rng: np.random.Generator | None = None, flip_boxes: bool = True) -> None:  # fmt: skip
        self.images, self.annots, self.split = images, annots, split
        self.flip, self.rng, self.flip_boxes = flip, rng, flip_boxes
        self.num_classes, self.max_objs = NUM_CLASSES, MAX_OBJS

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        img = self.images[index]
        anns = self.annots[index]
        num_objs = min(len(anns), self.max_objs)
        height, width = img.shape[0], img.shape[1]
        input_h = input_w = IMG

        flipped = False
        if self.split == "train" and self.rng is not None and self.rng.random() < self.flip:
            flipped = True
            img = img[:, ::-1, :]

        inp = img.astype(np.float32) / 255.0
        inp = (inp - MEAN) / STD
        inp = inp.transpose(2, 0, 1).copy()

        output_h, output_w = input_h // DOWN_RATIO, input_w // DOWN_RATIO
        hm = np.zeros((self.num_classes, output_h, output_w), dtype=np.float32)
        wh = np.zeros((self.max_objs, 2), dtype=np.float32)
        reg = np.zeros((self.max_objs, 2), dtype=np.float32)
        ind = np.zeros((self.max_objs), dtype=np.int64)
        reg_mask = np.zeros((self.max_objs), dtype=np.uint8)

        for k in range(num_objs):
            bbox = anns[k, :4].copy()
            cls_id = int(anns[k, 4])
            if flipped and self.flip_boxes:
                bbox[[0, 2]] = width - bbox[[2, 0]] - 1
            bbox = bbox * (output_w / input_w)  # the affine transform to the output, without crop or scale
            bbox[[0, 2]] = np.clip(bbox[[0, 2]], 0, output_w - 1)
            bbox[[1, 3]] = np.clip(bbox[[1, 3]], 0, output_h - 1)
            h, w = bbox[3] - bbox[1], bbox[2] - bbox[0]
            if h > 0 and w > 0:
                radius = gaussian_radius((math.ceil(h), math.ceil(w)))
                radius = max(0, int(radius))
                ct = np.array([(bbox[0] + bbox[2]) / 2, (bbox[1] + bbox[3]) / 2], dtype=np.float32)
                ct_int = ct.astype(np.int32)
                draw_umich_gaussian(hm[cls_id], ct_int, radius)
                wh[k] = 1.0 * w, 1.0 * h
                ind[k] = ct_int[1] * output_w + ct_int[0]
                reg[k] = ct - ct_int
                reg_mask[k] = 1

        ret = {"input": inp, "hm": hm, "reg_mask": reg_mask, "ind": ind, "wh": wh, "reg": reg}
        return {k: torch.from_numpy(v) for k, v in ret.items()}


# --------------------------------------------------------------------------- models/networks/msra_resnet.py


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes, momentum=BN_MOMENTUM)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes, momentum=BN_MOMENTUM)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        return self.relu(out)


class PoseResNet(nn.Module):
    def __init__(self, block: type[BasicBlock], layers: list[int], heads: dict[str, int], head_conv: int) -> None:
        self.inplanes = WIDTHS[0]
        self.deconv_with_bias = False
        self.heads = heads
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTHS[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(WIDTHS[0], momentum=BN_MOMENTUM)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, WIDTHS[0], layers[0])
        self.layer2 = self._make_layer(block, WIDTHS[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, WIDTHS[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, WIDTHS[3], layers[3], stride=2)
        self.deconv_layers = self._make_deconv_layer(3, [DECONV] * 3, [4, 4, 4])
        for head in sorted(self.heads):
            num_output = self.heads[head]
            fc = nn.Sequential(
                nn.Conv2d(DECONV, head_conv, kernel_size=3, padding=1, bias=True),
                nn.ReLU(inplace=True),
                nn.Conv2d(head_conv, num_output, kernel_size=1, stride=1, padding=0),
            )
            self.__setattr__(head, fc)

    def _make_layer(self, block: type[BasicBlock], planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion, momentum=BN_MOMENTUM),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def _make_deconv_layer(self, num_layers: int, num_filters: list[int], num_kernels: list[int]) -> nn.Sequential:
        layers: list[nn.Module] = []
        for i in range(num_layers):
            kernel, padding, output_padding = num_kernels[i], 1, 0
            planes = num_filters[i]
            layers.append(nn.ConvTranspose2d(self.inplanes, planes, kernel_size=kernel, stride=2, padding=padding,
                                             output_padding=output_padding, bias=self.deconv_with_bias))  # fmt: skip
            layers.append(nn.BatchNorm2d(planes, momentum=BN_MOMENTUM))
            layers.append(nn.ReLU(inplace=True))
            self.inplanes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.deconv_layers(x)
        return [{head: self.__getattr__(head)(x) for head in self.heads}]

    def init_weights(self, hm_bias: bool = True) -> None:
        """``init_weights``' part that needs no download (the ImageNet weights are not loaded)."""
        for _, m in self.deconv_layers.named_modules():
            if isinstance(m, nn.ConvTranspose2d):
                nn.init.normal_(m.weight, std=0.001)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        for head in self.heads:
            final_layer = self.__getattr__(head)
            for m in final_layer.modules():
                if isinstance(m, nn.Conv2d) and m.weight.shape[0] == self.heads[head]:
                    if "hm" in head:
                        if hm_bias:  # the bug leaves this line out
                            nn.init.constant_(m.bias, -2.19)
                    else:
                        nn.init.normal_(m.weight, std=0.001)
                        nn.init.constant_(m.bias, 0)


# --------------------------------------------------------------------------- models/utils.py, losses.py


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x.sigmoid_(), min=1e-4, max=1 - 1e-4)


def _gather_feat(feat: torch.Tensor, ind: torch.Tensor) -> torch.Tensor:
    dim = feat.size(2)
    ind = ind.unsqueeze(2).expand(ind.size(0), ind.size(1), dim)
    return feat.gather(1, ind)


def _transpose_and_gather_feat(feat: torch.Tensor, ind: torch.Tensor) -> torch.Tensor:
    feat = feat.permute(0, 2, 3, 1).contiguous()
    feat = feat.view(feat.size(0), -1, feat.size(3))
    return _gather_feat(feat, ind)


def _neg_loss(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    pos_inds = gt.eq(1).float()
    neg_inds = gt.lt(1).float()
    neg_weights = torch.pow(1 - gt, 4)
    loss = 0
    pos_loss = torch.log(pred) * torch.pow(1 - pred, 2) * pos_inds
    neg_loss = torch.log(1 - pred) * torch.pow(pred, 2) * neg_weights * neg_inds
    num_pos = pos_inds.float().sum()
    pos_loss = pos_loss.sum()
    neg_loss = neg_loss.sum()
    if num_pos == 0:
        loss = loss - neg_loss
    else:
        loss = loss - (pos_loss + neg_loss) / num_pos
    return loss


class FocalLoss(nn.Module):
    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _neg_loss(out, target)


class RegL1Loss(nn.Module):
    def forward(self, output: torch.Tensor, mask: torch.Tensor, ind: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pred = _transpose_and_gather_feat(output, ind)
        mask = mask.unsqueeze(2).expand_as(pred).float()
        loss = F.l1_loss(pred * mask, target * mask, reduction="sum")
        return loss / (mask.sum() + 1e-4)


class CtdetLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.crit = FocalLoss()
        self.crit_reg = RegL1Loss()
        self.crit_wh = self.crit_reg

    def forward(self, outputs: list[dict[str, torch.Tensor]], batch: dict[str, torch.Tensor]):
        num_stacks = 1
        hm_loss, wh_loss, off_loss = 0, 0, 0
        for s in range(num_stacks):
            output = outputs[s]
            output["hm"] = _sigmoid(output["hm"])
            hm_loss += self.crit(output["hm"], batch["hm"]) / num_stacks
            wh_loss += self.crit_reg(output["wh"], batch["reg_mask"], batch["ind"], batch["wh"]) / num_stacks
            off_loss += self.crit_reg(output["reg"], batch["reg_mask"], batch["ind"], batch["reg"]) / num_stacks
        loss = HM_WEIGHT * hm_loss + WH_WEIGHT * wh_loss + OFF_WEIGHT * off_loss
        loss_stats = {"loss": loss, "hm_loss": hm_loss, "wh_loss": wh_loss, "off_loss": off_loss}
        return loss, loss_stats


class ModelWithLoss(nn.Module):
    def __init__(self, model: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, batch: dict[str, torch.Tensor]):
        outputs = self.model(batch["input"])
        loss, loss_stats = self.loss(outputs, batch)
        return outputs[-1], loss, loss_stats


# --------------------------------------------------------------------------- decode.py and the measure


def _nms(heat: torch.Tensor, kernel: int = 3) -> torch.Tensor:
    hmax = F.max_pool2d(heat, (kernel, kernel), stride=1, padding=(kernel - 1) // 2)
    return heat * (hmax == heat).float()


def ctdet_decode(heat: torch.Tensor, wh: torch.Tensor, reg: torch.Tensor, k: int = K) -> torch.Tensor:
    """(batch, K, 6): x1, y1, x2, y2 (output pixels), score, class; top K over all classes."""
    batch, cat, height, width = heat.size()
    heat = _nms(heat)
    scores, inds = torch.topk(heat.view(batch, -1), k)
    clses = torch.div(inds, height * width, rounding_mode="floor")
    inds = inds % (height * width)
    ys = torch.div(inds, width, rounding_mode="floor").float()
    xs = (inds % width).float()
    reg = _transpose_and_gather_feat(reg, inds)
    xs, ys = xs + reg[..., 0], ys + reg[..., 1]
    wh = _transpose_and_gather_feat(wh, inds)
    boxes = torch.stack([xs - wh[..., 0] / 2, ys - wh[..., 1] / 2, xs + wh[..., 0] / 2, ys + wh[..., 1] / 2], dim=2)
    return torch.cat([boxes, scores.unsqueeze(2), clses.float().unsqueeze(2)], dim=2)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def evaluate(model: nn.Module, images: np.ndarray, annots: list[np.ndarray]) -> dict[str, float]:
    dataset = CTDetDataset(images, annots, "val")
    inputs = torch.stack([dataset[i]["input"] for i in range(len(dataset))])
    model.eval()
    with torch.no_grad():
        output = model(inputs)[-1]
        dets = ctdet_decode(output["hm"].sigmoid_(), output["wh"], output["reg"]).numpy()
    tp = n_det = n_gt = 0
    for det, ann in zip(dets, annots):
        det = det[det[:, 4] >= 0.3]
        det = det[np.argsort(-det[:, 4])]
        n_det += len(det)
        n_gt += len(ann)
        used = np.zeros(len(ann), dtype=bool)
        for d in det:
            box = d[:4] * DOWN_RATIO
            best, best_j = 0.5, -1
            for j, a in enumerate(ann):
                if not used[j] and int(a[4]) == int(d[5]):
                    iou = _iou(box, a[:4])
                    if iou >= best:
                        best, best_j = iou, j
            if best_j >= 0:
                used[best_j] = True
                tp += 1
    precision = tp / n_det if n_det else 0.0
    recall = tp / n_gt if n_gt else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"test_precision": precision, "test_recall": recall, "test_f1": f1}


# --------------------------------------------------------------------------- main.py + base_trainer.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(317 + seed)  # opts' --seed 317
    train_images, train_annots = make_images(N_TRAIN, seed)
    test_images, test_annots = make_images(N_TEST, seed + 1000)

    heads = {"hm": NUM_CLASSES, "wh": 2, "reg": 2}
    model = PoseResNet(BasicBlock, [1, 1, 1, 1], heads, head_conv=HEAD_CONV)
    model.init_weights(hm_bias=variant != "hm_bias_not_initialised")
    optimizer = torch.optim.Adam(model.parameters(), LR)
    loss = CtdetLoss()
    model_with_loss = ModelWithLoss(model, loss)

    dataset_train = CTDetDataset(train_images, train_annots, "train", rng=np.random.default_rng(seed),
                                 flip_boxes=variant != "flip_without_boxes")  # fmt: skip
    train_loader = DataLoader(dataset_train, batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip

    probe_source = CTDetDataset(train_images, train_annots, "val")
    first = {k: torch.stack([probe_source[i][k] for i in range(BATCH_SIZE)]) for k in probe_source[0]}
    probe_batch = (first["input"], first)

    def ctdet_loss(outputs, batch):
        return loss(outputs, batch)[0]

    nx.preflight(model, probe_batch, ctdet_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    epoch_loss = float("nan")
    for epoch in range(1, NUM_EPOCHS + 1):
        model_with_loss.train()
        losses = []
        for batch in train_loader:
            _output, loss_value, _loss_stats = model_with_loss(batch)
            loss_value = loss_value.mean()
            optimizer.zero_grad()
            loss_value.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss_value))  # noqa: B023
            losses.append(loss_value.item())
        epoch_loss = float(np.mean(losses))
        if epoch in LR_STEP:
            lr = LR * (0.1 ** (LR_STEP.index(epoch) + 1))
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr

    nx.finish(mon, model, probe_batch, ctdet_loss, optimizer=optimizer)
    metrics = evaluate(model, test_images, test_annots)
    metrics["final_epoch_loss"] = epoch_loss
    return metrics
