"""Port of yunjey's StarGAN (single dataset, RaFD mode): one generator conditioned on a target
domain label replicated over the image, a PatchGAN critic with an auxiliary domain classifier,
WGAN-GP + domain classification + cycle reconstruction losses, n_critic 5, linear LR decay.

Source: github.com/yunjey/stargan, ``model.py``, ``solver.py`` (``Solver.train``) and
``main.py`` (the defaults) at commit 94dd002e93a2863d9b987a937b85925b80f7a19f (MIT, Copyright
(c) 2017 Yunjey Choi). Written anew from the facts of those files; no code copied.

Kept: ``Generator`` = the label ``c`` viewed (B, c_dim, 1, 1), repeated over H x W and
concatenated to the image; 7x7 conv (no bias) + ``InstanceNorm2d(affine=True,
track_running_stats=True)`` + ReLU; two 4x4 stride-2 convolutions doubling the width;
``repeat_num`` ``ResidualBlock`` s (3x3 conv, IN, ReLU, 3x3 conv, IN, ``x + main(x)``); two
4x4 stride-2 ``ConvTranspose2d`` halving it; 7x7 conv to the image channels + Tanh.
``Discriminator`` = 4x4 stride-2 convolutions with ``LeakyReLU(0.01)`` doubling the width
``repeat_num`` times; ``conv1`` a 3x3 conv to 1 channel (the PatchGAN source map), ``conv2``
a conv of kernel ``image_size / 2^repeat_num`` to ``c_dim`` (the domain logits, viewed (B,
c_dim)); PyTorch's default init. ``Solver.train`` for one dataset in RaFD mode
(``label2onehot``, ``F.cross_entropy`` classification loss): the target labels a
``randperm`` of the batch's own labels; D: ``-mean(D(x_real).src) + lambda_cls * CE(cls,
label_org) + mean(D(G(x, c_trg).detach()).src) + lambda_gp * gp``, the penalty at
``alpha * x_real.data + (1 - alpha) * x_fake.data`` with ``requires_grad_``,
``autograd.grad(..., grad_outputs=ones, retain_graph=True, create_graph=True,
only_inputs=True)``, ``mean((||dydx||_2 - 1)^2)``; ``reset_grad()`` (both optimizers'
``zero_grad``), backward, ``d_optimizer.step()``; every ``n_critic``-th iteration G:
``-mean(D(x_fake).src) + lambda_rec * mean(|x_real - G(x_fake, c_org)|) + lambda_cls *
CE(D(x_fake).cls, label_trg)``, ``reset_grad()``, backward, ``g_optimizer.step()``;
``lambda_cls`` 1, ``lambda_rec`` 10, ``lambda_gp`` 10, ``n_critic`` 5; one ``Adam(lr=1e-4,
betas=(0.5, 0.999))`` each; the decay every ``lr_update_step`` iterations once past
``num_iters - num_iters_decay``: ``lr -= lr0 / num_iters_decay`` (as written); the data
through RandomHorizontalFlip, ToTensor and Normalize(0.5, 0.5); the data iterator restarted
when exhausted; G left in training mode for translation, as the program's sampling does.
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16, one channel, instead of 128x128 faces;
three synthetic domains standing in for RaFD's expressions: the digit as it is, its strokes
thickened (a 3x3 max filter) and its colours inverted, each training digit in one domain
(300 per domain, unpaired); ``c_dim`` 3; G width 8 with 2 residual blocks instead of 64 and 6;
D width 8 with 3 strided convolutions instead of 64 and 6 (a 2x2 PatchGAN map, ``conv2``
kernel 2); batch 16 as in the defaults; 700 iterations (140 generator steps) with the decay
over the last 350 and ``lr_update_step`` 10 instead of 200,000 / 100,000 / 1,000. No
tensorboard, sample images or checkpoints.
Measure only (not in the program): a small CNN domain classifier trained on the fly on real
digits of the three domains (held-out from StarGAN's data) reads the domain of G's
translations of 120 test digits into each other domain (``translation_acc``, 1/3 by chance;
an identity G scores 0), and the L1 of the cycle ``G(G(x, c_trg), c_org)`` against ``x``
(``test_rec_l1``).

nndx, as a GAN author would add it (like the DCGAN and CycleGAN ports): a preflight
``nndx.probe`` of ``D`` (the model with a loss of its own) on 16 real digits and 16 of the
untrained G's translations, with D's loss written as ``loss_fn((out_src, out_cls), y)``
(``y`` the domain of a real digit, -1 for a fake: ``-mean(src_real) + mean(src_fake) +
lambda_cls * CE(cls_real, y_real)``; the penalty needs the interpolates, which a
``loss_fn(output, target)`` does not see, so it is left out); one ``nndx.Monitor`` per
model/optimizer pair, ``d_loss``/``g_loss`` logged to them; after training
``nndx.probe(D, ..., monitor=monD)`` and the G Monitor's report, each diagnosed; the author
reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "stargan"
SOURCE = Source("yunjey/stargan", "solver.py", "94dd002e93a2863d9b987a937b85925b80f7a19f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digits in three synthetic domains)"),
        Variant(
            "gp_without_create_graph",
            "gradient_penalty calls torch.autograd.grad(..., create_graph=False): the penalty is computed, logged "
            "and added to d_loss, but as a constant cut from D's parameters, so the critic is unconstrained",
            (C.DETACHED_GRAPH,),
            ("https://github.com/igul222/improved_wgan_training/issues/18",
             "https://github.com/caogang/wgan-gp/issues/4",
             "https://github.com/ooples/AiDotNet/issues/1844"),
            Measure("test_rec_l1", "cycle reconstruction L1 on 120 held-out digits, 1.3x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "d_cls_on_label_trg",
            "D's classification loss on the real images computed against label_trg (the shuffled target labels) "
            "instead of label_org: D's domain classifier is taught labels unrelated to its inputs, so G's "
            "classification loss carries no domain signal",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/clvrai/ACGAN-PyTorch/issues/9",
             "https://github.com/eriklindernoren/Keras-GAN/issues/240",
             "https://github.com/hujinsen/pytorch-StarGAN-VC/issues/8"),
            Measure("translation_acc", "share of held-out translations the measuring classifier reads as the target "
                    "domain, 0.9x the healthy run's or less (0.66 against 0.77 on seed 0)",
                    lambda healthy, buggy: not buggy > 0.9 * healthy),
        ),
    )
}

# main.py's options, shrunk
c_dim, image_size = 3, 16
g_conv_dim, d_conv_dim, g_repeat_num, d_repeat_num = 8, 8, 2, 3
lambda_cls, lambda_rec, lambda_gp = 1.0, 10.0, 10.0
batch_size, num_iters, num_iters_decay = 16, 700, 350
g_lr, d_lr, n_critic, beta1, beta2 = 1e-4, 1e-4, 5, 0.5, 0.999
lr_update_step = 10
PER_DOMAIN, N_TEST, PROBE = 300, 120, 16


# --------------------------------------------------------------------------- model.py


class ResidualBlock(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(dim_in, dim_out, kernel_size=3, stride=1, padding=1, bias=False),
            nn.InstanceNorm2d(dim_out, affine=True, track_running_stats=True),
            nn.ReLU(inplace=True),
            nn.Conv2d(dim_out, dim_out, kernel_size=3, stride=1, padding=1, bias=False),
            nn.InstanceNorm2d(dim_out, affine=True, track_running_stats=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.main(x)


class Generator(nn.Module):
    def __init__(self, conv_dim: int = g_conv_dim, c_dim: int = c_dim, repeat_num: int = g_repeat_num) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(1 + c_dim, conv_dim, kernel_size=7, stride=1, padding=3, bias=False),
            nn.InstanceNorm2d(conv_dim, affine=True, track_running_stats=True), nn.ReLU(inplace=True),
        ]  # fmt: skip
        curr = conv_dim
        for _ in range(2):  # down-sampling
            layers += [nn.Conv2d(curr, curr * 2, kernel_size=4, stride=2, padding=1, bias=False),
                       nn.InstanceNorm2d(curr * 2, affine=True, track_running_stats=True), nn.ReLU(inplace=True)]
            curr *= 2
        layers += [ResidualBlock(curr, curr) for _ in range(repeat_num)]  # bottleneck
        for _ in range(2):  # up-sampling
            layers += [nn.ConvTranspose2d(curr, curr // 2, kernel_size=4, stride=2, padding=1, bias=False),
                       nn.InstanceNorm2d(curr // 2, affine=True, track_running_stats=True), nn.ReLU(inplace=True)]
            curr //= 2
        layers += [nn.Conv2d(curr, 1, kernel_size=7, stride=1, padding=3, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        c = c.view(c.size(0), c.size(1), 1, 1).repeat(1, 1, x.size(2), x.size(3))
        return self.main(torch.cat([x, c], dim=1))


class Discriminator(nn.Module):
    def __init__(self, image_size: int = image_size, conv_dim: int = d_conv_dim, c_dim: int = c_dim,
                 repeat_num: int = d_repeat_num) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(1, conv_dim, kernel_size=4, stride=2, padding=1), nn.LeakyReLU(0.01)]
        curr = conv_dim
        for _ in range(1, repeat_num):
            layers += [nn.Conv2d(curr, curr * 2, kernel_size=4, stride=2, padding=1), nn.LeakyReLU(0.01)]
            curr *= 2
        kernel_size = int(image_size / np.power(2, repeat_num))
        self.main = nn.Sequential(*layers)
        self.conv1 = nn.Conv2d(curr, 1, kernel_size=3, stride=1, padding=1, bias=False)
        self.conv2 = nn.Conv2d(curr, c_dim, kernel_size=kernel_size, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.main(x)
        out_src, out_cls = self.conv1(h), self.conv2(h)
        return out_src, out_cls.view(out_cls.size(0), out_cls.size(1))


# --------------------------------------------------------------------------- the data (RaFD stand-in)


def to_domain(images01: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] put in their domains: 0 as they are, 1 thickened, 2 inverted."""
    thick = F.max_pool2d(images01, 3, stride=1, padding=1)
    d = domain.view(-1, 1, 1, 1)
    return torch.where(d == 0, images01, torch.where(d == 1, thick, 1.0 - images01))


