"""Port of Hugging Face's ``run_qa_no_trainer.py``: extractive question answering (start/end
span prediction) with a plain loop, ``outputs = model(**batch)``, ``loss = outputs.loss``.

Source: github.com/huggingface/transformers,
``examples/pytorch/question-answering/run_qa_no_trainer.py`` at commit
3e93524a13cf090daed5f0398f4f756d4390e27a and ``utils_qa.py`` at commit
e3b8f49f021f206cf09529ed0810d0df7e8d7656 (Apache-2.0, Copyright The HuggingFace Team).
Written anew from the facts of those files; no code copied.

Kept: ``AutoModelForQuestionAnswering`` from a config (here ``BertForQuestionAnswering`` from a
small ``BertConfig``, "Training new model from scratch"), called as ``model(**batch)`` with
``input_ids``, ``token_type_ids``, ``attention_mask``, ``start_positions`` and
``end_positions``, the loss from ``outputs.loss``; ``prepare_train_features``: the question
``lstrip``-ed, question and context tokenized as a pair (``[CLS] q [SEP] c [SEP]``, question
first: ``pad_on_right``) with offsets, ``cls_index``, ``sequence_ids``, the answer's
``start_char`` / ``end_char`` from ``answer_start`` and the text's length, the
context's first and last tokens found through ``sequence_ids``, the CLS index as label when
the answer is outside the span, otherwise the two walks over the offsets to the answer's
first and last token; ``prepare_validation_features``: ``example_id`` and the offsets set to
``None`` outside the context; ``DataCollatorWithPadding`` (dynamic padding); a shuffled train
loader and an unshuffled eval loader; ``AdamW`` over two parameter groups (no decay on
``bias`` and ``LayerNorm.weight``); ``max_train_steps = num_train_epochs *
ceil(len(train_dataloader) / gradient_accumulation_steps)``; ``get_scheduler(lr_scheduler_type,
num_warmup_steps, num_training_steps=max_train_steps)``; the loop ``model.train()``, forward,
backward, ``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``,
``completed_steps``, ``break`` at ``max_train_steps``; evaluation: ``model.eval()``,
``torch.no_grad()``, start/end logits padded with -100 into one array
(``create_and_fill_np_array``), ``postprocess_qa_predictions`` (the ``n_best_size`` largest start
and end logits, spans outside the context, reversed or longer than ``max_answer_length``
skipped, the best ``start_logit + end_logit`` span's text cut from the context by the offsets,
"empty" when none is left) and the ``squad`` metric's exact match (lower-cased, punctuation and
articles removed, whitespace collapsed).
Shrunk: a generated data set instead of SQuAD: a context states three facts "KEY is VALUE ;"
(3 of 8 keys; a VALUE is one of the key's own 4 words, half the time after one of 4 modifiers
such as "dark": one or two words), the question "KEY ?", the answer the VALUE; a word-level tokenizer over a vocabulary written in the program (the
words are the tokens, so offsets are word spans) instead of a downloaded WordPiece one;
1,200 train and 300 validation examples; BERT with hidden 64, 2 layers, 4 heads,
intermediate 128 instead of bert-base, ``initializer_range`` 0.1 instead of 0.02 (at 0.02 the
from-scratch model sits at the ln(3) plateau, never using the question, for 900 steps); contexts are shorter than ``max_seq_length`` (here
64 instead of 384), so each example gives one feature and ``doc_stride`` never applies;
learning_rate 1e-3 instead of 5e-5 (random init, not a pretrained checkpoint) with
``num_warmup_steps`` 10% of the steps (the script's option; default 0); batch 8 (the default), eval batch 8;
6 epochs instead of 3. No Accelerator (one CPU process: ``accelerator.backward(loss)`` is
``loss.backward()``), no tracking, checkpointing, hub or prediction split.

Measure only: the exact match that the script's evaluation computes on the validation set
(in [0, 1] here, not percent).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first train batch (a
collated dict with the labels, ``loss_fn=None``: the model returns its own loss), the
optimizer, and ``data=(train input_ids, train start_positions)`` (padded to the longest
feature) for the data checks; ``nndx.Monitor(model, optimizer)`` around the loop with each
batch's ``outputs.loss`` logged, each epoch's exact match on the validation set logged as
``split="val"`` accuracy with the validation loss (the script's validation features carry no
labels; for nndx the author labels them with ``prepare_train_features``, so the loss runs
alongside the unchanged post-processing); then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import collections
import math
import random
import re
import string

import numpy as np
import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "run_qa"
SOURCE = Source("huggingface/transformers", "examples/pytorch/question-answering/run_qa_no_trainer.py",
                "3e93524a13cf090daed5f0398f4f756d4390e27a", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (linear schedule with 10% warmup)"),
        Variant(
            "positions_in_context_tokens",
            "start/end positions counted in the context's own (word-level) tokens instead of in the "
            "[CLS] question [SEP] context [SEP] feature: every label lands len(question) + 2 tokens before "
            "the answer",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/transformers/pull/246",
             "https://github.com/huggingface/transformers/pull/250",
             "https://github.com/huggingface/transformers/issues/9326",
             "https://github.com/kushalj001/pytorch-question-answering/issues/8"),
            Measure("exact_match", "validation exact match at least 0.2 below the healthy run's: 0.14 against "
                    "0.88 healthy on seed 0 (eval loss 1.13 ~ ln 3: one of the three facts at random)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "schedule_sized_in_epochs",
            "get_scheduler(..., num_training_steps=num_train_epochs) (the horizon given in epochs while the "
            "scheduler is stepped every batch): the LR warms up, then is 0 for the rest of training",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/deepset-ai/FARM/issues/46",
             "https://github.com/vturrisi/solo-learn/issues/264",
             "https://github.com/huggingface/transformers/pull/598"),
            Measure("exact_match", "validation exact match at least 0.2 below the healthy run's: 0.20 against "
                    "0.88 healthy on seed 0 (LR 0 after the 90 warmup steps)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

# --------------------------------------------------------------------------- the vocabulary and the data

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
CATEGORIES = {
    "color": ["red", "blue", "green", "pink"], "city": ["paris", "rome", "oslo", "lima"],
    "owner": ["anna", "bob", "carl", "dora"], "fruit": ["apple", "pear", "plum", "fig"],
    "animal": ["cat", "dog", "fox", "owl"], "metal": ["iron", "gold", "tin", "zinc"],
    "drink": ["tea", "milk", "juice", "soda"], "tree": ["oak", "pine", "elm", "ash"],
}  # fmt: skip
KEYS = list(CATEGORIES)
MODIFIERS = ["dark", "light", "old", "new"]
VALUES = [w for words in CATEGORIES.values() for w in words] + MODIFIERS
GLUE = ["is", ";", "?"]
VOCAB = SPECIALS + KEYS + VALUES + GLUE
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
PAD, CLS, SEP, UNK = 0, 1, 2, 3
N_TRAIN, N_EVAL, FACTS = 1200, 300, 3


class Args:
    max_seq_length = 64
    doc_stride = 16
    per_device_train_batch_size = 8
    per_device_eval_batch_size = 8
    learning_rate = 1e-3
    weight_decay = 0.0
    num_train_epochs = 6
    gradient_accumulation_steps = 1
    lr_scheduler_type = "linear"
    warmup_ratio = 0.1
    n_best_size = 20
    max_answer_length = 30
    version_2_with_negative = False


def make_examples(n: int, seed: int, prefix: str) -> dict[str, list]:
    """SQuAD-shaped columns: id, question, context, answers {text, answer_start}."""
    rng = random.Random(seed)
    ids, questions, contexts, answers = [], [], [], []
    for i in range(n):
        keys = rng.sample(KEYS, FACTS)
        values = [" ".join(([rng.choice(MODIFIERS)] if rng.random() < 0.5 else []) + [rng.choice(CATEGORIES[k])])
                  for k in keys]  # fmt: skip
        asked = rng.randrange(FACTS)
        context, start = "", 0
        for j, (key, value) in enumerate(zip(keys, values)):
            sentence = f"{key} is "
            if j == asked:
                start = len(context) + len(sentence)
            context += sentence + value + " ; "
        ids.append(f"{prefix}{i}")
        questions.append(f"  {keys[asked]} ?")  # leading spaces: lstrip() in the script
        contexts.append(context.strip())
        answers.append({"text": [values[asked]], "answer_start": [start]})
    return {"id": ids, "question": questions, "context": contexts, "answers": answers}


class WordTokenizer:
    """A fast tokenizer's pair encoding on whitespace words: ``input_ids``, ``token_type_ids``,
    ``attention_mask``, ``offset_mapping`` (character spans in each text) and ``sequence_ids``."""

    cls_token_id, sep_token_id, pad_token_id, padding_side = CLS, SEP, PAD, "right"
    model_max_length = 512

    @staticmethod
    def words(text: str) -> list[tuple[str, int, int]]:
        return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]

    def __call__(self, question: str, context: str, max_length: int) -> dict[str, list]:
        q, c = self.words(question), self.words(context)
        c = c[: max_length - len(q) - 3]  # truncation="only_second" (never reached here)
        ids = [CLS] + [WORD_ID.get(w, UNK) for w, _, _ in q] + [SEP] + [WORD_ID.get(w, UNK) for w, _, _ in c] + [SEP]
        offsets = [(0, 0)] + [(s, e) for _, s, e in q] + [(0, 0)] + [(s, e) for _, s, e in c] + [(0, 0)]
        seq = [None] + [0] * len(q) + [None] + [1] * len(c) + [None]
        return {"input_ids": ids, "token_type_ids": [0] * (len(q) + 2) + [1] * (len(c) + 1),
                "attention_mask": [1] * len(ids), "offset_mapping": offsets, "sequence_ids": seq}  # fmt: skip


def prepare_train_features(examples: dict[str, list], tokenizer: WordTokenizer, args, variant: str) -> list[dict]:
    features = []
    for i, (question, context) in enumerate(zip(examples["question"], examples["context"])):
        question = question.lstrip()
        enc = tokenizer(question, context, args.max_seq_length)
        input_ids, offsets, sequence_ids = enc["input_ids"], enc["offset_mapping"], enc["sequence_ids"]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        answers = examples["answers"][i]
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        token_start_index = 0
        while sequence_ids[token_start_index] != 1:
            token_start_index += 1
        token_end_index = len(input_ids) - 1
        while sequence_ids[token_end_index] != 1:
            token_end_index -= 1
        if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
            start_position = end_position = cls_index
        else:
            while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
                token_start_index += 1
            start_position = token_start_index - 1
            while offsets[token_end_index][1] >= end_char:
                token_end_index -= 1
            end_position = token_end_index + 1
        if variant == "positions_in_context_tokens":  # the answer's index among the context's words
            context_start = sequence_ids.index(1)
            start_position, end_position = start_position - context_start, end_position - context_start
        features.append({"input_ids": input_ids, "token_type_ids": enc["token_type_ids"],
                         "attention_mask": enc["attention_mask"], "start_positions": start_position,
                         "end_positions": end_position})  # fmt: skip
    return features


def prepare_validation_features(examples: dict[str, list], tokenizer: WordTokenizer, args) -> list[dict]:
    features = []
    for i, (question, context) in enumerate(zip(examples["question"], examples["context"])):
        enc = tokenizer(question.lstrip(), context, args.max_seq_length)
        offsets = [o if s == 1 else None for o, s in zip(enc["offset_mapping"], enc["sequence_ids"])]
        features.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                         "attention_mask": enc["attention_mask"], "example_id": examples["id"][i],
                         "offset_mapping": offsets})  # fmt: skip
    return features


MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")


def collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """``DataCollatorWithPadding``: pad to the batch's longest feature."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        t = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            t[i, : len(f[key])] = torch.tensor(f[key])
        batch[key] = t
    for key in ("start_positions", "end_positions"):
        if key in features[0]:
            batch[key] = torch.tensor([f[key] for f in features])
    return batch


