"""Port of Hugging Face's ``run_clm_no_trainer.py`` (a causal language model trained with a
plain loop: the corpus tokenised, concatenated and cut into ``block_size`` chunks whose
``labels`` are a copy of their ``input_ids``; ``outputs = model(**batch)``, ``outputs.loss``;
perplexity on the validation split after each epoch).

Source: github.com/huggingface/transformers,
``examples/pytorch/language-modeling/run_clm_no_trainer.py`` at commit
00661e38a9e1393472adae9ac71f777b74ccdcde (Apache-2.0, Copyright 2021 The HuggingFace Inc.
team). Written anew from the facts of that file; no code copied.

Kept: ``AutoModelForCausalLM.from_config`` (here ``GPT2LMHeadModel(GPT2Config(...))``, the
model shifting the labels itself) called as ``model(**batch)`` on dict batches of
``input_ids``, ``attention_mask`` and ``labels``; ``tokenize_function`` then
``group_texts`` (each column of the texts concatenated, the remainder that does not fill
a block dropped, cut into ``block_size`` chunks, ``labels`` = a copy of ``input_ids``),
applied to groups of 1,000 texts as ``datasets.map(batched=True)`` does;
``default_data_collator`` (stacking equal-length chunks); a shuffled train loader and an
unshuffled eval loader; ``AdamW`` over two parameter groups (no weight decay on names
containing ``bias`` or ``LayerNorm.weight``); ``num_update_steps_per_epoch =
ceil(len(train_dataloader) / gradient_accumulation_steps)``, ``max_train_steps =
num_train_epochs * num_update_steps_per_epoch``; ``get_scheduler(lr_scheduler_type="linear",
num_warmup_steps, max_train_steps)``; the loop: ``model.train()``, ``loss = loss /
gradient_accumulation_steps``, backward, and ``if step % gradient_accumulation_steps == 0 or
step == len(train_dataloader) - 1``: ``optimizer.step()``, ``lr_scheduler.step()``,
``optimizer.zero_grad()``, ``completed_steps += 1`` (the original's condition), ``break``
once ``completed_steps >= max_train_steps``; after each epoch ``model.eval()``, under
``torch.no_grad()`` each eval batch's ``outputs.loss`` repeated ``per_device_eval_batch_size``
times, the list cut to ``len(eval_dataset)``, ``perplexity = exp(mean)`` (``inf`` on
overflow).
Shrunk: no tokenizer, checkpoint or dataset download: a tiny ``GPT2Config`` (vocab 64,
``n_positions`` 32, ``n_embd`` 32, 2 layers, 2 heads) built locally with random init, on a
synthetic corpus already tokenised: 500 train and 60 validation "documents" of 20-60
word ids walked from a sparse first-order Markov chain (each word has three possible
successors with probabilities 0.65/0.25/0.10), each ended by an ``eos`` id (63);
``block_size`` 32 instead of 1024; ``per_device_train_batch_size`` 8 (the default),
``gradient_accumulation_steps`` 2, ``num_train_epochs`` 3 (the default),
``learning_rate`` 2e-3 instead of 5e-5 and ``weight_decay`` 0.01 instead of 0.0 (the model
starts from scratch), ``num_warmup_steps`` 10 instead of 0. ``accelerator.backward(loss)``
and ``accelerator.gather`` on one CPU process are ``loss.backward()`` and the identity; no
Accelerator, logging, tracking, hub or saving code.
Measure only (not in the program): the validation perplexity the program logs after the
last epoch, and the mean train loss of the last 30 micro-batches.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first effective batch
(2 x 8 = 16 train chunks, collated as one) with ``loss_fn=None`` (the model returns its own
loss), the optimizer, and ``data=(train input_ids, train labels, validation input_ids,
validation labels)`` for the data checks; ``nndx.Monitor(model, optimizer)`` around the
loop, each micro-batch's ``outputs.loss`` logged, the validation loss (whose exp is the
perplexity) logged as ``split="val"`` after each epoch; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "run_clm"
SOURCE = Source("huggingface/transformers", "examples/pytorch/language-modeling/run_clm_no_trainer.py",
                "00661e38a9e1393472adae9ac71f777b74ccdcde", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published"),
        Variant(
            "labels_shifted_twice",
            "group_texts shifts the labels itself (input_ids = chunk[:-1], labels = chunk[1:]) although GPT2LMHeadModel "
            "shifts them again inside: every position is trained (and evaluated) to predict the token after next",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/transformers/pull/44642",
             "https://github.com/huggingface/transformers/pull/562",
             "https://github.com/huggingface/transformers/pull/47395"),
            Measure("perplexity", "validation perplexity after the last epoch, 1.3x the healthy run's or more: "
                    "15.0 against 7.97 healthy on seed 0 (the t+2 task is harder to predict)",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "zero_grad_dropped",
            "optimizer.zero_grad() left out of the gradient-accumulation branch: every micro-batch's gradient is "
            "added to all the earlier ones, each optimizer.step() follows the running sum of the whole run",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/tenstorrent/tt-blacksmith/pull/711",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20"),
            Measure("perplexity", "validation perplexity after the last epoch, 1.3x the healthy run's or more: "
                    "12.4 against 7.97 healthy on seed 0",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

VOCAB = 64
EOS = VOCAB - 1
N_TRAIN_DOCS, N_EVAL_DOCS = 500, 60

block_size = 32
per_device_train_batch_size = 8
per_device_eval_batch_size = 8
learning_rate = 2e-3
weight_decay = 0.01
num_train_epochs = 3
gradient_accumulation_steps = 2
num_warmup_steps = 10


# --------------------------------------------------------------------------- the corpus (already tokenised)


def markov_chain(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each word's three successors and their probabilities: the structure a model can learn."""
    rng = np.random.default_rng(seed + 7)
    successors = np.stack([rng.choice(EOS, size=3, replace=False) for _ in range(EOS)])
    return successors, np.array([0.65, 0.25, 0.10])


