"""Port of jaywonchung/BERT4Rec-VAE-Pytorch: BERT4Rec, a bidirectional transformer trained
with the Cloze objective on item-id sequences, ranked by NDCG@10 against sampled negatives.

Source: github.com/jaywonchung/BERT4Rec-VAE-Pytorch, ``models/bert.py``,
``models/bert_modules/`` (``bert.py``, ``embedding/``, ``attention/``, ``transformer.py``,
``utils/``), ``dataloaders/bert.py``, ``dataloaders/negative_samplers/random.py``,
``trainers/bert.py``, ``trainers/base.py``, ``trainers/utils.py`` and ``templates.py``
(``train_bert``) at commit f66f2534ebfd937778c7174b5f9f216efdebe5de (GPL-3.0, Copyright
Jaewon Chung and SungMin Cho). Written anew from the facts of those files; no code copied.

Kept: ``BERTModel`` = ``BERT`` + ``out = Linear(hidden, num_items + 1)``; ``BERT``: the
vocabulary ``num_items + 2`` (0 padding, 1..num_items the items, ``num_items + 1`` the
[MASK] token), ``BERTEmbedding`` = ``TokenEmbedding`` (``padding_idx=0``) + the *learned*
``PositionalEmbedding`` (an ``nn.Embedding(max_len, hidden)`` whose whole weight is
repeated over the batch), dropout; the key-padding mask ``(x > 0)`` repeated to (batch,
1, T, T); ``TransformerBlock`` s: two ``SublayerConnection`` s (the repository's
``LayerNorm`` with ``std`` and eps 1e-6 applied first, the residual added after dropout)
around ``MultiHeadedAttention`` (three ``Linear`` projections, heads by
``view``/``transpose``, scores / sqrt(d_k), ``masked_fill(mask == 0, -1e9)``, softmax,
dropout, the output ``Linear``) and ``PositionwiseFeedForward`` (w_1, the tanh ``GELU``,
dropout, w_2, width 4 x hidden), then a dropout; PyTorch's default init (``init_weights``
does nothing), the model seeded by ``model_init_seed`` 0. ``BertTrainDataset``: each item
of the user's train sequence chosen with probability ``mask_prob`` (then 80% [MASK], 10% a
random item ``randint(1, num_items)``, 10% itself, its label the item; other labels 0),
cut to the last ``max_len`` and left-padded with 0, python ``random.Random(seed)``;
``BertEvalDataset``: the user's *train* sequence plus [MASK] at the end, cut and padded,
the answer first among the candidates then the negatives (labels 1, 0...), for both the
validation and the test answer (as published: the test input does not include the
validation item); ``RandomNegativeSampler``: 100 items per user outside everything the
user saw, numpy seed 98765. ``leave_one_out`` split (train ``items[:-2]``, val
``items[-2]``, test ``items[-1]``). ``BERTTrainer``: ``CrossEntropyLoss(ignore_index=0)``
on the logits viewed (B*T, V) against the labels viewed (B*T); ``calculate_metrics``: the
last position's scores gathered at the candidates, ``recalls_and_ndcgs_for_ks``.
``AbstractTrainer``: ``Adam(lr, weight_decay)`` (``--weight_decay`` default 0), ``StepLR
(step_size=decay_step, gamma)`` stepped at the start of every epoch (the template's
``decay_step`` 25, ``gamma`` 1.0), ``validate`` before training and after each epoch
(eval mode, ``no_grad``), the best model by validation NDCG@10 kept and tested at the end;
per batch ``zero_grad``, loss, ``backward``, ``step``.
Shrunk: synthetic interaction logs instead of ml-1m: 200 users, 150 items in 10 clusters
of 15, sequences of 12-22 items that follow a hidden item-to-item transition structure
(each item has three likely successors inside its cluster, 75% of steps follow one, the rest
jump at random); ``bert_max_len`` 20 instead of 100, ``bert_hidden_units`` 32 instead of 256,
2 heads instead of 4 (2 blocks, dropout 0.1, ``mask_prob`` 0.15 kept); batch 64 instead of
128; 100 epochs (400 steps) instead of 100 over 6,040 users, validated every 10 epochs instead
of every epoch; lr 0.003 instead of 0.001 (the shrunk run has 400 steps); no tqdm,
tensorboard, checkpoint files, CUDA.
Measure only (not in the program): nothing beyond the program's own numbers; the test
NDCG@10 / Recall@10 of the best-validation model and the last epoch's mean training loss
are returned.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``(seqs, labels)`` with ``calculate_loss``'s loss written as a function of ``(logits,
labels)`` and the Adam optimizer; ``nndx.Monitor(model, optimizer, loss_fn=that loss)``
around the epochs, the loss computed through ``mon.loss_fn`` and every batch loss logged
(the program shows it in tqdm); no validation loss is logged (the program's validation
computes ranking metrics only, no loss); then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bert4rec"
SOURCE = Source("jaywonchung/BERT4Rec-VAE-Pytorch", "trainers/bert.py", "f66f2534ebfd937778c7174b5f9f216efdebe5de",
                "GPL-3.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (train_bert template, shrunk sizes)"),
        Variant(
            "no_ignore_index",
            "self.ce = nn.CrossEntropyLoss() without ignore_index=0: every unmasked position and every padding "
            "position (label 0) is trained to predict the padding index, so about 85% of the loss terms "
            "teach the model to output class 0 and the masked items' signal is drowned",
            (C.WRONG_LOSS, C.CLASS_IMBALANCE),
            ("https://github.com/huggingface/transformers/issues/2759",
             "https://github.com/deepspeedai/DeepSpeedExamples/issues/66",
             "https://github.com/microsoft/onnxruntime/pull/4640",
             "https://github.com/jaywonchung/BERT4Rec-VAE-Pytorch/issues/17"),
            Measure("test_ndcg10", "test NDCG@10 at least 0.05 below the healthy run's (0.12 against 0.27 on "
                    "seed 0, Recall@10 0.26 against 0.44; the training loss 0.63 against 3.91: the easy label-0 "
                    "terms dominate it)",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "test_items_in_train",
            "the Cloze training set is built from each user's whole sequence (train + validation + test items) "
            "instead of user_train: the held-out items are masked and predicted during training, so the "
            "reported validation/test ranking is inflated",
            (C.DATA_LEAKAGE,),
            ("https://github.com/FeiSun/BERT4Rec/issues/12",
             "https://github.com/RUCAIBox/RecBole/issues/620",
             "https://github.com/RUCAIBox/RecBole/issues/1649"),
            Measure("test_ndcg10", "test NDCG@10 at least 0.05 above the healthy run's (the held-out items "
                    "were trained on: 0.35 against 0.27 on seed 0, Recall@10 0.52 against 0.44; the training loss "
                    "unchanged, 3.91 both)", lambda healthy, buggy: not buggy < healthy + 0.05),
        ),
    )
}

ARGS = {"num_users": 200, "num_items": 150, "clusters": 10, "follow": 0.75, "bert_max_len": 20,
        "bert_hidden_units": 32, "bert_num_blocks": 2, "bert_num_heads": 2, "bert_dropout": 0.1,
        "bert_mask_prob": 0.15, "train_batch_size": 64, "val_batch_size": 128, "lr": 0.003, "weight_decay": 0.0,
        "decay_step": 25, "gamma": 1.0, "num_epochs": 100, "validate_every": 10, "test_negative_sample_size": 100,
        "test_negative_sampling_seed": 98765, "dataloader_random_seed": 0, "model_init_seed": 0,
        "metric_ks": (1, 5, 10)}  # fmt: skip


# --------------------------------------------------------------------------- models/bert_modules


class LayerNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class GELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class SublayerConnection(nn.Module):
    """Pre-norm residual: ``x + dropout(sublayer(norm(x)))``."""

    def __init__(self, size: int, dropout: float) -> None:
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class Attention(nn.Module):
    def forward(self, query, key, value, mask=None, dropout=None):
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        p_attn = F.softmax(scores, dim=-1)
        if dropout is not None:
            p_attn = dropout(p_attn)
        return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        assert d_model % h == 0
        self.d_k, self.h = d_model // h, h
        self.linear_layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.output_linear = nn.Linear(d_model, d_model)
        self.attention = Attention()
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        batch_size = query.size(0)
        query, key, value = [layer(t).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
                             for layer, t in zip(self.linear_layers, (query, key, value))]  # fmt: skip
        x, _attn = self.attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(batch_size, -1, self.h * self.d_k)
        return self.output_linear(x)


class TransformerBlock(nn.Module):
    def __init__(self, hidden: int, attn_heads: int, feed_forward_hidden: int, dropout: float) -> None:
        super().__init__()
        self.attention = MultiHeadedAttention(h=attn_heads, d_model=hidden, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model=hidden, d_ff=feed_forward_hidden, dropout=dropout)
        self.input_sublayer = SublayerConnection(size=hidden, dropout=dropout)
        self.output_sublayer = SublayerConnection(size=hidden, dropout=dropout)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.input_sublayer(x, lambda _x: self.attention(_x, _x, _x, mask=mask))
        x = self.output_sublayer(x, self.feed_forward)
        return self.dropout(x)


class TokenEmbedding(nn.Embedding):
    def __init__(self, vocab_size: int, embed_size: int = 512) -> None:
        super().__init__(vocab_size, embed_size, padding_idx=0)


class PositionalEmbedding(nn.Module):
    """Learned: one row per position, the whole table added to every sequence."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.pe = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pe.weight.unsqueeze(0).repeat(x.size(0), 1, 1)


