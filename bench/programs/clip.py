"""Port of moein-shariatnia/OpenAI-CLIP: a simple CLIP, an image encoder and a text encoder, each
followed by a projection head, trained with a symmetric cross-entropy over text-image logits.

Source: github.com/moein-shariatnia/OpenAI-CLIP, ``CLIP.py``, ``modules.py``, ``main.py``,
``utils.py`` and the training cells of ``OpenAI CLIP Simple Implementation.ipynb`` at commit
73fea1f9b71a4982997ea4c75070a845b547abef (MIT, Copyright (c) 2021 Moein Shariatnia). Written anew
from the facts of those files; no code copied.

Kept: ``CLIPModel`` (``ImageEncoder`` = a CNN with global average pooling and no classifier,
``num_classes=0``; ``TextEncoder`` = a ``DistilBertModel`` whose first token's last hidden state
(``target_token_idx = 0``) is the sentence embedding; two ``ProjectionHead``s: Linear ->
GELU -> Linear -> Dropout(0.1), plus the first projection as a residual, then LayerNorm); the
forward's loss: ``logits = text_emb @ image_emb.T / temperature``, the row-wise ``cross_entropy``
(``-targets * log_softmax``) of ``logits`` and of ``logits.T`` against ``targets.T``, averaged, then
``.mean()``; temperature 1.0. One change, in the healthy program only: the published soft targets
``softmax((image_sim + text_sim) / 2 * temperature)`` are replaced by the identity (each caption's
own image), the fix asked for in the repository's issues #16 and #27 (merged upstream later, after
this commit): with encoders trained from scratch the published targets collapse every embedding
(retrieval at chance here), so they are the ``soft_targets`` bug. ``main.py`` with ``config.py``:
one ``AdamW(model.parameters(), lr=1e-3, weight_decay=1e-3)``, ``ReduceLROnPlateau(mode="min",
patience=2, factor=0.5)`` stepped on the validation loss after each epoch (``step = "epoch"``),
``pretrained = False``; ``trainable = True`` as in the notebook (``config.py``'s ``False`` is the
``encoders_not_trainable`` bug); ``train_epoch`` (``loss = model(batch)``, ``zero_grad``,
``backward``, ``step``, an ``AvgMeter`` of the loss), ``valid_epoch`` under ``model.eval()`` and
``no_grad``, ``model.train()`` before each epoch, the best validation loss kept (the state dict in
memory instead of ``best.pt``); the train loader shuffled, the validation loader not; captions
tokenised with padding to the longest and an attention mask.
Shrunk: synthetic paired data instead of Flickr-8k: each pair has 4 attributes of 4 values
(256 combinations); the image (3x16x16) is the sum of one random smooth pattern per attribute value
plus noise, the caption ``[CLS]`` and the 4 attribute words in a random order with 0-3 filler words
between them (vocabulary 26); 1,024 training pairs, 256 validation pairs (the split of ``main``'s
``make_train_valid_dfs``, 80/20). A 3-layer CNN (conv-BN-ReLU x 3, widths 16/32/64, average
pooled: 64 features) instead of timm's ResNet-50 (2,048); DistilBERT with 2 layers, width 32,
2 heads, FFN 64 instead of 6/768/12/3072 (``text_embedding`` 32); ``projection_dim`` 32 instead of
256; batch 32 instead of 8, 4 epochs instead of 5.

Measure only (not in the program): text-to-image and image-to-text top-1 retrieval on the
validation pairs with the l2-normalised projections (``find_matches``' similarity), a hit when the
retrieved item has the query's attribute combination; ``retrieval`` is their mean.

nndx, as the author would add it: a preflight ``nndx.probe`` on the ``CLIPModel`` with the first
training batch (the batch dict as the model's one positional input) and a loss function returning the model's output (its
forward returns the loss), ``nndx.Monitor(model, optimizer)`` around the epochs with each step's
loss logged, then ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "clip"
SOURCE = Source("moein-shariatnia/OpenAI-CLIP", "CLIP.py", "73fea1f9b71a4982997ea4c75070a845b547abef", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published with its loss fixed as issues #16/#27 ask (identity targets), "
                "main.py's optimizer and schedule, trainable encoders (shrunk)"),
        Variant(
            "soft_targets",
            "the loss as published: soft targets softmax((image_sim + text_sim) / 2 * temperature) computed "
            "from the model's own embeddings instead of each caption's own image; the loss is minimised by "
            "making every embedding alike",
            (C.WRONG_LOSS,),
            ("https://github.com/moein-shariatnia/OpenAI-CLIP/issues/27",
             "https://github.com/moein-shariatnia/OpenAI-CLIP/issues/16",
             "https://github.com/moein-shariatnia/OpenAI-CLIP/pull/25"),
            Measure("retrieval", "held-out top-1 retrieval (mean of both directions) at least 0.05 below the "
                    "healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "encoders_not_trainable",
            "CFG.trainable = False (the value in the repository's config.py, next to pretrained = False): every encoder parameter has requires_grad=False, only the projection heads learn, "
            "on random features",
            (C.FROZEN_PARAMETERS,),
            ("https://github.com/KaiyangZhou/CoOp/issues/7",
             "https://github.com/edreisMD/ConVIRT-pytorch/issues/7",
             "https://github.com/mlfoundations/open_clip/issues/17"),
            Measure("retrieval", "held-out top-1 retrieval (mean of both directions) at least 0.05 below the "
                    "healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}


class CFG:
    batch_size = 32
    lr = 1e-3
    weight_decay = 1e-3
    patience = 2
    factor = 0.5
    epochs = 4
    image_embedding = 64
    text_embedding = 32
    pretrained = False  # nothing can be downloaded here
    trainable = True
    temperature = 1.0
    size = 16
    projection_dim = 32
    dropout = 0.1


# --------------------------------------------------------------------------- synthetic pairs (stand-in for Flickr-8k)

N_ATTR, N_VALUES, N_FILLER = 4, 4, 8
PAD, CLS = 0, 1
VOCAB = 2 + N_ATTR * N_VALUES + N_FILLER
N_TRAIN, N_VALID = 1024, 256


def make_pairs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images (N, 3, 16, 16), input_ids (N, L), attention_mask (N, L), combos (N,))."""
    rng = np.random.default_rng(1_000 + seed)
    n = N_TRAIN + N_VALID
    raw = rng.normal(size=(N_ATTR, N_VALUES, 3, 6, 6)).astype(np.float32)
    patterns = F.interpolate(torch.from_numpy(raw.reshape(-1, 3, 6, 6)), size=(CFG.size, CFG.size), mode="bicubic",
                             align_corners=False).reshape(N_ATTR, N_VALUES, 3, CFG.size, CFG.size)  # fmt: skip
    values = rng.integers(0, N_VALUES, size=(n, N_ATTR))
    images = sum(patterns[a][torch.from_numpy(values[:, a])] for a in range(N_ATTR))
    images = images + 0.5 * torch.from_numpy(rng.normal(size=images.shape).astype(np.float32))
    captions = []
    for row in values:
        words = [2 + a * N_VALUES + int(v) for a, v in enumerate(row)]
        rng.shuffle(words)
        caption = [CLS]
        for w in words:
            caption += [2 + N_ATTR * N_VALUES + int(f) for f in rng.integers(0, N_FILLER, size=rng.integers(0, 4))]
            caption.append(w)
        captions.append(caption)
    length = max(len(c) for c in captions)  # padding=True: to the longest
    input_ids = torch.full((n, length), PAD, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    for i, c in enumerate(captions):
        input_ids[i, : len(c)] = torch.tensor(c)
        attention_mask[i, : len(c)] = 1
    combos = torch.from_numpy((values * (N_VALUES ** np.arange(N_ATTR))).sum(1))
    return images, input_ids, attention_mask, combos


class CLIPDataset(Dataset):
    def __init__(self, images, input_ids, attention_mask) -> None:
        self.images, self.input_ids, self.attention_mask = images, input_ids, attention_mask

    def __getitem__(self, idx: int) -> dict:
        return {"input_ids": self.input_ids[idx], "attention_mask": self.attention_mask[idx], "image": self.images[idx]}

    def __len__(self) -> int:
        return len(self.input_ids)


# --------------------------------------------------------------------------- modules.py


class ImageEncoder(nn.Module):
    """A CNN with global average pooling and no classifier (timm's ``num_classes=0``)."""

    def __init__(self, pretrained: bool = CFG.pretrained, trainable: bool = CFG.trainable) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        for p in self.model.parameters():
            p.requires_grad = trainable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class TextEncoder(nn.Module):
    def __init__(self, pretrained: bool = CFG.pretrained, trainable: bool = CFG.trainable) -> None:
        super().__init__()
        from transformers import DistilBertConfig, DistilBertModel

        config = DistilBertConfig(vocab_size=VOCAB, max_position_embeddings=32, n_layers=2, n_heads=2,
                                  dim=CFG.text_embedding, hidden_dim=64, pad_token_id=PAD)  # fmt: skip
        self.model = DistilBertModel(config=config)
        for p in self.model.parameters():
            p.requires_grad = trainable
        self.target_token_idx = 0  # the CLS token's hidden state is the sentence's embedding

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        output = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return output.last_hidden_state[:, self.target_token_idx, :]


class ProjectionHead(nn.Module):
    def __init__(self, embedding_dim: int, projection_dim: int = CFG.projection_dim, dropout: float = CFG.dropout):
        super().__init__()
        self.projection = nn.Linear(embedding_dim, projection_dim)
        self.gelu = nn.GELU()
        self.fc = nn.Linear(projection_dim, projection_dim)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(projection_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = self.projection(x)
        x = self.fc(self.gelu(projected))
        x = self.dropout(x) + projected
        return self.layer_norm(x)


# --------------------------------------------------------------------------- CLIP.py


def cross_entropy(preds: torch.Tensor, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    loss = (-targets * nn.LogSoftmax(dim=-1)(preds)).sum(1)
    return loss if reduction == "none" else loss.mean()


class CLIPModel(nn.Module):
    def __init__(self, temperature: float = CFG.temperature, image_embedding: int = CFG.image_embedding,
                 text_embedding: int = CFG.text_embedding, trainable: bool = CFG.trainable,
                 soft_targets: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.soft_targets = soft_targets
        self.image_encoder = ImageEncoder(trainable=trainable)
        self.text_encoder = TextEncoder(trainable=trainable)
        self.image_projection = ProjectionHead(embedding_dim=image_embedding)
        self.text_projection = ProjectionHead(embedding_dim=text_embedding)
        self.temperature = temperature

    def embed(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        image_features = self.image_encoder(batch["image"])
        text_features = self.text_encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return self.image_projection(image_features), self.text_projection(text_features)

    def forward(self, batch: dict) -> torch.Tensor:
        image_embeddings, text_embeddings = self.embed(batch)
        logits = (text_embeddings @ image_embeddings.T) / self.temperature
        if self.soft_targets:  # the bug: the published soft targets
            images_similarity = image_embeddings @ image_embeddings.T
            texts_similarity = text_embeddings @ text_embeddings.T
            targets = F.softmax((images_similarity + texts_similarity) / 2 * self.temperature, dim=-1)
        else:  # issue #16/#27's fix: each caption's own image is its one positive (the paper's identity targets)
            targets = torch.eye(len(logits), dtype=logits.dtype)
        texts_loss = cross_entropy(logits, targets, reduction="none")
        images_loss = cross_entropy(logits.T, targets.T, reduction="none")
        loss = (images_loss + texts_loss) / 2.0  # shape: (batch_size)
        return loss.mean()


# --------------------------------------------------------------------------- utils.py + main.py


class AvgMeter:
    def __init__(self, name: str = "Metric") -> None:
        self.name = name
        self.avg, self.sum, self.count = 0.0, 0.0, 0

    def update(self, val: float, count: int = 1) -> None:
        self.count += count
        self.sum += val * count
        self.avg = self.sum / self.count


def get_lr(optimizer) -> float:
    return optimizer.param_groups[0]["lr"]


def train_epoch(model, train_loader, optimizer, lr_scheduler, step: str, mon, zero_grad: bool) -> AvgMeter:
    loss_meter = AvgMeter()
    for batch in train_loader:
        loss = model(batch)
        if zero_grad:
            optimizer.zero_grad()  # the bug: this line left out
        loss.backward()
        optimizer.step()
        if step == "batch":
            lr_scheduler.step()
        mon.log(loss)
        loss_meter.update(loss.item(), batch["image"].size(0))
    return loss_meter


def valid_epoch(model, valid_loader) -> AvgMeter:
    loss_meter = AvgMeter()
    for batch in valid_loader:
        loss = model(batch)
        loss_meter.update(loss.item(), batch["image"].size(0))
    return loss_meter


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def retrieval(model: CLIPModel, dataset: CLIPDataset, combos: torch.Tensor) -> tuple[float, float]:
    model.eval()
    image_embeddings, text_embeddings = model.embed(
        {"image": dataset.images, "input_ids": dataset.input_ids, "attention_mask": dataset.attention_mask})
    image_n, text_n = F.normalize(image_embeddings, p=2, dim=-1), F.normalize(text_embeddings, p=2, dim=-1)
    sim = text_n @ image_n.T
    t2i = float((combos[sim.argmax(1)] == combos).float().mean())
    i2t = float((combos[sim.argmax(0)] == combos).float().mean())
    return t2i, i2t


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    images, input_ids, attention_mask, combos = make_pairs(seed)
    train_ds = CLIPDataset(images[:N_TRAIN], input_ids[:N_TRAIN], attention_mask[:N_TRAIN])
    valid_ds = CLIPDataset(images[N_TRAIN:], input_ids[N_TRAIN:], attention_mask[N_TRAIN:])
    train_loader = DataLoader(train_ds, batch_size=CFG.batch_size, shuffle=True)
    valid_loader = DataLoader(valid_ds, batch_size=CFG.batch_size, shuffle=False)

    model = CLIPModel(trainable=variant != "encoders_not_trainable", soft_targets=variant == "soft_targets")
    optimizer = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=CFG.weight_decay)
    lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", patience=CFG.patience,
                                                              factor=CFG.factor)  # fmt: skip
    step = "epoch"

    def clip_loss(loss: torch.Tensor, _target) -> torch.Tensor:
        return loss  # the model's forward returns the loss itself

    probe_batch = ((train_ds[list(range(CFG.batch_size))],), None)  # the forward takes the batch dict
    nx.preflight(model, probe_batch, clip_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    best_loss, best_state = float("inf"), None
    train_losses, valid_losses = [], []
    for _epoch in range(CFG.epochs):
        model.train()
        train_loss = train_epoch(model, train_loader, optimizer, lr_scheduler, step, mon,
                                 zero_grad=variant != "missing_zero_grad")  # fmt: skip
        model.eval()
        with torch.no_grad():
            valid_loss = valid_epoch(model, valid_loader)
        if valid_loss.avg < best_loss:
            best_loss = valid_loss.avg
            best_state = copy.deepcopy(model.state_dict())  # torch.save(..., "best.pt")
        lr_scheduler.step(valid_loss.avg)
        train_losses.append(train_loss.avg)
        valid_losses.append(valid_loss.avg)
    nx.finish(mon, model, probe_batch, clip_loss, optimizer=optimizer)

    t2i, i2t = retrieval(model, valid_ds, combos[N_TRAIN:])
    return {
        "first_train_loss": train_losses[0],
        "final_train_loss": train_losses[-1],
        "best_valid_loss": best_loss,
        "t2i": t2i,
        "i2t": i2t,
        "retrieval": (t2i + i2t) / 2,
        "kept_best": float(best_state is not None),
    }
