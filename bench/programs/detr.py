"""Port of facebookresearch/detr: DETR, a CNN backbone whose features go through a transformer
encoder-decoder with learned object queries, each query predicting a class (or "no object")
and a box; a Hungarian matching of the predictions to the ground truth, then cross-entropy
with a down-weighted no-object class, L1 and GIoU box losses, repeated on every decoder
layer's output; AdamW with a ten-times-lower learning rate on the backbone, gradient
clipping at 0.1 and a StepLR drop.

Source: github.com/facebookresearch/detr, ``main.py``, ``engine.py``, ``models/detr.py``,
``models/matcher.py``, ``models/transformer.py`` (with ``models/backbone.py``,
``models/position_encoding.py``, ``util/box_ops.py``, ``util/misc.py`` and
``datasets/transforms.py`` for the pieces they use) at commit
29901c51d7fe8712168b8d0d64351170bc0f83e0 (Apache-2.0, Copyright (c) Facebook, Inc. and its
affiliates). Written anew from the facts of those files; no code copied. torchvision is not
installed: its ResNet, ``IntermediateLayerGetter`` and ``box_area`` are written out here.

Kept: ``DETR`` (``input_proj`` 1x1 conv from the backbone's channels to ``hidden_dim``,
``query_embed`` an ``nn.Embedding(num_queries, hidden_dim)``, ``class_embed`` a
``Linear(hidden_dim, num_classes + 1)``, ``bbox_embed`` the 3-layer ReLU ``MLP`` followed by
``sigmoid``, the auxiliary outputs of every decoder layer); the ``Transformer`` (post-norm
encoder and decoder layers with ``nn.MultiheadAttention``, positional encodings added to the
queries and keys of every attention, ``tgt`` starting at zeros, the decoder's final
``LayerNorm`` and ``return_intermediate``, xavier-uniform init of every matrix, dropout 0.1,
ReLU); ``PositionEmbeddingSine`` with ``normalize=True`` over the padding mask;
``nested_tensor_from_tensor_list`` and the mask carried through the backbone; the backbone
``Joiner``: a ResNet with ``FrozenBatchNorm2d`` whose ``conv1``/``bn1``/``layer1``
parameters are frozen (``requires_grad_(False)`` for every name without layer2-4, as
``BackboneBase`` does); ``HungarianMatcher`` (softmax class cost, L1 ``cdist`` and -GIoU
costs with weights 1, 5, 2, ``scipy.optimize.linear_sum_assignment`` per image);
``SetCriterion`` (``empty_weight`` with ``eos_coef`` 0.1 on the no-object class,
``loss_labels`` with ``class_error``, ``loss_cardinality``, ``loss_boxes`` = L1 and 1 - GIoU
each divided by ``num_boxes``, the same on each ``aux_outputs`` with its own matching);
``weight_dict`` {ce 1, bbox 5, giou 2} and its aux copies; ``build``'s ``num_classes`` =
max class id + 1 (the ids are 1-based as COCO's); ``main.py``'s two parameter groups
(backbone at ``lr_backbone``), ``AdamW(weight_decay=1e-4)``, ``StepLR(lr_drop)`` stepped
once per epoch, a ``RandomSampler`` in a ``BatchSampler(drop_last=True)``;
``train_one_epoch`` (``model.train()``, ``criterion.train()``, the weighted sum of the
losses, the non-finite-loss stop, ``zero_grad``, ``backward``,
``clip_grad_norm_(max_norm=0.1)``, ``step``); ``PostProcess`` (softmax, the best
non-no-object class and its score per query, boxes to corners and scaled by the image
size); the dataset transform ``Normalize`` (ImageNet mean/std on the image, boxes from
corners to ``(cx, cy, w, h)`` divided by the image's width and height).
Shrunk: synthetic 48x48 images (a noisy background with one or two filled rectangles of
12-23 pixels, the class given by the colour, ids 1-3; 512 for training, 192 held out)
instead of COCO; the ResNet-50 (pretrained on ImageNet) replaced by a ResNet of
``BasicBlock``s of widths 16-32-64, one block each, a 3x3 stride-2 stem, no max-pool and no
``layer4`` (stride 8: a 6x6 feature map), whose "pretraining" is 80 steps of telling which
colours an image holds, on 600 images drawn apart from the detection data (made at run
time, cached per seed; nothing downloaded); ``hidden_dim`` 64 with 8 heads,
``dim_feedforward`` 128, 2 encoder and 2 decoder layers instead of 256, 2048, 6 and 6; 6
queries instead of 100 (at most two objects per image); batch 16 instead of 2 per GPU; lr
1e-3 and ``lr_backbone`` 1e-4 (the original's ten-to-one) instead of 1e-4 / 1e-5; 20 epochs
with ``lr_drop`` 14 instead of 300 and 200; no random resize/crop/flip augmentation (every
image has the same size, so ``collate_fn`` stacks them and the model's own
``nested_tensor_from_tensor_list`` gives an all-False mask), no distributed training, no
checkpoints, no COCO API; ``evaluate`` is run once after the last epoch instead of after
each.
Measure only (not in the program): the mean average precision at IoU 0.5 (VOC's
all-point interpolation, per class, averaged over the three classes; the AP of class id 3
alone as ``test_ap_id3``) of ``PostProcess``'s detections on the held-out images, standing in
for ``evaluate``'s COCO evaluation; the same on 128 training images.

nndx, as the author would add it (as the other ports): a preflight ``nndx.probe`` on a
batch of the first 16 training images (images, the list of target dicts) with the loss the loop sums from
the criterion's dict and the optimizer; ``nndx.Monitor(model, optimizer)`` around the
epochs with the loop's own criterion call and the weighted loss logged each step; then
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "detr"
SOURCE = Source("facebookresearch/detr", "main.py", "29901c51d7fe8712168b8d0d64351170bc0f83e0", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 48x48 boxes, small ResNet, 2+2 layers, 6 queries)"),
        Variant(
            "num_classes_without_background_slot",
            "num_classes set to the number of classes (3) instead of max class id + 1 (4) while the ids are "
            "1-based: class_embed has 4 outputs and the no-object slot is index 3, the id of the third class, "
            "so every object of that class is trained as 'no object' and can never be detected",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/facebookresearch/detr/issues/108",
             "https://github.com/facebookresearch/detr/issues/32",
             "https://github.com/facebookresearch/detr/issues/230"),
            Measure("test_map", "held-out mAP@0.5 at least 0.1 below the healthy run's (the third class's AP is 0)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "boxes_not_normalized",
            "the dataset's Normalize transform converts the boxes to (cx, cy, w, h) but does not divide them by "
            "the image's width and height: the targets are in pixels (up to 48) while pred_boxes come out of a "
            "sigmoid in (0, 1)",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/kuangliu/torchcv/issues/30",
             "https://github.com/facebookresearch/detr/issues/587",
             "https://github.com/facebookresearch/detr/issues/207"),
            Measure("test_map", "held-out mAP@0.5 at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

IMG, NUM_IDS = 48, 3  # class ids 1..3
N_TRAIN, N_TEST, N_PRETRAIN = 512, 192, 600
COLOURS = np.array([[0.9, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.3, 0.95]])
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ARGS = {
    "lr": 1e-3, "lr_backbone": 1e-4, "batch_size": 16, "weight_decay": 1e-4, "epochs": 20, "lr_drop": 14,
    "clip_max_norm": 0.1, "enc_layers": 2, "dec_layers": 2, "dim_feedforward": 128, "hidden_dim": 64,
    "dropout": 0.1, "nheads": 8, "num_queries": 6, "aux_loss": True, "set_cost_class": 1.0,
    "set_cost_bbox": 5.0, "set_cost_giou": 2.0, "bbox_loss_coef": 5.0, "giou_loss_coef": 2.0, "eos_coef": 0.1,
}  # fmt: skip
WIDTHS = (16, 32, 64)
LAYER3_STRIDE = 2
BOX_MIN, BOX_MAX = 4, 2  # side in [IMG // BOX_MIN, IMG // BOX_MAX)
MAX_OBJECTS = 2
PRETRAIN_STEPS = 80


# --------------------------------------------------------------------------- util/box_ops.py


def box_cxcywh_to_xyxy(x: torch.Tensor) -> torch.Tensor:
    x_c, y_c, w, h = x.unbind(-1)
    return torch.stack([x_c - 0.5 * w, y_c - 0.5 * h, x_c + 0.5 * w, y_c + 0.5 * h], dim=-1)


def box_xyxy_to_cxcywh(x: torch.Tensor) -> torch.Tensor:
    x0, y0, x1, y1 = x.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    area1, area2 = box_area(boxes1), box_area(boxes2)
    lt = torch.max(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[:, :, 0] * wh[:, :, 1]
    union = area1[:, None] + area2 - inter
    return inter / union, union


def generalized_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    assert (boxes1[:, 2:] >= boxes1[:, :2]).all()
    assert (boxes2[:, 2:] >= boxes2[:, :2]).all()
    iou, union = box_iou(boxes1, boxes2)
    lt = torch.min(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.max(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    area = wh[:, :, 0] * wh[:, :, 1]
    return iou - (area - union) / area


# --------------------------------------------------------------------------- util/misc.py


class NestedTensor:
    def __init__(self, tensors: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.tensors, self.mask = tensors, mask

    def decompose(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.tensors, self.mask


def nested_tensor_from_tensor_list(tensor_list) -> NestedTensor:
    """Pad to the largest image of the batch; the mask is True on padded pixels."""
    max_size = [max(s) for s in zip(*[img.shape for img in tensor_list])]
    b = len(tensor_list)
    c, h, w = max_size
    tensor = torch.zeros((b, c, h, w), dtype=tensor_list[0].dtype, device=tensor_list[0].device)
    mask = torch.ones((b, h, w), dtype=torch.bool, device=tensor_list[0].device)
    for img, pad_img, m in zip(tensor_list, tensor, mask):
        pad_img[: img.shape[0], : img.shape[1], : img.shape[2]].copy_(img)
        m[: img.shape[1], : img.shape[2]] = False
    return NestedTensor(tensor, mask)


@torch.no_grad()
def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.numel() == 0:
        return torch.zeros([], device=output.device)
    pred = output.argmax(-1)
    return (pred == target).float().mean() * 100.0


def collate_fn(batch):
    images, targets = zip(*batch)
    return torch.stack(images), list(targets)  # every image is 64x64: the model pads nothing


# --------------------------------------------------------------------------- models/backbone.py


class FrozenBatchNorm2d(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(n))
        self.register_buffer("bias", torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight.reshape(1, -1, 1, 1), self.bias.reshape(1, -1, 1, 1)
        rv, rm = self.running_var.reshape(1, -1, 1, 1), self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + 1e-5).rsqrt()
        return x * scale + (b - rm * scale)


class BasicBlock(nn.Module):
    """torchvision's ResNet ``BasicBlock`` with the given norm layer."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, norm_layer=nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = norm_layer(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            norm_layer(planes))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet layout, shrunk: a 3x3 stride-2 stem (no max-pool), three stages."""

    def __init__(self, norm_layer=nn.BatchNorm2d, widths=WIDTHS) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, stride=2, padding=1, bias=False)
        self.bn1 = norm_layer(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(widths[0], widths[0], 1, norm_layer)
        self.layer2 = BasicBlock(widths[0], widths[1], 2, norm_layer)
        self.layer3 = BasicBlock(widths[1], widths[2], LAYER3_STRIDE, norm_layer)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer3(self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x))))))


