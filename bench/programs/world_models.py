"""Port of ctallec's World Models (PyTorch): a convolutional VAE of the frames, trained first
(``trainvae.py``), then an MDN-RNN over the VAE's latents (``trainmdrnn.py``): an LSTM whose
head gives a Gaussian mixture over the next latent, a reward and a terminal logit.

Source: github.com/ctallec/world-models, ``trainvae.py``, ``trainmdrnn.py``, ``models/vae.py``,
``models/mdrnn.py``, ``utils/misc.py``, ``utils/learning.py`` and ``data/loaders.py`` at commit
d6abd9ce97409734a766eb67ccf0d1967ba9bf0c (MIT, Copyright (c) 2018 Corentin Tallec). Written
anew from the facts of those files; no code copied.

Kept, VAE: ``Encoder`` = stride-2 ``Conv2d(k=4)`` + ``F.relu`` blocks, flatten, ``fc_mu`` and
``fc_logsigma``; ``Decoder`` = ``fc1`` + ``F.relu``, ``unsqueeze`` to 1x1, stride-2
``ConvTranspose2d`` blocks with ``F.relu``, the last one through a sigmoid; ``VAE.forward``:
``sigma = logsigma.exp()``, ``z = eps * sigma + mu``, returns ``(recon_x, mu, logsigma)``;
``loss_function`` = ``F.mse_loss(recon_x, x, size_average=False)`` (summed; written
``reduction="sum"``) + ``KLD = -0.5 * sum(1 + 2 * logsigma - mu^2 - exp(2 * logsigma))``;
``optim.Adam(model.parameters())`` (lr 1e-3); the repository's own ``ReduceLROnPlateau('min',
factor=0.5, patience=5)`` and ``EarlyStopping('min', patience=30)`` (``utils/learning.py``,
rewritten here) stepped on the test loss after each epoch; the training transform's
``RandomHorizontalFlip``; ``train(epoch)``: ``model.train()``, the next file buffer, per batch
``zero_grad`` / forward / loss / ``backward`` / ``step``; ``test()``: ``model.eval()``,
``torch.no_grad()``, the loss summed and divided by the data set size; batch 32; the best model
by test loss kept (``save_checkpoint(..., is_best)``) and loaded by the MDRNN script. MDRNN:
``MDRNN(latents, actions, hiddens, gaussians=5)`` = ``nn.LSTM(latents + actions, hiddens)``
(sequence-first) and ``gmm_linear = Linear(hiddens, (2 * latents + 1) * gaussians + 2)`` cut
into the means, ``exp`` of the sigmas, ``log_softmax`` of the mixture logits, the reward and
the terminal logit; ``gmm_loss`` (the log-sum-exp with the max subtracted, the mean over batch
and time); ``get_loss``: the arrays transposed to (time, batch), ``(gmm + bce) / (LSIZE + 1)``
without ``--include_reward`` (the README's command); ``torch.optim.RMSprop(lr=1e-3,
alpha=.9)``, the same plateau scheduler and early stopping on the test loss; ``to_latent``
under ``torch.no_grad()`` (the frames resized to ``RED_SIZE``, the whole VAE run, a latent
sampled from its mu and sigma); ``RolloutSequenceDataset``: windows of ``SEQ_LEN + 1`` frames,
``obs = frames[:-1]``, ``next_obs = frames[1:]``, the action, reward and terminal from
``seq_index + 1`` on (``data/carracing.py`` stores the frame each action produced at that
action's index), one file buffer loaded per pass; ``BSIZE`` 16; the train loader shuffled,
the test loader not.
Shrunk: CarRacing's 64x64 frames become 16x16 frames drawn by numpy from a small top-down
driving model (a straight grey road on grass placed by the car's lateral offset and heading, a
red car, a black dashboard with a speed bar; the wheel sets the heading, gas and brake the
speed), the rollouts recorded as ``generation_script.py --policy white`` records them
(``env.action_space.sample()`` every step, in CarRacing's box [-1, 1] x [0, 1] x [0, 1]; the
script's default, ``brown``, changes the action by sqrt(1/50) a step); a rollout is 48 frames
instead of 1,000, 40 rollouts train and 10 test instead of 10,000 / 600. VAE: two conv blocks
of 32-64 channels and two deconv blocks (kernels 6, ``fc1`` 128 wide) instead of four of
32-64-128-256 and four deconvs (``fc1`` 1024), ``LSIZE`` 4 instead of 32; file buffers of 20
rollouts instead of 200; 12 epochs instead of 1,000 (early stopping never reached). MDRNN:
``RSIZE`` 64 instead of 256, ``SEQ_LEN`` 8 instead of 32; buffers of 8 (train) / 4 (test)
rollouts instead of 30 / 10; 10 epochs instead of 30. No tqdm, no image samples, no files.
Measure only (not in the program): the best VAE's reconstruction error on all test frames
with the published summed MSE (per frame, z sampled, seeded) and its KL term; the MDRNN's
test loss and test GMM negative log-likelihood per latent dimension from its last ``test``
pass.

nndx, as the author would add it to each script: ``trainvae.py``: a preflight ``nndx.probe``
of the VAE on the first 32 training frames, batch ``(x, x)``, with ``loss_function`` as
``loss_fn(output, x)``, ``nndx.Monitor(model, optimizer)`` around the epochs, each batch's
loss per frame (the number the script prints) and each epoch's test loss (``split="val"``)
logged, then ``nndx.probe(..., monitor=mon)``;
``trainmdrnn.py``: the same with the MDRNN, batch ``((action, latent_obs), (latent_next_obs,
reward, terminal))`` (time first) from the first training window and ``get_loss``'s loss as
``loss_fn``. Each script's diagnosis is read; the two ranked together.
"""