class BERTEmbedding(nn.Module):
    def __init__(self, vocab_size: int, embed_size: int, max_len: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.token = TokenEmbedding(vocab_size=vocab_size, embed_size=embed_size)
        self.position = PositionalEmbedding(max_len=max_len, d_model=embed_size)
        self.dropout = nn.Dropout(p=dropout)
        self.embed_size = embed_size

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.token(sequence) + self.position(sequence))


class BERT(nn.Module):
    def __init__(self, args: dict) -> None:
        super().__init__()
        torch.manual_seed(args["model_init_seed"])  # fix_random_seed_as(model_init_seed)
        hidden = args["bert_hidden_units"]
        self.hidden = hidden
        self.embedding = BERTEmbedding(vocab_size=args["num_items"] + 2, embed_size=hidden,
                                       max_len=args["bert_max_len"], dropout=args["bert_dropout"])  # fmt: skip
        self.transformer_blocks = nn.ModuleList(
            [TransformerBlock(hidden, args["bert_num_heads"], hidden * 4, args["bert_dropout"])
             for _ in range(args["bert_num_blocks"])]
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).unsqueeze(1).repeat(1, x.size(1), 1).unsqueeze(1)
        x = self.embedding(x)
        for transformer in self.transformer_blocks:
            x = transformer(x, mask)
        return x