class BackboneBase(nn.Module):
    def __init__(self, backbone: nn.Module, train_backbone: bool, num_channels: int) -> None:
        super().__init__()
        for name, parameter in backbone.named_parameters():
            if not train_backbone or ("layer2" not in name and "layer3" not in name and "layer4" not in name):
                parameter.requires_grad_(False)
        self.body = backbone  # IntermediateLayerGetter(backbone, {"layer3": "0"}): the last stage's output
        self.num_channels = num_channels

    def forward(self, tensor_list: NestedTensor) -> dict[str, NestedTensor]:
        xs = {"0": self.body(tensor_list.tensors)}
        out = {}
        for name, x in xs.items():
            m = tensor_list.mask
            assert m is not None
            mask = F.interpolate(m[None].float(), size=x.shape[-2:]).to(torch.bool)[0]
            out[name] = NestedTensor(x, mask)
        return out


class PositionEmbeddingSine(nn.Module):
    def __init__(self, num_pos_feats: int = 64, temperature: int = 10000, normalize: bool = False,
                 scale: float | None = None) -> None:  # fmt: skip
        super().__init__()
        self.num_pos_feats, self.temperature, self.normalize = num_pos_feats, temperature, normalize
        self.scale = 2 * math.pi if scale is None else scale

    def forward(self, tensor_list: NestedTensor) -> torch.Tensor:
        x, mask = tensor_list.tensors, tensor_list.mask
        assert mask is not None
        not_mask = ~mask
        y_embed = not_mask.cumsum(1, dtype=torch.float32)
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = y_embed / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = x_embed / (x_embed[:, :, -1:] + eps) * self.scale
        dim_t = torch.arange(self.num_pos_feats, dtype=torch.float32, device=x.device)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.num_pos_feats)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class Joiner(nn.Sequential):
    def __init__(self, backbone: nn.Module, position_embedding: nn.Module) -> None:
        super().__init__(backbone, position_embedding)

    def forward(self, tensor_list: NestedTensor):
        xs = self[0](tensor_list)
        out, pos = [], []
        for _name, x in xs.items():
            out.append(x)
            pos.append(self[1](x).to(x.tensors.dtype))
        return out, pos


