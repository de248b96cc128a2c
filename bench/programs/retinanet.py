"""Port of yhenon/pytorch-retinanet: RetinaNet, a ResNet with a feature pyramid (P3-P7), a
classification subnet ending in a sigmoid (its last bias set to the prior -log((1 - pi) / pi)
with pi = 0.01) and a box-regression subnet, nine anchors per position, the focal loss and
a smooth-L1 box loss computed by the model itself in training mode; Adam, gradient clipping
at 0.1, ReduceLROnPlateau on the epoch's mean loss, BatchNorm frozen (eval mode) throughout.

Source: github.com/yhenon/pytorch-retinanet, ``train.py``, ``retinanet/model.py`` and
``retinanet/losses.py`` (with ``retinanet/anchors.py``, ``retinanet/utils.py``,
``retinanet/dataloader.py`` and ``retinanet/csv_eval.py`` for the pieces they use) at commit
0348a9d57b279e3b5b235461b472d37da5feec3d (Apache-2.0, Copyright yhenon and contributors).
Written anew from the facts of those files; no code copied. torchvision is not installed:
its ``nms`` is written out here.

Kept: ``ResNet`` (7x7 stride-2 ``conv1``, ``bn1``, ReLU, 3x3 stride-2 max-pool, four stages of
``BasicBlock``s, the last three giving C3, C4, C5; every conv initialised N(0, sqrt(2 / (k*k*out))),
BatchNorm scales 1 and shifts 0); ``PyramidFeatures`` (P5 = 1x1 on C5, upsampled and added to
the 1x1 of C4 for P4, again for P3, each through a 3x3; P6 a stride-2 3x3 on C5, P7 a ReLU
and a stride-2 3x3 on P6); ``RegressionModel`` and ``ClassificationModel`` (four 3x3 conv +
ReLU, an output conv of 9 * 4 / 9 * classes channels, the sigmoid on the classes, the
permute-and-view to (N, anchors, ...)); the classification output's weights 0 and bias
-log((1 - 0.01) / 0.01), the regression output's weights and bias 0; ``freeze_bn`` (every
``BatchNorm2d`` to eval mode, at construction and after each ``train()``); ``Anchors`` (levels
3-7, strides 2^level, sizes 2^(level + 2), ratios 0.5/1/2, scales 2^0, 2^(1/3), 2^(2/3),
``generate_anchors`` and ``shift``); ``FocalLoss`` as written (per image: padding rows with class
-1 dropped, the probabilities clamped to [1e-4, 1 - 1e-4], IoU of every anchor with every box,
negatives below 0.4, positives from 0.5, ignored in between, alpha 0.25 and gamma 2, the loss
summed and divided by the number of positive anchors; for the positives the box deltas
against the anchor divided by (0.1, 0.1, 0.2, 0.2) and the smooth L1 with beta 1/9; the batch
mean of each); the training-mode forward returning the two losses, the eval-mode forward
(``BBoxTransform``, ``ClipBoxes``, per class a score threshold of 0.05 and NMS at 0.5);
``dataloader.py``'s ``load_image`` (the file's 0-255 pixels divided by 255), ``Normalizer``
(ImageNet mean/std), ``Augmenter`` (horizontal flip with probability 0.5, boxes flipped),
``collater`` (annotations padded with -1 rows); ``train.py``: ``Adam(lr)``,
``ReduceLROnPlateau(patience=3)`` stepped once per epoch on the mean epoch loss, per epoch
``train()`` then ``freeze_bn()``, per batch ``zero_grad``, the two losses' means summed, the
``loss == 0`` skip, ``backward``, ``clip_grad_norm_(0.1)``, ``step``, and the ``try/except``
that prints an error and goes on; ``csv_eval.evaluate`` (one image at a time in eval mode,
at most 100 detections, per class the detections matched greedily at IoU 0.5, VOC all-point
AP).
Shrunk: synthetic 128x128 images (a noisy background with one to three filled rectangles
of 24-64 pixels, the class given by the colour; 384 for training, 96 held out) instead of a
CSV or COCO data set resized to 608; no ``Resizer`` (the images are already a multiple of
32); the ResNet-18 (pretrained on ImageNet) shrunk to widths 8-16-32-64 with one block per
stage, whose "pretraining" is 80 steps of telling which colours an image holds, on 600
images drawn apart from the detection data, at half size (made at run time, cached per
seed; nothing downloaded); the FPN and subnets 32 channels wide instead of 256; batch 8
instead of 2; Adam lr 1e-4 instead of 1e-5 for 6 epochs instead of 100 (so
``ReduceLROnPlateau``'s patience of 3 epochs seldom comes into play); no ``DataParallel``
(one CPU process: ``retinanet.module`` is the model itself), no ``AspectRatioBasedSampler`` (every
image has the same size: a shuffled batch sampler), no checkpoints.
Measure only (not in the program): ``csv_eval.evaluate``'s mAP@0.5 on the held-out images
after the last epoch (the program evaluates its validation CSV each epoch; here once).

nndx, as the author would add it (as the other ports): the model computes its own loss,
so the batch is ``(([images, annotations],), None)`` and the loss function sums the two
losses' means as the loop does; a preflight ``nndx.probe`` on a batch of the first 8
training images (not flipped) with the optimizer; ``nndx.Monitor(retinanet, optimizer)``
around the epochs, each step's loss logged; then ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import collections
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "retinanet"
SOURCE = Source("yhenon/pytorch-retinanet", "train.py", "0348a9d57b279e3b5b235461b472d37da5feec3d", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 128x128 boxes, small ResNet, FPN 32 wide, Adam 1e-4)"),
        Variant(
            "no_prior_bias_init",
            "the two lines that set the classification subnet's output conv to weight 0 and bias "
            "-log((1 - pi) / pi) left out (it keeps the init loop's N(0, sqrt(2/n)) weights and PyTorch's default "
            "bias): every anchor starts near p = 0.5 instead of 0.01, so the thousands of easy negatives dominate "
            "the focal loss at the start",
            (C.BAD_INIT,),
            ("https://github.com/yhenon/pytorch-retinanet/issues/41",
             "https://github.com/kuangliu/pytorch-retinanet/issues/10",
             "https://github.com/JIA-Lab-research/PanopticFCN/issues/6"),
            Measure("test_map", "held-out mAP@0.5 at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "adam_at_sgd_lr",
            "Adam given the RetinaNet paper's SGD learning rate, 0.01 (100x the port's 1e-4; the repository's own "
            "default is 1e-5): the clipped gradient (norm 0.1) does not bound Adam's steps, which are about lr "
            "per weight whatever the gradient's size",
            (C.LR_TOO_HIGH,),
            ("https://github.com/yhenon/pytorch-retinanet/issues/140",
             "https://github.com/yhenon/pytorch-retinanet/issues/41",
             "https://github.com/xytpai/retinanet/issues/3"),
            Measure("test_map", "held-out mAP@0.5 at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

IMG, NUM_CLASSES = 128, 3
N_TRAIN, N_TEST, N_PRETRAIN, PRETRAIN_STEPS = 384, 96, 600, 80
BOX_SIDE = (24, 65)
COLOURS = np.array([[0.9, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.3, 0.95]])
MEAN, STD = np.array([[[0.485, 0.456, 0.406]]]), np.array([[[0.229, 0.224, 0.225]]])
WIDTHS, LAYERS, FEATURE_SIZE = (8, 16, 32, 64), (1, 1, 1, 1), 32
LR, BATCH_SIZE, EPOCHS = 1e-4, 8, 6


# --------------------------------------------------------------------------- retinanet/utils.py


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
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


class BBoxTransform(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = torch.zeros(4)
        self.std = torch.tensor([0.1, 0.1, 0.2, 0.2])

    def forward(self, boxes: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        widths = boxes[:, :, 2] - boxes[:, :, 0]
        heights = boxes[:, :, 3] - boxes[:, :, 1]
        ctr_x = boxes[:, :, 0] + 0.5 * widths
        ctr_y = boxes[:, :, 1] + 0.5 * heights
        dx = deltas[:, :, 0] * self.std[0] + self.mean[0]
        dy = deltas[:, :, 1] * self.std[1] + self.mean[1]
        dw = deltas[:, :, 2] * self.std[2] + self.mean[2]
        dh = deltas[:, :, 3] * self.std[3] + self.mean[3]
        pred_ctr_x, pred_ctr_y = ctr_x + dx * widths, ctr_y + dy * heights
        pred_w, pred_h = torch.exp(dw) * widths, torch.exp(dh) * heights
        return torch.stack([pred_ctr_x - 0.5 * pred_w, pred_ctr_y - 0.5 * pred_h,
                            pred_ctr_x + 0.5 * pred_w, pred_ctr_y + 0.5 * pred_h], dim=2)  # fmt: skip


class ClipBoxes(nn.Module):
    def forward(self, boxes: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        _batch_size, _num_channels, height, width = img.shape
        boxes[:, :, 0] = torch.clamp(boxes[:, :, 0], min=0)
        boxes[:, :, 1] = torch.clamp(boxes[:, :, 1], min=0)
        boxes[:, :, 2] = torch.clamp(boxes[:, :, 2], max=width)
        boxes[:, :, 3] = torch.clamp(boxes[:, :, 3], max=height)
        return boxes


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision.ops.nms: indices kept, by decreasing score."""
    order = scores.argsort(descending=True)
    keep = []
    while order.numel() > 0:
        i = int(order[0])
        keep.append(i)
        if order.numel() == 1:
            break
        rest = order[1:]
        lt = torch.max(boxes[i, :2], boxes[rest, :2])
        rb = torch.min(boxes[i, 2:], boxes[rest, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        area_i = (boxes[i, 2:] - boxes[i, :2]).prod()
        area_r = (boxes[rest, 2:] - boxes[rest, :2]).prod(1)
        iou = inter / (area_i + area_r - inter)
        order = rest[iou <= iou_threshold]
    return torch.tensor(keep, dtype=torch.long)


# --------------------------------------------------------------------------- retinanet/anchors.py


def generate_anchors(base_size: int = 16, ratios=None, scales=None) -> np.ndarray:
    ratios = np.array([0.5, 1, 2]) if ratios is None else ratios
    scales = np.array([2**0, 2 ** (1.0 / 3.0), 2 ** (2.0 / 3.0)]) if scales is None else scales
    num_anchors = len(ratios) * len(scales)
    anchors = np.zeros((num_anchors, 4))
    anchors[:, 2:] = base_size * np.tile(scales, (2, len(ratios))).T
    areas = anchors[:, 2] * anchors[:, 3]
    anchors[:, 2] = np.sqrt(areas / np.repeat(ratios, len(scales)))
    anchors[:, 3] = anchors[:, 2] * np.repeat(ratios, len(scales))
    anchors[:, 0::2] -= np.tile(anchors[:, 2] * 0.5, (2, 1)).T
    anchors[:, 1::2] -= np.tile(anchors[:, 3] * 0.5, (2, 1)).T
    return anchors


def shift(shape, stride: int, anchors: np.ndarray) -> np.ndarray:
    shift_x = (np.arange(0, shape[1]) + 0.5) * stride
    shift_y = (np.arange(0, shape[0]) + 0.5) * stride
    shift_x, shift_y = np.meshgrid(shift_x, shift_y)
    shifts = np.vstack((shift_x.ravel(), shift_y.ravel(), shift_x.ravel(), shift_y.ravel())).transpose()
    a, k = anchors.shape[0], shifts.shape[0]
    all_anchors = anchors.reshape((1, a, 4)) + shifts.reshape((1, k, 4)).transpose((1, 0, 2))
    return all_anchors.reshape((k * a, 4))


class Anchors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pyramid_levels = [3, 4, 5, 6, 7]
        self.strides = [2**x for x in self.pyramid_levels]
        self.sizes = [2 ** (x + 2) for x in self.pyramid_levels]
        self.ratios = np.array([0.5, 1, 2])
        self.scales = np.array([2**0, 2 ** (1.0 / 3.0), 2 ** (2.0 / 3.0)])

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        image_shape = np.array(image.shape[2:])
        image_shapes = [(image_shape + 2**x - 1) // (2**x) for x in self.pyramid_levels]
        all_anchors = np.zeros((0, 4)).astype(np.float32)
        for idx, _p in enumerate(self.pyramid_levels):
            anchors = generate_anchors(base_size=self.sizes[idx], ratios=self.ratios, scales=self.scales)
            all_anchors = np.append(all_anchors, shift(image_shapes[idx], self.strides[idx], anchors), axis=0)
        return torch.from_numpy(np.expand_dims(all_anchors, axis=0).astype(np.float32))


# --------------------------------------------------------------------------- retinanet/losses.py


def calc_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iw = torch.min(torch.unsqueeze(a[:, 2], dim=1), b[:, 2]) - torch.max(torch.unsqueeze(a[:, 0], 1), b[:, 0])
    ih = torch.min(torch.unsqueeze(a[:, 3], dim=1), b[:, 3]) - torch.max(torch.unsqueeze(a[:, 1], 1), b[:, 1])
    iw, ih = torch.clamp(iw, min=0), torch.clamp(ih, min=0)
    ua = torch.unsqueeze((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]), dim=1) + area - iw * ih
    ua = torch.clamp(ua, min=1e-8)
    return iw * ih / ua


class FocalLoss(nn.Module):
    def forward(self, classifications, regressions, anchors, annotations):
        alpha, gamma = 0.25, 2.0
        batch_size = classifications.shape[0]
        classification_losses, regression_losses = [], []
        anchor = anchors[0, :, :]
        anchor_widths = anchor[:, 2] - anchor[:, 0]
        anchor_heights = anchor[:, 3] - anchor[:, 1]
        anchor_ctr_x = anchor[:, 0] + 0.5 * anchor_widths
        anchor_ctr_y = anchor[:, 1] + 0.5 * anchor_heights

        for j in range(batch_size):
            classification = classifications[j, :, :]
            regression = regressions[j, :, :]
            bbox_annotation = annotations[j, :, :]
            bbox_annotation = bbox_annotation[bbox_annotation[:, 4] != -1]
            classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)

            if bbox_annotation.shape[0] == 0:  # an image without boxes: every anchor a negative
                alpha_factor = 1.0 - torch.ones(classification.shape) * alpha
                focal_weight = alpha_factor * torch.pow(classification, gamma)
                bce = -(torch.log(1.0 - classification))
                classification_losses.append((focal_weight * bce).sum())
                regression_losses.append(torch.tensor(0).float())
                continue

            iou = calc_iou(anchors[0, :, :], bbox_annotation[:, :4])
            iou_max, iou_argmax = torch.max(iou, dim=1)

            targets = torch.ones(classification.shape) * -1
            targets[torch.lt(iou_max, 0.4), :] = 0
            positive_indices = torch.ge(iou_max, 0.5)
            num_positive_anchors = positive_indices.sum()
            assigned_annotations = bbox_annotation[iou_argmax, :]
            targets[positive_indices, :] = 0
            targets[positive_indices, assigned_annotations[positive_indices, 4].long()] = 1

            alpha_factor = torch.ones(targets.shape) * alpha
            alpha_factor = torch.where(torch.eq(targets, 1.0), alpha_factor, 1.0 - alpha_factor)
            focal_weight = torch.where(torch.eq(targets, 1.0), 1.0 - classification, classification)
            focal_weight = alpha_factor * torch.pow(focal_weight, gamma)
            bce = -(targets * torch.log(classification) + (1.0 - targets) * torch.log(1.0 - classification))
            cls_loss = focal_weight * bce
            cls_loss = torch.where(torch.ne(targets, -1.0), cls_loss, torch.zeros(cls_loss.shape))
            classification_losses.append(cls_loss.sum() / torch.clamp(num_positive_anchors.float(), min=1.0))

            if positive_indices.sum() > 0:
                assigned_annotations = assigned_annotations[positive_indices, :]
                anchor_widths_pi = anchor_widths[positive_indices]
                anchor_heights_pi = anchor_heights[positive_indices]
                anchor_ctr_x_pi = anchor_ctr_x[positive_indices]
                anchor_ctr_y_pi = anchor_ctr_y[positive_indices]
                gt_widths = assigned_annotations[:, 2] - assigned_annotations[:, 0]
                gt_heights = assigned_annotations[:, 3] - assigned_annotations[:, 1]
                gt_ctr_x = assigned_annotations[:, 0] + 0.5 * gt_widths
                gt_ctr_y = assigned_annotations[:, 1] + 0.5 * gt_heights
                gt_widths = torch.clamp(gt_widths, min=1)
                gt_heights = torch.clamp(gt_heights, min=1)
                targets_dx = (gt_ctr_x - anchor_ctr_x_pi) / anchor_widths_pi
                targets_dy = (gt_ctr_y - anchor_ctr_y_pi) / anchor_heights_pi
                targets_dw = torch.log(gt_widths / anchor_widths_pi)
                targets_dh = torch.log(gt_heights / anchor_heights_pi)
                box_targets = torch.stack((targets_dx, targets_dy, targets_dw, targets_dh)).t()
                box_targets = box_targets / torch.Tensor([[0.1, 0.1, 0.2, 0.2]])
                regression_diff = torch.abs(box_targets - regression[positive_indices, :])
                regression_loss = torch.where(torch.le(regression_diff, 1.0 / 9.0),
                                              0.5 * 9.0 * torch.pow(regression_diff, 2),
                                              regression_diff - 0.5 / 9.0)  # fmt: skip
                regression_losses.append(regression_loss.mean())
            else:
                regression_losses.append(torch.tensor(0).float())

        return (torch.stack(classification_losses).mean(dim=0, keepdim=True),
                torch.stack(regression_losses).mean(dim=0, keepdim=True))  # fmt: skip


# --------------------------------------------------------------------------- retinanet/model.py


class PyramidFeatures(nn.Module):
    def __init__(self, c3_size: int, c4_size: int, c5_size: int, feature_size: int = 256) -> None:
        super().__init__()
        self.P5_1 = nn.Conv2d(c5_size, feature_size, kernel_size=1, stride=1, padding=0)
        self.P5_upsampled = nn.Upsample(scale_factor=2, mode="nearest")
        self.P5_2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, stride=1, padding=1)
        self.P4_1 = nn.Conv2d(c4_size, feature_size, kernel_size=1, stride=1, padding=0)
        self.P4_upsampled = nn.Upsample(scale_factor=2, mode="nearest")
        self.P4_2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, stride=1, padding=1)
        self.P3_1 = nn.Conv2d(c3_size, feature_size, kernel_size=1, stride=1, padding=0)
        self.P3_2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, stride=1, padding=1)
        self.P6 = nn.Conv2d(c5_size, feature_size, kernel_size=3, stride=2, padding=1)
        self.P7_1 = nn.ReLU()
        self.P7_2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, stride=2, padding=1)

    def forward(self, inputs):
        c3, c4, c5 = inputs
        p5_x = self.P5_1(c5)
        p5_upsampled_x = self.P5_upsampled(p5_x)
        p5_x = self.P5_2(p5_x)
        p4_x = self.P4_1(c4)
        p4_x = p5_upsampled_x + p4_x
        p4_upsampled_x = self.P4_upsampled(p4_x)
        p4_x = self.P4_2(p4_x)
        p3_x = self.P3_1(c3)
        p3_x = p3_x + p4_upsampled_x
        p3_x = self.P3_2(p3_x)
        p6_x = self.P6(c5)
        p7_x = self.P7_2(self.P7_1(p6_x))
        return [p3_x, p4_x, p5_x, p6_x, p7_x]


