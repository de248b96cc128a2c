"""Port of microsoft/LoRA (``loralib``: low-rank adapters on the attention projections of a
pre-trained transformer, fine-tuned with the base weights frozen) as its NLU example uses it:
RoBERTa with ``lora.Linear`` query/value projections, fine-tuned on a GLUE task.

Source: github.com/microsoft/LoRA, ``loralib/layers.py``, ``loralib/utils.py``,
``examples/NLU/examples/text-classification/run_glue.py``,
``examples/NLU/src/transformers/models/roberta/modeling_roberta.py`` and
``examples/NLU/roberta_base_sst2.sh`` at commit c4593f060e6a368d7bb5af5273b8e42810cdef90 (MIT,
Copyright (c) Microsoft Corporation). Written anew from the facts of those files; no code
copied.

Kept: ``lora.Linear``: an ``nn.Linear`` whose ``weight`` is frozen (``requires_grad = False``),
``lora_A`` (r x in) initialised ``kaiming_uniform_(a=sqrt(5))``, ``lora_B`` (out x r) zeros,
``scaling = lora_alpha / r``, forward ``F.linear(x, W, b) + x @ A^T @ B^T * scaling``, and
``merge_weights``: ``eval()`` adds ``B @ A * scaling`` into ``weight`` and ``train()`` takes it back
out; ``mark_only_lora_as_trainable`` (every parameter without ``lora_`` in its name frozen);
``modeling_roberta``'s self-attention with ``query`` and ``value`` as ``lora.Linear(hidden,
hidden, lora_r, lora_alpha)`` and ``key`` a plain ``nn.Linear``; the post-LN RoBERTa layer
(attention output dense + residual + LayerNorm, GELU intermediate, output dense + residual +
LayerNorm), word + learnt position embeddings with LayerNorm, ``RobertaClassificationHead``
(the ``<s>`` token's state -> dense -> tanh -> out_proj), ``CrossEntropyLoss``; ``run_glue.py``'s
freezing: every ``roberta.*`` parameter frozen unless its name contains ``lora``, every other
parameter (the new classifier) trainable; the pre-trained checkpoint loaded with
``strict=False`` (the LoRA matrices and the classifier are not in it); the Trainer's AdamW over
the trainable parameters (weight decay 0.1 except biases and LayerNorm weights), a linear
schedule with ``warmup_ratio 0.06``, an evaluation under ``eval()`` + ``no_grad`` each epoch;
``roberta_base_sst2.sh``'s lora_r 8, lora_alpha 16, lr 5e-4, batch 16.
Shrunk: "roberta-base" is a 2-layer, 32-wide, 4-head encoder (BERT's normal(0.02) init) pre-trained
in the program (AdamW lr 1e-3, 200 steps of 32) on a synthetic task A (``<s>`` then 16 filler tokens
with one of the marker tokens 1..4 planted at a random place; the label is which marker) and
fine-tuned on the related task B (the same, with the markers 5..8: the same form, other tokens to
attend to), 1,000 training and 500 held-out sequences, 5 epochs of batch 16 at lr 2e-3 instead of
SST-2 for 60 epochs at 5e-4 (a 2-layer model with rank-8 adapters needs the larger step to move in
315 steps); no dropout; single process.

Measure only: held-out accuracy on task B after fine-tuning.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first fine-tuning batch
with the criterion, the optimizer and the data splits, once the LoRA model is frozen and its
optimizer built; ``nndx.Monitor`` around the fine-tuning loop (the pre-training stands in for
downloading the checkpoint, which the author does not watch), each step's loss and accuracy
logged, each epoch's held-out loss/accuracy logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lora"
SOURCE = Source("microsoft/LoRA", "loralib/layers.py", "c4593f060e6a368d7bb5af5273b8e42810cdef90", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the NLU example as published (LoRA on query/value, new classifier trained)"),
        Variant(
            "classifier_frozen",
            "lora.mark_only_lora_as_trainable(model) applied to the whole model (the README's quickstart) instead "
            "of run_glue's freezing of roberta.* only: the newly initialised classification head stays frozen at "
            "its random init and only the adapters train",
            (C.FROZEN_PARAMETERS,),
            ("https://github.com/TNI-playground/Fed_HeLLo/issues/2", "https://github.com/4AI/LS-LLaMA/issues/3",
             "https://github.com/huggingface/peft/issues/1070", "https://github.com/huggingface/peft/pull/307"),
            Measure("test_accuracy", "held-out task-B accuracy at least 0.05 below the healthy run's: 0.77 against "
                    "1.00 healthy on seed 0 (held-out loss 1.33 against 0.04)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "lora_A_zero_init",
            "lora_A initialised with zeros like lora_B (the Embedding variant's zeros_ applied to A in Linear): "
            "B @ A stays 0 and both get zero gradients, so the adapters never move and only the head trains",
            (C.BAD_INIT, C.VANISHING_GRADIENTS),
            ("https://github.com/nvidia-cosmos/cosmos-predict2.5/pull/15", "https://github.com/Guitaricet/relora/issues/18",
             "https://github.com/NovaSky-AI/SkyRL/pull/852", "https://github.com/microsoft/LoRA/issues/98"),
            Measure("test_accuracy", "held-out task-B accuracy at least 0.05 below the healthy run's: 0.50 against "
                    "1.00 healthy on seed 0 (the head alone on the frozen encoder)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

ARGS = {"vocab": 20, "seq_len": 16, "hidden": 32, "layers": 2, "heads": 4, "intermediate": 64, "num_labels": 4,
        "pretrain_steps": 200, "pretrain_lr": 1e-3, "pretrain_batch": 32, "lora_r": 8, "lora_alpha": 16,
        "lr": 2e-3, "batch_size": 16, "epochs": 5, "warmup_ratio": 0.06, "weight_decay": 0.1,
        "n_train": 1000, "n_test": 500}  # fmt: skip
TASK_A, TASK_B = (1, 2, 3, 4), (5, 6, 7, 8)  # the marker tokens whose identity is the label


# --------------------------------------------------------------------------- loralib/layers.py, utils.py


class LoRALinear(nn.Linear):
    """``lora.Linear`` (fan_in_fan_out False, no LoRA dropout)."""

    def __init__(self, in_features: int, out_features: int, r: int = 0, lora_alpha: int = 1,
                 merge_weights: bool = True, zero_a: bool = False) -> None:  # fmt: skip
        self.r, self.lora_alpha, self.merge_weights, self.merged, self.zero_a = r, lora_alpha, merge_weights, False, zero_a
        super().__init__(in_features, out_features)
        if r > 0:
            self.lora_A = nn.Parameter(self.weight.new_zeros((r, in_features)))
            self.lora_B = nn.Parameter(self.weight.new_zeros((out_features, r)))
            self.scaling = lora_alpha / r
            self.weight.requires_grad = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.Linear.reset_parameters(self)
        if hasattr(self, "lora_A"):
            if self.zero_a:
                nn.init.zeros_(self.lora_A)
            else:
                nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def train(self, mode: bool = True) -> LoRALinear:
        nn.Linear.train(self, mode)
        if self.r > 0 and self.merge_weights:
            if mode and self.merged:
                self.weight.data -= (self.lora_B @ self.lora_A) * self.scaling
                self.merged = False
            elif not mode and not self.merged:
                self.weight.data += (self.lora_B @ self.lora_A) * self.scaling
                self.merged = True
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, bias=self.bias)
        if self.r > 0 and not self.merged:
            result = result + (x @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)) * self.scaling
        return result


def mark_only_lora_as_trainable(model: nn.Module) -> None:
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad = False


# --------------------------------------------------------------------------- modeling_roberta.py


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, r: int, alpha: int, zero_a: bool) -> None:
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        if r > 0:  # config.apply_lora
            self.query = LoRALinear(hidden, hidden, r, lora_alpha=alpha, zero_a=zero_a)
            self.value = LoRALinear(hidden, hidden, r, lora_alpha=alpha, zero_a=zero_a)
        else:
            self.query, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        split = lambda t: t.view(b, n, self.heads, self.head_size).permute(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size)
        ctx = scores.softmax(dim=-1) @ v
        return ctx.permute(0, 2, 1, 3).reshape(b, n, h)


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, r: int, alpha: int, zero_a: bool) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads, r, alpha, zero_a)
        self.attn_dense, self.attn_norm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.intermediate, self.output = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.out_norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(self.attn_dense(self.attention(x)) + x)
        return self.out_norm(self.output(F.gelu(self.intermediate(x))) + x)


class Roberta(nn.Module):
    def __init__(self, r: int = 0, alpha: int = 1, zero_a: bool = False) -> None:
        super().__init__()
        h = ARGS["hidden"]
        self.word_embeddings = nn.Embedding(ARGS["vocab"], h)
        self.position_embeddings = nn.Embedding(ARGS["seq_len"] + 1, h)
        self.emb_norm = nn.LayerNorm(h)
        self.layer = nn.ModuleList(Layer(h, ARGS["heads"], ARGS["intermediate"], r, alpha, zero_a)
                                   for _ in range(ARGS["layers"]))  # fmt: skip

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.size(1), device=ids.device)
        x = self.emb_norm(self.word_embeddings(ids) + self.position_embeddings(pos))
        for layer in self.layer:
            x = layer(x)
        return x


class ClassificationHead(nn.Module):
    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.dense, self.out_proj = nn.Linear(hidden, hidden), nn.Linear(hidden, num_labels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(features[:, 0])))  # the <s> token


class RobertaForSequenceClassification(nn.Module):
    def __init__(self, r: int = 0, alpha: int = 1, zero_a: bool = False) -> None:
        super().__init__()
        self.roberta = Roberta(r, alpha, zero_a)
        self.classifier = ClassificationHead(ARGS["hidden"], ARGS["num_labels"])
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:  # BERT's init: normal(0.02), the LoRA matrices left as loralib set them
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.roberta(ids))


# --------------------------------------------------------------------------- data and the checkpoint


def sequences(n: int, markers: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``<s>`` (id 0) then seq_len filler tokens (ids 9..vocab-1) with one of the four ``markers`` planted at a
    random position; the label: which marker."""
    body = torch.randint(9, ARGS["vocab"], (n, ARGS["seq_len"]), generator=generator)
    labels = torch.randint(0, len(markers), (n,), generator=generator)
    where = torch.randint(0, ARGS["seq_len"], (n,), generator=generator)
    body[torch.arange(n), where] = torch.tensor(markers)[labels]
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), body], dim=1)
    return ids, labels


