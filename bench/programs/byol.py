"""Port of lucidrains/byol-pytorch: BYOL, an online network with a predictor regressing an EMA target network.

Source: github.com/lucidrains/byol-pytorch, ``byol_pytorch/byol_pytorch.py`` and the training
loop of its ``README.md`` at commit 299312613c1f44923e7869d1c82be7d536c2c42b (MIT, Copyright
(c) 2020 Phil Wang). Written anew from the facts of those files; no code copied.

Kept: ``BYOL(net, image_size, hidden_layer="avgpool")`` with its defaults: ``NetWrapper``
reading the hidden layer through a forward hook (output flattened), the projector built
lazily on the first forward (a ``singleton``) as ``MLP`` = Linear -> BatchNorm1d -> ReLU ->
Linear, preceded (``use_simplicial_embeddings=True``, the default) by Linear -> BatchNorm1d
and the simplicial embedding ``SEM`` (softmax over groups of ``dim_simplex`` at temperature
0.1); the online predictor ``MLP(projection_size, projection_size, hidden)``; the target
encoder a ``deepcopy`` of the online encoder with ``requires_grad=False``, made on first use;
the mock forward in ``__init__`` that creates both; ``EMA(0.99)`` and
``update_moving_average`` (``old * beta + (1 - beta) * new`` over the parameters);
``forward``: two draws of ``DEFAULT_AUG`` on the batch, both views through the online encoder
and predictor in one batch, the target projections under ``no_grad`` (detached), the
symmetric ``cosine_loss_fn`` (``2 - 2 cos``) of each prediction against the other view's
target, ``.mean()``. ``DEFAULT_AUG`` is an ``nn.Sequential`` of torchvision transforms applied
to the whole batch tensor, so each transform draws its random parameters once per batch:
``RandomApply(ColorJitter(0.8, 0.8, 0.8, 0.2), p=0.3)``, ``RandomGrayscale(p=0.2)``,
``RandomHorizontalFlip()``, ``RandomApply(GaussianBlur((3, 3), (1.0, 2.0)), p=0.2)``,
``RandomResizedCrop``, ``Normalize`` (ImageNet mean/std). The README loop: images in,
``loss = learner(images)``, ``opt.zero_grad()``, ``backward``, ``step``,
``learner.update_moving_average()``, with ``Adam(learner.parameters(), lr=3e-4)``.
Shrunk: scikit-learn's 8x8 digits (1,437 training images, 360 held out) upscaled to 16x16,
grey in 3 channels, in [0, 1] (``ToTensor``'s range), instead of 256x256 photos;
torchvision's ResNet-18 with stage widths 8/16/32/64 instead of ResNet-50 (``avgpool``
gives 64 features); ``projection_size`` 64 and ``projection_hidden_size`` 128 instead of
256 and 4096, 16 simplices of 8 instead of 32 of 8; ``RandomResizedCrop`` scale (0.5, 1)
instead of (0.08, 1) (an 8% crop of a 16x16 digit is unreadable); batches of 32 shuffled
training images (the README's ``sample_unlabelled_images`` gives 20 random ones), 3 epochs
(132 steps) instead of the README's 100 steps of 256x256 images. The augmentations draw from
torch's global generator and Python's ``random``. The measure (not part of the program) is a
weighted kNN (k 20, the MoCo demo's) on the representation (``return_embedding=True``) of the
held-out images against the training images, and BYOL's own loss on the held-out images with
two independent augmentations (fixed seeds), model in eval mode.

nndx, as the author would add it: a preflight ``nndx.probe`` on the learner itself (the module
whose forward returns the loss) with the first batch of images and a loss function that returns
the learner's output, ``nndx.Monitor(learner, opt)`` around the loop with each step's loss
logged, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
import random
from functools import wraps

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.simclr import ResNet18, _grey, color_jitter
from nndx.report import CauseCode as C

NAME = "byol"
SOURCE = Source("lucidrains/byol-pytorch", "byol_pytorch/byol_pytorch.py", "299312613c1f44923e7869d1c82be7d536c2c42b",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (the README's loop, the module's defaults)"),
        Variant(
            "lars_lr_with_adam",
            "Adam given the paper's LARS learning rate 0.2 instead of the README's 3e-4",
            (C.LR_TOO_HIGH,),
            ("https://github.com/lucidrains/byol-pytorch/issues/44",
             "https://github.com/lucidrains/byol-pytorch/issues/39"),
            Measure("knn_acc", "held-out kNN accuracy of the representation at least 0.05 below the healthy run's "
                    "(0.439/0.378/0.525 against 0.625/0.567/0.650 on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "views_not_independent",
            "forward augments the batch once and uses that one view twice (image_two = image_one) instead of "
            "two draws of the augmentation: every positive pair is two identical images",
            (C.DATA_LEAKAGE,),
            ("https://github.com/sthalles/SimCLR/issues/9",
             "https://github.com/catalyst-team/catalyst/pull/1278",
             "https://github.com/microsoft/A-CLIP/pull/4"),
            Measure("heldout_loss", "BYOL's loss on held-out images with two independent augmentations at least "
                    "1.08x the healthy run's (2.33/2.29/2.13 against 2.02/2.07/1.94 on seeds 0-2, while its training "
                    "loss ends lower: 1.41/1.36/1.43 against 2.01/2.04/1.94)",
                    lambda healthy, buggy: not buggy < 1.08 * healthy),
        ),
    )
}

SIZE = 16
CROP_SCALE = (0.5, 1.0)
BATCH, EPOCHS, LR = 32, 3, 3e-4
PROJECTION, HIDDEN, SIMPLICES, SIMPLEX_DIM = 64, 128, 16, 8


# --------------------------------------------------------------------------- helpers


def default(val, def_val):
    return def_val if val is None else val


def l2norm(t: torch.Tensor) -> torch.Tensor:
    return F.normalize(t, dim=-1, p=2)


def flatten(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


def singleton(cache_key: str):
    def inner_fn(fn):
        @wraps(fn)
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None:
                return instance
            instance = fn(self, *args, **kwargs)
            setattr(self, cache_key, instance)
            return instance

        return wrapper

    return inner_fn


def set_requires_grad(model: nn.Module, val: bool) -> None:
    for p in model.parameters():
        p.requires_grad = val


def cosine_loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 - 2 * (l2norm(x) * l2norm(y)).sum(dim=-1)


class SEM(nn.Module):
    """Simplicial embeddings: softmax over groups of ``dim_simplex`` at a temperature."""

    def __init__(self, dim: int, temperature: float = 0.1, dim_simplex: int = 8) -> None:
        super().__init__()
        assert dim % dim_simplex == 0
        self.dim, self.dim_simplex, self.temperature = dim, dim_simplex, temperature

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        shape = t.shape
        t = t.reshape(*shape[:-1], -1, self.dim_simplex)
        return (t / self.temperature).softmax(dim=-1).reshape(shape)


# --------------------------------------------------------------------------- DEFAULT_AUG (torchvision's, on a batch)


def _batch_params(fn):
    """A torchvision transform on a batch tensor: one random draw for the whole batch (here: one
    seed from the global generator, the per-image function replayed with it for every image)."""

    def apply(x: torch.Tensor) -> torch.Tensor:
        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        return torch.stack([fn(img, torch.Generator().manual_seed(seed)) for img in x])

    return apply


def _resized_crop(img: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    _, height, width = img.shape
    area = height * width
    for _ in range(10):
        target_area = area * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * torch.rand(1, generator=generator).item())
        log_r = (math.log(3 / 4), math.log(4 / 3))
        aspect = math.exp(log_r[0] + (log_r[1] - log_r[0]) * torch.rand(1, generator=generator).item())
        w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            j = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            break
    else:
        i, j, h, w = 0, 0, height, width
    crop = img[:, i : i + h, j : j + w].unsqueeze(0)
    return F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", align_corners=False, antialias=True)[0]


def _blur(img: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``GaussianBlur((3, 3), sigma=(1.0, 2.0))``: reflection padding, a separable 3-tap kernel."""
    sigma = 1.0 + torch.rand(1, generator=generator).item()
    x = torch.arange(-1, 2, dtype=torch.float32)
    kernel = torch.exp(-(x**2) / (2 * sigma * sigma))
    kernel = (kernel / kernel.sum()).tolist()
    out = F.pad(img.unsqueeze(0), (1, 1, 1, 1), mode="reflect")[0]
    out = sum(wt * out[:, i : i + SIZE, :] for i, wt in enumerate(kernel))
    return sum(wt * out[:, :, i : i + SIZE] for i, wt in enumerate(kernel))