from __future__ import annotations

import copy
import math
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions.normal import Normal
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "world_models"
SOURCE = Source("ctallec/world-models", "trainmdrnn.py", "d6abd9ce97409734a766eb67ccf0d1967ba9bf0c", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the programs as published (shrunk: 16x16 synthetic driving frames, small nets, 12+10 epochs)"),
        Variant(
            "actions_off_by_one",
            "RolloutSequenceDataset reads action = actions[seq_index:seq_index + seq_len] instead of from "
            "seq_index + 1: each transition obs -> next_obs is paired with the action that produced obs, not the one "
            "taken from it, so the MDN-RNN is never shown the action that moves the car",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/epignatelli/navix/pull/152",
             "https://github.com/danijar/dreamer/issues/8",
             "https://github.com/galilai-group/stable-worldmodel/issues/293"),
            Measure("mdrnn_test_gmm", "MDRNN test GMM negative log-likelihood per latent dimension at least 0.03 "
                    "nats above the healthy run's: 1.270 / 1.203 / 1.296 against 1.222 / 1.148 / 1.228 healthy on "
                    "seeds 0 / 1 / 2 (a standard normal scores 1.419)",
                    lambda healthy, buggy: not buggy < healthy + 0.03),
        ),
        Variant(
            "recon_loss_mean_reduction",
            "trainvae.py's deprecated F.mse_loss(recon_x, x, size_average=False) rewritten as F.mse_loss(recon_x, x) "
            "(reduction='mean'): the reconstruction term becomes a per-pixel mean, 768x smaller beside the summed "
            "KL term, and the posterior collapses: the latents the MDN-RNN models carry nothing of the frame",
            (C.WRONG_LOSS,),
            ("https://github.com/AppliedDataSciencePartners/WorldModels/issues/12",
             "https://github.com/podgorskiy/VAE/issues/1"),
            Measure("vae_test_recon", "VAE test reconstruction error (summed squared error per frame) at least 1.5x "
                    "the healthy run's: 68.7 / 65.9 / 66.4 (KL 0.0) against 33.6 / 33.2 / 34.5 (KL 3.5-3.7) healthy "
                    "on seeds 0 / 1 / 2", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

# utils/misc.py, shrunk
ASIZE, LSIZE, RSIZE, RED_SIZE, SIZE = 3, 4, 64, 16, 16
# trainvae.py
VAE_BATCH, VAE_EPOCHS, VAE_BUFFER = 32, 12, 20
# trainmdrnn.py
BSIZE, SEQ_LEN, MDRNN_EPOCHS, TRAIN_BUFFER, TEST_BUFFER = 16, 8, 10, 8, 4
ROLLOUT_LEN, N_TRAIN_ROLLOUTS, N_TEST_ROLLOUTS = 48, 40, 10


# --------------------------------------------------------------------------- data/generation_script.py, offline


def render(d: float, h: float, v: float) -> np.ndarray:
    """A 16x16 RGB top-down frame (uint8): grass, the straight road ahead of the car placed by
    the car's offset d and relative heading h, the car, a dashboard speed bar of length v."""
    img = np.empty((SIZE, SIZE, 3), dtype=np.float32)
    img[:] = (0.10, 0.60, 0.10)
    rows = np.arange(SIZE - 2)
    ahead = (SIZE - 3 - rows).astype(np.float32)  # rows above the car's
    centre = SIZE / 2 - 0.5 - 3.0 * d - 0.6 * ahead * math.tan(h)
    cols = np.arange(SIZE)[None, :]
    road = np.abs(cols - centre[:, None]) < 3.5
    img[: SIZE - 2][road] = (0.85, 0.85, 0.85)
    img[SIZE - 5 : SIZE - 3, SIZE // 2 - 1 : SIZE // 2 + 1] = (0.85, 0.10, 0.10)  # the car
    img[SIZE - 2 :] = 0.0  # dashboard
    img[SIZE - 2 :, : int(round(v * SIZE))] = 1.0  # true speed
    return (img * 255).astype(np.uint8)


def rollout(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One rollout as carracing.py saves it: the frame at index t is the one action t produced."""
    # generation_script.py --policy white: env.action_space.sample() at every step
    actions = rng.uniform([-1.0, 0.0, 0.0], [1.0, 1.0, 1.0], size=(ROLLOUT_LEN, 3)).astype(np.float32)
    d, v = rng.uniform(-0.5, 0.5), rng.uniform(0.2, 0.6)
    frames, rewards, dones = [], [], []
    for t in range(ROLLOUT_LEN):
        steer, gas, brake = actions[t]
        v = float(np.clip(v + 0.25 * (gas - brake), 0.0, 1.0))
        h = 0.5 * float(steer)  # the car turns with the wheel
        d = float(np.clip(0.9 * d + 1.2 * math.sin(h) * (0.2 + v), -2.0, 2.0))
        frames.append(render(d, h, v))
        rewards.append((1.0 if abs(d) < 0.9 else 0.0) * v - 0.1)
        dones.append(t == ROLLOUT_LEN - 1)
    return {"observations": np.stack(frames), "actions": actions, "rewards": np.array(rewards, dtype=np.float32),
            "terminals": np.array(dones)}  # fmt: skip


def rollouts(seed: int) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(1000 + seed)
    files = [rollout(rng) for _ in range(N_TRAIN_ROLLOUTS + N_TEST_ROLLOUTS)]
    return files[:-N_TEST_ROLLOUTS], files[-N_TEST_ROLLOUTS:]  # _files[:-600] / _files[-600:]


# --------------------------------------------------------------------------- data/loaders.py


class _RolloutDataset(Dataset):
    def __init__(self, files: list[dict], transform, buffer_size: int) -> None:
        self._files = files
        self._transform = transform
        self._buffer_size = buffer_size
        self._buffer_index = 0
        self._buffer: list[dict] = []
        self._cum_size: list[int] | None = None

    def load_next_buffer(self) -> None:
        chosen = self._files[self._buffer_index : self._buffer_index + self._buffer_size]
        self._buffer_index = (self._buffer_index + self._buffer_size) % len(self._files)
        self._buffer, self._cum_size = [], [0]
        for data in chosen:
            self._buffer.append(data)
            self._cum_size.append(self._cum_size[-1] + self._data_per_sequence(data["rewards"].shape[0]))

    def __len__(self) -> int:
        if not self._cum_size:
            self.load_next_buffer()
        return self._cum_size[-1]

    def __getitem__(self, i: int):
        file_index = int(np.searchsorted(self._cum_size, i, side="right")) - 1
        return self._get_data(self._buffer[file_index], i - self._cum_size[file_index])

    def _data_per_sequence(self, data_length: int) -> int:
        raise NotImplementedError

    def _get_data(self, data: dict, seq_index: int):
        raise NotImplementedError


class RolloutObservationDataset(_RolloutDataset):
    def _data_per_sequence(self, data_length: int) -> int:
        return data_length

    def _get_data(self, data: dict, seq_index: int):
        return self._transform(data["observations"][seq_index])


class RolloutSequenceDataset(_RolloutDataset):
    def __init__(self, files, seq_len: int, transform, buffer_size: int, action_offset: int = 1) -> None:
        super().__init__(files, transform, buffer_size)
        self._seq_len = seq_len
        self._action_offset = action_offset  # 1 as published; 0 the actions_off_by_one bug

    def _data_per_sequence(self, data_length: int) -> int:
        return data_length - self._seq_len

    def _get_data(self, data: dict, seq_index: int):
        obs_data = data["observations"][seq_index : seq_index + self._seq_len + 1]
        obs_data = self._transform(obs_data.astype(np.float32))
        obs, next_obs = obs_data[:-1], obs_data[1:]
        a = seq_index + self._action_offset
        action = data["actions"][a : a + self._seq_len].astype(np.float32)
        reward, terminal = [data[key][seq_index + 1 : seq_index + self._seq_len + 1].astype(np.float32)
                            for key in ("rewards", "terminals")]  # fmt: skip
        return obs, action, reward, terminal, next_obs


def to_tensor(frame: np.ndarray) -> torch.Tensor:
    """transforms.ToPILImage + Resize((RED_SIZE, RED_SIZE)) (the same size here) + ToTensor."""
    return torch.from_numpy(frame).permute(2, 0, 1).contiguous().float().div(255.0)


class RandomHorizontalFlip:
    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.flip(-1) if torch.rand(1, generator=self.generator).item() < 0.5 else img


# --------------------------------------------------------------------------- models/vae.py


class Decoder(nn.Module):
    def __init__(self, img_channels: int, latent_size: int) -> None:
        super().__init__()
        self.latent_size, self.img_channels = latent_size, img_channels
        self.fc1 = nn.Linear(latent_size, 128)
        self.deconv1 = nn.ConvTranspose2d(128, 16, 6, stride=2)  # 1 -> 6
        self.deconv2 = nn.ConvTranspose2d(16, img_channels, 6, stride=2)  # 6 -> 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = x.unsqueeze(-1).unsqueeze(-1)
        x = F.relu(self.deconv1(x))
        return torch.sigmoid(self.deconv2(x))


class Encoder(nn.Module):
    def __init__(self, img_channels: int, latent_size: int) -> None:
        super().__init__()
        self.latent_size, self.img_channels = latent_size, img_channels
        self.conv1 = nn.Conv2d(img_channels, 32, 4, stride=2)  # 16 -> 7
        self.conv2 = nn.Conv2d(32, 64, 4, stride=2)  # 7 -> 2
        self.fc_mu = nn.Linear(2 * 2 * 64, latent_size)
        self.fc_logsigma = nn.Linear(2 * 2 * 64, latent_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = x.view(x.size(0), -1)
        return self.fc_mu(x), self.fc_logsigma(x)


class VAE(nn.Module):
    def __init__(self, img_channels: int, latent_size: int) -> None:
        super().__init__()
        self.encoder = Encoder(img_channels, latent_size)
        self.decoder = Decoder(img_channels, latent_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logsigma = self.encoder(x)
        sigma = logsigma.exp()
        eps = torch.randn_like(sigma)
        z = eps.mul(sigma).add_(mu)
        return self.decoder(z), mu, logsigma


# --------------------------------------------------------------------------- models/mdrnn.py


def gmm_loss(batch: torch.Tensor, mus: torch.Tensor, sigmas: torch.Tensor, logpi: torch.Tensor,
             reduce: bool = True) -> torch.Tensor:  # fmt: skip
    """- mean log of sum_k pi_k N(batch | mu_k, sigma_k), over every batch dimension."""
    batch = batch.unsqueeze(-2)
    normal_dist = Normal(mus, sigmas)
    g_log_probs = normal_dist.log_prob(batch)
    g_log_probs = logpi + torch.sum(g_log_probs, dim=-1)
    max_log_probs = torch.max(g_log_probs, dim=-1, keepdim=True)[0]
    g_log_probs = g_log_probs - max_log_probs
    g_probs = torch.exp(g_log_probs)
    probs = torch.sum(g_probs, dim=-1)
    log_prob = max_log_probs.squeeze() + torch.log(probs)
    if reduce:
        return -torch.mean(log_prob)
    return -log_prob


class _MDRNNBase(nn.Module):
    def __init__(self, latents: int, actions: int, hiddens: int, gaussians: int) -> None:
        super().__init__()
        self.latents, self.actions, self.hiddens, self.gaussians = latents, actions, hiddens, gaussians
        self.gmm_linear = nn.Linear(hiddens, (2 * latents + 1) * gaussians + 2)


class MDRNN(_MDRNNBase):
    """MULTI STEPS forward: actions (SEQ_LEN, BSIZE, ASIZE), latents (SEQ_LEN, BSIZE, LSIZE)."""

    def __init__(self, latents: int, actions: int, hiddens: int, gaussians: int) -> None:
        super().__init__(latents, actions, hiddens, gaussians)
        self.rnn = nn.LSTM(latents + actions, hiddens)

    def forward(self, actions: torch.Tensor, latents: torch.Tensor):
        seq_len, bs = actions.size(0), actions.size(1)
        ins = torch.cat([actions, latents], dim=-1)
        outs, _ = self.rnn(ins)
        gmm_outs = self.gmm_linear(outs)
        stride = self.gaussians * self.latents
        mus = gmm_outs[:, :, :stride].view(seq_len, bs, self.gaussians, self.latents)
        sigmas = torch.exp(gmm_outs[:, :, stride : 2 * stride].view(seq_len, bs, self.gaussians, self.latents))
        pi = gmm_outs[:, :, 2 * stride : 2 * stride + self.gaussians].view(seq_len, bs, self.gaussians)
        logpi = F.log_softmax(pi, dim=-1)
        rs = gmm_outs[:, :, -2]
        ds = gmm_outs[:, :, -1]
        return mus, sigmas, logpi, rs, ds


# --------------------------------------------------------------------------- utils/learning.py


class _Plateau:
    def __init__(self, mode: str = "min", patience: int = 10, threshold: float = 1e-4) -> None:
        assert mode == "min"
        self.patience, self.threshold = patience, threshold
        self.best, self.num_bad_epochs, self.last_epoch = float("inf"), 0, -1

    def _better(self, current: float) -> bool:
        return current < self.best * (1.0 - self.threshold)


class EarlyStopping(_Plateau):
    def step(self, metrics: float) -> None:
        self.last_epoch += 1
        if self._better(metrics):
            self.best, self.num_bad_epochs = metrics, 0
        else:
            self.num_bad_epochs += 1

    @property
    def stop(self) -> bool:
        return self.num_bad_epochs > self.patience


class ReduceLROnPlateau(_Plateau):
    """The repository's copy of PyTorch 0.5's scheduler (cooldown 0, min_lr 0, eps 1e-8)."""

    def __init__(self, optimizer: optim.Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10) -> None:
        super().__init__(mode, patience)
        self.optimizer, self.factor, self.eps = optimizer, factor, 1e-8

    def step(self, metrics: float) -> None:
        self.last_epoch += 1
        if self._better(metrics):
            self.best, self.num_bad_epochs = metrics, 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.patience:
            for group in self.optimizer.param_groups:
                old_lr = float(group["lr"])
                new_lr = old_lr * self.factor
                if old_lr - new_lr > self.eps:
                    group["lr"] = new_lr
            self.num_bad_epochs = 0


# --------------------------------------------------------------------------- trainvae.py


def vae_loss_function(recon_x, x, mu, logsigma, reduction: str = "sum") -> torch.Tensor:
    """Reconstruction + KL divergence losses summed over all elements and batch."""
    BCE = F.mse_loss(recon_x, x, reduction=reduction)  # noqa: N806 - size_average=False as published
    KLD = -0.5 * torch.sum(1 + 2 * logsigma - mu.pow(2) - (2 * logsigma).exp())  # noqa: N806
    return BCE + KLD


def train_vae(variant: str, nx: Nndx, seed: int, train_files, test_files) -> tuple[dict, dict[str, float]]:
    torch.manual_seed(123 + seed)
    flips = torch.Generator().manual_seed(seed)
    transform_train = lambda frame: RandomHorizontalFlip(flips)(to_tensor(frame))  # noqa: E731
    dataset_train = RolloutObservationDataset(train_files, transform_train, VAE_BUFFER)
    dataset_test = RolloutObservationDataset(test_files, to_tensor, VAE_BUFFER)
    train_loader = DataLoader(dataset_train, batch_size=VAE_BATCH, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(dataset_test, batch_size=VAE_BATCH, shuffle=True,
                             generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip

    model = VAE(3, LSIZE)
    optimizer = optim.Adam(model.parameters())
    scheduler = ReduceLROnPlateau(optimizer, "min", factor=0.5, patience=5)
    earlystopping = EarlyStopping("min", patience=30)
    reduction = "mean" if variant == "recon_loss_mean_reduction" else "sum"
    loss_function = partial(vae_loss_function, reduction=reduction)

    def loss_fn(output, x):
        recon_batch, mu, logsigma = output
        return loss_function(recon_batch, x, mu, logsigma)

    first = torch.stack([to_tensor(f) for f in train_files[0]["observations"][:VAE_BATCH]])
    probe_batch = (first, first)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    def train(epoch: int) -> float:
        model.train()
        dataset_train.load_next_buffer()
        train_loss = 0.0
        for data in train_loader:
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            nx.timed(lambda: mon.log(loss.item() / len(data)))  # noqa: B023 - the number it prints
        return train_loss / len(train_loader.dataset)

    def test() -> float:
        model.eval()
        dataset_test.load_next_buffer()
        test_loss = 0.0
        with torch.no_grad():
            for data in test_loader:
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar).item()
        return test_loss / len(test_loader.dataset)

    cur_best, best_state = None, None
    for epoch in range(1, VAE_EPOCHS + 1):
        train(epoch)
        test_loss = test()
        nx.timed(lambda: mon.log(test_loss, split="val"))  # noqa: B023
        scheduler.step(test_loss)
        earlystopping.step(test_loss)
        is_best = not cur_best or test_loss < cur_best
        if is_best:
            cur_best = test_loss
            best_state = copy.deepcopy(model.state_dict())  # save_checkpoint(..., is_best, ..., 'best.tar')
        if earlystopping.stop:
            break

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # measure only: the best VAE's reconstruction error with the published summed MSE, and its KL
    best = VAE(3, LSIZE)
    best.load_state_dict(best_state)
    frames = torch.stack([to_tensor(f) for data in test_files for f in data["observations"]])
    with torch.random.fork_rng():
        torch.manual_seed(4321)
        with torch.no_grad():
            recon, mu, logsigma = best(frames)
    recon_err = F.mse_loss(recon, frames, reduction="sum").item() / len(frames)
    kld = (-0.5 * torch.sum(1 + 2 * logsigma - mu.pow(2) - (2 * logsigma).exp())).item() / len(frames)
    return best_state, {"vae_test_loss": cur_best, "vae_test_recon": recon_err, "vae_test_kld": kld}


# --------------------------------------------------------------------------- trainmdrnn.py


def train_mdrnn(variant: str, nx: Nndx, seed: int, vae_state: dict, train_files, test_files) -> dict[str, float]:
    torch.manual_seed(7 + seed)
    vae = VAE(3, LSIZE)
    vae.load_state_dict(vae_state)

    mdrnn = MDRNN(LSIZE, ASIZE, RSIZE, 5)
    optimizer = torch.optim.RMSprop(mdrnn.parameters(), lr=1e-3, alpha=0.9)
    scheduler = ReduceLROnPlateau(optimizer, "min", factor=0.5, patience=5)
    earlystopping = EarlyStopping("min", patience=30)

    def transform(x: np.ndarray) -> torch.Tensor:  # transforms.Lambda(lambda x: np.transpose(x, (0, 3, 1, 2)) / 255)
        return torch.from_numpy(np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)) / 255)).float()

    offset = 0 if variant == "actions_off_by_one" else 1
    train_loader = DataLoader(RolloutSequenceDataset(train_files, SEQ_LEN, transform, TRAIN_BUFFER, offset),
                              batch_size=BSIZE, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(RolloutSequenceDataset(test_files, SEQ_LEN, transform, TEST_BUFFER, offset),
                             batch_size=BSIZE)  # fmt: skip

    def to_latent(obs: torch.Tensor, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            obs, next_obs = [F.interpolate(x.view(-1, 3, SIZE, SIZE), size=RED_SIZE, mode="bilinear",
                                           align_corners=True) for x in (obs, next_obs)]  # fmt: skip
            (obs_mu, obs_logsigma), (next_obs_mu, next_obs_logsigma) = [vae(x)[1:] for x in (obs, next_obs)]
            latent_obs, latent_next_obs = [
                (x_mu + x_logsigma.exp() * torch.randn_like(x_mu)).view(BSIZE, SEQ_LEN, LSIZE)
                for x_mu, x_logsigma in [(obs_mu, obs_logsigma), (next_obs_mu, next_obs_logsigma)]
            ]
        return latent_obs, latent_next_obs

    def losses_of(outputs, latent_next_obs, reward, terminal, include_reward: bool = False) -> dict:
        mus, sigmas, logpi, rs, ds = outputs
        gmm = gmm_loss(latent_next_obs, mus, sigmas, logpi)
        bce = F.binary_cross_entropy_with_logits(ds, terminal)
        if include_reward:
            mse, scale = F.mse_loss(rs, reward), LSIZE + 2
        else:
            mse, scale = 0, LSIZE + 1
        return {"gmm": gmm, "bce": bce, "mse": mse, "loss": (gmm + bce + mse) / scale}

    def get_loss(latent_obs, action, reward, terminal, latent_next_obs) -> dict:
        latent_obs, action, reward, terminal, latent_next_obs = [
            arr.transpose(1, 0) for arr in [latent_obs, action, reward, terminal, latent_next_obs]
        ]
        return losses_of(mdrnn(action, latent_obs), latent_next_obs, reward, terminal)

    def loss_fn(outputs, targets):  # get_loss's loss, as loss_fn(output, target) for nndx
        latent_next_obs, reward, terminal = targets
        return losses_of(outputs, latent_next_obs, reward, terminal)["loss"]

    with torch.random.fork_rng():  # the preflight batch: the first training window, as the loop sees it
        torch.manual_seed(seed + 99)
        train_loader.dataset.load_next_buffer()
        obs, action, reward, terminal, next_obs = next(iter(DataLoader(train_loader.dataset, batch_size=BSIZE)))
        latent_obs, latent_next_obs = to_latent(obs, next_obs)
        train_loader.dataset._buffer_index = 0
    probe_batch = ((action.transpose(1, 0), latent_obs.transpose(1, 0)),
                   (latent_next_obs.transpose(1, 0), reward.transpose(1, 0), terminal.transpose(1, 0)))  # fmt: skip
    nx.preflight(mdrnn, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(mdrnn, optimizer, every=5)

    def data_pass(epoch: int, train: bool) -> tuple[float, float]:
        if train:
            mdrnn.train()
            loader = train_loader
        else:
            mdrnn.eval()
            loader = test_loader
        loader.dataset.load_next_buffer()
        cum_loss, cum_gmm, n = 0.0, 0.0, 0
        for data in loader:
            obs, action, reward, terminal, next_obs = data
            latent_obs, latent_next_obs = to_latent(obs, next_obs)
            if train:
                losses = get_loss(latent_obs, action, reward, terminal, latent_next_obs)
                optimizer.zero_grad()
                losses["loss"].backward()
                optimizer.step()
                nx.timed(lambda: mon.log(losses["loss"]))  # noqa: B023
            else:
                with torch.no_grad():
                    losses = get_loss(latent_obs, action, reward, terminal, latent_next_obs)
            cum_loss += losses["loss"].item()
            cum_gmm += losses["gmm"].item()
            n += 1
        return cum_loss * BSIZE / (n * BSIZE), cum_gmm / LSIZE / n

    cur_best, test_loss, test_gmm = None, float("nan"), float("nan")
    for e in range(MDRNN_EPOCHS):
        data_pass(e, train=True)
        test_loss, test_gmm = data_pass(e, train=False)
        nx.timed(lambda: mon.log(test_loss, split="val"))  # noqa: B023
        scheduler.step(test_loss)
        earlystopping.step(test_loss)
        is_best = not cur_best or test_loss < cur_best
        if is_best:
            cur_best = test_loss
        if earlystopping.stop:
            break

    nx.finish(mon, mdrnn, probe_batch, loss_fn, optimizer=optimizer)
    return {"mdrnn_test_loss": test_loss, "mdrnn_test_gmm": test_gmm, "mdrnn_best_test_loss": cur_best}


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    train_files, test_files = rollouts(seed)
    vae_state, vae_metrics = train_vae(variant, nx, seed, train_files, test_files)
    mdrnn_metrics = train_mdrnn(variant, nx, seed, vae_state, train_files, test_files)
    return {**vae_metrics, **mdrnn_metrics}
