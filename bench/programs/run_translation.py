"""Port of Hugging Face's ``run_translation_no_trainer.py``: a sequence-to-sequence model
fine-tuned for translation with a plain loop, ``outputs = model(**batch)``,
``loss = outputs.loss``, evaluated by generation.

Source: github.com/huggingface/transformers,
``examples/pytorch/translation/run_translation_no_trainer.py`` at commit
00e3e798432b8e5e7f89bbbc7fd1e8df064f7f65 (Apache-2.0, Copyright The HuggingFace Team).
Written anew from the facts of that file; no code copied.

Kept: ``AutoModelForSeq2SeqLM`` from a config ("Training new model from scratch": here
``T5ForConditionalGeneration`` from a small ``T5Config``; ``decoder_start_token_id`` the pad
id, as T5 has it); ``preprocess_function``: the source texts (with ``source_prefix``, None by
default) tokenized with ``max_length=max_source_length`` and ``truncation=True``, the
targets tokenized as ``text_target`` with ``max_length=max_target_length``, the target ids
as ``labels`` (``padding`` False: dynamic padding); ``DataCollatorForSeq2Seq(tokenizer,
model=model, label_pad_token_id=-100)`` (``ignore_pad_token_for_loss`` True, the default):
inputs padded with the pad id, labels with -100, and ``decoder_input_ids`` from the model's
own ``prepare_decoder_input_ids_from_labels`` (the labels shifted right behind the start
token, -100 replaced by the pad id); a shuffled train loader and an unshuffled eval loader;
``AdamW`` over two parameter groups (no decay on ``bias``, ``LayerNorm.weight`` and
``layer_norm.weight``); ``max_train_steps = num_train_epochs * ceil(len(train_dataloader) /
gradient_accumulation_steps)``; ``get_scheduler(lr_scheduler_type, num_warmup_steps=0,
max_train_steps)`` (linear, no warmup: the defaults); the loop ``model.train()``, forward,
``loss / gradient_accumulation_steps``, backward, on the accumulation boundary
``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``, ``completed_steps``,
``break`` at ``max_train_steps``; each epoch's evaluation: ``model.eval()``,
``model.generate(input_ids, attention_mask, max_length=val_max_target_length,
num_beams=None)`` (greedy), the -100 in the labels replaced by the pad id,
``batch_decode(skip_special_tokens=True)``, ``postprocess_text`` (strip).
Shrunk: a generated translation task instead of WMT: a source sentence is 2 or 3 noun
groups, each a noun with an adjective before it half the time; its translation maps every
word through a fixed dictionary (10 nouns, 5 adjectives, each with its own target word)
and puts each group's adjective after its noun (the order changes, as English -> French);
a word-level tokenizer over a vocabulary written in the program (pad 0, eos 1, unk 2; the
eos appended to sources and targets, as T5's tokenizer does) instead of a SentencePiece
download; 1,200 train and 160 validation pairs, distinct within each split (drawn at random from
this small space, 10% of the train pairs would repeat); T5 with d_model 64, d_kv 16, d_ff 128, 2
encoder and 2 decoder layers, 4 heads and ``dropout_rate`` 0 instead of t5-small (with
dropout 0.1 this small model's loss stalls above 1.1); learning_rate 1e-3 instead of 5e-5
(random init, not a pretrained checkpoint); batch 8 (the default), 6 epochs instead of 3;
max_source_length and max_target_length 32 (the sentences are at most 7 tokens; the
defaults 1024 and 128 change nothing), val_max_target_length 10. sacrebleu replaced by
exact match and token accuracy (``evaluate`` downloads its metric). No Accelerator (one
CPU process), tracking, checkpointing or hub code.

Measure only: the exact match of the greedy generations against the validation targets
(the whole sentence right), and their token accuracy (position by position).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first train batch (the
collated dict with ``labels`` and ``decoder_input_ids``, ``loss_fn=None``: the model returns
its own loss), the optimizer, and ``data=(train input_ids, train labels)`` (padded with the
collator's values) for the data checks; ``nndx.Monitor(model, optimizer)`` around the loop,
each batch's ``outputs.loss`` logged, each epoch's validation loss (teacher-forced, on the
same collated validation batches) and exact match logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "run_translation"
SOURCE = Source("huggingface/transformers", "examples/pytorch/translation/run_translation_no_trainer.py",
                "00e3e798432b8e5e7f89bbbc7fd1e8df064f7f65", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (linear schedule, no warmup)"),
        Variant(
            "decoder_inputs_are_labels",
            "the batch's decoder_input_ids set to the labels themselves (pads for -100) instead of the labels "
            "shifted right: at every position the decoder is shown the token it must predict",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/huggingface/transformers/issues/11977",
             "https://github.com/huggingface/transformers/issues/5987",
             "https://github.com/lgw863/ACSA-generation/issues/5",
             "https://github.com/abhimishra91/transformers-tutorials/issues/15"),
            Measure("exact_match", "validation exact match of greedy generation at least 0.3 below the healthy "
                    "run's: 0.00 against 0.65 healthy on seed 0 (while the train loss falls to 0.004 against 0.15)",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "source_truncated",
            "max_source_length 4 (a value meant for another data set): every source longer than 3 words is "
            "silently cut, the targets are kept whole, so the model is asked to translate words it never sees",
            (C.SILENT_DATA_LOSS,),
            ("https://github.com/harvardnlp/encoder-agnostic-adaptation/issues/3",
             "https://github.com/huggingface/transformers/issues/7500",
             "https://github.com/mlcommons/training_policies/issues/67"),
            Measure("exact_match", "validation exact match of greedy generation at least 0.2 below the healthy "
                    "run's: 0.36 against 0.65 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

# --------------------------------------------------------------------------- the data and the tokenizer

NOUNS = ["cat", "dog", "house", "tree", "car", "river", "book", "door", "bird", "road"]
ADJS = ["red", "big", "small", "old", "new"]
DICT = {w: f"{w}_fr" for w in NOUNS + ADJS}
SPECIALS = ["<pad>", "</s>", "<unk>"]
VOCAB = {t: i for i, t in enumerate(SPECIALS + NOUNS + ADJS + [DICT[w] for w in NOUNS + ADJS])}
ID2TOK = {i: t for t, i in VOCAB.items()}
PAD, EOS, UNK = 0, 1, 2
N_TRAIN, N_EVAL = 1200, 160


def make_pairs(n: int, seed: int) -> list[dict[str, str]]:
    """``translation`` rows: {"en": source, "fr": target}."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        src, tgt = [], []
        for _ in range(rng.randint(2, 3)):
            noun = rng.choice(NOUNS)
            if rng.random() < 0.5:
                adj = rng.choice(ADJS)
                src += [adj, noun]
                tgt += [DICT[noun], DICT[adj]]
            else:
                src.append(noun)
                tgt.append(DICT[noun])
        if " ".join(src) in seen:  # a corpus of distinct sentence pairs, as WMT's (nearly) is
            continue
        seen.add(" ".join(src))
        rows.append({"en": " ".join(src), "fr": " ".join(tgt)})
    return rows


