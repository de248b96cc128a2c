"""Port of SeanNaren/deepspeech.pytorch: DeepSpeech2 (a 2-D convolutional front end over the
spectrogram, bidirectional LSTMs with sequence-wise batch norm, a per-frame linear layer to
characters) trained with CTC, AdamW, an exponential LR anneal and gradient clipping.

Source: github.com/SeanNaren/deepspeech.pytorch, ``deepspeech_pytorch/model.py``,
``deepspeech_pytorch/decoder.py``, ``deepspeech_pytorch/validation.py``,
``deepspeech_pytorch/loader/data_loader.py``, ``deepspeech_pytorch/configs/train_config.py``,
``configs/an4.yaml`` and ``labels.json`` at commit b88a631ef6b96553e16bbaa5bd6a621435bed278
(MIT, Copyright (c) 2017 Sean Naren). Written anew from the facts of those files; no code
copied.

Kept: ``labels.json``'s layout (the CTC blank ``_`` first, then ``'``, the letters and the
space); the spectrogram parser's ``log1p`` of the magnitude and per-utterance mean/std
normalisation; ``_collate_fn``: the batch sorted longest first, zero padded to the longest,
``input_percentages`` (length / longest), the targets concatenated with their
``target_sizes``; ``DeepSpeech``: ``MaskConv`` over ``Conv2d(1, 32, (41, 11), stride (2, 2),
padding (20, 5))`` + ``BatchNorm2d`` + ``Hardtanh(0, 20)`` + ``Conv2d(32, 32, (21, 11), stride
(2, 1), padding (10, 5))`` + ``BatchNorm2d`` + ``Hardtanh(0, 20)``, every stage's output zeroed
past each utterance's length; the feature and channel axes collapsed and the output made
time-major (T, N, H); ``BatchRNN`` layers (the first without batch norm, the others with
``SequenceWise(BatchNorm1d)`` before the RNN), each ``pack_padded_sequence`` ->
bidirectional ``nn.LSTM`` -> ``pad_packed_sequence``, the two directions summed;
``fc = SequenceWise(BatchNorm1d(hidden) + Linear(hidden, classes, bias=False))``; the output
transposed to (N, T, C) and passed through ``InferenceBatchSoftmax`` (softmax in eval mode
only); ``get_seq_lens`` from the convolutions' time padding/kernel/stride;
``training_step``: input sizes from the percentages, the output back to (T, N, C),
``log_softmax(-1)``, ``CTCLoss(blank=labels.index('_'), reduction='sum',
zero_infinity=True)``; ``configure_optimizers`` for the default ``optim: adam``:
``AdamW(lr=1.5e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-5)`` with
``ExponentialLR(gamma=learning_anneal=0.99)`` stepped each epoch; an4.yaml's
``gradient_clip_val: 400`` (Lightning clips the gradients' norm before each step);
``validation_step``: the ``GreedyDecoder`` (argmax per frame, repeats merged, blanks
dropped) and ``CharErrorRate`` (Levenshtein distance of the strings without spaces over the
reference characters, x100) each epoch.
Shrunk: LibriSpeech/AN4 cannot be downloaded: utterances are synthesised (see
``utterance``): 1-3 "words" of 1-3 of the letters A-H, each letter 3-5 frames of its own
pattern over 32 frequency bins (two formant-like peaks that drift in a letter-specific
direction, with a per-utterance shift of up to 2 bins, loudness and strong noise), the space
a short pause; 384 train and 160 val utterances; the convolutions 8 channels with kernels (11, 5) and (7, 5)
instead of 32 with (41, 11) and (21, 11) (the frequency axis is 32 bins, not 161); 3
bidirectional LSTM layers of 48 instead of 5 of 1024; batch 16 instead of 8 (an4) / 64; 8
epochs instead of 70; lr 1.5e-3 instead of 1.5e-4 (192 steps, not tens of thousands);
fp32 on one CPU instead of 16-bit DDP; no checkpoints, no WER (CER only; the words are
letters, not dictionary words).
Measure only (not in the program): nothing; the measure is the last validation CER, the
number the program logs (``best_cer``, the best epoch's, is what the checkpoint callback
would keep).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch,
its input the model's ``(inputs, input_sizes)`` and its target the labels padded with the
blank 0 to the longest (a form ``CTCLoss`` also accepts), scored by ``training_step``'s loss
as a function of the model's output and the padded labels; ``nndx.Monitor(model,
optimizer)`` around the epochs, each step's loss logged (the program computes no
validation loss, so nothing is logged as ``split="val"``); then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deepspeech2"
SOURCE = Source("SeanNaren/deepspeech.pytorch", "deepspeech_pytorch/model.py",
                "b88a631ef6b96553e16bbaa5bd6a621435bed278", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 3 BiLSTMs of 48, 8 epochs, lr 1.5e-3)"),
        Variant(
            "lr_too_high",
            "an SGD-style learning rate (0.3) given to AdamW instead of 1.5e-3: the CTC loss jumps to the "
            "thousands, then stalls on the all-blank plateau (~200 per batch) and the greedy decode emits "
            "almost nothing",
            (C.LR_TOO_HIGH,),
            ("https://github.com/SeanNaren/deepspeech.pytorch/issues/260",
             "https://github.com/SeanNaren/deepspeech.pytorch/issues/416",
             "https://github.com/mozilla/DeepSpeech/issues/238"),
            Measure("val_cer", "final validation CER at least 15 points above the healthy run's: 100.0 "
                    "against 10.5 healthy on seed 0", lambda healthy, buggy: not buggy < healthy + 15.0),
        ),
        Variant(
            "softmax_before_ctc",
            "the inference softmax applied in training too (InferenceBatchSoftmax without its training "
            "switch), so training_step's log_softmax runs on probabilities: log_softmax(softmax(x)) bounds "
            "every log-probability within 1 of the others and the CTC loss can barely fall",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/SeanNaren/deepspeech.pytorch/issues/361",
             "https://github.com/SeanNaren/deepspeech.pytorch/issues/194",
             "https://github.com/clovaai/deep-text-recognition-benchmark/issues/117"),
            Measure("val_cer", "final validation CER at least 5 points above the healthy run's: 17.9 against "
                    "10.5 healthy on seed 0 (train loss ~200 per batch throughout, against 8.7)",
                    lambda healthy, buggy: not buggy < healthy + 5.0),
        ),
    )
}

LABELS = ["_", "'", "A", "B", "C", "D", "E", "F", "G", "H", " "]
LETTERS = "ABCDEFGH"
N_FREQ, N_TRAIN, N_VAL = 32, 384, 160
CONV_CH, HIDDEN, HIDDEN_LAYERS = 8, 48, 3
BATCH, EPOCHS, LR, ANNEAL, WEIGHT_DECAY, CLIP = 16, 8, 1.5e-3, 0.99, 1e-5, 400.0
LR_BUG = 0.3  # the lr_too_high variant


# --------------------------------------------------------------------------- the data (the manifests' stand-in)


def utterance(rng: np.random.Generator) -> tuple[torch.Tensor, str]:
    """A normalised log spectrogram (N_FREQ, T) and its transcript."""
    words = ["".join(rng.choice(list(LETTERS), size=int(rng.integers(1, 4)))) for _ in range(int(rng.integers(1, 4)))]
    text = " ".join(words)
    shift, gain = int(rng.integers(-2, 3)), rng.uniform(0.5, 1.5)
    bins = np.arange(N_FREQ)
    frames = [np.zeros(N_FREQ) for _ in range(int(rng.integers(1, 3)))]  # leading silence
    for ch in text:
        if ch == " ":
            frames += [np.zeros(N_FREQ) for _ in range(int(rng.integers(1, 3)))]
            continue
        k = LETTERS.index(ch)
        f1, f2 = 3 + 3 * k + shift, 5 + (5 * k + 11) % 24 + shift  # two letter-specific peaks
        drift = (-1) ** k * (1 + k % 3) * 0.6
        n = int(rng.integers(3, 6))
        for j in range(n):
            pos = j / max(1, n - 1) - 0.5
            spec = np.exp(-0.5 * ((bins - f1 - drift * pos) / 1.2) ** 2)
            spec += 0.7 * np.exp(-0.5 * ((bins - f2 + drift * pos) / 1.5) ** 2)
            frames.append(gain * 3.0 * spec)
    frames += [np.zeros(N_FREQ) for _ in range(int(rng.integers(1, 3)))]
    mag = np.stack(frames, axis=1) + np.abs(rng.normal(0, 0.5, (N_FREQ, len(frames))))
    spect = torch.from_numpy(np.log1p(mag)).float()
    spect = (spect - spect.mean()) / spect.std()  # parse_audio with normalize=True
    return spect, text


def collate(batch: list[tuple[torch.Tensor, list[int]]]):
    """``_collate_fn``: longest first, zero padded, length percentages, concatenated targets."""
    batch = sorted(batch, key=lambda sample: sample[0].size(1), reverse=True)
    freq_size, max_len = batch[0][0].size(0), batch[0][0].size(1)
    inputs = torch.zeros(len(batch), 1, freq_size, max_len)
    input_percentages = torch.zeros(len(batch))
    target_sizes = torch.zeros(len(batch), dtype=torch.int)
    targets: list[int] = []
    for x, (tensor, target) in enumerate(batch):
        seq_length = tensor.size(1)
        inputs[x][0].narrow(1, 0, seq_length).copy_(tensor)
        input_percentages[x] = seq_length / float(max_len)
        target_sizes[x] = len(target)
        targets.extend(target)
    return inputs, torch.tensor(targets, dtype=torch.long), input_percentages, target_sizes


# --------------------------------------------------------------------------- model.py


class SequenceWise(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, n = x.size(0), x.size(1)
        return self.module(x.view(t * n, -1)).view(t, n, -1)


class MaskConv(nn.Module):
    def __init__(self, seq_module: nn.Sequential) -> None:
        super().__init__()
        self.seq_module = seq_module

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        for module in self.seq_module:
            x = module(x)
            mask = torch.zeros(x.size(), dtype=torch.bool)
            for i, length in enumerate(lengths):
                length = int(length)
                if mask[i].size(2) - length > 0:
                    mask[i].narrow(2, length, mask[i].size(2) - length).fill_(1)
            x = x.masked_fill(mask, 0)
        return x, lengths


class InferenceBatchSoftmax(nn.Module):
    def __init__(self, always: bool = False) -> None:
        super().__init__()
        self.always = always  # the softmax_before_ctc bug: no training switch

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        if not self.training or self.always:
            return F.softmax(input_, dim=-1)
        return input_


class BatchRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, rnn_type=nn.LSTM, bidirectional: bool = False,
                 batch_norm: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.bidirectional = bidirectional
        self.batch_norm = SequenceWise(nn.BatchNorm1d(input_size)) if batch_norm else None
        self.rnn = rnn_type(input_size=input_size, hidden_size=hidden_size, bidirectional=bidirectional, bias=True)

    def forward(self, x: torch.Tensor, output_lengths: torch.Tensor, h=None):
        if self.batch_norm is not None:
            x = self.batch_norm(x)
        x = nn.utils.rnn.pack_padded_sequence(x, output_lengths)
        x, h = self.rnn(x, h)
        x, _ = nn.utils.rnn.pad_packed_sequence(x)
        if self.bidirectional:  # (T, N, 2H) -> (T, N, H) by summing the directions
            x = x.view(x.size(0), x.size(1), 2, -1).sum(2).view(x.size(0), x.size(1), -1)
        return x, h


class DeepSpeech(nn.Module):
    def __init__(self, labels: list[str], hidden_size: int, hidden_layers: int, n_freq: int,
                 softmax_always: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.labels = labels
        num_classes = len(labels)
        self.conv = MaskConv(nn.Sequential(
            nn.Conv2d(1, CONV_CH, kernel_size=(11, 5), stride=(2, 2), padding=(5, 2)),
            nn.BatchNorm2d(CONV_CH),
            nn.Hardtanh(0, 20, inplace=True),
            nn.Conv2d(CONV_CH, CONV_CH, kernel_size=(7, 5), stride=(2, 1), padding=(3, 2)),
            nn.BatchNorm2d(CONV_CH),
            nn.Hardtanh(0, 20, inplace=True),
        ))  # fmt: skip
        rnn_input_size = int(math.floor(n_freq + 2 * 5 - 11) / 2 + 1)
        rnn_input_size = int(math.floor(rnn_input_size + 2 * 3 - 7) / 2 + 1)
        rnn_input_size *= CONV_CH
        self.rnns = nn.Sequential(
            BatchRNN(rnn_input_size, hidden_size, bidirectional=True, batch_norm=False),
            *(BatchRNN(hidden_size, hidden_size, bidirectional=True) for _ in range(hidden_layers - 1)),
        )
        self.fc = nn.Sequential(SequenceWise(nn.Sequential(nn.BatchNorm1d(hidden_size),
                                                           nn.Linear(hidden_size, num_classes, bias=False))))  # fmt: skip
        self.inference_softmax = InferenceBatchSoftmax(always=softmax_always)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, hs=None):
        lengths = lengths.cpu().int()
        output_lengths = self.get_seq_lens(lengths)
        x, _ = self.conv(x, output_lengths)
        sizes = x.size()
        x = x.view(sizes[0], sizes[1] * sizes[2], sizes[3])  # collapse the feature dimension
        x = x.transpose(1, 2).transpose(0, 1).contiguous()  # (T, N, H)
        if hs is None:
            hs = [None] * len(self.rnns)
        new_hs = []
        for i, rnn in enumerate(self.rnns):
            x, h = rnn(x, output_lengths, hs[i])
            new_hs.append(h)
        x = self.fc(x)
        x = x.transpose(0, 1)
        return self.inference_softmax(x), output_lengths, new_hs

    def get_seq_lens(self, input_length: torch.Tensor) -> torch.Tensor:
        seq_len = input_length
        for m in self.conv.modules():
            if type(m) is nn.Conv2d:
                seq_len = (seq_len + 2 * m.padding[1] - m.dilation[1] * (m.kernel_size[1] - 1) - 1) // m.stride[1] + 1
        return seq_len.int()


# --------------------------------------------------------------------------- decoder.py / validation.py


class GreedyDecoder:
    def __init__(self, labels: list[str], blank_index: int = 0) -> None:
        self.labels, self.blank_index = labels, blank_index
        self.int_to_char = dict(enumerate(labels))
        self.space_index = labels.index(" ") if " " in labels else len(labels)

    def convert_to_strings(self, sequences, sizes=None, remove_repetitions: bool = False) -> list[list[str]]:
        strings = []
        for x in range(len(sequences)):
            seq_len = int(sizes[x]) if sizes is not None else len(sequences[x])
            strings.append([self.process_string(sequences[x], seq_len, remove_repetitions)])
        return strings

    def process_string(self, sequence, size: int, remove_repetitions: bool = False) -> str:
        string = ""
        for i in range(size):
            char = self.int_to_char[int(sequence[i])]
            if char != self.int_to_char[self.blank_index]:
                if remove_repetitions and i != 0 and char == self.int_to_char[int(sequence[i - 1])]:
                    pass
                elif char == self.labels[self.space_index]:
                    string += " "
                else:
                    string += char
        return string

    def decode(self, probs: torch.Tensor, sizes=None) -> list[list[str]]:
        _, max_probs = torch.max(probs, 2)
        return self.convert_to_strings(max_probs.view(max_probs.size(0), max_probs.size(1)), sizes,
                                       remove_repetitions=True)  # fmt: skip


def levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


class CharErrorRate:
    def __init__(self, decoder: GreedyDecoder, target_decoder: GreedyDecoder) -> None:
        self.decoder, self.target_decoder = decoder, target_decoder
        self.cer, self.n_chars = 0, 0

    def update(self, preds, preds_sizes, targets, target_sizes) -> None:
        split_targets, offset = [], 0
        for size in target_sizes:
            split_targets.append(targets[offset : offset + int(size)])
            offset += int(size)
        decoded = self.decoder.decode(preds, preds_sizes)
        references = self.target_decoder.convert_to_strings(split_targets)
        for x in range(len(references)):
            transcript, reference = decoded[x][0], references[x][0]
            self.cer += levenshtein(transcript.replace(" ", ""), reference.replace(" ", ""))
            self.n_chars += len(reference.replace(" ", ""))

    def compute(self) -> float:
        return float(self.cer) / self.n_chars * 100


# --------------------------------------------------------------------------- training (what Lightning's fit runs)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    char_to_int = {c: i for i, c in enumerate(LABELS)}

    def dataset(n: int) -> list[tuple[torch.Tensor, list[int]]]:
        items = []
        for _ in range(n):
            spect, text = utterance(rng)
            items.append((spect, [char_to_int[c] for c in text]))
        return items

    train_set, val_set = dataset(N_TRAIN), dataset(N_VAL)
    model = DeepSpeech(LABELS, HIDDEN, HIDDEN_LAYERS, N_FREQ, softmax_always=variant == "softmax_before_ctc")
    criterion = nn.CTCLoss(blank=LABELS.index("_"), reduction="sum", zero_infinity=True)
    decoder = GreedyDecoder(LABELS)
    lr = LR_BUG if variant == "lr_too_high" else LR
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=ANNEAL)

    def ctc_loss(out: torch.Tensor, output_sizes, targets, target_sizes) -> torch.Tensor:
        out = out.transpose(0, 1)  # (T, N, C)
        return criterion(out.log_softmax(-1), targets, output_sizes, target_sizes)

    def probe_loss(output, padded: torch.Tensor) -> torch.Tensor:
        """training_step's loss as a function of the model's output and the blank-padded labels."""
        out, output_sizes, _ = output
        return ctc_loss(out, output_sizes, padded, (padded != 0).sum(1))

    def batches(items, shuffle: bool, gen: torch.Generator | None = None):
        order = torch.randperm(len(items), generator=gen).tolist() if shuffle else list(range(len(items)))
        for i in range(0, len(order), BATCH):
            yield collate([items[j] for j in order[i : i + BATCH]])

    inputs, targets, input_percentages, target_sizes = next(batches(train_set, False))
    input_sizes = input_percentages.mul(int(inputs.size(3))).int()
    padded = torch.zeros(len(target_sizes), int(target_sizes.max()), dtype=torch.long)
    offset = 0
    for i, size in enumerate(target_sizes.tolist()):
        padded[i, :size] = targets[offset : offset + size]
        offset += size
    first_batch = ((inputs, input_sizes), padded)
    nx.preflight(model, first_batch, probe_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def validate() -> float:
        model.eval()
        cer = CharErrorRate(decoder, decoder)
        with torch.no_grad():
            for inputs, targets, input_percentages, target_sizes in batches(val_set, False):
                input_sizes = input_percentages.mul(int(inputs.size(3))).int()
                out, output_sizes, _ = model(inputs, input_sizes)
                cer.update(out, output_sizes, targets, target_sizes)
        model.train()
        return cer.compute()

    gen = torch.Generator().manual_seed(seed)
    loss, val_cer, cers = torch.tensor(float("nan")), float("nan"), []
    model.train()
    for _ in range(EPOCHS):
        for inputs, targets, input_percentages, target_sizes in batches(train_set, True, gen):
            input_sizes = input_percentages.mul_(int(inputs.size(3))).int()
            out, output_sizes, _ = model(inputs, input_sizes)
            loss = ctc_loss(out, output_sizes, targets, target_sizes)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            mon.log(loss)
        val_cer = validate()
        cers.append(val_cer)
        scheduler.step()

    nx.finish(mon, model, first_batch, probe_loss, optimizer=optimizer)
    return {"val_cer": val_cer, "best_cer": min(cers), "train_loss": float(loss.detach())}
