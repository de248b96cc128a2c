"""Port of yenchenlin/nerf-pytorch: a NeRF (positional encoding, an MLP giving density and colour,
alpha-compositing volume rendering along rays) trained with MSE on rendered pixel colours.

Source: github.com/yenchenlin/nerf-pytorch, ``run_nerf.py`` and ``run_nerf_helpers.py`` at
commit 63a5a630c9abd62b0f21c08703d0ac2ea7d4b9dd (MIT, Copyright (c) 2020 bmild). Written anew
from the facts of those files; no code copied. The Blender scenes (downloaded PNGs and
``transforms_*.json``) are replaced by a scene rendered analytically at run time (the data,
not the program): three opaque, Lambert-shaded coloured spheres inside the unit ball, seen by
pinhole cameras on a sphere of radius 4 looking at the origin (Blender-style camera-to-world
poses, x right, y up, looking down -z), composited on a white background as ``load_blender``
+ ``white_bkgd`` do.

Kept: ``Embedder`` (the input itself, then ``sin``/``cos`` at log-sampled frequencies
``2**linspace(0, multires-1)``); ``NeRF`` (``pts_linears`` of ReLU layers with the input
concatenated after the skip layer, with ``use_viewdirs``: ``alpha_linear``, ``feature_linear``,
the encoded view direction concatenated, one ``views_linears`` ReLU layer of width W//2,
``rgb_linear``; outputs ``[rgb, alpha]``); ``run_network`` (points flattened, encoded, the
expanded view directions encoded and concatenated, chunked, reshaped back); ``get_rays``
(``torch.meshgrid`` in 'ij' order then ``.t()``, directions ``((i - cx)/f, -(j - cy)/f, -1)``
rotated by the pose, origins the pose's translation); ``render``/``render_rays`` (near/far per
ray, ``linspace`` depths, stratified jitter when ``perturb``, unit view directions);
``raw2outputs`` (deltas with a final 1e10, times the ray direction's norm; ``sigmoid`` colour;
``alpha = 1 - exp(-relu(sigma) * delta)``; weights by the exclusive ``cumprod`` of ``1 - alpha +
1e-10``; ``rgb_map``, ``depth_map``, ``disp_map``, ``acc_map``; ``+ (1 - acc)`` on a white
background); ``img2mse``/``mse2psnr``; ``create_nerf``'s ``Adam(lr=lrate, betas=(0.9,
0.999))`` and the test-time kwargs (no jitter, no noise); ``train``'s ``--no_batching`` path
that the Blender configs use (each step one random training image, ``N_rand`` of its pixels
without replacement, the centre crop for the first ``precrop_iters`` steps), ``render`` with
``retraw``, ``optimizer.zero_grad``, ``img2mse``, ``backward``, ``step``, then the learning
rate set to ``lrate * 0.1 ** (global_step / (lrate_decay * 1000))`` in every param group;
``i_print`` records of loss and PSNR; the held-out-view PSNR (the commented ``i_img`` block's
``psnr_holdout``) every ``i_img`` steps and the test-set render at the end (``render_path``
on the test poses).
Shrunk: images 20x20 (focal 27.8, Blender's 0.69 rad field of view) instead of 400x400;
16 train / 3 test views instead of 100 / 200; ``netdepth`` 4 with the skip after layer 2
and ``netwidth`` 64 instead of 8 / 4 / 256; ``multires`` 6 instead of 10 (``multires_views``
4 kept); ``N_samples`` 32 instead of 64 and ``N_importance`` 0 (the parser's default, no fine
network) instead of the lego config's 128; ``N_rand`` 128 instead of 1024; 500 steps instead
of 200,000 with ``precrop_iters`` 50 (of 500) and ``lrate_decay`` 1.5 thousand steps instead of
500 (about the same fraction of the decay, a third, is reached at the end), ``lrate`` 5e-3 instead of 5e-4
(500 steps instead of 200,000); no checkpoints, videos or images written.
Measure only (not in the program): the mean PSNR of the test views, computed against the
images in [0, 1] whatever the program was trained on.

nndx, as the author would add it: ``network_fn`` is the model and ``optimizer`` its
optimizer; the probe's batch is the first step's rays as the network sees them (encoded points
and view directions, flattened) with their pixel colours as targets, and the loss function
is the rest of the program (``raw2outputs`` with those rays' depths and directions, then
``img2mse``). ``nndx.probe`` before the first step with the data splits as rays (origin and
direction, 6 numbers) and pixel colours; ``nndx.Monitor(network_fn, optimizer,
loss_fn=img2mse)`` around the loop, the rendered colours and targets passed through
``mon.loss_fn``, each step's loss logged, the held-out view's loss and PSNR logged as
``split="val"`` every ``i_img`` steps; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nerf"
SOURCE = Source("yenchenlin/nerf-pytorch", "run_nerf.py", "63a5a630c9abd62b0f21c08703d0ac2ea7d4b9dd", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (lego config shrunk: 20x20 images, 4x64 network, 500 steps)"),
        Variant(
            "rays_transposed",
            "get_rays without the .t() after torch.meshgrid (its 'ij' order taken for numpy's 'xy'): on square "
            "images every pixel's colour is paired with the ray through the pixel mirrored across the diagonal",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/pytorch/pytorch/issues/50276",
             "https://github.com/bennyguo/instant-nsr-pl/pull/49",
             "https://github.com/yenchenlin/nerf-pytorch/issues/105"),
            Measure("test_psnr", "mean test-view PSNR at least 2 dB below the healthy run's (11.7 against 21.7 "
                    "on seed 0)",
                    lambda healthy, buggy: not buggy > healthy - 2.0),
        ),
        Variant(
            "images_not_scaled",
            "the loader keeps the images' 0..255 pixel values (no / 255.): the targets lie far outside the "
            "sigmoid colour's [0, 1] range",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51",
             "https://github.com/ToniRV/NeRF-SLAM/pull/28",
             "https://github.com/timsainb/Tensorflow-MultiGPU-VAE-GAN/issues/5"),
            Measure("test_psnr", "mean test-view PSNR (against the [0, 1] images) at least 2 dB below the "
                    "healthy run's (9.1 against 21.7 on seed 0)", lambda healthy, buggy: not buggy > healthy - 2.0),
        ),
    )
}

H = W = 20
FOCAL = 0.5 * W / math.tan(0.5 * 0.6911112070083618)
NEAR, FAR = 2.0, 6.0
ARGS = {"netdepth": 4, "netwidth": 64, "skips": [2], "multires": 6, "multires_views": 4, "N_samples": 32,
        "N_rand": 128, "lrate": 5e-3, "lrate_decay": 1.5, "N_iters": 500, "precrop_iters": 50,
        "precrop_frac": 0.5, "perturb": 1.0, "raw_noise_std": 0.0, "use_viewdirs": True, "white_bkgd": True,
        "chunk": 1024 * 32, "netchunk": 1024 * 64, "i_print": 100, "i_img": 50}  # fmt: skip
N_TRAIN, N_TEST = 16, 3
SPHERES = (  # centre, radius, colour
    ((0.55, 0.0, 0.0), 0.5, (0.9, 0.15, 0.1)),
    ((-0.45, 0.45, 0.25), 0.4, (0.1, 0.8, 0.2)),
    ((-0.1, -0.55, -0.3), 0.45, (0.15, 0.25, 0.9)),
)
LIGHT = np.array([0.4, 0.3, 0.85]) / np.linalg.norm([0.4, 0.3, 0.85])

img2mse = lambda x, y: torch.mean((x - y) ** 2)  # noqa: E731 - the helpers' own lambdas
mse2psnr = lambda x: -10.0 * torch.log(x) / torch.log(torch.tensor([10.0]))  # noqa: E731


# --------------------------------------------------------------------------- run_nerf_helpers.py


class Embedder:
    def __init__(self, input_dims: int, multires: int) -> None:
        self.fns = [lambda x: x]
        self.out_dim = input_dims
        for freq in 2.0 ** torch.linspace(0.0, multires - 1, steps=multires):
            for p_fn in (torch.sin, torch.cos):
                self.fns.append(lambda x, p_fn=p_fn, freq=freq: p_fn(x * freq))
                self.out_dim += input_dims

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat([fn(inputs) for fn in self.fns], -1)


def get_embedder(multires: int):
    embedder = Embedder(3, multires)
    return embedder.embed, embedder.out_dim


class NeRF(nn.Module):
    def __init__(self, D: int = 8, W: int = 256, input_ch: int = 3, input_ch_views: int = 3, output_ch: int = 4,
                 skips=(4,), use_viewdirs: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.D, self.W, self.input_ch, self.input_ch_views = D, W, input_ch, input_ch_views
        self.skips, self.use_viewdirs = list(skips), use_viewdirs
        self.pts_linears = nn.ModuleList(
            [nn.Linear(input_ch, W)] + [nn.Linear(W + input_ch, W) if i in self.skips else nn.Linear(W, W)
                                        for i in range(D - 1)])  # fmt: skip
        self.views_linears = nn.ModuleList([nn.Linear(input_ch_views + W, W // 2)])
        if use_viewdirs:
            self.feature_linear = nn.Linear(W, W)
            self.alpha_linear = nn.Linear(W, 1)
            self.rgb_linear = nn.Linear(W // 2, 3)
        else:
            self.output_linear = nn.Linear(W, output_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_pts, input_views = torch.split(x, [self.input_ch, self.input_ch_views], dim=-1)
        h = input_pts
        for i, layer in enumerate(self.pts_linears):
            h = F.relu(layer(h))
            if i in self.skips:
                h = torch.cat([input_pts, h], -1)
        if not self.use_viewdirs:
            return self.output_linear(h)
        alpha = self.alpha_linear(h)
        h = torch.cat([self.feature_linear(h), input_views], -1)
        for layer in self.views_linears:
            h = F.relu(layer(h))
        return torch.cat([self.rgb_linear(h), alpha], -1)


def get_rays(h: int, w: int, K: np.ndarray, c2w: torch.Tensor, transpose: bool = True):
    i, j = torch.meshgrid(torch.linspace(0, w - 1, w), torch.linspace(0, h - 1, h), indexing="ij")
    if transpose:  # the buggy variant leaves the 'ij' grid as it is
        i, j = i.t(), j.t()
    dirs = torch.stack([(i - K[0][2]) / K[0][0], -(j - K[1][2]) / K[1][1], -torch.ones_like(i)], -1)
    rays_d = torch.sum(dirs[..., None, :] * c2w[:3, :3], -1)
    rays_o = c2w[:3, -1].expand(rays_d.shape)
    return rays_o, rays_d


# --------------------------------------------------------------------------- run_nerf.py


def batchify(fn, chunk):
    if chunk is None:
        return fn
    return lambda inputs: torch.cat([fn(inputs[i : i + chunk]) for i in range(0, inputs.shape[0], chunk)], 0)


def encode(inputs: torch.Tensor, viewdirs: torch.Tensor | None, embed_fn, embeddirs_fn) -> torch.Tensor:
    """``run_network``'s preparation: what the network is fed, flattened."""
    inputs_flat = torch.reshape(inputs, [-1, inputs.shape[-1]])
    embedded = embed_fn(inputs_flat)
    if viewdirs is not None:
        input_dirs = viewdirs[:, None].expand(inputs.shape)
        embedded = torch.cat([embedded, embeddirs_fn(torch.reshape(input_dirs, [-1, input_dirs.shape[-1]]))], -1)
    return embedded