class WordTokenizer:
    pad_token_id, eos_token_id = PAD, EOS

    def encode(self, text: str, max_length: int, truncation: bool = True) -> list[int]:
        ids = [VOCAB.get(w, UNK) for w in text.split()]
        if truncation and len(ids) > max_length - 1:
            ids = ids[: max_length - 1]  # truncation keeps room for the eos
        return ids + [EOS]

    def __call__(self, texts: list[str] | None = None, text_target: list[str] | None = None,
                 max_length: int = 128, truncation: bool = True) -> dict[str, list[list[int]]]:  # fmt: skip
        ids = [self.encode(t, max_length, truncation) for t in (texts if texts is not None else text_target)]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}

    def batch_decode(self, sequences, skip_special_tokens: bool = True) -> list[str]:
        out = []
        for seq in sequences:
            toks = [ID2TOK.get(int(i), "<unk>") for i in seq]
            out.append(" ".join(t for t in toks if not (skip_special_tokens and t in SPECIALS)))
        return out

    def __len__(self) -> int:
        return len(VOCAB)


# --------------------------------------------------------------------------- the script


class Args:
    max_source_length = 32
    max_target_length = 32
    val_max_target_length = 10
    num_beams = None
    source_prefix = None
    per_device_train_batch_size = 8
    per_device_eval_batch_size = 16
    learning_rate = 1e-3
    weight_decay = 0.0
    num_train_epochs = 6
    gradient_accumulation_steps = 1
    lr_scheduler_type = "linear"
    num_warmup_steps = 0
    ignore_pad_token_for_loss = True


def preprocess_function(examples: list[dict[str, str]], tokenizer: WordTokenizer, args: Args) -> list[dict]:
    prefix = args.source_prefix if args.source_prefix is not None else ""
    inputs = [prefix + ex["en"] for ex in examples]
    targets = [ex["fr"] for ex in examples]
    model_inputs = tokenizer(inputs, max_length=args.max_source_length, truncation=True)
    labels = tokenizer(text_target=targets, max_length=args.max_target_length, truncation=True)
    return [{"input_ids": i, "attention_mask": a, "labels": lab}
            for i, a, lab in zip(model_inputs["input_ids"], model_inputs["attention_mask"], labels["input_ids"])]


