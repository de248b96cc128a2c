"""Port of Stanford Alpaca's supervised fine-tuning script (``train.py``: instruction / input /
output records formatted with the Alpaca prompt, the prompt's tokens masked with
``IGNORE_INDEX`` in the labels, a padding collator, a causal LM that computes its own loss
from ``labels``, trained by the Hugging Face ``Trainer``).

Source: github.com/tatsu-lab/stanford_alpaca, ``train.py`` at commit
761dc5bfbdeeffa89b8bff5d038781a4055f796a (Apache-2.0, Copyright 2023 Rohan Taori, Ishaan
Gulrajani, Tianyi Zhang, Yann Dubois, Xuechen Li), with the hyperparameters of its README's
LLaMA-7B command. Written anew from the facts of those files; no code copied.

Kept: ``IGNORE_INDEX = -100``; ``PROMPT_DICT``'s two templates (``prompt_input`` when the
record has an input, ``prompt_no_input`` otherwise) and the target ``f"{output}{eos_token}"``;
``smart_tokenizer_and_embedding_resize`` (a missing pad token added as ``[PAD]``,
``model.resize_token_embeddings(len(tokenizer))``, the new rows of the input and output
embeddings set to the mean of the old ones); ``_tokenize_fn`` (each string tokenized alone
with ``padding="longest"``, ``max_length=model_max_length``, ``truncation=True``; its length
counted as the tokens that are not the pad id); ``preprocess`` (source + target tokenized,
``labels = copy.deepcopy(input_ids)``, ``label[:source_len] = IGNORE_INDEX``);
``SupervisedDataset``; ``DataCollatorForSupervisedDataset`` (``pad_sequence`` of the ids with
the pad id and of the labels with ``IGNORE_INDEX``, ``attention_mask = input_ids.ne(pad)``);
the tokenizer loaded with ``padding_side="right"`` (a LLaMA tokenizer: BOS added in front, no
pad token); ``Trainer(model=model, processing_class=tokenizer, args=training_args,
train_dataset=..., eval_dataset=None, data_collator=...)``, ``trainer.train()``,
``save_state``, ``save_model``; the README's ``num_train_epochs 3``, ``eval_strategy
"no"``, ``weight_decay 0.``, warmup ratio 0.03 (``warmup_steps=0.03`` in transformers 5),
``lr_scheduler_type "cosine"``, ``logging_steps 1``, ``optim "adamw_torch"`` (the script's
``TrainingArguments`` default).
Shrunk: no checkpoint, tokenizer or data download: a ``LlamaForCausalLM`` built from a
``LlamaConfig`` (hidden 64, 2 layers, 4 heads, MLP 176, ``max_position_embeddings`` 64,
untied output head as LLaMA's) with random init stands for ``from_pretrained`` of LLaMA-7B;
a word-level ``PreTrainedTokenizerFast`` (``tokenizers`` ``WordLevel`` + ``Whitespace``,
a ``TemplateProcessing`` that puts ``<s>`` in front; unk, bos, eos, no pad) for the LLaMA
tokenizer; ``model_max_length`` 64 instead of 512; 2,048 synthetic instruction records
(translate a word to French, repeat a word, give the next number, with an input; count to a
number, without one) instead of the 52k of ``alpaca_data.json`` (built in memory, not read
by ``utils.jload``); ``per_device_train_batch_size`` 8 and ``gradient_accumulation_steps`` 1
(768 optimizer steps) instead of 4 x 8 on 4 GPUs; ``learning_rate`` 3e-3 instead of 2e-5
(the model starts from scratch); one CPU process instead of FSDP, float32 instead of
bf16/tf32, ``save_strategy "no"`` instead of every 2,000 steps, ``report_to "none"``, the
Trainer's per-step log printer removed (the original shows a progress bar).
Measure only (not in the program; Alpaca sets no eval set): on 256 held-out records
formatted with the program's own (healthy) tokenizer, teacher forcing over each response
(its tokens and the closing ``</s>``): the cross-entropy, the argmax's token accuracy, its
accuracy on the response's first token, and exact match (every response token right).

nndx, as the author would add it: the program trains through the Hugging Face ``Trainer``,
so the author adds nndx's own Trainer callback, ``NndxCallback(every=10, preflight=True)``
(the probes on the first ``per_device_train_batch_size`` training records collated by the
program's collator, with the loss the model computes from ``labels``; the Monitor on the
model and the Trainer's optimizer; the train loss of each logging step); its report
(``callback.report``) is diagnosed after ``trainer.train()``.
"""

from __future__ import annotations

