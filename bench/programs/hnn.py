"""Port of greydanus/hamiltonian-nn: a Hamiltonian neural network (HNN) on the mass-spring task.

Source: github.com/greydanus/hamiltonian-nn, ``experiment-spring/train.py``,
``experiment-spring/data.py``, ``hnn.py``, ``nn_models.py`` and ``utils.py`` at commit
bcc362235dc623ffe48f22ccc22417e02e9803b4 (the repository's HEAD) (Apache-2.0, Copyright
2019 Sam Greydanus, Misko Dzamba, Jason Yosinski). Written anew from the facts of those
files; no code copied.

Kept: ``MLP`` (``linear1``/``linear2`` ``Linear(., hidden)``, ``linear3`` ``Linear(hidden,
output, bias=None)``, every weight ``orthogonal_``, the nonlinearity chosen by name through
``choose_nonlinearity``, default ``tanh``); ``HNN`` (``forward`` splits the MLP's two outputs
``F1, F2``; ``time_derivative``: the solenoidal field ``torch.autograd.grad(F2.sum(), x,
create_graph=True)[0] @ M.t()`` with ``M`` the canonical permutation tensor ``cat([eye[n//2:],
-eye[:n//2]])``, the conservative field zero for ``field_type="solenoidal"``); the spring data
of ``data.py`` (H = p^2 + q^2, 50 trajectories of 30 points on t in [0, 3] integrated by
``solve_ivp`` with rtol 1e-10 from a random direction at radius U(0.1, 1), the derivatives
taken at the clean states, then Gaussian noise std 0.1 added to q and p; the (T, 1, 2)
derivative blocks concatenated and ``.squeeze()``-d to (N, 2); the first half of the points
for training, the second for test); ``train.py``: ``torch.manual_seed(seed)``,
``np.random.seed(seed)``, ``Adam(model.parameters(), 1e-3, weight_decay=1e-4)``, full-batch
``x`` made with ``requires_grad=True``, the loop ``loss = L2_loss(dxdt, dxdt_hat);
loss.backward(); optim.step(); optim.zero_grad()`` then the test loss on ``test_x`` every
step, the final train/test distances; the baseline (``--baseline``: the same MLP with two
outputs used directly as the field) trained the same way for comparison.
Shrunk: ``hidden_dim`` 64 instead of 200, ``total_steps`` 600 instead of 2,000 and 25
trajectories instead of 50 (the test loss is at the noise floor, ~0.037, by then); the test
loss computed every 10 steps instead of every step; the data generator's ``autograd``
gradient of H written out by hand (dH/dq = 2q, dH/dp = 2p). No printing.
Measure only (not in the program): ``field_error``, the mean squared error of the learned
vector field against the true one on the ``get_field`` grid of ``experiment-spring/data.py`` (20 x 20 points in
[-1.2, 1.2]^2, noise-free), and the test loss recomputed with the (N, 2) targets.

nndx, as the author would add it: the loss compares ``model.time_derivative(x)`` with the
true derivatives, not ``model(x)`` (whose output is the pair F1, F2), so the author wraps the
time derivative in a module, ``VectorField(model)`` (which makes its input require grad when
a caller passes one that does not), and the loop calls that wrapper (the same computation);
the preflight ``nndx.probe`` gets ``(x, dxdt)`` with ``L2_loss`` and the Adam;
``nndx.Monitor(field, optim)`` around the loop, the train loss logged every step and the test
loss as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The
baseline, trained for comparison, is not watched.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.integrate import solve_ivp

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "hnn"
SOURCE = Source("greydanus/hamiltonian-nn", "experiment-spring/train.py",
                "bcc362235dc623ffe48f22ccc22417e02e9803b4", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the spring experiment as published (shrunk)"),
        Variant(
            "dx_not_squeezed",
            "get_dataset without the .squeeze() on the concatenated derivatives: the targets stay (N, 1, 2) "
            "against (N, 2) predictions, and L2_loss's (u - v).pow(2).mean() broadcasts them to (N, N, 2) "
            "without a warning: every prediction is fitted to every target",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/4938",
             "https://github.com/andrewgcodes/xlstm/issues/4",
             "https://github.com/sunwuzhou03/reinforcement-learning-lab/issues/1"),
            Measure("field_error", "learned-field error on the noise-free grid 5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 5 * healthy),
        ),
        Variant(
            "relu_nonlinearity",
            "--nonlinearity relu: the HNN's loss is on dH/dx, and its gradient to the weights goes through the "
            "activation's second derivative, zero for ReLU: the hidden biases get no gradient at all and the "
            "learned field is piecewise constant",
            (C.VANISHING_GRADIENTS,),
            ("https://github.com/CampusAI/Hamiltonian-Generative-Networks/issues/68",),
            Measure("field_error", "learned-field error on the noise-free grid 2x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}


class Args:
    input_dim, hidden_dim, learn_rate, nonlinearity = 2, 64, 1e-3, "tanh"
    total_steps, field_type = 600, "solenoidal"
    samples, test_every = 25, 10


# --------------------------------------------------------------------------- utils.py


def L2_loss(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (u - v).pow(2).mean()


def choose_nonlinearity(name: str):
    if name == "tanh":
        return torch.tanh
    if name == "relu":
        return torch.relu
    if name == "sigmoid":
        return torch.sigmoid
    if name == "softplus":
        return torch.nn.functional.softplus
    raise ValueError("nonlinearity not recognized")


# --------------------------------------------------------------------------- nn_models.py


class MLP(torch.nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, nonlinearity: str = "tanh") -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(input_dim, hidden_dim)
        self.linear2 = torch.nn.Linear(hidden_dim, hidden_dim)
        self.linear3 = torch.nn.Linear(hidden_dim, output_dim, bias=None)
        for layer in (self.linear1, self.linear2, self.linear3):
            torch.nn.init.orthogonal_(layer.weight)
        self.nonlinearity = choose_nonlinearity(nonlinearity)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.nonlinearity(self.linear1(x))
        h = self.nonlinearity(self.linear2(h))
        return self.linear3(h)


# --------------------------------------------------------------------------- hnn.py


class HNN(torch.nn.Module):
    def __init__(self, input_dim: int, differentiable_model: torch.nn.Module, field_type: str = "solenoidal",
                 baseline: bool = False, assume_canonical_coords: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.baseline = baseline
        self.differentiable_model = differentiable_model
        self.assume_canonical_coords = assume_canonical_coords
        self.M = self.permutation_tensor(input_dim)
        self.field_type = field_type

    def forward(self, x: torch.Tensor):
        if self.baseline:
            return self.differentiable_model(x)
        y = self.differentiable_model(x)
        assert y.dim() == 2 and y.shape[1] == 2, "Output tensor should have shape [batch_size, 2]"
        return y.split(1, 1)

    def time_derivative(self, x: torch.Tensor, t=None, separate_fields: bool = False):
        if self.baseline:
            return self.differentiable_model(x)
        F1, F2 = self.forward(x)
        conservative_field = torch.zeros_like(x)
        solenoidal_field = torch.zeros_like(x)
        if self.field_type != "solenoidal":
            dF1 = torch.autograd.grad(F1.sum(), x, create_graph=True)[0]
            conservative_field = dF1 @ torch.eye(*self.M.shape)
        if self.field_type != "conservative":
            dF2 = torch.autograd.grad(F2.sum(), x, create_graph=True)[0]
            solenoidal_field = dF2 @ self.M.t()
        if separate_fields:
            return [conservative_field, solenoidal_field]
        return conservative_field + solenoidal_field

    def permutation_tensor(self, n: int) -> torch.Tensor:
        if self.assume_canonical_coords:
            M = torch.eye(n)
            return torch.cat([M[n // 2 :], -M[: n // 2]])
        M = torch.ones(n, n) * (1 - torch.eye(n))
        M[::2] *= -1
        M[:, ::2] *= -1
        for i in range(n):
            for j in range(i + 1, n):
                M[i, j] *= -1
        return M


class VectorField(torch.nn.Module):
    """The author's wrapper for nndx: the module whose output the loss compares."""

    def __init__(self, hnn: HNN) -> None:
        super().__init__()
        self.hnn = hnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:  # a probe's copy of the batch: time_derivative differentiates by x
            x = x.detach().requires_grad_(True)
        return self.hnn.time_derivative(x)