class BERTModel(nn.Module):
    def __init__(self, args: dict) -> None:
        super().__init__()
        self.bert = BERT(args)
        self.out = nn.Linear(self.bert.hidden, args["num_items"] + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.bert(x))


# --------------------------------------------------------------------------- datasets + dataloaders


def interaction_log(args: dict, seed: int) -> dict[int, list[int]]:
    """Each user's time-ordered items (the preprocessed ``user2items``), made up: items in
    clusters; each item has three likely successors inside its cluster, followed with
    probability ``follow``, otherwise a uniformly random item."""
    rng = np.random.default_rng(seed + 17)
    n_items, clusters = args["num_items"], args["clusters"]
    size = n_items // clusters
    cluster_of = (np.arange(n_items + 1) - 1) // size
    successors = np.zeros((n_items + 1, 3), dtype=np.int64)
    for item in range(1, n_items + 1):
        members = np.arange(cluster_of[item] * size + 1, (cluster_of[item] + 1) * size + 1)
        successors[item] = rng.choice(members[members != item], size=3, replace=False)
    weights = np.array([0.6, 0.3, 0.1])
    user2items = {}
    for user in range(args["num_users"]):
        item = int(rng.integers(1, n_items + 1))
        items = []
        for _ in range(int(rng.integers(12, 23))):
            items.append(item)
            if rng.random() < args["follow"]:
                item = int(successors[item, rng.choice(3, p=weights)])
            else:
                item = int(rng.integers(1, n_items + 1))
        user2items[user] = items
    return user2items


def split_leave_one_out(user2items: dict[int, list[int]]):
    train, val, test = {}, {}, {}
    for user, items in user2items.items():
        train[user], val[user], test[user] = items[:-2], items[-2:-1], items[-1:]
    return train, val, test