import copy
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "alpaca"
SOURCE = Source("tatsu-lab/stanford_alpaca", "train.py", "761dc5bfbdeeffa89b8bff5d038781a4055f796a", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: a tiny LLaMA from a config, synthetic instructions)"),
        Variant(
            "source_len_counts_eos",
            "the tokenizer built with add_eos_token=True (a '</s>' appended to every encoding, the usual advice for "
            "models that never stop): the source tokenized alone now ends with '</s>', so source_len is one too long "
            "and label[:source_len] = IGNORE_INDEX also masks the response's first token, never trained",
            (C.SILENT_DATA_LOSS, C.LABELS_MISALIGNED),
            ("https://github.com/tatsu-lab/stanford_alpaca/pull/229",
             "https://github.com/hpcaitech/ColossalAI/issues/4135",
             "https://github.com/huggingface/trl/issues/734"),
            Measure("first_token_accuracy", "teacher-forced accuracy on the response's first token at least 0.3 "
                    "below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "optimizer_before_resize",
            "the AdamW built from model.parameters() right after the model is loaded, before "
            "smart_tokenizer_and_embedding_resize, and handed to Trainer(optimizers=(optimizer, None)): the resize "
            "puts a new output-embedding Parameter on the model, which no optimizer steps (it keeps its init)",
            (C.OPTIMIZER_NOT_CONNECTED, C.FROZEN_PARAMETERS),
            ("https://github.com/huggingface/transformers/pull/3532",
             "https://github.com/huggingface/transformers/pull/3519"),
            Measure("eval_loss", "held-out response loss (teacher forced) at least 0.5 nats above the healthy run's: "
                    "the frozen small-init head keeps every prediction unsure (1.9 against 0.05 on seed 0) though "
                    "its argmax is right",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
    )
}

IGNORE_INDEX = -100
DEFAULT_PAD_TOKEN = "[PAD]"
DEFAULT_EOS_TOKEN = "</s>"
DEFAULT_BOS_TOKEN = "<s>"
DEFAULT_UNK_TOKEN = "<unk>"
PROMPT_DICT = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}

# the README's LLaMA-7B command, shrunk where the docstring says
num_train_epochs = 3
per_device_train_batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 3e-3
weight_decay = 0.0
warmup_ratio = 0.03
lr_scheduler_type = "cosine"
logging_steps = 1
model_max_length = 64
N_TRAIN, N_EVAL = 2048, 256

# --------------------------------------------------------------------------- the data and the tokenizer (offline)

WORDS = "cat dog fish bird frog goat apple pear plum lemon grape peach".split()
FRENCH = "chat chien poisson oiseau grenouille chevre pomme poire prune citron raisin peche".split()
NUMBERS = "one two three four five six seven eight".split()
TASKS = ("Translate the word to French.", "Repeat the word.", "Give the next number.", "Count to")


def records(n: int, seed: int) -> list[dict[str, str]]:
    """``alpaca_data.json``'s shape: instruction, input (may be empty), output."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = rng.choice(TASKS)
        if task == TASKS[0]:
            i = rng.randrange(len(WORDS))
            out.append({"instruction": task, "input": WORDS[i], "output": FRENCH[i] + "."})
        elif task == TASKS[1]:
            word = rng.choice(WORDS + NUMBERS)
            out.append({"instruction": task, "input": word, "output": word + "."})
        elif task == TASKS[2]:
            i = rng.randrange(len(NUMBERS) - 1)
            out.append({"instruction": task, "input": NUMBERS[i], "output": NUMBERS[i + 1] + "."})
        else:
            k = rng.randint(2, len(NUMBERS))
            out.append({"instruction": f"Count to {NUMBERS[k - 1]}.", "input": "",
                        "output": " ".join(NUMBERS[:k]) + "."})  # fmt: skip
    return out


def _vocabulary() -> list[str]:
    words = [DEFAULT_UNK_TOKEN, DEFAULT_BOS_TOKEN, DEFAULT_EOS_TOKEN, "###", ":", ".", ","]
    text = " ".join(PROMPT_DICT.values()) + " " + " ".join(TASKS)
    for w in text.replace(".", " ").replace(",", " ").replace(":", " ").split():
        if w not in words and "{" not in w:
            words.append(w)
    for w in WORDS + FRENCH + NUMBERS:
        if w not in words:
            words.append(w)
    return words


def load_tokenizer(add_eos_token: bool = False):
    """``AutoTokenizer.from_pretrained(..., padding_side="right", use_fast=False)`` of a LLaMA
    checkpoint, offline: BOS in front (and ``</s>`` at the end with ``add_eos_token``), unk,
    bos and eos tokens, no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(_vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=DEFAULT_UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    bos, eos = vocab[DEFAULT_BOS_TOKEN], vocab[DEFAULT_EOS_TOKEN]
    single = "<s> $A </s>" if add_eos_token else "<s> $A"
    backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<s>", bos), ("</s>", eos)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=DEFAULT_BOS_TOKEN, eos_token=DEFAULT_EOS_TOKEN,
                                   unk_token=DEFAULT_UNK_TOKEN, model_max_length=model_max_length,
                                   padding_side="right")  # fmt: skip


