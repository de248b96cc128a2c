"""Port of Hugging Face's ``run_ner_no_trainer.py``: token classification (NER) with a plain
loop, ``outputs = model(**batch)``, ``loss = outputs.loss``.

Source: github.com/huggingface/transformers,
``examples/pytorch/token-classification/run_ner_no_trainer.py`` at commit
01080c629600d4ff3121446bb4f4a2e240c2cf41 (Apache-2.0, Copyright 2021 The HuggingFace Inc.
team). Written anew from the facts of that file; no code copied.

Kept: the label list built by ``get_label_list`` (the union of the train tags, sorted) and
``label_to_id``; ``AutoModelForTokenClassification`` from a config with ``num_labels``
("Training new model from scratch": here ``BertForTokenClassification`` from a small
``BertConfig``), ``config.label2id`` / ``id2label`` set from the label list;
``tokenize_and_align_labels``: the words tokenized with ``is_split_into_words=True``, the
labels aligned through ``word_ids()``: -100 for the special tokens (word id ``None``), the
word's label on its first sub-token, and on the following sub-tokens -100
(``label_all_tokens`` False, the default; the ``b_to_i_label`` map when it is True);
``DataCollatorForTokenClassification`` (dynamic padding of the inputs, labels padded with
-100); a shuffled train loader and an unshuffled eval loader; ``AdamW`` over two parameter
groups (no decay on ``bias`` and ``LayerNorm.weight``); ``num_update_steps_per_epoch =
ceil(len(train_dataloader) / gradient_accumulation_steps)``, ``max_train_steps =
num_train_epochs * num_update_steps_per_epoch``, ``get_scheduler(lr_scheduler_type,
num_warmup_steps, max_train_steps)``; the loop ``model.train()``, forward, ``loss /
gradient_accumulation_steps``, backward, and on the accumulation boundary
``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``,
``completed_steps += 1``, ``break`` at ``max_train_steps``; each epoch's evaluation:
``model.eval()``, ``torch.no_grad()``, ``logits.argmax(-1)``, ``get_labels`` (positions whose
reference is -100 dropped) and the ``seqeval`` metric's overall precision, recall, F1 and
accuracy (entities as conlleval reads BIO: an ``I-`` after ``O`` or another type opens one).
Shrunk: a generated CoNLL-like data set instead of a download: sentences from 6 templates
("PER works for ORG in LOC", "the ORG office in LOC said", ...) where a person is an
optional title ("mr"/"ms", tagged O) then a first name and maybe a surname (B-PER I-PER), an
organisation a name and maybe "corp"/"bank" (B-ORG I-ORG), a location one or two words; two
words ("jordan", "georgia") are both first names and places, so their tag follows from the
context. A word-piece-like tokenizer written in the program (no download): a word of up to
4 letters is one token, a longer one its first 3 letters and "##" + the rest, so most
entity words become two sub-tokens. 1,000 train and 300 validation sentences; BERT with
hidden 64, 2 layers, 4 heads, intermediate 128 instead of bert-base; learning_rate 1e-3
instead of 5e-5 (random init, not a pretrained checkpoint) with ``num_warmup_steps`` 10% of
the steps (the script's option; default 0); batch 8 (the default), 3 epochs (the default).
No Accelerator (one CPU process: ``accelerator.backward`` is ``loss.backward()``,
``gather``/``pad_across_processes`` are the identity), no tracking, checkpointing or hub.

Measure only: the seqeval-style entity F1 against the validation words' own tags (each
word's prediction read at its first sub-token, the alignment the script intends),
whatever alignment the run used; and the script's own F1 and token accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first train batch (a
collated dict with the labels, ``loss_fn=None``: the model returns its own loss), the
optimizer, and ``data=(train input_ids, train labels)`` (padded to the longest sentence);
``nndx.Monitor(model, optimizer)`` around the loop, each batch's ``outputs.loss`` logged,
each epoch's validation loss and the script's token accuracy logged as ``split="val"``;
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "run_ner"
SOURCE = Source("huggingface/transformers", "examples/pytorch/token-classification/run_ner_no_trainer.py",
                "01080c629600d4ff3121446bb4f4a2e240c2cf41", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (linear schedule with 10% warmup)"),
        Variant(
            "labels_by_token_position",
            "tokenize_and_align_labels gives token i the label of word i (label[i] over the tokens after [CLS], "
            "-100 past the last word) instead of going through word_ids(): once a word is split into sub-tokens "
            "every later label sits on the wrong token",
            (C.LABELS_MISALIGNED,),
            ("https://discuss.huggingface.co/t/how-to-deal-with-differences-between-conll-2003-dataset-tokenisation-"
             "and-ber-tokeniser-when-fine-tuning-ner-model/11129",
             "https://github.com/VinAIResearch/PhoNER_COVID19/issues/2",
             "https://github.com/huggingface/notebooks/issues/250",
             "https://github.com/huggingface/transformers/issues/12665"),
            Measure("word_f1", "entity F1 on the validation words' own tags at least 0.2 below the healthy run's: "
                    "0.21 against 1.00 healthy on seed 0 (the script's own F1, on equally misaligned references: 0.53)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the accumulation branch: every step's gradient is the sum of all "
            "the batches so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://thecodeforge.io/ml-ai/pytorch-training-loop/",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://discuss.pytorch.org/t/loss-function-s-not-reflecting-optimum-values-and-increasing-with-time/"
             "188492"),
            Measure("word_f1", "entity F1 on the validation words' own tags at least 0.2 below the healthy run's: "
                    "0.18 against 1.00 healthy on seed 0 (final train loss 1.29 against 0.018)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

# --------------------------------------------------------------------------- the data and the tokenizer

FIRST = ["anna", "bob", "carlos", "dmitri", "elena", "fatima", "hiroshi", "ivan", "jordan", "georgia"]
LAST = ["smith", "nakamura", "kowalski", "okafor", "berg", "li", "moreau"]
PLACE = ["paris", "berlin", "lagos", "toronto", "oslo", "lima", "jordan", "georgia", "chad", "kenya"]
PLACE2 = [("new", "york"), ("san", "diego"), ("hong", "kong")]
ORG = ["acme", "globex", "initech", "umbrella", "wayne", "stark", "hooli"]
ORG_TAIL = ["corp", "bank"]
TEMPLATES = [
    ["PER", "works", "for", "ORG", "in", "LOC"],
    ["PER", "visited", "LOC", "yesterday"],
    ["the", "ORG", "office", "in", "LOC", "said"],
    ["PER", "met", "PER", "at", "ORG"],
    ["a", "report", "from", "LOC", "said", "ORG", "and", "PER", "met"],
    ["today", "PER", "flew", "to", "LOC", "with", "PER"],
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
PAD, UNK, CLS, SEP = 0, 1, 2, 3


def pieces(word: str) -> list[str]:
    """The tokenizer's split of one word: whole up to 4 letters, else 3 letters + '##rest'."""
    return [word] if len(word) <= 4 else [word[:3], "##" + word[3:]]