def domain_data(seed: int) -> dict[str, torch.Tensor]:
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    g = torch.Generator().manual_seed(seed + 11)
    x = data.upscaled(train_images, image_size)
    n = 3 * PER_DOMAIN
    label = torch.arange(n) % c_dim
    label = label[torch.randperm(n, generator=g)]
    cls_x = x[n : n + 480]  # for the measuring classifier only
    cls_label = torch.randint(0, c_dim, (len(cls_x),), generator=g)
    test_x = data.upscaled(test_images[:N_TEST], image_size)
    test_label = torch.randint(0, c_dim, (N_TEST,), generator=g)
    return {"x": to_domain(x[:n], label), "label": label, "cls_x": to_domain(cls_x, cls_label), "cls_label": cls_label,
            "test_x": to_domain(test_x, test_label), "test_label": test_label}  # fmt: skip


def normalize(x01: torch.Tensor) -> torch.Tensor:
    return (x01 - 0.5) / 0.5


def loader(x: torch.Tensor, label: torch.Tensor, g: torch.Generator):
    """shuffled batches of ``batch_size`` through RandomHorizontalFlip, ToTensor, Normalize."""
    order = torch.randperm(len(x), generator=g)
    for i in range(0, len(x) - batch_size + 1, batch_size):
        idx = order[i : i + batch_size]
        img = x[idx]
        flip = torch.rand(len(idx), generator=g) < 0.5
        img = torch.where(flip.view(-1, 1, 1, 1), img.flip(-1), img)
        yield normalize(img), label[idx]