# --------------------------------------------------------------------------- train.py


def smart_tokenizer_and_embedding_resize(special_tokens_dict: dict, tokenizer, model) -> None:
    num_new_tokens = tokenizer.add_special_tokens(special_tokens_dict)
    model.resize_token_embeddings(len(tokenizer))
    if num_new_tokens > 0:
        input_embeddings = model.get_input_embeddings().weight.data
        output_embeddings = model.get_output_embeddings().weight.data
        input_embeddings[-num_new_tokens:] = input_embeddings[:-num_new_tokens].mean(dim=0, keepdim=True)
        output_embeddings[-num_new_tokens:] = output_embeddings[:-num_new_tokens].mean(dim=0, keepdim=True)


def _tokenize_fn(strings: Sequence[str], tokenizer) -> dict:
    tokenized_list = [
        tokenizer(text, return_tensors="pt", padding="longest", max_length=tokenizer.model_max_length, truncation=True)
        for text in strings
    ]
    input_ids = labels = [tokenized.input_ids[0] for tokenized in tokenized_list]
    input_ids_lens = labels_lens = [tokenized.input_ids.ne(tokenizer.pad_token_id).sum().item()
                                    for tokenized in tokenized_list]  # fmt: skip
    return dict(input_ids=input_ids, labels=labels, input_ids_lens=input_ids_lens, labels_lens=labels_lens)


def preprocess(sources: Sequence[str], targets: Sequence[str], tokenizer) -> dict:
    examples = [s + t for s, t in zip(sources, targets)]
    examples_tokenized, sources_tokenized = [_tokenize_fn(strings, tokenizer) for strings in (examples, sources)]
    input_ids = examples_tokenized["input_ids"]
    labels = copy.deepcopy(input_ids)
    for label, source_len in zip(labels, sources_tokenized["input_ids_lens"]):
        label[:source_len] = IGNORE_INDEX
    return dict(input_ids=input_ids, labels=labels)


def format_records(list_data_dict: list[dict[str, str]], tokenizer) -> tuple[list[str], list[str]]:
    prompt_input, prompt_no_input = PROMPT_DICT["prompt_input"], PROMPT_DICT["prompt_no_input"]
    sources = [prompt_input.format_map(example) if example.get("input", "") != "" else prompt_no_input.format_map(example)
               for example in list_data_dict]  # fmt: skip
    targets = [f"{example['output']}{tokenizer.eos_token}" for example in list_data_dict]
    return sources, targets


class SupervisedDataset(torch.utils.data.Dataset):
    def __init__(self, list_data_dict: list[dict[str, str]], tokenizer) -> None:
        super().__init__()
        sources, targets = format_records(list_data_dict, tokenizer)  # utils.jload(data_path) in the original
        data_dict = preprocess(sources, targets, tokenizer)
        self.input_ids = data_dict["input_ids"]
        self.labels = data_dict["labels"]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return dict(input_ids=self.input_ids[i], labels=self.labels[i])


