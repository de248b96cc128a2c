"""Port of jadore801120/attention-is-all-you-need-pytorch: the Transformer trained with ScheduledOptim.

Source: github.com/jadore801120/attention-is-all-you-need-pytorch, ``train.py``,
``transformer/Models.py``, ``transformer/Layers.py``, ``transformer/SubLayers.py``,
``transformer/Modules.py`` and ``transformer/Optim.py`` at commit
132907dd272e2cc92e3c10e6c4e783a87ff8893d (MIT, Copyright (c) 2017 Victor Huang). Written
anew from the facts of those files; no code copied.

Kept: ``Transformer`` with ``-embs_share_weight -proj_share_weight`` (the README's command)
and ``scale_emb_or_prj='prj'`` (logits times ``d_model ** -0.5``): ``Encoder``/``Decoder``
= padded ``nn.Embedding`` -> sinusoid ``PositionalEncoding`` (a buffer) -> ``Dropout`` ->
``LayerNorm(eps=1e-6)`` -> layers; post-norm ``MultiHeadAttention`` (bias-free q/k/v/fc
projections, ``ScaledDotProductAttention`` with temperature ``sqrt(d_k)``, masked_fill
-1e9, attention dropout, residual then LayerNorm) and ``PositionwiseFeedForward`` (ReLU,
dropout, residual, LayerNorm); xavier_uniform on every matrix, then the weights tied;
``get_pad_mask`` and ``get_subsequent_mask`` with ``trg_mask = pad & subsequent``;
``forward`` returns logits flattened to (tokens, vocab). ``ScheduledOptim``:
``Adam(betas=(0.9, 0.98), eps=1e-9)`` whose LR is set before each step to ``lr_mul *
d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)``. ``train.py``: ``patch_src`` /
``patch_trg`` (time-major batches transposed, decoder input ``trg[:, :-1]``, gold
``trg[:, 1:]``), ``cal_loss`` with label smoothing (eps 0.1 spread over ``n_class - 1``,
pad positions masked, summed), ``cal_performance`` (argmax accuracy over non-pad
tokens); ``train_epoch``: ``model.train()``, ``zero_grad``, forward, loss, ``backward``,
``step_and_update_lr``; ``eval_epoch`` under ``model.eval()`` and ``no_grad`` without
smoothing; per-word loss and accuracy per epoch; the best model (lowest valid loss) kept.
Shrunk: a synthetic reversal "translation" task (source: 3-10 symbols from 20, target:
``<s>`` + the source reversed + ``</s>``; shared vocabulary with ``<blank>`` pad,
``<unk>``, ``<s>``, ``</s>``), 2,048 training / 256 validation pairs, batches of 64
shuffled each epoch, instead of Multi30k with BucketIterator; d_model 32, d_inner 64, 2
layers, 4 heads, d_k = d_v = 8 instead of 512/2048/6/8/64; 8 epochs (256 steps) with
``-warmup 40 -lr_mul 0.25`` (peak LR 7e-3) instead of 4000 steps and 2.0 (a warmup of 4000
would never end in 256 steps); no checkpoint files or TensorBoard.
Measure only (not in the program): token accuracy of greedy decoding on the validation
pairs, built step by step with the subsequent mask as ``Translator`` does.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with ``cal_loss`` (smoothing on) as the loss; ``nndx.Monitor(model, optimizer._optimizer)``
(the Adam inside ``ScheduledOptim``: the wrapper is not a torch optimizer) around the
epochs, each batch's per-word loss and accuracy logged, each ``eval_epoch``'s as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the first batch.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "attention_is_all_you_need"
SOURCE = Source("jadore801120/attention-is-all-you-need-pytorch", "train.py",
                "132907dd272e2cc92e3c10e6c4e783a87ff8893d", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shared embeddings and projection, label smoothing)"),
        Variant(
            "no_subsequent_mask",
            "Transformer.forward builds trg_mask from get_pad_mask alone (the subsequent mask dropped): the "
            "decoder attends to the very tokens it is trained to predict",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/19",
             "https://github.com/pytorch/tutorials/issues/719",
             "https://github.com/IpsumDominum/Pytorch-Simple-Transformer/issues/3"),
            Measure("greedy_accuracy", "token accuracy of greedy decoding (with the subsequent mask, as "
                    "Translator decodes) at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "warmup_default_4000",
            "-warmup left at its default 4000 for a run of 256 steps (the script's own warning for small "
            "batches): the ScheduledOptim LR is still ramping up at 5e-5 when training ends",
            (C.LR_TOO_LOW,),
            ("https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/147",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/pull/168",
             "https://github.com/hirofumi0810/neural_sp/issues/137"),
            Measure("valid_accuracy", "validation token accuracy at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

PAD, UNK, BOS, EOS = 0, 1, 2, 3
N_SYMBOLS, MIN_LEN, MAX_LEN = 20, 3, 10
VOCAB = 4 + N_SYMBOLS
N_TRAIN, N_VALID, BATCH_SIZE, EPOCHS = 2048, 256, 64, 8
D_MODEL, D_INNER, N_LAYERS, N_HEAD, D_K, D_V, DROPOUT = 32, 64, 2, 4, 8, 8, 0.1
LR_MUL, WARMUP = 0.25, 40


# --------------------------------------------------------------------------- the data (Multi30k's stand-in)


def pairs(n: int, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    out = []
    for _ in range(n):
        src = list(rng.integers(4, VOCAB, size=rng.integers(MIN_LEN, MAX_LEN + 1)))
        out.append((src, [BOS] + src[::-1] + [EOS]))
    return out


def to_batch(examples) -> tuple[torch.Tensor, torch.Tensor]:
    """Like a torchtext Field: padded, time-major (len, batch) LongTensors for src and trg."""
    def pad(seqs):
        width = max(len(s) for s in seqs)
        return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs], dtype=torch.long).t().contiguous()
    return pad([s for s, _ in examples]), pad([t for _, t in examples])


def batches(examples, rng: np.random.Generator | None):
    order = rng.permutation(len(examples)) if rng is not None else np.arange(len(examples))
    return [to_batch([examples[j] for j in order[i : i + BATCH_SIZE]]) for i in range(0, len(examples), BATCH_SIZE)]


# --------------------------------------------------------------------------- transformer/Modules.py, SubLayers.py, Layers.py


class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature: float, attn_dropout: float = 0.1) -> None:
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q, k, v, mask=None):
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        return torch.matmul(attn, v), attn


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.attention = ScaledDotProductAttention(temperature=d_k**0.5)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

    def forward(self, q, k, v, mask=None):
        n_head, d_k, d_v = self.n_head, self.d_k, self.d_v
        sz_b, len_q, len_k, len_v = q.size(0), q.size(1), k.size(1), v.size(1)
        residual = q
        q = self.w_qs(q).view(sz_b, len_q, n_head, d_k).transpose(1, 2)
        k = self.w_ks(k).view(sz_b, len_k, n_head, d_k).transpose(1, 2)
        v = self.w_vs(v).view(sz_b, len_v, n_head, d_v).transpose(1, 2)
        if mask is not None:
            mask = mask.unsqueeze(1)  # broadcast over heads
        q, attn = self.attention(q, k, v, mask=mask)
        q = q.transpose(1, 2).contiguous().view(sz_b, len_q, -1)
        q = self.dropout(self.fc(q))
        q += residual
        return self.layer_norm(q), attn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_in, d_hid), nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        x = self.dropout(self.w_2(F.relu(self.w_1(x))))
        x += residual
        return self.layer_norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, enc_input, slf_attn_mask=None):
        enc_output, enc_slf_attn = self.slf_attn(enc_input, enc_input, enc_input, mask=slf_attn_mask)
        return self.pos_ffn(enc_output), enc_slf_attn


class DecoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, dec_input, enc_output, slf_attn_mask=None, dec_enc_attn_mask=None):
        dec_output, dec_slf_attn = self.slf_attn(dec_input, dec_input, dec_input, mask=slf_attn_mask)
        dec_output, dec_enc_attn = self.enc_attn(dec_output, enc_output, enc_output, mask=dec_enc_attn_mask)
        return self.pos_ffn(dec_output), dec_slf_attn, dec_enc_attn


# --------------------------------------------------------------------------- transformer/Models.py


def get_pad_mask(seq: torch.Tensor, pad_idx: int) -> torch.Tensor:
    return (seq != pad_idx).unsqueeze(-2)


def get_subsequent_mask(seq: torch.Tensor) -> torch.Tensor:
    _, len_s = seq.size()
    return (1 - torch.triu(torch.ones((1, len_s, len_s), device=seq.device), diagonal=1)).bool()


class PositionalEncoding(nn.Module):
    def __init__(self, d_hid: int, n_position: int = 200) -> None:
        super().__init__()
        position = np.arange(n_position)[:, None]
        angles = position / np.power(10000, 2 * (np.arange(d_hid) // 2) / d_hid)[None, :]
        angles[:, 0::2], angles[:, 1::2] = np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])
        self.register_buffer("pos_table", torch.FloatTensor(angles).unsqueeze(0))

    def forward(self, x):
        return x + self.pos_table[:, : x.size(1)].clone().detach()


class Encoder(nn.Module):
    def __init__(self, n_src_vocab, d_word_vec, n_layers, n_head, d_k, d_v, d_model, d_inner, pad_idx, dropout=0.1,
                 n_position=200, scale_emb=False) -> None:  # fmt: skip
        super().__init__()
        self.src_word_emb = nn.Embedding(n_src_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = PositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList([EncoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout)
                                          for _ in range(n_layers)])  # fmt: skip
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb, self.d_model = scale_emb, d_model

    def forward(self, src_seq, src_mask):
        enc_output = self.src_word_emb(src_seq)
        if self.scale_emb:
            enc_output *= self.d_model**0.5
        enc_output = self.layer_norm(self.dropout(self.position_enc(enc_output)))
        for enc_layer in self.layer_stack:
            enc_output, _ = enc_layer(enc_output, slf_attn_mask=src_mask)
        return (enc_output,)


class Decoder(nn.Module):
    def __init__(self, n_trg_vocab, d_word_vec, n_layers, n_head, d_k, d_v, d_model, d_inner, pad_idx,
                 n_position=200, dropout=0.1, scale_emb=False) -> None:  # fmt: skip
        super().__init__()
        self.trg_word_emb = nn.Embedding(n_trg_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = PositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList([DecoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout)
                                          for _ in range(n_layers)])  # fmt: skip
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb, self.d_model = scale_emb, d_model

    def forward(self, trg_seq, trg_mask, enc_output, src_mask):
        dec_output = self.trg_word_emb(trg_seq)
        if self.scale_emb:
            dec_output *= self.d_model**0.5
        dec_output = self.layer_norm(self.dropout(self.position_enc(dec_output)))
        for dec_layer in self.layer_stack:
            dec_output, _, _ = dec_layer(dec_output, enc_output, slf_attn_mask=trg_mask, dec_enc_attn_mask=src_mask)
        return (dec_output,)


class Transformer(nn.Module):
    def __init__(self, n_src_vocab, n_trg_vocab, src_pad_idx, trg_pad_idx, d_word_vec=512, d_model=512, d_inner=2048,
                 n_layers=6, n_head=8, d_k=64, d_v=64, dropout=0.1, n_position=200, trg_emb_prj_weight_sharing=True,
                 emb_src_trg_weight_sharing=True, scale_emb_or_prj="prj", subsequent_mask=True) -> None:  # fmt: skip
        super().__init__()
        self.src_pad_idx, self.trg_pad_idx = src_pad_idx, trg_pad_idx
        scale_emb = (scale_emb_or_prj == "emb") if trg_emb_prj_weight_sharing else False
        self.scale_prj = (scale_emb_or_prj == "prj") if trg_emb_prj_weight_sharing else False
        self.d_model = d_model
        self.subsequent_mask = subsequent_mask  # False: the bug
        self.encoder = Encoder(n_src_vocab, d_word_vec, n_layers, n_head, d_k, d_v, d_model, d_inner, src_pad_idx,
                               dropout=dropout, n_position=n_position, scale_emb=scale_emb)  # fmt: skip
        self.decoder = Decoder(n_trg_vocab, d_word_vec, n_layers, n_head, d_k, d_v, d_model, d_inner, trg_pad_idx,
                               n_position=n_position, dropout=dropout, scale_emb=scale_emb)  # fmt: skip
        self.trg_word_prj = nn.Linear(d_model, n_trg_vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if trg_emb_prj_weight_sharing:
            self.trg_word_prj.weight = self.decoder.trg_word_emb.weight
        if emb_src_trg_weight_sharing:
            self.encoder.src_word_emb.weight = self.decoder.trg_word_emb.weight

    def forward(self, src_seq, trg_seq):
        src_mask = get_pad_mask(src_seq, self.src_pad_idx)
        trg_mask = get_pad_mask(trg_seq, self.trg_pad_idx)
        if self.subsequent_mask:
            trg_mask = trg_mask & get_subsequent_mask(trg_seq)
        enc_output, *_ = self.encoder(src_seq, src_mask)
        dec_output, *_ = self.decoder(trg_seq, trg_mask, enc_output, src_mask)
        seq_logit = self.trg_word_prj(dec_output)
        if self.scale_prj:
            seq_logit *= self.d_model**-0.5
        return seq_logit.view(-1, seq_logit.size(2))


# --------------------------------------------------------------------------- transformer/Optim.py


class ScheduledOptim:
    def __init__(self, optimizer: torch.optim.Optimizer, lr_mul: float, d_model: int, n_warmup_steps: int) -> None:
        self._optimizer, self.lr_mul, self.d_model, self.n_warmup_steps = optimizer, lr_mul, d_model, n_warmup_steps
        self.n_steps = 0

    def step_and_update_lr(self) -> None:
        self._update_learning_rate()
        self._optimizer.step()

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()

    def _get_lr_scale(self) -> float:
        n, w = self.n_steps, self.n_warmup_steps
        return (self.d_model**-0.5) * min(n ** (-0.5), n * w ** (-1.5))

    def _update_learning_rate(self) -> None:
        self.n_steps += 1
        lr = self.lr_mul * self._get_lr_scale()
        for param_group in self._optimizer.param_groups:
            param_group["lr"] = lr


# --------------------------------------------------------------------------- train.py


def cal_loss(pred, gold, trg_pad_idx, smoothing=False):
    gold = gold.contiguous().view(-1)
    if smoothing:
        eps, n_class = 0.1, pred.size(1)
        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (n_class - 1)
        log_prb = F.log_softmax(pred, dim=1)
        non_pad_mask = gold.ne(trg_pad_idx)
        loss = -(one_hot * log_prb).sum(dim=1)
        return loss.masked_select(non_pad_mask).sum()
    return F.cross_entropy(pred, gold, ignore_index=trg_pad_idx, reduction="sum")


def cal_performance(pred, gold, trg_pad_idx, smoothing=False):
    loss = cal_loss(pred, gold, trg_pad_idx, smoothing=smoothing)
    pred = pred.max(1)[1]
    gold = gold.contiguous().view(-1)
    non_pad_mask = gold.ne(trg_pad_idx)
    n_correct = pred.eq(gold).masked_select(non_pad_mask).sum().item()
    return loss, n_correct, non_pad_mask.sum().item()


def patch_src(src):
    return src.transpose(0, 1)


def patch_trg(trg):
    trg = trg.transpose(0, 1)
    return trg[:, :-1], trg[:, 1:].contiguous().view(-1)


def greedy_accuracy(model: Transformer, examples) -> float:
    """Measure only: decode each validation source greedily, one token at a time with the
    subsequent mask (``Translator``'s beam of 1), and score the tokens against the gold."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for src, trg in batches(examples, None):
            src_seq, gold = patch_src(src), patch_trg(trg)[1].view(src.size(1), -1)
            src_mask = get_pad_mask(src_seq, PAD)
            enc_output, *_ = model.encoder(src_seq, src_mask)
            dec = torch.full((src_seq.size(0), 1), BOS, dtype=torch.long)
            for _ in range(gold.size(1)):
                dec_output, *_ = model.decoder(dec, get_subsequent_mask(dec), enc_output, src_mask)
                logit = model.trg_word_prj(dec_output[:, -1]) * (model.d_model**-0.5 if model.scale_prj else 1.0)
                dec = torch.cat([dec, logit.argmax(-1, keepdim=True)], dim=1)
            mask = gold.ne(PAD)
            correct += dec[:, 1:].eq(gold).masked_select(mask).sum().item()
            total += mask.sum().item()
    return correct / total


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_examples, valid_examples = pairs(N_TRAIN, rng), pairs(N_VALID, rng)
    transformer = Transformer(VOCAB, VOCAB, src_pad_idx=PAD, trg_pad_idx=PAD, trg_emb_prj_weight_sharing=True,
                              emb_src_trg_weight_sharing=True, d_k=D_K, d_v=D_V, d_model=D_MODEL, d_word_vec=D_MODEL,
                              d_inner=D_INNER, n_layers=N_LAYERS, n_head=N_HEAD, dropout=DROPOUT, scale_emb_or_prj="prj",
                              subsequent_mask=variant != "no_subsequent_mask")  # fmt: skip
    warmup = 4000 if variant == "warmup_default_4000" else WARMUP
    optimizer = ScheduledOptim(torch.optim.Adam(transformer.parameters(), betas=(0.9, 0.98), eps=1e-09),
                               LR_MUL, D_MODEL, warmup)  # fmt: skip

    def loss_fn(pred, gold):
        return cal_loss(pred, gold, PAD, smoothing=True)

    first_src, first_trg = to_batch(train_examples[:BATCH_SIZE])
    trg_seq0, gold0 = patch_trg(first_trg)
    probe_batch = ((patch_src(first_src), trg_seq0), gold0)
    nx.preflight(transformer, probe_batch, loss_fn, optimizer=optimizer._optimizer)
    mon = nx.monitor(transformer, optimizer._optimizer, every=5)

    def train_epoch(training_data):
        transformer.train()
        total_loss, n_word_total, n_word_correct = 0.0, 0, 0
        for src, trg in training_data:
            src_seq = patch_src(src)
            trg_seq, gold = patch_trg(trg)
            optimizer.zero_grad()
            pred = transformer(src_seq, trg_seq)
            loss, n_correct, n_word = cal_performance(pred, gold, PAD, smoothing=True)
            loss.backward()
            optimizer.step_and_update_lr()
            mon.log(loss / n_word, accuracy=n_correct / n_word)
            n_word_total += n_word
            n_word_correct += n_correct
            total_loss += loss.item()
        return total_loss / n_word_total, n_word_correct / n_word_total

    def eval_epoch(validation_data):
        transformer.eval()
        total_loss, n_word_total, n_word_correct = 0.0, 0, 0
        with torch.no_grad():
            for src, trg in validation_data:
                src_seq = patch_src(src)
                trg_seq, gold = patch_trg(trg)
                pred = transformer(src_seq, trg_seq)
                loss, n_correct, n_word = cal_performance(pred, gold, PAD, smoothing=False)
                n_word_total += n_word
                n_word_correct += n_correct
                total_loss += loss.item()
        return total_loss / n_word_total, n_word_correct / n_word_total

    validation_data = batches(valid_examples, None)
    valid_losses: list[float] = []
    best_state = None
    for _epoch_i in range(EPOCHS):
        train_loss, train_accu = train_epoch(batches(train_examples, rng))
        valid_loss, valid_accu = eval_epoch(validation_data)
        mon.log(valid_loss, split="val", accuracy=valid_accu)
        valid_losses.append(valid_loss)
        if valid_loss <= min(valid_losses):  # save_mode 'best'
            best_state = copy.deepcopy(transformer.state_dict())

    nx.finish(mon, transformer, probe_batch, loss_fn, optimizer=optimizer._optimizer)
    final = {"train_loss": train_loss, "train_accuracy": train_accu, "valid_loss": valid_loss,
             "valid_accuracy": valid_accu, "lr": optimizer._optimizer.param_groups[0]["lr"]}  # fmt: skip
    transformer.load_state_dict(best_state)
    final["greedy_accuracy"] = greedy_accuracy(transformer, valid_examples)
    return final
