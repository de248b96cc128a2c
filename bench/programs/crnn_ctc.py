"""Port of meijieru/crnn.pytorch: CRNN (convolutions + two bidirectional LSTMs) trained with CTC.

Source: github.com/meijieru/crnn.pytorch, ``train.py``, ``models/crnn.py`` and ``utils.py``
at commit 3cc7904c5ba20b18fcdc2d02ac2b24a9be9eafaf (MIT). Written anew from the facts of
those files; no code copied.

Kept: ``CRNN``: seven ``convRelu`` stages (3x3 convolutions with padding 1, the last 2x2
without padding; batch norm after the 3rd, 5th and 7th; ``ReLU(True)``), ``MaxPool2d(2, 2)``
after the 1st and 2nd, ``MaxPool2d((2, 2), (2, 1), (0, 1))`` after the 4th and 6th, so a
32-high image comes out 1 high; the feature map squeezed and permuted to ``[w, b, c]`` and fed
to two ``BidirectionalLSTM``s (``nn.LSTM(bidirectional=True)`` + a ``Linear`` on the 2*nh
outputs), the second emitting ``nclass = len(alphabet) + 1`` scores per frame;
``weights_init`` (Conv weights N(0, 0.02), BatchNorm weight N(1, 0.02) and bias 0);
``strLabelConverter`` (blank is 0, character i of the alphabet is i + 1; ``encode`` gives
the concatenated labels and their lengths; ``decode`` greedy: drops blanks and repeats);
``trainBatch``: forward, ``preds_size`` = T for every sample, ``criterion(preds, text,
preds_size, length) / batch_size``, ``crnn.zero_grad()``, ``backward``, ``optimizer.step()``;
the default optimizer (neither ``--adam`` nor ``--adadelta``) ``optim.RMSprop(lr=opt.lr)``;
the epoch loop setting ``requires_grad = True`` and ``crnn.train()`` before every batch, the
``averager`` of the loss reset at every ``displayInterval``; ``val``: ``requires_grad =
False``, ``eval()``, up to ``max_iter`` batches, ``preds.max(2)``, transposed and flattened,
decoded, a prediction counted correct when it equals the lower-cased label, accuracy
``n_correct / (max_iter * batchSize)``; ``val`` every ``valInterval`` batches.
Shrunk: the alphabet is the ten digits; text lines are 1 to 3 of scikit-learn's 8x8 digit
glyphs (each resized to 32x12, gaps of 1-3 px), each line resized to 32x48 as
``alignCollate``/``resizeNormalize`` resize every lmdb image to 32x100 (13 frames instead of
26); 640 train / 256 val lines; channel widths 8/16/32/32/64/64/64 instead of
64/128/256/256/512/512/512, ``nh`` 48 instead of 256; ``batchSize`` 32 instead of 64; 24
epochs instead of 25 (480 batches), ``displayInterval``/``valInterval`` 20 batches instead
of 500; no checkpoints. The run is ``--adam --lr 0.001`` (``Adam(lr, betas=(beta1=0.5,
0.999))``): RMSprop at 0.001 and Adadelta stayed on the CTC plateau for 600 batches at this
size. warp-ctc (``warpctc_pytorch.CTCLoss``, which takes the raw activations and sums over
the batch) is not installed: ``nn.CTCLoss(reduction="sum")`` on ``log_softmax`` of the
activations, what the ports of this program to PyTorch >= 1.0 do.
Measure only (not in the program): the last ``val``'s accuracy over the whole val set.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(images, and the labels padded with blank 0 to the longest, the form ``nn.CTCLoss`` also
accepts) with the loss as a function of the frame scores and the padded labels;
``nndx.Monitor(crnn, optimizer)`` around the epochs, each batch's cost logged, each
``val``'s loss and accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "crnn_ctc"
SOURCE = Source("meijieru/crnn.pytorch", "train.py", "3cc7904c5ba20b18fcdc2d02ac2b24a9be9eafaf", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program run with --adam --lr 0.001, nn.CTCLoss on log_softmax "
                "(shrunk: 24 epochs, widths /8)"),
        Variant(
            "ctc_on_raw_activations",
            "warpctc's CTCLoss replaced by nn.CTCLoss but still given the raw activations: the 'log-probabilities' "
            "are unnormalised, raising every score lowers the loss, which goes negative and the greedy decode of "
            "the frames is meaningless",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/Holmeyoung/crnn-pytorch/issues/14",
             "https://github.com/SeanNaren/deepspeech.pytorch/issues/488",
             "https://github.com/gwx314/STARS/issues/9"),
            Measure("val_accuracy", "final val sequence accuracy at least 0.2 below the healthy run's: 0.0 "
                    "against 0.80 healthy on seed 0 (the loss rises from -6.7)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "default_lr_too_high",
            "--adam run with the train.py default --lr 0.01 instead of 0.001: the CTC loss stalls near the "
            "blank/length plateau and the greedy decode is wrong for most lines",
            (C.LR_TOO_HIGH,),
            ("https://github.com/meijieru/crnn.pytorch/issues/92",
             "https://github.com/meijieru/crnn.pytorch/issues/29",
             "https://github.com/SeanNaren/warp-ctc/issues/63"),
            Measure("val_accuracy", "final val sequence accuracy at least 0.2 below the healthy run's: 0.035 "
                    "against 0.80 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

ALPHABET = "0123456789"
IMG_H, IMG_W, GLYPH_W = 32, 48, 12
N_TRAIN, N_VAL = 640, 256
OPT = {"batchSize": 32, "nh": 48, "nepoch": 24, "lr": 0.001, "adam": True, "beta1": 0.5,
       "displayInterval": 20, "valInterval": 20,
       "n_test_disp": 10}  # fmt: skip
WIDTHS = [8, 16, 32, 32, 64, 64, 64]  # nm, shrunk from 64/128/256/256/512/512/512


# --------------------------------------------------------------------------- the data (lmdb stand-in)


def text_lines(glyphs: torch.Tensor, labels: torch.Tensor, n: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    """``n`` images (n, 1, 32, 48) in [-1, 1] of 1-3 digits side by side, each line resized to the full width
    (``alignCollate`` / ``resizeNormalize``), and their texts."""
    rng = np.random.default_rng(seed)
    glyphs = F.interpolate(glyphs.unsqueeze(1).float() / 255.0, size=(IMG_H, GLYPH_W), mode="bilinear",
                           align_corners=False).clamp(0, 1)[:, 0]  # fmt: skip
    images = torch.zeros(n, 1, IMG_H, IMG_W)
    texts = []
    for i in range(n):
        count = int(rng.integers(1, 4))
        parts, text = [], ""
        for _ in range(count):
            j = int(rng.integers(0, len(labels)))
            parts += [glyphs[j], torch.zeros(IMG_H, int(rng.integers(1, 4)))]
            text += ALPHABET[int(labels[j])]
        line = torch.cat([torch.zeros(IMG_H, int(rng.integers(1, 4)))] + parts, dim=1)
        images[i, 0] = F.interpolate(line[None, None], size=(IMG_H, IMG_W), mode="bilinear", align_corners=False)[0, 0]
        texts.append(text)
    return images.sub(0.5).div(0.5), texts


# --------------------------------------------------------------------------- models/crnn.py


class BidirectionalLSTM(nn.Module):
    def __init__(self, nIn: int, nHidden: int, nOut: int) -> None:  # noqa: N803 - the source's names
        super().__init__()
        self.rnn = nn.LSTM(nIn, nHidden, bidirectional=True)
        self.embedding = nn.Linear(nHidden * 2, nOut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recurrent, _ = self.rnn(x)
        T, b, h = recurrent.size()  # noqa: N806
        return self.embedding(recurrent.view(T * b, h)).view(T, b, -1)


class CRNN(nn.Module):
    def __init__(self, imgH: int, nc: int, nclass: int, nh: int, leakyRelu: bool = False) -> None:  # noqa: N803
        super().__init__()
        assert imgH % 16 == 0, "imgH has to be a multiple of 16"
        ks, ps, nm = [3, 3, 3, 3, 3, 3, 2], [1, 1, 1, 1, 1, 1, 0], WIDTHS
        cnn = nn.Sequential()

        def conv_relu(i: int, batch_normalization: bool = False) -> None:
            n_in = nc if i == 0 else nm[i - 1]
            cnn.add_module(f"conv{i}", nn.Conv2d(n_in, nm[i], ks[i], 1, ps[i]))
            if batch_normalization:
                cnn.add_module(f"batchnorm{i}", nn.BatchNorm2d(nm[i]))
            cnn.add_module(f"relu{i}", nn.LeakyReLU(0.2, inplace=True) if leakyRelu else nn.ReLU(True))

        conv_relu(0)
        cnn.add_module("pooling0", nn.MaxPool2d(2, 2))
        conv_relu(1)
        cnn.add_module("pooling1", nn.MaxPool2d(2, 2))
        conv_relu(2, True)
        conv_relu(3)
        cnn.add_module("pooling2", nn.MaxPool2d((2, 2), (2, 1), (0, 1)))
        conv_relu(4, True)
        conv_relu(5)
        cnn.add_module("pooling3", nn.MaxPool2d((2, 2), (2, 1), (0, 1)))
        conv_relu(6, True)
        self.cnn = cnn
        self.rnn = nn.Sequential(BidirectionalLSTM(nm[-1], nh, nh), BidirectionalLSTM(nh, nh, nclass))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.cnn(x)
        b, c, h, w = conv.size()
        assert h == 1, "the height of conv must be 1"
        conv = conv.squeeze(2).permute(2, 0, 1)  # [w, b, c]
        return self.rnn(conv)


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


# --------------------------------------------------------------------------- utils.py


class StrLabelConverter:
    """Text <-> labels; blank is 0, the alphabet's i-th character is i + 1."""

    def __init__(self, alphabet: str) -> None:
        self.alphabet = alphabet.lower() + "-"
        self.dict = {char: i + 1 for i, char in enumerate(alphabet.lower())}

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        length = [len(s) for s in texts]
        return torch.IntTensor([self.dict[c.lower()] for c in "".join(texts)]), torch.IntTensor(length)

    def decode(self, t: torch.Tensor, length: torch.Tensor, raw: bool = False) -> list[str]:
        texts, index = [], 0
        for n in length.tolist():
            seq = t[index : index + n].tolist()
            if raw:
                texts.append("".join(self.alphabet[i - 1] for i in seq))
            else:
                texts.append("".join(self.alphabet[c - 1] for k, c in enumerate(seq)
                                     if c != 0 and not (k > 0 and seq[k - 1] == c)))  # fmt: skip
            index += n
        return texts