# --------------------------------------------------------------------------- models/transformer.py


class TransformerEncoderLayer(nn.Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, src, src_key_padding_mask=None, pos=None):  # forward_post (normalize_before False)
        q = k = src if pos is None else src + pos
        src2 = self.self_attn(q, k, value=src, key_padding_mask=src_key_padding_mask)[0]
        src = self.norm1(src + self.dropout1(src2))
        src2 = self.linear2(self.dropout(F.relu(self.linear1(src))))
        return self.norm2(src + self.dropout2(src2))


class TransformerDecoderLayer(nn.Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt, memory, memory_key_padding_mask=None, pos=None, query_pos=None):  # forward_post
        q = k = tgt + query_pos
        tgt2 = self.self_attn(q, k, value=tgt)[0]
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.multihead_attn(query=tgt + query_pos, key=memory + pos, value=memory,
                                   key_padding_mask=memory_key_padding_mask)[0]  # fmt: skip
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        tgt2 = self.linear2(self.dropout(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(tgt2))


class TransformerEncoder(nn.Module):
    def __init__(self, encoder_layer: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])

    def forward(self, src, src_key_padding_mask=None, pos=None):
        output = src
        for layer in self.layers:
            output = layer(output, src_key_padding_mask=src_key_padding_mask, pos=pos)
        return output  # encoder_norm is None for post-norm