class RegressionModel(nn.Module):
    def __init__(self, num_features_in: int, num_anchors: int = 9, feature_size: int = 256) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(num_features_in, feature_size, kernel_size=3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act2 = nn.ReLU()
        self.conv3 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act3 = nn.ReLU()
        self.conv4 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act4 = nn.ReLU()
        self.output = nn.Conv2d(feature_size, num_anchors * 4, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.conv1(x))
        out = self.act2(self.conv2(out))
        out = self.act3(self.conv3(out))
        out = self.act4(self.conv4(out))
        out = self.output(out)
        out = out.permute(0, 2, 3, 1)
        return out.contiguous().view(out.shape[0], -1, 4)


class ClassificationModel(nn.Module):
    def __init__(self, num_features_in: int, num_anchors: int = 9, num_classes: int = 80, prior: float = 0.01,
                 feature_size: int = 256) -> None:  # fmt: skip
        super().__init__()
        self.num_classes, self.num_anchors = num_classes, num_anchors
        self.conv1 = nn.Conv2d(num_features_in, feature_size, kernel_size=3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act2 = nn.ReLU()
        self.conv3 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act3 = nn.ReLU()
        self.conv4 = nn.Conv2d(feature_size, feature_size, kernel_size=3, padding=1)
        self.act4 = nn.ReLU()
        self.output = nn.Conv2d(feature_size, num_anchors * num_classes, kernel_size=3, padding=1)
        self.output_act = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.conv1(x))
        out = self.act2(self.conv2(out))
        out = self.act3(self.conv3(out))
        out = self.act4(self.conv4(out))
        out = self.output_act(self.output(out))
        out1 = out.permute(0, 2, 3, 1)
        batch_size, width, height, _channels = out1.shape
        out2 = out1.view(batch_size, width, height, self.num_anchors, self.num_classes)
        return out2.contiguous().view(x.shape[0], -1, self.num_classes)


class ResNet(nn.Module):
    def __init__(self, num_classes: int, block, layers, widths=WIDTHS, prior_init: bool = True) -> None:
        self.inplanes = widths[0]
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
        fpn_sizes = [self.layer2[layers[1] - 1].conv2.out_channels, self.layer3[layers[2] - 1].conv2.out_channels,
                     self.layer4[layers[3] - 1].conv2.out_channels]  # fmt: skip
        self.fpn = PyramidFeatures(fpn_sizes[0], fpn_sizes[1], fpn_sizes[2], feature_size=FEATURE_SIZE)
        self.regressionModel = RegressionModel(FEATURE_SIZE, feature_size=FEATURE_SIZE)
        self.classificationModel = ClassificationModel(FEATURE_SIZE, num_classes=num_classes,
                                                       feature_size=FEATURE_SIZE)  # fmt: skip
        self.anchors = Anchors()
        self.regressBoxes = BBoxTransform()
        self.clipBoxes = ClipBoxes()
        self.focalLoss = FocalLoss()

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
        prior = 0.01
        if prior_init:  # the bug: these two lines left out, the output conv keeps the loop's N(0, sqrt(2/n))
            self.classificationModel.output.weight.data.fill_(0)
            self.classificationModel.output.bias.data.fill_(-math.log((1.0 - prior) / prior))
        self.regressionModel.output.weight.data.fill_(0)
        self.regressionModel.output.bias.data.fill_(0)
        self.freeze_bn()

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1,
                                                 stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))  # fmt: skip
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def freeze_bn(self) -> None:
        for layer in self.modules():
            if isinstance(layer, nn.BatchNorm2d):
                layer.eval()

    def forward(self, inputs):
        if self.training:
            img_batch, annotations = inputs
        else:
            img_batch = inputs
        x = self.maxpool(self.relu(self.bn1(self.conv1(img_batch))))
        x1 = self.layer1(x)
        x2 = self.layer2(x1)
        x3 = self.layer3(x2)
        x4 = self.layer4(x3)
        features = self.fpn([x2, x3, x4])
        regression = torch.cat([self.regressionModel(feature) for feature in features], dim=1)
        classification = torch.cat([self.classificationModel(feature) for feature in features], dim=1)
        anchors = self.anchors(img_batch)
        if self.training:
            return self.focalLoss(classification, regression, anchors, annotations)
        transformed_anchors = self.regressBoxes(anchors, regression)
        transformed_anchors = self.clipBoxes(transformed_anchors, img_batch)
        final_scores = torch.Tensor([])
        final_indexes = torch.Tensor([]).long()
        final_coordinates = torch.Tensor([])
        for i in range(classification.shape[2]):
            scores = torch.squeeze(classification[:, :, i])
            scores_over_thresh = scores > 0.05
            if scores_over_thresh.sum() == 0:
                continue
            scores = scores[scores_over_thresh]
            anchor_boxes = torch.squeeze(transformed_anchors)[scores_over_thresh]
            anchors_nms_idx = nms(anchor_boxes, scores, 0.5)
            final_scores = torch.cat((final_scores, scores[anchors_nms_idx]))
            final_indexes = torch.cat((final_indexes, torch.tensor([i] * anchors_nms_idx.shape[0])))
            final_coordinates = torch.cat((final_coordinates, anchor_boxes[anchors_nms_idx]))
        return [final_scores, final_indexes, final_coordinates]