class RandomApply(nn.Module):
    def __init__(self, fn, p: float) -> None:
        super().__init__()
        self.fn, self.p = fn, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if random.random() > self.p:
            return x
        return self.fn(x)


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _random_grayscale(x: torch.Tensor) -> torch.Tensor:
    if torch.rand(1).item() < 0.2:
        return torch.stack([_grey(img).repeat(3, 1, 1) for img in x])
    return x


def _random_hflip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1) if torch.rand(1).item() < 0.5 else x


IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def default_aug() -> nn.Module:
    return nn.Sequential(
        RandomApply(Lambda(_batch_params(lambda img, g: color_jitter(img, 0.8, 0.2, g))), p=0.3),
        Lambda(_random_grayscale),
        Lambda(_random_hflip),
        RandomApply(Lambda(_batch_params(_blur)), p=0.2),
        Lambda(_batch_params(_resized_crop)),
        Lambda(lambda x: (x - IMAGENET_MEAN) / IMAGENET_STD),
    )


# --------------------------------------------------------------------------- byol_pytorch.py


class EMA:
    def __init__(self, beta: float) -> None:
        self.beta = beta

    def update_average(self, old, new):
        if old is None:
            return new
        return old * self.beta + (1 - self.beta) * new


def update_moving_average(ema_updater: EMA, ma_model: nn.Module, current_model: nn.Module) -> None:
    for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters()):
        ma_params.data = ema_updater.update_average(ma_params.data, current_params.data)


