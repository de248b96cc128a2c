"""Port of karpathy/minGPT: the GPT of ``mingpt/model.py`` trained by ``mingpt/trainer.py`` on the
``projects/adder`` task (add two 2-digit numbers, the sum's digits written backwards).

Source: github.com/karpathy/minGPT, ``mingpt/model.py``, ``mingpt/trainer.py`` and
``projects/adder/adder.py`` at commit 37baab71b9abea1b76ab957409a1cc2fbfba8a26 (MIT,
Copyright (c) Andrej Karpathy). Written anew from the facts of those files; no code copied.

Kept: ``NewGELU`` (the tanh approximation written out); ``CausalSelfAttention`` with one
``c_attn`` Linear to q, k, v, heads split by ``view`` + ``transpose``, scores scaled by
1/sqrt(head size), the causal mask a registered ``tril`` buffer named ``bias`` applied with
``masked_fill(... == 0, -inf)``, softmax, ``attn_dropout``, ``c_proj`` and ``resid_dropout``;
``Block``: pre-LayerNorm residual attention and an MLP held in an ``nn.ModuleDict`` (``c_fc``,
``c_proj``, ``act``, ``dropout``) and run through a ``mlpf`` lambda closed over that dict (as
in the original, a ``copy.deepcopy`` of a Block keeps calling the original's MLP);
``GPT``: ``wte``/``wpe`` embeddings, embedding dropout, the blocks, ``ln_f``, an unbiased
``lm_head`` (no weight tying), the ``gpt-nano`` configuration (3 layers, 3 heads, n_embd 48)
that adder.py selects, dropout 0.1 everywhere, ``_init_weights`` (N(0, 0.02) for Linear and
Embedding weights, zero biases, LayerNorm 1/0) and ``c_proj.weight`` re-drawn with std
0.02/sqrt(2 n_layer); ``forward(idx, targets)`` returning ``(logits, loss)`` with
``cross_entropy(..., ignore_index=-1)``; ``generate`` (greedy ``topk(1)`` when not sampling,
the context cropped to ``block_size``); ``configure_optimizers``: the decay / no_decay split
(biases and LayerNorm/Embedding weights not decayed, Linear weights decayed), the two
checks that every parameter is in exactly one set, ``AdamW`` over the two groups with the
trainer's ``learning_rate``, ``betas`` (0.9, 0.95) and ``weight_decay`` 0.1;
``Trainer.run``: a ``DataLoader`` over ``RandomSampler(replacement=True,
num_samples=1e10)``, per iteration forward, ``model.zero_grad(set_to_none=True)``,
``backward``, ``clip_grad_norm_(..., grad_norm_clip=1.0)``, ``optimizer.step()``, the
``on_batch_end`` callbacks, stop at ``max_iters``; ``AdditionDataset``: every a + b of
``ndigit`` = 2, a fixed permutation (seed 1337) of which min(20%, 500) are the test split,
``x`` = the digits of a, b and the reversed sum without the last, ``y`` = shifted by one
with the first ``2 * ndigit - 1`` targets set to -1; ``eval_split``: greedy generation of
``ndigit + 1`` digits after the first ``2 * ndigit``, reversed and decoded, compared with
a + b; the callback: a log line every 10 iterations (kept as a record instead of printed),
an evaluation of train and test whenever ``iter_num % 500 == 0`` (iteration 0 included) in
``model.eval()`` / ``torch.no_grad()`` keeping the best score (the checkpoint in memory
instead of ``torch.save``), then ``model.train()``; ``set_seed(3407)``.
Shrunk: 1,001 iterations (adder.py sets no ``max_iters``: it runs until stopped; the last
one is evaluated) with the learning rate 1e-3 instead of adder.py's 5e-4 (at 5e-4 the test
accuracy is 0.5 after 800 iterations, at 1e-3 0.87 after 1,000); the train split scored on
5 batches of 100 (ndigit 2 scores the whole train split); ``num_workers`` 0, no
``CfgNode`` / command-line overrides / logging setup, CPU only.
Measure only (not in the program): the last evaluation's test accuracy (the share of the
500 held-out sums ``eval_split`` gets right).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
given as ``((x, y), y)`` with the model's own loss (``lambda out, _: out[1]``) and an
optimizer built by ``model.configure_optimizers`` as the trainer will build it (the trainer
makes its own inside ``run``); an ``nndx.Monitor(model, trainer.optimizer)`` attached in the
first ``on_batch_end`` callback (the first moment the trainer's optimizer exists), every
iteration's ``trainer.loss`` logged, and each evaluation's test loss (the mean loss of
``model(x, y)`` over the test split, computed for the Monitor) logged as ``split="val"``
with the test accuracy; after ``trainer.run()`` returns, ``nndx.probe(..., monitor=mon)``
on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mingpt"
SOURCE = Source("karpathy/minGPT", "projects/adder/adder.py", "37baab71b9abea1b76ab957409a1cc2fbfba8a26", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (adder, gpt-nano, shrunk to 1,001 iterations at lr 1e-3)"),
        Variant(
            "causal_mask_not_applied",
            "att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf')) with its result not assigned (the "
            "out-of-place masked_fill is a no-op): every position attends to the tokens after it, so the next "
            "digit it must predict is in its input; greedy generation, which has no future tokens, fails",
            (C.DATA_LEAKAGE,),
            ("https://github.com/karpathy/minGPT/issues/75", "https://github.com/karpathy/nanoGPT/issues/331",
             "https://github.com/lucidrains/flamingo-pytorch/issues/10",
             "https://github.com/facebookresearch/ParlAI/pull/3068",
             "https://github.com/huggingface/transformers/issues/35162"),
            Measure("test_acc", "final test accuracy of the generated sums at least 0.3 below the healthy run's: "
                    "0.01 against 0.87 on seed 0, while the train and test losses fall to 0.0007",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "no_decay_group_dropped",
            "configure_optimizers passes only the decay group to AdamW (optim_groups[:1]): the biases, "
            "LayerNorm gains and both embedding tables (wte, wpe) are in no optimizer and keep their "
            "initial values",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/DocF/multispectral-object-detection/issues/77",
             "https://github.com/ACEsuit/mace/pull/1529",
             "https://github.com/namisan/mt-dnn/pull/37"),
            Measure("test_acc", "final test accuracy of the generated sums at least 0.1 below the healthy run's: "
                    "0.72/0.71 against 0.87/0.99 healthy on seeds 0-1",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

NDIGIT = 2
N_LAYER, N_HEAD, N_EMBD = 3, 3, 48  # gpt-nano
PDROP = 0.1
LEARNING_RATE, BETAS, WEIGHT_DECAY, GRAD_NORM_CLIP, BATCH_SIZE = 1e-3, (0.9, 0.95), 0.1, 1.0, 64
MAX_ITERS, EVAL_INTERVAL, TRAIN_EVAL_BATCHES = 1001, 500, 5


# --------------------------------------------------------------------------- mingpt/model.py


class NewGELU(nn.Module):
    """GELU, the tanh approximation (BERT / OpenAI GPT)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, block_size: int, variant: str) -> None:
        super().__init__()
        assert N_EMBD % N_HEAD == 0
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.attn_dropout = nn.Dropout(PDROP)
        self.resid_dropout = nn.Dropout(PDROP)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head, self.n_embd = N_HEAD, N_EMBD
        self.mask_applied = variant != "causal_mask_not_applied"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.mask_applied:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        else:  # the bug: the out-of-place masked_fill's result thrown away
            att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, block_size: int, variant: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention(block_size, variant)
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(N_EMBD, 4 * N_EMBD),
            c_proj=nn.Linear(4 * N_EMBD, N_EMBD),
            act=NewGELU(),
            dropout=nn.Dropout(PDROP),
        ))  # fmt: skip
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # the MLP's forward, as in the original

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, variant: str) -> None:
        super().__init__()
        self.block_size = block_size
        self.variant = variant
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, N_EMBD),
            wpe=nn.Embedding(block_size, N_EMBD),
            drop=nn.Dropout(PDROP),
            h=nn.ModuleList([Block(block_size, variant) for _ in range(N_LAYER)]),
            ln_f=nn.LayerNorm(N_EMBD),
        ))  # fmt: skip
        self.lm_head = nn.Linear(N_EMBD, vocab_size, bias=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)

    def configure_optimizers(self, learning_rate: float, betas: tuple[float, float], weight_decay: float):
        decay, no_decay = set(), set()
        whitelist_weight_modules = (torch.nn.Linear,)
        blacklist_weight_modules = (torch.nn.LayerNorm, torch.nn.Embedding)
        for mn, m in self.named_modules():
            for pn, _p in m.named_parameters():
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("bias"):
                    no_decay.add(fpn)
                elif pn.endswith("weight") and isinstance(m, whitelist_weight_modules):
                    decay.add(fpn)
                elif pn.endswith("weight") and isinstance(m, blacklist_weight_modules):
                    no_decay.add(fpn)
        param_dict = dict(self.named_parameters())
        inter_params, union_params = decay & no_decay, decay | no_decay
        assert len(inter_params) == 0, f"parameters {inter_params} made it into both decay/no_decay sets"
        assert len(param_dict.keys() - union_params) == 0, \
            f"parameters {param_dict.keys() - union_params} were not separated into either decay/no_decay set"
        optim_groups = [
            {"params": [param_dict[pn] for pn in sorted(decay)], "weight_decay": weight_decay},
            {"params": [param_dict[pn] for pn in sorted(no_decay)], "weight_decay": 0.0},
        ]
        if self.variant == "no_decay_group_dropped":
            optim_groups = optim_groups[:1]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, do_sample: bool = False,
                 top_k: int | None = None) -> torch.Tensor:  # fmt: skip
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size :]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, top_k)
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            if do_sample:
                idx_next = torch.multinomial(probs, num_samples=1)
            else:
                _, idx_next = torch.topk(probs, k=1, dim=-1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


# --------------------------------------------------------------------------- mingpt/trainer.py


class Trainer:
    def __init__(self, model: GPT, train_dataset: Dataset, max_iters: int, generator: torch.Generator) -> None:
        self.model, self.train_dataset, self.max_iters, self.generator = model, train_dataset, max_iters, generator
        self.optimizer = None
        self.callbacks: dict[str, list] = {}
        self.iter_num = 0
        self.loss: torch.Tensor | None = None

    def set_callback(self, onevent: str, callback) -> None:
        self.callbacks[onevent] = [callback]

    def trigger_callbacks(self, onevent: str) -> None:
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self) -> None:
        model = self.model
        self.optimizer = model.configure_optimizers(LEARNING_RATE, BETAS, WEIGHT_DECAY)
        train_loader = DataLoader(
            self.train_dataset,
            sampler=RandomSampler(self.train_dataset, replacement=True, num_samples=int(1e10), generator=self.generator),
            shuffle=False, batch_size=BATCH_SIZE, num_workers=0,
        )  # fmt: skip
        model.train()
        self.iter_num = 0
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            x, y = batch
            logits, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_NORM_CLIP)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            if self.max_iters is not None and self.iter_num >= self.max_iters:
                break