def resnet_small(num_classes: int, seed: int, prior_init: bool = True) -> ResNet:
    """``model.resnet18(num_classes, pretrained=True)``: the "pretrained" state loaded with
    ``strict=False`` (only the backbone's keys are in it)."""
    model = ResNet(num_classes, BasicBlock, LAYERS, prior_init=prior_init)
    model.load_state_dict(pretrained_backbone_state(seed), strict=False)
    return model


# --------------------------------------------------------------------------- retinanet/dataloader.py (the data)


def make_images(n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The "image files" (n, IMG, IMG, 3) uint8, and per image its CSV rows (x1, y1, x2, y2, class)."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, IMG, IMG, 3), dtype=np.float32)
    images *= 0.1
    images += 0.45
    np.clip(images, 0, 1, out=images)
    annotations = []
    for k in range(n):
        rows = []
        for _ in range(rng.integers(1, 4)):
            for _try in range(30):
                w, h = rng.integers(*BOX_SIDE), rng.integers(*BOX_SIDE)
                x0, y0 = rng.integers(0, IMG - w + 1), rng.integers(0, IMG - h + 1)
                box = (x0, y0, x0 + w, y0 + h)
                if all(_overlap(box, r) < 0.1 for r in rows):
                    break
            cls = int(rng.integers(NUM_CLASSES))
            colour = np.clip(COLOURS[cls] + 0.08 * rng.standard_normal(3), 0, 1)
            images[k, y0 : y0 + h, x0 : x0 + w, :] = colour[None, None, :]
            rows.append((x0, y0, x0 + w, y0 + h, cls))
        annotations.append(np.array(rows, dtype=np.float64))
    images *= 255
    images += 0.5
    return images.astype(np.uint8), annotations


def _overlap(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


class Normalizer:
    def __init__(self) -> None:
        self.mean, self.std = MEAN, STD

    def __call__(self, sample: dict) -> dict:
        return {"img": (sample["img"].astype(np.float32) - self.mean) / self.std, "annot": sample["annot"]}


class Augmenter:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng  # np.random.rand in the original; a seeded generator here

    def __call__(self, sample: dict, flip_x: float = 0.5) -> dict:
        if self.rng.random() < flip_x:
            image, annots = sample["img"], sample["annot"]
            image = image[:, ::-1, :]
            _rows, cols, _channels = image.shape
            x1, x2 = annots[:, 0].copy(), annots[:, 2].copy()
            annots[:, 0] = cols - x2
            annots[:, 2] = cols - x1
            sample = {"img": image, "annot": annots}
        return sample


class CSVDataset(Dataset):
    def __init__(self, images: np.ndarray, annotations: list[np.ndarray], transforms) -> None:
        self.images, self.annotations, self.transforms = images, annotations, transforms

    def __len__(self) -> int:
        return len(self.images)

    def num_classes(self) -> int:
        return NUM_CLASSES

    def load_image(self, image_index: int) -> np.ndarray:
        img = self.images[image_index]
        return img.astype(np.float32) / 255.0

    def load_annotations(self, image_index: int) -> np.ndarray:
        return self.annotations[image_index].copy()

    def __getitem__(self, idx: int) -> dict:
        sample = {"img": self.load_image(idx), "annot": self.load_annotations(idx)}
        for transform in self.transforms:
            sample = transform(sample)
        return {"img": torch.from_numpy(np.ascontiguousarray(sample["img"], dtype=np.float32)),
                "annot": torch.from_numpy(sample["annot"]), "scale": 1.0}  # fmt: skip


def collater(data: list[dict]) -> dict:
    imgs = [s["img"] for s in data]
    annots = [s["annot"] for s in data]
    scales = [s["scale"] for s in data]
    widths = [int(s.shape[0]) for s in imgs]
    heights = [int(s.shape[1]) for s in imgs]
    batch_size = len(imgs)
    padded_imgs = torch.zeros(batch_size, max(widths), max(heights), 3)
    for i in range(batch_size):
        padded_imgs[i, : int(imgs[i].shape[0]), : int(imgs[i].shape[1]), :] = imgs[i]
    max_num_annots = max(annot.shape[0] for annot in annots)
    if max_num_annots > 0:
        annot_padded = torch.ones((len(annots), max_num_annots, 5)) * -1
        for idx, annot in enumerate(annots):
            if annot.shape[0] > 0:
                annot_padded[idx, : annot.shape[0], :] = annot
    else:
        annot_padded = torch.ones((len(annots), 1, 5)) * -1
    return {"img": padded_imgs.permute(0, 3, 1, 2), "annot": annot_padded, "scale": scales}


# --------------------------------------------------------------------------- "pretrained" backbone


@functools.lru_cache(maxsize=4)
def pretrained_backbone_state(seed: int) -> dict[str, torch.Tensor]:
    """The stand-in for the ImageNet checkpoint: the ResNet's backbone (BatchNorm in training
    mode) trained ``PRETRAIN_STEPS`` steps to tell which of the three colours an image holds,
    on images of their own at half size; its keys are the backbone's only."""
    rng_state = torch.get_rng_state()
    torch.manual_seed(20_000 + seed)
    images, annotations = make_images(N_PRETRAIN, seed + 5000)
    x = torch.from_numpy(((images.astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32)).permute(0, 3, 1, 2)
    x = F.avg_pool2d(x, 2)  # at half the size: the labels stay, the cost is a quarter
    y = torch.zeros(len(annotations), NUM_CLASSES)
    for k, rows in enumerate(annotations):
        y[k, rows[:, 4].astype(int)] = 1.0
    net = ResNet(NUM_CLASSES, BasicBlock, LAYERS)
    backbone = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4)
    backbone.train()
    head = nn.Linear(WIDTHS[-1], NUM_CLASSES)
    opt = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.05, momentum=0.9,
                          weight_decay=1e-4)  # fmt: skip
    for _step in range(PRETRAIN_STEPS):
        idx = torch.randint(0, len(x), (32,))
        loss = F.binary_cross_entropy_with_logits(head(backbone(x[idx]).mean((2, 3))), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_rng_state(rng_state)
    keep = ("conv1.", "bn1.", "layer1.", "layer2.", "layer3.", "layer4.")
    return {k: v.detach().clone() for k, v in net.state_dict().items() if k.startswith(keep)}


# --------------------------------------------------------------------------- csv_eval.py


def compute_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iw = np.minimum(np.expand_dims(a[:, 2], axis=1), b[:, 2]) - np.maximum(np.expand_dims(a[:, 0], 1), b[:, 0])
    ih = np.minimum(np.expand_dims(a[:, 3], axis=1), b[:, 3]) - np.maximum(np.expand_dims(a[:, 1], 1), b[:, 1])
    iw, ih = np.maximum(iw, 0), np.maximum(ih, 0)
    ua = np.expand_dims((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]), axis=1) + area - iw * ih
    return iw * ih / np.maximum(ua, np.finfo(float).eps)


def _compute_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1]))