def run_network(inputs, viewdirs, fn, embed_fn, embeddirs_fn, netchunk=1024 * 64):
    outputs_flat = batchify(fn, netchunk)(encode(inputs, viewdirs, embed_fn, embeddirs_fn))
    return torch.reshape(outputs_flat, list(inputs.shape[:-1]) + [outputs_flat.shape[-1]])


def raw2outputs(raw, z_vals, rays_d, raw_noise_std=0.0, white_bkgd=False):
    raw2alpha = lambda raw, dists, act_fn=F.relu: 1.0 - torch.exp(-act_fn(raw) * dists)  # noqa: E731
    dists = z_vals[..., 1:] - z_vals[..., :-1]
    dists = torch.cat([dists, torch.tensor([1e10]).expand(dists[..., :1].shape)], -1)
    dists = dists * torch.norm(rays_d[..., None, :], dim=-1)
    rgb = torch.sigmoid(raw[..., :3])
    noise = 0.0
    if raw_noise_std > 0.0:
        noise = torch.randn(raw[..., 3].shape) * raw_noise_std
    alpha = raw2alpha(raw[..., 3] + noise, dists)
    weights = alpha * torch.cumprod(torch.cat([torch.ones((alpha.shape[0], 1)), 1.0 - alpha + 1e-10], -1), -1)[:, :-1]
    rgb_map = torch.sum(weights[..., None] * rgb, -2)
    depth_map = torch.sum(weights * z_vals, -1)
    disp_map = 1.0 / torch.max(1e-10 * torch.ones_like(depth_map), depth_map / torch.sum(weights, -1))
    acc_map = torch.sum(weights, -1)
    if white_bkgd:
        rgb_map = rgb_map + (1.0 - acc_map[..., None])
    return rgb_map, disp_map, acc_map, weights, depth_map