def batches(features: list[dict], batch_size: int, shuffle: bool, rng: random.Random | None = None) -> list[dict]:
    order = list(range(len(features)))
    if shuffle:
        rng.shuffle(order)
    return [collate([{k: features[j][k] for k in MODEL_KEYS if k in features[j]} for j in order[i : i + batch_size]])
            for i in range(0, len(order), batch_size)]  # fmt: skip


# --------------------------------------------------------------------------- utils_qa.py and the squad metric


def postprocess_qa_predictions(examples, features, predictions, n_best_size: int = 20,
                               max_answer_length: int = 30) -> dict[str, str]:  # fmt: skip
    all_start_logits, all_end_logits = predictions
    if len(all_start_logits) != len(features):
        raise ValueError(f"Got {len(all_start_logits)} predictions and {len(features)} features.")
    example_id_to_index = {k: i for i, k in enumerate(examples["id"])}
    features_per_example = collections.defaultdict(list)
    for i, feature in enumerate(features):
        features_per_example[example_id_to_index[feature["example_id"]]].append(i)
    all_predictions = collections.OrderedDict()
    for example_index, example_id in enumerate(examples["id"]):
        prelim = []
        for feature_index in features_per_example[example_index]:
            start_logits, end_logits = all_start_logits[feature_index], all_end_logits[feature_index]
            offset_mapping = features[feature_index]["offset_mapping"]
            start_indexes = np.argsort(start_logits)[-1 : -n_best_size - 1 : -1].tolist()
            end_indexes = np.argsort(end_logits)[-1 : -n_best_size - 1 : -1].tolist()
            for s in start_indexes:
                for e in end_indexes:
                    if s >= len(offset_mapping) or e >= len(offset_mapping) or offset_mapping[s] is None \
                            or offset_mapping[e] is None:  # fmt: skip
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append({"offsets": (offset_mapping[s][0], offset_mapping[e][1]),
                                   "score": start_logits[s] + end_logits[e]})  # fmt: skip
        preds = sorted(prelim, key=lambda x: x["score"], reverse=True)[:n_best_size]
        context = examples["context"][example_index]
        for pred in preds:
            pred["text"] = context[pred["offsets"][0] : pred["offsets"][1]]
        if len(preds) == 0 or (len(preds) == 1 and preds[0]["text"] == ""):
            preds.insert(0, {"text": "empty", "score": 0.0})
        all_predictions[example_id] = preds[0]["text"]
    return all_predictions


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(predictions: dict[str, str], examples: dict[str, list]) -> float:
    hits = [max(float(normalize_answer(predictions[i]) == normalize_answer(t)) for t in a["text"])
            for i, a in zip(examples["id"], examples["answers"])]  # fmt: skip
    return float(np.mean(hits))