def evaluate(dataset: CSVDataset, retinanet: ResNet, iou_threshold: float = 0.5, score_threshold: float = 0.05,
             max_detections: int = 100) -> dict[int, tuple[float, float]]:  # fmt: skip
    all_detections = [[None] * dataset.num_classes() for _ in range(len(dataset))]
    retinanet.eval()
    with torch.no_grad():
        for index in range(len(dataset)):
            data = dataset[index]
            scores, labels, boxes = retinanet(data["img"].permute(2, 0, 1).float().unsqueeze(dim=0))
            scores, labels, boxes = scores.numpy(), labels.numpy(), boxes.numpy() / data["scale"]
            indices = np.where(scores > score_threshold)[0]
            if indices.shape[0] > 0:
                scores = scores[indices]
                scores_sort = np.argsort(-scores)[:max_detections]
                image_detections = np.concatenate([boxes[indices[scores_sort], :], np.expand_dims(scores[scores_sort], 1),
                                                   np.expand_dims(labels[indices[scores_sort]], 1)], axis=1)  # fmt: skip
                for label in range(dataset.num_classes()):
                    all_detections[index][label] = image_detections[image_detections[:, -1] == label, :-1]
            else:
                for label in range(dataset.num_classes()):
                    all_detections[index][label] = np.zeros((0, 5))
    all_annotations = [[a[a[:, 4] == label, :4].copy() for label in range(dataset.num_classes())]
                       for a in (dataset.load_annotations(i) for i in range(len(dataset)))]  # fmt: skip

    average_precisions = {}
    for label in range(dataset.num_classes()):
        false_positives, true_positives, scores = np.zeros((0,)), np.zeros((0,)), np.zeros((0,))
        num_annotations = 0.0
        for i in range(len(dataset)):
            detections, annotations = all_detections[i][label], all_annotations[i][label]
            num_annotations += annotations.shape[0]
            detected_annotations = []
            for d in detections:
                scores = np.append(scores, d[4])
                if annotations.shape[0] == 0:
                    false_positives, true_positives = np.append(false_positives, 1), np.append(true_positives, 0)
                    continue
                overlaps = compute_overlap(np.expand_dims(d, axis=0), annotations)
                assigned_annotation = np.argmax(overlaps, axis=1)
                max_overlap = overlaps[0, assigned_annotation]
                if max_overlap >= iou_threshold and assigned_annotation not in detected_annotations:
                    false_positives, true_positives = np.append(false_positives, 0), np.append(true_positives, 1)
                    detected_annotations.append(assigned_annotation)
                else:
                    false_positives, true_positives = np.append(false_positives, 1), np.append(true_positives, 0)
        if num_annotations == 0:
            average_precisions[label] = 0, 0
            continue
        indices = np.argsort(-scores)
        false_positives, true_positives = np.cumsum(false_positives[indices]), np.cumsum(true_positives[indices])
        recall = true_positives / num_annotations
        precision = true_positives / np.maximum(true_positives + false_positives, np.finfo(np.float64).eps)
        average_precisions[label] = _compute_ap(recall, precision), num_annotations
    return average_precisions


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_images, train_rows = make_images(N_TRAIN, seed)
    val_images, val_rows = make_images(N_TEST, seed + 1000)
    augment_rng = np.random.default_rng(seed)
    dataset_train = CSVDataset(train_images, train_rows, [Normalizer(), Augmenter(augment_rng)])
    dataset_val = CSVDataset(val_images, val_rows, [Normalizer()])
    sampler = BatchSampler(RandomSampler(dataset_train, generator=torch.Generator().manual_seed(seed)),
                           batch_size=BATCH_SIZE, drop_last=False)  # fmt: skip
    dataloader_train = DataLoader(dataset_train, collate_fn=collater, batch_sampler=sampler)

    retinanet = resnet_small(num_classes=dataset_train.num_classes(), seed=seed,
                             prior_init=variant != "no_prior_bias_init")  # fmt: skip
    retinanet.training = True
    optimizer = optim.Adam(retinanet.parameters(), lr=0.01 if variant == "adam_at_sgd_lr" else LR)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=3)
    loss_hist = collections.deque(maxlen=500)
    retinanet.train()
    retinanet.freeze_bn()

    first = collater([CSVDataset(train_images, train_rows, [Normalizer()])[i] for i in range(BATCH_SIZE)])
    probe_batch = (([first["img"].float(), first["annot"]],), None)

    def retinanet_loss(output, _target):
        classification_loss, regression_loss = output
        return classification_loss.mean() + regression_loss.mean()

    nx.preflight(retinanet, probe_batch, retinanet_loss, optimizer=optimizer)
    mon = nx.monitor(retinanet, optimizer, every=5)

    epoch_loss: list[float] = []
    skipped = 0
    for _epoch_num in range(EPOCHS):
        retinanet.train()
        retinanet.freeze_bn()
        epoch_loss = []
        for _iter_num, data in enumerate(dataloader_train):
            try:
                optimizer.zero_grad()
                classification_loss, regression_loss = retinanet([data["img"].float(), data["annot"]])
                classification_loss = classification_loss.mean()
                regression_loss = regression_loss.mean()
                loss = classification_loss + regression_loss
                if bool(loss == 0):
                    continue
                loss.backward()
                torch.nn.utils.clip_grad_norm_(retinanet.parameters(), 0.1)
                optimizer.step()
                nx.timed(lambda: mon.log(loss))  # noqa: B023
                loss_hist.append(float(loss))
                epoch_loss.append(float(loss))
                del classification_loss
                del regression_loss
            except Exception as e:  # noqa: BLE001 - the program's own: print and go on
                print(e)
                skipped += 1
                continue
        scheduler.step(np.mean(epoch_loss))

    nx.finish(mon, retinanet, probe_batch, retinanet_loss, optimizer=optimizer)
    retinanet.eval()
    aps = evaluate(dataset_val, retinanet)
    return {"test_map": float(np.mean([aps[label][0] for label in aps])), "final_epoch_loss": float(np.mean(epoch_loss)),
            "final_lr": optimizer.param_groups[0]["lr"], "skipped_batches": float(skipped)}  # fmt: skip
