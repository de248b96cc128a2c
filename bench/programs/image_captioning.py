"""Port of sgrvinod's a-PyTorch-Tutorial-to-Image-Captioning: "Show, Attend and Tell", a CNN
encoder, an LSTMCell decoder with soft attention over the image's pixels, teacher forcing,
``pack_padded_sequence`` on the scores and targets, doubly stochastic attention
regularisation and gradient clipping.

Source: github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning, ``train.py``,
``models.py``, ``utils.py``, ``datasets.py`` and ``eval.py`` at commit
cc9c7e2f4017938d414178d3781fed8dbe442852 (the repository's HEAD; MIT, Copyright (c) 2018
Sagar Vinodababu). Written anew from the facts of those files; no code copied.

Kept: ``Encoder``: a ResNet without its pool and fc (``children()[:-2]`` as an
``nn.Sequential``), ``AdaptiveAvgPool2d((enc_image_size, enc_image_size))``, the output
permuted to (batch, size, size, encoder_dim); ``fine_tune``: every parameter frozen, then
``children()[5:]`` (the last three stages) given ``requires_grad = fine_tune``;
``Attention``: ``encoder_att``/``decoder_att`` Linears to ``attention_dim``, ``full_att``
to 1 after a ReLU of their sum, ``Softmax(dim=1)`` over the pixels, the weighted sum of the
encoder's pixels; ``DecoderWithAttention``: ``Embedding``, ``Dropout(0.5)``,
``LSTMCell(embed_dim + encoder_dim, decoder_dim)``, ``init_h``/``init_c`` from the mean
encoder pixel, the sigmoid gate ``f_beta``, ``fc`` to the vocabulary, ``init_weights``
(embedding and fc uniform +-0.1, fc bias 0); ``forward``: the batch sorted by caption
length (longest first), ``decode_lengths = caption_lengths - 1``, per time step only the
``batch_size_t`` captions still running, the predictions and alphas stored into zero
tensors, ``(predictions, encoded_captions, decode_lengths, alphas, sort_ind)`` returned.
``train``: ``encoder(imgs)``, the decoder, ``targets = caps_sorted[:, 1:]``,
``pack_padded_sequence(..., batch_first=True)`` of scores and targets (``.data``: the
``scores, _ = ...`` unpacking of the original fails on PyTorch >= 1.1, its issue #86),
``CrossEntropyLoss``, ``+ alpha_c * ((1 - alphas.sum(dim=1)) ** 2).mean()`` (alpha_c = 1),
both optimizers' ``zero_grad``, ``backward``, ``clip_gradient`` (each gradient clamped to
+-``grad_clip`` = 5), both ``step``s, the ``AverageMeter``s of the loss and the top-5
accuracy (``utils.accuracy``) weighted by ``sum(decode_lengths)``, a progress record every
``print_freq`` batches; ``validate``: ``decoder.eval()``/``encoder.eval()``,
``torch.no_grad()``, the same teacher-forced loss, the references (``allcaps`` re-ordered by
``sort_ind``, ``<start>``/``<pad>`` removed) and the hypotheses (the argmax of the scores
cut at each decode length), ``corpus_bleu`` (written out: nltk's default BLEU-4, uniform
weights, no smoothing, the closest reference length for the brevity penalty); ``main``:
``Adam(decoder_lr=4e-4)`` over the decoder's trainable parameters, the encoder's
``Adam(encoder_lr=1e-4)`` when ``fine_tune_encoder``, the epoch loop with
``adjust_learning_rate(0.8)`` after every 8 epochs without a better BLEU-4 and the stop after
20, ``best_bleu4`` and the best checkpoint (kept in memory, not ``torch.save``d);
``CaptionDataset``: ``captions_per_image`` captions per image (the Nth caption is image
N // cpi), pixels / 255 then ``Normalize`` with the ImageNet mean/std, ``allcaps`` for
validation; the word map of ``create_input_files`` (the words in order of appearance, ids
from 1, then ``<unk>``, ``<start>``, ``<end>``, ``<pad>`` = 0), captions encoded as
``<start>`` + words + ``<end>`` + pads, caption length = words + 2.
Changed because there is no ImageNet ResNet-101 here: the encoder is a small randomly
initialised ResNet-like CNN (conv 7x7/2 + BN + ReLU + max-pool 3/2, then four stages of one
BasicBlock each, widths 16/32/32/64, strides 1/2/1/1: eight children, so ``children()[5:]``
is still the last three stages) and ``fine_tune_encoder = True`` (the tutorial's second
phase) from the start, since an untrained encoder must be trained.
Shrunk: synthetic 32x32 images instead of MS-COCO at 256x256: one or two coloured shapes
(red/green/blue/yellow; square/cross/line) in the left and/or right half, slightly jittered
and noised; captions_per_image 2 instead of 5 ("a red square on the left and a blue line on
the right", and the objects named in the other order, or with "the" for a lone object);
600 train, 100 val and 100 test images; enc_image_size 4 instead of 14; encoder_dim 64
instead of 2048; emb_dim/attention_dim/decoder_dim 32/32/64 instead of 512; batch_size 32
(kept); 8 epochs instead of 120; decoder_lr 2e-3 and encoder_lr 5e-4 instead of 4e-4/1e-4
(the shrunk run has 300 steps, not hundreds of thousands); no checkpoint files.
Measure only (not in the program): ``eval.py`` at beam size 1 (greedy decoding from
``<start>`` until ``<end>`` or 50 steps, without teacher forcing; ``<start>``, ``<end>``,
``<pad>`` removed from hypotheses and references) on the test images, its corpus BLEU-4.

nndx, as the author would add it: nndx's probe takes one model, so a small ``Captioner``
holding ``encoder`` and ``decoder`` (forward = ``decoder(encoder(imgs), caps, caplens)``)
and ``train``'s loss as a function of its output and the captions (targets = the captions
re-ordered by ``sort_ind``, shifted by one, packed; CE + the attention regulariser); a
preflight ``nndx.probe`` on the first training batch (``((imgs, caps, caplens), caps)``)
with no optimizer (there are two, and probe takes one); ``nndx.Monitor({"encoder": ...,
"decoder": ...}, [decoder_optimizer, encoder_optimizer])`` around the epochs with
``criterion`` called as ``mon.loss_fn`` on the packed scores and targets, each batch's loss
logged with its top-5 accuracy, each ``validate``'s loss and top-5 accuracy logged as
``split="val"``; then ``nndx.probe(captioner, ..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "image_captioning"
SOURCE = Source("sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning", "train.py",
                "cc9c7e2f4017938d414178d3781fed8dbe442852", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (fine_tune_encoder = True, random-init encoder)"),
        Variant(
            "targets_not_shifted",
            "targets = caps_sorted[:, :-1] instead of caps_sorted[:, 1:]: at each step the target is the word the "
            "decoder was just fed, so it learns to copy its input (the loss falls toward 0) instead of predicting "
            "the next word",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/172",
             "https://github.com/yunjey/pytorch-tutorial/issues/101",
             "https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning/issues/94"),
            Measure("test_bleu4", "greedy-decoded test BLEU-4 (eval.py, beam 1) at least 0.2 below the healthy run's: "
                    "0.048/0.043/0.031 against 0.740/0.785/0.776 healthy on seeds 0-2 (while validate()'s "
                    "teacher-forced BLEU-4 is higher: 0.87/0.86/0.88 against 0.75/0.81/0.78)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "encoder_under_no_grad",
            "imgs = encoder(imgs) run inside torch.no_grad() in train() while fine_tune_encoder is on: the encoder's "
            "features are cut from the graph, its trainable stages get no gradient and its optimizer never moves them",
            (C.DETACHED_GRAPH, C.FROZEN_PARAMETERS),
            ("https://github.com/TinyLLaVA/TinyLLaVA_Factory/issues/17",
             "https://github.com/mlfoundations/open_flamingo/issues/253",
             "https://github.com/mazurowski-lab/finetune-SAM/issues/5"),
            Measure("test_bleu4", "greedy-decoded test BLEU-4 (eval.py, beam 1) at least 0.1 below the healthy run's: "
                    "0.595/0.538/0.612 against 0.740/0.785/0.776 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

# the parameters of train.py, shrunk
emb_dim, attention_dim, decoder_dim, dropout = 32, 32, 64, 0.5
encoded_image_size, encoder_dim = 4, 64
epochs, batch_size = 8, 32
encoder_lr, decoder_lr = 5e-4, 2e-3
grad_clip, alpha_c, print_freq = 5.0, 1.0, 10
fine_tune_encoder = True
captions_per_image, min_word_freq = 2, 0
N_TRAIN, N_VAL, N_TEST, SIDE = 600, 100, 100, 32
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

COLOURS = {"red": (1.0, 0.1, 0.1), "green": (0.1, 0.9, 0.1), "blue": (0.15, 0.25, 1.0), "yellow": (1.0, 0.9, 0.1)}
SHAPES = ("square", "cross", "line")


# --------------------------------------------------------------------------- the data (create_input_files + CaptionDataset)


def _draw(img: np.ndarray, shape: str, colour: tuple[float, float, float], cy: int, cx: int) -> None:
    mask = np.zeros(img.shape[1:], dtype=bool)
    if shape == "square":
        mask[cy - 3 : cy + 3, cx - 3 : cx + 3] = True
    elif shape == "cross":
        mask[cy - 4 : cy + 5, cx - 1 : cx + 1] = True
        mask[cy - 1 : cy + 1, cx - 4 : cx + 5] = True
    else:  # a horizontal line
        mask[cy - 1 : cy + 1, cx - 5 : cx + 5] = True
    for ch in range(3):
        img[ch][mask] = colour[ch]


def make_split(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[list[list[str]]]]:
    """n images (uint8, (n, 3, SIDE, SIDE)) and, per image, captions_per_image tokenised captions."""
    images = np.zeros((n, 3, SIDE, SIDE), dtype=np.uint8)
    captions = []
    for i in range(n):
        img = rng.uniform(0.0, 0.15, size=(3, SIDE, SIDE))
        slots = [["left"], ["right"], ["left", "right"]][rng.integers(3)]
        objects = []
        for slot in slots:
            colour, shape = list(COLOURS)[rng.integers(4)], SHAPES[rng.integers(3)]
            cx = (8 if slot == "left" else 24) + int(rng.integers(-2, 3))
            cy = 16 + int(rng.integers(-6, 7))
            _draw(img, shape, COLOURS[colour], cy, cx)
            objects.append(["a", colour, shape, "on", "the", slot])
        images[i] = np.round(np.clip(img, 0, 1) * 255).astype(np.uint8)
        if len(objects) == 1:
            caps = [objects[0], ["the"] + objects[0][1:]]
        else:
            caps = [objects[0] + ["and"] + objects[1], objects[1] + ["and"] + objects[0]]
        captions.append(caps)
    return images, captions


def build_word_map(train_captions: list[list[list[str]]]) -> dict[str, int]:
    word_freq: Counter[str] = Counter()
    for caps in train_captions:
        for c in caps:
            word_freq.update(c)
    words = [w for w in word_freq.keys() if word_freq[w] > min_word_freq]
    word_map = {k: v + 1 for v, k in enumerate(words)}
    word_map["<unk>"] = len(word_map) + 1
    word_map["<start>"] = len(word_map) + 1
    word_map["<end>"] = len(word_map) + 1
    word_map["<pad>"] = 0
    return word_map


def encode(captions: list[list[list[str]]], word_map: dict[str, int], max_len: int) -> tuple[list, list]:
    enc_captions, caplens = [], []
    for caps in captions:
        for c in caps:
            enc_c = ([word_map["<start>"]] + [word_map.get(w, word_map["<unk>"]) for w in c] + [word_map["<end>"]]
                     + [word_map["<pad>"]] * (max_len - len(c)))  # fmt: skip
            enc_captions.append(enc_c)
            caplens.append(len(c) + 2)
    return enc_captions, caplens


class CaptionDataset(Dataset):
    def __init__(self, images: np.ndarray, captions: list, caplens: list, split: str) -> None:
        self.split, self.imgs, self.captions, self.caplens = split, images, captions, caplens
        self.cpi = captions_per_image
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
        self.dataset_size = len(self.captions)

    def __getitem__(self, i: int):
        img = torch.FloatTensor(self.imgs[i // self.cpi] / 255.0)
        img = (img - self.mean) / self.std  # transforms.Normalize
        caption = torch.LongTensor(self.captions[i])
        caplen = torch.LongTensor([self.caplens[i]])
        if self.split == "TRAIN":
            return img, caption, caplen
        start = (i // self.cpi) * self.cpi
        all_captions = torch.LongTensor(self.captions[start : start + self.cpi])
        return img, caption, caplen, all_captions

    def __len__(self) -> int:
        return self.dataset_size


# --------------------------------------------------------------------------- models.py


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


def small_resnet() -> nn.Sequential:
    """The stand-in for ``torchvision.models.resnet101(pretrained=True)``: a randomly
    initialised ResNet-like CNN with the same children layout (the last two are dropped)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 32), BasicBlock(32, encoder_dim),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(encoder_dim, 1000),
    )  # fmt: skip