def pretrained_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    """The stand-in for ``from_pretrained('roberta-base')``: a plain model trained on task A."""
    torch.manual_seed(1000 + seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    model = RobertaForSequenceClassification()
    opt = torch.optim.AdamW(model.parameters(), lr=ARGS["pretrain_lr"], weight_decay=0.01)
    for _ in range(ARGS["pretrain_steps"]):
        ids, labels = sequences(ARGS["pretrain_batch"], TASK_A, gen)
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v for k, v in model.state_dict().items() if k.startswith("roberta.")}  # the encoder only


# --------------------------------------------------------------------------- run_glue.py


def linear_warmup(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    checkpoint = pretrained_checkpoint(seed)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x_train, y_train = sequences(ARGS["n_train"], TASK_B, gen)
    x_test, y_test = sequences(ARGS["n_test"], TASK_B, gen)
    train_dl = DataLoader(TensorDataset(x_train, y_train), batch_size=ARGS["batch_size"], shuffle=True,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip

    model = RobertaForSequenceClassification(ARGS["lora_r"], ARGS["lora_alpha"], zero_a=variant == "lora_A_zero_init")
    missing, unexpected = model.load_state_dict(checkpoint, strict=False)
    assert not unexpected and all("lora_" in k or k.startswith("classifier.") for k in missing)
    if variant == "classifier_frozen":
        mark_only_lora_as_trainable(model)
    else:  # run_glue.py's trainable_params = ['lora']
        for name, param in model.named_parameters():
            param.requires_grad = "lora" in name if name.startswith("roberta") else True

    no_decay = ("bias", "norm.weight")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in trainable if not any(nd in n for nd in no_decay)],
               "weight_decay": ARGS["weight_decay"]},
              {"params": [p for n, p in trainable if any(nd in n for nd in no_decay)], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=ARGS["lr"], betas=(0.9, 0.999), eps=1e-8)
    total = ARGS["epochs"] * len(train_dl)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup(math.ceil(ARGS["warmup_ratio"] * total),
                                                                           total))  # fmt: skip
    criterion = nn.CrossEntropyLoss()

    splits = (x_train, y_train, x_test, y_test)
    first_batch = (x_train[: ARGS["batch_size"]], y_train[: ARGS["batch_size"]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    train_losses: list[float] = []
    for _epoch in range(ARGS["epochs"]):
        model.train()
        for ids, labels in train_dl:
            logits = model(ids)
            loss = mon.loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            mon.log(loss, accuracy=(logits.argmax(-1) == labels).float().mean())
            train_losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            val_loss = criterion(logits, y_test).item()
            val_acc = (logits.argmax(-1) == y_test).float().mean().item()
        mon.log(val_loss, split="val", accuracy=val_acc)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    model.eval()
    with torch.no_grad():
        logits = model(x_test)
        test_acc = (logits.argmax(-1) == y_test).float().mean().item()
        test_loss = F.cross_entropy(logits, y_test).item()
    return {"test_accuracy": test_acc, "test_loss": test_loss, "final_train_loss": sum(train_losses[-25:]) / 25}