class Averager:
    def __init__(self) -> None:
        self.reset()

    def add(self, v: torch.Tensor) -> None:
        self.n_count += v.numel()
        self.sum += float(v.detach().sum())

    def reset(self) -> None:
        self.n_count, self.sum = 0, 0.0

    def val(self) -> float:
        return self.sum / self.n_count if self.n_count else 0.0


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    if variant == "default_lr_too_high":
        opt["lr"] = 0.01
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_raw, train_labels, val_raw, val_labels = data.digit_images(seed=seed)
    train_images, train_texts = text_lines(train_raw, train_labels, N_TRAIN, seed)
    val_images, val_texts = text_lines(val_raw, val_labels, N_VAL, seed + 1)

    nclass = len(ALPHABET) + 1
    converter = StrLabelConverter(ALPHABET)
    ctc = nn.CTCLoss(reduction="sum")  # warp-ctc sums over the batch

    def criterion(preds: torch.Tensor, text: torch.Tensor, preds_size: torch.Tensor, length: torch.Tensor):
        if variant == "ctc_on_raw_activations":  # warpctc took activations; nn.CTCLoss wants log-probabilities
            return ctc(preds, text, preds_size, length)
        return ctc(preds.log_softmax(2), text, preds_size, length)

    def crnn_loss(preds: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
        """``criterion(...) / batch_size`` as a function of the frame scores and the blank-padded labels."""
        batch_size = preds.size(1)
        length = (padded != 0).sum(1)
        preds_size = torch.full((batch_size,), preds.size(0), dtype=torch.long)
        return criterion(preds, padded, preds_size, length) / batch_size

    def padded_labels(texts: list[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), max(len(t) for t in texts), dtype=torch.long)
        for i, t in enumerate(texts):
            out[i, : len(t)] = torch.tensor([converter.dict[c] for c in t])
        return out

    crnn = CRNN(IMG_H, 1, nclass, opt["nh"])
    crnn.apply(weights_init)
    if opt.get("adam"):
        optimizer = optim.Adam(crnn.parameters(), lr=opt["lr"], betas=(opt["beta1"], 0.999))
    elif opt.get("adadelta"):
        optimizer = optim.Adadelta(crnn.parameters())
    else:
        optimizer = optim.RMSprop(crnn.parameters(), lr=opt["lr"])

    bs = opt["batchSize"]
    first_batch = (train_images[:bs], padded_labels(train_texts[:bs]))
    nx.preflight(crnn, first_batch, crnn_loss, optimizer=optimizer)
    mon = nx.monitor(crnn, optimizer, every=10)

    def val(max_iter: int = 100) -> tuple[float, float]:
        for p in crnn.parameters():
            p.requires_grad = False
        crnn.eval()
        loss_avg, n_correct = Averager(), 0
        n_batches = min(max_iter, N_VAL // bs)
        for i in range(n_batches):
            cpu_images, cpu_texts = val_images[i * bs : (i + 1) * bs], val_texts[i * bs : (i + 1) * bs]
            batch_size = cpu_images.size(0)
            text, length = converter.encode(cpu_texts)
            preds = crnn(cpu_images)
            preds_size = torch.IntTensor([preds.size(0)] * batch_size)
            cost = criterion(preds, text, preds_size, length) / batch_size
            loss_avg.add(cost)
            _, best = preds.max(2)
            best = best.transpose(1, 0).contiguous().view(-1)
            sim_preds = converter.decode(best, preds_size, raw=False)
            n_correct += sum(pred == target.lower() for pred, target in zip(sim_preds, cpu_texts))
        accuracy = n_correct / float(n_batches * bs)
        mon.log(loss_avg.val(), split="val", accuracy=accuracy)
        return loss_avg.val(), accuracy

    def train_batch(cpu_images: torch.Tensor, cpu_texts: list[str]) -> torch.Tensor:
        batch_size = cpu_images.size(0)
        text, length = converter.encode(cpu_texts)
        preds = crnn(cpu_images)
        preds_size = torch.IntTensor([preds.size(0)] * batch_size)
        cost = criterion(preds, text, preds_size, length) / batch_size
        crnn.zero_grad()
        cost.backward()
        optimizer.step()
        return cost

    loss_avg, log = Averager(), []
    gen = torch.Generator().manual_seed(seed)
    n_batches = N_TRAIN // bs
    val_loss = val_acc = float("nan")
    for epoch in range(opt["nepoch"]):
        order = torch.randperm(N_TRAIN, generator=gen)
        i = 0
        while i < n_batches:
            for p in crnn.parameters():
                p.requires_grad = True
            crnn.train()
            idx = order[i * bs : (i + 1) * bs]
            cost = train_batch(train_images[idx], [train_texts[k] for k in idx.tolist()])
            mon.log(cost)
            loss_avg.add(cost)
            i += 1
            if i % opt["displayInterval"] == 0:
                log.append(f"[{epoch}/{opt['nepoch']}][{i}/{n_batches}] Loss: {loss_avg.val():f}")
                loss_avg.reset()
            if i % opt["valInterval"] == 0:
                val_loss, val_acc = val()
    val_loss, val_acc = val()
    for p in crnn.parameters():
        p.requires_grad = True
    crnn.train()
    nx.finish(mon, crnn, first_batch, crnn_loss, optimizer=optimizer)
    return {"val_accuracy": val_acc, "val_loss": val_loss, "train_loss": float(cost.detach())}
