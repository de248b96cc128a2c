"""Port of a physics-informed neural network (PINN) for Burgers' equation: the PyTorch
re-implementation of Raissi, Perdikaris and Karniadakis's "continuous time inference
(Burgers)" example, trained by L-BFGS on the PDE residual plus the initial/boundary data.

Source: github.com/jayroxis/PINNs, ``Burgers Equation/Burgers Inference (PyTorch).ipynb`` at
commit 1c7689ba1b450ab87fcdbdcd3b1fa6fd22b90764 (the repository states no licence; it is a
re-implementation of github.com/maziarraissi/PINNs, MIT, Copyright (c) 2018 maziarraissi).
Written anew from the facts of that notebook; no code copied.

Kept: u_t + u u_x - nu u_xx = 0 with ``nu = 0.01 / pi`` on x in [-1, 1], t in [0, 0.99],
u(x, 0) = -sin(pi x), u(-1, t) = u(1, t) = 0; the training data the notebook takes from the
solution grid (the t = 0 row and the x = -1 and x = 1 columns, stacked, ``N_u`` of them
drawn without replacement), the collocation points ``lb + (ub - lb) * lhs(2, N_f)`` with
the data points appended; ``DNN``: an ``OrderedDict`` of ``layer_i`` ``Linear`` and
``activation_i`` ``torch.nn.Tanh()`` modules in a ``Sequential``, no activation after the last
``Linear``, PyTorch's default init, no input scaling (the notebook keeps ``lb``/``ub`` but never
uses them); ``PhysicsInformedNN``, a plain class holding the ``dnn``: ``x``/``t`` columns as
float tensors made with ``requires_grad=True``, ``net_u`` = ``dnn(cat([x, t], 1))``, ``net_f``
= the residual from three ``torch.autograd.grad`` calls (``grad_outputs=ones_like``,
``retain_graph=True``, ``create_graph=True``), ``loss_func`` (the L-BFGS closure:
``optimizer.zero_grad()``, ``loss = mean((u - u_pred) ** 2) + mean(f_pred ** 2)``,
``loss.backward()``, an iteration counter, a print every 100 evaluations, ``return loss``),
``train`` = ``dnn.train()`` then one ``optimizer.step(self.loss_func)``; ``torch.optim.LBFGS(lr=1.0,
max_iter=max_eval, history_size=50, tolerance_grad=1e-5, tolerance_change=machine epsilon,
line_search_fn="strong_wolfe")``; ``predict`` and the relative L2 error of u on the grid.
Shrunk: the solution grid is 128 x 50 instead of the .mat file's 256 x 100, and the
reference solution (``burgers_shock.mat``, not downloadable here) is computed from the
Cole-Hopf formula by quadrature; ``N_f`` 1,000 collocation points instead of 10,000;
layers [2, 20, 20, 20, 20, 1] instead of [2, 20 x 8, 1]; ``max_iter = max_eval`` 600 instead of
50,000 (the notebook's run stops by tolerance after ~6,400); ``scipy.stats.qmc.LatinHypercube``
in place of pyDOE's ``lhs``; the prints kept, not printed.
Measure only (not in the program): the notebook's ``Error u`` (relative L2 error of
``predict`` against the reference solution on the grid), the final loss and its two terms.

nndx, as the author would add it: the one part of the loss with inputs and targets is the
data term, so the preflight ``nndx.probe`` runs on ``dnn`` with the (x, t) data points as
inputs, u as targets and ``mean((u - u_pred) ** 2)`` as ``loss_fn`` (the residual needs the
input columns with ``requires_grad``, which a ``loss_fn(output, target)`` does not see), with
the L-BFGS optimizer; ``nndx.Monitor(dnn, optimizer)`` around ``train()``, the loss logged in
the closure where the notebook prints it (every evaluation); after training
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``. No validation set.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from scipy.stats import qmc

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pinn"
SOURCE = Source("jayroxis/PINNs", "Burgers Equation/Burgers Inference (PyTorch).ipynb",
                "1c7689ba1b450ab87fcdbdcd3b1fa6fd22b90764", "none stated (port of maziarraissi/PINNs, MIT)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk)"),
        Variant(
            "target_flattened",
            "the initial/boundary values built as a flat array (N_u,) instead of a column (N_u, 1): "
            "mean((self.u - u_pred) ** 2) broadcasts to (N_u, N_u), no warning, and every prediction is fitted "
            "to every boundary value",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/frohrhofer/PINN_pareto/issues/1",
             "https://github.com/Photon-AI-Research/NeuralSolvers/issues/20",
             "https://github.com/LAMDA-Tabular/TALENT/pull/92"),
            Measure("error_u", "relative L2 error of u 2x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "closure_no_zero_grad",
            "optimizer.zero_grad() left out of the L-BFGS closure: every evaluation adds its gradient to all the "
            "previous ones, so the line search and the curvature pairs see a sum of stale gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Lightning-AI/pytorch-lightning/pull/6147",
             "https://github.com/skorch-dev/skorch/issues/636",
             "https://github.com/NeuroDiffGym/neurodiffeq/pull/93"),
            Measure("error_u", "relative L2 error of u 2x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

nu = 0.01 / np.pi
N_u = 100
N_f = 1000
layers = [2, 20, 20, 20, 20, 1]
MAX_ITER = 600
N_X, N_T = 128, 50  # the solution grid (the .mat file's is 256 x 100)


# --------------------------------------------------------------------------- the data (burgers_shock.mat's stand-in)


def burgers_exact(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """u on the grid (len(t), len(x)) from the Cole-Hopf transform of u(x, 0) = -sin(pi x):
    u = -int sin(pi(x-y)) g(x-y) G(y) dy / int g(x-y) G(y) dy, g = exp(-cos(pi .) / (2 pi nu)),
    G the heat kernel of variance 2 nu t; trapezoid rule over +-10 standard deviations."""
    out = np.empty((len(t), len(x)))
    for i, ti in enumerate(t):
        if ti == 0:
            out[i] = -np.sin(np.pi * x)
            continue
        sigma = np.sqrt(2 * nu * ti)
        y = np.linspace(-10 * sigma, 10 * sigma, 4001)
        z = x[:, None] - y[None, :]
        log_w = -np.cos(np.pi * z) / (2 * np.pi * nu) - y[None, :] ** 2 / (4 * nu * ti)
        w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
        out[i] = -np.trapezoid(np.sin(np.pi * z) * w, y, axis=1) / np.trapezoid(w, y, axis=1)
    return out


def lhs(dims: int, samples: int, seed: int) -> np.ndarray:
    """pyDOE's ``lhs(dims, samples)``: a Latin hypercube sample in [0, 1]^dims."""
    return qmc.LatinHypercube(d=dims, seed=seed).random(samples)