@dataclass
class DataCollatorForSupervisedDataset:
    tokenizer: object

    def __call__(self, instances: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids, labels = tuple([instance[key] for instance in instances] for key in ("input_ids", "labels"))
        input_ids = torch.nn.utils.rnn.pad_sequence(input_ids, batch_first=True,
                                                    padding_value=self.tokenizer.pad_token_id)  # fmt: skip
        labels = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX)
        return dict(input_ids=input_ids, labels=labels, attention_mask=input_ids.ne(self.tokenizer.pad_token_id))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, PrinterCallback, Trainer, TrainingArguments

    transformers.utils.logging.set_verbosity_error()
    output_dir = tempfile.mkdtemp(prefix="nndx-alpaca-")
    try:
        training_args = TrainingArguments(
            output_dir=output_dir, num_train_epochs=num_train_epochs,
            per_device_train_batch_size=per_device_train_batch_size, per_device_eval_batch_size=4,
            gradient_accumulation_steps=gradient_accumulation_steps, eval_strategy="no", save_strategy="no",
            learning_rate=learning_rate, weight_decay=weight_decay, warmup_steps=warmup_ratio,
            lr_scheduler_type=lr_scheduler_type, logging_steps=logging_steps, optim="adamw_torch", seed=42 + seed,
            report_to="none", use_cpu=True, disable_tqdm=True, dataloader_pin_memory=False,
        )  # fmt: skip

        torch.manual_seed(seed)
        base_vocab = len(_vocabulary())
        config = LlamaConfig(vocab_size=base_vocab, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=model_max_length,
                             rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)  # fmt: skip
        model = LlamaForCausalLM(config)  # AutoModelForCausalLM.from_pretrained(model_name_or_path)
        optimizers = (None, None)
        if variant == "optimizer_before_resize":
            optimizers = (torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay), None)

        tokenizer = load_tokenizer(add_eos_token=variant == "source_len_counts_eos")
        special_tokens_dict = dict()
        if tokenizer.pad_token is None:
            special_tokens_dict["pad_token"] = DEFAULT_PAD_TOKEN
        if tokenizer.eos_token is None:
            special_tokens_dict["eos_token"] = DEFAULT_EOS_TOKEN
        if tokenizer.bos_token is None:
            special_tokens_dict["bos_token"] = DEFAULT_BOS_TOKEN
        if tokenizer.unk_token is None:
            special_tokens_dict["unk_token"] = DEFAULT_UNK_TOKEN
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            smart_tokenizer_and_embedding_resize(special_tokens_dict, tokenizer, model)

        train_dataset = SupervisedDataset(records(N_TRAIN, seed), tokenizer)
        data_collator = DataCollatorForSupervisedDataset(tokenizer=tokenizer)

        callbacks = []
        callback = None
        if nx.enabled:
            from nndx.integrations.hf import NndxCallback

            callback = NndxCallback(every=10, preflight=True)
            callbacks.append(callback)

        trainer = Trainer(model=model, processing_class=tokenizer, args=training_args, train_dataset=train_dataset,
                          eval_dataset=None, data_collator=data_collator, optimizers=optimizers,
                          callbacks=callbacks)  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # the per-step log lines (tqdm's bar in the original): no print here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = trainer.train()
            trainer.save_state()
            trainer.save_model(output_dir=training_args.output_dir)

        if callback is not None:
            _diagnose_callback(nx, callback)

        metrics = evaluate(model, seed)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        metrics.update(train_loss=float(result.training_loss), final_train_loss=sum(losses[-10:]) / 10,
                       steps=float(trainer.state.global_step))  # fmt: skip
        return metrics
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)


def _diagnose_callback(nx: Nndx, callback) -> None:
    """The author reads ``nndx.diagnose(callback.report)``; recorded like the harness records its calls."""
    import nndx

    started = time.perf_counter()
    try:
        report = callback.report
        nx.final_diagnoses.append(nndx.diagnose(report))
        nx._note_report_errors("final", report.errors)
    except Exception as exc:  # noqa: BLE001
        text = str(exc).strip().splitlines()
        nx.errors.append(f"final diagnose raised {type(exc).__name__}: {text[0][:160] if text else ''}")
    finally:
        nx.seconds += time.perf_counter() - started


@torch.no_grad()
def evaluate(model, seed: int) -> dict[str, float]:
    """Measure only: teacher-forced argmax on held-out records in the healthy format."""
    tokenizer = load_tokenizer(add_eos_token=False)
    tokenizer.add_special_tokens({"pad_token": DEFAULT_PAD_TOKEN})
    sources, targets = format_records(records(N_EVAL, seed + 5000), tokenizer)
    data = preprocess(sources, targets, tokenizer)
    batch = DataCollatorForSupervisedDataset(tokenizer)([dict(input_ids=i, labels=l)
                                                        for i, l in zip(data["input_ids"], data["labels"])])  # fmt: skip
    model.eval()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    pred = logits[:, :-1].argmax(-1)
    labels = batch["labels"][:, 1:]
    scored = labels != IGNORE_INDEX
    right = (pred == labels) & scored
    first = scored.float().argmax(1)  # the first scored position of each row
    rows = torch.arange(labels.size(0))
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, ignore_index=IGNORE_INDEX)
    return {
        "eval_loss": float(nll),
        "token_accuracy": float(right.sum() / scored.sum()),
        "first_token_accuracy": float(right[rows, first].float().mean()),
        "exact_match": float((right | ~scored).all(1).float().mean()),
    }