def documents(n: int, seed: int, chain: tuple[np.ndarray, np.ndarray]) -> list[list[int]]:
    successors, probs = chain
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        word = int(rng.integers(0, EOS))
        doc = [word]
        for _ in range(int(rng.integers(20, 61)) - 1):
            word = int(successors[word][rng.choice(3, p=probs)])
            doc.append(word)
        docs.append(doc)
    return docs


def tokenize_function(texts: list[list[int]]) -> dict[str, list[list[int]]]:
    """The tokenizer's output for each text: its ids (ended by eos) and an all-ones mask."""
    ids = [t + [EOS] for t in texts]
    return {"input_ids": ids, "attention_mask": [[1] * len(t) for t in ids]}


def group_texts(examples: dict[str, list[list[int]]], shift_labels: bool = False) -> dict[str, list[list[int]]]:
    concatenated = {k: sum(examples[k], []) for k in examples}
    total_length = len(concatenated["input_ids"])
    if total_length >= block_size:
        total_length = (total_length // block_size) * block_size
    result = {k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}
    if shift_labels:  # the bug: "shift so that tokens < n predict n", done here and again in the model
        result["labels"] = [chunk[1:] for chunk in result["input_ids"]]
        result["input_ids"] = [chunk[:-1] for chunk in result["input_ids"]]
        result["attention_mask"] = [chunk[:-1] for chunk in result["attention_mask"]]
    else:
        result["labels"] = [list(chunk) for chunk in result["input_ids"]]
    return result


def map_batched(texts: list[list[int]], shift_labels: bool) -> list[dict[str, list[int]]]:
    """``raw_datasets.map(tokenize_function).map(group_texts, batched=True)``: groups of 1,000."""
    rows = []
    for i in range(0, len(texts), 1000):
        grouped = group_texts(tokenize_function(texts[i : i + 1000]), shift_labels)
        rows.extend({k: grouped[k][j] for k in grouped} for j in range(len(grouped["input_ids"])))
    return rows


def default_data_collator(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor([f[k] for f in features], dtype=torch.long) for k in features[0]}


def loader(dataset: list[dict[str, list[int]]], batch_size: int, rng: random.Random | None = None):
    order = list(range(len(dataset)))
    if rng is not None:
        rng.shuffle(order)
    return [default_data_collator([dataset[j] for j in order[i : i + batch_size]])
            for i in range(0, len(order), batch_size)]  # fmt: skip


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # set_seed(args.seed)
    chain = markov_chain(seed)
    shift = variant == "labels_shifted_twice"
    train_dataset = map_batched(documents(N_TRAIN_DOCS, seed, chain), shift)
    eval_dataset = map_batched(documents(N_EVAL_DOCS, seed + 1000, chain), shift)

    config = GPT2Config(vocab_size=VOCAB, n_positions=block_size, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=EOS, eos_token_id=EOS)  # fmt: skip
    model = GPT2LMHeadModel(config)  # AutoModelForCausalLM.from_config(config)

    loader_rng = random.Random(seed + 2)  # DataLoader(shuffle=True)'s sampler
    eval_dataloader = loader(eval_dataset, per_device_eval_batch_size)
    len_train_dataloader = math.ceil(len(train_dataset) / per_device_train_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=learning_rate)

    num_update_steps_per_epoch = math.ceil(len_train_dataloader / gradient_accumulation_steps)
    max_train_steps = num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name="linear", optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                                 num_training_steps=max_train_steps)  # fmt: skip

    def stacked(rows: list[dict[str, list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = default_data_collator(rows)
        return batch["input_ids"], batch["labels"]

    data_splits = (*stacked(train_dataset), *stacked(eval_dataset))
    first_batch = default_data_collator(train_dataset[: per_device_train_batch_size * gradient_accumulation_steps])
    nx.preflight(model, first_batch, None, optimizer=optimizer, data=data_splits)
    mon = nx.monitor(model, optimizer, every=10)

    completed_steps = 0
    train_losses: list[float] = []
    perplexity = eval_loss = float("nan")
    for epoch in range(num_train_epochs):
        model.train()
        train_dataloader = loader(train_dataset, per_device_train_batch_size, rng=loader_rng)
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            mon.log(loss)
            train_losses.append(loss.item())
            loss = loss / gradient_accumulation_steps
            loss.backward()  # accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                optimizer.step()
                lr_scheduler.step()
                if variant != "zero_grad_dropped":
                    optimizer.zero_grad()
                completed_steps += 1
            if completed_steps >= max_train_steps:
                break

        model.eval()
        losses = []
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(outputs.loss.reshape(1).repeat(per_device_eval_batch_size))  # accelerator.gather
        losses = torch.cat(losses)[: len(eval_dataset)]
        eval_loss = float(torch.mean(losses))
        try:
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        mon.log(eval_loss, split="val")

    nx.finish(mon, model, first_batch, None, optimizer=optimizer, data=data_splits)
    return {
        "perplexity": perplexity,
        "eval_loss": eval_loss,
        "final_train_loss": sum(train_losses[-30:]) / 30,
        "first_train_loss": sum(train_losses[:30]) / 30,
        "completed_steps": completed_steps,
    }
