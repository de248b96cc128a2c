"""Port of rasbt/LLMs-from-scratch chapter 7: instruction fine-tuning a GPT on Alpaca-style
instruction/response pairs with a padding-aware collate function and the book's simple training loop.

Source: github.com/rasbt/LLMs-from-scratch, ``ch07/01_main-chapter-code/ch07.ipynb`` and
``ch07/01_main-chapter-code/previous_chapters.py`` at commit 28c65cdfbc3338e2e040016eea4b7fdf556e4d57
(Apache-2.0, Copyright Sebastian Raschka). Written anew from the facts of those files; no code copied.

Kept: ``format_input`` (the Alpaca preamble "Below is an instruction that describes a task. ...",
"### Instruction:", an "### Input:" section only when the entry has an input) and the response
appended as "\\n\\n### Response:\\n" + output; the 85% / 10% / 5% train / test / val split in the
data's order; ``InstructionDataset`` (pre-tokenised full texts); ``custom_collate_fn`` (the batch's
longest item + 1, each item + one ``<|endoftext|>`` then padded with it, inputs ``padded[:-1]``,
targets ``padded[1:]``, every padding position in the targets after the first replaced by
``ignore_index`` -100, ``allowed_max_length`` 1024 via ``functools.partial``); the loaders (batch 8,
train shuffled with ``drop_last``, val/test in order, ``torch.manual_seed(123)`` before them);
``GPTModel`` of ``previous_chapters.py`` (:mod:`bench.programs.llm_book_gpt`, shared with the ch06 port:
token + position embeddings, dropout, pre-LayerNorm
``TransformerBlock`` s with the book's ``MultiHeadAttention`` (causal mask by ``masked_fill_`` with
-inf, scaled softmax, heads split by ``view`` + ``transpose``), ``LayerNorm`` with ``scale``/``shift``,
the tanh ``GELU``, ``FeedForward`` 4x, shortcut connections, final norm, ``out_head`` without bias),
``qkv_bias`` True and ``drop_rate`` 0.0 as in ``BASE_CONFIG``; ``calc_loss_batch``
(``cross_entropy(logits.flatten(0, 1), target_batch.flatten())``), ``calc_loss_loader``,
``evaluate_model`` (eval mode, ``eval_iter`` batches of each loader), ``train_model_simple``
(``zero_grad``, loss, ``backward``, ``step``, tokens seen, an evaluation every ``eval_freq`` steps,
``generate_and_print_sample`` after each epoch), ``generate`` with ``eos_id`` and
``generate_text_simple``; ``AdamW(weight_decay=0.1)``, ``eval_freq=5``, ``eval_iter=5``,
``torch.manual_seed(123)`` before the optimizer; after training, the notebook's test loop (greedy
``generate`` from ``format_input(entry)`` with ``eos_id``, the response text after the prompt with
"### Response:" stripped).
Shrunk / replaced: the 1,100 entries of ``instruction-data.json`` are replaced by 600 entries
generated here from seven small task templates (plurals, opposites, capitals, sorting digits,
reversing words, repeating a word, counting words), deterministic by seed; tiktoken's GPT-2 BPE by
a word-level tokenizer written here (words, digits, punctuation and newlines as tokens, spaces
dropped) whose last id is ``<|endoftext|>``, as 50256 is GPT-2's; GPT-2 medium with OpenAI's
weights by a randomly initialised GPT of the same code (``emb_dim`` 64, 2 layers, 4 heads,
``context_length`` 128); so the lr is 1e-3 instead of 5e-5 (a fine-tuning rate for pretrained
weights moves a random model nowhere in a few hundred steps) and 4 epochs instead of 2; CPU;
nothing printed; at most 20 new tokens per test response instead of 256; the test responses are
scored by exact match (the generated tokens after the prompt equal the response's, generation
stopped by <|endoftext|>) instead of by Llama 3 via Ollama.
Measure only (not in the program): on the test split, the next-token loss of the response tokens
and the <|endoftext|> after them (correct targets, teacher forcing), the fraction of test entries
whose greedy next token after the full response is <|endoftext|>, and the exact-match rate of the
generated responses.

nndx, as the author would add it after reading the README: a preflight ``nndx.probe`` of the
model on the first training batch with the loss of ``calc_loss_batch`` as ``loss_fn(logits,
targets)`` and the AdamW; ``nndx.Monitor(model, optimizer, every=10)`` passed into
``train_model_simple``, each step's loss logged after ``optimizer.step()`` and each evaluation's
val loss logged as ``split="val"``; after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random
import re
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.llm_book_gpt import GPTModel
from nndx.report import CauseCode as C

NAME = "llm_instruction_finetune"
SOURCE = Source("rasbt/LLMs-from-scratch", "ch07/01_main-chapter-code/ch07.ipynb",
                "28c65cdfbc3338e2e040016eea4b7fdf556e4d57", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter as published (shrunk: generated instructions, word tokenizer, tiny GPT)"),
        Variant(
            "targets_not_shifted",
            "custom_collate_fn builds the targets from padded[:-1], the same slice as the inputs, instead of "
            "padded[1:]: every position is trained to predict the token it already sees (the current token, "
            "not the next one), which the causal model learns at once; generation then repeats the last token",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/macrocosm-os/pretraining/pull/64",
             "https://github.com/huggingface/transformers/issues/3711",
             "https://github.com/huggingface/transformers/pull/44642"),
            Measure("test_response_loss", "test response next-token loss at least 1 nat above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 1.0),
        ),
        Variant(
            "eos_target_masked",
            "custom_collate_fn replaces every padding position of the targets with -100, the first one included "
            "(targets[indices] instead of targets[indices[1:]]): the <|endoftext|> that ends each response is "
            "never a target, so the model never learns to stop and generation runs on past the response",
            (C.SILENT_DATA_LOSS,),
            ("https://github.com/mlabonne/llm-course/issues/33",
             "https://github.com/huggingface/trl/issues/1623",
             "https://github.com/meta-pytorch/torchtune/issues/949"),
            Measure("eos_after_response", "fraction of test entries whose greedy next token after the response is "
                    "<|endoftext|> at least 0.5 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.5),
        ),
    )
}

N_ENTRIES, BATCH_SIZE, NUM_EPOCHS, LR, EVAL_FREQ, EVAL_ITER = 600, 8, 4, 1e-3, 5, 5
GPT_CONFIG = {"context_length": 128, "drop_rate": 0.0, "qkv_bias": True, "emb_dim": 64, "n_layers": 2, "n_heads": 4}
EOT = "<|endoftext|>"

# --------------------------------------------------------------------------- instruction-data.json, replaced

_PLURALS = {"cat": "cats", "dog": "dogs", "mouse": "mice", "child": "children", "box": "boxes", "city": "cities",
            "leaf": "leaves", "tooth": "teeth", "man": "men", "bus": "buses", "knife": "knives", "baby": "babies",
            "goose": "geese", "tomato": "tomatoes", "story": "stories", "wolf": "wolves", "foot": "feet",
            "party": "parties", "glass": "glasses", "person": "people"}  # fmt: skip
_OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "early": "late",
              "old": "young", "strong": "weak", "rich": "poor", "open": "closed", "high": "low", "full": "empty",
              "hard": "soft", "loud": "quiet", "wet": "dry", "clean": "dirty", "near": "far", "true": "false"}  # fmt: skip
_CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Egypt": "Cairo",
             "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo", "Greece": "Athens",
             "Chile": "Santiago", "Cuba": "Havana", "Poland": "Warsaw", "Ireland": "Dublin", "Austria": "Vienna",
             "Portugal": "Lisbon"}  # fmt: skip
_WORDS = ("red", "blue", "green", "apple", "river", "stone", "cloud", "tiger", "piano", "lamp", "road", "bread",
          "music", "garden", "window", "sun", "moon", "chair", "book", "bird")  # fmt: skip


def make_entries(n: int, seed: int) -> list[dict[str, str]]:
    """Alpaca-style entries (instruction, input, output) from seven templates, some with an input."""
    rng = random.Random(seed)
    entries = []
    for _ in range(n):
        kind = rng.randrange(7)
        if kind == 0:
            word = rng.choice(list(_PLURALS))
            e = ("Convert the following noun into its plural form.", word, f"The plural form of {word} is "
                 f"{_PLURALS[word]}.")  # fmt: skip
        elif kind == 1:
            word = rng.choice(list(_OPPOSITES))
            e = (f"What is the opposite of {word}?", "", f"The opposite of {word} is {_OPPOSITES[word]}.")
        elif kind == 2:
            country = rng.choice(list(_CAPITALS))
            e = (f"What is the capital of {country}?", "", f"The capital of {country} is {_CAPITALS[country]}.")
        elif kind == 3:
            digits = [str(d) for d in rng.sample(range(10), rng.randint(3, 5))]
            e = ("Sort the following numbers in ascending order.", ", ".join(digits),
                 ", ".join(sorted(digits)))  # fmt: skip
        elif kind == 4:
            words = rng.sample(_WORDS, rng.randint(2, 4))
            e = ("Reverse the order of the following words.", " ".join(words), " ".join(reversed(words)))
        elif kind == 5:
            word = rng.choice(_WORDS)
            e = (f"Repeat the word {word} three times.", "", f"{word} {word} {word}")
        else:
            words = rng.sample(_WORDS, rng.randint(2, 6))
            e = ("Count the words in the following sentence.", " ".join(words), f"There are {len(words)} words.")
        entries.append({"instruction": e[0], "input": e[1], "output": e[2]})
    return entries


class WordTokenizer:
    """A word-level stand-in for tiktoken's GPT-2 encoding: words, digits, punctuation and newlines are
    tokens, spaces are dropped; ``<|endoftext|>`` is the last id (as 50256 is GPT-2's)."""

    _pattern = re.compile(r"<\|endoftext\|>|\n|[A-Za-z]+|\d|[^\sA-Za-z\d]")

    def __init__(self, texts: list[str]) -> None:
        vocab = sorted({t for text in texts for t in self._pattern.findall(text)} - {EOT})
        self.itos = vocab + [EOT]
        self.stoi = {s: i for i, s in enumerate(self.itos)}

    def encode(self, text: str, allowed_special: set[str] | None = None) -> list[int]:
        return [self.stoi[t] for t in self._pattern.findall(text)]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.itos[i] for i in ids).replace(" \n ", "\n").replace(" \n", "\n").replace("\n ", "\n")

    @property
    def n_vocab(self) -> int:
        return len(self.itos)


