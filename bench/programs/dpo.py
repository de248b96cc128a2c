"""Port of eric-mitchell/direct-preference-optimization: a causal LM fine-tuned by SFT, then by
DPO against a frozen copy of the SFT model (``BasicTrainer``, ``loss=dpo``).

Source: github.com/eric-mitchell/direct-preference-optimization, ``trainers.py``
(``preference_loss``, ``_get_batch_logps``, ``concatenated_inputs``, ``BasicTrainer``),
``train.py``, ``preference_datasets.py`` (``tokenize_batch_element``, ``get_collate_fn``,
``get_batch_iterator``), ``utils.py`` (``pad_to_length``, ``disable_dropout``) and
``config/config.yaml`` / ``config/loss/dpo.yaml`` at commit
f8b8c0f49dc92a430bae41585f9d467d3618fe2f (Apache-2.0). Written anew from the facts of those
files; no code copied.

Kept: ``tokenize_batch_element`` (prompt, chosen and rejected tokenised apart, eos appended to
each response, ``labels`` = the sequence's ids with ``-100`` over the prompt);
``get_collate_fn`` (chosen/rejected right-padded with the pad id, ``-100`` for labels, 0 for
masks; prompts left-padded); ``get_batch_iterator`` (each epoch the prompts reshuffled, one
element per preference pair, batches of ``batch_size``, stopping after ``n_epochs`` or
``n_examples``; ``sft_mode`` yields the ``sft_target``); ``concatenated_inputs`` (chosen then
rejected stacked along the batch, padded to one length with ``pad_to_length``);
``_get_batch_logps`` (labels ``[:, 1:]`` against logits ``[:, :-1]``, ``-100`` masked, the
per-token log-probs summed); ``preference_loss`` (``pi_logratios - ref_logratios``,
``-logsigmoid(beta * logits)``, label smoothing 0, rewards ``beta * (policy - reference)``
detached); ``BasicTrainer.concatenated_forward`` (one forward of the concatenated batch,
``.logits.to(float32)``); ``get_batch_metrics`` (``loss=dpo``: the policy's forward, the
reference's under ``torch.no_grad()``, reward accuracies and margins; ``loss=sft``:
``-logps`` of the chosen); ``BasicTrainer.train`` (``RMSprop`` from ``config.optimizer``,
``LambdaLR`` linear warm-up ``min(1, (step + 1) / (warmup_steps + 1))``, the seeds set,
``reference_model.eval()``, an evaluation every ``eval_every`` examples (first one included,
``do_first_eval``) under ``policy.eval()`` and ``torch.no_grad()``, then per batch
``policy.train()``, ``gradient_accumulation_steps`` micro-batches each
``(loss / gradient_accumulation_steps).backward()``, ``clip_grad_norm_(max_grad_norm)``,
``optimizer.step()``, ``scheduler.step()``, ``optimizer.zero_grad()``); ``train.py``:
policy and reference built from the same weights, ``disable_dropout`` on both, the reference
loaded from the SFT run's final policy (``model.archive``) as the README's two-stage
recipe does (SFT with ``loss=sft``, then DPO with ``loss=dpo loss.beta=0.1``).
Shrunk: no tokenizer or checkpoint download: a character tokenizer over the digits, ``:``,
``R`` and ``C`` and an eos id (the pad id is the eos id, as ``BasicTrainer`` sets it when the
tokenizer has none) and a tiny ``GPT2LMHeadModel(GPT2Config(vocab 14, n_positions 16, n_embd
64, 2 layers, 4 heads))`` built from its config (random init) instead of a pretrained
checkpoint; the SFT stage trains it from scratch with the same trainer (``loss=sft``; it
stands in for the SFT checkpoint, is trained once per seed and is not watched). The
Anthropic HH data are replaced by synthetic pairs in ``get_shp``'s format: a prompt of 4-5
digits followed by ``:``, two responses in random order as A and B, and ``labels`` = 1 when A
is preferred; the preferred response answers (``R``, the digits reversed), the other
declines (``C``); eos ends both. The SFT target of each prompt is one of its two responses
drawn at random (a base model that does either), so the SFT model is about indifferent and
DPO has a preference to learn. 2,000 train and 256 eval prompts; SFT ``batch_size`` 32, 16
epochs, lr 2e-3; DPO ``loss.beta`` 0.1 (the README's), ``batch_size`` 32 instead of 64,
``n_examples`` 8,192 (256 updates, about 4 epochs), lr 1e-5 instead of 5e-7 (a 100k-parameter
model, not a 2.8B one), ``warmup_steps`` 20 instead of 150, ``eval_every`` 2,048 examples
instead of 20,000, ``eval_batch_size`` 64, ``max_length`` 16 and ``max_prompt_length`` 8;
``sample_during_eval`` false (no wandb tables), no wandb, no FSDP, no checkpoint files.
Measure only (not in the program), on the 256 eval prompts and their preferred responses
(whatever the pairs say): ``preferred_prob``, the mean probability that the policy samples
exactly the preferred response (eos included), and the SFT model's; ``reverse_rate``, the
fraction of greedy completions that are exactly it; ``kl_from_sft``, the mean summed
KL(policy || SFT model) of the next-token distributions along it; and the program's last
evaluation's reward accuracy and margin, as it would print them.

nndx, as the author would add it: the policy is the model the optimizer trains; its batch
for the probes is the first DPO batch as ``concatenated_forward`` feeds it,
``(concatenated input_ids, (concatenated labels, reference chosen log-probs, reference
rejected log-probs))`` (the reference's numbers computed once under ``torch.no_grad()``, as
``get_batch_metrics`` does; without the attention mask, which changes no logit the labels
read: the padding is on the right), scored by ``dpo_loss_fn(logits, targets)``:
``_get_batch_logps`` and ``preference_loss`` as the program calls them. A preflight
``nndx.probe`` with the optimizer before the first step, ``nndx.Monitor(policy, optimizer)``
around the loop, each batch's loss logged, each evaluation's mean loss and reward accuracy
logged as ``split="val"``; after training ``nndx.probe(..., monitor=mon)`` on the same batch
and ``nndx.diagnose``.
"""