class TransformerDecoder(nn.Module):
    def __init__(self, decoder_layer: nn.Module, num_layers: int, norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.norm = norm

    def forward(self, tgt, memory, memory_key_padding_mask=None, pos=None, query_pos=None):
        output, intermediate = tgt, []
        for layer in self.layers:
            output = layer(output, memory, memory_key_padding_mask=memory_key_padding_mask, pos=pos,
                           query_pos=query_pos)  # fmt: skip
            intermediate.append(self.norm(output))  # return_intermediate=True
        output = self.norm(output)
        intermediate.pop()
        intermediate.append(output)
        return torch.stack(intermediate)


class Transformer(nn.Module):
    def __init__(self, d_model: int, nhead: int, num_encoder_layers: int, num_decoder_layers: int,
                 dim_feedforward: int, dropout: float) -> None:  # fmt: skip
        super().__init__()
        self.encoder = TransformerEncoder(TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout),
                                          num_encoder_layers)  # fmt: skip
        self.decoder = TransformerDecoder(TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout),
                                          num_decoder_layers, nn.LayerNorm(d_model))  # fmt: skip
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        self.d_model, self.nhead = d_model, nhead

    def forward(self, src, mask, query_embed, pos_embed):
        bs, c, h, w = src.shape
        src = src.flatten(2).permute(2, 0, 1)
        pos_embed = pos_embed.flatten(2).permute(2, 0, 1)
        query_embed = query_embed.unsqueeze(1).repeat(1, bs, 1)
        mask = mask.flatten(1)
        tgt = torch.zeros_like(query_embed)
        memory = self.encoder(src, src_key_padding_mask=mask, pos=pos_embed)
        hs = self.decoder(tgt, memory, memory_key_padding_mask=mask, pos=pos_embed, query_pos=query_embed)
        return hs.transpose(1, 2), memory.permute(1, 2, 0).view(bs, c, h, w)


# --------------------------------------------------------------------------- models/detr.py


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        self.num_layers = num_layers
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < self.num_layers - 1 else layer(x)
        return x


class DETR(nn.Module):
    def __init__(self, backbone: nn.Module, transformer: Transformer, num_classes: int, num_queries: int,
                 aux_loss: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.num_queries = num_queries
        self.transformer = transformer
        hidden_dim = transformer.d_model
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden_dim, kernel_size=1)
        self.backbone = backbone
        self.aux_loss = aux_loss

    def forward(self, samples):
        if isinstance(samples, (list, torch.Tensor)):
            samples = nested_tensor_from_tensor_list(samples)
        features, pos = self.backbone(samples)
        src, mask = features[-1].decompose()
        assert mask is not None
        hs = self.transformer(self.input_proj(src), mask, self.query_embed.weight, pos[-1])[0]
        outputs_class = self.class_embed(hs)
        outputs_coord = self.bbox_embed(hs).sigmoid()
        out = {"pred_logits": outputs_class[-1], "pred_boxes": outputs_coord[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b}
                                  for a, b in zip(outputs_class[:-1], outputs_coord[:-1])]  # fmt: skip
        return out


