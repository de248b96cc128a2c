"""Port of Hugging Face Accelerate's gradient-accumulation example: a BERT sequence-pair
classifier (GLUE MRPC) fine-tuned with ``Accelerator(gradient_accumulation_steps=...)``,
``accelerator.accumulate(model)``, ``accelerator.backward(loss)``, AdamW and a linear
schedule with warmup.

Source: github.com/huggingface/accelerate, ``examples/by_feature/gradient_accumulation.py``
at commit 16cb6eb80dd9aa8b4df1a63ef57863e455d53b83 (Apache-2.0, Copyright 2021 The
HuggingFace Inc. team). Written anew from the facts of that file; no code copied. The real
``accelerate`` library (1.16) runs it, on one CPU process.

Kept: ``Accelerator(cpu=..., mixed_precision=None, gradient_accumulation_steps=k)``;
``set_seed(seed)``; sentence pairs tokenised as ``tokenizer(sentence1, sentence2)``
(``[CLS] s1 [SEP] s2 [SEP]`` with ``token_type_ids`` 0/1 and an ``attention_mask``), the
``label`` column renamed ``labels``; the collate function padding each batch to its longest
pair (``padding="longest"``, no ``pad_to_multiple_of`` without mixed precision); a shuffled
train ``DataLoader`` of ``batch_size`` 16 and an unshuffled eval loader of
``EVAL_BATCH_SIZE`` 32; ``AutoModelForSequenceClassification`` (here
``BertForSequenceClassification``, ``return_dict=True``) called as ``model(**batch)``, the
loss taken from ``output.loss`` (the model computes its own cross entropy);
``AdamW(params=model.parameters(), lr=lr)``;
``get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps=
len(train_dataloader) * num_epochs)``; ``accelerator.prepare(model, optimizer,
train_dataloader, eval_dataloader, lr_scheduler)``; per epoch ``model.train()``, then per
batch ``with accelerator.accumulate(model):`` ``output = model(**batch)``, ``loss =
output.loss``, ``accelerator.backward(loss)``, ``optimizer.step()``,
``lr_scheduler.step()``, ``optimizer.zero_grad()`` (the prepared optimizer and scheduler
skip the non-sync micro-batches, ``backward`` divides the loss by k, as the library does);
then ``model.eval()``, ``torch.no_grad()``, ``outputs.logits.argmax(dim=-1)``,
``accelerator.gather_for_metrics((predictions, batch["labels"]))`` and the MRPC metric
(accuracy and F1; not printed here); ``accelerator.end_training()``; ``num_epochs`` 3.
``batch.to(accelerator.device)`` is left out: the batches are plain dicts, which the
prepared loader already puts on the (CPU) device.
Shrunk: no checkpoint, tokenizer, dataset or metric download: a tiny ``BertConfig`` (vocab
49, hidden 32, 2 layers, 2 heads, intermediate 64, two token types) with random init, on a
synthetic MRPC-like pair task (each sentence 4-8 filler words plus 0-3 "key" words; label 1
when the first sentence holds more key words than the second, never equal; about two
thirds positive, as MRPC's 68%); 2,000 train and 400 validation pairs instead of 3,668 and
408; ``gradient_accumulation_steps`` 4 (the script's flag, default 1); lr 3e-3 instead of
2e-5 (the model starts from random weights, not ``bert-base-cased``);
``num_warmup_steps`` 54 instead of 100 (the same share of the run's
``len(train_dataloader) * num_epochs``: 100/690 of 375). The accuracy and F1 are computed
by hand (``evaluate`` is not installed). Because the benchmark calls the script twice in one
process, the Accelerator's process-wide singletons (``AcceleratorState``,
``GradientState``) are reset at the start of each run, as a fresh process would have them.

nndx, as the author would add it: after ``accelerator.prepare``, a preflight
``nndx.probe(model, first_batch, None, optimizer=optimizer, data=...)`` on the first
effective batch (4 x 16 = 64 train pairs collated as one dict batch; ``loss_fn=None``: the
model returns its own loss) with the prepared optimizer and ``data=(train ids, train
labels, validation ids, validation labels)`` (each split padded to its longest pair);
``nndx.Monitor(model, optimizer)`` (the prepared optimizer the loop steps) around the loop,
each micro-batch's ``output.loss`` logged after its ``accumulate`` block, the validation
loss (``outputs.loss``, computed in the eval loop for this) and accuracy logged as
``split="val"`` after each epoch; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "accelerate_nlp"
SOURCE = Source("huggingface/accelerate", "examples/by_feature/gradient_accumulation.py",
                "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (shrunk: tiny BERT from scratch, synthetic pairs)"),
        Variant(
            "zero_grad_at_start_of_accumulate",
            "optimizer.zero_grad() moved to the top of the accelerator.accumulate block (as the Accelerate docs once "
            "showed it): on the sync micro-batch it wipes the three accumulated ones, so every update carries one "
            "micro-batch's gradient in four",
            (C.GRAD_ACCUM_SCALING, C.SILENT_DATA_LOSS),
            ("https://github.com/huggingface/accelerate/issues/616",
             "https://github.com/huggingface/accelerate/issues/1299",
             "https://github.com/tatsu-lab/alpaca_farm/issues/57"),
            Measure("final_train_loss", "mean train loss of the last 50 micro-batches at least 2x the healthy run's: "
                    "0.356/0.350/0.351 buggy against 0.069/0.086/0.067 healthy on seeds 0-2; validation accuracy "
                    "0.865/0.903/0.915 against 0.930/0.993/0.998",
                    lambda healthy, buggy: buggy >= 2 * healthy),
        ),
        Variant(
            "num_labels_one",
            "the model built with num_labels=1 for the binary task and the labels cast to float (the fix usually "
            "given for the 'Found dtype Long but expected Float' error it raises): the model silently switches to "
            "regression (MSELoss on 0/1), and logits.argmax(-1) over its one logit always says 0",
            (C.WRONG_LOSS, C.LABEL_DTYPE),
            ("https://openillumi.com/en/en-bert-finetuning-long-float-error-fix",
             "https://github.com/huggingface/transformers/issues/7496",
             "https://github.com/huggingface/transformers/issues/1541"),
            Measure("eval_accuracy", "validation accuracy after the last epoch at least 0.25 below the healthy run's: "
                    "0.338/0.335/0.343 (every pair called 0; F1 0) buggy against 0.930/0.993/0.998 healthy on "
                    "seeds 0-2",
                    lambda healthy, buggy: buggy <= healthy - 0.25),
        ),
    )
}

EVAL_BATCH_SIZE = 32
config = {"lr": 3e-3, "num_epochs": 3, "batch_size": 16}
gradient_accumulation_steps = 4
num_warmup_steps = 54

PAD, CLS, SEP = 0, 1, 2
KEY, FILLER = 6, 40
OFFSET = 3
VOCAB = OFFSET + KEY + FILLER
N_TRAIN, N_EVAL = 2000, 400


# --------------------------------------------------------------------------- data (GLUE MRPC's stand-in)


def sentence_pairs(n: int, seed: int) -> list[dict[str, object]]:
    """Pairs of word-id sentences and a 0/1 label: 1 when the first holds more key words
    than the second (never equal); about two thirds positive."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []

    def sentence(keys: int) -> list[int]:
        words = list(OFFSET + rng.choice(KEY, size=keys))
        words += list(OFFSET + KEY + rng.choice(FILLER, size=int(rng.integers(4, 9))))
        rng.shuffle(words)
        return [int(w) for w in words]

    while len(rows) < n:
        a, b = int(rng.integers(0, 4)), int(rng.integers(0, 4))
        if a == b:
            continue
        label = int(a > b)
        if label == 0 and rng.random() < 0.5:
            continue
        rows.append({"sentence1": sentence(a), "sentence2": sentence(b), "label": label})
    return rows


