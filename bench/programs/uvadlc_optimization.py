"""Port of Phillip Lippe's UvA DL Tutorial 4, "Optimization and Initialization": a deep ReLU MLP
(``BaseNetwork``) with the notebook's own init functions, trained by the notebook's hand-written
optimizers (``OptimizerTemplate`` and its ``SGD`` / ``SGDMomentum`` / ``Adam`` subclasses) in its
own ``train_model`` / ``epoch_iteration`` / ``test_model`` loop.

Source: github.com/phlippe/uvadlc_notebooks,
``docs/tutorial_notebooks/tutorial4/Optimization_and_Initialization.ipynb`` (MIT, Copyright (c)
2020 Phillip Lippe; mirror at commit 0da8037c7abc32f478ff6142acceb72dbcf088ee). That snapshot
lacks the notebook's blob, so the code was read from the same author's jupytext copy of the
notebook in github.com/Lightning-AI/tutorials,
``course_UvA-DL/03-initialization-and-optimization/Initialization_and_Optimization.py`` at commit
753defcec34a8e9fe7f9e34f37cce47fef468ff7 (CC BY-SA; it differs from the notebook only by
``L.seed_everything`` in place of ``set_seed``). Written anew from the facts of that file; no
code copied.

Kept: ``BaseNetwork(act_fn, input_size=784, num_classes=10, hidden_sizes=[512, 256, 256,
128])`` (``Linear``/activation pairs in an ``nn.ModuleList``, ``x.view(x.size(0), -1)``,
the layers applied in turn); the notebook's ``Identity`` module and ``act_fn_by_name``;
``const_init``, ``var_init``, ``equal_var_init``, ``xavier_init`` and ``kaiming_init`` (biases
filled with 0; first layer std ``1/sqrt(d_in)``, the others ``sqrt(2)/sqrt(d_in)``), all writing
``param.data`` in place; ``OptimizerTemplate`` (``self.params = list(params)``; ``zero_grad``
detaches and zeroes each ``p.grad`` in place; ``step`` under ``torch.no_grad`` calls
``update_param`` for each parameter with a gradient), ``SGD``, ``SGDMomentum`` (``m = (1 - beta)
g + beta m``, ``p.add_(-lr m)``) and ``Adam`` (per-parameter step counts, bias-corrected moments,
``p.add_(-lr / (sqrt(v_hat) + eps) * m_hat)``); ``train_model`` (``optim_func(net.parameters())``,
``nn.CrossEntropyLoss``, a shuffling ``drop_last`` loader of 256, per epoch
``epoch_iteration`` then the val accuracy, the model "saved" whenever the val accuracy improves
and the best one loaded back before ``test_model``); ``epoch_iteration`` (``net.train()``,
``zero_grad`` / forward / loss / ``backward`` / ``step``, train accuracy and per-batch losses);
``test_model`` (``net.eval()``, argmax accuracy under ``no_grad``); the notebook's training
setup: one ``base_model`` with ReLU and ``kaiming_init``, deep-copied and trained with
``SGDMomentum(params, lr=1e-1, momentum=0.9)`` for 40 epochs at batch size 256 (the second of
its three runs); ``transforms.Normalize`` with the training images' own mean and std (the
notebook's 0.2861/0.3530 are FashionMNIST's, computed the same way); ``random_split`` of the
training set into train/val.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 instead of FashionMNIST, so
``input_size`` stays 784 (1,437 train images split 1,150/287 into train/val, 360 test instead of
50,000/10,000/10,000); checkpoints kept in memory instead of files; no plots, no tqdm, no
pretrained-file download; CPU.
Measure only (not in the program): nothing; the variants are measured by ``test_model``'s test
accuracy of the best-val checkpoint.

nndx, as the author would add it: in ``train_model``, once the optimizer, the loss module and
the loader exist, a preflight ``nndx.probe`` of the net on the loader's first batch with the
``CrossEntropyLoss`` and the hand-written optimizer; ``nndx.Monitor(net, optimizer)`` around the
epochs, each batch's loss logged where ``epoch_iteration`` records it (``epoch_losses``; the
notebook computes no val loss, only a val accuracy, so nothing is logged as ``split="val"``); after the best model is loaded back,
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.utils.data as data
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_optimization"
SOURCE = Source("Lightning-AI/tutorials",
                "course_UvA-DL/03-initialization-and-optimization/Initialization_and_Optimization.py",
                "753defcec34a8e9fe7f9e34f37cce47fef468ff7", "CC BY-SA (notebook: phlippe/uvadlc_notebooks, MIT)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's SGDMomentum run (ReLU, kaiming_init, lr 0.1, momentum 0.9, 40 epochs of "
                "batch 256), shrunk to 28x28 digits"),
        Variant(
            "constant_init",
            "const_init(model, fill=0.005) in place of kaiming_init before training: every unit of a layer starts "
            "with the same weights and bias, gets the same gradient and stays a copy of its neighbours",
            (C.BAD_INIT,),
            ("https://github.com/phlippe/uvadlc_notebooks/blob/master/docs/tutorial_notebooks/tutorial4/"
             "Optimization_and_Initialization.ipynb (section 'Constant initialization')",
             "https://stackoverflow.com/questions/20027598/why-should-weights-of-neural-networks-be-initialized-to-random-numbers"),
            Measure("test_acc", "test accuracy (percent) at least 30 points below the healthy run's: 15.0 "
                    "against 98.3 on seed 0", lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "params_generator",
            "OptimizerTemplate.__init__ keeps self.params = params (the generator net.parameters() returns) instead "
            "of list(params): SGDMomentum's param_momentum dict comprehension exhausts it, so zero_grad and step "
            "loop over nothing and no weight is ever updated",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/pytorch/pytorch/issues/47594",
             "https://github.com/YanaiEliyahu/AdasOptimizer/issues/2",
             "https://github.com/pytorch/pytorch/issues/51794"),
            Measure("test_acc", "test accuracy (percent) at least 30 points below the healthy run's: 11.9 "
                    "against 98.3 on seed 0", lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

MAX_EPOCHS = 40
BATCH_SIZE = 256
SIDE = 28
N_VAL = 287  # the notebook's 50,000/10,000 split, in proportion


# --------------------------------------------------------------------------- the network


class BaseNetwork(nn.Module):
    def __init__(self, act_fn: nn.Module, input_size: int = 784, num_classes: int = 10,
                 hidden_sizes: list[int] | None = None) -> None:  # fmt: skip
        super().__init__()
        hidden_sizes = [512, 256, 256, 128] if hidden_sizes is None else hidden_sizes
        layers: list[nn.Module] = []
        layer_sizes = [input_size] + hidden_sizes
        for layer_index in range(1, len(layer_sizes)):
            layers += [nn.Linear(layer_sizes[layer_index - 1], layer_sizes[layer_index]), act_fn]
        layers += [nn.Linear(layer_sizes[-1], num_classes)]
        self.layers = nn.ModuleList(layers)
        self.config = {"act_fn": act_fn.__class__.__name__, "input_size": input_size, "num_classes": num_classes,
                       "hidden_sizes": hidden_sizes}  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.size(0), -1)
        for layer in self.layers:
            x = layer(x)
        return x


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


act_fn_by_name = {"tanh": nn.Tanh, "relu": nn.ReLU, "identity": Identity}


# --------------------------------------------------------------------------- initialisation


def const_init(model: nn.Module, fill: float = 0.0) -> None:
    for _name, param in model.named_parameters():
        param.data.fill_(fill)


def var_init(model: nn.Module, std: float = 0.01) -> None:
    for _name, param in model.named_parameters():
        param.data.normal_(mean=0.0, std=std)


def equal_var_init(model: nn.Module) -> None:
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            param.data.fill_(0)
        else:
            param.data.normal_(std=1.0 / math.sqrt(param.shape[1]))


def xavier_init(model: nn.Module) -> None:
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            param.data.fill_(0)
        else:
            bound = math.sqrt(6) / math.sqrt(param.shape[0] + param.shape[1])
            param.data.uniform_(-bound, bound)


def kaiming_init(model: nn.Module) -> None:
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            param.data.fill_(0)
        elif name.startswith("layers.0"):  # the first layer sees no ReLU on its input
            param.data.normal_(0, 1 / math.sqrt(param.shape[1]))
        else:
            param.data.normal_(0, math.sqrt(2) / math.sqrt(param.shape[1]))


# --------------------------------------------------------------------------- the optimizers


def make_optimizers(keep_generator: bool):
    """The notebook's optimizer classes; ``keep_generator`` plants the bug in the template."""

    class OptimizerTemplate:
        def __init__(self, params, lr: float) -> None:
            self.params = params if keep_generator else list(params)
            self.lr = lr

        def zero_grad(self) -> None:
            for p in self.params:
                if p.grad is not None:
                    p.grad.detach_()  # for second-order optimizers
                    p.grad.zero_()

        @torch.no_grad()
        def step(self) -> None:
            for p in self.params:
                if p.grad is None:  # parameters without gradients are skipped
                    continue
                self.update_param(p)

        def update_param(self, p: nn.Parameter) -> None:
            raise NotImplementedError

    class SGD(OptimizerTemplate):
        def __init__(self, params, lr: float) -> None:
            super().__init__(params, lr)

        def update_param(self, p: nn.Parameter) -> None:
            p_update = -self.lr * p.grad
            p.add_(p_update)  # in place: no graph, no new tensor

    class SGDMomentum(OptimizerTemplate):
        def __init__(self, params, lr: float, momentum: float = 0.0) -> None:
            super().__init__(params, lr)
            self.momentum = momentum  # beta_1
            self.param_momentum = {p: torch.zeros_like(p.data) for p in self.params}

        def update_param(self, p: nn.Parameter) -> None:
            self.param_momentum[p] = (1 - self.momentum) * p.grad + self.momentum * self.param_momentum[p]
            p_update = -self.lr * self.param_momentum[p]
            p.add_(p_update)

    class Adam(OptimizerTemplate):
        def __init__(self, params, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
            super().__init__(params, lr)
            self.beta1, self.beta2, self.eps = beta1, beta2, eps
            self.param_step = {p: 0 for p in self.params}
            self.param_momentum = {p: torch.zeros_like(p.data) for p in self.params}
            self.param_2nd_momentum = {p: torch.zeros_like(p.data) for p in self.params}

        def update_param(self, p: nn.Parameter) -> None:
            self.param_step[p] += 1
            self.param_momentum[p] = (1 - self.beta1) * p.grad + self.beta1 * self.param_momentum[p]
            self.param_2nd_momentum[p] = (1 - self.beta2) * (p.grad) ** 2 + self.beta2 * self.param_2nd_momentum[p]
            bias_correction_1 = 1 - self.beta1 ** self.param_step[p]
            bias_correction_2 = 1 - self.beta2 ** self.param_step[p]
            p_2nd_mom = self.param_2nd_momentum[p] / bias_correction_2
            p_mom = self.param_momentum[p] / bias_correction_1
            p_lr = self.lr / (torch.sqrt(p_2nd_mom) + self.eps)
            p_update = -p_lr * p_mom
            p.add_(p_update)

    return SGD, SGDMomentum, Adam


# --------------------------------------------------------------------------- train_model and friends


def test_model(net: nn.Module, data_loader: data.DataLoader) -> float:
    net.eval()
    true_preds, count = 0.0, 0
    for imgs, labels in data_loader:
        with torch.no_grad():
            preds = net(imgs).argmax(dim=-1)
            true_preds += (preds == labels).sum().item()
            count += labels.shape[0]
    return true_preds / count


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(42 + seed)  # L.seed_everything(42)
    np.random.seed(42 + seed)
    _SGD, SGDMomentum, _Adam = make_optimizers(keep_generator=variant == "params_generator")

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_imgs = digits.upscaled(tr_raw, SIDE)
    mean, std = train_imgs.mean().item(), train_imgs.std().item()  # the notebook's print("Mean", ...), ("Std", ...)
    train_dataset = data.TensorDataset((train_imgs - mean) / std, tr_y)  # ToTensor + Normalize((mean,), (std,))
    test_set = data.TensorDataset((digits.upscaled(te_raw, SIDE) - mean) / std, te_y)
    train_set, val_set = data.random_split(train_dataset, [len(train_dataset) - N_VAL, N_VAL])
    val_loader = data.DataLoader(val_set, batch_size=1024, shuffle=False, drop_last=False)
    test_loader = data.DataLoader(test_set, batch_size=1024, shuffle=False, drop_last=False)

    base_model = BaseNetwork(act_fn=nn.ReLU(), hidden_sizes=[512, 256, 256, 128])
    if variant == "constant_init":
        const_init(base_model, fill=0.005)
    else:
        kaiming_init(base_model)
    net = copy.deepcopy(base_model)

    # train_model(net, "FashionMNIST_SGDMom", lambda params: SGDMomentum(params, lr=1e-1, momentum=0.9), 40, 256)
    optim_func = lambda params: SGDMomentum(params, lr=1e-1, momentum=0.9)  # noqa: E731
    optimizer = optim_func(net.parameters())
    loss_module = nn.CrossEntropyLoss()
    train_loader_local = data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first_batch = next(iter(train_loader_local))
    nx.preflight(net, first_batch, loss_module, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5)

    val_scores: list[float] = []
    train_losses: list[float] = []
    train_scores: list[float] = []
    best_val_epoch, saved = -1, None
    for _epoch in range(MAX_EPOCHS):
        # epoch_iteration
        net.train()
        true_preds, count = 0.0, 0
        epoch_losses = []
        for imgs, labels in train_loader_local:
            optimizer.zero_grad()
            preds = net(imgs)
            loss = loss_module(preds, labels)
            loss.backward()
            optimizer.step()
            true_preds += (preds.argmax(dim=-1) == labels).sum().item()
            count += labels.shape[0]
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())
        train_acc = true_preds / count
        val_acc = test_model(net, val_loader)
        train_scores.append(train_acc)
        val_scores.append(val_acc)
        train_losses += epoch_losses
        if len(val_scores) == 1 or val_acc > val_scores[best_val_epoch]:  # save_model
            saved = copy.deepcopy(net.state_dict())
            best_val_epoch = _epoch
    net.load_state_dict(saved)  # load_model(CHECKPOINT_PATH, model_name, net=net)

    nx.finish(mon, net, first_batch, loss_module, optimizer=optimizer)

    test_acc = test_model(net, test_loader)
    return {"test_acc": 100.0 * test_acc, "best_val_acc": 100.0 * val_scores[best_val_epoch],
            "final_train_acc": 100.0 * train_scores[-1], "first_train_loss": train_losses[0],
            "last_train_loss": float(np.mean(train_losses[-4:])), "best_val_epoch": float(best_val_epoch)}  # fmt: skip