# --------------------------------------------------------------------------- experiment-spring/data.py


def hamiltonian_fn(coords: np.ndarray) -> np.ndarray:
    q, p = np.split(coords, 2)
    return p**2 + q**2


def dynamics_fn(t, coords: np.ndarray) -> np.ndarray:
    q, p = np.split(coords, 2)
    dqdt, dpdt = 2 * q, 2 * p  # dH/dq, dH/dp (autograd.grad in the original)
    return np.concatenate([dpdt, -dqdt], axis=-1)


def get_trajectory(t_span=(0, 3), timescale=10, radius=None, y0=None, noise_std=0.1):
    t_eval = np.linspace(t_span[0], t_span[1], int(timescale * (t_span[1] - t_span[0])))
    if y0 is None:
        y0 = np.random.rand(2) * 2 - 1
    if radius is None:
        radius = np.random.rand() * 0.9 + 0.1
    y0 = y0 / np.sqrt((y0**2).sum()) * radius
    spring_ivp = solve_ivp(fun=dynamics_fn, t_span=t_span, y0=y0, t_eval=t_eval, rtol=1e-10)
    q, p = spring_ivp["y"][0], spring_ivp["y"][1]
    dydt = np.stack([dynamics_fn(None, y) for y in spring_ivp["y"].T]).T
    dqdt, dpdt = np.split(dydt, 2)
    q = q + np.random.randn(*q.shape) * noise_std
    p = p + np.random.randn(*p.shape) * noise_std
    return q, p, dqdt, dpdt, t_eval


