"""Port of *Build a Large Language Model (From Scratch)*, chapter 6: fine-tuning a GPT for SMS
spam classification. The GPT's vocabulary head is replaced by a 2-class ``nn.Linear``, every
parameter is frozen but the last transformer block, the final LayerNorm and the new head, and
the classifier is trained on the logits of the *last* token of each (padded) message with
``calc_loss_batch`` / ``train_classifier_simple`` and scored by ``calc_accuracy_loader``.

Source: github.com/rasbt/LLMs-from-scratch, ``ch06/01_main-chapter-code/ch06.ipynb``,
``gpt_class_finetune.py`` and ``previous_chapters.py`` (``GPTModel``, ``TransformerBlock``,
``MultiHeadAttention``, ``LayerNorm``, ``GELU``, ``FeedForward``), the tokenizer from
``ch02/01_main-chapter-code/ch02.ipynb`` (``SimpleTokenizerV2``), at commit
28c65cdfbc3338e2e040016eea4b7fdf556e4d57 (Apache-2.0, Copyright (c) Sebastian Raschka). Written
anew from the facts of those files; no code copied.

Kept: ``GPTModel`` as published (:mod:`bench.programs.llm_book_gpt`, shared with the ch07 port: token +
position embeddings, dropout, pre-LayerNorm
transformer blocks with causal multi-head attention whose mask is a registered buffer filled
with ``-inf`` through ``masked_fill_``, the tanh GELU, a 4x feed-forward, the hand-written
``LayerNorm`` with ``scale``/``shift``, ``out_head`` without bias); ``create_balanced_dataset``
(ham down-sampled to the number of spam), labels mapped ham 0 / spam 1, ``random_split`` 0.7 /
0.1 / 0.2 after a shuffle; ``SpamDataset`` (pre-tokenised texts, padded with the
``<|endoftext|>`` id to the longest training message; val and test padded/truncated to the
training ``max_length``); the loaders (batch 8, train shuffled with ``drop_last=True``, val
and test not); the fine-tuning setup cell by cell: ``requires_grad = False`` on every
parameter, ``torch.manual_seed(123)``, ``model.out_head = nn.Linear(emb_dim, 2)``, the last
transformer block and ``final_norm`` unfrozen; ``AdamW`` over ``model.parameters()`` with
``weight_decay=0.1``; ``train_classifier_simple`` exactly (per batch ``zero_grad``,
``calc_loss_batch`` = cross-entropy on ``model(x)[:, -1, :]``, ``backward``, ``step``; every
``eval_freq`` 50 steps ``evaluate_model`` over ``eval_iter`` 5 batches in eval mode; train and
val accuracy each epoch over ``eval_iter`` batches), 5 epochs; ``calc_accuracy_loader``.
Shrunk / replaced: a tiny GPT (``emb_dim`` 64, 2 layers, 2 heads, context 64, ``drop_rate``
0.0, ``qkv_bias`` True as in the chapter's GPT-2 config) at random init instead of the
downloaded GPT-2 124M, so the frozen layers are random features (nothing is downloaded); the
AdamW lr 1e-3 instead of 5e-5 (5e-5 is for pretrained 124M weights: a random 2-layer model
barely moves at it in 5 short epochs); a synthetic SMS collection of the UCI set's size (4,825 ham /
747 spam, 6-25 words each, made from word lists: the same openers for both classes, then each
word from the class's own list with p 0.40, from the other class's list with p 0.03, else from a
shared list; balanced to 747 + 747, 1,045 training messages) instead of the UCI SMS Spam Collection;
chapter 2's word tokenizer (``SimpleTokenizerV2``: the regex split, ``<|unk|>`` and
``<|endoftext|>``) over the collection's vocabulary instead of tiktoken's GPT-2 BPE; lists of
(label, text) rows instead of pandas DataFrames and CSV files; CPU.
Measure only (not in the program): the test accuracy over the whole test loader (the chapter's
``calc_accuracy_loader(test_loader, ...)``) and the train/val accuracy of the last epoch.

nndx, as the author would add it: ``loss_fn(logits, y) = cross_entropy(logits[:, -1, :], y)``,
what ``calc_loss_batch`` does after the forward (so nndx gets the GPT's full output and the
labels); a preflight ``nndx.probe(model, first_train_batch, loss_fn, optimizer=optimizer,
data=(train_x, train_y, val_x, val_y))`` after the optimizer is built; ``nndx.Monitor(model,
optimizer, every=10)`` around ``train_classifier_simple``, each batch's loss logged after
``optimizer.step()`` and the val loss logged (``split="val"``) where the chapter prints it; after
training ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.llm_book_gpt import GPTModel
from nndx.report import CauseCode as C

NAME = "llm_spam_classifier"
SOURCE = Source("rasbt/LLMs-from-scratch", "ch06/01_main-chapter-code/ch06.ipynb",
                "28c65cdfbc3338e2e040016eea4b7fdf556e4d57", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "chapter 6's classification fine-tuning as published (shrunk: tiny random-init GPT, "
                "synthetic SMS set, word tokenizer)"),
        Variant(
            "first_token_logits",
            "calc_loss_batch and calc_accuracy_loader take model(x)[:, 0, :] (the first token, the BERT [CLS] "
            "habit) instead of model(x)[:, -1, :]: under the causal mask the first position attends only to "
            "itself, so the classifier sees one word of each message",
            (C.WRONG_RESHAPE,),
            ("https://github.com/rasbt/MachineLearning-QandAI-book/issues/18",
             "https://github.com/salesforce/progen/issues/8",
             "https://github.com/huggingface/transformers/pull/7501"),
            Measure("test_acc", "test accuracy at least 15 points below the healthy run's: 51.3 against 85.3 "
                    "healthy on seed 0, 47.3 against 93.3 on seed 1",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "lr_too_high",
            "AdamW's lr set 30x too high (3e-2 instead of 1e-3) for the fine-tuned layers: the classifier "
            "stays near 50% accuracy, as reported for the chapter's full fine-tuning at 5e-5 (fixed at 5e-6)",
            (C.LR_TOO_HIGH,),
            ("https://github.com/rasbt/LLMs-from-scratch/pull/335",),
            Measure("test_acc", "test accuracy at least 15 points below the healthy run's: 50.7 against 85.3 "
                    "healthy on seed 0, 46.0 against 93.3 on seed 1",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
    )
}

N_HAM, N_SPAM = 4825, 747  # the UCI collection's counts
OWN_P, OTHER_P = 0.40, 0.03  # a word from the own class's list, from the other class's list
BATCH_SIZE, NUM_EPOCHS, EVAL_FREQ, EVAL_ITER = 8, 5, 50, 5
LR, LR_BUGGY, WEIGHT_DECAY = 1e-3, 3e-2, 0.1
BASE_CONFIG = {"context_length": 64, "drop_rate": 0.0, "qkv_bias": True, "emb_dim": 64, "n_layers": 2, "n_heads": 2}


# --------------------------------------------------------------------------- a synthetic SMS collection

OPENERS = ["hey", "hi", "ok", "so", "dear", "yo", "hello", "oh", "well", "u"]
SHARED = ["you", "the", "a", "to", "now", "today", "your", "for", "and", "is", "me", "this", "get", "at", "it",
          "we", "can", "just", "new", "call", "text", "free", "my", "in", "on", "!", ".", "?", ","]
HAM = ["lunch", "dinner", "later", "home", "mum", "sorry", "late", "meet", "tonight", "love", "miss", "class",
       "work", "bus", "pick", "up", "movie", "game", "tomorrow", "sleep", "tired", "haha", "lol", "okay", "see",
       "soon", "coffee", "shop", "need", "milk", "going", "back", "wait", "there", "nice", "thanks", "babe",
       "weekend", "plans", "train", "leaving", "office", "done", "study", "exam", "room", "gonna", "cook"]
SPAM = ["prize", "won", "winner", "claim", "cash", "urgent", "offer", "award", "guaranteed", "reply", "stop",
        "txt", "mobile", "customer", "selected", "bonus", "ringtone", "voucher", "entry", "draw", "pounds",
        "150p", "apply", "landline", "contract", "video", "camera", "chat", "sexy", "club", "tone", "service",
        "code", "expires", "valid", "delivery", "unsubscribe", "nokia", "line", "points", "holiday", "tickets"]


def sms_collection(seed: int) -> list[tuple[str, str]]:
    """(label, text) rows, "ham"/"spam", in the order of a scraped file (ham then spam, shuffled)."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, n in (("ham", N_HAM), ("spam", N_SPAM)):
        own = HAM if label == "ham" else SPAM
        other = SPAM if label == "ham" else HAM
        for _ in range(n):
            length = int(rng.integers(6, 26))
            words = [OPENERS[rng.integers(len(OPENERS))]]
            for _ in range(length - 1):
                u = rng.random()
                pool = own if u < OWN_P else other if u < OWN_P + OTHER_P else SHARED
                words.append(pool[rng.integers(len(pool))])
            rows.append((label, " ".join(words)))
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