class HungarianMatcher(nn.Module):
    def __init__(self, cost_class: float = 1, cost_bbox: float = 1, cost_giou: float = 1) -> None:
        super().__init__()
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou

    @torch.no_grad()
    def forward(self, outputs, targets):
        bs, num_queries = outputs["pred_logits"].shape[:2]
        out_prob = outputs["pred_logits"].flatten(0, 1).softmax(-1)
        out_bbox = outputs["pred_boxes"].flatten(0, 1)
        tgt_ids = torch.cat([v["labels"] for v in targets])
        tgt_bbox = torch.cat([v["boxes"] for v in targets])
        cost_class = -out_prob[:, tgt_ids]
        cost_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        cost = cost.view(bs, num_queries, -1).cpu()
        sizes = [len(v["boxes"]) for v in targets]
        indices = [linear_sum_assignment(c[i]) for i, c in enumerate(cost.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]


class SetCriterion(nn.Module):
    def __init__(self, num_classes: int, matcher: HungarianMatcher, weight_dict: dict, eos_coef: float,
                 losses: list[str]) -> None:  # fmt: skip
        super().__init__()
        self.num_classes, self.matcher, self.weight_dict = num_classes, matcher, weight_dict
        self.eos_coef, self.losses = eos_coef, losses
        empty_weight = torch.ones(self.num_classes + 1)
        empty_weight[-1] = self.eos_coef
        self.register_buffer("empty_weight", empty_weight)

    def loss_labels(self, outputs, targets, indices, num_boxes, log=True):
        src_logits = outputs["pred_logits"]
        idx = self._get_src_permutation_idx(indices)
        target_classes_o = torch.cat([t["labels"][J] for t, (_, J) in zip(targets, indices)])
        target_classes = torch.full(src_logits.shape[:2], self.num_classes, dtype=torch.int64,
                                    device=src_logits.device)  # fmt: skip
        target_classes[idx] = target_classes_o
        loss_ce = F.cross_entropy(src_logits.transpose(1, 2), target_classes, self.empty_weight)
        losses = {"loss_ce": loss_ce}
        if log:
            losses["class_error"] = 100 - accuracy(src_logits[idx], target_classes_o)
        return losses

    @torch.no_grad()
    def loss_cardinality(self, outputs, targets, indices, num_boxes):
        pred_logits = outputs["pred_logits"]
        tgt_lengths = torch.as_tensor([len(v["labels"]) for v in targets], device=pred_logits.device)
        card_pred = (pred_logits.argmax(-1) != pred_logits.shape[-1] - 1).sum(1)
        return {"cardinality_error": F.l1_loss(card_pred.float(), tgt_lengths.float())}

    def loss_boxes(self, outputs, targets, indices, num_boxes):
        idx = self._get_src_permutation_idx(indices)
        src_boxes = outputs["pred_boxes"][idx]
        target_boxes = torch.cat([t["boxes"][i] for t, (_, i) in zip(targets, indices)], dim=0)
        loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction="none")
        loss_giou = 1 - torch.diag(generalized_box_iou(box_cxcywh_to_xyxy(src_boxes),
                                                       box_cxcywh_to_xyxy(target_boxes)))  # fmt: skip
        return {"loss_bbox": loss_bbox.sum() / num_boxes, "loss_giou": loss_giou.sum() / num_boxes}

    @staticmethod
    def _get_src_permutation_idx(indices):
        batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        src_idx = torch.cat([src for (src, _) in indices])
        return batch_idx, src_idx

    def get_loss(self, loss, outputs, targets, indices, num_boxes, **kwargs):
        loss_map = {"labels": self.loss_labels, "cardinality": self.loss_cardinality, "boxes": self.loss_boxes}
        return loss_map[loss](outputs, targets, indices, num_boxes, **kwargs)

    def forward(self, outputs, targets):
        outputs_without_aux = {k: v for k, v in outputs.items() if k != "aux_outputs"}
        indices = self.matcher(outputs_without_aux, targets)
        num_boxes = sum(len(t["labels"]) for t in targets)
        num_boxes = torch.as_tensor([num_boxes], dtype=torch.float, device=next(iter(outputs.values())).device)
        num_boxes = torch.clamp(num_boxes, min=1).item()  # one process: world size 1
        losses = {}
        for loss in self.losses:
            losses.update(self.get_loss(loss, outputs, targets, indices, num_boxes))
        if "aux_outputs" in outputs:
            for i, aux_outputs in enumerate(outputs["aux_outputs"]):
                indices = self.matcher(aux_outputs, targets)
                for loss in self.losses:
                    kwargs = {"log": False} if loss == "labels" else {}
                    l_dict = self.get_loss(loss, aux_outputs, targets, indices, num_boxes, **kwargs)
                    losses.update({k + f"_{i}": v for k, v in l_dict.items()})
        return losses


