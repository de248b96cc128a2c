"""Port of lucidrains/electra-pytorch: ELECTRA pre-training (replaced-token detection).

Source: github.com/lucidrains/electra-pytorch, ``electra_pytorch/electra_pytorch.py`` and
``pretraining/openwebtext/pretrain.py`` (with ``small_generator.json`` and
``small_discriminator.json``) at commit 5b8bae5c3575b7529891c1b878c24688f57d7ca1 (MIT,
Copyright (c) 2020 Phil Wang); the generator and discriminator are transformers'
``ElectraForMaskedLM`` and ``ElectraForPreTraining`` built from configs (no download).
Written anew from the facts of those files; no code copied.

Kept: ``Electra``: ``mask_prob = 0.15``, ``replace_prob = 0.85``, ``random_token_prob = 0``
(as pretrain.py passes it), ``disc_weight = 50``, ``gen_weight = 1``, temperature 1; the
padding and ``[CLS]``/``[SEP]`` never masked; ``get_mask_subset_with_prob`` (exactly
``ceil(0.15 * n)`` of each sequence's maskable tokens chosen by the top-k of random scores);
the masked input with ``[MASK]`` on the chosen positions kept with probability 0.85; the
generator's MLM ``cross_entropy`` on ``logits.transpose(1, 2)`` against labels that are the
padding id (ignored) outside the mask; the gumbel-argmax sample of the masked positions'
logits, ``detach``-ed and scattered into a copy of the input; the discriminator labels
``input != disc_input`` (a sampled original token counts as original); the discriminator's
``binary_cross_entropy_with_logits`` on the non-padded tokens only; ``gen_acc`` and the
balanced ``disc_acc`` (half on masked, half on unmasked positions, predictions
``round((sign(logit) + 1) / 2)``); the ``Results`` tuple. pretrain.py: ``ElectraForMaskedLM``
/ ``ElectraForPreTraining`` wrapped in ``LogitsAdapter`` (``[0]`` of the output), the word,
position and token-type embeddings of the generator tied to the discriminator's; the
input ids, ``attention_mask`` and ``token_type_ids`` padded with ``pad_sequence`` by the
collate function and the loader cycled; ``AdamW(lr, betas=(0.9, 0.999), eps=1e-8)`` with
weight decay 0.1 except on ``bias`` and ``LayerNorm.weight``; the linear warm-up / linear
decay ``LambdaLR``; the loop: ``zero_grad``, forward, ``backward``, ``clip_grad_norm_(1.0)``,
``optimizer.step()``, ``scheduler.step()``, the metrics record every ``step_log`` steps.
The generator is a quarter of the discriminator's width with one attention head, as in the
two json configs; dropout 0.1, GELU, ``initializer_range`` 0.02, eps 1e-12 kept.
Shrunk: a generated corpus instead of OpenWebText (4 topics of 10 words, each a Markov chain
where every word has 2 likely successors, 0.75 and 0.2, any topic word otherwise; a sequence
is ``[CLS]`` + 8 to 20 words of one chain + ``[SEP]``, 2,000 for training and 256 held out),
a vocabulary of 44 instead of 30,522 (``[PAD]`` 0, ``[CLS]`` 1, ``[SEP]`` 2, ``[MASK]`` 3);
``embedding_size`` 32 instead of 128, discriminator hidden 64 / 4 heads / FFN 256 and
generator hidden 16 / 1 head / FFN 64 instead of 256 and 64, 2 layers each instead of 12,
64 positions instead of 512; batch 32 instead of 128 (over 4 GPUs); 300 steps with a
30-step warm-up instead of 200,000 and 10,000; lr 2e-3 instead of 5e-4 (300 steps, not
200,000); single process on a CPU, no DistributedDataParallel; ``GradScaler(enabled=False)``
(mixed precision is off by default) left out; no checkpoints, logs kept in memory.
Measure only (not in the program): the model in ``eval()`` under ``no_grad`` on the held-out
sequences with a fixed seed for the masking and sampling: the mean ``disc_acc`` and
``gen_acc`` the program computes, and the share of non-padded tokens whose replaced/original
call is right.

nndx, as the author would add it: ``Electra`` returns its own loss, so the loss function is
``lambda results, _: results.loss`` and a batch is the keyword inputs ``{"input": ids,
"attention_mask": mask, "token_type_ids": segments}`` with no target; a preflight
``nndx.probe`` of the ``Electra`` model (generator + discriminator) on the first batch with
the optimizer; ``nndx.Monitor(model, optimizer)`` around the loop, each step's loss logged
with the step's ``acc_disc`` as its accuracy (the metrics pretrain.py logs); no validation
pass in the program, so none is logged; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math
from collections import namedtuple
from functools import reduce

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "electra"
SOURCE = Source("lucidrains/electra-pytorch", "pretraining/openwebtext/pretrain.py",
                "5b8bae5c3575b7529891c1b878c24688f57d7ca1", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk)"),
        Variant(
            "sigmoid_before_bce_logits",
            "the discriminator's adapter returns sigmoid(logits) (the repository's first adapter ended in "
            "nn.Sigmoid()) while the loss is binary_cross_entropy_with_logits: the scores are squashed twice, "
            "every 'logit' is positive and every token is called replaced",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/lucidrains/electra-pytorch/commit/5cf70886c94766aaeb3f9f5e56945a17cca271a2",
             "https://github.com/ChengBinJin/V-GAN-tensorflow/issues/16",
             "https://github.com/itakurah/focal-loss-pytorch/pull/5",
             "https://github.com/jeffheaton/t81_558_deep_learning/pull/81"),
            Measure("heldout_disc_acc", "held-out balanced discriminator accuracy (the program's disc_acc) at "
                    "least 0.1 below the healthy run's: 0.42 against 0.67 healthy on seed 0 (every token called replaced; "
                    "the MLM accuracy is not hurt: 0.29 against 0.25)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "scheduler_never_stepped",
            "scheduler.step() left out of the loop: the warm-up LambdaLR set the LR to lr_lambda(0) = 0 when it "
            "was built, and nothing ever raises it, so AdamW steps with LR 0 for the whole run",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/pytorch/text/issues/671", "https://github.com/saforem2/ezpz/pull/128"),
            Measure("heldout_gen_acc", "held-out MLM accuracy on the masked positions at least 0.1 below the "
                    "healthy run's (the untrained generator's): 0.02 against 0.25 healthy on seed 0 (disc_acc 0.50 "
                    "against 0.67)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

PAD, CLS, SEP, MASK = 0, 1, 2, 3
TOPICS, PER_TOPIC = 4, 10
VOCAB = 4 + TOPICS * PER_TOPIC
N_TRAIN, N_HELDOUT, MIN_WORDS, MAX_WORDS = 2000, 256, 8, 20
ARGS = {"data_max_seq_length": 32, "model_mask_prob": 0.15, "opt_lr": 2e-3, "opt_batch_size": 32,
        "opt_warmup_steps": 30, "opt_num_training_steps": 300, "step_log": 10}  # fmt: skip
GEN_CONFIG = {"embedding_size": 32, "hidden_size": 16, "num_attention_heads": 1, "intermediate_size": 64}
DISC_CONFIG = {"embedding_size": 32, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 256}
COMMON_CONFIG = {"vocab_size": VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 64, "type_vocab_size": 2,
                 "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                 "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": PAD}  # fmt: skip

Results = namedtuple("Results", ["loss", "mlm_loss", "disc_loss", "gen_acc", "disc_acc", "disc_labels",
                                 "disc_predictions"])  # fmt: skip


# --------------------------------------------------------------------------- the corpus (the data)


def corpus(n: int, rng: np.random.Generator) -> list[torch.Tensor]:
    """Sequences ``[CLS] w ... w [SEP]``: the words walk one topic's chain, in which every
    word has two likely successors (0.45 each) and any topic word otherwise."""
    succ = rng.integers(0, PER_TOPIC, size=(TOPICS, PER_TOPIC, 2))
    out = []
    for _ in range(n):
        topic = rng.integers(TOPICS)
        w = rng.integers(PER_TOPIC)
        words = []
        for _ in range(rng.integers(MIN_WORDS, MAX_WORDS + 1)):
            words.append(4 + topic * PER_TOPIC + w)
            r = rng.random()
            w = succ[topic, w, 0] if r < 0.75 else succ[topic, w, 1] if r < 0.95 else rng.integers(PER_TOPIC)
        out.append(torch.tensor([CLS, *words, SEP]))
    return out


def collate_batch(examples: list[torch.Tensor]):
    input_ids = nn.utils.rnn.pad_sequence(examples, batch_first=True, padding_value=PAD)
    input_mask = nn.utils.rnn.pad_sequence([torch.ones_like(e) for e in examples], batch_first=True,
                                           padding_value=PAD)  # fmt: skip
    segment_ids = nn.utils.rnn.pad_sequence([torch.zeros_like(e) for e in examples], batch_first=True,
                                            padding_value=PAD)  # fmt: skip
    return input_ids, input_mask, segment_ids


def cycle(iterable):
    while True:
        yield from iterable


# --------------------------------------------------------------------------- electra_pytorch.py


def log(t, eps=1e-9):
    return torch.log(t + eps)


def gumbel_noise(t):
    noise = torch.zeros_like(t).uniform_(0, 1)
    return -log(-log(noise))


def gumbel_sample(t, temperature=1.0):
    return ((t / temperature) + gumbel_noise(t)).argmax(dim=-1)


def prob_mask_like(t, prob):
    return torch.zeros_like(t).float().uniform_(0, 1) < prob


def mask_with_tokens(t, token_ids):
    init_no_mask = torch.full_like(t, False, dtype=torch.bool)
    return reduce(lambda acc, el: acc | (t == el), token_ids, init_no_mask)


def get_mask_subset_with_prob(mask, prob):
    batch, seq_len = mask.shape
    max_masked = math.ceil(prob * seq_len)
    num_tokens = mask.sum(dim=-1, keepdim=True)
    mask_excess = (mask.cumsum(dim=-1) > (num_tokens * prob).ceil())[:, :max_masked]
    rand = torch.rand((batch, seq_len)).masked_fill(~mask, -1e9)
    _, sampled_indices = rand.topk(max_masked, dim=-1)
    sampled_indices = (sampled_indices + 1).masked_fill_(mask_excess, 0)
    new_mask = torch.zeros((batch, seq_len + 1))
    new_mask.scatter_(-1, sampled_indices, 1)
    return new_mask[:, 1:].bool()


class Electra(nn.Module):
    def __init__(self, generator, discriminator, *, num_tokens=None, mask_prob=0.15, replace_prob=0.85,
                 random_token_prob=0.0, mask_token_id=2, pad_token_id=0, mask_ignore_token_ids=(),
                 disc_weight=50.0, gen_weight=1.0, temperature=1.0):  # fmt: skip
        super().__init__()
        self.generator = generator
        self.discriminator = discriminator
        self.mask_prob, self.replace_prob = mask_prob, replace_prob
        self.num_tokens, self.random_token_prob = num_tokens, random_token_prob
        self.pad_token_id, self.mask_token_id = pad_token_id, mask_token_id
        self.mask_ignore_token_ids = {*mask_ignore_token_ids, pad_token_id}
        self.temperature = temperature
        self.disc_weight, self.gen_weight = disc_weight, gen_weight

    def forward(self, input, **kwargs):
        replace_prob = prob_mask_like(input, self.replace_prob)
        no_mask = mask_with_tokens(input, self.mask_ignore_token_ids)
        mask = get_mask_subset_with_prob(~no_mask, self.mask_prob)
        mask_indices = torch.nonzero(mask, as_tuple=True)

        masked_input = input.clone().detach()
        gen_labels = input.masked_fill(~mask, self.pad_token_id)
        masking_mask = mask.clone()
        if self.random_token_prob > 0:  # pretrain.py passes 0: never taken
            random_token_prob = prob_mask_like(input, self.random_token_prob)
            random_tokens = torch.randint(0, self.num_tokens, input.shape)
            random_token_prob &= ~mask_with_tokens(random_tokens, self.mask_ignore_token_ids)
            masked_input = torch.where(random_token_prob, random_tokens, masked_input)
            masking_mask = masking_mask & ~random_token_prob
        masked_input = masked_input.masked_fill(masking_mask * replace_prob, self.mask_token_id)

        logits = self.generator(masked_input, **kwargs)
        mlm_loss = F.cross_entropy(logits.transpose(1, 2), gen_labels, ignore_index=self.pad_token_id)

        sample_logits = logits[mask_indices]
        sampled = gumbel_sample(sample_logits, temperature=self.temperature)
        disc_input = input.clone()
        disc_input[mask_indices] = sampled.detach()
        disc_labels = (input != disc_input).float().detach()

        non_padded_indices = torch.nonzero(input != self.pad_token_id, as_tuple=True)
        disc_logits = self.discriminator(disc_input, **kwargs)
        disc_logits = disc_logits.reshape_as(disc_labels)
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits[non_padded_indices],
                                                       disc_labels[non_padded_indices])  # fmt: skip

        with torch.no_grad():
            gen_predictions = torch.argmax(logits, dim=-1)
            disc_predictions = torch.round((torch.sign(disc_logits) + 1.0) * 0.5)
            gen_acc = (gen_labels[mask] == gen_predictions[mask]).float().mean()
            disc_acc = (0.5 * (disc_labels[mask] == disc_predictions[mask]).float().mean()
                        + 0.5 * (disc_labels[~mask] == disc_predictions[~mask]).float().mean())  # fmt: skip

        return Results(self.gen_weight * mlm_loss + self.disc_weight * disc_loss, mlm_loss, disc_loss, gen_acc,
                       disc_acc, disc_labels, disc_predictions)  # fmt: skip


# --------------------------------------------------------------------------- pretrain.py


class LogitsAdapter(nn.Module):
    def __init__(self, adaptee, squash: bool = False):
        super().__init__()
        self.adaptee = adaptee
        self.squash = squash  # the bug: a sigmoid on the discriminator's logits

    def forward(self, *args, **kwargs):
        out = self.adaptee(*args, **kwargs)[0]
        return out.sigmoid() if self.squash else out


def tie_weights(generator, discriminator):
    generator.electra.embeddings.word_embeddings = discriminator.electra.embeddings.word_embeddings
    generator.electra.embeddings.position_embeddings = discriminator.electra.embeddings.position_embeddings
    generator.electra.embeddings.token_type_embeddings = discriminator.electra.embeddings.token_type_embeddings


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):
    def lr_lambda(current_step):
        learning_rate = max(0.0, 1.0 - (float(current_step) / float(num_training_steps)))
        learning_rate *= min(1.0, float(current_step) / float(num_warmup_steps))
        return learning_rate

    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_params_without_weight_decay_ln(named_params, weight_decay):
    no_decay = ["bias", "LayerNorm.weight"]
    return [
        {"params": [p for n, p in named_params if not any(nd in n for nd in no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in named_params if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]


def heldout(model: Electra, examples: list[torch.Tensor], seed: int) -> dict[str, float]:
    """Measure only: the program's own metrics on held-out sequences, fixed draws."""
    state = torch.random.get_rng_state()
    torch.manual_seed(10_000 + seed)
    model.eval()
    disc, gen, token_right, tokens = [], [], 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(examples), 64):
            input_ids, input_mask, segment_ids = collate_batch(examples[start : start + 64])
            r = model(input_ids, attention_mask=input_mask, token_type_ids=segment_ids)
            disc.append(r.disc_acc.item())
            gen.append(r.gen_acc.item())
            real = input_ids != PAD
            token_right += (r.disc_predictions[real] == r.disc_labels[real]).float().sum().item()
            tokens += real.sum().item()
    model.train()
    torch.random.set_rng_state(state)
    return {"heldout_disc_acc": float(np.mean(disc)), "heldout_gen_acc": float(np.mean(gen)),
            "heldout_token_acc": token_right / tokens}  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    rng = np.random.default_rng(seed)
    examples = corpus(N_TRAIN + N_HELDOUT, rng)
    ds_train, ds_heldout = examples[:N_TRAIN], examples[N_TRAIN:]
    loader = DataLoader(ds_train, batch_size=args["opt_batch_size"], collate_fn=collate_batch)
    ds_train_loader = iter(cycle(loader))

    generator = ElectraForMaskedLM(ElectraConfig(**COMMON_CONFIG, **GEN_CONFIG))
    discriminator = ElectraForPreTraining(ElectraConfig(**COMMON_CONFIG, **DISC_CONFIG))
    tie_weights(generator, discriminator)
    model = Electra(LogitsAdapter(generator),
                    LogitsAdapter(discriminator, squash=variant == "sigmoid_before_bce_logits"),
                    num_tokens=VOCAB, mask_token_id=MASK, pad_token_id=PAD, mask_prob=args["model_mask_prob"],
                    mask_ignore_token_ids=[CLS, SEP], random_token_prob=0.0)  # fmt: skip

    optimizer = torch.optim.AdamW(get_params_without_weight_decay_ln(list(model.named_parameters()), weight_decay=0.1),
                                  lr=args["opt_lr"], betas=(0.9, 0.999), eps=1e-08)  # fmt: skip
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=args["opt_warmup_steps"],
                                                num_training_steps=args["opt_num_training_steps"])  # fmt: skip

    def loss_fn(results, _target):
        return results.loss  # Electra.forward returns its own loss

    first_ids, first_mask, first_segments = collate_batch(ds_train[: args["opt_batch_size"]])
    probe_batch = ({"input": first_ids, "attention_mask": first_mask, "token_type_ids": first_segments}, None)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    records = []
    for step in range(args["opt_num_training_steps"] + 1):
        input_ids, input_mask, segment_ids = next(ds_train_loader)
        assert input_ids.shape[1] <= args["data_max_seq_length"]
        optimizer.zero_grad()
        loss, loss_mlm, loss_disc, acc_gen, acc_disc, disc_labels, disc_pred = model(
            input_ids, attention_mask=input_mask, token_type_ids=segment_ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if variant != "scheduler_never_stepped":
            scheduler.step()
        mon.log(loss, accuracy=acc_disc)
        if step % args["step_log"] == 0:
            records.append({"step": step, "loss": loss.item(), "loss_mlm": loss_mlm.item(),
                            "loss_disc": loss_disc.item(), "acc_gen": acc_gen.item(), "acc_disc": acc_disc.item(),
                            "lr": scheduler.get_last_lr()[0]})  # fmt: skip

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    late = records[-5:]
    return {
        **heldout(model, ds_heldout, seed),
        "train_loss": float(np.mean([r["loss"] for r in late])),
        "train_acc_disc": float(np.mean([r["acc_disc"] for r in late])),
        "train_acc_gen": float(np.mean([r["acc_gen"] for r in late])),
    }