class Encoder(nn.Module):
    def __init__(self, encoded_image_size: int = 14) -> None:
        super().__init__()
        self.enc_image_size = encoded_image_size
        resnet = small_resnet()
        modules = list(resnet.children())[:-2]  # no linear and pool layers
        self.resnet = nn.Sequential(*modules)
        self.adaptive_pool = nn.AdaptiveAvgPool2d((encoded_image_size, encoded_image_size))
        self.fine_tune()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.resnet(images)
        out = self.adaptive_pool(out)
        return out.permute(0, 2, 3, 1)

    def fine_tune(self, fine_tune: bool = True) -> None:
        for p in self.resnet.parameters():
            p.requires_grad = False
        for c in list(self.resnet.children())[5:]:
            for p in c.parameters():
                p.requires_grad = fine_tune


class Attention(nn.Module):
    def __init__(self, encoder_dim: int, decoder_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.encoder_att = nn.Linear(encoder_dim, attention_dim)
        self.decoder_att = nn.Linear(decoder_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)
        self.relu = nn.ReLU()
        self.softmax = nn.Softmax(dim=1)

    def forward(self, encoder_out: torch.Tensor, decoder_hidden: torch.Tensor):
        att1 = self.encoder_att(encoder_out)
        att2 = self.decoder_att(decoder_hidden)
        att = self.full_att(self.relu(att1 + att2.unsqueeze(1))).squeeze(2)
        alpha = self.softmax(att)
        attention_weighted_encoding = (encoder_out * alpha.unsqueeze(2)).sum(dim=1)
        return attention_weighted_encoding, alpha


class DecoderWithAttention(nn.Module):
    def __init__(self, attention_dim: int, embed_dim: int, decoder_dim: int, vocab_size: int,
                 encoder_dim: int = 2048, dropout: float = 0.5) -> None:  # fmt: skip
        super().__init__()
        self.encoder_dim, self.attention_dim, self.embed_dim = encoder_dim, attention_dim, embed_dim
        self.decoder_dim, self.vocab_size = decoder_dim, vocab_size
        self.attention = Attention(encoder_dim, decoder_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(p=dropout)
        self.decode_step = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim, bias=True)
        self.init_h = nn.Linear(encoder_dim, decoder_dim)
        self.init_c = nn.Linear(encoder_dim, decoder_dim)
        self.f_beta = nn.Linear(decoder_dim, encoder_dim)
        self.sigmoid = nn.Sigmoid()
        self.fc = nn.Linear(decoder_dim, vocab_size)
        self.init_weights()

    def init_weights(self) -> None:
        self.embedding.weight.data.uniform_(-0.1, 0.1)
        self.fc.bias.data.fill_(0)
        self.fc.weight.data.uniform_(-0.1, 0.1)

    def init_hidden_state(self, encoder_out: torch.Tensor):
        mean_encoder_out = encoder_out.mean(dim=1)
        return self.init_h(mean_encoder_out), self.init_c(mean_encoder_out)

    def forward(self, encoder_out: torch.Tensor, encoded_captions: torch.Tensor, caption_lengths: torch.Tensor):
        batch_size = encoder_out.size(0)
        encoder_dim = encoder_out.size(-1)
        vocab_size = self.vocab_size
        encoder_out = encoder_out.view(batch_size, -1, encoder_dim)  # flatten the image
        num_pixels = encoder_out.size(1)

        caption_lengths, sort_ind = caption_lengths.squeeze(1).sort(dim=0, descending=True)
        encoder_out = encoder_out[sort_ind]
        encoded_captions = encoded_captions[sort_ind]
        embeddings = self.embedding(encoded_captions)
        h, c = self.init_hidden_state(encoder_out)
        decode_lengths = (caption_lengths - 1).tolist()  # no decoding at the <end> position

        predictions = torch.zeros(batch_size, max(decode_lengths), vocab_size)
        alphas = torch.zeros(batch_size, max(decode_lengths), num_pixels)
        for t in range(max(decode_lengths)):
            batch_size_t = sum([length > t for length in decode_lengths])
            attention_weighted_encoding, alpha = self.attention(encoder_out[:batch_size_t], h[:batch_size_t])
            gate = self.sigmoid(self.f_beta(h[:batch_size_t]))
            attention_weighted_encoding = gate * attention_weighted_encoding
            h, c = self.decode_step(torch.cat([embeddings[:batch_size_t, t, :], attention_weighted_encoding], dim=1),
                                    (h[:batch_size_t], c[:batch_size_t]))  # fmt: skip
            preds = self.fc(self.dropout(h))
            predictions[:batch_size_t, t, :] = preds
            alphas[:batch_size_t, t, :] = alpha
        return predictions, encoded_captions, decode_lengths, alphas, sort_ind


class Captioner(nn.Module):
    """What the author hands nndx's probe: the encoder and the teacher-forced decoder as one model."""

    def __init__(self, encoder: Encoder, decoder: DecoderWithAttention) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, imgs: torch.Tensor, caps: torch.Tensor, caplens: torch.Tensor):
        return self.decoder(self.encoder(imgs), caps, caplens)


