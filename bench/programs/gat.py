"""Port of the PyTorch graph attention network example (Velickovic et al.'s GAT on Cora).

Source: github.com/pytorch/examples, ``gat/main.py`` at commit
259172f190fdfc12ea16adadd27ab1873ada0165 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``GraphAttentionLayer`` (a shared weight ``W`` of shape (in, n_hidden * n_heads) and
attention vectors ``a`` of shape (n_heads, 2 * n_hidden, 1), both ``xavier_normal_``;
``torch.mm(h, W)``, functional ``F.dropout(..., training=self.training)``, the heads split
by ``view(n_nodes, n_heads, n_hidden).permute(1, 0, 2)``; scores ``LeakyReLU(0.2)`` of the
source part plus the transposed target part (broadcast to (heads, nodes, nodes)); the
non-edges set to -9e16 with ``torch.where(adj_mat > 0, e, ...)``; ``F.softmax(e,
dim=-1)``, dropout on the attention, ``torch.matmul(attention, h)``; the heads averaged
(``concat=False``, the default) or concatenated; the unused ``nn.Softmax(dim=1)`` member
kept); ``GAT`` = GAT layer (n_heads) -> ``F.elu`` -> GAT layer (1 head, num_classes) ->
``F.log_softmax(dim=1)``; ``load_cora``'s preprocessing: binary bag-of-words features
row-normalised (empty rows left at zero), kept dense, the adjacency from the *directed*
citation list plus the identity, dense and not normalised (only ``> 0`` is read);
``torch.randperm`` split into test / val / train in the example's 1,200 / 400 / 1,108
proportions of 2,708 nodes; full-batch training, one step per epoch (``train_iter``:
``model.train()``, ``zero_grad``, forward on every node, ``nn.NLLLoss`` over the training
nodes, ``backward``, ``step``, then ``test`` on the training and validation nodes under
``model.eval()`` + ``torch.no_grad()``); the final ``test`` on the test nodes;
``Adam(lr=0.005, weight_decay=5e-4)``, dropout 0.6, 8 heads, ``torch.manual_seed(13)``.
Shrunk: Cora (downloaded) replaced by the stochastic block model the ``gcn`` port builds
(``bench.programs.gcn.synthetic_cora``: Cora's 7 class proportions, about 2 directed
citations a node, edge homophily about 0.79, 400-word binary bag-of-words), 300 nodes
instead of 2,708; hidden size 16 instead of 64; 200 epochs instead of 300 (the healthy run's
test accuracy is 0.76-0.81 on seeds 0-2; its NLL is still falling).

nndx, as the author would add it (the other ports' layout): a preflight ``nndx.probe`` on
the full batch ``((features, adj_mat), labels)`` with the loop's masked loss as the loss
function, the loop under ``nndx.Monitor`` with the criterion called through
``mon.loss_fn``, the validation loss and accuracy ``train_iter`` already computes logged as
``split="val"`` every epoch, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.gcn import synthetic_cora
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gat"
SOURCE = Source("pytorch/examples", "gat/main.py", "259172f190fdfc12ea16adadd27ab1873ada0165", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (default arguments: heads averaged)"),
        Variant(
            "dropout_ignores_eval",
            "F.dropout(h_transformed, self.dropout) and F.dropout(attention, self.dropout) without "
            "training=self.training: the functional dropout (p=0.6) stays on under model.eval(), so every "
            "validation and test pass is a random dropped-out net",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/rixwew/pytorch-fm/issues/21",
             "https://github.com/pytorch/pytorch/issues/26338",
             "https://github.com/pytorch/pytorch/issues/11999"),
            Measure("test_accuracy", "test accuracy, as the example's test() reports it (dropout on), at least "
                    "0.1 below the healthy run's (0.79/0.76/0.81 healthy, 0.42/0.49/0.47 buggy on seeds 0-2)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "softmax_into_nll",
            "GAT.forward returns F.softmax(x, dim=1) instead of F.log_softmax(x, dim=1): nn.NLLLoss is given "
            "probabilities, so the loss is -p(target) (bounded, negative) instead of -log p(target)",
            (C.WRONG_LOSS, C.WRONG_OUTPUT_ACTIVATION),  # filed as the mnist port files the same bug
            ("https://github.com/midas-research/man-sf-emnlp/issues/2",
             "https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9",
             "https://github.com/clvrai/ACGAN-PyTorch/issues/3"),
            Measure("test_accuracy", "test accuracy at least 0.1 below the healthy run's (0.79/0.76/0.81 healthy, "
                    "0.26/0.30/0.38 buggy on seeds 0-2; the test NLL the example prints turns negative)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

N_NODES = 300
EPOCHS = 200
LR = 0.005
L2 = 5e-4
DROPOUT_P = 0.6
HIDDEN_DIM = 16
NUM_HEADS = 8
CORA_NODES, CORA_TEST, CORA_VAL = 2708, 1200, 400


# --------------------------------------------------------------------------- the model


class GraphAttentionLayer(nn.Module):
    def __init__(self, in_features: int, out_features: int, n_heads: int, concat: bool = False,
                 dropout: float = 0.4, leaky_relu_slope: float = 0.2, dropout_obeys_eval: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.n_heads = n_heads
        self.concat = concat
        self.dropout = dropout
        if concat:
            self.out_features = out_features
            assert out_features % n_heads == 0
            self.n_hidden = out_features // n_heads
        else:
            self.n_hidden = out_features
        self.W = nn.Parameter(torch.empty(size=(in_features, self.n_hidden * n_heads)))
        self.a = nn.Parameter(torch.empty(size=(n_heads, 2 * self.n_hidden, 1)))
        self.leakyrelu = nn.LeakyReLU(leaky_relu_slope)
        self.softmax = nn.Softmax(dim=1)  # defined, never called (the forward uses F.softmax)
        self.dropout_obeys_eval = dropout_obeys_eval
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_normal_(self.W)
        nn.init.xavier_normal_(self.a)

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout_obeys_eval:
            return F.dropout(x, self.dropout, training=self.training)
        return F.dropout(x, self.dropout)  # the bug: F.dropout's training defaults to True

    def _get_attention_scores(self, h_transformed: torch.Tensor) -> torch.Tensor:
        source_scores = torch.matmul(h_transformed, self.a[:, : self.n_hidden, :])
        target_scores = torch.matmul(h_transformed, self.a[:, self.n_hidden :, :])
        e = source_scores + target_scores.mT  # (heads, nodes, 1) + (heads, 1, nodes)
        return self.leakyrelu(e)

    def forward(self, h: torch.Tensor, adj_mat: torch.Tensor) -> torch.Tensor:
        n_nodes = h.shape[0]
        h_transformed = torch.mm(h, self.W)
        h_transformed = self._dropout(h_transformed)
        h_transformed = h_transformed.view(n_nodes, self.n_heads, self.n_hidden).permute(1, 0, 2)
        e = self._get_attention_scores(h_transformed)
        connectivity_mask = -9e16 * torch.ones_like(e)
        e = torch.where(adj_mat > 0, e, connectivity_mask)
        attention = F.softmax(e, dim=-1)
        attention = self._dropout(attention)
        h_prime = torch.matmul(attention, h_transformed)
        if self.concat:
            return h_prime.permute(1, 0, 2).contiguous().view(n_nodes, self.out_features)
        return h_prime.mean(dim=0)


class GAT(nn.Module):
    def __init__(self, in_features: int, n_hidden: int, n_heads: int, num_classes: int, concat: bool = False,
                 dropout: float = 0.4, leaky_relu_slope: float = 0.2, dropout_obeys_eval: bool = True,
                 log_softmax_out: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.gat1 = GraphAttentionLayer(in_features, n_hidden, n_heads, concat, dropout, leaky_relu_slope,
                                        dropout_obeys_eval)  # fmt: skip
        self.gat2 = GraphAttentionLayer(n_hidden, num_classes, 1, False, dropout, leaky_relu_slope, dropout_obeys_eval)
        self.log_softmax_out = log_softmax_out

    def forward(self, input_tensor: torch.Tensor, adj_mat: torch.Tensor) -> torch.Tensor:
        x = self.gat1(input_tensor, adj_mat)
        x = F.elu(x)
        x = self.gat2(x, adj_mat)
        if not self.log_softmax_out:
            return F.softmax(x, dim=1)  # the bug: probabilities handed to NLLLoss
        return F.log_softmax(x, dim=1)


# --------------------------------------------------------------------------- load_cora, on the synthetic graph


def load_graph(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``load_cora``'s preprocessing: (dense row-normalised features, labels, dense A + I)."""
    raw_features, raw_labels, edges = synthetic_cora(seed, n=N_NODES)
    features = torch.from_numpy(raw_features)
    scale_vector = 1 / torch.sum(features, dim=1)
    scale_vector[scale_vector == float("inf")] = 0
    features = torch.diag(scale_vector).to_sparse() @ features
    labels = torch.from_numpy(raw_labels).long()
    v, e = len(labels), len(edges)
    adj_mat = torch.sparse_coo_tensor(torch.from_numpy(edges.T), torch.ones(e), (v, v), dtype=torch.int64)
    adj_mat = torch.eye(v) + adj_mat
    return features, labels, adj_mat