# --------------------------------------------------------------------------- projects/adder/adder.py


class AdditionDataset(Dataset):
    def __init__(self, ndigit: int, split: str) -> None:
        self.ndigit, self.split = ndigit, split
        num = (10**ndigit) ** 2
        rng = torch.Generator()
        rng.manual_seed(1337)
        perm = torch.randperm(num, generator=rng)
        num_test = min(int(num * 0.2), 500)
        self.ixes = perm[:num_test] if split == "test" else perm[num_test:]

    def get_vocab_size(self) -> int:
        return 10

    def get_block_size(self) -> int:
        return 3 * self.ndigit + 1 - 1

    def __len__(self) -> int:
        return self.ixes.nelement()

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        ndigit = self.ndigit
        idx = self.ixes[idx].item()
        nd = 10**ndigit
        a, b = idx // nd, idx % nd
        c = a + b
        render = f"%0{ndigit}d" % a + f"%0{ndigit}d" % b + (f"%0{ndigit + 1}d" % c)[::-1]
        dix = [int(s) for s in render]
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        y[: ndigit * 2 - 1] = -1  # train on the output positions only
        return x, y


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(3407 + seed)  # set_seed(config.system.seed)
    train_dataset = AdditionDataset(NDIGIT, "train")
    test_dataset = AdditionDataset(NDIGIT, "test")
    model = GPT(train_dataset.get_vocab_size(), train_dataset.get_block_size(), variant)
    trainer = Trainer(model, train_dataset, MAX_ITERS, torch.Generator().manual_seed(seed))

    def eval_split(split: str, max_batches: int | None = None) -> tuple[float, int]:
        dataset = {"train": train_dataset, "test": test_dataset}[split]
        ndigit = NDIGIT
        results: list[int] = []
        factors = torch.tensor([[10**i for i in range(ndigit + 1)][::-1]])
        loader = DataLoader(dataset, batch_size=100, num_workers=0, drop_last=False)
        for b, (x, _y) in enumerate(loader):
            d1d2 = x[:, : ndigit * 2]
            d1d2d3 = model.generate(d1d2, ndigit + 1, do_sample=False)
            d3 = d1d2d3[:, -(ndigit + 1) :].flip(1)
            d1i = (d1d2[:, :ndigit] * factors[:, 1:]).sum(1)
            d2i = (d1d2[:, ndigit : ndigit * 2] * factors[:, 1:]).sum(1)
            d3i_pred = (d3 * factors).sum(1)
            correct = d3i_pred == d1i + d2i
            results.extend(int(c) for c in correct)
            if max_batches is not None and b + 1 >= max_batches:
                break
        rt = torch.tensor(results, dtype=torch.float)
        return float(rt.sum()), len(results)

    def test_loss() -> float:
        """For the Monitor: the mean loss of model(x, y) over the test split."""
        loader = DataLoader(test_dataset, batch_size=100, num_workers=0)
        losses = [model(x, y)[1].item() for x, y in loader]
        return sum(losses) / len(losses)

    first_batch = next(iter(DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=False)))
    probe_batch = ((first_batch[0], first_batch[1]), first_batch[1])

    def own_loss(output, _targets):
        return output[1]

    nx.preflight(model, probe_batch, own_loss, optimizer=model.configure_optimizers(LEARNING_RATE, BETAS, WEIGHT_DECAY))

    state: dict = {"mon": None, "top_score": 0.0, "best": None, "log": [], "test_acc": float("nan"),
                   "train_acc": float("nan"), "test_loss": float("nan")}  # fmt: skip

    def batch_end_callback(trainer: Trainer) -> None:
        if state["mon"] is None:  # the trainer's optimizer exists from the first step on
            state["mon"] = nx.monitor(model, trainer.optimizer, every=10)
        nx.timed(lambda: state["mon"].log(trainer.loss))
        if trainer.iter_num % 10 == 0:
            state["log"].append(f"iter {trainer.iter_num}: train loss {trainer.loss.item():.5f}")
        if trainer.iter_num % EVAL_INTERVAL == 0:
            model.eval()
            with torch.no_grad():
                train_score, n_train = eval_split("train", max_batches=TRAIN_EVAL_BATCHES)
                test_score, n_test = eval_split("test", max_batches=None)
                state["test_loss"] = test_loss()
            state["train_acc"], state["test_acc"] = train_score / n_train, test_score / n_test
            nx.timed(lambda: state["mon"].log(state["test_loss"], split="val", accuracy=state["test_acc"]))
            score = train_score + test_score
            if score > state["top_score"]:
                state["top_score"] = score
                state["best"] = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), ckpt_path)
            model.train()

    trainer.set_callback("on_batch_end", batch_end_callback)
    trainer.run()

    if state["mon"] is not None:
        nx.finish(state["mon"], model, probe_batch, own_loss, optimizer=trainer.optimizer)
    return {
        "test_acc": state["test_acc"],
        "train_acc": state["train_acc"],
        "test_loss": state["test_loss"],
        "final_train_loss": float(trainer.loss.item()),
    }