def MLP(dim: int, projection_size: int, hidden_size: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden_size), nn.BatchNorm1d(hidden_size), nn.ReLU(inplace=True),
                         nn.Linear(hidden_size, projection_size))  # fmt: skip


class NetWrapper(nn.Module):
    def __init__(self, net: nn.Module, projection_size: int, projection_hidden_size: int, layer="avgpool",
                 sem_num_simplices: int = 32, sem_simplex_dim: int = 8, sem_temperature: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.net, self.layer = net, layer
        self.projector = None
        self.projection_size, self.projection_hidden_size = projection_size, projection_hidden_size
        self.sem_num_simplices, self.sem_simplex_dim, self.sem_temperature = (
            sem_num_simplices, sem_simplex_dim, sem_temperature)  # fmt: skip
        self.hidden: dict = {}
        self.hook_registered = False

    def _find_layer(self):
        return dict([*self.net.named_modules()]).get(self.layer, None)

    def _hook(self, _, inputs, output) -> None:
        self.hidden[inputs[0].device] = flatten(output)

    def _register_hook(self) -> None:
        layer = self._find_layer()
        assert layer is not None, f"hidden layer ({self.layer}) not found"
        layer.register_forward_hook(self._hook)
        self.hook_registered = True

    @singleton("projector")
    def _get_projector(self, hidden: torch.Tensor) -> nn.Module:
        _, dim = hidden.shape
        sem_dim = self.sem_num_simplices * self.sem_simplex_dim
        projector = MLP(sem_dim, self.projection_size, self.projection_hidden_size)
        embedder = nn.Sequential(nn.Linear(dim, sem_dim), nn.BatchNorm1d(sem_dim))
        sem = SEM(sem_dim, temperature=self.sem_temperature, dim_simplex=self.sem_simplex_dim)
        return nn.Sequential(embedder, sem, projector).to(hidden)

    def get_representation(self, x: torch.Tensor) -> torch.Tensor:
        if not self.hook_registered:
            self._register_hook()
        self.hidden.clear()
        _ = self.net(x)
        hidden = self.hidden[x.device]
        self.hidden.clear()
        return hidden

    def forward(self, x: torch.Tensor, return_projection: bool = True):
        representation = self.get_representation(x)
        if not return_projection:
            return representation
        projector = self._get_projector(representation)
        return projector(representation), representation


class BYOL(nn.Module):
    def __init__(self, net: nn.Module, image_size: int, hidden_layer="avgpool", projection_size: int = 256,
                 projection_hidden_size: int = 4096, moving_average_decay: float = 0.99,
                 sem_num_simplices: int = 32, sem_simplex_dim: int = 8) -> None:  # fmt: skip
        super().__init__()
        self.net = net
        self.augment1 = default_aug()
        self.augment2 = self.augment1
        self.online_encoder = NetWrapper(net, projection_size, projection_hidden_size, layer=hidden_layer,
                                         sem_num_simplices=sem_num_simplices, sem_simplex_dim=sem_simplex_dim)  # fmt: skip
        self.one_view = False
        self.target_encoder = None
        self.target_ema_updater = EMA(moving_average_decay)
        self.online_predictor = MLP(projection_size, projection_size, projection_hidden_size)
        # send a mock image tensor to instantiate singleton parameters
        self.forward(torch.randn(2, 3, image_size, image_size))

    @singleton("target_encoder")
    def _get_target_encoder(self) -> nn.Module:
        target_encoder = copy.deepcopy(self.online_encoder)
        set_requires_grad(target_encoder, False)
        return target_encoder

    def update_moving_average(self) -> None:
        assert self.target_encoder is not None, "target encoder has not been created yet"
        update_moving_average(self.target_ema_updater, self.target_encoder, self.online_encoder)

    def forward(self, x: torch.Tensor, return_embedding: bool = False, return_projection: bool = True):
        assert not (self.training and x.shape[0] == 1), "you must have greater than 1 sample when training"
        if return_embedding:
            return self.online_encoder(x, return_projection=return_projection)
        image_one = self.augment1(x)
        image_two = image_one if self.one_view else self.augment2(x)  # the bug: one draw, used twice
        images = torch.cat((image_one, image_two), dim=0)
        online_projections, _ = self.online_encoder(images)
        online_predictions = self.online_predictor(online_projections)
        online_pred_one, online_pred_two = online_predictions.chunk(2, dim=0)
        with torch.no_grad():
            target_encoder = self._get_target_encoder()
            target_projections, _ = target_encoder(images)
            target_projections = target_projections.detach()
            target_proj_one, target_proj_two = target_projections.chunk(2, dim=0)
        loss_one = cosine_loss_fn(online_pred_one, target_proj_two.detach())
        loss_two = cosine_loss_fn(online_pred_two, target_proj_one.detach())
        return (loss_one + loss_two).mean()


# --------------------------------------------------------------------------- the README's loop


@torch.no_grad()
def knn_acc(learner: BYOL, memory, memory_labels, test, test_labels, k: int = 20, t: float = 0.1) -> float:
    """Measure only: weighted kNN on the normalised representations, eval mode."""
    learner.eval()
    bank = F.normalize(learner(memory, return_embedding=True, return_projection=False), dim=1)
    feats = F.normalize(learner(test, return_embedding=True, return_projection=False), dim=1)
    sim_weight, sim_indices = (feats @ bank.T).topk(k=k, dim=-1)
    one_hot = torch.zeros(len(test), k, 10).scatter_(-1, memory_labels[sim_indices].unsqueeze(-1), 1.0)
    scores = (one_hot * (sim_weight / t).exp().unsqueeze(-1)).sum(dim=1)
    learner.train()
    return float((scores.argmax(1) == test_labels).float().mean())


@torch.no_grad()
def heldout_loss(learner: BYOL, test: torch.Tensor, seed: int) -> float:
    """Measure only: BYOL's loss on the held-out images with two independent draws of the
    augmentation (fixed seeds: the same views for every variant), eval mode."""
    learner.eval()
    one_view, learner.one_view = learner.one_view, False
    state, py_state = torch.get_rng_state(), random.getstate()
    torch.manual_seed(10_000 + seed)
    random.seed(10_000 + seed)
    losses = [learner(test[i : i + BATCH]).item() for i in range(0, len(test) - BATCH + 1, BATCH)]
    torch.set_rng_state(state)
    random.setstate(py_state)
    learner.one_view = one_view
    learner.train()
    return float(np.mean(losses))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x = data.upscaled(train_images, SIZE).repeat(1, 3, 1, 1)
    test_x = data.upscaled(test_images, SIZE).repeat(1, 3, 1, 1)
    loader = DataLoader(TensorDataset(train_x), batch_size=BATCH, shuffle=True, drop_last=True)

    resnet = ResNet18(num_classes=10)
    learner = BYOL(resnet, image_size=SIZE, hidden_layer="avgpool", projection_size=PROJECTION,
                   projection_hidden_size=HIDDEN, sem_num_simplices=SIMPLICES, sem_simplex_dim=SIMPLEX_DIM)  # fmt: skip
    learner.one_view = variant == "views_not_independent"
    opt = torch.optim.Adam(learner.parameters(), lr=0.2 if variant == "lars_lr_with_adam" else LR)

    def byol_loss(loss: torch.Tensor, _target) -> torch.Tensor:
        return loss  # the learner's forward returns the loss itself

    probe_batch = (train_x[:BATCH], None)
    nx.preflight(learner, probe_batch, byol_loss, optimizer=opt)
    mon = nx.monitor(learner, opt, every=10)
    losses: list[float] = []
    for _ in range(EPOCHS):
        for (images,) in loader:
            loss = learner(images)
            opt.zero_grad()
            loss.backward()
            opt.step()
            learner.update_moving_average()  # update moving average of target encoder
            mon.log(loss)
            losses.append(loss.item())
    nx.finish(mon, learner, probe_batch, byol_loss, optimizer=opt)

    return {
        "heldout_loss": heldout_loss(learner, test_x, seed),
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
        "knn_acc": knn_acc(learner, train_x, train_labels, test_x, test_labels),
    }