# --------------------------------------------------------------------------- train_iter / test / main


def test(model: nn.Module, criterion: nn.Module, input: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor,
         mask: torch.Tensor) -> tuple[float, float]:  # fmt: skip
    model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = EPOCHS) -> dict[str, float]:
    torch.manual_seed(13 + seed)  # the example's --seed default
    features, labels, adj_mat = load_graph(seed=seed)
    idx = torch.randperm(len(labels))
    n_test, n_val = round(len(labels) * CORA_TEST / CORA_NODES), round(len(labels) * CORA_VAL / CORA_NODES)
    idx_test, idx_val, idx_train = idx[:n_test], idx[n_test : n_test + n_val], idx[n_test + n_val :]

    gat_net = GAT(in_features=features.shape[1], n_hidden=HIDDEN_DIM, n_heads=NUM_HEADS,
                  num_classes=labels.max().item() + 1, concat=False, dropout=DROPOUT_P, leaky_relu_slope=0.2,
                  dropout_obeys_eval=variant != "dropout_ignores_eval",
                  log_softmax_out=variant != "softmax_into_nll")  # fmt: skip
    optimizer = torch.optim.Adam(gat_net.parameters(), lr=LR, weight_decay=L2)
    criterion = nn.NLLLoss()

    def loss_on_graph(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(output[idx_train], target[idx_train])  # the loop's loss, for the probe

    full_batch = ((features, adj_mat), labels)
    nx.preflight(gat_net, full_batch, loss_on_graph, optimizer=optimizer)
    mon = nx.monitor(gat_net, optimizer, every=10, loss_fn=criterion)

    for _epoch in range(1, epochs + 1):  # train_iter
        gat_net.train()
        optimizer.zero_grad()
        output = gat_net(features, adj_mat)
        loss = mon.loss_fn(output[idx_train], labels[idx_train])
        loss.backward()
        optimizer.step()
        mon.log(loss)
        loss_train, acc_train = test(gat_net, criterion, (features, adj_mat), labels, idx_train)
        loss_val, acc_val = test(gat_net, criterion, (features, adj_mat), labels, idx_val)
        mon.log(loss_val, split="val", accuracy=acc_val)

    nx.finish(mon, gat_net, full_batch, loss_on_graph, optimizer=optimizer)
    loss_test, acc_test = test(gat_net, criterion, (features, adj_mat), labels, idx_test)
    return {
        "train_loss": loss_train,
        "train_accuracy": acc_train,
        "val_loss": loss_val,
        "val_accuracy": acc_val,
        "test_loss": loss_test,
        "test_accuracy": acc_test,
        "test_log_loss": test_log_loss(gat_net, features, adj_mat, labels, idx_test, variant == "softmax_into_nll"),
    }


@torch.no_grad()
def test_log_loss(model: nn.Module, features, adj_mat, labels, mask, outputs_are_probabilities: bool) -> float:
    """Measure only: the cross-entropy of the class probabilities the network stands for."""
    model.eval()
    output = model(features, adj_mat)[mask]
    log_p = output.clamp_min(1e-12).log() if outputs_are_probabilities else output
    return F.nll_loss(log_p, labels[mask]).item()