# --------------------------------------------------------------------------- ch07.ipynb: data


def format_input(entry: dict[str, str]) -> str:
    instruction_text = (
        f"Below is an instruction that describes a task. "
        f"Write a response that appropriately completes the request."
        f"\n\n### Instruction:\n{entry['instruction']}"
    )
    input_text = f"\n\n### Input:\n{entry['input']}" if entry["input"] else ""
    return instruction_text + input_text


class InstructionDataset(Dataset):
    def __init__(self, data, tokenizer) -> None:
        self.data = data
        self.encoded_texts = []
        for entry in data:
            instruction_plus_input = format_input(entry)
            response_text = f"\n\n### Response:\n{entry['output']}"
            self.encoded_texts.append(tokenizer.encode(instruction_plus_input + response_text))

    def __getitem__(self, index):
        return self.encoded_texts[index]

    def __len__(self) -> int:
        return len(self.data)


def custom_collate_fn(batch, pad_token_id=50256, ignore_index=-100, allowed_max_length=None, device="cpu",
                      variant="healthy"):  # fmt: skip
    batch_max_length = max(len(item) + 1 for item in batch)
    inputs_lst, targets_lst = [], []
    for item in batch:
        new_item = item.copy()
        new_item += [pad_token_id]
        padded = new_item + [pad_token_id] * (batch_max_length - len(new_item))
        inputs = torch.tensor(padded[:-1])  # Truncate the last token for inputs
        if variant == "targets_not_shifted":
            targets = torch.tensor(padded[:-1])
        else:
            targets = torch.tensor(padded[1:])  # Shift +1 to the right for targets

        # Replace all but the first padding tokens in targets by ignore_index
        mask = targets == pad_token_id
        indices = torch.nonzero(mask).squeeze()
        if variant == "eos_target_masked":
            if indices.numel() > 0:
                targets[indices] = ignore_index
        elif indices.numel() > 1:
            targets[indices[1:]] = ignore_index

        if allowed_max_length is not None:
            inputs = inputs[:allowed_max_length]
            targets = targets[:allowed_max_length]
        inputs_lst.append(inputs)
        targets_lst.append(targets)
    return torch.stack(inputs_lst).to(device), torch.stack(targets_lst).to(device)