# --------------------------------------------------------------------------- ch02: the tokenizer


class SimpleTokenizerV2:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.str_to_int = vocab
        self.int_to_str = {i: s for s, i in vocab.items()}

    def encode(self, text: str) -> list[int]:
        preprocessed = re.split(r'([,.:;?_!"()\']|--|\s)', text)
        preprocessed = [item.strip() for item in preprocessed if item.strip()]
        preprocessed = [item if item in self.str_to_int else "<|unk|>" for item in preprocessed]
        return [self.str_to_int[s] for s in preprocessed]


def build_vocab(texts: list[str]) -> dict[str, int]:
    words = sorted({item.strip() for t in texts for item in re.split(r'([,.:;?_!"()\']|--|\s)', t) if item.strip()})
    words.extend(["<|endoftext|>", "<|unk|>"])
    return {token: i for i, token in enumerate(words)}


# --------------------------------------------------------------------------- ch06: data


def create_balanced_dataset(rows: list[tuple[str, str]], rng: np.random.Generator) -> list[tuple[str, str]]:
    spam = [r for r in rows if r[0] == "spam"]
    ham = [r for r in rows if r[0] == "ham"]
    ham_subset = [ham[i] for i in rng.choice(len(ham), size=len(spam), replace=False)]
    return ham_subset + spam


