"""Port of davidmrau/mixture-of-experts: the sparsely-gated mixture-of-experts layer of
Shazeer et al. 2017 ("Outrageously Large Neural Networks") trained as a classifier by its
``cifar10_example.py``.

Source: github.com/davidmrau/mixture-of-experts, ``moe.py`` and ``cifar10_example.py`` at
commit f662999727109357c42074997e9a6cd72806f668 (GPL-3.0, David Rau). Written anew from the
facts of those files; no code copied.

Kept: ``SparseDispatcher`` (the batch positions of the non-zero gates sorted by expert,
``_part_sizes`` = how many examples each expert gets, ``dispatch`` = the input rows split per
expert, ``combine`` = the expert outputs multiplied by their gates and ``index_add``-ed back
into a zero tensor of the batch's size); the expert ``MLP`` (``fc1`` -> ReLU -> ``fc2`` ->
``Softmax(1)``, as published: the experts output probabilities, which the example then feeds
to ``CrossEntropyLoss``); ``MoE`` with ``w_gate`` and ``w_noise`` zero-initialised
``nn.Parameter``s, ``noisy_top_k_gating`` (clean logits ``x @ w_gate``; in training the noise
std ``softplus(x @ w_noise) + 1e-2`` times ``randn`` added; a softmax over the experts; the
top ``k + 1``; the top ``k`` renormalised by their sum + 1e-6 and scattered into a zero gate
matrix), ``_prob_in_top_k`` (the normal CDF of the clean logit against the k-th / (k+1)-th
noisy threshold) as the differentiable ``load`` in training and the count of non-zero gates
otherwise, ``cv_squared`` (var / (mean^2 + 1e-10)), ``forward`` returning ``(y, loss_coef *
(cv_squared(importance) + cv_squared(load)))`` with ``importance = gates.sum(0)`` and
``loss_coef`` 1e-2; ``cifar10_example.py``'s loop: ``MoE(num_experts=10, k=4,
noisy_gating=True)``, ``nn.CrossEntropyLoss()``, ``Adam(lr=0.001)``, ``net.train()``, per
batch ``zero_grad``, inputs flattened, ``outputs, aux_loss = net(inputs)``, ``total_loss =
loss + aux_loss``, ``backward``, ``step``, the running loss printed every 100 batches (kept
as a record); then ``net.eval()`` and ``torch.no_grad()`` over the test loader, the argmax of
the outputs counted against the labels; the transform ``ToTensor`` + ``Normalize(0.5, 0.5)``.
Shrunk: scikit-learn's 8x8 digits (64 inputs, 1,437 train / 360 test) instead of CIFAR-10's
3,072; ``hidden_size`` 32 instead of 128; 12 epochs over the digits (276 batches of 64)
instead of one epoch over CIFAR's 50,000 images (782 batches); the running loss printed
every 20 batches instead of 100; CPU, no DataLoader workers.
Measure only (not in the program): the test accuracy the program prints, and the expert
utilisation on the test set (each expert's share of the examples it is among the top k for;
``max_expert_share`` is the largest share, 0.4 = 4 of 10 experts used evenly, 1.0 = one
expert sees every example; ``experts_unused`` counts experts no test example is sent to).

nndx, as the author would add it: the layer returns ``(y, aux_loss)``, so the loss the probe
and the Monitor are given is the example's ``criterion(outputs, labels) + aux_loss`` as a
function of that pair; a preflight ``nndx.probe`` on the first training batch (with the data
splits), ``nndx.Monitor(net, optimizer)`` around the loop with that loss called as
``mon.loss_fn``, every batch's total loss logged with its accuracy, the test loss and
accuracy logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions.normal import Normal
from torch.optim import Adam

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "moe"
SOURCE = Source("davidmrau/mixture-of-experts", "cifar10_example.py", "f662999727109357c42074997e9a6cd72806f668",
                "GPL-3.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (10 MLP experts, k=4, noisy gating, loss_coef 1e-2)"),
        Variant(
            "aux_loss_dropped",
            "the load-balancing loss returned by the layer is computed but never added: total_loss = loss "
            "instead of loss + aux_loss, so nothing keeps the router from sending everything to a few experts",
            (C.WRONG_LOSS,),
            ("https://github.com/jingyaogong/minimind/issues/140", "https://github.com/pytorch/torchtitan/issues/1246",
             "https://github.com/davidmrau/mixture-of-experts/issues/10",
             "https://github.com/huggingface/transformers/issues/28093"),
            Measure("max_expert_share", "the largest share of test examples routed to one expert at least 0.15 above "
                    "the healthy run's: 0.89 (2 experts unused) against 0.59 on seed 0 (test accuracy 0.958 "
                    "against 0.947: the bug shows in the routing, not the accuracy)",
                    lambda healthy, buggy: buggy >= healthy + 0.15),
        ),
        Variant(
            "gate_not_registered",
            "w_gate and w_noise created as nn.Parameter(...).to(self.device) (the repository's code before PR #14): "
            "on a GPU .to() returns a copy that is a plain tensor, so the router's weights are no parameters of the "
            "model, Adam never sees them and they stay zero (reproduced on the CPU by the same copy)",
            (C.FROZEN_PARAMETERS, C.OPTIMIZER_NOT_CONNECTED),
            ("https://github.com/davidmrau/mixture-of-experts/issues/12",
             "https://github.com/davidmrau/mixture-of-experts/pull/14", "https://github.com/pytorch/pytorch/issues/17484",
             "https://github.com/yfzhang114/SliME/issues/3"),
            Measure("max_expert_share", "the largest share of test examples routed to one expert at least 0.15 above "
                    "the healthy run's (zero clean logits at test: every example goes to the same k experts): "
                    "1.0 (6 unused) against 0.59 on seed 0, test accuracy 0.839 against 0.947",
                    lambda healthy, buggy: buggy >= healthy + 0.15),
        ),
    )
}

ARGS = {"num_experts": 10, "hidden_size": 32, "k": 4, "batch_size": 64, "lr": 0.001, "epochs": 12, "print_freq": 20}


# --------------------------------------------------------------------------- moe.py


class SparseDispatcher:
    """Splits a batch among the experts whose gate is non-zero and combines their outputs."""

    def __init__(self, num_experts: int, gates: torch.Tensor) -> None:
        self._gates = gates
        self._num_experts = num_experts
        nonzero = torch.nonzero(gates)
        sorted_experts, index_sorted_experts = nonzero.sort(0)
        _, self._expert_index = sorted_experts.split(1, dim=1)
        self._batch_index = nonzero[index_sorted_experts[:, 1], 0]
        self._part_sizes = (gates > 0).sum(0).tolist()
        gates_exp = gates[self._batch_index.flatten()]
        self._nonzero_gates = torch.gather(gates_exp, 1, self._expert_index)

    def dispatch(self, inp: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inp_exp = inp[self._batch_index].squeeze(1)
        return torch.split(inp_exp, self._part_sizes, dim=0)

    def combine(self, expert_out: list[torch.Tensor], multiply_by_gates: bool = True) -> torch.Tensor:
        stitched = torch.cat(expert_out, 0)
        if multiply_by_gates:
            stitched = stitched.mul(self._nonzero_gates)
        zeros = torch.zeros(self._gates.size(0), expert_out[-1].size(1), requires_grad=True, device=stitched.device)
        return zeros.index_add(0, self._batch_index, stitched.float())

    def expert_to_gates(self) -> tuple[torch.Tensor, ...]:
        return torch.split(self._nonzero_gates, self._part_sizes, dim=0)


class MLP(nn.Module):
    def __init__(self, input_size: int, output_size: int, hidden_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, output_size)
        self.relu = nn.ReLU()
        self.soft = nn.Softmax(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.soft(self.fc2(self.relu(self.fc1(x))))


class MoE(nn.Module):
    def __init__(self, input_size: int, output_size: int, num_experts: int, hidden_size: int,
                 noisy_gating: bool = True, k: int = 4, registered: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.noisy_gating, self.num_experts, self.k = noisy_gating, num_experts, k
        self.input_size, self.output_size, self.hidden_size = input_size, output_size, hidden_size
        self.experts = nn.ModuleList([MLP(input_size, output_size, hidden_size) for _ in range(num_experts)])
        self.w_gate = nn.Parameter(torch.zeros(input_size, num_experts), requires_grad=True)
        self.w_noise = nn.Parameter(torch.zeros(input_size, num_experts), requires_grad=True)
        if not registered:  # before PR #14: nn.Parameter(...).to(self.device); on a GPU .to() returns a copy
            del self.w_gate, self.w_noise
            self.w_gate = nn.Parameter(torch.zeros(input_size, num_experts), requires_grad=True).clone()
            self.w_noise = nn.Parameter(torch.zeros(input_size, num_experts), requires_grad=True).clone()
        self.softplus = nn.Softplus()
        self.softmax = nn.Softmax(1)
        self.register_buffer("mean", torch.tensor([0.0]))
        self.register_buffer("std", torch.tensor([1.0]))
        self.last_load: torch.Tensor | None = None  # measure only: the hard load of the last forward
        assert self.k <= self.num_experts

    def cv_squared(self, x: torch.Tensor) -> torch.Tensor:
        eps = 1e-10
        if x.shape[0] == 1:
            return torch.tensor([0], device=x.device, dtype=x.dtype)
        return x.float().var() / (x.float().mean() ** 2 + eps)

    def _gates_to_load(self, gates: torch.Tensor) -> torch.Tensor:
        return (gates > 0).sum(0)

    def _prob_in_top_k(self, clean_values, noisy_values, noise_stddev, noisy_top_values) -> torch.Tensor:
        batch = clean_values.size(0)
        m = noisy_top_values.size(1)
        top_values_flat = noisy_top_values.flatten()
        threshold_positions_if_in = torch.arange(batch, device=clean_values.device) * m + self.k
        threshold_if_in = torch.unsqueeze(torch.gather(top_values_flat, 0, threshold_positions_if_in), 1)
        is_in = torch.gt(noisy_values, threshold_if_in)
        threshold_positions_if_out = threshold_positions_if_in - 1
        threshold_if_out = torch.unsqueeze(torch.gather(top_values_flat, 0, threshold_positions_if_out), 1)
        normal = Normal(self.mean, self.std)
        prob_if_in = normal.cdf((clean_values - threshold_if_in) / noise_stddev)
        prob_if_out = normal.cdf((clean_values - threshold_if_out) / noise_stddev)
        return torch.where(is_in, prob_if_in, prob_if_out)

    def noisy_top_k_gating(self, x: torch.Tensor, train: bool, noise_epsilon: float = 1e-2):
        clean_logits = x @ self.w_gate
        if self.noisy_gating and train:
            raw_noise_stddev = x @ self.w_noise
            noise_stddev = self.softplus(raw_noise_stddev) + noise_epsilon
            noisy_logits = clean_logits + torch.randn_like(clean_logits) * noise_stddev
            logits = noisy_logits
        else:
            logits = clean_logits
        logits = self.softmax(logits)
        top_logits, top_indices = logits.topk(min(self.k + 1, self.num_experts), dim=1)
        top_k_logits = top_logits[:, : self.k]
        top_k_indices = top_indices[:, : self.k]
        top_k_gates = top_k_logits / (top_k_logits.sum(1, keepdim=True) + 1e-6)
        zeros = torch.zeros_like(logits, requires_grad=True)
        gates = zeros.scatter(1, top_k_indices, top_k_gates)
        if self.noisy_gating and self.k < self.num_experts and train:
            load = self._prob_in_top_k(clean_logits, noisy_logits, noise_stddev, top_logits).sum(0)
        else:
            load = self._gates_to_load(gates)
        return gates, load

    def forward(self, x: torch.Tensor, loss_coef: float = 1e-2):
        gates, load = self.noisy_top_k_gating(x, self.training)
        self.last_load = (gates > 0).sum(0).detach()
        importance = gates.sum(0)
        loss = self.cv_squared(importance) + self.cv_squared(load)
        loss *= loss_coef
        dispatcher = SparseDispatcher(self.num_experts, gates)
        expert_inputs = dispatcher.dispatch(x)
        gates = dispatcher.expert_to_gates()
        expert_outputs = [self.experts[i](expert_inputs[i]) for i in range(self.num_experts)]
        y = dispatcher.combine(expert_outputs)
        return y, loss


# --------------------------------------------------------------------------- cifar10_example.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, test_raw, test_labels = data.digit_images(seed=seed)
    # ToTensor() + Normalize((0.5,), (0.5,)), then inputs.view(inputs.shape[0], -1)
    x_train = ((data.to_tensor(train_raw) - 0.5) / 0.5).view(len(train_raw), -1)
    x_test = ((data.to_tensor(test_raw) - 0.5) / 0.5).view(len(test_raw), -1)

    net = MoE(input_size=64, output_size=10, num_experts=args["num_experts"], hidden_size=args["hidden_size"],
              noisy_gating=True, k=args["k"], registered=variant != "gate_not_registered")  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    optimizer = Adam(net.parameters(), lr=args["lr"])

    def moe_loss(output, labels: torch.Tensor) -> torch.Tensor:
        """The example's total loss as a function of the layer's (outputs, aux_loss)."""
        outputs, aux_loss = output
        loss = criterion(outputs, labels)
        return loss if variant == "aux_loss_dropped" else loss + aux_loss

    first_batch = (x_train[: args["batch_size"]], train_labels[: args["batch_size"]])
    nx.preflight(net, first_batch, moe_loss, optimizer=optimizer, data=(x_train, train_labels, x_test, test_labels))
    mon = nx.monitor(net, optimizer, every=5, loss_fn=moe_loss)

    shuffle = torch.Generator().manual_seed(seed)
    progress: list[str] = []
    net.train()
    for epoch in range(args["epochs"]):
        running_loss = 0.0
        order = torch.randperm(len(x_train), generator=shuffle)
        for i, start in enumerate(range(0, len(order), args["batch_size"])):
            idx = order[start : start + args["batch_size"]]
            inputs, labels = x_train[idx], train_labels[idx]
            optimizer.zero_grad()
            output = net(inputs)
            total_loss = mon.loss_fn(output, labels)
            total_loss.backward()
            optimizer.step()
            outputs = output[0]
            acc = (outputs.argmax(1) == labels).float().mean().item()
            mon.log(total_loss, accuracy=acc)
            running_loss += criterion(outputs.detach(), labels).item()
            if i % args["print_freq"] == args["print_freq"] - 1:
                progress.append(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / args['print_freq']:.3f}")
                running_loss = 0.0

    correct, total, test_loss, n_batches = 0, 0, 0.0, 0
    load = torch.zeros(args["num_experts"])
    net.eval()
    with torch.no_grad():
        for start in range(0, len(x_test), args["batch_size"]):
            images, labels = x_test[start : start + args["batch_size"]], test_labels[start : start + args["batch_size"]]
            outputs, _ = net(images)
            load += net.last_load.float()
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
            test_loss += criterion(outputs, labels).item()
            n_batches += 1
    test_acc = correct / total
    mon.log(test_loss / n_batches, split="val", accuracy=test_acc)

    nx.finish(mon, net, first_batch, moe_loss, optimizer=optimizer, data=(x_train, train_labels, x_test, test_labels))
    share = load / total
    return {"test_acc": test_acc, "test_loss": test_loss / n_batches, "max_expert_share": float(share.max()),
            "experts_unused": float((share == 0).sum())}  # fmt: skip
