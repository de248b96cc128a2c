"""Port of Hugging Face's ``run_glue_no_trainer.py`` (a sequence classifier fine-tuned with
a plain loop: ``outputs = model(**batch)``, ``loss = outputs.loss``).

Source: github.com/huggingface/transformers,
``examples/pytorch/text-classification/run_glue_no_trainer.py`` at commit
a22a4378d97d06b7a1d9abad6e0086d30fdea199 (Apache-2.0, Copyright 2021 The HuggingFace Inc.
team). Written anew from the facts of that file; no code copied.

Kept: ``AutoModelForSequenceClassification`` (here ``BertForSequenceClassification``) called
as ``model(**batch)`` on dict batches of ``input_ids``, ``attention_mask`` and ``labels``,
the loss taken from ``outputs.loss``; the label column renamed ``labels``; dynamic padding
of each batch to its longest sequence (``DataCollatorWithPadding``); a shuffled train
loader and an unshuffled eval loader; ``torch.optim.AdamW`` over two parameter groups
(no weight decay on ``bias`` and ``LayerNorm.weight``; ``weight_decay`` 0.0, the default);
``num_update_steps_per_epoch = ceil(len(train_dataloader) / gradient_accumulation_steps)``,
``max_train_steps = num_train_epochs * num_update_steps_per_epoch``;
``get_scheduler("linear", num_warmup_steps=0, num_training_steps=max_train_steps)``;
the loop: ``model.train()``, ``loss = loss / gradient_accumulation_steps``, backward, and
``if step % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1``:
``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``,
``completed_steps += 1`` (the original's condition, which also steps after the first
micro-batch), ``break`` once ``completed_steps >= max_train_steps``; after each epoch
``model.eval()`` and, under ``torch.no_grad()``, ``outputs.logits.argmax(dim=-1)``
against ``batch["labels"]`` for the accuracy metric.
Shrunk: no checkpoint, tokenizer or dataset download: a tiny ``BertConfig`` (vocab 60,
hidden 32, 2 layers, 2 heads, intermediate 64) with random init, on a synthetic SST-2-like
task (each "sentence" is 4-24 word ids drawn from a filler vocabulary plus 0-3 "positive"
and 0-3 "negative" words, never as many of each; label 1 when the positive ones
outnumber the negative), already tokenised as ``[CLS] words [SEP]``; 2,000 train and 400
validation sentences; batch 8 (the default) with gradient_accumulation_steps 4; 3 epochs
(the default); learning_rate 1e-3 instead of 5e-5 (the model starts from random weights,
not a pretrained checkpoint). ``accelerator.backward(loss)`` on one CPU process is
``loss.backward()``; no Accelerator, tracking, checkpointing or hub code.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first effective batch (4 x 8 = 32 train
sentences, collated as one) with
``loss_fn=None`` (the model returns its own loss), the optimizer, and
``data=(train ids, train labels, validation ids, validation labels)`` (each split padded to
its longest sentence) for the data checks; ``nndx.Monitor(model, optimizer)`` around the
loop, each micro-batch's ``outputs.loss`` logged, the validation loss and accuracy logged
as ``split="val"`` after each epoch; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "glue_no_trainer"
SOURCE = Source("huggingface/transformers", "examples/pytorch/text-classification/run_glue_no_trainer.py",
                "a22a4378d97d06b7a1d9abad6e0086d30fdea199", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published"),
        Variant(
            "scheduler_stepped_per_micro_batch",
            "lr_scheduler.step() moved out of the gradient-accumulation branch (called for every micro-batch): "
            "the linear schedule sized in optimizer steps reaches 0 after a quarter of training (k = 4)",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/huggingface/accelerate/issues/963",
             "https://github.com/starVLA/starVLA/pull/210",
             "https://github.com/h2oai/h2o-llmstudio/issues/663"),
            Measure("final_train_loss", "mean train loss of the last 50 micro-batches, 1.5x the healthy run's or more: "
                    "0.692/0.692/0.692 (ln 2: nothing learnt) buggy against 0.047/0.038/0.022 healthy on seeds 0-2; "
                    "validation accuracy 0.49/0.54/0.48 against 1.0/1.0/1.0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "labels_shuffled_apart",
            "the training sentences shuffled on their own (random.shuffle(sentences)) before the label column is "
            "attached: every train label belongs to another sentence (the validation split is intact)",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/Borda/kaggle_image-classify/pull/12",
             "https://github.com/udacity/sdc-issue-reports/issues/1326"),
            Measure("eval_accuracy", "validation accuracy after the last epoch, 0.25 below the healthy run's or more: "
                    "0.49/0.54/0.52 (chance) buggy against 1.0/1.0/1.0 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy <= healthy - 0.25),
        ),
    )
}

PAD, CLS, SEP = 0, 1, 2
VOCAB = 60
POSITIVE = (3, 4, 5, 6, 7)
NEGATIVE = (8, 9, 10, 11, 12)
FILLER = tuple(range(13, VOCAB))
N_TRAIN, N_EVAL = 2000, 400

per_device_train_batch_size = 8
per_device_eval_batch_size = 8
learning_rate = 1e-3
weight_decay = 0.0
num_train_epochs = 3
gradient_accumulation_steps = 4
num_warmup_steps = 0


# --------------------------------------------------------------------------- data


def sentences(n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """SST-2's stand-in: word ids (no [CLS]/[SEP]) and 0/1 labels, positive when the
    positive words outnumber the negative ones."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    while len(texts) < n:
        pos, neg = int(rng.integers(0, 4)), int(rng.integers(0, 4))
        if pos == neg:
            continue
        words = list(rng.choice(FILLER, size=int(rng.integers(4, 21))))
        words += list(rng.choice(POSITIVE, size=pos)) + list(rng.choice(NEGATIVE, size=neg))
        rng.shuffle(words)
        texts.append([int(w) for w in words])
        labels.append(int(pos > neg))
    return texts, labels


