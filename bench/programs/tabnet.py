"""Port of dreamquark-ai's pytorch-tabnet: ``TabNetClassifier.fit`` (attentive transformer with
sparsemax masks, feature transformers of GLU blocks with ghost batch norm, sparsity loss).

Source: github.com/dreamquark-ai/tabnet, ``pytorch_tabnet/tab_network.py`` (the network),
``pytorch_tabnet/sparsemax.py``, ``pytorch_tabnet/abstract_model.py`` (``TabModel.fit``,
``_train_epoch``, ``_train_batch``, ``_predict_epoch``), ``pytorch_tabnet/tab_model.py``
(``TabNetClassifier``), ``pytorch_tabnet/callbacks.py`` (``History``, ``EarlyStopping``) and
``pytorch_tabnet/utils.py`` (``create_dataloaders``, ``create_group_matrix``) at commit
2c0c4ebd2bb1cb639ea94ab4b11823bc49265588 (MIT, Copyright (c) 2019 DreamQuark). Written anew
from the facts of those files; no code copied.

Kept: ``TabNet`` = ``EmbeddingGenerator`` (no categorical columns: the identity, the group
matrix ``eye(input_dim)``) + ``TabNetNoEmbeddings``: ``TabNetEncoder`` with its
``initial_bn`` (``BatchNorm1d``, momentum 0.01), the shared ``Linear(input_dim, 2(n_d+n_a))``
and ``Linear(n_d+n_a, 2(n_d+n_a))`` (no bias) used by every ``FeatTransformer``, the
``initial_splitter`` and one ``FeatTransformer`` + ``AttentiveTransformer`` per step;
``GLU_Layer`` = fc -> ``GBN`` -> ``x[:, :d] * sigmoid(x[:, d:])`` with the ``initialize_glu``
xavier-normal gain; ``GLU_Block`` (the first layer unscaled when ``first``, then residual
adds scaled by sqrt(0.5)); ``GBN`` = one ``BatchNorm1d`` over ``ceil(n / virtual_batch_size)``
chunks; ``AttentiveTransformer`` = fc (``initialize_non_glu``) -> GBN -> times the prior ->
``Sparsemax`` (the custom autograd function: max subtracted in place, the sorted-cumsum
threshold, the backward through the support); the encoder's step loop (``M_loss`` the mean
over rows of ``sum(M * log(M + eps))``, ``prior = (gamma - M) * prior``, the masked input,
``ReLU`` of the first ``n_d`` outputs kept, the rest the next attention input, ``M_loss /
n_steps``), ``forward`` returning ``(final_mapping(sum of steps), M_loss)``, ``forward_masks``
for the feature importances; the defaults n_d = n_a = 8, n_steps 3, gamma 1.3,
n_independent = n_shared = 2, epsilon 1e-15, momentum 0.02, lambda_sparse 1e-3,
``clip_value`` 1, ``Adam(lr=2e-2)``, no scheduler, mask_type sparsemax, seed 0; ``fit``:
``max_epochs=100``, ``patience=10``, ``drop_last=True``, the train loader shuffled (weights
0), the valid loader not; ``_train_batch``: ``param.grad = None`` for every parameter, the
forward, ``cross_entropy(output, y.long())`` minus ``lambda_sparse * M_loss``, backward,
``clip_grad_norm_(params, clip_value)``, step; ``History``'s running epoch loss;
``_predict_epoch`` in eval mode with softmax scores; the binary task's default metric
``auc`` on the valid set; ``EarlyStopping`` (maximise, tol 0, ``wait`` reset to 1 on a new
best, stop once ``wait >= patience``, the best weights loaded back at the end); the feature
importances from ``explain`` after training; ``predict_proba`` / ``predict`` (argmax).
Shrunk: scikit-learn's breast-cancer table (569 rows, 30 numerical features, binary,
shipped with scikit-learn) split 64/16/20 (stratified) into train/valid/test and
standardised with a ``StandardScaler`` fitted on train (the user's preprocessing, before
``fit``) instead of a downloaded dataset (the census example's); ``batch_size`` 64 and
``virtual_batch_size`` 16 instead of ``fit``'s 1024 and 128 (the train split has 364 rows: 5
batches an epoch); the per-epoch print kept as a record.
Measure only (not in the program): test accuracy and AUC of the restored best model.

nndx, as the author would add it: a preflight ``nndx.probe`` of ``network`` on the first
training batch with the batch loss as ``_train_batch`` computes it (a function of the
network's ``(output, M_loss)`` and the targets), the optimizer, and the train/valid splits as
``data``; ``nndx.Monitor(network, optimizer)`` around the epochs, the loss computed through
``mon.loss_fn`` and logged every batch, each epoch's valid log-loss and accuracy (from the
scores ``_predict_epoch`` computes) logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.nn import BatchNorm1d, Linear, ReLU
from torch.nn.utils import clip_grad_norm_
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "tabnet"
SOURCE = Source("dreamquark-ai/tabnet", "pytorch_tabnet/abstract_model.py", "2c0c4ebd2bb1cb639ea94ab4b11823bc49265588",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the classifier fitted as published (batch 64 / virtual 16 for the 364-row train split)"),
        Variant(
            "default_batch_over_train_size",
            "fit() left at its defaults batch_size=1024, virtual_batch_size=128 on the 364-row train split: with "
            "drop_last=True the loader yields no batch at all, every epoch prints loss 0.0 and the weights never "
            "change (early stopping then restores the untrained network)",
            (C.SILENT_DATA_LOSS,),
            ("https://github.com/dreamquark-ai/tabnet/issues/537", "https://github.com/dreamquark-ai/tabnet/issues/519",
             "https://github.com/RasmussenLab/vamb/pull/425"),
            Measure("test_accuracy", "test accuracy at least 0.15 below the healthy run's: 0.39/0.61/0.58 "
                    "against 0.93/0.96/0.97 healthy on seeds 0-2 (the untrained network's)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "features_shuffled_not_labels",
            "the training rows shuffled before fit (np.random.shuffle on X_train) while y_train keeps its order: "
            "every training row carries another row's label",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/DrexelChatbotGroup/DrexelChatbot/issues/15",
             "https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/IBM/AutoXAI4Omics/pull/58", "https://github.com/alanarazi7/TabSTAR/issues/25"),
            Measure("test_accuracy", "test accuracy at least 0.15 below the healthy run's: 0.64/0.69/0.66 "
                    "against 0.93/0.96/0.97 healthy on seeds 0-2 (near the majority class's 0.63)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

BATCH_SIZE, VIRTUAL_BATCH_SIZE, MAX_EPOCHS, PATIENCE = 64, 16, 100, 10


# --------------------------------------------------------------------------- sparsemax.py


def _make_ix_like(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    d = x.size(dim)
    rho = torch.arange(1, d + 1, device=x.device, dtype=x.dtype)
    view = [1] * x.dim()
    view[0] = -1
    return rho.view(view).transpose(0, dim)


class SparsemaxFunction(Function):
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, dim: int = -1) -> torch.Tensor:  # noqa: A002 - the source's name
        ctx.dim = dim
        max_val, _ = input.max(dim=dim, keepdim=True)
        input -= max_val  # the softmax stability trick, in place as in the source
        tau, supp_size = SparsemaxFunction._threshold_and_support(input, dim=dim)
        output = torch.clamp(input - tau, min=0)
        ctx.save_for_backward(supp_size, output)
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        supp_size, output = ctx.saved_tensors
        dim = ctx.dim
        grad_input = grad_output.clone()
        grad_input[output == 0] = 0
        v_hat = grad_input.sum(dim=dim) / supp_size.to(output.dtype).squeeze()
        v_hat = v_hat.unsqueeze(dim)
        grad_input = torch.where(output != 0, grad_input - v_hat, grad_input)
        return grad_input, None

    @staticmethod
    def _threshold_and_support(input: torch.Tensor, dim: int = -1):  # noqa: A002
        input_srt, _ = torch.sort(input, descending=True, dim=dim)
        input_cumsum = input_srt.cumsum(dim) - 1
        rhos = _make_ix_like(input, dim)
        support = rhos * input_srt > input_cumsum
        support_size = support.sum(dim=dim).unsqueeze(dim)
        tau = input_cumsum.gather(dim, support_size - 1)
        tau /= support_size.to(input.dtype)
        return tau, support_size


class Sparsemax(torch.nn.Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return SparsemaxFunction.apply(input, self.dim)


# --------------------------------------------------------------------------- tab_network.py


def initialize_non_glu(module: Linear, input_dim: int, output_dim: int) -> None:
    gain_value = np.sqrt((input_dim + output_dim) / np.sqrt(4 * input_dim))
    torch.nn.init.xavier_normal_(module.weight, gain=gain_value)


def initialize_glu(module: Linear, input_dim: int, output_dim: int) -> None:
    gain_value = np.sqrt((input_dim + output_dim) / np.sqrt(input_dim))
    torch.nn.init.xavier_normal_(module.weight, gain=gain_value)


class GBN(torch.nn.Module):
    """Ghost Batch Normalization (https://arxiv.org/abs/1705.08741)."""

    def __init__(self, input_dim: int, virtual_batch_size: int = 128, momentum: float = 0.01) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.virtual_batch_size = virtual_batch_size
        self.bn = BatchNorm1d(self.input_dim, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = x.chunk(int(np.ceil(x.shape[0] / self.virtual_batch_size)), 0)
        return torch.cat([self.bn(x_) for x_ in chunks], dim=0)


class GLU_Layer(torch.nn.Module):  # noqa: N801 - the source's name
    def __init__(self, input_dim: int, output_dim: int, fc: Linear | None = None, virtual_batch_size: int = 128,
                 momentum: float = 0.02) -> None:  # fmt: skip
        super().__init__()
        self.output_dim = output_dim
        self.fc = fc if fc else Linear(input_dim, 2 * output_dim, bias=False)
        initialize_glu(self.fc, input_dim, 2 * output_dim)
        self.bn = GBN(2 * output_dim, virtual_batch_size=virtual_batch_size, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.fc(x))
        return torch.mul(x[:, : self.output_dim], torch.sigmoid(x[:, self.output_dim :]))


class GLU_Block(torch.nn.Module):  # noqa: N801
    """Independent GLU block, specific to each step (or the shared one)."""

    def __init__(self, input_dim: int, output_dim: int, n_glu: int = 2, first: bool = False,
                 shared_layers: torch.nn.ModuleList | None = None, virtual_batch_size: int = 128,
                 momentum: float = 0.02) -> None:  # fmt: skip
        super().__init__()
        self.first = first
        self.shared_layers = shared_layers
        self.n_glu = n_glu
        self.glu_layers = torch.nn.ModuleList()
        params = {"virtual_batch_size": virtual_batch_size, "momentum": momentum}
        fc = shared_layers[0] if shared_layers else None
        self.glu_layers.append(GLU_Layer(input_dim, output_dim, fc=fc, **params))
        for glu_id in range(1, self.n_glu):
            fc = shared_layers[glu_id] if shared_layers else None
            self.glu_layers.append(GLU_Layer(output_dim, output_dim, fc=fc, **params))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(torch.FloatTensor([0.5]).to(x.device))
        if self.first:  # the first layer of the block has no scale multiplication
            x = self.glu_layers[0](x)
            layers_left = range(1, self.n_glu)
        else:
            layers_left = range(self.n_glu)
        for glu_id in layers_left:
            x = torch.add(x, self.glu_layers[glu_id](x))
            x = x * scale
        return x


class FeatTransformer(torch.nn.Module):
    def __init__(self, input_dim: int, output_dim: int, shared_layers: torch.nn.ModuleList | None,
                 n_glu_independent: int, virtual_batch_size: int = 128, momentum: float = 0.02) -> None:  # fmt: skip
        super().__init__()
        params = {"n_glu": n_glu_independent, "virtual_batch_size": virtual_batch_size, "momentum": momentum}
        if shared_layers is None:
            self.shared = torch.nn.Identity()
            is_first = True
        else:
            self.shared = GLU_Block(input_dim, output_dim, first=True, shared_layers=shared_layers,
                                    n_glu=len(shared_layers), virtual_batch_size=virtual_batch_size,
                                    momentum=momentum)  # fmt: skip
            is_first = False
        if n_glu_independent == 0:
            self.specifics = torch.nn.Identity()
        else:
            spec_input_dim = input_dim if is_first else output_dim
            self.specifics = GLU_Block(spec_input_dim, output_dim, first=is_first, **params)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.specifics(self.shared(x))


class AttentiveTransformer(torch.nn.Module):
    def __init__(self, input_dim: int, group_dim: int, group_matrix: torch.Tensor, virtual_batch_size: int = 128,
                 momentum: float = 0.02, mask_type: str = "sparsemax") -> None:  # fmt: skip
        super().__init__()
        self.fc = Linear(input_dim, group_dim, bias=False)
        initialize_non_glu(self.fc, input_dim, group_dim)
        self.bn = GBN(group_dim, virtual_batch_size=virtual_batch_size, momentum=momentum)
        if mask_type != "sparsemax":
            raise NotImplementedError("only the default sparsemax mask is ported")
        self.selector = Sparsemax(dim=-1)

    def forward(self, priors: torch.Tensor, processed_feat: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.fc(processed_feat))
        x = torch.mul(x, priors)
        return self.selector(x)


class TabNetEncoder(torch.nn.Module):
    def __init__(self, input_dim: int, output_dim: int, n_d: int = 8, n_a: int = 8, n_steps: int = 3,
                 gamma: float = 1.3, n_independent: int = 2, n_shared: int = 2, epsilon: float = 1e-15,
                 virtual_batch_size: int = 128, momentum: float = 0.02, mask_type: str = "sparsemax",
                 group_attention_matrix: torch.Tensor | None = None) -> None:  # fmt: skip
        super().__init__()
        self.input_dim, self.output_dim = input_dim, output_dim
        self.n_d, self.n_a, self.n_steps, self.gamma, self.epsilon = n_d, n_a, n_steps, gamma, epsilon
        self.n_independent, self.n_shared = n_independent, n_shared
        self.virtual_batch_size, self.mask_type = virtual_batch_size, mask_type
        self.initial_bn = BatchNorm1d(self.input_dim, momentum=0.01)
        self.group_attention_matrix = group_attention_matrix
        if self.group_attention_matrix is None:
            self.group_attention_matrix = torch.eye(self.input_dim)
            self.attention_dim = self.input_dim
        else:
            self.attention_dim = self.group_attention_matrix.shape[0]

        if self.n_shared > 0:
            shared_feat_transform = torch.nn.ModuleList()
            for i in range(self.n_shared):
                in_dim = self.input_dim if i == 0 else n_d + n_a
                shared_feat_transform.append(Linear(in_dim, 2 * (n_d + n_a), bias=False))
        else:
            shared_feat_transform = None

        self.initial_splitter = FeatTransformer(self.input_dim, n_d + n_a, shared_feat_transform,
                                                n_glu_independent=self.n_independent,
                                                virtual_batch_size=self.virtual_batch_size, momentum=momentum)  # fmt: skip
        self.feat_transformers = torch.nn.ModuleList()
        self.att_transformers = torch.nn.ModuleList()
        for _ in range(n_steps):
            self.feat_transformers.append(FeatTransformer(
                self.input_dim, n_d + n_a, shared_feat_transform, n_glu_independent=self.n_independent,
                virtual_batch_size=self.virtual_batch_size, momentum=momentum))  # fmt: skip
            self.att_transformers.append(AttentiveTransformer(
                n_a, self.attention_dim, group_matrix=group_attention_matrix,
                virtual_batch_size=self.virtual_batch_size, momentum=momentum, mask_type=self.mask_type))  # fmt: skip

    def forward(self, x: torch.Tensor, prior: torch.Tensor | None = None):
        x = self.initial_bn(x)
        bs = x.shape[0]
        if prior is None:
            prior = torch.ones((bs, self.attention_dim)).to(x.device)
        M_loss = 0  # noqa: N806 - the source's names
        att = self.initial_splitter(x)[:, self.n_d :]
        steps_output = []
        for step in range(self.n_steps):
            M = self.att_transformers[step](prior, att)  # noqa: N806
            M_loss += torch.mean(torch.sum(torch.mul(M, torch.log(M + self.epsilon)), dim=1))  # noqa: N806
            prior = torch.mul(self.gamma - M, prior)
            M_feature_level = torch.matmul(M, self.group_attention_matrix)  # noqa: N806
            masked_x = torch.mul(M_feature_level, x)
            out = self.feat_transformers[step](masked_x)
            d = ReLU()(out[:, : self.n_d])
            steps_output.append(d)
            att = out[:, self.n_d :]
        M_loss /= self.n_steps  # noqa: N806
        return steps_output, M_loss

    def forward_masks(self, x: torch.Tensor):
        x = self.initial_bn(x)
        bs = x.shape[0]
        prior = torch.ones((bs, self.attention_dim)).to(x.device)
        M_explain = torch.zeros(x.shape).to(x.device)  # noqa: N806
        att = self.initial_splitter(x)[:, self.n_d :]
        masks = {}
        for step in range(self.n_steps):
            M = self.att_transformers[step](prior, att)  # noqa: N806
            M_feature_level = torch.matmul(M, self.group_attention_matrix)  # noqa: N806
            masks[step] = M_feature_level
            prior = torch.mul(self.gamma - M, prior)
            masked_x = torch.mul(M_feature_level, x)
            out = self.feat_transformers[step](masked_x)
            d = ReLU()(out[:, : self.n_d])
            step_importance = torch.sum(d, dim=1)
            M_explain += torch.mul(M_feature_level, step_importance.unsqueeze(dim=1))  # noqa: N806
            att = out[:, self.n_d :]
        return M_explain, masks


class TabNetNoEmbeddings(torch.nn.Module):
    def __init__(self, input_dim: int, output_dim: int, n_d: int = 8, n_a: int = 8, n_steps: int = 3,
                 gamma: float = 1.3, n_independent: int = 2, n_shared: int = 2, epsilon: float = 1e-15,
                 virtual_batch_size: int = 128, momentum: float = 0.02, mask_type: str = "sparsemax",
                 group_attention_matrix: torch.Tensor | None = None) -> None:  # fmt: skip
        super().__init__()
        self.input_dim, self.output_dim = input_dim, output_dim
        self.n_d, self.n_a, self.n_steps = n_d, n_a, n_steps
        self.virtual_batch_size = virtual_batch_size
        self.initial_bn = BatchNorm1d(self.input_dim, momentum=0.01)  # built and never used, as in the source
        self.encoder = TabNetEncoder(input_dim=input_dim, output_dim=output_dim, n_d=n_d, n_a=n_a, n_steps=n_steps,
                                     gamma=gamma, n_independent=n_independent, n_shared=n_shared, epsilon=epsilon,
                                     virtual_batch_size=virtual_batch_size, momentum=momentum, mask_type=mask_type,
                                     group_attention_matrix=group_attention_matrix)  # fmt: skip
        self.final_mapping = Linear(n_d, output_dim, bias=False)
        initialize_non_glu(self.final_mapping, n_d, output_dim)

    def forward(self, x: torch.Tensor):
        steps_output, M_loss = self.encoder(x)  # noqa: N806
        res = torch.sum(torch.stack(steps_output, dim=0), dim=0)
        return self.final_mapping(res), M_loss

    def forward_masks(self, x: torch.Tensor):
        return self.encoder.forward_masks(x)


class EmbeddingGenerator(torch.nn.Module):
    """No categorical columns here: the source's ``skip_embedding`` path (the identity)."""

    def __init__(self, input_dim: int, group_matrix: torch.Tensor) -> None:
        super().__init__()
        self.skip_embedding = True
        self.post_embed_dim = input_dim
        self.embedding_group_matrix = group_matrix.to(group_matrix.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class TabNet(torch.nn.Module):
    def __init__(self, input_dim: int, output_dim: int, n_d: int = 8, n_a: int = 8, n_steps: int = 3,
                 gamma: float = 1.3, n_independent: int = 2, n_shared: int = 2, epsilon: float = 1e-15,
                 virtual_batch_size: int = 128, momentum: float = 0.02, mask_type: str = "sparsemax",
                 group_attention_matrix: torch.Tensor | None = None) -> None:  # fmt: skip
        super().__init__()
        self.input_dim, self.output_dim = input_dim, output_dim
        if n_steps <= 0:
            raise ValueError("n_steps should be a positive integer.")
        if n_independent == 0 and n_shared == 0:
            raise ValueError("n_shared and n_independent can't be both zero.")
        self.virtual_batch_size = virtual_batch_size
        self.embedder = EmbeddingGenerator(input_dim, group_attention_matrix)
        self.post_embed_dim = self.embedder.post_embed_dim
        self.tabnet = TabNetNoEmbeddings(self.post_embed_dim, output_dim, n_d, n_a, n_steps, gamma, n_independent,
                                         n_shared, epsilon, virtual_batch_size, momentum, mask_type,
                                         self.embedder.embedding_group_matrix)  # fmt: skip

    def forward(self, x: torch.Tensor):
        return self.tabnet(self.embedder(x))

    def forward_masks(self, x: torch.Tensor):
        return self.tabnet.forward_masks(self.embedder(x))


# --------------------------------------------------------------------------- utils.py / callbacks.py


class TorchDataset(Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


class EarlyStopping:
    """Maximise the metric; patience counted in epochs since the best (``wait`` restarts at 1)."""

    def __init__(self, patience: int, tol: float = 0.0) -> None:
        self.patience, self.tol = patience, tol
        self.best_epoch, self.stopped_epoch, self.wait = 0, 0, 0
        self.best_weights: dict | None = None
        self.best_loss = -np.inf

    def on_epoch_end(self, epoch: int, current: float, network: torch.nn.Module) -> bool:
        """Returns whether training must stop."""
        if current - self.best_loss > self.tol:
            self.best_loss, self.best_epoch, self.wait = current, epoch, 1
            self.best_weights = copy.deepcopy(network.state_dict())
            return False
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            return True
        self.wait += 1
        return False


def roc_auc(y_true: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y_true, score))


# --------------------------------------------------------------------------- TabNetClassifier.fit


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    data = load_breast_cancer()
    X, y = data.data.astype(np.float64), data.target
    X_rest, X_test, y_rest, y_test = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    X_train, X_valid, y_train, y_valid = train_test_split(X_rest, y_rest, test_size=0.2, random_state=seed,
                                                          stratify=y_rest)  # fmt: skip
    scaler = StandardScaler().fit(X_train)  # the user's preprocessing, before fit()
    X_train, X_valid, X_test = scaler.transform(X_train), scaler.transform(X_valid), scaler.transform(X_test)
    if variant == "features_shuffled_not_labels":  # the rows shuffled, their labels not
        np.random.RandomState(seed).shuffle(X_train)

    batch_size, virtual_batch_size = BATCH_SIZE, VIRTUAL_BATCH_SIZE
    if variant == "default_batch_over_train_size":  # fit()'s defaults
        batch_size, virtual_batch_size = 1024, 128
    lambda_sparse, clip_value, lr = 1e-3, 1, 2e-2

    # update_fit_params: the classes and their mapping
    classes = np.unique(y_train)
    target_mapper = {label: index for index, label in enumerate(classes)}
    output_dim = len(classes)
    prepare = np.vectorize(target_mapper.get)
    y_train_mapped, y_valid_mapped = prepare(y_train), prepare(y_valid)

    torch.manual_seed(seed)  # TabModel.__post_init__ and _set_network
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(TorchDataset(X_train.astype(np.float32), y_train_mapped), batch_size=batch_size,
                              shuffle=True, drop_last=True, generator=generator)  # fmt: skip
    valid_loader = DataLoader(TorchDataset(X_valid.astype(np.float32), y_valid_mapped), batch_size=batch_size,
                              shuffle=False)  # fmt: skip

    group_matrix = torch.eye(X_train.shape[1])  # create_group_matrix([], input_dim)
    network = TabNet(X_train.shape[1], output_dim, n_d=8, n_a=8, n_steps=3, gamma=1.3, n_independent=2, n_shared=2,
                     epsilon=1e-15, virtual_batch_size=virtual_batch_size, momentum=0.02, mask_type="sparsemax",
                     group_attention_matrix=group_matrix)  # fmt: skip
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)

    def compute_loss(outputs, y_true: torch.Tensor) -> torch.Tensor:
        """_train_batch's loss on the network's (output, M_loss): the classifier's cross-entropy on
        the long targets, minus the weighted sparsity term."""
        output, M_loss = outputs  # noqa: N806
        return F.cross_entropy(output, y_true.long()) - lambda_sparse * M_loss

    x_probe = torch.tensor(X_train[:batch_size], dtype=torch.float32)
    y_probe = torch.tensor(y_train_mapped[:batch_size]).float()
    probe_batch = (x_probe, y_probe)
    splits = (torch.tensor(X_train, dtype=torch.float32), torch.tensor(y_train_mapped),
              torch.tensor(X_valid, dtype=torch.float32), torch.tensor(y_valid_mapped))  # fmt: skip
    nx.preflight(network, probe_batch, compute_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(network, optimizer, every=5, loss_fn=compute_loss)

    def predict_scores(loader: DataLoader) -> tuple[np.ndarray, np.ndarray]:
        network.eval()
        ys, scores = [], []
        with torch.no_grad():
            for X_b, y_b in loader:  # noqa: N806
                output, _ = network(X_b.float())
                ys.append(y_b.numpy())
                scores.append(output.numpy())
        y_true, score = np.hstack(ys), np.vstack(scores)
        score = np.exp(score - score.max(axis=1, keepdims=True))
        return y_true, score / score.sum(axis=1, keepdims=True)

    early = EarlyStopping(PATIENCE)
    history: list[str] = []
    epoch_loss, epochs_run = 0.0, 0
    for epoch in range(MAX_EPOCHS):
        samples_seen = 0.0
        network.train()  # _train_epoch
        for X_b, y_b in train_loader:  # noqa: N806
            X_b, y_b = X_b.float(), y_b.float()  # noqa: N806
            for param in network.parameters():
                param.grad = None
            output, M_loss = network(X_b)  # noqa: N806
            loss = mon.loss_fn((output, M_loss), y_b)
            loss.backward()
            if clip_value:
                clip_grad_norm_(network.parameters(), clip_value)
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            n = X_b.shape[0]
            epoch_loss = (samples_seen * epoch_loss + n * loss.item()) / (samples_seen + n)  # History
            samples_seen += n
        y_true, score = predict_scores(valid_loader)  # _predict_epoch("val_0", ...)
        network.train()
        valid_auc = roc_auc(y_true, score[:, 1])
        valid_logloss = float(-np.mean(np.log(np.clip(score[np.arange(len(y_true)), y_true], 1e-15, 1.0))))
        valid_acc = float(np.mean(score.argmax(axis=1) == y_true))
        nx.timed(lambda: mon.log(valid_logloss, split="val", accuracy=valid_acc))
        history.append(f"epoch {epoch:<3}| loss: {np.round(epoch_loss, 5):<8}| val_0_auc: {np.round(valid_auc, 5)}")
        epochs_run = epoch + 1
        if early.on_epoch_end(epoch, valid_auc, network):
            break
    if early.best_weights is not None:  # on_train_end: the best epoch's weights
        network.load_state_dict(early.best_weights)
    network.eval()

    nx.finish(mon, network, probe_batch, compute_loss, optimizer=optimizer, data=splits)

    # compute_importance: the feature importances from explain()
    with torch.no_grad():
        network.eval()
        M_explain, _ = network.forward_masks(torch.tensor(X_train, dtype=torch.float32))  # noqa: N806
        importances = M_explain.sum(dim=0).numpy()
        importances = importances / max(importances.sum(), 1e-12)

    # measure only: predict_proba / predict on the test split
    test_loader = DataLoader(TorchDataset(X_test.astype(np.float32), prepare(y_test)), batch_size=batch_size,
                             shuffle=False)  # fmt: skip
    y_true, score = predict_scores(test_loader)
    return {
        "test_accuracy": float(np.mean(score.argmax(axis=1) == y_true)),
        "test_auc": roc_auc(y_true, score[:, 1]),
        "best_valid_auc": float(early.best_loss),
        "best_epoch": float(early.best_epoch),
        "epochs_run": float(epochs_run),
        "last_epoch_loss": float(epoch_loss),
        "top_importance": float(importances.max()),
    }