def sample_z(n_rays: int, near: torch.Tensor, far: torch.Tensor, n_samples: int, perturb: float) -> torch.Tensor:
    t_vals = torch.linspace(0.0, 1.0, steps=n_samples)
    z_vals = (near * (1.0 - t_vals) + far * t_vals).expand([n_rays, n_samples])
    if perturb > 0.0:
        mids = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
        upper = torch.cat([mids, z_vals[..., -1:]], -1)
        lower = torch.cat([z_vals[..., :1], mids], -1)
        z_vals = lower + (upper - lower) * torch.rand(z_vals.shape)
    return z_vals


def render_rays(ray_batch, network_fn, network_query_fn, N_samples, retraw=False, perturb=0.0, white_bkgd=False,
                raw_noise_std=0.0, **_unused):  # fmt: skip
    n_rays = ray_batch.shape[0]
    rays_o, rays_d = ray_batch[:, 0:3], ray_batch[:, 3:6]
    viewdirs = ray_batch[:, -3:] if ray_batch.shape[-1] > 8 else None
    bounds = torch.reshape(ray_batch[..., 6:8], [-1, 1, 2])
    near, far = bounds[..., 0], bounds[..., 1]
    z_vals = sample_z(n_rays, near, far, N_samples, perturb)
    pts = rays_o[..., None, :] + rays_d[..., None, :] * z_vals[..., :, None]
    raw = network_query_fn(pts, viewdirs, network_fn)
    rgb_map, disp_map, acc_map, weights, depth_map = raw2outputs(raw, z_vals, rays_d, raw_noise_std, white_bkgd)
    ret = {"rgb_map": rgb_map, "disp_map": disp_map, "acc_map": acc_map}
    if retraw:
        ret["raw"] = raw
    return ret


