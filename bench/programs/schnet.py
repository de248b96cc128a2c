"""Port of schnetpack's SchNet energy model (the ``qm9_atomwise`` experiment): continuous-filter
convolution interaction blocks on a Gaussian radial basis of the interatomic distances with a
cosine cutoff, an atom-wise output MLP summed over the atoms, targets with the atom
references and the per-atom mean removed, MSE, Adam(W) with ReduceLROnPlateau.

Source: github.com/atomistic-machine-learning/schnetpack, ``src/schnetpack/representation/
schnet.py``, ``nn/radial.py``, ``nn/cutoff.py``, ``nn/activations.py``, ``nn/base.py``,
``nn/blocks.py``, ``atomistic/atomwise.py``, ``transform/atomistic.py`` and the hydra configs
``configs/experiment/qm9_atomwise.yaml``, ``configs/model/representation/schnet.yaml``,
``configs/task/optimizer/adam.yaml``, ``configs/task/scheduler/reduce_on_plateau.yaml`` at
commit 4c967da8d6f1183b5127cce90e62eb3ae9ab4543 (MIT, Copyright (c) 2018 Kristof Schütt et al.).
Written anew from the facts of those files; no code copied.

Kept: ``SchNet`` = ``nn.Embedding(100, n_atom_basis)`` of the atomic numbers, ``d_ij =
norm(R[idx_j] - R[idx_i])`` (the ``PairwiseDistances`` input module), ``GaussianRBF`` (offsets
``linspace(0, cutoff, n_rbf)``, widths the spacing, ``exp(-0.5 / w^2 (d - mu)^2)``),
``CosineCutoff`` (``0.5 (cos(pi d / rc) + 1)`` times ``d < rc``), ``n_interactions``
``SchNetInteraction`` blocks added residually (``x = x + v``): ``in2f`` Dense without bias,
the filter network Dense(n_rbf, n_filters, shifted softplus) + Dense(n_filters, n_filters),
the filter times the cutoff, ``x[idx_j] * W_ij`` scattered (summed) onto ``idx_i``, ``f2out``
Dense(act) + Dense; ``shifted_softplus = softplus(x) - log 2``; ``Dense`` with xavier-uniform
weights and zero biases; ``Atomwise`` with ``build_mlp`` 's pyramidal widths (n_in, n_in // 2,
1; SiLU), ``scatter_add`` over ``idx_m`` (aggregation ``sum``) and ``squeeze(-1)``;
``SubtractCenterOfMass``; ``RemoveOffsets(remove_atomrefs=True, remove_mean=True)`` on the
target (the atom references of the molecule's atoms and ``n_atoms`` x the training set's mean
energy per atom after the references are removed) and ``AddOffsets`` after the model at
evaluation; a neighbour list of all pairs within the cutoff; ``ModelOutput`` with
``MSELoss`` and weight 1; ``AdamW(lr=5e-4, weight_decay=0)``; ``ReduceLROnPlateau(mode=min,
factor=0.5, threshold=0, cooldown, min_lr=0)`` stepped on the validation loss once per epoch
(Lightning's ``scheduler_monitor: val_loss``); the best validation checkpoint kept.
Shrunk: synthetic molecules instead of QM9 (no download): 4 to 9 atoms of H/C/N/O placed as a
random bonded chain (bonds 0.95-1.55 A, no two atoms closer than 0.9 A), the energy in eV = the
QM9 atom references (-13.6, -1029.9, -1485.3, -2042.6 eV) plus a Morse pair energy over all
pairs (well depth 0.6 sqrt(z_i z_j) / 6 eV, width 1.8 / A, minimum at 1.25 A) (rotation and
translation invariant); 800 / 160 / 160 molecules for train / valid / test instead of ~110k /
10k / rest; ``n_atom_basis`` 32 instead of 128, 3 interactions instead of 6, 20 radial basis
functions, cutoff 5 A as in the config; batch 32 instead of 100, 30 epochs; the scheduler's
patience 4 and cooldown 1 epochs instead of 75 and 10; no EMA, no early stopping, no logger.
Measure only (not in the program): the test MAE of the total energy in eV at the best
validation epoch's weights, and the largest change of the predicted energy when the test
molecules are rotated (the model is invariant: float32 rounding only).

nndx, as the author would add it: a preflight ``nndx.probe`` of the model on the first
training batch (the input dict as the model gets it, the offset-removed energies as the
target) with the task's loss (MSE of ``pred["energy_U0"]`` against the target) and the
optimizer; ``nndx.Monitor(model, optimizer, loss_fn=...)`` around the epochs, the training
loss computed through ``mon.loss_fn`` and logged per batch, the validation loss logged with
``split="val"``; after training ``nndx.probe(..., monitor=mon)`` on the same batch.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "schnet"
SOURCE = Source("atomistic-machine-learning/schnetpack", "src/schnetpack/representation/schnet.py",
                "4c967da8d6f1183b5127cce90e62eb3ae9ab4543", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: synthetic molecules, 32 features, 3 interactions)"),
        Variant(
            "targets_not_standardized",
            "RemoveOffsets/AddOffsets left out of the transforms: the model is trained with MSE on the raw total "
            "energies in eV (-3,000 to -16,000; atom references and per-atom mean not removed)",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/atomistic-machine-learning/schnetpack/issues/336",
             "https://github.com/atomistic-machine-learning/schnetpack/issues/288",
             "https://discuss.pytorch.org/t/scaling-target-variables/41046"),
            Measure("test_mae", "test MAE of the total energy (eV) at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "plateau_step_per_batch",
            "scheduler.step(loss) moved into the batch loop with the training batch's loss: ReduceLROnPlateau's "
            "patience (meant in epochs) counts noisy batches, so the LR is halved again and again down to ~0",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/pytorch/pytorch/issues/30873",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/673",
             "https://github.com/pytorch/pytorch/pull/13710"),
            Measure("test_mae", "test MAE of the total energy (eV) at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

N_ATOM_BASIS, N_INTERACTIONS, N_RBF, CUTOFF = 32, 3, 20, 5.0
LR, BATCH_SIZE, EPOCHS = 5e-4, 32, 30
PATIENCE, COOLDOWN, FACTOR = 4, 1, 0.5
N_TRAIN, N_VAL, N_TEST = 800, 160, 160
PROPERTY = "energy_U0"
Z_CHOICES = np.array([1, 6, 7, 8])  # H C N O
ATOMREF = {1: -13.6131, 6: -1029.8631, 7: -1485.3025, 8: -2042.6112}  # eV, QM9's single-atom U0
MASSES = {1: 1.008, 6: 12.011, 7: 14.007, 8: 15.999}


# --------------------------------------------------------------------------- the data (QM9 stand-in)


def make_molecules(n: int, rng: np.random.Generator) -> list[dict[str, np.ndarray | float]]:
    out = []
    for _ in range(n):
        k = int(rng.integers(4, 10))
        z = rng.choice(Z_CHOICES, size=k, p=[0.4, 0.35, 0.1, 0.15])
        pos = np.zeros((k, 3))
        for i in range(1, k):
            while True:
                step = rng.normal(size=3)
                cand = pos[rng.integers(0, i)] + step / np.linalg.norm(step) * rng.uniform(0.95, 1.55)
                if np.min(np.linalg.norm(pos[:i] - cand, axis=1)) > 0.9:
                    break
            pos[i] = cand
        mass = np.array([MASSES[int(a)] for a in z])
        pos -= (mass[:, None] * pos).sum(0) / mass.sum()  # SubtractCenterOfMass
        energy = sum(ATOMREF[int(a)] for a in z)
        for i in range(k):
            for j in range(i + 1, k):
                r = np.linalg.norm(pos[i] - pos[j])
                depth = 0.6 * math.sqrt(z[i] * z[j]) / 6.0
                energy += depth * ((1 - math.exp(-1.8 * (r - 1.25))) ** 2 - 1)
        out.append({"Z": z, "R": pos, "E": energy})
    return out


def collate(mols: list[dict], rotation: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """schnetpack's ``_atoms_collate_fn`` with the neighbour list: atoms of all molecules
    concatenated, ``idx_m`` the molecule of each atom, pairs offset by the atoms before."""
    Z, R, idx_m, idx_i, idx_j, n_atoms, E = [], [], [], [], [], [], []
    offset = 0
    for m, mol in enumerate(mols):
        pos = mol["R"] if rotation is None else mol["R"] @ rotation.T
        k = len(mol["Z"])
        d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
        ii, jj = np.nonzero((d < CUTOFF) & ~np.eye(k, dtype=bool))
        Z.append(mol["Z"]), R.append(pos), idx_m.append(np.full(k, m))
        idx_i.append(ii + offset), idx_j.append(jj + offset)
        n_atoms.append(k), E.append(mol["E"])
        offset += k
    return {
        "_atomic_numbers": torch.tensor(np.concatenate(Z), dtype=torch.long),
        "_positions": torch.tensor(np.concatenate(R), dtype=torch.float32),
        "_idx_m": torch.tensor(np.concatenate(idx_m), dtype=torch.long),
        "_idx_i": torch.tensor(np.concatenate(idx_i), dtype=torch.long),
        "_idx_j": torch.tensor(np.concatenate(idx_j), dtype=torch.long),
        "_n_atoms": torch.tensor(n_atoms, dtype=torch.long),
        PROPERTY: torch.tensor(E, dtype=torch.float64),
    }


class RemoveOffsets:
    """Atom references and n_atoms x the training mean energy per atom, removed from the target."""

    def __init__(self, train: list[dict]) -> None:
        self.atomref = torch.zeros(100, dtype=torch.float64)
        for z, e in ATOMREF.items():
            self.atomref[z] = e
        per_atom = [(m["E"] - sum(ATOMREF[int(a)] for a in m["Z"])) / len(m["Z"]) for m in train]
        self.mean = torch.tensor(float(np.mean(per_atom)), dtype=torch.float64)

    def offsets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ref = torch.zeros(len(batch["_n_atoms"]), dtype=torch.float64)
        ref.index_add_(0, batch["_idx_m"], self.atomref[batch["_atomic_numbers"]])
        return ref + self.mean * batch["_n_atoms"]


# --------------------------------------------------------------------------- schnetpack.nn


def shifted_softplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x) - math.log(2.0)


class Dense(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation=None) -> None:
        super().__init__(in_features, out_features, bias)
        self.activation = activation if activation is not None else nn.Identity()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(F.linear(x, self.weight, self.bias))


def scatter_add(x: torch.Tensor, idx: torch.Tensor, dim_size: int) -> torch.Tensor:
    out = torch.zeros((dim_size,) + x.shape[1:], dtype=x.dtype, device=x.device)
    return out.index_add(0, idx, x)


class GaussianRBF(nn.Module):
    def __init__(self, n_rbf: int, cutoff: float, start: float = 0.0) -> None:
        super().__init__()
        self.n_rbf = n_rbf
        offset = torch.linspace(start, cutoff, n_rbf)
        self.register_buffer("widths", torch.abs(offset[1] - offset[0]) * torch.ones_like(offset))
        self.register_buffer("offsets", offset)

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        coeff = -0.5 / self.widths.pow(2)
        return torch.exp(coeff * (d[..., None] - self.offsets).pow(2))


class CosineCutoff(nn.Module):
    def __init__(self, cutoff: float) -> None:
        super().__init__()
        self.register_buffer("cutoff", torch.tensor([cutoff]))

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        return 0.5 * (torch.cos(d * math.pi / self.cutoff) + 1.0) * (d < self.cutoff).float()


def build_mlp(n_in: int, n_out: int, n_layers: int = 2, activation=F.silu) -> nn.Module:
    neurons, c = [], n_in
    for _ in range(n_layers):
        neurons.append(c)
        c = max(n_out, c // 2)
    neurons.append(n_out)
    layers = [Dense(neurons[i], neurons[i + 1], activation=activation) for i in range(n_layers - 1)]
    layers.append(Dense(neurons[-2], neurons[-1]))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- representation/schnet.py, atomwise.py


class SchNetInteraction(nn.Module):
    def __init__(self, n_atom_basis: int, n_rbf: int, n_filters: int, activation=shifted_softplus) -> None:
        super().__init__()
        self.in2f = Dense(n_atom_basis, n_filters, bias=False)
        self.f2out = nn.Sequential(Dense(n_filters, n_atom_basis, activation=activation),
                                   Dense(n_atom_basis, n_atom_basis))  # fmt: skip
        self.filter_network = nn.Sequential(Dense(n_rbf, n_filters, activation=activation),
                                            Dense(n_filters, n_filters))  # fmt: skip

    def forward(self, x, f_ij, idx_i, idx_j, rcut_ij):
        x = self.in2f(x)
        w_ij = self.filter_network(f_ij) * rcut_ij[:, None]
        x_ij = x[idx_j] * w_ij  # continuous-filter convolution
        x = scatter_add(x_ij, idx_i, dim_size=x.shape[0])
        return self.f2out(x)


class SchNet(nn.Module):
    def __init__(self, n_atom_basis: int, n_interactions: int, radial_basis: nn.Module, cutoff_fn: nn.Module) -> None:
        super().__init__()
        self.radial_basis, self.cutoff_fn = radial_basis, cutoff_fn
        self.embedding = nn.Embedding(100, n_atom_basis)
        self.interactions = nn.ModuleList(
            SchNetInteraction(n_atom_basis, radial_basis.n_rbf, n_atom_basis) for _ in range(n_interactions))

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        d_ij = torch.norm(inputs["_Rij"], dim=1)
        f_ij = self.radial_basis(d_ij)
        rcut_ij = self.cutoff_fn(d_ij)
        x = self.embedding(inputs["_atomic_numbers"])
        for interaction in self.interactions:
            x = x + interaction(x, f_ij, inputs["_idx_i"], inputs["_idx_j"], rcut_ij)
        inputs["scalar_representation"] = x
        return inputs


class Atomwise(nn.Module):
    def __init__(self, n_in: int, output_key: str) -> None:
        super().__init__()
        self.output_key = output_key
        self.outnet = build_mlp(n_in, 1, n_layers=2, activation=F.silu)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        y = self.outnet(inputs["scalar_representation"])
        maxm = int(inputs["_idx_m"][-1]) + 1
        inputs[self.output_key] = torch.squeeze(scatter_add(y, inputs["_idx_m"], dim_size=maxm), -1)
        return inputs


class NeuralNetworkPotential(nn.Module):
    """PairwiseDistances -> representation -> output module, on one input dict."""

    def __init__(self, representation: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.representation, self.output_module = representation, output

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = dict(inputs)
        R = inputs["_positions"]
        inputs["_Rij"] = R[inputs["_idx_j"]] - R[inputs["_idx_i"]]
        return self.output_module(self.representation(inputs))


# --------------------------------------------------------------------------- the task (spk.task.AtomisticTask)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != PROPERTY}


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_mols, val_mols, test_mols = make_molecules(N_TRAIN, rng), make_molecules(N_VAL, rng), make_molecules(N_TEST, rng)
    offsets = RemoveOffsets(train_mols)
    standardize = variant != "targets_not_standardized"

    def target_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        e = batch[PROPERTY] - offsets.offsets(batch) if standardize else batch[PROPERTY]
        return e.float()

    model = NeuralNetworkPotential(
        SchNet(N_ATOM_BASIS, N_INTERACTIONS, GaussianRBF(N_RBF, CUTOFF), CosineCutoff(CUTOFF)),
        Atomwise(N_ATOM_BASIS, PROPERTY),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=FACTOR, patience=PATIENCE,
                                                           threshold=0.0, cooldown=COOLDOWN, min_lr=0.0)  # fmt: skip
    mse = nn.MSELoss()

    def loss_fn(pred: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return 1.0 * mse(pred[PROPERTY], target)  # ModelOutput: loss_weight * loss_fn(pred[name], target[name])

    val_batches = [collate(val_mols[i : i + BATCH_SIZE]) for i in range(0, N_VAL, BATCH_SIZE)]
    first = collate(train_mols[:BATCH_SIZE])
    probe_batch = ((model_inputs(first),), target_of(first))
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_fn)

    best_val, best_state = float("inf"), None
    for epoch in range(EPOCHS):
        model.train()
        order = rng.permutation(N_TRAIN)
        train_loss = 0.0
        for i in range(0, N_TRAIN, BATCH_SIZE):
            batch = collate([train_mols[j] for j in order[i : i + BATCH_SIZE]])
            optimizer.zero_grad()
            pred = model(model_inputs(batch))
            loss = mon.loss_fn(pred, target_of(batch))
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            train_loss += loss.item()
            if variant == "plateau_step_per_batch":
                scheduler.step(loss.item())
        model.eval()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(model_inputs(b)), target_of(b)).item() for b in val_batches) / len(val_batches)
        nx.timed(lambda: mon.log(val_loss, split="val"))
        if variant != "plateau_step_per_batch":
            scheduler.step(val_loss)
        if val_loss < best_val:
            best_val, best_state = val_loss, copy.deepcopy(model.state_dict())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # measure only: the best checkpoint's test MAE in eV (AddOffsets applied), and rotation invariance
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        test = collate(test_mols)
        q, _ = np.linalg.qr(np.random.default_rng(seed + 7).normal(size=(3, 3)))
        rotated = collate(test_mols, rotation=q)

        def energy(b: dict[str, torch.Tensor]) -> torch.Tensor:
            e = model(model_inputs(b))[PROPERTY].double()
            return e + offsets.offsets(b) if standardize else e

        pred, pred_rot = energy(test), energy(rotated)
        test_mae = torch.mean(torch.abs(pred - test[PROPERTY])).item()
        rotation_change = torch.max(torch.abs(pred_rot - pred)).item()
    return {
        "test_mae": test_mae,
        "best_val_loss": best_val,
        "train_loss": train_loss / math.ceil(N_TRAIN / BATCH_SIZE),
        "rotation_change": rotation_change,
        "final_lr": optimizer.param_groups[0]["lr"],
    }