def tokenize_function(example: dict[str, object]) -> dict[str, list[int]]:
    """``tokenizer(sentence1, sentence2)``: [CLS] s1 [SEP] s2 [SEP] with token types."""
    s1, s2 = example["sentence1"], example["sentence2"]
    ids = [CLS, *s1, SEP, *s2, SEP]
    return {"input_ids": ids, "token_type_ids": [0] * (len(s1) + 2) + [1] * (len(s2) + 1),
            "attention_mask": [1] * len(ids)}  # fmt: skip


def pad(examples: list[dict[str, object]], label_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``tokenizer.pad(examples, padding="longest", return_tensors="pt")``."""
    longest = max(len(e["input_ids"]) for e in examples)
    out = {k: torch.zeros((len(examples), longest), dtype=torch.long)
           for k in ("input_ids", "token_type_ids", "attention_mask")}  # fmt: skip
    for i, e in enumerate(examples):
        for k in out:
            out[k][i, : len(e[k])] = torch.tensor(e[k])
    out["labels"] = torch.tensor([e["labels"] for e in examples], dtype=label_dtype)
    return out


# --------------------------------------------------------------------------- the program


def _f1(pred: torch.Tensor, ref: torch.Tensor) -> float:
    tp = int(((pred == 1) & (ref == 1)).sum())
    fp = int(((pred == 1) & (ref == 0)).sum())
    fn = int(((pred == 0) & (ref == 1)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup, set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    AcceleratorState._reset_state(reset_partial_state=True)  # a fresh process, as the script runs once per process
    GradientState._reset_state()
    num_labels_one = variant == "num_labels_one"
    zero_grad_first = variant == "zero_grad_at_start_of_accumulate"

    accelerator = Accelerator(cpu=True, mixed_precision=None, gradient_accumulation_steps=gradient_accumulation_steps)
    lr, num_epochs, batch_size = config["lr"], int(config["num_epochs"]), int(config["batch_size"])
    set_seed(seed)

    def tokenized(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{**tokenize_function(r), "labels": r["label"]} for r in rows]  # rename_column("label", "labels")

    train_rows = tokenized(sentence_pairs(N_TRAIN, seed))
    eval_rows = tokenized(sentence_pairs(N_EVAL, seed + 1000))
    label_dtype = torch.float if num_labels_one else torch.long

    def collate_fn(examples: list[dict[str, object]]) -> dict[str, torch.Tensor]:
        return pad(examples, label_dtype)

    train_dataloader = DataLoader(train_rows, shuffle=True, collate_fn=collate_fn, batch_size=batch_size)
    eval_dataloader = DataLoader(eval_rows, shuffle=False, collate_fn=collate_fn, batch_size=EVAL_BATCH_SIZE)

    model_config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, pad_token_id=PAD,
                              num_labels=1 if num_labels_one else 2, return_dict=True)  # fmt: skip
    model = BertForSequenceClassification(model_config)
    model = model.to(accelerator.device)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                                                   num_training_steps=len(train_dataloader) * num_epochs)  # fmt: skip
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    def ids_and_labels(rows: list[dict[str, object]]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = pad(rows, label_dtype)
        return batch["input_ids"], batch["labels"]

    data_splits = (*ids_and_labels(train_rows), *ids_and_labels(eval_rows))
    first_batch = pad(train_rows[: batch_size * gradient_accumulation_steps], label_dtype)
    nx.preflight(model, first_batch, None, optimizer=optimizer, data=data_splits)
    mon = nx.monitor(model, optimizer, every=10)

    train_losses: list[float] = []
    optimizer_steps = 0
    eval_accuracy = eval_f1 = eval_loss = float("nan")
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                if zero_grad_first:
                    optimizer.zero_grad()
                output = model(**batch)
                loss = output.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                if not zero_grad_first:
                    optimizer.zero_grad()
            optimizer_steps += int(accelerator.sync_gradients)
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_losses.append(loss.item())

        model.eval()
        all_pred, all_ref, loss_sum = [], [], 0.0
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            all_pred.append(predictions)
            all_ref.append(references.long())
            loss_sum += float(outputs.loss) * len(predictions)
        pred, ref = torch.cat(all_pred), torch.cat(all_ref)
        eval_accuracy = float((pred == ref).float().mean())
        eval_f1 = _f1(pred, ref)
        eval_loss = loss_sum / len(ref)
        nx.timed(lambda: mon.log(eval_loss, split="val", accuracy=eval_accuracy))  # noqa: B023

    nx.finish(mon, model, first_batch, None, optimizer=optimizer, data=data_splits)
    accelerator.end_training()
    return {
        "final_train_loss": float(np.mean(train_losses[-50:])),
        "first_train_loss": float(np.mean(train_losses[:50])),
        "eval_accuracy": eval_accuracy,
        "eval_f1": eval_f1,
        "eval_loss": eval_loss,
        "final_lr": optimizer.param_groups[0]["lr"],
        "optimizer_steps": float(optimizer_steps),
    }
