"""Port of descriptinc/melgan-neurips: MelGAN, a GAN vocoder. A fully convolutional generator
upsamples a log-mel-spectrogram to a waveform (weight-normalised transposed convolutions, dilated
residual stacks, tanh); three discriminators judge the waveform at three scales (average-pool
downsampling), trained with hinge losses; the generator gets the adversarial loss plus 10 x an L1
feature-matching loss over every discriminator layer.

Source: github.com/descriptinc/melgan-neurips, ``scripts/train.py``, ``mel2wav/modules.py``
(``Audio2Mel``, ``ResnetBlock``, ``Generator``, ``NLayerDiscriminator``, ``Discriminator``,
``weights_init``, ``WNConv1d``, ``WNConvTranspose1d``) and ``mel2wav/dataset.py``
(``AudioDataset``) at commit 6488045bfba1975602288de07a58570c7b4d66ea (MIT, Copyright (c) 2019
Descript Inc.). Written anew from the facts of those files; no code copied.

Kept: ``Audio2Mel`` (reflect padding of ``(n_fft - hop) // 2``, ``torch.stft`` with a Hann window,
``center=False``, real and imaginary parts unbound and the magnitude taken by hand, the mel basis
(librosa's Slaney mel filterbank, computed here in torch/numpy: no librosa), ``log10(clamp(mel,
min=1e-5))``), n_fft 1024, hop 256, window 1024, 22,050 Hz, 80 mel channels; the ``Generator``
(reflection pad 3, ``WNConv1d(80, 16 ngf, 7)``, four upsampling stages of ratios 8, 8, 2, 2, each
LeakyReLU(0.2) + ``WNConvTranspose1d`` + ``n_residual_layers`` residual blocks with dilations 1, 3,
9 and 1x1 weight-normalised shortcuts, then LeakyReLU, reflection pad, ``WNConv1d(ngf, 1, 7)``,
tanh; ``self.apply(weights_init)``, which writes ``normal_(0, 0.02)`` into the computed ``weight``
of the weight-normalised convs, as the original does); ``NLayerDiscriminator`` (a ``ModuleDict``
of layers: reflection pad 7 + ``WNConv1d(1, ndf, 15)``, ``n_layers`` grouped strided convs of
kernel ``10 stride + 1``, groups ``nf_prev // 4``, a kernel-5 conv, a kernel-3 conv to one channel;
every layer's output returned) and ``Discriminator`` (``num_D`` of them, ``AvgPool1d(4, 2, 1,
count_include_pad=False)`` between scales); Adam lr 1e-4, betas (0.5, 0.9) for both; the loop of
``train.py``: ``s_t = fft(x_t).detach()``, ``x_pred_t = netG(s_t)``, the no-grad mel error, the
discriminator on ``x_pred_t.detach()`` and ``x_t``, hinge ``relu(1 + D(fake)) + relu(1 - D(real))``
summed over the scales, ``netD.zero_grad()``, backward, ``optD.step()``; the generator's
``-D(fake).mean()`` over scales plus ``lambda_feat`` (10) x the L1 between fake and detached real
features weighted ``4 / (n_layers_D + 1) / num_D``, ``netG.zero_grad()``, backward, ``optG.step()``;
``AudioDataset``: the file list shuffled with ``random.seed(1234)``, each file loaded, ``0.95 *
normalize`` (peak), the random amplitude ``np.random.uniform(0.3, 1.0)`` when augmenting, a random
segment of ``segment_length`` (``random.randint``) or zero padding at the end of a shorter file; the
unshuffled train ``DataLoader``; the test set's mels computed once before training.
Shrunk: synthetic clips (one to three harmonic tones of 110-880 Hz, each with an attack/decay
envelope, 600-6,000 samples long at 22,050 Hz; 48 train / 4 test "files", held in memory as the
wav files would be) instead of LJ Speech; segment length 2,048 instead of 8,192, the test clips 4,096
samples instead of 4 s; ngf 4 instead of 32, ndf 4 instead of 16, 3 discriminator layers instead of 4
with the channel cap 64 instead of 1,024 (the original's layer after the strided ones reads
``nf_prev`` channels, which equals ``nf`` only once the cap is reached, so the cap shrinks with the
width); batch 4 instead of 16; 6 epochs (72 steps) instead of 3,000; CPU; no tensorboard, no wav
files, no checkpoints.
Measure only (not in the program): after training, the L1 between the test clips' log-mels and the
log-mels of the generator's waveforms from them (train.py's ``s_error``, on the held-out clips);
the mean ``s_error`` of the last epoch.

nndx, as the author would add it: the generator is the model of interest; a preflight
``nndx.probe(netG, (s_t, x_t), loss_fn, optimizer=optG)`` on the first training batch, the
``loss_fn`` being the generator's own loss (adversarial + feature matching through ``netD``);
``nndx.Monitor(netG, optG)`` and ``nndx.Monitor(netD, optD)`` around the loop, each step's
generator and discriminator losses logged where ``train.py`` writes them to tensorboard; after
training ``nndx.probe(netG, ..., monitor=monG)`` on the same batch, the discriminator's Monitor
diagnosed from its own report, both read together.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import weight_norm

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "melgan"
SOURCE = Source("descriptinc/melgan-neurips", "scripts/train.py", "6488045bfba1975602288de07a58570c7b4d66ea", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "train.py as published (shrunk: synthetic tone clips, ngf 4, ndf 4, 72 steps)"),
        Variant(
            "log_mel_unclamped",
            "Audio2Mel takes torch.log10(mel_output) without the clamp(min=1e-5): the zero-padded end of a clip "
            "shorter than the segment gives all-zero frames, whose log-mel is -inf; the generator's input then "
            "holds -inf and everything downstream turns NaN",
            (C.LOG_OF_ZERO,),
            ("https://github.com/Kyubyong/tacotron/pull/36",
             "https://github.com/r9y9/deepvoice3_pytorch/pull/46",
             "https://github.com/igorshmukler/kokoro-ruslan/issues/85"),
            Measure("test_mel_error", "the test mel error is not finite or at least 2x the healthy run's",
                    lambda healthy, buggy: not (math.isfinite(buggy) and buggy < 2 * healthy)),
        ),
        Variant(
            "audio_int16_unscaled",
            "the clips are read as 16-bit PCM (scipy.io.wavfile.read) and the dataset's division by 32768 "
            "(commented out in mel2wav/dataset.py) is left out: real waveforms reach +-3e4 while the generator "
            "ends in tanh, and the mels the generator gets are shifted by log10(32768)",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/mazzzystar/WaveGAN-pytorch/issues/2",
             "https://github.com/jtcramer/wavegan/issues/4",
             "https://github.com/NVIDIA/tacotron2/issues/206"),
            Measure("test_mel_error", "the test mel error is not finite or at least 2x the healthy run's",
                    lambda healthy, buggy: not (math.isfinite(buggy) and buggy < 2 * healthy)),
        ),
    )
}

SR, N_FFT, HOP, N_MELS = 22050, 1024, 256, 80
ARGS = {"n_mel_channels": N_MELS, "ngf": 4, "n_residual_layers": 3, "ndf": 4, "num_D": 3, "n_layers_D": 3,
        "downsamp_factor": 4, "lambda_feat": 10.0, "batch_size": 4, "seq_len": 2048, "epochs": 6,
        "n_test_samples": 4}  # fmt: skip
N_TRAIN_FILES, N_TEST_FILES, TEST_LEN, NF_CAP = 48, 4, 4096, 64


# --------------------------------------------------------------------------- librosa.filters.mel (Slaney), no librosa


def _hz_to_mel(f):
    f = np.asanyarray(f, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    mels = f / f_sp
    return np.where(f >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m):
    m = np.asanyarray(m, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def librosa_mel_fn(sr, n_fft, n_mels, fmin=0.0, fmax=None):
    fmax = sr / 2.0 if fmax is None else fmax
    fftfreqs = np.linspace(0, sr / 2.0, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    weights = np.zeros((n_mels, 1 + n_fft // 2))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    return (weights * enorm[:, None]).astype(np.float32)


# --------------------------------------------------------------------------- mel2wav/modules.py


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


def WNConv1d(*args, **kwargs):
    return weight_norm(nn.Conv1d(*args, **kwargs))


def WNConvTranspose1d(*args, **kwargs):
    return weight_norm(nn.ConvTranspose1d(*args, **kwargs))


class Audio2Mel(nn.Module):
    def __init__(self, n_fft=1024, hop_length=256, win_length=1024, sampling_rate=22050, n_mel_channels=80,
                 mel_fmin=0.0, mel_fmax=None, clamp=True):  # fmt: skip
        super().__init__()
        window = torch.hann_window(win_length).float()
        mel_basis = torch.from_numpy(librosa_mel_fn(sampling_rate, n_fft, n_mel_channels, mel_fmin, mel_fmax)).float()
        self.register_buffer("mel_basis", mel_basis)
        self.register_buffer("window", window)
        self.n_fft, self.hop_length, self.win_length = n_fft, hop_length, win_length
        self.sampling_rate, self.n_mel_channels = sampling_rate, n_mel_channels
        self.clamp = clamp

    def forward(self, audio):
        p = (self.n_fft - self.hop_length) // 2
        audio = F.pad(audio, (p, p), "reflect").squeeze(1)
        fft = torch.view_as_real(torch.stft(audio, n_fft=self.n_fft, hop_length=self.hop_length,
                                            win_length=self.win_length, window=self.window, center=False,
                                            return_complex=True))  # fmt: skip
        real_part, imag_part = fft.unbind(-1)
        magnitude = torch.sqrt(real_part**2 + imag_part**2)
        mel_output = torch.matmul(self.mel_basis, magnitude)
        if self.clamp:
            log_mel_spec = torch.log10(torch.clamp(mel_output, min=1e-5))
        else:
            log_mel_spec = torch.log10(mel_output)
        return log_mel_spec


class ResnetBlock(nn.Module):
    def __init__(self, dim, dilation=1):
        super().__init__()
        self.block = nn.Sequential(
            nn.LeakyReLU(0.2),
            nn.ReflectionPad1d(dilation),
            WNConv1d(dim, dim, kernel_size=3, dilation=dilation),
            nn.LeakyReLU(0.2),
            WNConv1d(dim, dim, kernel_size=1),
        )
        self.shortcut = WNConv1d(dim, dim, kernel_size=1)

    def forward(self, x):
        return self.shortcut(x) + self.block(x)


class Generator(nn.Module):
    def __init__(self, input_size, ngf, n_residual_layers):
        super().__init__()
        ratios = [8, 8, 2, 2]
        self.hop_length = np.prod(ratios)
        mult = int(2 ** len(ratios))
        model = [nn.ReflectionPad1d(3), WNConv1d(input_size, mult * ngf, kernel_size=7, padding=0)]
        for _i, r in enumerate(ratios):
            model += [
                nn.LeakyReLU(0.2),
                WNConvTranspose1d(mult * ngf, mult * ngf // 2, kernel_size=r * 2, stride=r,
                                  padding=r // 2 + r % 2, output_padding=r % 2),  # fmt: skip
            ]
            for j in range(n_residual_layers):
                model += [ResnetBlock(mult * ngf // 2, dilation=3**j)]
            mult //= 2
        model += [nn.LeakyReLU(0.2), nn.ReflectionPad1d(3), WNConv1d(ngf, 1, kernel_size=7, padding=0), nn.Tanh()]
        self.model = nn.Sequential(*model)
        self.apply(weights_init)

    def forward(self, x):
        return self.model(x)


class NLayerDiscriminator(nn.Module):
    def __init__(self, ndf, n_layers, downsampling_factor):
        super().__init__()
        model = nn.ModuleDict()
        model["layer_0"] = nn.Sequential(nn.ReflectionPad1d(7), WNConv1d(1, ndf, kernel_size=15),
                                         nn.LeakyReLU(0.2, True))  # fmt: skip
        nf = ndf
        stride = downsampling_factor
        for n in range(1, n_layers + 1):
            nf_prev = nf
            nf = min(nf * stride, NF_CAP)
            model["layer_%d" % n] = nn.Sequential(
                WNConv1d(nf_prev, nf, kernel_size=stride * 10 + 1, stride=stride, padding=stride * 5,
                         groups=nf_prev // 4),  # fmt: skip
                nn.LeakyReLU(0.2, True),
            )
        nf = min(nf * 2, NF_CAP)
        model["layer_%d" % (n_layers + 1)] = nn.Sequential(
            WNConv1d(nf_prev, nf, kernel_size=5, stride=1, padding=2), nn.LeakyReLU(0.2, True))
        model["layer_%d" % (n_layers + 2)] = WNConv1d(nf, 1, kernel_size=3, stride=1, padding=1)
        self.model = model

    def forward(self, x):
        results = []
        for _key, layer in self.model.items():
            x = layer(x)
            results.append(x)
        return results


class Discriminator(nn.Module):
    def __init__(self, num_D, ndf, n_layers, downsampling_factor):
        super().__init__()
        self.model = nn.ModuleDict()
        for i in range(num_D):
            self.model[f"disc_{i}"] = NLayerDiscriminator(ndf, n_layers, downsampling_factor)
        self.downsample = nn.AvgPool1d(4, stride=2, padding=1, count_include_pad=False)
        self.apply(weights_init)

    def forward(self, x):
        results = []
        for _key, disc in self.model.items():
            results.append(disc(x))
            x = self.downsample(x)
        return results


# --------------------------------------------------------------------------- the "wav files" (synthetic)


def synth_clips(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sums of harmonic tones with attack/decay envelopes, as float wav files in [-1, 1]."""
    clips = []
    for _ in range(n):
        length = int(rng.integers(600, 6000))
        t = np.arange(length) / SR
        clip = np.zeros(length)
        for _tone in range(int(rng.integers(1, 4))):
            f0 = rng.uniform(110, 880)
            start = int(rng.integers(0, max(1, length // 2)))
            attack, decay = rng.uniform(0.002, 0.02), rng.uniform(0.02, 0.2)
            tt = np.clip(t - start / SR, 0, None)
            env = np.where(t * SR < start, 0.0, np.minimum(tt / attack, 1.0) * np.exp(-tt / decay))
            for h in range(1, 4):
                clip += env * rng.uniform(0.2, 1.0) / h * np.sin(2 * np.pi * h * f0 * t + rng.uniform(0, 2 * np.pi))
        clip = 0.9 * clip / max(np.abs(clip).max(), 1e-6)
        clips.append(clip.astype(np.float32))
    return clips


def normalize(data: np.ndarray) -> np.ndarray:  # librosa.util.normalize: peak normalisation
    return data / max(np.abs(data).max(), 1e-12)


class AudioDataset(torch.utils.data.Dataset):
    def __init__(self, clips, segment_length, sampling_rate, augment=True, int16=False):
        self.sampling_rate = sampling_rate
        self.segment_length = segment_length
        self.audio_files = list(range(len(clips)))
        self.clips = clips
        random.seed(1234)
        random.shuffle(self.audio_files)
        self.augment = augment
        self.int16 = int16

    def __getitem__(self, index):
        filename = self.audio_files[index]
        audio, sampling_rate = self.load_wav_to_torch(filename)
        if audio.size(0) >= self.segment_length:
            max_audio_start = audio.size(0) - self.segment_length
            audio_start = random.randint(0, max_audio_start)
            audio = audio[audio_start : audio_start + self.segment_length]
        else:
            audio = F.pad(audio, (0, self.segment_length - audio.size(0)), "constant").data
        # audio = audio / 32768.0
        return audio.unsqueeze(0)

    def __len__(self):
        return len(self.audio_files)

    def load_wav_to_torch(self, full_path):
        if self.int16:  # sampling_rate, data = scipy.io.wavfile.read(full_path): 16-bit PCM as stored
            data = np.round(self.clips[full_path] * 32767).astype(np.int16).astype(np.float32)
        else:  # data, sampling_rate = librosa.core.load(full_path, sr=self.sampling_rate)
            data = 0.95 * normalize(self.clips[full_path])
        if self.augment:
            amplitude = np.random.uniform(low=0.3, high=1.0)
            data = data * amplitude
        return torch.from_numpy(data).float(), self.sampling_rate


# --------------------------------------------------------------------------- scripts/train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    rng = np.random.default_rng(2019 + seed)
    train_clips, test_clips = synth_clips(N_TRAIN_FILES, rng), synth_clips(N_TEST_FILES, rng)
    int16 = variant == "audio_int16_unscaled"

    netG = Generator(args["n_mel_channels"], args["ngf"], args["n_residual_layers"])
    netD = Discriminator(args["num_D"], args["ndf"], args["n_layers_D"], args["downsamp_factor"])
    fft = Audio2Mel(n_mel_channels=args["n_mel_channels"], clamp=variant != "log_mel_unclamped")

    optG = torch.optim.Adam(netG.parameters(), lr=1e-4, betas=(0.5, 0.9))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-4, betas=(0.5, 0.9))

    train_set = AudioDataset(train_clips, args["seq_len"], sampling_rate=SR, int16=int16)
    test_set = AudioDataset(test_clips, TEST_LEN, sampling_rate=SR, augment=False, int16=int16)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args["batch_size"], num_workers=0)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=1)

    test_voc, test_audio = [], []
    for i, x_t in enumerate(test_loader):
        s_t = fft(x_t).detach()
        test_voc.append(s_t)
        test_audio.append(x_t)
        if i == args["n_test_samples"] - 1:
            break

    feat_weights = 4.0 / (args["n_layers_D"] + 1)
    D_weights = 1.0 / args["num_D"]
    wt = D_weights * feat_weights

    def generator_loss(x_pred_t: torch.Tensor, x_t: torch.Tensor) -> torch.Tensor:
        """The generator's objective of train.py, for nndx's probes: adversarial + feature matching."""
        D_fake = netD(x_pred_t)
        with torch.no_grad():
            D_real = netD(x_t)
        loss_G = 0
        for scale in D_fake:
            loss_G += -scale[-1].mean()
        loss_feat = 0
        for i in range(args["num_D"]):
            for j in range(len(D_fake[i]) - 1):
                loss_feat += wt * F.l1_loss(D_fake[i][j], D_real[i][j].detach())
        return loss_G + args["lambda_feat"] * loss_feat

    with torch.random.fork_rng():  # the first batch, drawn without moving the program's random streams
        py_state, np_state = random.getstate(), np.random.get_state()
        x_probe = next(iter(torch.utils.data.DataLoader(train_set, batch_size=args["batch_size"])))
        random.setstate(py_state)
        np.random.set_state(np_state)
    probe_batch = (fft(x_probe).detach(), x_probe)
    nx.preflight(netG, probe_batch, generator_loss, optimizer=optG)
    monG = nx.monitor(netG, optG, every=5)
    monD = nx.monitor(netD, optD, every=5)

    costs = []
    steps = 0
    for _epoch in range(1, args["epochs"] + 1):
        costs = []
        for _iterno, x_t in enumerate(train_loader):
            s_t = fft(x_t).detach()
            x_pred_t = netG(s_t)

            with torch.no_grad():
                s_pred_t = fft(x_pred_t.detach())
                s_error = F.l1_loss(s_t, s_pred_t).item()

            # Train Discriminator
            D_fake_det = netD(x_pred_t.detach())
            D_real = netD(x_t)

            loss_D = 0
            for scale in D_fake_det:
                loss_D += F.relu(1 + scale[-1]).mean()
            for scale in D_real:
                loss_D += F.relu(1 - scale[-1]).mean()

            netD.zero_grad()
            loss_D.backward()
            optD.step()

            # Train Generator
            D_fake = netD(x_pred_t)

            loss_G = 0
            for scale in D_fake:
                loss_G += -scale[-1].mean()

            loss_feat = 0
            for i in range(args["num_D"]):
                for j in range(len(D_fake[i]) - 1):
                    loss_feat += wt * F.l1_loss(D_fake[i][j], D_real[i][j].detach())

            netG.zero_grad()
            (loss_G + args["lambda_feat"] * loss_feat).backward()
            optG.step()

            costs.append([loss_D.item(), loss_G.item(), loss_feat.item(), s_error])
            total_G = loss_G + args["lambda_feat"] * loss_feat
            nx.timed(lambda: monD.log(loss_D))  # noqa: B023
            nx.timed(lambda: monG.log(total_G))  # noqa: B023
            steps += 1

    nx.finish(monG, netG, probe_batch, generator_loss, optimizer=optG)
    nx.finish(monD)

    with torch.no_grad():
        errors = [F.l1_loss(voc, fft(netG(voc))).item() for voc in test_voc]
    last = np.asarray(costs).mean(0)
    return {"test_mel_error": float(np.mean(errors)), "last_epoch_s_error": float(last[3]),
            "last_epoch_loss_D": float(last[0]), "last_epoch_loss_G": float(last[1]),
            "last_epoch_loss_feat": float(last[2]), "steps": float(steps)}  # fmt: skip