def get_dataset(seed=0, samples=50, test_split=0.5, squeeze=True) -> dict[str, np.ndarray]:
    np.random.seed(seed)
    xs, dxs = [], []
    for _ in range(samples):
        x, y, dx, dy, t = get_trajectory()
        xs.append(np.stack([x, y]).T)
        dxs.append(np.stack([dx, dy]).T)  # (T, 1, 2): dx, dy are (1, T) halves of np.split
    data = {"x": np.concatenate(xs), "dx": np.concatenate(dxs)}
    if squeeze:
        data["dx"] = data["dx"].squeeze()
    split_ix = int(len(data["x"]) * test_split)
    split_data = {}
    for k in ("x", "dx"):
        split_data[k], split_data["test_" + k] = data[k][:split_ix], data[k][split_ix:]
    return split_data


def get_field(xmin=-1.2, xmax=1.2, ymin=-1.2, ymax=1.2, gridsize=20) -> dict[str, np.ndarray]:
    b, a = np.meshgrid(np.linspace(xmin, xmax, gridsize), np.linspace(ymin, ymax, gridsize))
    ys = np.stack([b.flatten(), a.flatten()])
    dydt = np.stack([dynamics_fn(None, y) for y in ys.T]).T
    return {"x": ys.T, "dx": dydt.T}


# --------------------------------------------------------------------------- experiment-spring/train.py


def train_one(args: Args, baseline: bool, seed: int, squeeze: bool, nx: Nndx | None):
    torch.manual_seed(seed)
    np.random.seed(seed)
    output_dim = args.input_dim if baseline else 2
    nn_model = MLP(args.input_dim, args.hidden_dim, output_dim, args.nonlinearity)
    model = HNN(args.input_dim, differentiable_model=nn_model, field_type=args.field_type, baseline=baseline)
    optim = torch.optim.Adam(model.parameters(), args.learn_rate, weight_decay=1e-4)

    data = get_dataset(seed=seed, samples=args.samples, squeeze=squeeze)
    x = torch.tensor(data["x"], requires_grad=True, dtype=torch.float32)
    test_x = torch.tensor(data["test_x"], requires_grad=True, dtype=torch.float32)
    dxdt = torch.Tensor(data["dx"])
    test_dxdt = torch.Tensor(data["test_dx"])

    field = VectorField(model)
    if nx is not None:
        nx.preflight(field, (x, dxdt), L2_loss, optimizer=optim)
        mon = nx.monitor(field, optim, every=10)
    stats = {"train_loss": [], "test_loss": []}
    for _step in range(args.total_steps + 1):
        dxdt_hat = field(x)
        loss = L2_loss(dxdt, dxdt_hat)
        loss.backward()
        optim.step()
        optim.zero_grad()
        stats["train_loss"].append(loss.item())
        if nx is not None:
            mon.log(loss)
        if _step % args.test_every == 0:
            test_dxdt_hat = field(test_x)
            test_loss = L2_loss(test_dxdt, test_dxdt_hat)
            stats["test_loss"].append(test_loss.item())
            if nx is not None:
                mon.log(test_loss, split="val")
    if nx is not None:
        nx.finish(mon, field, (x, dxdt), L2_loss, optimizer=optim)
    return model, stats, data


def measured(model: HNN, data: dict[str, np.ndarray]) -> tuple[float, float]:
    grid = get_field()
    gx = torch.tensor(grid["x"], requires_grad=True, dtype=torch.float32)
    field_error = (model.time_derivative(gx) - torch.tensor(grid["dx"], dtype=torch.float32)).pow(2).mean()
    test_x = torch.tensor(data["test_x"], requires_grad=True, dtype=torch.float32)
    test_dx = torch.tensor(data["test_dx"], dtype=torch.float32).reshape(-1, 2)
    test_loss = (model.time_derivative(test_x) - test_dx).pow(2).mean()
    return field_error.item(), test_loss.item()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = Args()
    if variant == "relu_nonlinearity":
        args.nonlinearity = "relu"
    squeeze = variant != "dx_not_squeezed"
    model, stats, data = train_one(args, baseline=False, seed=seed, squeeze=squeeze, nx=nx)
    field_error, test_loss = measured(model, data)
    base, base_stats, _ = train_one(args, baseline=True, seed=seed, squeeze=squeeze, nx=None)
    base_field_error, base_test_loss = measured(base, data)
    return {
        "field_error": field_error,
        "test_loss": test_loss,
        "printed_test_loss": stats["test_loss"][-1],
        "final_train_loss": stats["train_loss"][-1],
        "baseline_field_error": base_field_error,
        "baseline_test_loss": base_test_loss,
    }