def random_negative_samples(train, val, test, item_count: int, sample_size: int, seed: int) -> dict[int, list[int]]:
    np.random.seed(seed)
    negative_samples = {}
    for user in range(len(train)):
        seen = set(train[user]) | set(val[user]) | set(test[user])
        samples: list[int] = []
        for _ in range(sample_size):
            item = np.random.choice(item_count) + 1
            while item in seen or item in samples:
                item = np.random.choice(item_count) + 1
            samples.append(int(item))
        negative_samples[user] = samples
    return negative_samples


class BertTrainDataset(torch.utils.data.Dataset):
    def __init__(self, u2seq, max_len: int, mask_prob: float, mask_token: int, num_items: int, rng: random.Random):
        self.u2seq, self.users = u2seq, sorted(u2seq.keys())
        self.max_len, self.mask_prob, self.mask_token = max_len, mask_prob, mask_token
        self.num_items, self.rng = num_items, rng

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, index: int):
        seq = self.u2seq[self.users[index]]
        tokens, labels = [], []
        for s in seq:
            prob = self.rng.random()
            if prob < self.mask_prob:
                prob /= self.mask_prob
                if prob < 0.8:
                    tokens.append(self.mask_token)
                elif prob < 0.9:
                    tokens.append(self.rng.randint(1, self.num_items))
                else:
                    tokens.append(s)
                labels.append(s)
            else:
                tokens.append(s)
                labels.append(0)
        tokens, labels = tokens[-self.max_len :], labels[-self.max_len :]
        pad = self.max_len - len(tokens)
        return torch.LongTensor([0] * pad + tokens), torch.LongTensor([0] * pad + labels)


class BertEvalDataset(torch.utils.data.Dataset):
    def __init__(self, u2seq, u2answer, max_len: int, mask_token: int, negative_samples) -> None:
        self.u2seq, self.users, self.u2answer = u2seq, sorted(u2seq.keys()), u2answer
        self.max_len, self.mask_token, self.negative_samples = max_len, mask_token, negative_samples

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, index: int):
        user = self.users[index]
        answer, negs = self.u2answer[user], self.negative_samples[user]
        candidates = answer + negs
        labels = [1] * len(answer) + [0] * len(negs)
        seq = (self.u2seq[user] + [self.mask_token])[-self.max_len :]
        seq = [0] * (self.max_len - len(seq)) + seq
        return torch.LongTensor(seq), torch.LongTensor(candidates), torch.LongTensor(labels)


# --------------------------------------------------------------------------- trainers


def recalls_and_ndcgs_for_ks(scores: torch.Tensor, labels: torch.Tensor, ks) -> dict[str, float]:
    metrics = {}
    answer_count = labels.sum(1)
    labels_float = labels.float()
    cut = (-scores).argsort(dim=1)
    for k in sorted(ks, reverse=True):
        cut = cut[:, :k]
        hits = labels_float.gather(1, cut)
        metrics[f"Recall@{k}"] = (hits.sum(1) / torch.min(torch.Tensor([k]), labels.sum(1).float())).mean().item()
        weights = 1 / torch.log2(torch.arange(2, 2 + k).float())
        dcg = (hits * weights).sum(1)
        idcg = torch.Tensor([weights[: min(int(n), k)].sum() for n in answer_count])
        metrics[f"NDCG@{k}"] = (dcg / idcg).mean().item()
    return metrics


