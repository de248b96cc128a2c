"""Port of hidasib/GRU4Rec_PyTorch_Official: GRU4Rec, session-based next-item recommendation with
a GRU over session-parallel mini-batches, scored against the batch's own targets plus shared
sampled negatives.

Source: github.com/hidasib/GRU4Rec_PyTorch_Official, ``gru4rec_pytorch.py`` and
``evaluation.py`` at commit d1fc31105577665d2f105de1c8d9a38d223a9a22 (licence: the README
points to the original GRU4Rec's, free for research and education); the hyperparameters
are ``paramfiles/rsc15_xe_shared_100_best.py``'s. Written anew from the facts of those
files; no code copied.

Kept: ``IndexedAdagradM`` (Adagrad with momentum; sparse gradients coalesced and applied
to their rows only, ``acc += g**2``, step ``g / sqrt(acc + eps) * lr`` with momentum);
``init_parameter_matrix`` (uniform, ``sqrt(6 / (fan0 + fan1))`` with the gate scales);
``GRU4RecModel`` with ``constrained_embedding=True`` (the input embedding of an item is its
row of the output embedding ``Wy``; ``Wy`` and the bias ``By`` sparse ``nn.Embedding`` s),
one ``nn.GRUCell`` layer, ``nn.Dropout`` on the embedding and the hidden state applied only
when ``training=True`` is passed, ``H[i]`` replaced by the new hidden state, the scores
``Xh @ O.T + B.T`` against the target items of the batch and the negatives (``Y``) or,
with ``Y=None``, every item; ``_reset_weights_to_compatibility_mode`` (numpy uniform init
seeded 42, biases zero), which ``fit`` applies; ``SampleCache`` (negatives drawn from the
cumulative ``popularity ** sample_alpha`` by binary search, a cache of pre-drawn batches
refreshed when used up); ``SessionDataIterator`` (sessions in order of their first
timestamp, ``batch_size`` sessions in parallel, each yielding ``(item_t, item_t+1)`` for
``minlen - 1`` steps, finished rows replaced by the next session, ``reset_hook``
zeroing the finished rows' hidden state and dropping rows when sessions run out; the
item id map; the shared negatives appended to the targets); ``xe_loss_with_softmax``
(``logq`` correction by the log popularity of targets and ``** sample_alpha`` of the
negatives, a stabilised softmax, ``-sum(log(diag + 1e-24))``) divided by ``batch_size``;
``fit``'s loop (``h.detach_()``, ``model.zero_grad()``, forward with ``training=True``,
loss, ``backward``, ``opt.step()``, the NaN check, the epoch's weighted average loss, its
``n_valid`` never updated as in the original); ``_adjust_hidden`` (stop when ``n_sample``
is 0 and fewer than 2 rows remain); ``evaluation.batch_eval`` (``torch.no_grad``, the
train item map, scores of all items, ``mode='conservative'`` ranks ``(scores >= target
score).sum()``, Recall@20 and MRR@20 over every test event). The rsc15 parameters: loss
cross-entropy, batch 32, ``dropout_p_hidden`` 0.4, ``dropout_p_embed`` 0,
``learning_rate`` 0.2, ``momentum`` 0.2, ``sample_alpha`` 0.5, ``logq`` 1.0, ``bpreg`` 0.
Shrunk: synthetic sessions instead of the RecSys Challenge 2015 clicks (no pandas: the
frame is three numpy columns): 300 items with Zipf-like popularity, each item with 4
preferred successors (a first-order Markov chain, 85% of next clicks from it, the rest by
popularity), session lengths 2 + geometric(0.25) capped at 12, 1,400 sessions in time
order, the last 200 the test set; ``layers`` [48] instead of [100]; ``n_sample`` 128
instead of 2048 and a sample cache of 64 batches; 4 epochs instead of 10; eval batch 64
instead of 512. Model saving and ``paropt`` are left out.
Measure only (not in the program): nothing added; Recall@20 and MRR@20 are ``batch_eval``'s.

nndx, as the author would add it: ``GRU4RecModel.forward`` takes the hidden-state list and
rewrites it, so the author probes through a thin adapter (the same parameters) that starts
each call from a given hidden state: the preflight ``nndx.probe`` on the first training
batch (input items, a zero hidden state and the targets + negatives; target the same ``Y``)
with the program's ``xe_loss_with_softmax / batch_size``, with the optimizer;
``nndx.Monitor(model, opt)`` around the epochs, every step's loss logged, each epoch's
test Recall@20 logged as ``split="val"`` accuracy; then ``nndx.probe(adapter, ...,
monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gru4rec"
SOURCE = Source("hidasib/GRU4Rec_PyTorch_Official", "gru4rec_pytorch.py", "d1fc31105577665d2f105de1c8d9a38d223a9a22",
                "free for research and education (the original GRU4Rec's licence; no LICENSE file)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (rsc15 cross-entropy parameters; shrunk data and width)"),
        Variant(
            "no_zero_grad",
            "self.model.zero_grad() left out of fit's loop: every step adds its gradient to all the earlier "
            "ones (the sparse Wy/By rows and the GRU's dense weights alike) and IndexedAdagradM steps on the sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("recall20", "test Recall@20 at least 0.05 below the healthy run's (0.34 against 0.81 "
                    "on seed 0; the epoch loss 46 against 4.9)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "target_not_shifted",
            "the session iterator takes the target at start + i instead of start + i + 1: each click is "
            "trained to predict itself, which the constrained embedding learns easily (the epoch loss ends at "
            "1.7 against the healthy 4.9) while nothing about the next click is learned",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/paxcema/KerasGRU4Rec/issues/1", "https://github.com/hidasib/GRU4Rec/issues/18",
             "https://github.com/yhs968/pyGRU4REC/issues/3"),
            Measure("recall20", "test Recall@20 at least 0.05 below the healthy run's (0.16 against 0.81 "
                    "on seed 0)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

PARAMS = {"loss": "cross-entropy", "constrained_embedding": True, "embedding": 0, "elu_param": 0.0, "layers": [48],
          "n_epochs": 4, "batch_size": 32, "dropout_p_embed": 0.0, "dropout_p_hidden": 0.4, "learning_rate": 0.2,
          "momentum": 0.2, "n_sample": 128, "sample_alpha": 0.5, "bpreg": 0.0, "logq": 1.0}  # fmt: skip
N_ITEMS, N_SESSIONS, N_TEST, SUCCESSORS, MAX_LEN = 300, 1400, 200, 4, 12
SAMPLE_CACHE_BATCHES, EVAL_BATCH = 64, 64


# --------------------------------------------------------------------------- the click log (the data)


def click_log(seed: int) -> dict[str, np.ndarray]:
    """SessionId, ItemId, Time columns of a synthetic click log (see the module docstring)."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, N_ITEMS + 1) ** 0.8
    pop = pop[rng.permutation(N_ITEMS)]
    pop /= pop.sum()
    succ = np.stack([rng.choice(N_ITEMS, size=SUCCESSORS, replace=False, p=pop) for _ in range(N_ITEMS)])
    succ_p = rng.dirichlet(np.ones(SUCCESSORS) * 2.0, size=N_ITEMS)
    sessions, items, times = [], [], []
    t = 0
    for s in range(N_SESSIONS):
        length = min(MAX_LEN, 2 + rng.geometric(0.25) - 1)
        item = rng.choice(N_ITEMS, p=pop)
        for _ in range(length):
            sessions.append(s)
            items.append(1000 + item)  # raw ids, mapped by the iterator's itemidmap
            times.append(t)
            t += 1
            item = succ[item, rng.choice(SUCCESSORS, p=succ_p[item])] if rng.random() < 0.85 else rng.choice(N_ITEMS, p=pop)
    return {"SessionId": np.array(sessions), "ItemId": np.array(items), "Time": np.array(times)}