class PostProcess(nn.Module):
    @torch.no_grad()
    def forward(self, outputs, target_sizes):
        out_logits, out_bbox = outputs["pred_logits"], outputs["pred_boxes"]
        prob = F.softmax(out_logits, -1)
        scores, labels = prob[..., :-1].max(-1)
        boxes = box_cxcywh_to_xyxy(out_bbox)
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        boxes = boxes * scale_fct[:, None, :]
        return [{"scores": s, "labels": lab, "boxes": b} for s, lab, b in zip(scores, labels, boxes)]


def build(args: dict, num_classes: int, backbone: nn.Module):
    transformer = Transformer(args["hidden_dim"], args["nheads"], args["enc_layers"], args["dec_layers"],
                              args["dim_feedforward"], args["dropout"])  # fmt: skip
    model = DETR(backbone, transformer, num_classes=num_classes, num_queries=args["num_queries"],
                 aux_loss=args["aux_loss"])  # fmt: skip
    matcher = HungarianMatcher(args["set_cost_class"], args["set_cost_bbox"], args["set_cost_giou"])
    weight_dict = {"loss_ce": 1, "loss_bbox": args["bbox_loss_coef"], "loss_giou": args["giou_loss_coef"]}
    if args["aux_loss"]:
        aux_weight_dict = {}
        for i in range(args["dec_layers"] - 1):
            aux_weight_dict.update({k + f"_{i}": v for k, v in weight_dict.items()})
        weight_dict.update(aux_weight_dict)
    criterion = SetCriterion(num_classes, matcher=matcher, weight_dict=weight_dict, eos_coef=args["eos_coef"],
                             losses=["labels", "boxes", "cardinality"])  # fmt: skip
    return model, criterion, {"bbox": PostProcess()}


# --------------------------------------------------------------------------- the data (COCO stand-in)