# --------------------------------------------------------------------------- utils.py


def clip_gradient(optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.data.clamp_(-grad_clip, grad_clip)


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def adjust_learning_rate(optimizer: torch.optim.Optimizer, shrink_factor: float) -> None:
    for param_group in optimizer.param_groups:
        param_group["lr"] = param_group["lr"] * shrink_factor


def accuracy(scores: torch.Tensor, targets: torch.Tensor, k: int) -> float:
    batch_size = targets.size(0)
    _, ind = scores.topk(k, 1, True, True)
    correct = ind.eq(targets.view(-1, 1).expand_as(ind))
    return correct.view(-1).float().sum().item() * (100.0 / batch_size)


def corpus_bleu(references: list[list[list[int]]], hypotheses: list[list[int]], max_n: int = 4) -> float:
    """nltk's ``corpus_bleu`` with its defaults: uniform weights over 1..4-grams, clipped counts
    pooled over the corpus, the closest reference length for the brevity penalty, no smoothing
    (0 when some n-gram order has no match)."""
    numerators, denominators = [0] * max_n, [0] * max_n
    hyp_len = ref_len = 0
    for refs, hyp in zip(references, hypotheses):
        for n in range(1, max_n + 1):
            counts = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
            max_ref: Counter[tuple[int, ...]] = Counter()
            for ref in refs:
                for gram, cnt in Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1)).items():
                    max_ref[gram] = max(max_ref[gram], cnt)
            numerators[n - 1] += sum(min(cnt, max_ref[gram]) for gram, cnt in counts.items())
            denominators[n - 1] += max(1, len(hyp) - n + 1)
        hyp_len += len(hyp)
        ref_len += min((abs(len(r) - len(hyp)), len(r)) for r in refs)[1]
    if numerators[0] == 0 or min(numerators) == 0:
        return 0.0
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / max(hyp_len, 1))
    return bp * math.exp(sum(math.log(num / den) for num, den in zip(numerators, denominators)) / max_n)


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed + 7)
    train_images, train_caps = make_split(N_TRAIN, rng)
    val_images, val_caps = make_split(N_VAL, rng)
    test_images, test_caps = make_split(N_TEST, rng)
    word_map = build_word_map(train_caps)
    max_len = max(len(c) for caps in train_caps + val_caps + test_caps for c in caps)
    train_enc, train_lens = encode(train_caps, word_map, max_len)
    val_enc, val_lens = encode(val_caps, word_map, max_len)
    test_enc, test_lens = encode(test_caps, word_map, max_len)
    vocab_size = len(word_map)

    decoder = DecoderWithAttention(attention_dim=attention_dim, embed_dim=emb_dim, decoder_dim=decoder_dim,
                                   vocab_size=vocab_size, encoder_dim=encoder_dim, dropout=dropout)  # fmt: skip
    decoder_optimizer = torch.optim.Adam(params=filter(lambda p: p.requires_grad, decoder.parameters()), lr=decoder_lr)
    encoder = Encoder(encoded_image_size)
    encoder.fine_tune(fine_tune_encoder)
    encoder_optimizer = (torch.optim.Adam(params=filter(lambda p: p.requires_grad, encoder.parameters()), lr=encoder_lr)
                         if fine_tune_encoder else None)  # fmt: skip
    criterion = nn.CrossEntropyLoss()

    train_loader = DataLoader(CaptionDataset(train_images, train_enc, train_lens, "TRAIN"), batch_size=batch_size,
                              shuffle=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip
    val_loader = DataLoader(CaptionDataset(val_images, val_enc, val_lens, "VAL"), batch_size=batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    test_dataset = CaptionDataset(test_images, test_enc, test_lens, "TEST")

    shift = 0 if variant == "targets_not_shifted" else 1  # the bug: caps_sorted[:, :-1] as the targets

    def targets_of(caps_sorted: torch.Tensor) -> torch.Tensor:
        return caps_sorted[:, 1:] if shift else caps_sorted[:, :-1]

    def caption_loss(output, caps: torch.Tensor) -> torch.Tensor:
        """train()'s loss as a function of the Captioner's output and the batch's captions."""
        scores, _caps_sorted, decode_lengths, alphas, sort_ind = output
        targets = targets_of(caps[sort_ind])
        scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
        targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
        return criterion(scores, targets) + alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()

    captioner = Captioner(encoder, decoder)
    first = next(iter(DataLoader(train_loader.dataset, batch_size=batch_size, shuffle=True,
                                 generator=torch.Generator().manual_seed(seed + 2))))  # fmt: skip
    probe_batch = ((first[0], first[1], first[2]), first[1])
    nx.preflight(captioner, probe_batch, caption_loss)
    optimizers = [decoder_optimizer] + ([encoder_optimizer] if encoder_optimizer is not None else [])
    mon = nx.monitor({"encoder": encoder, "decoder": decoder}, optimizers, every=10, loss_fn=criterion)

    progress: list[str] = []

    def train_epoch(epoch: int) -> float:
        decoder.train()
        encoder.train()
        losses, top5accs = AverageMeter(), AverageMeter()
        for i, (imgs, caps, caplens) in enumerate(train_loader):
            if variant == "encoder_under_no_grad":
                with torch.no_grad():
                    imgs = encoder(imgs)
            else:
                imgs = encoder(imgs)
            scores, caps_sorted, decode_lengths, alphas, sort_ind = decoder(imgs, caps, caplens)
            targets = targets_of(caps_sorted)
            scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
            targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
            loss = mon.loss_fn(scores, targets)
            loss += alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()  # doubly stochastic attention
            decoder_optimizer.zero_grad()
            if encoder_optimizer is not None:
                encoder_optimizer.zero_grad()
            loss.backward()
            if grad_clip is not None:
                clip_gradient(decoder_optimizer, grad_clip)
                if encoder_optimizer is not None:
                    clip_gradient(encoder_optimizer, grad_clip)
            decoder_optimizer.step()
            if encoder_optimizer is not None:
                encoder_optimizer.step()
            top5 = accuracy(scores, targets, 5)
            losses.update(loss.item(), sum(decode_lengths))
            top5accs.update(top5, sum(decode_lengths))
            mon.log(loss, accuracy=top5 / 100.0)
            if i % print_freq == 0:
                progress.append(f"Epoch: [{epoch}][{i}/{len(train_loader)}] Loss {losses.val:.4f} ({losses.avg:.4f}) "
                                f"Top-5 Accuracy {top5accs.val:.3f} ({top5accs.avg:.3f})")  # fmt: skip
        return losses.avg

    def validate() -> tuple[float, float]:
        decoder.eval()
        encoder.eval()
        losses, top5accs = AverageMeter(), AverageMeter()
        references, hypotheses = [], []
        strip = {word_map["<start>"], word_map["<pad>"]}
        with torch.no_grad():
            for imgs, caps, caplens, allcaps in val_loader:
                imgs = encoder(imgs)
                scores, caps_sorted, decode_lengths, alphas, sort_ind = decoder(imgs, caps, caplens)
                targets = targets_of(caps_sorted)
                scores_copy = scores.clone()
                scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
                targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
                loss = criterion(scores, targets)
                loss += alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
                losses.update(loss.item(), sum(decode_lengths))
                top5accs.update(accuracy(scores, targets, 5), sum(decode_lengths))
                allcaps = allcaps[sort_ind]  # the images were sorted in the decoder
                for j in range(allcaps.shape[0]):
                    references.append([[w for w in c if w not in strip] for c in allcaps[j].tolist()])
                _, preds = torch.max(scores_copy, dim=2)
                hypotheses.extend(p[: decode_lengths[j]] for j, p in enumerate(preds.tolist()))
        bleu4 = corpus_bleu(references, hypotheses)
        progress.append(f" * LOSS - {losses.avg:.3f}, TOP-5 ACCURACY - {top5accs.avg:.3f}, BLEU-4 - {bleu4}")
        mon.log(losses.avg, split="val", accuracy=top5accs.avg / 100.0)
        return bleu4, losses.avg

    best_bleu4, epochs_since_improvement, best = 0.0, 0, {}
    train_loss = val_loss = recent_bleu4 = float("nan")
    for epoch in range(epochs):
        if epochs_since_improvement == 20:
            break
        if epochs_since_improvement > 0 and epochs_since_improvement % 8 == 0:
            adjust_learning_rate(decoder_optimizer, 0.8)
            if fine_tune_encoder:
                adjust_learning_rate(encoder_optimizer, 0.8)
        train_loss = train_epoch(epoch)
        recent_bleu4, val_loss = validate()
        is_best = recent_bleu4 > best_bleu4
        best_bleu4 = max(recent_bleu4, best_bleu4)
        epochs_since_improvement = 0 if is_best else epochs_since_improvement + 1
        if is_best:  # save_checkpoint(..., is_best): in memory
            best = {"epoch": epoch, "encoder": copy.deepcopy(encoder.state_dict()),
                    "decoder": copy.deepcopy(decoder.state_dict())}  # fmt: skip

    nx.finish(mon, captioner, probe_batch, caption_loss)

    # measure only: eval.py at beam size 1 on the test images, from the best checkpoint
    if best:
        encoder.load_state_dict(best["encoder"])
        decoder.load_state_dict(best["decoder"])
    test_bleu4 = greedy_bleu(encoder, decoder, test_dataset, word_map)
    return {
        "test_bleu4": test_bleu4,
        "best_val_bleu4": best_bleu4,
        "final_val_bleu4": recent_bleu4,
        "final_train_loss": train_loss,
        "final_val_loss": val_loss,
    }


def greedy_bleu(encoder: Encoder, decoder: DecoderWithAttention, dataset: CaptionDataset,
                word_map: dict[str, int]) -> float:  # fmt: skip
    """eval.py's ``evaluate(beam_size=1)``, the images decoded together: from ``<start>``, the
    top word each step until ``<end>`` (or 50 steps), BLEU-4 against the image's captions."""
    encoder.eval()
    decoder.eval()
    strip = {word_map["<start>"], word_map["<end>"], word_map["<pad>"]}
    n_images = len(dataset) // dataset.cpi
    with torch.no_grad():
        images = torch.stack([dataset[i * dataset.cpi][0] for i in range(n_images)])
        encoder_out = encoder(images)
        encoder_out = encoder_out.view(n_images, -1, encoder_out.size(-1))
        h, c = decoder.init_hidden_state(encoder_out)
        prev = torch.full((n_images,), word_map["<start>"], dtype=torch.long)
        seqs = [[] for _ in range(n_images)]
        done = torch.zeros(n_images, dtype=torch.bool)
        for _step in range(50):
            awe, _ = decoder.attention(encoder_out, h)
            awe = decoder.sigmoid(decoder.f_beta(h)) * awe
            h, c = decoder.decode_step(torch.cat([decoder.embedding(prev), awe], dim=1), (h, c))
            prev = F.log_softmax(decoder.fc(h), dim=1).argmax(dim=1)
            for i in range(n_images):
                if not done[i]:
                    seqs[i].append(int(prev[i]))
            done |= prev == word_map["<end>"]
            if bool(done.all()):
                break
    references, hypotheses = [], []
    for i in range(n_images):
        caps = dataset.captions[i * dataset.cpi : (i + 1) * dataset.cpi]
        references.append([[w for w in cap if w not in strip] for cap in caps])
        hypotheses.append([w for w in seqs[i] if w not in strip])
    return corpus_bleu(references, hypotheses)
