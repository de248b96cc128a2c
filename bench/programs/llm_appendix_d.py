"""Port of "LLMs from scratch", appendix D: the chapter-4 GPT pretrained with the appendix's
``train_model`` (linear warmup, cosine decay, gradient clipping) and AdamW.

Source: github.com/rasbt/LLMs-from-scratch, ``appendix-D/01_main-chapter-code/appendix-D.ipynb``
and its ``previous_chapters.py`` (GPTModel, ``create_dataloader_v1``, ``calc_loss_batch``,
``calc_loss_loader``, ``evaluate_model``, ``generate_and_print_sample``) at commit
28c65cdfbc3338e2e040016eea4b7fdf556e4d57 (Apache-2.0, Copyright (c) Sebastian Raschka). Written
anew from the facts of those files; no code copied. The model, the loaders and the chapter-5
helpers are those of the port ``llm_from_scratch_gpt`` (the same chapter-4 GPT), imported.

Kept: ``torch.manual_seed(123)`` before the loaders and the model; a 90/10 split of the text;
``create_dataloader_v1`` windows of ``context_length`` with stride = context length, a shuffled
train loader with ``drop_last`` and an unshuffled val loader; ``GPTModel(cfg)`` (dropout 0.1, no
qkv bias); ``total_steps = len(train_loader) * n_epochs``, ``warmup_steps = int(0.2 *
total_steps)``; ``optimizer = AdamW(model.parameters(), lr=peak_lr, weight_decay=0.1)``;
``train_model(..., n_epochs=15, eval_freq=5, eval_iter=1, warmup_steps=warmup_steps,
initial_lr=1e-5, min_lr=1e-5)``: ``peak_lr`` read back from ``optimizer.param_groups[0]["lr"]``,
``total_training_steps = len(train_loader) * n_epochs``, ``lr_increment = (peak_lr - initial_lr) /
warmup_steps``, per batch ``zero_grad``, ``global_step += 1``, the linear warmup below
``warmup_steps`` and the cosine ``min_lr + (peak_lr - min_lr) * 0.5 * (1 + cos(pi * progress))``
after it, the lr written into every param group and tracked, ``calc_loss_batch``, ``backward``,
``clip_grad_norm_(max_norm=1.0)`` from ``global_step >= warmup_steps`` on (the notebook's
corrected condition), ``step``, ``tokens_seen``, ``evaluate_model`` every ``eval_freq`` steps
(``model.eval()``, no grad, ``eval_iter`` batches of each loader, ``model.train()``),
``generate_and_print_sample`` after each epoch.
Shrunk: a ~10 KB generated text (``data.char_text``, 1,000 words) tokenised by characters
instead of "The Verdict" through tiktoken's GPT-2 BPE (no download); 2 layers, 2 heads, emb_dim
64, context 32 instead of 12/12/768/256; batch 4 instead of 2 (the windows are 8x shorter); 10
epochs instead of 15; peak_lr 5e-3 instead of 1e-3 (the same 5x the chapter-5 port applies to
its 4e-4: the 124M model's rate barely moves a 64-dim model in a few hundred steps).
Measure only (not in the program): the full val loss at the end (and the lr of the last step).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first train batch with
``calc_loss_batch``'s loss as ``loss_fn(logits, targets)`` and the optimizer;
``nndx.Monitor(model, optimizer)`` around ``train_model``, each batch's loss logged,
``evaluate_model``'s val loss logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)``
and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.llm_from_scratch_gpt import GPTModel, calc_loss_batch, calc_loss_loader, generate_text_simple
from bench.programs.llm_from_scratch_gpt import loader as make_loader
from bench.programs.llm_from_scratch_gpt import windows
from nndx.report import CauseCode as C

NAME = "llm_appendix_d"
SOURCE = Source("rasbt/LLMs-from-scratch", "appendix-D/01_main-chapter-code/appendix-D.ipynb",
                "28c65cdfbc3338e2e040016eea4b7fdf556e4d57", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: char-level synthetic text, 2x2x64 GPT, 10 epochs)"),
        Variant(
            "adamw_lr_omitted",
            "optimizer = AdamW(model.parameters(), weight_decay=0.1) without lr=peak_lr (as the printed book has "
            "it): train_model reads peak_lr back from the optimizer and gets AdamW's default 1e-3, so warmup and "
            "cosine run up to a peak 5x below the one chosen",
            (C.LR_TOO_LOW,),
            ("https://github.com/rasbt/LLMs-from-scratch/pull/427",),
            Measure("val_loss", "full val loss at the end, 1.1x the healthy run's or more: 1.769 against 0.993 "
                    "on seed 0",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
        Variant(
            "cosine_over_one_epoch",
            "total_training_steps = len(train_loader) (the * n_epochs dropped): the cosine's progress runs "
            "past its half cycle many times, so after warmup the lr swings between peak and min every few "
            "dozen steps instead of decaying once over the run",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/sthalles/SimCLR/issues/8", "https://github.com/ivadomed/ivadomed/issues/57",
             "https://github.com/skorch-dev/skorch/issues/610"),
            Measure("val_loss", "full val loss at the end, 1.1x the healthy run's or more: 1.170 against 0.993 "
                    "on seed 0 (the last step's lr 5e-3 against 1e-5)",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
    )
}

GPT_CONFIG = {"vocab_size": 0, "context_length": 32, "emb_dim": 64, "n_heads": 2, "n_layers": 2, "drop_rate": 0.1,
              "qkv_bias": False}  # fmt: skip
SETTINGS = {"peak_lr": 5e-3, "n_epochs": 10, "batch_size": 4, "weight_decay": 0.1, "initial_lr": 1e-5,
            "min_lr": 1e-5, "eval_freq": 5, "eval_iter": 1}  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    text = data.char_text(1000, seed=seed)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    cfg = dict(GPT_CONFIG, vocab_size=len(chars))
    split_idx = int(0.90 * len(text))
    ids_train, ids_val = [stoi[c] for c in text[:split_idx]], [stoi[c] for c in text[split_idx:]]
    ctx = cfg["context_length"]
    torch.manual_seed(123 + seed)
    train_x, train_y = windows(ids_train, ctx, ctx)
    val_x, val_y = windows(ids_val, ctx, ctx)
    generator = torch.Generator().manual_seed(seed)
    train_loader = make_loader(train_x, train_y, SETTINGS["batch_size"], shuffle=True, drop_last=True,
                               generator=generator)  # fmt: skip
    val_loader = make_loader(val_x, val_y, SETTINGS["batch_size"], shuffle=False, drop_last=False)

    n_epochs = SETTINGS["n_epochs"]
    total_steps = len(train_loader) * n_epochs
    warmup_steps = int(0.2 * total_steps)  # 20% warmup

    torch.manual_seed(123 + seed)
    model = GPTModel(cfg)
    peak_lr = SETTINGS["peak_lr"]
    if variant == "adamw_lr_omitted":
        optimizer = torch.optim.AdamW(model.parameters(), weight_decay=SETTINGS["weight_decay"])
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=SETTINGS["weight_decay"])

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def evaluate_model(eval_iter: int) -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            train_loss = calc_loss_loader(train_loader, model, num_batches=eval_iter)
            val_loss = calc_loss_loader(val_loader, model, num_batches=eval_iter)
        model.train()
        return train_loss, val_loss

    def generate_and_print_sample(start_context: str = "ba") -> str:
        model.eval()
        encoded = torch.tensor([[stoi[c] for c in start_context if c in stoi]])
        with torch.no_grad():
            out = generate_text_simple(model, encoded, max_new_tokens=20, context_size=model.pos_emb.weight.shape[0])
        model.train()
        return "".join(chars[i] for i in out[0].tolist())

    first_batch = next(iter(make_loader(train_x, train_y, SETTINGS["batch_size"], shuffle=False, drop_last=True)))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def train_model(n_epochs: int, eval_freq: int, eval_iter: int, warmup_steps: int, initial_lr: float = 3e-05,
                    min_lr: float = 1e-6):  # fmt: skip
        train_losses, val_losses, track_tokens_seen, track_lrs = [], [], [], []
        tokens_seen, global_step = 0, -1
        peak_lr = optimizer.param_groups[0]["lr"]
        if variant == "cosine_over_one_epoch":
            total_training_steps = len(train_loader)
        else:
            total_training_steps = len(train_loader) * n_epochs
        lr_increment = (peak_lr - initial_lr) / warmup_steps

        for _epoch in range(n_epochs):
            model.train()
            for input_batch, target_batch in train_loader:
                optimizer.zero_grad()
                global_step += 1
                if global_step < warmup_steps:
                    lr = initial_lr + global_step * lr_increment
                else:
                    progress = (global_step - warmup_steps) / (total_training_steps - warmup_steps)
                    lr = min_lr + (peak_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr
                track_lrs.append(lr)

                loss = calc_loss_batch(input_batch, target_batch, model)
                loss.backward()
                if global_step >= warmup_steps:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                tokens_seen += input_batch.numel()
                nx.timed(lambda: mon.log(loss))

                if global_step % eval_freq == 0:
                    train_loss, val_loss = evaluate_model(eval_iter)
                    train_losses.append(train_loss)
                    val_losses.append(val_loss)
                    track_tokens_seen.append(tokens_seen)
                    nx.timed(lambda: mon.log(val_loss, split="val"))
            generate_and_print_sample()
        return train_losses, val_losses, track_tokens_seen, track_lrs

    train_losses, val_losses, _tokens, lrs = train_model(
        n_epochs, SETTINGS["eval_freq"], SETTINGS["eval_iter"], warmup_steps,
        initial_lr=SETTINGS["initial_lr"], min_lr=SETTINGS["min_lr"],
    )  # fmt: skip

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)
    model.eval()
    with torch.no_grad():
        full_val = calc_loss_loader(val_loader, model)
        full_train = calc_loss_loader(train_loader, model)
    return {"val_loss": full_val, "train_loss": full_train, "last_lr": lrs[-1], "max_lr": max(lrs),
            "last_logged_val_loss": val_losses[-1]}  # fmt: skip