def tokenize(words: list[int]) -> dict[str, list[int]]:
    ids = [CLS, *words, SEP]
    return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def collate(features: list[dict[str, object]]) -> dict[str, torch.Tensor]:
    """``DataCollatorWithPadding``: pad to the longest sequence of the batch."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(features), longest), dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["attention_mask"])] = torch.tensor(f["attention_mask"])
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


def batches(dataset: list[dict[str, object]], batch_size: int, shuffle: bool, rng: random.Random | None = None):
    order = list(range(len(dataset)))
    if shuffle:
        rng.shuffle(order)
    return [collate([dataset[j] for j in order[i : i + batch_size]]) for i in range(0, len(order), batch_size)]


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import BertConfig, BertForSequenceClassification, get_scheduler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    random.seed(seed)
    torch.manual_seed(seed)  # set_seed(args.seed)
    train_texts, train_labels = sentences(N_TRAIN, seed)
    eval_texts, eval_labels = sentences(N_EVAL, seed + 1000)
    if variant == "labels_shuffled_apart":
        random.Random(seed + 1).shuffle(train_texts)  # the labels stay in the old order

    def preprocess(texts: list[list[int]], labels: list[int]) -> list[dict[str, object]]:
        rows = []
        for words, label in zip(texts, labels):
            row = tokenize(words)
            row["labels"] = label  # "rename the column to labels because the model will expect that"
            rows.append(row)
        return rows

    train_dataset = preprocess(train_texts, train_labels)
    eval_dataset = preprocess(eval_texts, eval_labels)

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, pad_token_id=PAD)  # fmt: skip
    model = BertForSequenceClassification(config)

    loader_rng = random.Random(seed + 2)  # DataLoader(shuffle=True)'s sampler
    eval_dataloader = batches(eval_dataset, per_device_eval_batch_size, shuffle=False)
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

    def padded(rows: list[dict[str, object]]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = collate(rows)
        return batch["input_ids"], batch["labels"]

    data_splits = (*padded(train_dataset), *padded(eval_dataset))
    first_batch = collate(train_dataset[:per_device_train_batch_size * 4])
    nx.preflight(model, first_batch, None, optimizer=optimizer, data=data_splits)
    mon = nx.monitor(model, optimizer, every=10)

    completed_steps = 0
    train_losses: list[float] = []
    lrs: list[float] = []
    eval_accuracy = eval_loss = float("nan")
    for epoch in range(num_train_epochs):
        model.train()
        train_dataloader = batches(train_dataset, per_device_train_batch_size, shuffle=True, rng=loader_rng)
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            mon.log(loss)
            train_losses.append(loss.item())
            loss = loss / gradient_accumulation_steps
            loss.backward()  # accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                optimizer.step()
                if variant != "scheduler_stepped_per_micro_batch":
                    lr_scheduler.step()
                optimizer.zero_grad()
                completed_steps += 1
                lrs.append(optimizer.param_groups[0]["lr"])
            if variant == "scheduler_stepped_per_micro_batch":
                lr_scheduler.step()
            if completed_steps >= max_train_steps:
                break

        model.eval()
        correct = total = 0
        loss_sum = 0.0
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            correct += int((predictions == batch["labels"]).sum())
            total += len(predictions)
            loss_sum += float(outputs.loss) * len(predictions)
        eval_accuracy, eval_loss = correct / total, loss_sum / total
        mon.log(eval_loss, split="val", accuracy=eval_accuracy)

    nx.finish(mon, model, first_batch, None, optimizer=optimizer, data=data_splits)
    return {
        "final_train_loss": sum(train_losses[-50:]) / 50,
        "first_train_loss": sum(train_losses[:50]) / 50,
        "eval_accuracy": eval_accuracy,
        "eval_loss": eval_loss,
        "final_lr": lrs[-1],
        "completed_steps": completed_steps,
    }