from __future__ import annotations

import functools
import random
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dpo"
SOURCE = Source("eric-mitchell/direct-preference-optimization", "trainers.py",
                "f8b8c0f49dc92a430bae41585f9d467d3618fe2f", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "SFT then DPO as published (shrunk: synthetic answer-vs-decline pairs, tiny GPT-2)"),
        Variant(
            "pairs_reversed",
            "the preference pairs built with the dataset's label read the other way round ((n + 1, n) where "
            "labels == 1 means response A is preferred, as get_shp reads it): every pair has its chosen and rejected "
            "responses swapped, in the train and eval splits alike, so DPO learns the dispreferred response while "
            "the reward accuracies it prints climb to 1",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED),
            ("https://github.com/huggingface/trl/issues/2578",),
            Measure("preferred_prob", "mean probability that the policy samples the preferred response on the eval "
                    "prompts, at least 0.15 below the healthy run's: 0.32/0.17/0.09 against 0.74/0.66/0.68 healthy "
                    "on seeds 0-2 (the SFT model's 0.52/0.45/0.45)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "logps_not_shifted",
            "_get_batch_logps without the shift (labels[:, 1:] and logits[:, :-1] dropped): each response token "
            "is scored by the logits at its own position, which predict the token after it, so DPO rewards "
            "repeating the current token of the chosen response and never trains the position that chooses the "
            "response; the trainer's own reward accuracies and margins look better than the healthy run's",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/wyf3/llm_related/issues/33",
             "https://github.com/eric-mitchell/direct-preference-optimization/issues/61",
             "https://github.com/huggingface/trl/issues/1172"),
            Measure("preferred_prob", "mean probability that the policy samples the preferred response on the eval "
                    "prompts, at least 0.15 below the healthy run's: 0.50/0.44/0.27 against 0.74/0.66/0.68 healthy "
                    "on seeds 0-2 (the SFT model's 0.52/0.45/0.45; the trainer's eval reward margin 0.95-1.08 "
                    "against 0.09-0.11 healthy)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

# --------------------------------------------------------------------------- config (shrunk)

DIGITS = "0123456789"
SEP, REVERSE, COPY = ":", "R", "C"
SYMBOLS = DIGITS + SEP + REVERSE + COPY
EOS_ID = len(SYMBOLS)
VOCAB = EOS_ID + 1
N_TRAIN, N_EVAL = 2000, 256
max_length, max_prompt_length = 16, 8
beta, label_smoothing = 0.1, 0.0
max_grad_norm = 10.0
gradient_accumulation_steps = 1
SFT = {"batch_size": 32, "n_epochs": 16, "n_examples": None, "lr": 2e-3, "warmup_steps": 20, "eval_every": 10**9}
DPO = {"batch_size": 32, "n_epochs": None, "n_examples": 8192, "lr": 1e-5, "warmup_steps": 20, "eval_every": 2048}
eval_batch_size = 64


# --------------------------------------------------------------------------- the data (preference_datasets.py)


class CharTokenizer:
    """What the program asks of its tokenizer: ids of a string, an eos and a pad id."""

    eos_token_id = EOS_ID
    pad_token_id = EOS_ID  # train.py: pad = eos when the tokenizer has none

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids = [SYMBOLS.index(c) for c in text]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def get_synthetic(split: str, seed: int, labels_read_reversed: bool = False) -> dict[str, dict]:
    """get_shp's format: prompt -> responses, pairs (preferred index, dispreferred index),
    sft_target. Each prompt has two responses, A and B in random order, and a ``labels``
    field that is 1 when A is preferred; the preferred one marks its answer with R."""
    rng = random.Random(seed * 7919 + (1 if split == "test" else 0))
    n = N_TRAIN if split == "train" else N_EVAL
    data: dict[str, dict] = {}
    while len(data) < n:
        digits = "".join(rng.choice(DIGITS) for _ in range(rng.randint(4, 5)))
        prompt = digits + SEP
        preferred, dispreferred = REVERSE + digits[::-1], COPY
        a_first = rng.random() < 0.5
        row = {"human_ref_A": preferred if a_first else dispreferred,
               "human_ref_B": dispreferred if a_first else preferred, "labels": int(a_first)}  # fmt: skip
        responses = [row["human_ref_A"], row["human_ref_B"]]
        if labels_read_reversed:  # the bug
            pairs = [(1, 0) if row["labels"] == 1 else (0, 1)]
        else:
            pairs = [(0, 1) if row["labels"] == 1 else (1, 0)]
        data[prompt] = {"responses": responses, "pairs": pairs, "sft_target": rng.choice(responses)}
    return data


def tokenize_batch_element(prompt: str, chosen: str, rejected: str, tokenizer: CharTokenizer) -> dict:
    chosen_tokens = tokenizer(chosen)
    rejected_tokens = tokenizer(rejected)
    prompt_tokens = tokenizer(prompt)
    chosen_tokens["input_ids"].append(tokenizer.eos_token_id)
    chosen_tokens["attention_mask"].append(1)
    rejected_tokens["input_ids"].append(tokenizer.eos_token_id)
    rejected_tokens["attention_mask"].append(1)
    longer = max(len(chosen_tokens["input_ids"]), len(rejected_tokens["input_ids"]))
    if len(prompt_tokens["input_ids"]) + longer > max_length:  # truncation_mode keep_end (hh)
        prompt_tokens = {k: v[-max_prompt_length:] for k, v in prompt_tokens.items()}
    if len(prompt_tokens["input_ids"]) + longer > max_length:
        chosen_tokens = {k: v[: max_length - max_prompt_length] for k, v in chosen_tokens.items()}
        rejected_tokens = {k: v[: max_length - max_prompt_length] for k, v in rejected_tokens.items()}
    chosen_seq = {k: prompt_tokens[k] + chosen_tokens[k] for k in chosen_tokens}
    rejected_seq = {k: prompt_tokens[k] + rejected_tokens[k] for k in rejected_tokens}
    n_prompt = len(prompt_tokens["input_ids"])
    chosen_seq["labels"] = [-100] * n_prompt + chosen_seq["input_ids"][n_prompt:]
    rejected_seq["labels"] = [-100] * n_prompt + rejected_seq["input_ids"][n_prompt:]
    batch = {"prompt": prompt, "chosen": prompt + chosen, "rejected": prompt + rejected,
             "chosen_response_only": chosen, "rejected_response_only": rejected}  # fmt: skip
    for k, toks in {"chosen": chosen_seq, "rejected": rejected_seq, "prompt": prompt_tokens}.items():
        for type_key, tokens in toks.items():
            batch[f"{k}_{type_key}"] = tokens
    return batch


def get_collate_fn(tokenizer: CharTokenizer):
    def collate_fn(batch: list[dict]) -> dict:
        padded = {}
        for k in batch[0]:
            if k.endswith("_input_ids") or k.endswith("_attention_mask") or k.endswith("_labels"):
                if "prompt" in k:
                    to_pad = [torch.LongTensor(ex[k][::-1]) for ex in batch]
                else:
                    to_pad = [torch.LongTensor(ex[k]) for ex in batch]
                if k.endswith("_input_ids"):
                    value = tokenizer.pad_token_id
                elif k.endswith("_labels"):
                    value = -100
                else:
                    value = 0
                padded[k] = nn.utils.rnn.pad_sequence(to_pad, batch_first=True, padding_value=value)
                if "prompt" in k:
                    padded[k] = padded[k].flip(dims=[1])
            else:
                padded[k] = [ex[k] for ex in batch]
        return padded

    return collate_fn


def get_batch_iterator(tokenizer: CharTokenizer, split: str, batch_size: int, shuffle: bool, sft_mode: bool,
                       n_epochs: int | None, n_examples: int | None, seed: int,
                       labels_read_reversed: bool = False):  # fmt: skip
    assert n_epochs is not None or n_examples is not None
    permutation_rng = np.random.RandomState(seed)
    dataset = get_synthetic(split, seed, labels_read_reversed)
    flat_data = [(p, d["responses"], d["pairs"], d["sft_target"]) for p, d in dataset.items()]
    collate_fn = get_collate_fn(tokenizer)
    epoch_idx = example_idx = 0
    done = False
    while True:
        if n_epochs is not None and epoch_idx >= n_epochs:
            break
        if shuffle:
            random.Random(int(permutation_rng.randint(0, 2**31))).shuffle(flat_data)
        batch = []
        for prompt, responses, pairs, sft_target in flat_data:
            if done:
                break
            if sft_mode:
                element = tokenize_batch_element(prompt, sft_target, sft_target, tokenizer)
                batch.append({k: v for k, v in element.items() if "rejected" not in k})
                example_idx += 1
                if len(batch) == batch_size:
                    yield collate_fn(batch)
                    if n_examples is not None and example_idx >= n_examples:
                        done = True
                    batch = []
            else:
                for p in pairs:
                    if done:
                        break
                    batch.append(tokenize_batch_element(prompt, responses[p[0]], responses[p[1]], tokenizer))
                    example_idx += 1
                    if len(batch) == batch_size:
                        yield collate_fn(batch)
                        if n_examples is not None and example_idx >= n_examples:
                            done = True
                        batch = []
        if done:
            break
        epoch_idx += 1


# --------------------------------------------------------------------------- trainers.py / utils.py


def pad_to_length(tensor: torch.Tensor, length: int, pad_value: int | float, dim: int = -1) -> torch.Tensor:
    if tensor.size(dim) >= length:
        return tensor
    pad_size = list(tensor.shape)
    pad_size[dim] = length - tensor.size(dim)
    return torch.cat([tensor, pad_value * torch.ones(*pad_size, dtype=tensor.dtype)], dim=dim)


def disable_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0


def preference_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
                    reference_chosen_logps: torch.Tensor, reference_rejected_logps: torch.Tensor, beta: float,
                    label_smoothing: float = 0.0, ipo: bool = False,
                    reference_free: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    pi_logratios = policy_chosen_logps - policy_rejected_logps
    ref_logratios = reference_chosen_logps - reference_rejected_logps
    if reference_free:
        ref_logratios = 0
    logits = pi_logratios - ref_logratios
    if ipo:
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        losses = (-F.logsigmoid(beta * logits) * (1 - label_smoothing)
                  - F.logsigmoid(-beta * logits) * label_smoothing)  # fmt: skip
    chosen_rewards = beta * (policy_chosen_logps - reference_chosen_logps).detach()
    rejected_rewards = beta * (policy_rejected_logps - reference_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def _get_batch_logps(logits: torch.Tensor, labels: torch.Tensor, average_log_prob: bool = False,
                     shift: bool = True) -> torch.Tensor:  # fmt: skip
    assert logits.shape[:-1] == labels.shape
    if shift:
        labels = labels[:, 1:].clone()
        logits = logits[:, :-1, :]
    else:  # the bug: labels scored by the logits at their own positions
        labels = labels.clone()
    loss_mask = labels != -100
    labels[labels == -100] = 0
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    if average_log_prob:
        return (per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1)
    return (per_token_logps * loss_mask).sum(-1)


def concatenated_inputs(batch: dict) -> dict[str, torch.Tensor]:
    max_len = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
    concatenated = {}
    for k in batch:
        if k.startswith("chosen") and isinstance(batch[k], torch.Tensor):
            pad_value = -100 if "labels" in k else 0
            concatenated[k.replace("chosen", "concatenated")] = pad_to_length(batch[k], max_len, pad_value)
    for k in batch:
        if k.startswith("rejected") and isinstance(batch[k], torch.Tensor):
            pad_value = -100 if "labels" in k else 0
            key = k.replace("rejected", "concatenated")
            concatenated[key] = torch.cat((concatenated[key], pad_to_length(batch[k], max_len, pad_value)), dim=0)
    return concatenated


class BasicTrainer:
    def __init__(self, policy: nn.Module, config: dict, seed: int, reference_model: nn.Module | None,
                 nx: Nndx | None = None) -> None:  # fmt: skip
        self.seed = seed
        self.config = config
        self.tokenizer = CharTokenizer()
        sft_mode = config["loss"] == "sft"
        self.policy = policy
        self.reference_model = reference_model
        flipped = config.get("labels_read_reversed", False)
        self.train_iterator = get_batch_iterator(self.tokenizer, "train", config["batch_size"], True, sft_mode,
                                                 config["n_epochs"], config["n_examples"], seed, flipped)  # fmt: skip
        self.eval_batches = list(get_batch_iterator(self.tokenizer, "test", eval_batch_size, True, sft_mode,
                                                    None, N_EVAL, seed, flipped))  # fmt: skip
        self.nx = nx
        self.shift = not config.get("logps_not_shifted", False)
        self.history: list[dict[str, float]] = []
        self.train_losses: list[float] = []

    def concatenated_forward(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        concatenated_batch = concatenated_inputs(batch)
        all_logits = model(concatenated_batch["concatenated_input_ids"],
                           attention_mask=concatenated_batch["concatenated_attention_mask"]).logits.to(torch.float32)
        all_logps = _get_batch_logps(all_logits, concatenated_batch["concatenated_labels"], shift=self.shift)
        n = batch["chosen_input_ids"].shape[0]
        return all_logps[:n], all_logps[n:]

    def get_batch_metrics(self, batch: dict, train: bool = True) -> tuple[torch.Tensor, dict[str, list[float]]]:
        metrics: dict[str, list[float]] = {}
        split = "train" if train else "eval"
        if self.config["loss"] == "dpo":
            policy_chosen_logps, policy_rejected_logps = self.concatenated_forward(self.policy, batch)
            with torch.no_grad():
                reference_chosen_logps, reference_rejected_logps = self.concatenated_forward(self.reference_model,
                                                                                             batch)  # fmt: skip
            losses, chosen_rewards, rejected_rewards = preference_loss(
                policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps,
                beta=self.config["beta"], label_smoothing=label_smoothing, reference_free=False)  # fmt: skip
            reward_accuracies = (chosen_rewards > rejected_rewards).float()
            metrics[f"rewards_{split}/chosen"] = chosen_rewards.numpy().tolist()
            metrics[f"rewards_{split}/rejected"] = rejected_rewards.numpy().tolist()
            metrics[f"rewards_{split}/accuracies"] = reward_accuracies.numpy().tolist()
            metrics[f"rewards_{split}/margins"] = (chosen_rewards - rejected_rewards).numpy().tolist()
            metrics[f"logps_{split}/rejected"] = policy_rejected_logps.detach().numpy().tolist()
        else:
            policy_chosen_logits = self.policy(batch["chosen_input_ids"],
                                               attention_mask=batch["chosen_attention_mask"]).logits.to(torch.float32)
            policy_chosen_logps = _get_batch_logps(policy_chosen_logits, batch["chosen_labels"], shift=self.shift)
            losses = -policy_chosen_logps
        metrics[f"logps_{split}/chosen"] = policy_chosen_logps.detach().numpy().tolist()
        metrics[f"loss/{split}"] = losses.detach().numpy().tolist()
        return losses.mean(), metrics

    def train(self) -> None:
        self.optimizer = torch.optim.RMSprop(self.policy.parameters(), lr=self.config["lr"])
        warmup = self.config["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           lr_lambda=lambda step: min(1.0, (step + 1) / (warmup + 1)))
        torch.manual_seed(self.seed)
        np.random.seed(self.seed)
        random.seed(self.seed)
        if self.config["loss"] == "dpo":
            self.reference_model.eval()

        mon = None
        probe = None
        self.example_counter = self.batch_counter = 0
        for batch in self.train_iterator:
            if self.nx is not None and mon is None:  # the author's nndx, before the first step
                probe = self.probe_batch(batch)
                self.nx.preflight(self.policy, probe, self.dpo_loss_fn, optimizer=self.optimizer)
                mon = self.nx.monitor(self.policy, self.optimizer, every=5)
            #### evaluation
            if self.example_counter % self.config["eval_every"] == 0:
                self.policy.eval()
                all_eval_metrics: dict[str, list[float]] = defaultdict(list)
                for eval_batch in self.eval_batches:
                    with torch.no_grad():
                        _, eval_metrics = self.get_batch_metrics(eval_batch, train=False)
                    for k, v in eval_metrics.items():
                        all_eval_metrics[k].extend(v)
                mean_eval = {k: sum(v) / len(v) for k, v in all_eval_metrics.items()}
                mean_eval["examples"] = self.example_counter
                self.history.append(mean_eval)
                if mon is not None:
                    acc = mean_eval.get("rewards_eval/accuracies")
                    mon.log(mean_eval["loss/eval"], split="val", **({"accuracy": acc} if acc is not None else {}))
            #### training
            self.policy.train()
            for microbatch_idx in range(gradient_accumulation_steps):
                loss, _metrics = self.get_batch_metrics(batch, train=True)
                (loss / gradient_accumulation_steps).backward()
            self.clip_gradient()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            if mon is not None:
                mon.log(loss)
            self.train_losses.append(loss.item())
            self.batch_counter += 1
            self.example_counter += self.config["batch_size"]
        if self.nx is not None and mon is not None:
            self.nx.finish(mon, self.policy, probe, self.dpo_loss_fn, optimizer=self.optimizer)

    def clip_gradient(self) -> float:
        return torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_grad_norm).item()

    # ---- the author's nndx glue: the DPO loss as loss_fn(logits, targets)
    def probe_batch(self, batch: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        concatenated_batch = concatenated_inputs(batch)
        with torch.no_grad():
            ref_chosen, ref_rejected = self.concatenated_forward(self.reference_model, batch)
        inputs = concatenated_batch["concatenated_input_ids"]
        return inputs, (concatenated_batch["concatenated_labels"], ref_chosen, ref_rejected)

    def dpo_loss_fn(self, logits: torch.Tensor, targets: tuple[torch.Tensor, ...]) -> torch.Tensor:
        labels, ref_chosen, ref_rejected = targets
        logits = getattr(logits, "logits", logits)
        all_logps = _get_batch_logps(logits.to(torch.float32), labels, shift=self.shift)
        n = ref_chosen.shape[0]
        losses, _, _ = preference_loss(all_logps[:n], all_logps[n:], ref_chosen, ref_rejected,
                                       beta=self.config["beta"], label_smoothing=label_smoothing)  # fmt: skip
        return losses.mean()


# --------------------------------------------------------------------------- train.py


def build_model(seed: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=max_length, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=EOS_ID, eos_token_id=EOS_ID)  # fmt: skip
    return GPT2LMHeadModel(config)


@functools.lru_cache(maxsize=2)
def sft_archive(seed: int) -> dict[str, torch.Tensor]:
    """Stage 1, ``loss=sft``: the checkpoint the DPO run loads (``model.archive``), the same
    for every variant of a seed, so trained once per process (it is not watched)."""
    with torch.random.fork_rng():
        sft_policy = build_model(seed)
        disable_dropout(sft_policy)
        BasicTrainer(sft_policy, {"loss": "sft", **SFT}, seed, None, nx=None).train()
    return {k: v.clone() for k, v in sft_policy.state_dict().items()}


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    archive = sft_archive(seed)

    # stage 2, loss=dpo loss.beta=0.1 model.archive=.../policy.pt
    policy = build_model(seed)
    disable_dropout(policy)
    reference_model = build_model(seed)
    disable_dropout(reference_model)
    policy.load_state_dict(archive)
    reference_model.load_state_dict(archive)
    config = {"loss": "dpo", "beta": beta, **DPO, "labels_read_reversed": variant == "pairs_reversed",
              "logps_not_shifted": variant == "logps_not_shifted"}
    trainer = BasicTrainer(policy, config, seed, reference_model, nx=nx)
    trainer.train()

    # the program's last evaluation (after the final batch), as it would print it
    policy.eval()
    metrics: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for eval_batch in trainer.eval_batches:
            for k, v in trainer.get_batch_metrics(eval_batch, train=False)[1].items():
                metrics[k].extend(v)
    sft_model = build_model(seed)
    sft_model.load_state_dict(archive)
    sft_model.eval()
    preferred_prob, kl = along_preferred(policy, sft_model, seed)
    return {
        "preferred_prob": preferred_prob,
        "sft_preferred_prob": along_preferred(sft_model, sft_model, seed)[0],
        "kl_from_sft": kl,
        "reverse_rate": reverse_rate(policy, seed),
        "sft_reverse_rate": reverse_rate(sft_model, seed),
        "eval_reward_accuracy": float(np.mean(metrics["rewards_eval/accuracies"])),
        "eval_reward_margin": float(np.mean(metrics["rewards_eval/margins"])),
        "final_train_loss": float(np.mean(trainer.train_losses[-10:])),
    }


# --------------------------------------------------------------------------- measure only


def preferred_responses(seed: int) -> list[tuple[str, str]]:
    """(prompt, preferred response) of each eval prompt, whatever the pairs say."""
    return [(p, REVERSE + p[:-1][::-1]) for p in get_synthetic("test", seed)]


@torch.no_grad()
def reverse_rate(model: nn.Module, seed: int) -> float:
    """Greedy completions of the eval prompts that are exactly the preferred response
    (the R marker, the digits reversed, eos); prompts of one length batched."""
    model.eval()
    tok = CharTokenizer()
    by_length: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for prompt, response in preferred_responses(seed):
        by_length[len(prompt)].append((prompt, response))
    hits = total = 0
    for rows in by_length.values():
        ids = torch.tensor([tok(p)["input_ids"] for p, _ in rows])
        targets = torch.tensor([tok(r)["input_ids"] + [EOS_ID] for _, r in rows])
        for _ in range(targets.shape[1]):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        hits += int((ids[:, -targets.shape[1]:] == targets).all(1).sum())
        total += len(rows)
    return hits / total


@torch.no_grad()
def along_preferred(policy: nn.Module, sft_model: nn.Module, seed: int) -> tuple[float, float]:
    """Over the eval prompts: the mean probability that the policy samples exactly the
    preferred response (eos included), and the mean summed KL(policy || SFT model) of the
    next-token distributions along it."""
    policy.eval()
    tok = CharTokenizer()
    prob = kl = 0.0
    rows = preferred_responses(seed)
    for prompt, response in rows:
        ids = torch.tensor([tok(prompt + response)["input_ids"] + [EOS_ID]])
        lp = policy(ids).logits.log_softmax(-1)[0, len(prompt) - 1 : -1]
        lq = sft_model(ids).logits.log_softmax(-1)[0, len(prompt) - 1 : -1]
        prob += float(lp.gather(1, ids[0, len(prompt) :, None]).sum().exp())
        kl += float((lp.exp() * (lp - lq)).sum())
    return prob / len(rows), kl / len(rows)