def batchify_rays(rays_flat, chunk=1024 * 32, **kwargs):
    all_ret: dict[str, list[torch.Tensor]] = {}
    for i in range(0, rays_flat.shape[0], chunk):
        for k, v in render_rays(rays_flat[i : i + chunk], **kwargs).items():
            all_ret.setdefault(k, []).append(v)
    return {k: torch.cat(v, 0) for k, v in all_ret.items()}


def make_ray_batch(rays_o, rays_d, near, far, use_viewdirs):
    """``render``'s ray batch: origins, directions, near, far (and unit view directions)."""
    viewdirs = None
    if use_viewdirs:
        viewdirs = torch.reshape(rays_d / torch.norm(rays_d, dim=-1, keepdim=True), [-1, 3]).float()
    rays_o = torch.reshape(rays_o, [-1, 3]).float()
    rays_d = torch.reshape(rays_d, [-1, 3]).float()
    near, far = near * torch.ones_like(rays_d[..., :1]), far * torch.ones_like(rays_d[..., :1])
    rays = torch.cat([rays_o, rays_d, near, far], -1)
    return torch.cat([rays, viewdirs], -1) if use_viewdirs else rays


def render(h, w, K, chunk=1024 * 32, rays=None, c2w=None, near=0.0, far=1.0, use_viewdirs=False, transpose=True,
           **kwargs):  # fmt: skip
    rays_o, rays_d = get_rays(h, w, K, c2w, transpose) if c2w is not None else rays
    sh = rays_d.shape
    all_ret = batchify_rays(make_ray_batch(rays_o, rays_d, near, far, use_viewdirs), chunk, **kwargs)
    for k in all_ret:
        all_ret[k] = torch.reshape(all_ret[k], list(sh[:-1]) + list(all_ret[k].shape[1:]))
    k_extract = ["rgb_map", "disp_map", "acc_map"]
    return [all_ret[k] for k in k_extract] + [{k: v for k, v in all_ret.items() if k not in k_extract}]