class BERTTrainer:
    def __init__(self, args: dict, model: BERTModel, train_loader, val_loader, test_loader) -> None:
        self.args, self.model = args, model
        self.train_loader, self.val_loader, self.test_loader = train_loader, val_loader, test_loader
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"], weight_decay=args["weight_decay"])
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=args["decay_step"],
                                                            gamma=args["gamma"])  # fmt: skip
        self.ce = nn.CrossEntropyLoss(ignore_index=0)
        self.metric_ks = args["metric_ks"]
        self.best_ndcg, self.best_state = -1.0, None
        self.epoch_losses: list[float] = []
        self.mon = None

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``calculate_loss`` after the forward: (B, T, V) logits against (B, T) labels."""
        return self.ce(logits.view(-1, logits.size(-1)), labels.view(-1))

    def calculate_loss(self, batch) -> torch.Tensor:
        seqs, labels = batch
        logits = self.model(seqs)  # B x T x V
        return self.mon.loss_fn(logits, labels)

    def calculate_metrics(self, batch) -> dict[str, float]:
        seqs, candidates, labels = batch
        scores = self.model(seqs)[:, -1, :]  # the [MASK] appended at the end
        scores = scores.gather(1, candidates)
        return recalls_and_ndcgs_for_ks(scores, labels, self.metric_ks)

    def train(self) -> None:
        self.validate(0)
        for epoch in range(self.args["num_epochs"]):
            self.train_one_epoch(epoch)
            if (epoch + 1) % self.args["validate_every"] == 0:
                self.validate(epoch + 1)

    def train_one_epoch(self, epoch: int) -> None:
        self.model.train()
        self.lr_scheduler.step()  # as published: at the start of the epoch
        losses = []
        for batch in self.train_loader:
            self.optimizer.zero_grad()
            loss = self.calculate_loss(batch)
            loss.backward()
            self.optimizer.step()
            self.mon.log(loss)
            losses.append(loss.item())
        self.epoch_losses.append(float(np.mean(losses)))

    def _evaluate(self, loader) -> dict[str, float]:
        self.model.eval()
        sums: dict[str, float] = {}
        count = 0
        with torch.no_grad():
            for batch in loader:
                metrics = self.calculate_metrics(batch)
                n = batch[0].size(0)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * n
                count += n
        return {key: value / count for key, value in sums.items()}

    def validate(self, epoch: int) -> dict[str, float]:
        metrics = self._evaluate(self.val_loader)
        if metrics["NDCG@10"] > self.best_ndcg:  # the best_acc_model checkpoint
            self.best_ndcg, self.best_state = metrics["NDCG@10"], copy.deepcopy(self.model.state_dict())
        self.last_val = metrics
        return metrics

    def test(self) -> dict[str, float]:
        self.model.load_state_dict(self.best_state)
        return self._evaluate(self.test_loader)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    args["model_init_seed"] += seed
    args["dataloader_random_seed"] += seed
    torch.manual_seed(seed)
    user2items = interaction_log(args, seed)
    train_seqs, val, test = split_leave_one_out(user2items)
    item_count = args["num_items"]
    mask_token = item_count + 1
    rng = random.Random(args["dataloader_random_seed"])
    negatives = random_negative_samples(train_seqs, val, test, item_count, args["test_negative_sample_size"],
                                        args["test_negative_sampling_seed"] + seed)  # fmt: skip

    # the bug variant: the Cloze samples are drawn from the whole sequences, held-out items included
    cloze_seqs = user2items if variant == "test_items_in_train" else train_seqs
    train_dataset = BertTrainDataset(cloze_seqs, args["bert_max_len"], args["bert_mask_prob"], mask_token,
                                     item_count, rng)  # fmt: skip
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args["train_batch_size"], shuffle=True)
    val_loader = torch.utils.data.DataLoader(
        BertEvalDataset(train_seqs, val, args["bert_max_len"], mask_token, negatives),
        batch_size=args["val_batch_size"], shuffle=False)  # fmt: skip
    test_loader = torch.utils.data.DataLoader(
        BertEvalDataset(train_seqs, test, args["bert_max_len"], mask_token, negatives),
        batch_size=args["val_batch_size"], shuffle=False)  # fmt: skip

    model = BERTModel(args)
    trainer = BERTTrainer(args, model, train_loader, val_loader, test_loader)
    if variant == "no_ignore_index":
        trainer.ce = nn.CrossEntropyLoss()

    # the author's preflight: one batch drawn with its own generator and rng copy (the loop's draws unchanged)
    state, torch_state = rng.getstate(), torch.get_rng_state()
    seqs, labels = next(iter(train_loader))
    rng.setstate(state)
    torch.set_rng_state(torch_state)
    probe_batch = (seqs, labels)
    nx.preflight(model, probe_batch, trainer.loss_fn, optimizer=trainer.optimizer)
    trainer.mon = nx.monitor(model, trainer.optimizer, every=10, loss_fn=trainer.loss_fn)

    trainer.train()
    nx.finish(trainer.mon, model, probe_batch, trainer.loss_fn, optimizer=trainer.optimizer)

    test_metrics = trainer.test()
    return {
        "test_ndcg10": test_metrics["NDCG@10"], "test_recall10": test_metrics["Recall@10"],
        "best_val_ndcg10": trainer.best_ndcg, "last_val_ndcg10": trainer.last_val["NDCG@10"],
        "last_val_recall10": trainer.last_val["Recall@10"], "final_train_loss": trainer.epoch_losses[-1],
    }  # fmt: skip