def make_scenes(n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Images (n, 3, IMG, IMG) in [0, 1], and per image its boxes (k, 4) as pixel corners
    (x0, y0, x1, y1) and their class ids (1-based, as COCO's category ids)."""
    rng = np.random.default_rng(seed)
    images = np.clip(0.45 + 0.1 * rng.standard_normal((n, 3, IMG, IMG)), 0, 1)
    all_boxes, all_ids = [], []
    for k in range(n):
        boxes, ids = [], []
        for _ in range(rng.integers(1, MAX_OBJECTS + 1)):
            for _try in range(30):
                w, h = rng.integers(IMG // BOX_MIN, IMG // BOX_MAX), rng.integers(IMG // BOX_MIN, IMG // BOX_MAX)
                x0, y0 = rng.integers(0, IMG - w + 1), rng.integers(0, IMG - h + 1)
                box = np.array([x0, y0, x0 + w, y0 + h], dtype=np.float32)
                if all(_overlap(box, b) < 0.1 for b in boxes):
                    break
            cls = int(rng.integers(NUM_IDS))
            colour = np.clip(COLOURS[cls] + 0.08 * rng.standard_normal(3), 0, 1)
            images[k, :, y0 : y0 + h, x0 : x0 + w] = colour[:, None, None]
            boxes.append(box)
            ids.append(cls + 1)
        all_boxes.append(np.stack(boxes))
        all_ids.append(np.array(ids, dtype=np.int64))
    return images.astype(np.float32), all_boxes, all_ids


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


class SceneDetection(Dataset):
    """``CocoDetection`` + ``ConvertCocoPolysToMask`` + ``T.Compose([T.ToTensor(), T.Normalize(...)])``:
    the image normalised with the ImageNet mean/std, the boxes from pixel corners to
    (cx, cy, w, h) divided by the image size (``normalize_boxes=False``: the bug, left in pixels)."""

    def __init__(self, images: np.ndarray, boxes: list, ids: list, normalize_boxes: bool = True) -> None:
        mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
        self.items = []
        for image, b, c in zip(images, boxes, ids):
            h, w = image.shape[-2:]
            img = (torch.from_numpy(image) - mean) / std
            target = {"boxes": torch.from_numpy(b), "labels": torch.from_numpy(c), "image_id": torch.tensor(len(self.items)),
                      "orig_size": torch.tensor([h, w]), "size": torch.tensor([h, w])}  # fmt: skip
            boxes_cxcywh = box_xyxy_to_cxcywh(target["boxes"])
            if normalize_boxes:
                boxes_cxcywh = boxes_cxcywh / torch.tensor([w, h, w, h], dtype=torch.float32)
            target["boxes"] = boxes_cxcywh
            self.items.append((img, target))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


# --------------------------------------------------------------------------- "pretrained" backbone


@functools.lru_cache(maxsize=4)
def pretrained_backbone_state(seed: int) -> dict[str, torch.Tensor]:
    """The stand-in for the ImageNet checkpoint: the ResNet (with ordinary BatchNorm) trained
    150 steps to tell which of the three colours an image holds, on images of their own."""
    gen_state = torch.get_rng_state()
    torch.manual_seed(10_000 + seed)
    images, _boxes, ids = make_scenes(N_PRETRAIN, seed + 5000)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x = (torch.from_numpy(images) - mean) / std
    y = torch.zeros(len(ids), NUM_IDS)
    for k, c in enumerate(ids):
        y[k, c - 1] = 1.0
    net = ResNet()
    head = nn.Linear(WIDTHS[-1], NUM_IDS)
    opt = torch.optim.SGD(list(net.parameters()) + list(head.parameters()), lr=0.05, momentum=0.9,
                          weight_decay=1e-4)  # fmt: skip
    net.train()
    for _step in range(PRETRAIN_STEPS):
        idx = torch.randint(0, len(x), (32,))
        loss = F.binary_cross_entropy_with_logits(head(net(x[idx]).mean((2, 3))), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_rng_state(gen_state)
    return {k: v.detach().clone() for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}


def build_backbone(seed: int, train_backbone: bool = True) -> Joiner:
    body = ResNet(norm_layer=FrozenBatchNorm2d)
    body.load_state_dict(pretrained_backbone_state(seed))
    backbone = BackboneBase(body, train_backbone, WIDTHS[-1])
    model = Joiner(backbone, PositionEmbeddingSine(ARGS["hidden_dim"] // 2, normalize=True))
    model.num_channels = backbone.num_channels
    return model


# --------------------------------------------------------------------------- the measure (evaluate's stand-in)


def average_precisions(detections: list[dict], truths: list[dict], iou_threshold: float = 0.5) -> dict[int, float]:
    """VOC all-point AP at one IoU threshold, per class id present in the truth."""
    aps = {}
    for cls in range(1, NUM_IDS + 1):
        gts = {i: t["boxes"][t["labels"] == cls] for i, t in enumerate(truths)}
        n_gt = sum(len(g) for g in gts.values())
        if n_gt == 0:
            continue
        used = {i: torch.zeros(len(g), dtype=torch.bool) for i, g in gts.items()}
        dets = [(float(s), i, b) for i, d in enumerate(detections)
                for s, lab, b in zip(d["scores"], d["labels"], d["boxes"]) if int(lab) == cls]  # fmt: skip
        dets.sort(key=lambda t: -t[0])
        tp = np.zeros(len(dets))
        for k, (_score, i, box) in enumerate(dets):
            if len(gts[i]) == 0:
                continue
            ious = box_iou(box[None], gts[i])[0][0]
            best = int(ious.argmax())
            if ious[best] >= iou_threshold and not used[i][best]:
                used[i][best] = True
                tp[k] = 1
        ctp, cfp = np.cumsum(tp), np.cumsum(1 - tp)
        recall = ctp / n_gt
        precision = ctp / np.maximum(ctp + cfp, 1e-9)
        mrec = np.concatenate(([0.0], recall, [1.0]))
        mpre = np.concatenate(([0.0], precision, [0.0]))
        for k in range(len(mpre) - 2, -1, -1):
            mpre[k] = max(mpre[k], mpre[k + 1])
        changed = np.where(mrec[1:] != mrec[:-1])[0]
        aps[cls] = float(np.sum((mrec[changed + 1] - mrec[changed]) * mpre[changed + 1]))
    return aps


def mean_average_precision(detections: list[dict], truths: list[dict], iou_threshold: float = 0.5) -> float:
    aps = average_precisions(detections, truths, iou_threshold)
    return float(np.mean(list(aps.values()))) if aps else 0.0


@torch.no_grad()
def detect(model: nn.Module, postprocessor: PostProcess, loader) -> list[dict]:
    model.eval()
    results = []
    for samples, targets in loader:
        outputs = model(samples)
        orig_target_sizes = torch.stack([t["orig_size"] for t in targets], dim=0)
        results.extend(postprocessor(outputs, orig_target_sizes))
    return results


# --------------------------------------------------------------------------- main.py / engine.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(42 + seed)
    np.random.seed(42 + seed)
    # build(): num_classes = max_id + 1 (the no-object slot after it); the bug: the count of classes
    num_classes = NUM_IDS if variant == "num_classes_without_background_slot" else NUM_IDS + 1
    normalize_boxes = variant != "boxes_not_normalized"

    model, criterion, postprocessors = build(args, num_classes, build_backbone(seed, args["lr_backbone"] > 0))
    param_dicts = [
        {"params": [p for n, p in model.named_parameters() if "backbone" not in n and p.requires_grad]},
        {"params": [p for n, p in model.named_parameters() if "backbone" in n and p.requires_grad],
         "lr": args["lr_backbone"]},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(param_dicts, lr=args["lr"], weight_decay=args["weight_decay"])
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args["lr_drop"])

    train_images, train_boxes, train_ids = make_scenes(N_TRAIN, seed)
    test_images, test_boxes, test_ids = make_scenes(N_TEST, seed + 1000)
    dataset_train = SceneDetection(train_images, train_boxes, train_ids, normalize_boxes)
    dataset_val = SceneDetection(test_images, test_boxes, test_ids, normalize_boxes)
    sampler_train = RandomSampler(dataset_train, generator=torch.Generator().manual_seed(seed))
    batch_sampler_train = BatchSampler(sampler_train, args["batch_size"], drop_last=True)
    data_loader_train = DataLoader(dataset_train, batch_sampler=batch_sampler_train, collate_fn=collate_fn)
    data_loader_val = DataLoader(dataset_val, args["batch_size"], shuffle=False, collate_fn=collate_fn)
    weight_dict = criterion.weight_dict

    def detr_loss(outputs, targets):
        loss_dict = criterion(outputs, targets)
        return sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)

    probe_batch = collate_fn([dataset_train[i] for i in range(args["batch_size"])])
    nx.preflight(model, probe_batch, detr_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    def train_one_epoch(max_norm: float) -> float:
        model.train()
        criterion.train()
        epoch_losses = []
        for samples, targets in data_loader_train:
            outputs = model(samples)
            loss_dict = criterion(outputs, targets)
            losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)
            loss_value = losses.item()
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"Loss is {loss_value}, stopping training")  # the program's sys.exit(1)
            optimizer.zero_grad()
            losses.backward()
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            nx.timed(lambda: mon.log(losses))  # noqa: B023
            epoch_losses.append(loss_value)
        return float(np.mean(epoch_losses))

    train_loss = float("nan")
    for _epoch in range(args["epochs"]):
        train_loss = train_one_epoch(args["clip_max_norm"])
        lr_scheduler.step()

    nx.finish(mon, model, probe_batch, detr_loss, optimizer=optimizer)
    # measure: the held-out detections, boxes scored in pixels against the annotations' corners
    results = detect(model, postprocessors["bbox"], data_loader_val)
    truths = [{"boxes": torch.from_numpy(b), "labels": torch.from_numpy(c)} for b, c in zip(test_boxes, test_ids)]
    test_aps = average_precisions(results, truths)
    train_results = detect(model, postprocessors["bbox"], DataLoader(
        torch.utils.data.Subset(dataset_train, range(128)), args["batch_size"], collate_fn=collate_fn))
    train_truths = [{"boxes": torch.from_numpy(b), "labels": torch.from_numpy(c)}
                    for b, c in zip(train_boxes[:128], train_ids[:128])]  # fmt: skip
    return {"test_map": float(np.mean(list(test_aps.values()))), "test_ap_id3": test_aps.get(3, 0.0),
            "train_map": mean_average_precision(train_results, train_truths), "train_loss": train_loss}  # fmt: skip