# --------------------------------------------------------------------------- the scene (load_blender, synthetic)


def pose_spherical(azimuth: float, elevation: float, radius: float = 4.0) -> np.ndarray:
    """A camera-to-world matrix (Blender convention) on a sphere around the origin, looking at it."""
    position = radius * np.array([math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth),
                                  math.sin(elevation)])  # fmt: skip
    back = position / np.linalg.norm(position)
    right = np.cross([0.0, 0.0, 1.0], back)
    right /= np.linalg.norm(right)
    up = np.cross(back, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, up, back, position
    return c2w.astype(np.float32)


def render_scene(c2w: np.ndarray, K: np.ndarray) -> np.ndarray:
    """The ground truth: an RGBA image (H, W, 4) in [0, 1] of the spheres (first hit, Lambert)."""
    j, i = np.meshgrid(np.arange(H, dtype=np.float64), np.arange(W, dtype=np.float64), indexing="ij")
    dirs = np.stack([(i - K[0][2]) / K[0][0], -(j - K[1][2]) / K[1][1], -np.ones_like(i)], -1)
    rays_d = dirs @ c2w[:3, :3].T
    rays_d /= np.linalg.norm(rays_d, axis=-1, keepdims=True)
    origin = c2w[:3, 3]
    best_t = np.full((H, W), np.inf)
    image = np.zeros((H, W, 4))
    for centre, radius, colour in SPHERES:
        oc = origin - np.array(centre)
        b = rays_d @ oc
        disc = b**2 - (oc @ oc - radius**2)
        t = np.where(disc > 0, -b - np.sqrt(np.maximum(disc, 0)), np.inf)
        hit = (t > 0) & (t < best_t)
        normal = (origin + np.where(hit, t, 0.0)[..., None] * rays_d - np.array(centre)) / radius
        shade = 0.35 + 0.65 * np.clip(normal @ LIGHT, 0.0, 1.0)
        image[hit, :3] = (np.array(colour)[None, :] * shade[hit][:, None]).clip(0, 1)
        image[hit, 3] = 1.0
        best_t = np.where(hit, t, best_t)
    return image


def load_scene(seed: int):
    """(images uint8 (N, H, W, 3) composited on white, poses (N, 4, 4), K, i_split): as image files and
    a poses file hold them."""
    rng = np.random.default_rng(seed)
    K = np.array([[FOCAL, 0, 0.5 * W], [0, FOCAL, 0.5 * H], [0, 0, 1]])
    azimuths = np.concatenate([np.linspace(0, 2 * np.pi, N_TRAIN, endpoint=False) + rng.uniform(0, 0.2),
                               np.linspace(0, 2 * np.pi, N_TEST, endpoint=False) + np.pi / N_TRAIN + 0.3])  # fmt: skip
    elevations = np.concatenate([rng.uniform(0.15, 0.9, N_TRAIN), rng.uniform(0.25, 0.8, N_TEST)])
    poses = np.stack([pose_spherical(a, e) for a, e in zip(azimuths, elevations)])
    rgba = np.stack([render_scene(p, K) for p in poses])
    rgb = rgba[..., :3] * rgba[..., -1:] + (1.0 - rgba[..., -1:])  # white_bkgd compositing
    images = np.round(rgb * 255.0).astype(np.uint8)
    return images, poses, K, (np.arange(N_TRAIN), np.arange(N_TRAIN, N_TRAIN + N_TEST))


# --------------------------------------------------------------------------- train()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    transpose = variant != "rays_transposed"

    raw_images, poses, K, (i_train, i_test) = load_scene(seed)
    images = raw_images.astype(np.float32)
    if variant != "images_not_scaled":
        images = images / 255.0  # the loader's (np.array(imgs) / 255.)
    truth = raw_images.astype(np.float32) / 255.0  # measure only: the images in [0, 1]

    # create_nerf
    embed_fn, input_ch = get_embedder(args["multires"])
    embeddirs_fn, input_ch_views = get_embedder(args["multires_views"])
    model = NeRF(D=args["netdepth"], W=args["netwidth"], input_ch=input_ch, output_ch=4, skips=args["skips"],
                 input_ch_views=input_ch_views, use_viewdirs=args["use_viewdirs"])  # fmt: skip
    grad_vars = list(model.parameters())
    network_query_fn = lambda inputs, viewdirs, network_fn: run_network(  # noqa: E731
        inputs, viewdirs, network_fn, embed_fn=embed_fn, embeddirs_fn=embeddirs_fn, netchunk=args["netchunk"])
    optimizer = torch.optim.Adam(params=grad_vars, lr=args["lrate"], betas=(0.9, 0.999))
    render_kwargs_train = {"network_query_fn": network_query_fn, "perturb": args["perturb"],
                           "N_samples": args["N_samples"], "network_fn": model, "use_viewdirs": args["use_viewdirs"],
                           "white_bkgd": args["white_bkgd"], "raw_noise_std": args["raw_noise_std"],
                           "near": NEAR, "far": FAR, "transpose": transpose}  # fmt: skip
    render_kwargs_test = dict(render_kwargs_train, perturb=0.0, raw_noise_std=0.0)

    images_t, poses_t = torch.tensor(images), torch.tensor(poses)
    N_rand = args["N_rand"]

    def sample_batch(step: int):
        img_i = np.random.choice(i_train)
        target = images_t[img_i]
        rays_o, rays_d = get_rays(H, W, K, poses_t[img_i, :3, :4], transpose)
        if step < args["precrop_iters"]:
            dH, dW = int(H // 2 * args["precrop_frac"]), int(W // 2 * args["precrop_frac"])
            coords = torch.stack(torch.meshgrid(torch.linspace(H // 2 - dH, H // 2 + dH - 1, 2 * dH),
                                                torch.linspace(W // 2 - dW, W // 2 + dW - 1, 2 * dW),
                                                indexing="ij"), -1)  # fmt: skip
        else:
            coords = torch.stack(torch.meshgrid(torch.linspace(0, H - 1, H), torch.linspace(0, W - 1, W),
                                                indexing="ij"), -1)  # fmt: skip
        coords = torch.reshape(coords, [-1, 2])
        select_inds = np.random.choice(coords.shape[0], size=[min(N_rand, coords.shape[0])], replace=False)
        select_coords = coords[select_inds].long()
        rays_o = rays_o[select_coords[:, 0], select_coords[:, 1]]
        rays_d = rays_d[select_coords[:, 0], select_coords[:, 1]]
        return torch.stack([rays_o, rays_d], 0), target[select_coords[:, 0], select_coords[:, 1]]

    def rays_and_colours(indices) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for k in indices:
            rays_o, rays_d = get_rays(H, W, K, poses_t[k, :3, :4], transpose)
            xs.append(torch.cat([rays_o, rays_d], -1).reshape(-1, 6))
            ys.append(images_t[k].reshape(-1, 3))
        return torch.cat(xs), torch.cat(ys)

    # the probe's batch: one step's rays as the network sees them, the rest of the program as the loss
    probe_rays, probe_target = sample_batch(args["precrop_iters"])
    ray_batch = make_ray_batch(probe_rays[0], probe_rays[1], NEAR, FAR, args["use_viewdirs"])
    probe_z = sample_z(ray_batch.shape[0], ray_batch[:, 6:7], ray_batch[:, 7:8], args["N_samples"], 0.0)
    probe_pts = ray_batch[:, None, 0:3] + ray_batch[:, None, 3:6] * probe_z[..., :, None]
    probe_inputs = encode(probe_pts, ray_batch[:, -3:], embed_fn, embeddirs_fn)
    probe_rays_d = ray_batch[:, 3:6]

    def rendered_mse(raw_flat: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raw = raw_flat.reshape(probe_z.shape[0], probe_z.shape[1], -1)
        return img2mse(raw2outputs(raw, probe_z, probe_rays_d, 0.0, args["white_bkgd"])[0], target)

    probe_batch = (probe_inputs, probe_target)
    splits = (*rays_and_colours(i_train), *rays_and_colours(i_test))
    nx.preflight(model, probe_batch, rendered_mse, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=img2mse)

    def holdout(indices) -> tuple[float, float]:
        """The held-out views rendered with the test kwargs: (mse in the loader's scale, PSNR against [0, 1])."""
        mses, psnrs = [], []
        with torch.no_grad():
            for k in indices:
                rgb, _, _, _ = render(H, W, K, chunk=args["chunk"], c2w=poses_t[k, :3, :4], **render_kwargs_test)
                mses.append(img2mse(rgb, images_t[k]).item())
                psnrs.append(mse2psnr(img2mse(rgb.clamp(0, 1), torch.tensor(truth[k]))).item())
        return float(np.mean(mses)), float(np.mean(psnrs))

    records: list[str] = []
    global_step = 0
    loss = psnr = torch.tensor(float("nan"))
    for i in range(1, args["N_iters"] + 1):
        batch_rays, target_s = sample_batch(i)
        rgb, disp, acc, extras = render(H, W, K, chunk=args["chunk"], rays=batch_rays, retraw=True,
                                        **render_kwargs_train)  # fmt: skip
        optimizer.zero_grad()
        img_loss = mon.loss_fn(rgb, target_s)
        loss = img_loss
        psnr = mse2psnr(img_loss)
        loss.backward()
        optimizer.step()
        mon.log(loss)

        decay_rate = 0.1
        decay_steps = args["lrate_decay"] * 1000
        new_lrate = args["lrate"] * (decay_rate ** (global_step / decay_steps))
        for param_group in optimizer.param_groups:
            param_group["lr"] = new_lrate

        if i % args["i_print"] == 0:
            records.append(f"[TRAIN] Iter: {i} Loss: {loss.item()}  PSNR: {psnr.item()}")
        if i % args["i_img"] == 0:
            img_i = int(np.random.choice(i_test))  # the held-out view (i_val = i_test)
            val_mse, _ = holdout([img_i])
            mon.log(val_mse, split="val")
        global_step += 1

    nx.finish(mon, model, probe_batch, rendered_mse, optimizer=optimizer, data=splits)
    test_mse, test_psnr = holdout(i_test)
    return {"train_loss": loss.item(), "train_psnr": psnr.item(), "test_mse": test_mse, "test_psnr": test_psnr,
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