# --------------------------------------------------------------------------- previous_chapters.py: generation, loss


def generate_text_simple(model, idx, max_new_tokens, context_size):
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        idx_next = torch.argmax(logits, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def generate(model, idx, max_new_tokens, context_size, temperature=0.0, top_k=None, eos_id=None):
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        if top_k is not None:
            top_logits, _ = torch.topk(logits, top_k)
            min_val = top_logits[:, -1]
            logits = torch.where(logits < min_val, torch.tensor(float("-inf")).to(logits.device), logits)
        if temperature > 0.0:
            logits = logits / temperature
            logits = logits - logits.max(dim=-1, keepdim=True).values
            probs = torch.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
        else:
            idx_next = torch.argmax(logits, dim=-1, keepdim=True)
        if idx_next == eos_id:
            break
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def text_to_token_ids(text, tokenizer):
    return torch.tensor(tokenizer.encode(text, allowed_special={EOT})).unsqueeze(0)


def token_ids_to_text(token_ids, tokenizer):
    return tokenizer.decode(token_ids.squeeze(0).tolist())


def calc_loss_batch(input_batch, target_batch, model, device):
    input_batch, target_batch = input_batch.to(device), target_batch.to(device)
    logits = model(input_batch)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_batch.flatten())


def calc_loss_loader(data_loader, model, device, num_batches=None):
    total_loss = 0.0
    if len(data_loader) == 0:
        return float("nan")
    elif num_batches is None:
        num_batches = len(data_loader)
    else:
        num_batches = min(num_batches, len(data_loader))
    for i, (input_batch, target_batch) in enumerate(data_loader):
        if i < num_batches:
            loss = calc_loss_batch(input_batch, target_batch, model, device)
            total_loss += loss.item()
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