def create_and_fill_np_array(start_or_end_logits: list[np.ndarray], dataset: list, max_len: int) -> np.ndarray:
    step = 0
    logits_concat = np.full((len(dataset), max_len), -100, dtype=np.float64)
    for output_logit in start_or_end_logits:
        batch_size, cols = output_logit.shape
        if step + batch_size < len(dataset):
            logits_concat[step : step + batch_size, :cols] = output_logit
        else:
            logits_concat[step:, :cols] = output_logit[: len(dataset) - step]
        step += batch_size
    return logits_concat


# --------------------------------------------------------------------------- main()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import BertConfig, BertForQuestionAnswering, get_scheduler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    args = Args()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # set_seed(args.seed)
    raw_train = make_examples(N_TRAIN, seed, "train-")
    eval_examples = make_examples(N_EVAL, seed + 1000, "eval-")
    tokenizer = WordTokenizer()

    config = BertConfig(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=args.max_seq_length,
                        initializer_range=0.1, pad_token_id=PAD)  # fmt: skip
    model = BertForQuestionAnswering(config)  # "Training new model from scratch"

    train_dataset = prepare_train_features(raw_train, tokenizer, args, variant)
    eval_dataset = prepare_validation_features(eval_examples, tokenizer, args)
    # nndx's val loss needs labels: the validation examples labelled by the same function as the train ones
    for feature, labelled in zip(eval_dataset, prepare_train_features(eval_examples, tokenizer, args, variant)):
        feature["start_positions"], feature["end_positions"] = labelled["start_positions"], labelled["end_positions"]
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
    num_warmup_steps = int(args.warmup_ratio * max_train_steps)
    horizon = args.num_train_epochs if variant == "schedule_sized_in_epochs" else max_train_steps
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                                 num_training_steps=horizon)  # fmt: skip

    first_batch = batches(train_dataset[: args.per_device_train_batch_size], args.per_device_train_batch_size,
                          shuffle=False)[0]  # fmt: skip
    all_train = collate([{k: f[k] for k in MODEL_KEYS} for f in train_dataset])
    nx.preflight(model, first_batch, None, optimizer=optimizer,
                 data=(all_train["input_ids"], all_train["start_positions"]))  # fmt: skip
    mon = nx.monitor(model, optimizer, every=10)

    def evaluate() -> tuple[float, float]:
        model.eval()
        all_start_logits, all_end_logits, losses = [], [], []
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(float(outputs.loss) * len(batch["input_ids"]))
            all_start_logits.append(outputs.start_logits.cpu().numpy())
            all_end_logits.append(outputs.end_logits.cpu().numpy())
        max_len = max(x.shape[1] for x in all_start_logits)
        start = create_and_fill_np_array(all_start_logits, eval_dataset, max_len)
        end = create_and_fill_np_array(all_end_logits, eval_dataset, max_len)
        predictions = postprocess_qa_predictions(eval_examples, eval_dataset, (start, end), args.n_best_size,
                                                 args.max_answer_length)  # fmt: skip
        return exact_match(predictions, eval_examples), sum(losses) / len(eval_dataset)

    completed_steps = 0
    train_losses: list[float] = []
    lrs: list[float] = []
    em = eval_loss = float("nan")
    for _epoch in range(args.num_train_epochs):
        model.train()
        train_dataloader = batches(train_dataset, args.per_device_train_batch_size, shuffle=True, rng=loader_rng)
        epoch_losses = []
        for _step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_losses.append(loss.item())
            epoch_losses.append(loss.item())
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1
            lrs.append(optimizer.param_groups[0]["lr"])
            if completed_steps >= max_train_steps:
                break
        em, eval_loss = evaluate()
        nx.timed(lambda: mon.log(eval_loss, split="val", accuracy=em))  # noqa: B023

    nx.finish(mon, model, first_batch, None, optimizer=optimizer,
              data=(all_train["input_ids"], all_train["start_positions"]))  # fmt: skip
    return {
        "exact_match": em,
        "eval_loss": eval_loss,
        "first_train_loss": float(np.mean(train_losses[:20])),
        "final_train_loss": float(np.mean(train_losses[-20:])),
        "max_lr": max(lrs),
        "final_lr": lrs[-1],
        "completed_steps": float(completed_steps),
    }