# --------------------------------------------------------------------------- the program


class DNN(torch.nn.Module):
    def __init__(self, layers: list[int]) -> None:
        super().__init__()
        self.depth = len(layers) - 1
        self.activation = torch.nn.Tanh
        layer_list = []
        for i in range(self.depth - 1):
            layer_list.append((f"layer_{i}", torch.nn.Linear(layers[i], layers[i + 1])))
            layer_list.append((f"activation_{i}", self.activation()))
        layer_list.append((f"layer_{self.depth - 1}", torch.nn.Linear(layers[-2], layers[-1])))
        self.layers = torch.nn.Sequential(OrderedDict(layer_list))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class PhysicsInformedNN:
    """The notebook's PINN: holds the network, the data, the optimizer and the closure."""

    def __init__(self, X_u, u, X_f, layers, lb, ub, nu, mon_log=None, zero_grad: bool = True) -> None:  # noqa: ANN001
        self.lb = torch.tensor(lb).float()
        self.ub = torch.tensor(ub).float()
        self.x_u = torch.tensor(X_u[:, 0:1], requires_grad=True).float()
        self.t_u = torch.tensor(X_u[:, 1:2], requires_grad=True).float()
        self.x_f = torch.tensor(X_f[:, 0:1], requires_grad=True).float()
        self.t_f = torch.tensor(X_f[:, 1:2], requires_grad=True).float()
        self.u = torch.tensor(u).float()
        self.layers = layers
        self.nu = nu
        self.dnn = DNN(layers)
        self.optimizer = torch.optim.LBFGS(
            self.dnn.parameters(), lr=1.0, max_iter=MAX_ITER, max_eval=MAX_ITER, history_size=50,
            tolerance_grad=1e-5, tolerance_change=1.0 * np.finfo(float).eps, line_search_fn="strong_wolfe",
        )  # fmt: skip
        self.iter = 0
        self.mon_log = mon_log  # nndx: the Monitor's log, called where the notebook prints
        self.zero_grad = zero_grad
        self.printed: list[tuple[int, float, float, float]] = []

    def net_u(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.dnn(torch.cat([x, t], dim=1))

    def net_f(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The residual u_t + u u_x - nu u_xx by autograd."""
        u = self.net_u(x, t)
        ones = torch.ones_like(u)
        u_t = torch.autograd.grad(u, t, grad_outputs=ones, retain_graph=True, create_graph=True)[0]
        u_x = torch.autograd.grad(u, x, grad_outputs=ones, retain_graph=True, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x), retain_graph=True, create_graph=True)[0]
        return u_t + u * u_x - self.nu * u_xx

    def loss_func(self) -> torch.Tensor:
        if self.zero_grad:
            self.optimizer.zero_grad()
        u_pred = self.net_u(self.x_u, self.t_u)
        f_pred = self.net_f(self.x_f, self.t_f)
        loss_u = torch.mean((self.u - u_pred) ** 2)
        loss_f = torch.mean(f_pred**2)
        loss = loss_u + loss_f
        loss.backward()
        self.iter += 1
        if self.mon_log is not None:
            self.mon_log(loss)
        if self.iter % 100 == 0:  # the notebook's print
            self.printed.append((self.iter, loss.item(), loss_u.item(), loss_f.item()))
        return loss

    def train(self) -> None:
        self.dnn.train()
        self.optimizer.step(self.loss_func)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = torch.tensor(X[:, 0:1], requires_grad=True).float()
        t = torch.tensor(X[:, 1:2], requires_grad=True).float()
        self.dnn.eval()
        u = self.net_u(x, t)
        f = self.net_f(x, t)
        return u.detach().numpy(), f.detach().numpy()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.RandomState(1234 + seed)  # the notebook's np.random.seed(1234)

    t = np.linspace(0.0, 0.99, N_T)[:, None]
    x = np.linspace(-1.0, 1.0, N_X)[:, None]
    Exact = burgers_exact(x.flatten(), t.flatten())  # (N_T, N_X), as np.real(data['usol']).T
    X, T = np.meshgrid(x, t)
    X_star = np.hstack((X.flatten()[:, None], T.flatten()[:, None]))
    u_star = Exact.flatten()[:, None]
    lb, ub = X_star.min(0), X_star.max(0)

    xx1 = np.hstack((X[0:1, :].T, T[0:1, :].T))
    xx2 = np.hstack((X[:, 0:1], T[:, 0:1]))
    xx3 = np.hstack((X[:, -1:], T[:, -1:]))
    if variant == "target_flattened":  # the bug: the values as flat rows/columns, concatenated
        u_train = np.concatenate([Exact[0, :], Exact[:, 0], Exact[:, -1]])
    else:
        u_train = np.vstack([Exact[0:1, :].T, Exact[:, 0:1], Exact[:, -1:]])
    X_u_train = np.vstack([xx1, xx2, xx3])
    X_f_train = lb + (ub - lb) * lhs(2, N_f, seed=rng.randint(2**31))
    X_f_train = np.vstack((X_f_train, X_u_train))
    idx = rng.choice(X_u_train.shape[0], N_u, replace=False)
    X_u_train, u_train = X_u_train[idx, :], u_train[idx]

    model = PhysicsInformedNN(X_u_train, u_train, X_f_train, layers, lb, ub, nu,
                              zero_grad=variant != "closure_no_zero_grad")  # fmt: skip

    def data_loss(u_pred: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The data term of ``loss_func``, as a loss_fn(output, target)."""
        return torch.mean((u - u_pred) ** 2)

    probe_batch = (torch.cat([model.x_u, model.t_u], dim=1).detach(), model.u)
    nx.preflight(model.dnn, probe_batch, data_loss, optimizer=model.optimizer)
    mon = nx.monitor(model.dnn, model.optimizer, every=10)
    model.mon_log = mon.log

    model.train()

    nx.finish(mon, model.dnn, probe_batch, data_loss, optimizer=model.optimizer)

    u_pred, f_pred = model.predict(X_star)
    error_u = np.linalg.norm(u_star - u_pred, 2) / np.linalg.norm(u_star, 2)
    last = model.printed[-1] if model.printed else (model.iter, float("nan"), float("nan"), float("nan"))
    return {
        "error_u": float(error_u),
        "residual_rms": float(np.sqrt(np.mean(f_pred**2))),
        "evaluations": float(model.iter),
        "last_printed_loss": last[1],
    }