def generate_and_print_sample(model, tokenizer, device, start_context):
    model.eval()
    context_size = model.pos_emb.weight.shape[0]
    encoded = text_to_token_ids(start_context, tokenizer).to(device)
    with torch.no_grad():
        token_ids = generate_text_simple(model=model, idx=encoded, max_new_tokens=50, context_size=context_size)
        token_ids_to_text(token_ids, tokenizer)  # the book prints it; not printed here
    model.train()


def train_model_simple(model, train_loader, val_loader, optimizer, device, num_epochs, eval_freq, eval_iter,
                       start_context, tokenizer, nx, mon):  # fmt: skip
    train_losses, val_losses, track_tokens_seen = [], [], []
    tokens_seen, global_step = 0, -1
    for epoch in range(num_epochs):
        model.train()
        for input_batch, target_batch in train_loader:
            optimizer.zero_grad()
            loss = calc_loss_batch(input_batch, target_batch, model, device)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            tokens_seen += input_batch.numel()
            global_step += 1
            if global_step % eval_freq == 0:
                train_loss, val_loss = evaluate_model(model, train_loader, val_loader, device, eval_iter)
                train_losses.append(train_loss)
                val_losses.append(val_loss)
                track_tokens_seen.append(tokens_seen)
                nx.timed(lambda: mon.log(val_loss, split="val"))
        generate_and_print_sample(model, tokenizer, device, start_context)
    return train_losses, val_losses, track_tokens_seen


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    assert variant in VARIANTS
    torch.manual_seed(seed)
    data = make_entries(N_ENTRIES, seed)
    full_texts = [format_input(e) + f"\n\n### Response:\n{e['output']}" for e in data]
    tokenizer = WordTokenizer(full_texts)
    eos_id = tokenizer.n_vocab - 1

    train_portion = int(len(data) * 0.85)
    test_portion = int(len(data) * 0.1)
    train_data = data[:train_portion]
    test_data = data[train_portion:train_portion + test_portion]
    val_data = data[train_portion + test_portion:]

    device = torch.device("cpu")
    customized_collate_fn = partial(custom_collate_fn, pad_token_id=eos_id, device=device, allowed_max_length=1024,
                                    variant=variant)  # fmt: skip

    torch.manual_seed(123 + seed)
    train_dataset = InstructionDataset(train_data, tokenizer)
    train_loader = DataLoader(train_dataset, batch_size=BATCH_SIZE, collate_fn=customized_collate_fn, shuffle=True,
                              drop_last=True, num_workers=0)  # fmt: skip
    val_loader = DataLoader(InstructionDataset(val_data, tokenizer), batch_size=BATCH_SIZE,
                            collate_fn=customized_collate_fn, shuffle=False, drop_last=False, num_workers=0)  # fmt: skip

    cfg = dict(GPT_CONFIG, vocab_size=tokenizer.n_vocab)
    model = GPTModel(cfg)
    model.to(device)

    torch.manual_seed(123 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)

    def loss_fn(logits, target_batch):  # calc_loss_batch's loss, on the model's output
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_batch.flatten())

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
        probe_batch = next(iter(train_loader))
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    train_losses, val_losses, _ = train_model_simple(
        model, train_loader, val_loader, optimizer, device, num_epochs=NUM_EPOCHS, eval_freq=EVAL_FREQ,
        eval_iter=EVAL_ITER, start_context=format_input(val_data[0]), tokenizer=tokenizer, nx=nx, mon=mon,
    )  # fmt: skip

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    # --- measure only: the test split, scored with correct targets and by generation
    model.eval()
    resp_loss, resp_tokens, eos_hits, exact = 0.0, 0, 0, 0
    with torch.no_grad():
        for entry in test_data:
            prompt_ids = tokenizer.encode(format_input(entry) + "\n\n### Response:\n")
            full_ids = tokenizer.encode(format_input(entry) + f"\n\n### Response:\n{entry['output']}") + [eos_id]
            logits = model(torch.tensor(full_ids[:-1]).unsqueeze(0))[0]
            start = len(prompt_ids) - 1  # the position whose next token is the first response token
            targets = torch.tensor(full_ids[start + 1:])
            resp_loss += F.cross_entropy(logits[start:], targets, reduction="sum").item()
            resp_tokens += len(targets)
            eos_hits += int(logits[-1].argmax().item() == eos_id)

            token_ids = generate(model=model, idx=text_to_token_ids(format_input(entry), tokenizer).to(device),
                                 max_new_tokens=20, context_size=cfg["context_length"], eos_id=eos_id)  # fmt: skip
            prompt_len = len(tokenizer.encode(format_input(entry)))
            expected = tokenizer.encode(f"\n\n### Response:\n{entry['output']}")
            exact += int(token_ids[0, prompt_len:].tolist() == expected)  # stopped right after the response
    n = len(test_data)
    return {"val_loss": calc_loss_loader(val_loader, model, device), "final_train_eval_loss": train_losses[-1],
            "final_val_eval_loss": val_losses[-1], "test_response_loss": resp_loss / resp_tokens,
            "eos_after_response": eos_hits / n, "test_exact_match": exact / n}  # fmt: skip