def build_vocab() -> dict[str, int]:
    words = set(FIRST + LAST + PLACE + ORG + ORG_TAIL + ["mr", "ms"])
    words |= {w for pair in PLACE2 for w in pair}
    words |= {w for t in TEMPLATES for w in t if w not in ("PER", "ORG", "LOC")}
    toks = sorted({p for w in words for p in pieces(w)})
    return {t: i for i, t in enumerate(SPECIALS + toks)}


VOCAB = build_vocab()


def make_sentences(n: int, seed: int) -> list[dict[str, list[str]]]:
    """CoNLL-shaped rows: ``tokens`` (words) and ``ner_tags`` (BIO strings)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for slot in rng.choice(TEMPLATES):
            if slot == "PER":
                if rng.random() < 0.4:
                    tokens.append(rng.choice(["mr", "ms"]))
                    tags.append("O")
                tokens.append(rng.choice(FIRST))
                tags.append("B-PER")
                if rng.random() < 0.5:
                    tokens.append(rng.choice(LAST))
                    tags.append("I-PER")
            elif slot == "LOC":
                if rng.random() < 0.25:
                    tokens += list(rng.choice(PLACE2))
                    tags += ["B-LOC", "I-LOC"]
                else:
                    tokens.append(rng.choice(PLACE))
                    tags.append("B-LOC")
            elif slot == "ORG":
                tokens.append(rng.choice(ORG))
                tags.append("B-ORG")
                if rng.random() < 0.5:
                    tokens.append(rng.choice(ORG_TAIL))
                    tags.append("I-ORG")
            else:
                tokens.append(slot)
                tags.append("O")
        rows.append({"tokens": tokens, "ner_tags": tags})
    return rows


class Encoding(dict):
    """What a fast tokenizer returns for a batch of pre-split sentences, with ``word_ids``."""

    def __init__(self, input_ids: list[list[int]], word_ids: list[list[int | None]]) -> None:
        super().__init__(input_ids=input_ids, token_type_ids=[[0] * len(x) for x in input_ids],
                         attention_mask=[[1] * len(x) for x in input_ids])  # fmt: skip
        self._word_ids = word_ids

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._word_ids[batch_index]


class PieceTokenizer:
    pad_token_id = PAD

    def __call__(self, batch_words: list[list[str]], max_length: int = 128, truncation: bool = True,
                 is_split_into_words: bool = True) -> Encoding:  # fmt: skip
        all_ids, all_word_ids = [], []
        for words in batch_words:
            ids, wids = [CLS], [None]
            for w, word in enumerate(words):
                for p in pieces(word):
                    ids.append(VOCAB.get(p, UNK))
                    wids.append(w)
            if truncation and len(ids) > max_length - 1:
                ids, wids = ids[: max_length - 1], wids[: max_length - 1]
            all_ids.append(ids + [SEP])
            all_word_ids.append(wids + [None])
        return Encoding(all_ids, all_word_ids)

    def __len__(self) -> int:
        return len(VOCAB)


# --------------------------------------------------------------------------- the script


class Args:
    max_length = 128
    per_device_train_batch_size = 8
    per_device_eval_batch_size = 8
    learning_rate = 1e-3
    weight_decay = 0.0
    num_train_epochs = 3
    gradient_accumulation_steps = 1
    lr_scheduler_type = "linear"
    warmup_ratio = 0.1
    label_all_tokens = False


def get_label_list(labels: list[list[str]]) -> list[str]:
    unique: set[str] = set()
    for label in labels:
        unique |= set(label)
    return sorted(unique)


def tokenize_and_align_labels(examples: list[dict], tokenizer: PieceTokenizer, label_to_id: dict[str, int],
                              b_to_i_label: list[int], args: Args, variant: str) -> list[dict]:  # fmt: skip
    tokenized = tokenizer([e["tokens"] for e in examples], max_length=args.max_length, truncation=True,
                          is_split_into_words=True)  # fmt: skip
    features = []
    for i, example in enumerate(examples):
        label = example["ner_tags"]
        word_ids = tokenized.word_ids(batch_index=i)
        label_ids: list[int] = []
        if variant == "labels_by_token_position":  # word i's label on token i (after [CLS]), no word_ids
            n = len(word_ids)
            label_ids = [-100] + [label_to_id[label[j]] if j < len(label) else -100 for j in range(n - 2)] + [-100]
        else:
            previous = None
            for word_idx in word_ids:
                if word_idx is None:
                    label_ids.append(-100)
                elif word_idx != previous:
                    label_ids.append(label_to_id[label[word_idx]])
                elif args.label_all_tokens:
                    label_ids.append(b_to_i_label[label_to_id[label[word_idx]]])
                else:
                    label_ids.append(-100)
                previous = word_idx
        features.append({"input_ids": tokenized["input_ids"][i], "token_type_ids": tokenized["token_type_ids"][i],
                         "attention_mask": tokenized["attention_mask"][i], "labels": label_ids,
                         "word_ids": word_ids})  # fmt: skip
    return features


MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels")


def collate(features: list[dict], label_pad_token_id: int = -100) -> dict[str, torch.Tensor]:
    """``DataCollatorForTokenClassification``: inputs padded with the pad id, labels with -100."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key, pad in (("input_ids", PAD), ("token_type_ids", 0), ("attention_mask", 0), ("labels", label_pad_token_id)):
        t = torch.full((len(features), longest), pad, dtype=torch.long)
        for i, f in enumerate(features):
            t[i, : len(f[key])] = torch.tensor(f[key])
        batch[key] = t
    return batch


