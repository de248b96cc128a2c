"""Port of vgsatorras/egnn, the QM9 example: E(n)-equivariant graph convolutional layers
(edge MLP on h_i, h_j and ||x_i - x_j||^2, optional attention gate, summed messages, node
MLP with a residual), sum pooling over the atoms, a graph-level regression head, L1 loss
on the normalised property, Adam with a cosine schedule.

Source: github.com/vgsatorras/egnn, ``main_qm9.py``, ``qm9/models.py``, ``qm9/utils.py``
and ``models/gcl.py`` (``E_GCL``; ``models/egnn_clean/egnn_clean.py`` is the same layer)
at commit e9ca6c0c3e1d30a7598efbd66034121b4af8dccc (MIT, Copyright (c) 2021 Victor Garcia
Satorras). Written anew from the facts of those files; no code copied.

Kept: ``E_GCL`` (``edge_mlp`` = Linear(2 * nf + 1 + edges_in_d, nf), act, Linear(nf, nf),
act over ``cat([h_row, h_col, radial])`` with ``radial = sum((x_row - x_col)^2)``; the
attention gate ``att_mlp`` = Linear(nf, 1) + Sigmoid multiplying the message; ``node_mlp``
= Linear(nf + nf, nf), act, Linear(nf, nf) over ``cat([h, segment_sum(messages)])``,
``h + out`` when ``recurrent``; the coordinate MLP built with its last layer at
xavier gain 0.001); ``E_GCL_mask`` (messages times ``edge_mask``, the coordinate model
deleted and the coordinates left as they are, as the QM9 model does: its output is
invariant); ``EGNN`` of ``qm9/models.py`` (``embedding`` Linear(in_node_nf, nf), the
layers with ``act_fn = SiLU``, ``attention = 1``, ``node_attr = 0``, ``node_dec`` = Linear,
SiLU, Linear; ``h * node_mask``, ``view(-1, n_nodes, nf)``, ``sum`` over the atoms,
``graph_dec`` = Linear, SiLU, Linear(nf, 1), ``pred.squeeze(1)``); ``preprocess_input``
(one-hot times ``(charge / charge_scale) ** [0, 1, 2]``: 5 atom types x 3 = 15 node
features, ``charge_power`` 2); ``get_adj_matrix`` (all n_nodes^2 pairs of each molecule,
self-pairs included, masked by ``edge_mask``); ``compute_mean_mad`` (the training
labels' mean and mean absolute deviation); ``main_qm9.py``'s ``Adam(lr=1e-3,
weight_decay=1e-16)``, ``CosineAnnealingLR(optimizer, epochs)`` stepped at the start of
every ``train(...)`` call (the valid and test passes included, as written), ``L1Loss``;
in training ``loss_l1(pred, (label - meann) / mad)``, in evaluation ``loss_l1(mad * pred +
meann, label)``; ``model.train()`` / ``model.eval()`` per partition; the best test loss at
the best validation loss; ``test_interval`` 1.
Shrunk: synthetic molecules instead of QM9 (no download): 3 to 6 atoms (padded to 6 with
``atom_mask``), H/C/N/O/F with charges 1/6/7/8/9, heavy atoms placed as a random chain
of bonds 1.1-1.6 A long, the property a U0-like energy: per-atom reference energies
(-0.5, -38, -54.6, -75, -99.7 Hartree) plus a pair term ``-0.4 z_i z_j / 36 exp(-(r_ij - 1.4)^2 /
0.08)`` (rotation and translation invariant), in eV as the cormorant files give U0 (mean ~-5,500, MAD ~1,660); 1,280 / 256 / 256 molecules for train /
valid / test instead of ~100k / 18k / 13k; ``nf`` 32 instead of 128, 4 layers instead of
7, ``batch_size`` 64 instead of 96, 25 epochs instead of 1,000; no log files.
Measure only (not in the program): the test MAE in the property's units at the best
validation epoch (the program's own ``best_test``), a correctly shaped MAE computed
outside the program's loss, and the largest change of the prediction when the test
molecules are rotated (the model is invariant: ~1e-3 eV, float32 rounding of ~5,000 eV).

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first
training batch, inputs as the loop passes them (``h0``, ``x``, ``edges``, ``edge_attr``
None, ``node_mask``, ``edge_mask``, ``n_nodes``) and target ``(label - meann) / mad``, with
``L1Loss`` and the optimizer; ``nndx.Monitor(model, optimizer, loss_fn=L1Loss())`` around
the epochs, the training loss computed through ``mon.loss_fn`` and logged per batch, the
validation loss logged with ``split="val"``; after training ``nndx.probe(...,
monitor=mon)`` on the same batch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "egnn"
SOURCE = Source("vgsatorras/egnn", "main_qm9.py", "e9ca6c0c3e1d30a7598efbd66034121b4af8dccc", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: synthetic molecules, nf 32, 4 layers, 25 epochs)"),
        Variant(
            "pred_not_squeezed",
            "the graph decoder's output returned as (batch, 1) without squeeze(1): L1Loss against the (batch,) "
            "labels broadcasts to (batch, batch) (a UserWarning) and every molecule regresses to the batch median",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/deepset-ai/FARM/issues/229", "https://github.com/timeseriesAI/tsai/issues/22",
             "https://github.com/mlcommons/GaNDLF/issues/134"),
            Measure("test_mae", "correctly shaped test MAE (eV) at least 2x the healthy run's (1,698 against 35.6 "
                    "on seed 0: the error of predicting the batch median)",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "targets_not_normalized",
            "compute_mean_mad left out: the model is trained on the raw energies (eV: mean ~-5,500, MAD ~1,660) with "
            "loss_l1(pred, label) and evaluated as loss_l1(pred, label)",
            (C.UNNORMALIZED_TARGETS,),
            ("https://discuss.pytorch.org/t/scaling-target-variables/41046",
             "https://stats.stackexchange.com/questions/409000/should-we-normalize-target-data-as-well-as-input-data",
             "https://discuss.pytorch.org/t/neural-network-could-not-learn-on-this-type-of-data-why/96648"),
            Measure("test_mae", "test MAE (eV) at least 1.2x the healthy run's (47.9 against 35.6 on seed 0: "
                    "L1 + Adam still fits the raw scale, only worse)",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

NF, N_LAYERS, BATCH_SIZE, EPOCHS, LR, WEIGHT_DECAY, ATTENTION = 32, 4, 64, 25, 1e-3, 1e-16, 1
N_NODES, N_TRAIN, N_VALID, N_TEST, CHARGE_POWER = 6, 1280, 256, 256, 2
CHARGES = np.array([1, 6, 7, 8, 9])  # H C N O F
ATOM_ENERGY = np.array([-0.5, -38.0, -54.6, -75.0, -99.7])  # Hartree
HARTREE_TO_EV = 27.2114  # the cormorant QM9 files give U0 in eV


# --------------------------------------------------------------------------- the data (QM9 stand-in)


def molecules(n: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Padded molecules as the QM9 dataloader gives them: positions, one_hot, charges,
    atom_mask, edge_mask and the property."""
    positions = np.zeros((n, N_NODES, 3))
    one_hot = np.zeros((n, N_NODES, 5))
    charges = np.zeros((n, N_NODES))
    atom_mask = np.zeros((n, N_NODES))
    label = np.zeros(n)
    for m in range(n):
        k = rng.integers(3, N_NODES + 1)
        types = rng.choice(5, size=k, p=[0.35, 0.35, 0.12, 0.12, 0.06])
        pos = np.zeros((k, 3))
        for i in range(1, k):
            step = rng.normal(size=3)
            pos[i] = pos[rng.integers(0, i)] + step / np.linalg.norm(step) * rng.uniform(1.1, 1.6)
        pos -= pos.mean(0)
        z = CHARGES[types]
        energy = ATOM_ENERGY[types].sum()
        for i in range(k):
            for j in range(i + 1, k):
                r = np.linalg.norm(pos[i] - pos[j])
                energy += -0.4 * z[i] * z[j] / 36.0 * math.exp(-((r - 1.4) ** 2) / 0.08)
        positions[m, :k], one_hot[m, np.arange(k), types], charges[m, :k] = pos, 1.0, z
        atom_mask[m, :k], label[m] = 1.0, energy * HARTREE_TO_EV
    edge_mask = atom_mask[:, :, None] * atom_mask[:, None, :] * (1 - np.eye(N_NODES))[None]
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return {"positions": t(positions), "one_hot": t(one_hot), "charges": t(charges), "atom_mask": t(atom_mask),
            "edge_mask": t(edge_mask).view(n, N_NODES * N_NODES, 1), "U0": t(label)}  # fmt: skip


