"""Port of aladdinpersson's YOLOv1 from scratch (Machine-Learning-Collection,
``ML/Pytorch/object_detection/YOLO``): a Darknet-style conv backbone with BatchNorm and
LeakyReLU to an S x S x (C + 5B) grid, the YOLOv1 sum-squared loss, Adam.

Source: github.com/aladdinpersson/Machine-Learning-Collection, ``ML/Pytorch/object_detection/YOLO/``
``loss.py`` at commit 658a37d22866587494f4acc6a07a707e348e7374, ``model.py``, ``train.py``
and ``utils.py`` as last changed in 0b08605d8e2dd89cad339745cc46618a4de7fd4c,
``dataset.py`` in 65b8c8049560b19ace11ef754cb4dbe5aa415296 (MIT, Copyright (c) 2020 Aladdin
Persson). Written anew from the facts of those files; no code copied.

Kept: ``CNNBlock`` (bias-free ``Conv2d`` + ``BatchNorm2d`` + ``LeakyReLU(0.1)``) built from an
``architecture_config`` list of ``(kernel, filters, stride, padding)`` tuples, ``"M"``
(2x2 max-pool) and ``[conv1, conv2, repeats]`` lists; ``Yolov1.forward`` = darknet, flatten,
``fcs`` (``Flatten``, ``Linear``, ``Dropout(0.0)``, ``LeakyReLU(0.1)``, ``Linear`` to
``S*S*(C + B*5)``); ``YoloLoss`` (``MSELoss(reduction="sum")``, ``lambda_noobj`` 0.5,
``lambda_coord`` 5; predictions reshaped to (N, S, S, C + 5B); the IoU of each of the two
predicted boxes with the target box, ``bestbox`` the argmax; ``exists_box`` the target's
objectness; the responsible box's coordinates with ``sign * sqrt(|w| + 1e-6)`` on the
predicted width/height and ``sqrt`` on the target's; the object loss of the responsible
box's confidence against ``target * iou_maxes``; the no-object loss on both boxes'
confidences; the class loss as MSE on the C class scores; their weighted sum); the
dataset's conversion of each (class, x, y, w, h) box (midpoint, relative to the image) into
cell ``i = int(S*y)``, ``j = int(S*x)``, ``x_cell = S*x - j``, ``y_cell = S*y - i``,
``w*S``, ``h*S``, one object per cell; ``intersection_over_union`` (midpoint format),
``non_max_suppression`` (score threshold, then per class IoU suppression),
``mean_average_precision`` (per class: detections sorted by score, greedy matching at IoU
0.5, cumulative precision/recall, ``torch.trapz``), ``convert_cellboxes`` /
``cellboxes_to_boxes`` (the higher-confidence box per cell, cell offsets to image
coordinates) and ``get_bboxes`` (``model.eval()``, ``no_grad``, NMS with ``iou_threshold``
0.5 and ``threshold`` 0.4, ground truths with objectness above the threshold, then
``model.train()``); ``train.py``'s ``torch.manual_seed``, ``Adam(lr, weight_decay=0)``,
``BATCH_SIZE`` 16, shuffled train loader with ``drop_last=True``, and its epoch loop: the train
mAP from ``get_bboxes`` first, then ``train_fn`` (forward, ``loss_fn``, ``zero_grad``,
``backward``, ``step``, the mean loss).
Shrunk: synthetic 32x32 RGB images (a noisy background with one or two filled rectangles,
the class given by the colour: red, green, blue; 512 for training, 128 held out) instead of
Pascal VOC at 448x448; S=4, B=2, C=3 instead of 7, 2, 20 (the loss's and the converters'
hard-coded 20/21/25/26 and 7 written in terms of C and S); the backbone's 24 conv layers up
to 1024 filters shrunk to 9 up to 64 filters (a stride-2 5x5 stem instead of 7x7, two
max-pools, the 1x1/3x3 pairs), the hidden ``Linear`` 128 wide instead of 496; Adam lr 1e-3
instead of 2e-5 and 20 epochs instead of 1,000 (the program overfits 100 examples at 2e-5);
no tqdm, no checkpoints, no plots.
Measure only (not in the program): the same ``get_bboxes`` + ``mean_average_precision``
on the held-out images after the last epoch (the program's own test loader, unused there).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with ``YoloLoss`` and the optimizer; ``nndx.Monitor(model, optimizer)`` around the epochs
with the loss called as ``mon.loss_fn`` and every batch's loss logged (the train mAP is
printed, not logged: it is not a per-step accuracy); then ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yolo_v1"
SOURCE = Source("aladdinpersson/Machine-Learning-Collection", "ML/Pytorch/object_detection/YOLO/loss.py",
                "658a37d22866587494f4acc6a07a707e348e7374", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 32x32 images, S=4, C=3, Adam 1e-3)"),
        Variant(
            "lr_too_high",
            "LEARNING_RATE raised 20x (2e-2 instead of 1e-3) for Adam on the sum-reduced YOLO loss",
            (C.LR_TOO_HIGH,),
            ("https://github.com/ivanwhaf/yolov1-pytorch/issues/4",
             "https://github.com/longcw/yolo2-pytorch/issues/14",
             "https://github.com/aladdinpersson/Machine-Learning-Collection/issues/137"),
            Measure("test_map", "held-out mAP@0.5 at least 0.15 below the healthy run's: 0.005 against 0.25 on "
                    "seed 0 (mean loss 37.0 against 14.1)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "labels_corner_format",
            "the annotation files hold corner boxes (x1, y1, x2, y2) and the dataset reads them as YOLO's "
            "midpoint (x, y, w, h): every target box sits at its top-left corner with the wrong size",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/AlexeyAB/darknet/issues/820",
             "https://github.com/chuanenlin/drone-net/issues/1",
             "https://github.com/rafaelpadilla/Object-Detection-Metrics/issues/82"),
            Measure("test_map", "held-out mAP@0.5 at least 0.15 below the healthy run's: 0.0 against 0.25 on "
                    "seed 0 (the program's own train mAP, on the misread labels, 0.51 against 0.22)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

IMG, S, B, NUM_CLASSES = 32, 4, 2, 3
N_TRAIN, N_TEST = 1024, 128
LEARNING_RATE, BATCH_SIZE, WEIGHT_DECAY, EPOCHS, MAP_EVERY = 1e-3, 16, 0, 8, 4
COLOURS = np.array([[0.9, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.3, 0.95]])

# (kernel_size, filters, stride, padding), "M" a 2x2 max-pool, [conv1, conv2, repeats]
architecture_config = [
    (5, 16, 2, 2),
    "M",
    (3, 32, 1, 1),
    "M",
    (1, 16, 1, 0),
    (3, 32, 1, 1),
    [(1, 32, 1, 0), (3, 64, 1, 1), 2],
    (3, 64, 1, 1),
    (3, 64, 1, 1),
]


# --------------------------------------------------------------------------- model.py


class CNNBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.batchnorm = nn.BatchNorm2d(out_channels)
        self.leakyrelu = nn.LeakyReLU(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leakyrelu(self.batchnorm(self.conv(x)))


class Yolov1(nn.Module):
    def __init__(self, in_channels: int = 3, *, split_size: int, num_boxes: int, num_classes: int) -> None:
        super().__init__()
        self.architecture = architecture_config
        self.in_channels = in_channels
        self.darknet = self._create_conv_layers(self.architecture)
        self.fcs = self._create_fcs(split_size, num_boxes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.darknet(x)
        return self.fcs(torch.flatten(x, start_dim=1))

    def _create_conv_layers(self, architecture) -> nn.Sequential:
        layers: list[nn.Module] = []
        in_channels = self.in_channels
        for x in architecture:
            if isinstance(x, tuple):
                layers.append(CNNBlock(in_channels, x[1], kernel_size=x[0], stride=x[2], padding=x[3]))
                in_channels = x[1]
            elif isinstance(x, str):
                layers.append(nn.MaxPool2d(kernel_size=(2, 2), stride=(2, 2)))
            else:
                conv1, conv2, repeats = x
                for _ in range(repeats):
                    layers.append(CNNBlock(in_channels, conv1[1], kernel_size=conv1[0], stride=conv1[2],
                                           padding=conv1[3]))  # fmt: skip
                    layers.append(CNNBlock(conv1[1], conv2[1], kernel_size=conv2[0], stride=conv2[2],
                                           padding=conv2[3]))  # fmt: skip
                    in_channels = conv2[1]
        self.out_channels = in_channels
        return nn.Sequential(*layers)

    def _create_fcs(self, split_size: int, num_boxes: int, num_classes: int) -> nn.Sequential:
        s, b, c = split_size, num_boxes, num_classes
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(self.out_channels * s * s, 128),  # 1024 * S * S -> 496 in the original
            nn.Dropout(0.0),
            nn.LeakyReLU(0.1),
            nn.Linear(128, s * s * (c + b * 5)),
        )


# --------------------------------------------------------------------------- utils.py


def intersection_over_union(boxes_preds: torch.Tensor, boxes_labels: torch.Tensor, box_format: str = "midpoint"):
    if box_format == "midpoint":
        b1x1 = boxes_preds[..., 0:1] - boxes_preds[..., 2:3] / 2
        b1y1 = boxes_preds[..., 1:2] - boxes_preds[..., 3:4] / 2
        b1x2 = boxes_preds[..., 0:1] + boxes_preds[..., 2:3] / 2
        b1y2 = boxes_preds[..., 1:2] + boxes_preds[..., 3:4] / 2
        b2x1 = boxes_labels[..., 0:1] - boxes_labels[..., 2:3] / 2
        b2y1 = boxes_labels[..., 1:2] - boxes_labels[..., 3:4] / 2
        b2x2 = boxes_labels[..., 0:1] + boxes_labels[..., 2:3] / 2
        b2y2 = boxes_labels[..., 1:2] + boxes_labels[..., 3:4] / 2
    else:
        b1x1, b1y1, b1x2, b1y2 = (boxes_preds[..., k : k + 1] for k in range(4))
        b2x1, b2y1, b2x2, b2y2 = (boxes_labels[..., k : k + 1] for k in range(4))
    x1, y1 = torch.max(b1x1, b2x1), torch.max(b1y1, b2y1)
    x2, y2 = torch.min(b1x2, b2x2), torch.min(b1y2, b2y2)
    intersection = (x2 - x1).clamp(0) * (y2 - y1).clamp(0)
    area1 = abs((b1x2 - b1x1) * (b1y2 - b1y1))
    area2 = abs((b2x2 - b2x1) * (b2y2 - b2y1))
    return intersection / (area1 + area2 - intersection + 1e-6)


def non_max_suppression(bboxes: list, iou_threshold: float, threshold: float, box_format: str = "corners") -> list:
    bboxes = sorted([box for box in bboxes if box[1] > threshold], key=lambda x: x[1], reverse=True)
    kept = []
    while bboxes:
        chosen = bboxes.pop(0)
        bboxes = [box for box in bboxes if box[0] != chosen[0]
                  or intersection_over_union(torch.tensor(chosen[2:]), torch.tensor(box[2:]),
                                             box_format=box_format) < iou_threshold]  # fmt: skip
        kept.append(chosen)
    return kept


def mean_average_precision(pred_boxes: list, true_boxes: list, iou_threshold: float = 0.5,
                           box_format: str = "midpoint", num_classes: int = NUM_CLASSES) -> float:  # fmt: skip
    average_precisions = []
    epsilon = 1e-6
    for c in range(num_classes):
        detections = [d for d in pred_boxes if d[1] == c]
        ground_truths = [g for g in true_boxes if g[1] == c]
        by_image: dict = {}
        for g in ground_truths:  # the original filters the list per detection; grouped once here (speed only)
            by_image.setdefault(g[0], []).append(g)
        amount_bboxes = {k: torch.zeros(v) for k, v in Counter(g[0] for g in ground_truths).items()}
        detections.sort(key=lambda x: x[2], reverse=True)
        tp, fp = torch.zeros(len(detections)), torch.zeros(len(detections))
        total_true_bboxes = len(ground_truths)
        if total_true_bboxes == 0:
            continue
        for d_idx, detection in enumerate(detections):
            gt_img = by_image.get(detection[0], [])
            best_iou, best_gt = 0.0, 0
            for idx, gt in enumerate(gt_img):
                iou = intersection_over_union(torch.tensor(detection[3:]), torch.tensor(gt[3:]), box_format=box_format)
                if iou > best_iou:
                    best_iou, best_gt = iou, idx
            if best_iou > iou_threshold and amount_bboxes[detection[0]][best_gt] == 0:
                tp[d_idx] = 1
                amount_bboxes[detection[0]][best_gt] = 1
            else:
                fp[d_idx] = 1
        tp_cumsum, fp_cumsum = torch.cumsum(tp, dim=0), torch.cumsum(fp, dim=0)
        recalls = torch.cat((torch.tensor([0.0]), tp_cumsum / (total_true_bboxes + epsilon)))
        precisions = torch.cat((torch.tensor([1.0]), tp_cumsum / (tp_cumsum + fp_cumsum + epsilon)))
        average_precisions.append(torch.trapz(precisions, recalls))
    return float(sum(average_precisions) / len(average_precisions)) if average_precisions else 0.0


def convert_cellboxes(predictions: torch.Tensor, s: int = S) -> torch.Tensor:
    c = NUM_CLASSES
    batch_size = predictions.shape[0]
    predictions = predictions.reshape(batch_size, s, s, c + B * 5)
    bboxes1, bboxes2 = predictions[..., c + 1 : c + 5], predictions[..., c + 6 : c + 10]
    scores = torch.cat((predictions[..., c].unsqueeze(0), predictions[..., c + 5].unsqueeze(0)), dim=0)
    best_box = scores.argmax(0).unsqueeze(-1)
    best_boxes = bboxes1 * (1 - best_box) + best_box * bboxes2
    cell_indices = torch.arange(s).repeat(batch_size, s, 1).unsqueeze(-1)
    x = 1 / s * (best_boxes[..., :1] + cell_indices)
    y = 1 / s * (best_boxes[..., 1:2] + cell_indices.permute(0, 2, 1, 3))
    w_y = 1 / s * best_boxes[..., 2:4]
    converted = torch.cat((x, y, w_y), dim=-1)
    predicted_class = predictions[..., :c].argmax(-1).unsqueeze(-1)
    best_confidence = torch.max(predictions[..., c], predictions[..., c + 5]).unsqueeze(-1)
    return torch.cat((predicted_class, best_confidence, converted), dim=-1)


def cellboxes_to_boxes(out: torch.Tensor, s: int = S) -> list:
    converted = convert_cellboxes(out).reshape(out.shape[0], s * s, -1)
    converted[..., 0] = converted[..., 0].long()
    return [[[v.item() for v in converted[ex, k, :]] for k in range(s * s)] for ex in range(out.shape[0])]


def get_bboxes(loader, model, iou_threshold: float, threshold: float, box_format: str = "midpoint"):
    all_pred_boxes, all_true_boxes = [], []
    model.eval()
    train_idx = 0
    for x, labels in loader:
        with torch.no_grad():
            predictions = model(x)
        true_bboxes, bboxes = cellboxes_to_boxes(labels), cellboxes_to_boxes(predictions)
        for idx in range(x.shape[0]):
            for nms_box in non_max_suppression(bboxes[idx], iou_threshold=iou_threshold, threshold=threshold,
                                               box_format=box_format):  # fmt: skip
                all_pred_boxes.append([train_idx] + nms_box)
            for box in true_bboxes[idx]:
                if box[1] > threshold:
                    all_true_boxes.append([train_idx] + box)
            train_idx += 1
    model.train()
    return all_pred_boxes, all_true_boxes


# --------------------------------------------------------------------------- loss.py


class YoloLoss(nn.Module):
    def __init__(self, S: int = S, B: int = B, C: int = NUM_CLASSES) -> None:  # noqa: N803 - the source's names
        super().__init__()
        self.mse = nn.MSELoss(reduction="sum")
        self.S, self.B, self.C = S, B, C
        self.lambda_noobj = 0.5
        self.lambda_coord = 5

    def forward(self, predictions: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        c = self.C
        predictions = predictions.reshape(-1, self.S, self.S, self.C + self.B * 5)
        iou_b1 = intersection_over_union(predictions[..., c + 1 : c + 5], target[..., c + 1 : c + 5])
        iou_b2 = intersection_over_union(predictions[..., c + 6 : c + 10], target[..., c + 1 : c + 5])
        ious = torch.cat([iou_b1.unsqueeze(0), iou_b2.unsqueeze(0)], dim=0)
        iou_maxes, bestbox = torch.max(ious, dim=0)
        exists_box = target[..., c].unsqueeze(3)

        box_predictions = exists_box * (bestbox * predictions[..., c + 6 : c + 10]
                                        + (1 - bestbox) * predictions[..., c + 1 : c + 5])  # fmt: skip
        box_targets = exists_box * target[..., c + 1 : c + 5]
        box_predictions[..., 2:4] = torch.sign(box_predictions[..., 2:4]) * torch.sqrt(
            torch.abs(box_predictions[..., 2:4] + 1e-6))  # fmt: skip
        box_targets[..., 2:4] = torch.sqrt(box_targets[..., 2:4])
        box_loss = self.mse(torch.flatten(box_predictions, end_dim=-2), torch.flatten(box_targets, end_dim=-2))

        pred_box = bestbox * predictions[..., c + 5 : c + 6] + (1 - bestbox) * predictions[..., c : c + 1]
        object_loss = self.mse(torch.flatten(exists_box * pred_box),
                               torch.flatten(exists_box * target[..., c : c + 1] * iou_maxes))  # fmt: skip

        no_object_loss = self.mse(torch.flatten((1 - exists_box) * predictions[..., c : c + 1], start_dim=1),
                                  torch.flatten((1 - exists_box) * target[..., c : c + 1], start_dim=1))  # fmt: skip
        no_object_loss = no_object_loss + self.mse(
            torch.flatten((1 - exists_box) * predictions[..., c + 5 : c + 6], start_dim=1),
            torch.flatten((1 - exists_box) * target[..., c : c + 1], start_dim=1))  # fmt: skip

        class_loss = self.mse(torch.flatten(exists_box * predictions[..., :c], end_dim=-2),
                              torch.flatten(exists_box * target[..., :c], end_dim=-2))  # fmt: skip
        return self.lambda_coord * box_loss + object_loss + self.lambda_noobj * no_object_loss + class_loss


# --------------------------------------------------------------------------- dataset.py (and the data)


def make_images(n: int, seed: int) -> tuple[np.ndarray, list[list[list[float]]]]:
    """Images (n, 3, IMG, IMG) in [0, 1] and their annotation "files": rows of
    (class, x1, y1, x2, y2) in image fractions (the generator's native corners)."""
    rng = np.random.default_rng(seed)
    images = np.clip(0.35 + 0.12 * rng.standard_normal((n, 3, IMG, IMG)), 0, 1)
    annotations = []
    for k in range(n):
        rows, taken = [], []
        for _ in range(rng.integers(1, 3)):
            for _try in range(20):
                w, h = rng.integers(6, 15), rng.integers(6, 15)
                x0, y0 = rng.integers(0, IMG - w + 1), rng.integers(0, IMG - h + 1)
                cell = (int(S * (x0 + w / 2) / IMG), int(S * (y0 + h / 2) / IMG))
                if cell not in taken:
                    break
            taken.append(cell)
            cls = int(rng.integers(NUM_CLASSES))
            colour = np.clip(COLOURS[cls] + 0.08 * rng.standard_normal(3), 0, 1)
            images[k, :, y0 : y0 + h, x0 : x0 + w] = colour[:, None, None]
            rows.append([cls, x0 / IMG, y0 / IMG, (x0 + w) / IMG, (y0 + h) / IMG])
        annotations.append(rows)
    return images.astype(np.float32), annotations


def label_file(rows: list[list[float]], corner_format: bool) -> list[list[float]]:
    """The label .txt the dataset reads: YOLO's (class, x, y, w, h) midpoint rows, or (the bug)
    the corner rows written as they are."""
    if corner_format:
        return [list(r) for r in rows]
    return [[c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1] for c, x1, y1, x2, y2 in rows]


class SyntheticVOCDataset(Dataset):
    def __init__(self, images: np.ndarray, labels: list[list[list[float]]], S: int = S, B: int = B,  # noqa: N803
                 C: int = NUM_CLASSES) -> None:  # noqa: N803  # fmt: skip
        self.images, self.labels, self.S, self.B, self.C = images, labels, S, B, C

        self.items = [self.convert(i) for i in range(len(images))]  # once, not per __getitem__ (speed only)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.items[index]

    def convert(self, index: int):
        image = torch.from_numpy(self.images[index])
        boxes = torch.tensor(self.labels[index])
        label_matrix = torch.zeros((self.S, self.S, self.C + 5 * self.B))
        for box in boxes:
            class_label, x, y, width, height = box.tolist()
            class_label = int(class_label)
            i, j = min(int(self.S * y), self.S - 1), min(int(self.S * x), self.S - 1)
            x_cell, y_cell = self.S * x - j, self.S * y - i
            width_cell, height_cell = width * self.S, height * self.S
            if label_matrix[i, j, self.C] == 0:
                label_matrix[i, j, self.C] = 1
                label_matrix[i, j, self.C + 1 : self.C + 5] = torch.tensor([x_cell, y_cell, width_cell, height_cell])
                label_matrix[i, j, class_label] = 1
        return image, label_matrix


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(123 + seed)
    corner = variant == "labels_corner_format"
    lr = 2e-2 if variant == "lr_too_high" else LEARNING_RATE
    train_images, train_rows = make_images(N_TRAIN, seed)
    test_images, test_rows = make_images(N_TEST, seed + 1000)
    train_dataset = SyntheticVOCDataset(train_images, [label_file(r, corner) for r in train_rows])
    test_dataset = SyntheticVOCDataset(test_images, [label_file(r, False) for r in test_rows])  # the truth

    model = Yolov1(split_size=S, num_boxes=B, num_classes=NUM_CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    loss_fn = YoloLoss()
    train_loader = DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_dataset, batch_size=BATCH_SIZE, shuffle=False, drop_last=False)

    first_batch = next(iter(DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=False)))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=loss_fn)

    train_maps: list[float] = []
    mean_loss: list[float] = []
    for epoch in range(EPOCHS):
        if epoch % MAP_EVERY == 0:
            pred_boxes, target_boxes = get_bboxes(train_loader, model, iou_threshold=0.5, threshold=0.4)
            train_maps.append(mean_average_precision(pred_boxes, target_boxes, iou_threshold=0.5))
        mean_loss = []
        for x, y in train_loader:
            out = model(x)
            loss = mon.loss_fn(out, y)
            mean_loss.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)
    pred_boxes, target_boxes = get_bboxes(test_loader, model, iou_threshold=0.5, threshold=0.4)
    return {"test_map": mean_average_precision(pred_boxes, target_boxes, iou_threshold=0.5),
            "train_map": train_maps[-1], "mean_loss": float(np.mean(mean_loss))}  # fmt: skip