def label2onehot(labels: torch.Tensor, dim: int) -> torch.Tensor:
    out = torch.zeros(labels.size(0), dim)
    out[np.arange(labels.size(0)), labels.long()] = 1
    return out


def gradient_penalty(y: torch.Tensor, x: torch.Tensor, create_graph: bool = True) -> torch.Tensor:
    weight = torch.ones(y.size())
    dydx = torch.autograd.grad(outputs=y, inputs=x, grad_outputs=weight, retain_graph=True,
                               create_graph=create_graph, only_inputs=True)[0]  # fmt: skip
    dydx = dydx.view(dydx.size(0), -1)
    dydx_l2norm = torch.sqrt(torch.sum(dydx**2, dim=1))
    return torch.mean((dydx_l2norm - 1) ** 2)


def d_loss_fn(output: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """D's loss as one function for nndx: y the domain of a real image, -1 for a fake."""
    out_src, out_cls = output
    real = y >= 0
    src = out_src.view(out_src.size(0), -1).mean(1)
    return -src[real].mean() + src[~real].mean() + lambda_cls * F.cross_entropy(out_cls[real], y[real])


# --------------------------------------------------------------------------- measure only


def domain_classifier(x: torch.Tensor, label: torch.Tensor, seed: int) -> nn.Module:
    torch.manual_seed(seed + 101)
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, c_dim))  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    xn = normalize(x)
    for _ in range(150):
        idx = torch.randint(0, len(x), (64,))
        opt.zero_grad()
        F.cross_entropy(net(xn[idx]), label[idx]).backward()
        opt.step()
    return net