def split(log: dict[str, np.ndarray], first_test_session: int):
    train_rows = log["SessionId"] < first_test_session
    return ({k: v[train_rows] for k, v in log.items()}, {k: v[~train_rows] for k, v in log.items()})


# --------------------------------------------------------------------------- gru4rec_pytorch.py


class IndexedAdagradM(Optimizer):
    def __init__(self, params, lr: float = 0.05, momentum: float = 0.0, eps: float = 1e-6) -> None:
        if lr <= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if eps <= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        super().__init__(params, dict(lr=lr, momentum=momentum, eps=eps))
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["acc"] = torch.zeros_like(p)
                if momentum > 0:
                    state["mom"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad._indices()[0], grad._values()
                    accs = state["acc"][rows] + values.pow(2)
                    state["acc"].index_copy_(0, rows, accs)
                    accs.add_(group["eps"]).sqrt_().mul_(-1 / lr)
                    if momentum > 0:
                        moma = state["mom"][rows]
                        moma.mul_(momentum).add_(values / accs)
                        state["mom"].index_copy_(0, rows, moma)
                        p.index_add_(0, rows, moma)
                    else:
                        p.index_add_(0, rows, values / accs)
                else:
                    state["acc"].add_(grad.pow(2))
                    accs = state["acc"].add(group["eps"]).sqrt_()
                    if momentum > 0:
                        state["mom"].mul_(momentum).addcdiv_(grad, accs, value=-lr)
                        p.add_(state["mom"])
                    else:
                        p.addcdiv_(grad, accs, value=-lr)
        return loss


def init_parameter_matrix(tensor: torch.Tensor, dim0_scale: int = 1, dim1_scale: int = 1) -> torch.Tensor:
    sigma = math.sqrt(6.0 / float(tensor.size(0) / dim0_scale + tensor.size(1) / dim1_scale))
    with torch.no_grad():
        return tensor.uniform_(-sigma, sigma)


class GRU4RecModel(nn.Module):
    """The constrained-embedding configuration (the rsc15 parameters): ``embedding=0``."""

    def __init__(self, n_items: int, layers: list[int], dropout_p_embed: float = 0.0,
                 dropout_p_hidden: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.n_items, self.layers = n_items, layers
        n_input = layers[-1]  # constrained_embedding: the input embedding is Wy
        self.DE = nn.Dropout(dropout_p_embed)
        self.G = nn.ModuleList([nn.GRUCell(layers[i - 1] if i > 0 else n_input, layers[i]) for i in range(len(layers))])
        self.D = nn.ModuleList([nn.Dropout(dropout_p_hidden) for _ in layers])
        self.Wy = nn.Embedding(n_items, layers[-1], sparse=True)
        self.By = nn.Embedding(n_items, 1, sparse=True)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for g in self.G:
            init_parameter_matrix(g.weight_ih, dim1_scale=3)
            init_parameter_matrix(g.weight_hh, dim1_scale=3)
            nn.init.zeros_(g.bias_ih)
            nn.init.zeros_(g.bias_hh)
        init_parameter_matrix(self.Wy.weight)
        nn.init.zeros_(self.By.weight)

    @staticmethod
    def _init_numpy_weights(shape: tuple[int, int]) -> np.ndarray:
        sigma = np.sqrt(6.0 / (shape[0] + shape[1]))
        return np.random.rand(*shape).astype("float32") * 2 * sigma - sigma

    @torch.no_grad()
    def _reset_weights_to_compatibility_mode(self, seed: int = 42) -> None:
        np.random.seed(seed)
        n_input = self.layers[-1]
        for i, g in enumerate(self.G):
            g.weight_ih.copy_(torch.tensor(np.vstack([self._init_numpy_weights((n_input, self.layers[i]))
                                                      for _ in range(3)])))  # fmt: skip
            g.weight_hh.copy_(torch.tensor(np.vstack([self._init_numpy_weights((self.layers[i], self.layers[i]))
                                                      for _ in range(3)])))  # fmt: skip
            g.bias_hh.zero_()
            g.bias_ih.zero_()
        self.Wy.weight.copy_(torch.tensor(self._init_numpy_weights((self.n_items, self.layers[-1]))))
        self.By.weight.zero_()

    def embed(self, X: torch.Tensor, Y: torch.Tensor | None):
        if Y is not None:  # embed_constrained: one lookup for inputs and targets
            EXY = self.Wy(torch.cat([X, Y]))
            return EXY[: X.shape[0]], EXY[X.shape[0] :], self.By(Y)
        return self.Wy(X), self.Wy.weight, self.By.weight

    def hidden_step(self, X: torch.Tensor, H: list[torch.Tensor], training: bool = False) -> torch.Tensor:
        for i in range(len(self.layers)):
            X = self.G[i](X, H[i])
            if training:
                X = self.D[i](X)
            H[i] = X
        return X

    def score_items(self, X: torch.Tensor, O: torch.Tensor, B: torch.Tensor) -> torch.Tensor:  # noqa: E741, N803
        return torch.mm(X, O.T) + B.T

    def forward(self, X: torch.Tensor, H: list[torch.Tensor], Y: torch.Tensor | None, training: bool = False):
        E, O, B = self.embed(X, Y)  # noqa: E741
        if training:
            E = self.DE(E)
        Xh = self.hidden_step(E, H, training=training)
        return self.score_items(Xh, O, B)


class SampleCache:
    def __init__(self, n_sample: int, sample_cache_max_size: int, distr: torch.Tensor) -> None:
        self.n_sample = n_sample
        self.generate_length = sample_cache_max_size // n_sample if n_sample > 0 else 0
        self.distr = distr
        self._refresh()

    def _bin_search(self, arr: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The first index whose cumulative probability exceeds x."""
        lo = torch.zeros(x.shape[0], dtype=torch.int64)
        hi = torch.full((x.shape[0],), arr.shape[0], dtype=torch.int64)
        while torch.any(lo != hi):
            mid = torch.div(lo + hi, 2, rounding_mode="trunc")
            right = arr[mid.clamp(max=arr.shape[0] - 1)] <= x
            lo = torch.where(right, mid + 1, lo)
            hi = torch.where(right, hi, mid)
        return lo

    def _refresh(self) -> None:
        if self.n_sample <= 0:
            return
        x = torch.rand(self.generate_length * self.n_sample, dtype=torch.float32)
        self.neg_samples = self._bin_search(self.distr, x).reshape((self.generate_length, self.n_sample))
        self.sample_pointer = 0

    def get_sample(self) -> torch.Tensor:
        if self.sample_pointer >= self.generate_length:
            self._refresh()
        sample = self.neg_samples[self.sample_pointer]
        self.sample_pointer += 1
        return sample


class SessionDataIterator:
    def __init__(self, data: dict[str, np.ndarray], batch_size: int, n_sample: int = 0, sample_alpha: float = 0.75,
                 sample_cache_max_size: int = 10000000, itemidmap: dict[int, int] | None = None,
                 target_offset: int = 1) -> None:  # fmt: skip
        self.batch_size = batch_size
        if itemidmap is None:
            itemids = list(dict.fromkeys(data["ItemId"].tolist()))  # unique, in order of appearance
            self.itemidmap = {item: i for i, item in enumerate(itemids)}
        else:
            self.itemidmap = itemidmap
            keep = np.array([item in itemidmap for item in data["ItemId"].tolist()], dtype=bool)
            data = {k: v[keep] for k, v in data.items()}
        self.n_items = len(self.itemidmap)
        order = np.lexsort((data["Time"], data["SessionId"]))  # sort_values([session, time])
        data = {k: v[order] for k, v in data.items()}
        session_ids, first_rows, counts = np.unique(data["SessionId"], return_index=True, return_counts=True)
        self.offset_sessions = np.zeros(len(session_ids) + 1, dtype=np.int64)
        self.offset_sessions[1:] = np.cumsum(counts)
        self.session_idx_arr = np.argsort(data["Time"][first_rows], kind="stable")  # session_order='time'
        self.data_items = np.array([self.itemidmap[item] for item in data["ItemId"].tolist()], dtype=np.int64)
        self.target_offset = target_offset  # 1 as published; 0 is the bug
        if n_sample > 0:
            ids, pop_counts = np.unique(data["ItemId"], return_counts=True)
            pop = np.zeros(self.n_items)
            pop[[self.itemidmap[i] for i in ids.tolist()]] = pop_counts
            pop = pop ** sample_alpha
            pop = pop.cumsum() / pop.sum()
            pop[-1] = 1
            self.pop_counts = np.zeros(self.n_items)
            self.pop_counts[[self.itemidmap[i] for i in ids.tolist()]] = pop_counts
            self.sample_cache = SampleCache(n_sample, sample_cache_max_size, torch.tensor(pop, dtype=torch.float32))

    def __call__(self, enable_neg_samples: bool, reset_hook=None):
        batch_size = self.batch_size
        iters = np.arange(batch_size)
        maxiter = iters.max()
        start = self.offset_sessions[self.session_idx_arr[iters]]
        end = self.offset_sessions[self.session_idx_arr[iters] + 1]
        finished = False
        while not finished:
            minlen = (end - start).min()
            out_idx = torch.tensor(self.data_items[start])
            for i in range(minlen - 1):
                in_idx = torch.tensor(self.data_items[start + i])
                out_idx = torch.tensor(self.data_items[start + i + self.target_offset])
                y = torch.cat([out_idx, self.sample_cache.get_sample()]) if enable_neg_samples else out_idx
                yield in_idx, y
            start = start + minlen - 1
            finished_mask = end - start <= 1
            n_finished = finished_mask.sum()
            iters[finished_mask] = maxiter + np.arange(1, n_finished + 1)
            maxiter += n_finished
            valid_mask = iters < len(self.offset_sessions) - 1
            n_valid = valid_mask.sum()
            if n_valid == 0:
                break
            mask = finished_mask & valid_mask
            sessions = self.session_idx_arr[iters[mask]]
            start[mask] = self.offset_sessions[sessions]
            end[mask] = self.offset_sessions[sessions + 1]
            iters, start, end = iters[valid_mask], start[valid_mask], end[valid_mask]
            if reset_hook is not None:
                finished = reset_hook(n_valid, finished_mask, valid_mask)


class GRU4Rec:
    def __init__(self, nx: Nndx, variant: str, **params) -> None:
        for k, v in params.items():
            setattr(self, k, v)
        self.nx, self.variant = nx, variant
        self.loss_function = self.xe_loss_with_softmax  # loss='cross-entropy'
        self.evaluations: list[tuple[float, float]] = []

    def xe_loss_with_softmax(self, O: torch.Tensor, Y: torch.Tensor, M: int) -> torch.Tensor:  # noqa: E741, N803
        if self.logq > 0:
            O = O - self.logq * torch.log(torch.cat([self.P0[Y[:M]], self.P0[Y[M:]] ** self.sample_alpha]))  # noqa: E741
        X = torch.exp(O - O.max(dim=1, keepdim=True)[0])
        X = X / X.sum(dim=1, keepdim=True)
        return -torch.sum(torch.log(torch.diag(X) + 1e-24))

    def fit(self, data: dict[str, np.ndarray], test: dict[str, np.ndarray], seed: int) -> None:
        self.error_during_train = False
        self.data_iterator = SessionDataIterator(data, self.batch_size, n_sample=self.n_sample,
                                                 sample_alpha=self.sample_alpha,
                                                 sample_cache_max_size=SAMPLE_CACHE_BATCHES * self.n_sample,
                                                 target_offset=0 if self.variant == "target_not_shifted" else 1)  # fmt: skip
        if self.logq:
            self.P0 = torch.tensor(self.data_iterator.pop_counts, dtype=torch.float32)
        self.model = GRU4RecModel(self.data_iterator.n_items, self.layers, self.dropout_p_embed, self.dropout_p_hidden)
        self.model._reset_weights_to_compatibility_mode(42 + seed)  # compatibility_mode=True
        opt = IndexedAdagradM(self.model.parameters(), self.learning_rate, self.momentum)

        # nndx, as the author adds it: the model rewrites its hidden-state list, so the probes go through an
        # adapter that starts every call from the batch's hidden state
        model, batch_size, loss_function = self.model, self.batch_size, self.loss_function

        class Step(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, X, H0, Y):  # noqa: N803
                return self.model(X, [H0.clone()], Y, training=True)

        def probe_loss(R: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:  # noqa: N803
            return loss_function(R, Y, batch_size) / batch_size

        first_in, first_y = next(self.data_iterator(enable_neg_samples=self.n_sample > 0))
        self.data_iterator.sample_cache.sample_pointer = 0  # the first batch's negatives drawn again in training
        step_model = Step()
        probe_batch = ((first_in, torch.zeros(batch_size, self.layers[0]), first_y), first_y)
        self.nx.preflight(step_model, probe_batch, probe_loss, optimizer=opt)
        mon = self.nx.monitor(self.model, opt, every=10)

        for epoch in range(self.n_epochs):
            H = [torch.zeros((self.batch_size, n), dtype=torch.float32) for n in self.layers]
            c, cc = [], []
            n_valid = self.batch_size

            def reset_hook(n_valid, finished_mask, valid_mask):
                return self._adjust_hidden(n_valid, finished_mask, valid_mask, H)

            for in_idx, out_idx in self.data_iterator(enable_neg_samples=self.n_sample > 0, reset_hook=reset_hook):
                for h in H:
                    h.detach_()
                if self.variant != "no_zero_grad":
                    self.model.zero_grad()
                R = self.model.forward(in_idx, H, out_idx, training=True)
                L = self.loss_function(R, out_idx, n_valid) / self.batch_size
                L.backward()
                opt.step()
                mon.log(L)
                L = L.detach().numpy()
                c.append(L)
                cc.append(n_valid)
                if np.isnan(L):
                    self.error_during_train = True
                    break
            if self.error_during_train:
                break
            c, cc = np.array(c), np.array(cc)
            self.avgc = float(np.sum(c * cc) / np.sum(cc))
            recall, mrr = batch_eval(self, test, cutoff=[20], batch_size=EVAL_BATCH)
            self.evaluations.append((recall[20], mrr[20]))
            mon.log(float(-np.log(max(mrr[20], 1e-6))), split="val", accuracy=recall[20])
        self.nx.finish(mon, step_model, probe_batch, probe_loss, optimizer=opt)

    def _adjust_hidden(self, n_valid, finished_mask, valid_mask, H) -> bool:
        if self.n_sample == 0 and n_valid < 2:
            return True
        with torch.no_grad():
            for i in range(len(self.layers)):
                H[i][torch.from_numpy(finished_mask)] = 0
        if n_valid < len(valid_mask):
            for i in range(len(H)):
                H[i] = H[i][torch.from_numpy(valid_mask)]
        return False


# --------------------------------------------------------------------------- evaluation.py


@torch.no_grad()
def batch_eval(gru: GRU4Rec, test_data: dict[str, np.ndarray], cutoff=(20,), batch_size: int = 512,
               mode: str = "conservative"):  # fmt: skip
    recall = {c: 0.0 for c in cutoff}
    mrr = {c: 0.0 for c in cutoff}
    H = [torch.zeros((batch_size, n), dtype=torch.float32) for n in gru.layers]
    n = 0

    def reset_hook(n_valid, finished_mask, valid_mask):
        return _eval_adjust(n_valid, finished_mask, valid_mask, H)

    iterator = SessionDataIterator(test_data, batch_size, 0, 0, 0, itemidmap=gru.data_iterator.itemidmap)
    for in_idxs, out_idxs in iterator(enable_neg_samples=False, reset_hook=reset_hook):
        O = gru.model.forward(in_idxs, H, None, training=False)  # noqa: E741
        oscores = O.T
        tscores = torch.diag(oscores[out_idxs])
        if mode == "standard":
            ranks = (oscores > tscores).sum(dim=0) + 1
        else:  # conservative
            ranks = (oscores >= tscores).sum(dim=0)
        for c in cutoff:
            recall[c] += float((ranks <= c).sum())
            mrr[c] += float(((ranks <= c) / ranks.float()).sum())
        n += O.shape[0]
    return {c: recall[c] / n for c in cutoff}, {c: mrr[c] / n for c in cutoff}


def _eval_adjust(n_valid, finished_mask, valid_mask, H) -> bool:
    """``gru._adjust_hidden`` as batch_eval calls it (n_sample is the model's: > 0, so it never stops early)."""
    for i in range(len(H)):
        H[i][torch.from_numpy(finished_mask)] = 0
    if n_valid < len(valid_mask):
        for i in range(len(H)):
            H[i] = H[i][torch.from_numpy(valid_mask)]
    return False


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    log = click_log(seed)
    train_data, test_data = split(log, N_SESSIONS - N_TEST)
    gru = GRU4Rec(nx, variant, **PARAMS)
    gru.fit(train_data, test_data, seed)
    recall20, mrr20 = gru.evaluations[-1] if gru.evaluations else (float("nan"), float("nan"))
    return {"recall20": recall20, "mrr20": mrr20, "train_loss": getattr(gru, "avgc", float("nan")),
            "first_recall20": gru.evaluations[0][0] if gru.evaluations else float("nan")}  # fmt: skip