def batches(data: dict[str, torch.Tensor], batch_size: int, shuffle: bool, g: torch.Generator):
    n = len(data["U0"])
    order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size]
        yield {k: v[idx] for k, v in data.items()}


# --------------------------------------------------------------------------- models/gcl.py, qm9/models.py


def unsorted_segment_sum(data: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    result = data.new_full((num_segments, data.size(1)), 0)
    return result.scatter_add_(0, segment_ids.unsqueeze(-1).expand(-1, data.size(1)), data)


class E_GCL(nn.Module):  # noqa: N801 - the source's name
    def __init__(self, input_nf: int, output_nf: int, hidden_nf: int, edges_in_d: int = 0, nodes_att_dim: int = 0,
                 act_fn: nn.Module = nn.ReLU(), recurrent: bool = True, coords_weight: float = 1.0,
                 attention: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.coords_weight, self.recurrent, self.attention = coords_weight, recurrent, attention
        self.edge_mlp = nn.Sequential(nn.Linear(input_nf * 2 + 1 + edges_in_d, hidden_nf), act_fn,
                                      nn.Linear(hidden_nf, hidden_nf), act_fn)  # fmt: skip
        self.node_mlp = nn.Sequential(nn.Linear(hidden_nf + input_nf + nodes_att_dim, hidden_nf), act_fn,
                                      nn.Linear(hidden_nf, output_nf))  # fmt: skip
        layer = nn.Linear(hidden_nf, 1, bias=False)
        torch.nn.init.xavier_uniform_(layer.weight, gain=0.001)
        self.coord_mlp = nn.Sequential(nn.Linear(hidden_nf, hidden_nf), act_fn, layer)
        if self.attention:
            self.att_mlp = nn.Sequential(nn.Linear(hidden_nf, 1), nn.Sigmoid())

    def edge_model(self, source, target, radial, edge_attr):
        out = torch.cat([source, target, radial] if edge_attr is None else [source, target, radial, edge_attr], dim=1)
        out = self.edge_mlp(out)
        if self.attention:
            out = out * self.att_mlp(out)
        return out

    def node_model(self, x, edge_index, edge_attr, node_attr):
        row, _col = edge_index
        agg = unsorted_segment_sum(edge_attr, row, num_segments=x.size(0))
        agg = torch.cat([x, agg] if node_attr is None else [x, agg, node_attr], dim=1)
        out = self.node_mlp(agg)
        if self.recurrent:
            out = x + out
        return out, agg

    def coord2radial(self, edge_index, coord):
        row, col = edge_index
        coord_diff = coord[row] - coord[col]
        radial = torch.sum(coord_diff**2, 1).unsqueeze(1)
        return radial, coord_diff


class E_GCL_mask(E_GCL):  # noqa: N801
    def __init__(self, input_nf, output_nf, hidden_nf, edges_in_d=0, nodes_attr_dim=0, act_fn=nn.ReLU(),
                 recurrent=True, coords_weight=1.0, attention=False) -> None:  # fmt: skip
        super().__init__(input_nf, output_nf, hidden_nf, edges_in_d=edges_in_d, nodes_att_dim=nodes_attr_dim,
                         act_fn=act_fn, recurrent=recurrent, coords_weight=coords_weight, attention=attention)
        del self.coord_mlp
        self.act_fn = act_fn

    def forward(self, h, edge_index, coord, node_mask, edge_mask, edge_attr=None, node_attr=None, n_nodes=None):
        radial, _coord_diff = self.coord2radial(edge_index, coord)
        edge_feat = self.edge_model(h[edge_index[0]], h[edge_index[1]], radial, edge_attr)
        edge_feat = edge_feat * edge_mask
        h, _agg = self.node_model(h, edge_index, edge_feat, node_attr)
        return h, coord, edge_attr


class EGNN(nn.Module):
    def __init__(self, in_node_nf, in_edge_nf, hidden_nf, act_fn=nn.SiLU(), n_layers=4, coords_weight=1.0,
                 attention=False, node_attr=1, squeeze=True) -> None:  # fmt: skip
        super().__init__()
        self.hidden_nf, self.n_layers, self.node_attr, self.squeeze = hidden_nf, n_layers, node_attr, squeeze
        self.embedding = nn.Linear(in_node_nf, hidden_nf)
        n_node_attr = in_node_nf if node_attr else 0
        for i in range(n_layers):
            self.add_module(f"gcl_{i}", E_GCL_mask(hidden_nf, hidden_nf, hidden_nf, edges_in_d=in_edge_nf,
                                                   nodes_attr_dim=n_node_attr, act_fn=act_fn, recurrent=True,
                                                   coords_weight=coords_weight, attention=attention))  # fmt: skip
        self.node_dec = nn.Sequential(nn.Linear(hidden_nf, hidden_nf), act_fn, nn.Linear(hidden_nf, hidden_nf))
        self.graph_dec = nn.Sequential(nn.Linear(hidden_nf, hidden_nf), act_fn, nn.Linear(hidden_nf, 1))

    def forward(self, h0, x, edges, edge_attr, node_mask, edge_mask, n_nodes):
        h = self.embedding(h0)
        for i in range(self.n_layers):
            h, _, _ = self._modules[f"gcl_{i}"](h, edges, x, node_mask, edge_mask, edge_attr=edge_attr,
                                                node_attr=h0 if self.node_attr else None, n_nodes=n_nodes)  # fmt: skip
        h = self.node_dec(h)
        h = h * node_mask
        h = h.view(-1, n_nodes, self.hidden_nf)
        h = torch.sum(h, dim=1)
        pred = self.graph_dec(h)
        return pred.squeeze(1) if self.squeeze else pred  # the variant drops the squeeze


# --------------------------------------------------------------------------- qm9/utils.py


_edges: dict[tuple[int, int], list[torch.Tensor]] = {}


def get_adj_matrix(n_nodes: int, batch_size: int) -> list[torch.Tensor]:
    if (n_nodes, batch_size) not in _edges:
        rows, cols = [], []
        for b in range(batch_size):
            for i in range(n_nodes):
                for j in range(n_nodes):
                    rows.append(i + b * n_nodes)
                    cols.append(j + b * n_nodes)
        _edges[(n_nodes, batch_size)] = [torch.LongTensor(rows), torch.LongTensor(cols)]
    return _edges[(n_nodes, batch_size)]


def preprocess_input(one_hot, charges, charge_power, charge_scale):
    charge_tensor = (charges.unsqueeze(-1) / charge_scale).pow(torch.arange(charge_power + 1.0))
    charge_tensor = charge_tensor.view(charges.shape + (1, charge_power + 1))
    return (one_hot.unsqueeze(-1) * charge_tensor).view(charges.shape[:2] + (-1,))


def compute_mean_mad(train: dict[str, torch.Tensor], prop: str) -> tuple[torch.Tensor, torch.Tensor]:
    values = train[prop]
    meann = torch.mean(values)
    return meann, torch.mean(torch.abs(values - meann))


def model_inputs(data: dict[str, torch.Tensor], charge_scale: float, rotation: torch.Tensor | None = None):
    batch_size, n_nodes, _ = data["positions"].size()
    positions = data["positions"] if rotation is None else data["positions"] @ rotation.T
    atom_positions = positions.view(batch_size * n_nodes, -1)
    atom_mask = data["atom_mask"].view(batch_size * n_nodes, -1)
    edge_mask = data["edge_mask"].view(batch_size * n_nodes * n_nodes, -1)
    nodes = preprocess_input(data["one_hot"], data["charges"], CHARGE_POWER, charge_scale)
    nodes = nodes.view(batch_size * n_nodes, -1)
    edges = get_adj_matrix(n_nodes, batch_size)
    return nodes, atom_positions, edges, None, atom_mask, edge_mask, n_nodes


# --------------------------------------------------------------------------- main_qm9.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)  # --seed default 1
    rng = np.random.default_rng(seed)
    splits = {"train": molecules(N_TRAIN, rng), "valid": molecules(N_VALID, rng), "test": molecules(N_TEST, rng)}
    charge_scale = float(CHARGES.max())
    prop = "U0"
    if variant == "targets_not_normalized":
        meann, mad = torch.tensor(0.0), torch.tensor(1.0)  # the author's loop without compute_mean_mad
    else:
        meann, mad = compute_mean_mad(splits["train"], prop)

    model = EGNN(in_node_nf=15, in_edge_nf=0, hidden_nf=NF, n_layers=N_LAYERS, coords_weight=1.0,
                 attention=ATTENTION, node_attr=0, squeeze=variant != "pred_not_squeezed")  # fmt: skip
    optimizer = optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, EPOCHS)
    loss_l1 = nn.L1Loss()
    g = torch.Generator().manual_seed(seed)

    first = next(batches(splits["train"], BATCH_SIZE, False, g))
    probe_batch = (model_inputs(first, charge_scale), (first[prop] - meann) / mad)
    nx.preflight(model, probe_batch, loss_l1, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_l1)

    def run(epoch: int, partition: str) -> float:
        lr_scheduler.step()
        res = {"loss": 0.0, "counter": 0}
        for data in batches(splits[partition], BATCH_SIZE, partition == "train", g):
            if partition == "train":
                model.train()
                optimizer.zero_grad()
            else:
                model.eval()
            batch_size = data["positions"].size(0)
            label = data[prop]
            pred = model(*model_inputs(data, charge_scale))
            if partition == "train":
                loss = mon.loss_fn(pred, (label - meann) / mad)
                loss.backward()
                optimizer.step()
                nx.timed(lambda: mon.log(loss))
            else:
                with torch.no_grad():
                    loss = loss_l1(mad * pred + meann, label)
            res["loss"] += loss.item() * batch_size
            res["counter"] += batch_size
        return res["loss"] / res["counter"]

    best = {"val": 1e10, "test": 1e10, "epoch": 0}
    for epoch in range(EPOCHS):
        train_loss = run(epoch, "train")
        val_loss = run(epoch, "valid")
        nx.timed(lambda: mon.log(val_loss / float(mad), split="val"))
        test_loss = run(epoch, "test")
        if val_loss < best["val"]:
            best = {"val": val_loss, "test": test_loss, "epoch": epoch}

    nx.finish(mon, model, probe_batch, loss_l1, optimizer=optimizer)

    # measure only: a correctly shaped test MAE, and the prediction's change under a rotation
    model.eval()
    with torch.no_grad():
        test = splits["test"]
        pred = (mad * model(*model_inputs(test, charge_scale)).reshape(-1) + meann)
        q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(seed + 7)))
        rotated = (mad * model(*model_inputs(test, charge_scale, rotation=q)).reshape(-1) + meann)
        test_mae = torch.mean(torch.abs(pred - test[prop])).item()
        rotation_change = torch.max(torch.abs(rotated - pred)).item()
    return {
        "test_mae": test_mae,
        "best_test": best["test"],
        "best_val": best["val"],
        "train_loss": train_loss,
        "rotation_change": rotation_change,
        "label_mad": float(compute_mean_mad(splits["train"], prop)[1]),
    }