class DataCollatorForSeq2Seq:
    def __init__(self, model, label_pad_token_id: int = -100, variant: str = "healthy") -> None:
        self.model, self.label_pad_token_id, self.variant = model, label_pad_token_id, variant

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = {}
        for key, pad in (("input_ids", PAD), ("attention_mask", 0), ("labels", self.label_pad_token_id)):
            longest = max(len(f[key]) for f in features)
            t = torch.full((len(features), longest), pad, dtype=torch.long)
            for i, f in enumerate(features):
                t[i, : len(f[key])] = torch.tensor(f[key])
            batch[key] = t
        if self.variant == "decoder_inputs_are_labels":  # the labels themselves, not shifted
            batch["decoder_input_ids"] = batch["labels"].masked_fill(batch["labels"] == -100, PAD)
        elif self.model is not None and hasattr(self.model, "prepare_decoder_input_ids_from_labels"):
            batch["decoder_input_ids"] = self.model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        return batch


def batches(features: list[dict], collator, batch_size: int, shuffle: bool, rng: random.Random | None = None):
    order = list(range(len(features)))
    if shuffle:
        rng.shuffle(order)
    return [collator([features[j] for j in order[i : i + batch_size]]) for i in range(0, len(order), batch_size)]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import T5Config, T5ForConditionalGeneration, get_scheduler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    args = Args()
    if variant == "source_truncated":
        args.max_source_length = 4
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # set_seed(args.seed)
    raw_train, raw_eval = make_pairs(N_TRAIN, seed), make_pairs(N_EVAL, seed + 1000)

    tokenizer = WordTokenizer()
    config = T5Config(vocab_size=len(VOCAB), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS,
                      decoder_start_token_id=PAD)  # fmt: skip
    model = T5ForConditionalGeneration(config)  # "Training new model from scratch"
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")

    train_dataset = preprocess_function(raw_train, tokenizer, args)
    eval_dataset = preprocess_function(raw_eval, tokenizer, args)
    label_pad_token_id = -100 if args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    collator = DataCollatorForSeq2Seq(model, label_pad_token_id=label_pad_token_id, variant=variant)
    loader_rng = random.Random(seed + 2)  # DataLoader(shuffle=True)'s sampler
    eval_dataloader = batches(eval_dataset, collator, args.per_device_eval_batch_size, shuffle=False)
    len_train_dataloader = math.ceil(len(train_dataset) / args.per_device_train_batch_size)

    no_decay = ["bias", "LayerNorm.weight", "layer_norm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len_train_dataloader / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps, num_training_steps=max_train_steps)  # fmt: skip

    first_batch = collator(train_dataset[: args.per_device_train_batch_size])
    all_train = collator(train_dataset)
    data = (all_train["input_ids"], all_train["labels"])
    nx.preflight(model, first_batch, None, optimizer=optimizer, data=data)
    mon = nx.monitor(model, optimizer, every=10)

    def evaluate() -> tuple[float, float, float]:
        model.eval()
        max_length = args.val_max_target_length if args.val_max_target_length is not None else args.max_target_length
        preds, refs, losses = [], [], []
        for batch in eval_dataloader:
            with torch.no_grad():
                generated = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                                           max_length=max_length, num_beams=args.num_beams or 1, do_sample=False)  # fmt: skip
                losses.append(float(model(**batch).loss) * len(batch["input_ids"]))
            labels = batch["labels"].numpy()
            if args.ignore_pad_token_for_loss:
                labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
            preds += [p.strip() for p in tokenizer.batch_decode(generated.numpy(), skip_special_tokens=True)]
            refs += [r.strip() for r in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        exact = float(np.mean([p == r for p, r in zip(preds, refs)]))
        tok = float(np.mean([np.mean([a == b for a, b in zip(p.split() + [""] * 20, r.split())]) for p, r in
                             zip(preds, refs)]))  # fmt: skip
        return exact, tok, sum(losses) / len(eval_dataset)

    completed_steps = 0
    train_losses: list[float] = []
    exact = token_acc = eval_loss = float("nan")
    for _epoch in range(args.num_train_epochs):
        model.train()
        train_dataloader = batches(train_dataset, collator, args.per_device_train_batch_size, shuffle=True,
                                   rng=loader_rng)  # fmt: skip
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_losses.append(loss.item())
            loss = loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                completed_steps += 1
            if completed_steps >= max_train_steps:
                break
        exact, token_acc, eval_loss = evaluate()
        nx.timed(lambda: mon.log(eval_loss, split="val", accuracy=exact))  # noqa: B023

    nx.finish(mon, model, first_batch, None, optimizer=optimizer, data=data)
    return {
        "exact_match": exact,
        "token_accuracy": token_acc,
        "eval_loss": eval_loss,
        "first_train_loss": float(np.mean(train_losses[:20])),
        "final_train_loss": float(np.mean(train_losses[-20:])),
        "completed_steps": float(completed_steps),
    }