def random_split(rows, train_frac, validation_frac, rng: np.random.Generator):
    rows = [rows[i] for i in rng.permutation(len(rows))]
    train_end = int(len(rows) * train_frac)
    validation_end = train_end + int(len(rows) * validation_frac)
    return rows[:train_end], rows[train_end:validation_end], rows[validation_end:]


class SpamDataset(Dataset):
    def __init__(self, rows, tokenizer, max_length=None, pad_token_id=0) -> None:
        self.data = rows
        self.encoded_texts = [tokenizer.encode(text) for _, text in self.data]
        if max_length is None:
            self.max_length = self._longest_encoded_length()
        else:
            self.max_length = max_length
            self.encoded_texts = [encoded_text[: self.max_length] for encoded_text in self.encoded_texts]
        self.encoded_texts = [encoded_text + [pad_token_id] * (self.max_length - len(encoded_text))
                              for encoded_text in self.encoded_texts]  # fmt: skip

    def __getitem__(self, index):
        encoded = self.encoded_texts[index]
        label = self.data[index][0]
        return torch.tensor(encoded, dtype=torch.long), torch.tensor(label, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.data)

    def _longest_encoded_length(self) -> int:
        return max(len(encoded_text) for encoded_text in self.encoded_texts)


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    pos = 0 if variant == "first_token_logits" else -1  # the bug: the first token's logits

    rng = np.random.default_rng(123 + seed)
    rows = sms_collection(seed)
    balanced = create_balanced_dataset(rows, rng)
    balanced = [({"ham": 0, "spam": 1}[label], text) for label, text in balanced]
    train_rows, val_rows, test_rows = random_split(balanced, 0.7, 0.1, rng)

    vocab = build_vocab([text for _, text in rows])
    tokenizer = SimpleTokenizerV2(vocab)
    pad_token_id = vocab["<|endoftext|>"]
    train_dataset = SpamDataset(train_rows, tokenizer, max_length=None, pad_token_id=pad_token_id)
    val_dataset = SpamDataset(val_rows, tokenizer, max_length=train_dataset.max_length, pad_token_id=pad_token_id)
    test_dataset = SpamDataset(test_rows, tokenizer, max_length=train_dataset.max_length, pad_token_id=pad_token_id)

    torch.manual_seed(123 + seed)
    train_loader = DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=0, drop_last=True)
    val_loader = DataLoader(val_dataset, batch_size=BATCH_SIZE, num_workers=0, drop_last=False)
    test_loader = DataLoader(test_dataset, batch_size=BATCH_SIZE, num_workers=0, drop_last=False)

    # "Load pretrained model": the tiny GPT at random init
    cfg = dict(BASE_CONFIG, vocab_size=len(vocab))
    assert train_dataset.max_length <= cfg["context_length"]
    model = GPTModel(cfg)
    model.eval()
    device = torch.device("cpu")

    for param in model.parameters():
        param.requires_grad = False
    torch.manual_seed(123 + seed)
    num_classes = 2
    model.out_head = torch.nn.Linear(in_features=cfg["emb_dim"], out_features=num_classes)
    for param in model.trf_blocks[-1].parameters():
        param.requires_grad = True
    for param in model.final_norm.parameters():
        param.requires_grad = True
    model.to(device)

    def calc_accuracy_loader(data_loader, model, device, num_batches=None):
        model.eval()
        correct_predictions, num_examples = 0, 0
        num_batches = len(data_loader) if num_batches is None else min(num_batches, len(data_loader))
        for i, (input_batch, target_batch) in enumerate(data_loader):
            if i < num_batches:
                input_batch, target_batch = input_batch.to(device), target_batch.to(device)
                with torch.no_grad():
                    logits = model(input_batch)[:, pos, :]  # Logits of last output token
                predicted_labels = torch.argmax(logits, dim=-1)
                num_examples += predicted_labels.shape[0]
                correct_predictions += (predicted_labels == target_batch).sum().item()
            else:
                break
        return correct_predictions / num_examples

    def calc_loss_batch(input_batch, target_batch, model, device):
        input_batch, target_batch = input_batch.to(device), target_batch.to(device)
        logits = model(input_batch)[:, pos, :]  # Logits of last output token
        return torch.nn.functional.cross_entropy(logits, target_batch)

    def calc_loss_loader(data_loader, model, device, num_batches=None):
        total_loss = 0.0
        if len(data_loader) == 0:
            return float("nan")
        num_batches = len(data_loader) if num_batches is None else min(num_batches, len(data_loader))
        for i, (input_batch, target_batch) in enumerate(data_loader):
            if i < num_batches:
                total_loss += calc_loss_batch(input_batch, target_batch, model, device).item()
            else:
                break
        return total_loss / num_batches

    def evaluate_model(model, train_loader, val_loader, device, eval_iter):
        model.eval()
        with torch.no_grad():
            train_loss = calc_loss_loader(train_loader, model, device, num_batches=eval_iter)
            val_loss = calc_loss_loader(val_loader, model, device, num_batches=eval_iter)
        model.train()
        return train_loss, val_loss

    def train_classifier_simple(model, train_loader, val_loader, optimizer, device, num_epochs, eval_freq,
                                eval_iter, mon):  # fmt: skip
        train_losses, val_losses, train_accs, val_accs = [], [], [], []
        examples_seen, global_step = 0, -1
        for epoch in range(num_epochs):
            model.train()
            for input_batch, target_batch in train_loader:
                optimizer.zero_grad()
                loss = calc_loss_batch(input_batch, target_batch, model, device)
                loss.backward()
                optimizer.step()
                nx.timed(lambda: mon.log(loss))  # noqa: B023
                examples_seen += input_batch.shape[0]
                global_step += 1
                if global_step % eval_freq == 0:
                    train_loss, val_loss = evaluate_model(model, train_loader, val_loader, device, eval_iter)
                    train_losses.append(train_loss)
                    val_losses.append(val_loss)
                    nx.timed(lambda: mon.log(val_loss, split="val"))  # noqa: B023
            train_accuracy = calc_accuracy_loader(train_loader, model, device, num_batches=eval_iter)
            val_accuracy = calc_accuracy_loader(val_loader, model, device, num_batches=eval_iter)
            train_accs.append(train_accuracy)
            val_accs.append(val_accuracy)
        return train_losses, val_losses, train_accs, val_accs, examples_seen

    torch.manual_seed(123 + seed)
    lr = LR_BUGGY if variant == "lr_too_high" else LR
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # what calc_loss_batch does
        return torch.nn.functional.cross_entropy(logits[:, pos, :], target)

    def stacked(dataset: SpamDataset) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor(dataset.encoded_texts, dtype=torch.long),
                torch.tensor([label for label, _ in dataset.data], dtype=torch.long))  # fmt: skip

    (x_tr, y_tr), (x_va, y_va) = stacked(train_dataset), stacked(val_dataset)
    first_batch = (x_tr[:BATCH_SIZE], y_tr[:BATCH_SIZE])
    splits = (x_tr, y_tr, x_va, y_va)
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    train_losses, val_losses, train_accs, val_accs, examples_seen = train_classifier_simple(
        model, train_loader, val_loader, optimizer, device, num_epochs=NUM_EPOCHS, eval_freq=EVAL_FREQ,
        eval_iter=EVAL_ITER, mon=mon)  # fmt: skip

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer, data=splits)

    test_accuracy = calc_accuracy_loader(test_loader, model, device)
    val_accuracy = calc_accuracy_loader(val_loader, model, device)
    return {"test_acc": 100.0 * test_accuracy, "val_acc": 100.0 * val_accuracy,
            "train_acc_last_epoch": 100.0 * train_accs[-1], "last_train_loss": train_losses[-1],
            "last_val_loss": val_losses[-1], "max_length": float(train_dataset.max_length)}  # fmt: skip