def batches(features: list[dict], batch_size: int, shuffle: bool, rng: random.Random | None = None) -> list[dict]:
    order = list(range(len(features)))
    if shuffle:
        rng.shuffle(order)
    return [collate([{k: features[j][k] for k in MODEL_KEYS} for j in order[i : i + batch_size]])
            for i in range(0, len(order), batch_size)]  # fmt: skip


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """conlleval's chunks: (type, start, end) from a BIO sequence."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, t = tag.partition("-")
        begins = prefix == "B" or (prefix == "I" and kind != t)
        if kind is not None and (tag == "O" or begins):
            chunks.add((kind, start, i))
            kind = None
        if begins:
            start, kind = i, t
    return chunks


def seqeval(predictions: list[list[str]], references: list[list[str]]) -> dict[str, float]:
    tp = n_pred = n_true = 0
    correct = total = 0
    for pred, ref in zip(predictions, references):
        p, r = entities(pred), entities(ref)
        tp += len(p & r)
        n_pred += len(p)
        n_true += len(r)
        correct += sum(a == b for a, b in zip(pred, ref))
        total += len(ref)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": correct / max(total, 1)}


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import BertConfig, BertForTokenClassification, get_scheduler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    args = Args()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # set_seed(args.seed)
    raw_train = make_sentences(1000, seed)
    raw_eval = make_sentences(300, seed + 1000)

    label_list = get_label_list([r["ner_tags"] for r in raw_train])
    label_to_id = {lab: i for i, lab in enumerate(label_list)}
    num_labels = len(label_list)
    b_to_i_label = [label_list.index(lab.replace("B-", "I-")) if lab.startswith("B-") and lab.replace("B-", "I-")
                    in label_list else i for i, lab in enumerate(label_list)]  # fmt: skip

    config = BertConfig(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=args.max_length, pad_token_id=PAD,
                        num_labels=num_labels)  # fmt: skip
    tokenizer = PieceTokenizer()
    model = BertForTokenClassification(config)  # "Training new model from scratch"
    model.config.label2id = {lab: i for i, lab in enumerate(label_list)}
    model.config.id2label = dict(enumerate(label_list))

    train_dataset = tokenize_and_align_labels(raw_train, tokenizer, label_to_id, b_to_i_label, args, variant)
    eval_dataset = tokenize_and_align_labels(raw_eval, tokenizer, label_to_id, b_to_i_label, args, variant)
    loader_rng = random.Random(seed + 2)  # DataLoader(shuffle=True)'s sampler
    eval_dataloader = batches(eval_dataset, args.per_device_eval_batch_size, shuffle=False)
    len_train_dataloader = math.ceil(len(train_dataset) / args.per_device_train_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
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
                                 num_warmup_steps=int(args.warmup_ratio * max_train_steps),
                                 num_training_steps=max_train_steps)  # fmt: skip

    first_batch = batches(train_dataset[: args.per_device_train_batch_size], args.per_device_train_batch_size,
                          shuffle=False)[0]  # fmt: skip
    all_train = collate([{k: f[k] for k in MODEL_KEYS} for f in train_dataset])
    data = (all_train["input_ids"], all_train["labels"])
    nx.preflight(model, first_batch, None, optimizer=optimizer, data=data)
    mon = nx.monitor(model, optimizer, every=10)

    def evaluate() -> tuple[dict[str, float], float, float]:
        model.eval()
        preds_all, refs_all, losses = [], [], []
        word_preds, word_refs = [], []
        k = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(float(outputs.loss) * len(batch["input_ids"]))
            predictions = outputs.logits.argmax(dim=-1).numpy()
            references = batch["labels"].numpy()
            for pred, gold in zip(predictions, references):  # get_labels
                preds_all.append([label_list[p] for p, g in zip(pred, gold) if g != -100])
                refs_all.append([label_list[g] for p, g in zip(pred, gold) if g != -100])
                # measure only: each word's first sub-token against the word's own tag
                feature, row = eval_dataset[k], raw_eval[k]
                firsts = [j for j, w in enumerate(feature["word_ids"]) if w is not None
                          and (j == 0 or feature["word_ids"][j - 1] != w)]  # fmt: skip
                word_preds.append([label_list[pred[j]] for j in firsts])
                word_refs.append(list(row["ner_tags"]))
                k += 1
        return seqeval(preds_all, refs_all), seqeval(word_preds, word_refs)["f1"], sum(losses) / len(eval_dataset)

    completed_steps = 0
    train_losses: list[float] = []
    metric: dict[str, float] = {}
    word_f1 = eval_loss = float("nan")
    for _epoch in range(args.num_train_epochs):
        model.train()
        train_dataloader = batches(train_dataset, args.per_device_train_batch_size, shuffle=True, rng=loader_rng)
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
                if variant != "no_zero_grad":
                    optimizer.zero_grad()
                completed_steps += 1
            if completed_steps >= max_train_steps:
                break
        metric, word_f1, eval_loss = evaluate()
        nx.timed(lambda: mon.log(eval_loss, split="val", accuracy=metric["accuracy"]))  # noqa: B023

    nx.finish(mon, model, first_batch, None, optimizer=optimizer, data=data)
    return {
        "word_f1": word_f1,
        "f1": metric["f1"],
        "token_accuracy": metric["accuracy"],
        "eval_loss": eval_loss,
        "first_train_loss": float(np.mean(train_losses[:20])),
        "final_train_loss": float(np.mean(train_losses[-20:])),
        "completed_steps": float(completed_steps),
    }