# --------------------------------------------------------------------------- solver.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    d = domain_data(seed)
    g = torch.Generator().manual_seed(seed)

    G, D = Generator(), Discriminator()
    g_optimizer = torch.optim.Adam(G.parameters(), g_lr, [beta1, beta2])
    d_optimizer = torch.optim.Adam(D.parameters(), d_lr, [beta1, beta2])

    def update_lr(new_g_lr: float, new_d_lr: float) -> None:
        for group in g_optimizer.param_groups:
            group["lr"] = new_g_lr
        for group in d_optimizer.param_groups:
            group["lr"] = new_d_lr

    def reset_grad() -> None:
        g_optimizer.zero_grad()
        d_optimizer.zero_grad()

    # preflight: D on real digits and the untrained G's translations
    real_p, lab_p = normalize(d["x"][:PROBE]), d["label"][:PROBE]
    with torch.no_grad():
        fake_p = G(normalize(d["x"][PROBE : 2 * PROBE]), label2onehot((d["label"][PROBE : 2 * PROBE] + 1) % c_dim, c_dim))
    probe_batch = (torch.cat([real_p, fake_p]), torch.cat([lab_p, torch.full((PROBE,), -1, dtype=torch.long)]))
    nx.preflight(D, probe_batch, d_loss_fn, optimizer=d_optimizer)
    monD = nx.monitor(D, d_optimizer, every=10)
    monG = nx.monitor(G, g_optimizer, every=10)

    cur_g_lr, cur_d_lr = g_lr, d_lr
    data_iter = loader(d["x"], d["label"], g)
    logged: dict[str, list[float]] = {"D/loss_gp": [], "G/loss_rec": [], "G/loss_cls": [], "D/loss_cls": []}
    for i in range(num_iters):
        # 1. preprocess input data
        try:
            x_real, label_org = next(data_iter)
        except StopIteration:
            data_iter = loader(d["x"], d["label"], g)
            x_real, label_org = next(data_iter)
        rand_idx = torch.randperm(label_org.size(0), generator=g)
        label_trg = label_org[rand_idx]
        c_org, c_trg = label2onehot(label_org, c_dim), label2onehot(label_trg, c_dim)

        # 2. train the discriminator
        out_src, out_cls = D(x_real)
        d_loss_real = -torch.mean(out_src)
        d_loss_cls = F.cross_entropy(out_cls, label_trg if variant == "d_cls_on_label_trg" else label_org)
        x_fake = G(x_real, c_trg)
        out_src, out_cls = D(x_fake.detach())
        d_loss_fake = torch.mean(out_src)
        alpha = torch.rand(x_real.size(0), 1, 1, 1, generator=g)
        x_hat = (alpha * x_real.data + (1 - alpha) * x_fake.data).requires_grad_(True)
        out_src, _ = D(x_hat)
        d_loss_gp = gradient_penalty(out_src, x_hat, create_graph=variant != "gp_without_create_graph")
        d_loss = d_loss_real + d_loss_fake + lambda_cls * d_loss_cls + lambda_gp * d_loss_gp
        reset_grad()
        d_loss.backward()
        d_optimizer.step()
        nx.timed(lambda: monD.log(d_loss))
        logged["D/loss_gp"].append(d_loss_gp.item())
        logged["D/loss_cls"].append(d_loss_cls.item())

        # 3. train the generator
        if (i + 1) % n_critic == 0:
            x_fake = G(x_real, c_trg)
            out_src, out_cls = D(x_fake)
            g_loss_fake = -torch.mean(out_src)
            g_loss_cls = F.cross_entropy(out_cls, label_trg)
            x_reconst = G(x_fake, c_org)
            g_loss_rec = torch.mean(torch.abs(x_real - x_reconst))
            g_loss = g_loss_fake + lambda_rec * g_loss_rec + lambda_cls * g_loss_cls
            reset_grad()
            g_loss.backward()
            g_optimizer.step()
            nx.timed(lambda: monG.log(g_loss))
            logged["G/loss_rec"].append(g_loss_rec.item())
            logged["G/loss_cls"].append(g_loss_cls.item())

        # 4. decay learning rates
        if (i + 1) % lr_update_step == 0 and (i + 1) > (num_iters - num_iters_decay):
            cur_g_lr -= g_lr / float(num_iters_decay)
            cur_d_lr -= d_lr / float(num_iters_decay)
            update_lr(cur_g_lr, cur_d_lr)

    nx.finish(monD, D, probe_batch, d_loss_fn, optimizer=d_optimizer)
    nx.finish(monG)

    # measure only: translations of held-out digits read by a classifier of the domains, and the cycle
    clf = domain_classifier(d["cls_x"], d["cls_label"], seed)
    x_test, lab_test = normalize(d["test_x"]), d["test_label"]
    correct, total, rec = 0, 0, []
    with torch.no_grad():
        for shift in (1, 2):
            trg = (lab_test + shift) % c_dim
            fake = G(x_test, label2onehot(trg, c_dim))
            correct += (clf(fake).argmax(1) == trg).sum().item()
            total += len(trg)
            rec.append(torch.mean(torch.abs(G(fake, label2onehot(lab_test, c_dim)) - x_test)).item())
        real_acc = (clf(x_test).argmax(1) == lab_test).float().mean().item()

    def late(name: str) -> float:
        values = logged[name][-40:]
        return sum(values) / len(values)

    return {
        "translation_acc": correct / total,
        "test_rec_l1": sum(rec) / len(rec),
        "classifier_real_acc": real_acc,
        "late_loss_gp": late("D/loss_gp"),
        "late_g_loss_rec": late("G/loss_rec"),
        "late_g_loss_cls": late("G/loss_cls"),
        "late_d_loss_cls": late("D/loss_cls"),
    }
