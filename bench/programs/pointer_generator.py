"""Port of atulkum/pointer_summarizer (a PyTorch port of See et al.'s pointer-generator network:
a BiLSTM encoder, a Bahdanau-attention LSTM decoder whose output mixes the vocabulary softmax
with the copy attention over the source's extended-vocabulary ids, trained with Adagrad).

Source: github.com/atulkum/pointer_summarizer, ``training_ptr_gen/model.py``,
``training_ptr_gen/train.py``, ``training_ptr_gen/train_util.py``, ``data_util/batcher.py`` and
``data_util/config.py`` at commit 4967dd478ba70b1c12116ad6357dcc1d000e5dfa (Apache-2.0,
Copyright (c) atulkum). Written anew from the facts of those files; no code copied.

Kept: the special ids (``[UNK]`` 0, ``[PAD]`` 1, ``[START]`` 2, ``[STOP]`` 3); ``Example``'s
article ids with OOVs as UNK, ``article2ids`` (the article's OOVs numbered ``vocab_size + i``
in order of appearance), ``abstract2ids`` (summary OOVs that occur in the article get their
temporary id, others UNK), ``get_dec_inp_targ_seqs`` (decoder input ``[START] + abstract``,
target ``abstract + [STOP]``), padding with ``[PAD]``; a ``Batch`` sorted by article length
(``pack_padded_sequence`` needs descending lengths), ``enc_padding_mask``, ``max_art_oovs``
and ``extra_zeros``, ``c_t_1`` zeros; ``Encoder`` (shared ``Embedding``, one-layer
bidirectional ``LSTM`` over the packed sequence, ``W_h`` without bias on the outputs);
``ReduceState`` (``reduce_h``/``reduce_c`` + ReLU of the two directions' states);
``Attention`` (``decode_proj`` of ``[h; c]``, ``v(tanh(W_h h_i + decode_proj(s_t)))``, softmax,
times the padding mask, renormalised; ``W_c`` coverage feature when ``is_coverage``);
``Decoder`` (``x_context`` of ``[c_{t-1}; emb(y_{t-1})]``, one-step ``LSTM``, attention,
``p_gen = sigmoid(p_gen_linear([c_t; s_t; x]))``, ``out2(out1([lstm_out; c_t]))`` softmax,
``p_gen * vocab_dist`` concatenated with ``extra_zeros`` and ``scatter_add`` of
``(1 - p_gen) * attn_dist`` at the extended ids; the eval-mode step-0 attention over the
reduced state); the embedding shared between encoder and decoder; the inits
(``rand_unif_init_mag`` 0.02 for the LSTM weights with forget bias 1, ``trunc_norm_init_std``
1e-4 normal for embeddings, ``reduce_*`` and ``out2``); ``train_one_batch``: ``zero_grad``,
teacher forcing for ``min(max_dec_len, max_dec_steps)`` steps, ``-log(gold_prob + eps)``
(``eps`` 1e-12), ``cov_loss_wt`` times ``sum(min(attn, coverage))`` when ``is_coverage`` (off, the
default), times the decoder padding mask, summed over steps and divided by each summary's
length, batch mean, ``backward``, ``clip_grad_norm_`` of encoder, decoder and reduce_state
separately at ``max_grad_norm`` 2.0, ``step``; ``Adagrad(lr=0.15,
initial_accumulator_value=0.1)``; ``calc_running_avg_loss`` (decay 0.99, clipped at 12);
``eval.py``'s loss on held-out batches; ``decode.py``'s feeding back of UNK for an extended id.
Shrunk: a synthetic "summarisation" task (no downloads): each article is 8-14 tokens from a
40-word vocabulary plus rare words outside it (each article token is rare with probability
0.15); its summary is the article's key tokens in order (the 10 "content" words and every
rare word), at most 6, so rare words can only be produced by copying; 3,000 training and
200 held-out articles; ``vocab_size`` 40 instead of 50k, ``emb_dim`` 16 instead of 128,
``hidden_dim`` 32 instead of 256, ``batch_size`` 16 instead of 8, ``max_enc_steps`` 14,
``max_dec_steps`` 7; 600 iterations instead of 500k; no TensorFlow summary writer, no
checkpoints. Beam search (``decode.py``) replaced by greedy decoding.
Measure only (not in the program): greedy decoding of the 200 held-out articles
(``decode.py`` with beam size 1), token accuracy against the reference summary + STOP, a
ROUGE-1-like unigram F1 (the program reports ROUGE through pyrouge), and the accuracy on the
rare (copy-only) reference tokens.

nndx, as the author would add it: the three modules of ``Model`` (a plain object) gathered
in one ``nn.Module`` whose forward is ``train_one_batch``'s encoder, ``reduce_state`` and
teacher-forced decoder loop (returning the stacked final distributions), with the masked,
length-normalised NLL as the loss (the padding mask and lengths read off the ``[PAD]``s of
the target); a preflight ``nndx.probe`` on the first batch with the optimizer;
``nndx.Monitor`` around the iterations with the loss computed through ``mon.loss_fn``, each
batch's loss logged, and ``eval.py``'s held-out loss logged as ``split="val"`` every 100
iterations; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.optim import Adagrad

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pointer_generator"
SOURCE = Source("atulkum/pointer_summarizer", "training_ptr_gen/train.py", "4967dd478ba70b1c12116ad6357dcc1d000e5dfa",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (pointer_gen on, coverage off)"),
        Variant(
            "decoder_input_is_target",
            "get_dec_inp_targ_seqs returns the target (abstract + [STOP]) as the decoder input instead of "
            "[START] + abstract: under teacher forcing the decoder is shown, at every step, the token it must "
            "predict",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/abisee/pointer-generator/issues/34",
             "https://github.com/huggingface/transformers/issues/11977",
             "https://github.com/abhimishra91/transformers-tutorials/issues/15"),
            Measure("rouge1_f", "ROUGE-1-like F1 of greedy held-out summaries at least 0.15 below the healthy "
                    "run's: 0.70 against 0.96 on seed 0 (token accuracy 0.78 against 0.95) while the training "
                    "loss ends lower, 0.27 against 0.32", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "attention_softmax_over_batch",
            "the attention's F.softmax(scores, dim=0) instead of dim=1: the scores are normalised over the "
            "batch's articles at each source position (the padding mask's renormalisation then makes each row "
            "sum to 1), so every article's attention, and with it the copy distribution, depends on the other "
            "articles in the batch",
            (C.WRONG_RESHAPE, C.SHAPE_BROADCAST),
            ("https://github.com/PetrochukM/PyTorch-NLP/issues/2",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52",
             "https://github.com/tsunrise/everybody-compose/pull/53",
             "https://github.com/ssw-nlp-study-group/nlp_study/pull/2"),
            Measure("token_accuracy", "greedy held-out token accuracy at least 0.05 below the healthy run's: 0.87 "
                    "against 0.95 on seed 0 (rare-word accuracy 0.83 against 0.94, the training loss 0.65 "
                    "against 0.32)", lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

# data_util/config.py, shrunk
CONFIG = {"hidden_dim": 32, "emb_dim": 16, "batch_size": 16, "max_enc_steps": 14, "max_dec_steps": 7,
          "vocab_size": 40, "lr": 0.15, "adagrad_init_acc": 0.1, "rand_unif_init_mag": 0.02,
          "trunc_norm_init_std": 1e-4, "max_grad_norm": 2.0, "pointer_gen": True, "is_coverage": False,
          "cov_loss_wt": 1.0, "eps": 1e-12, "max_iterations": 600}  # fmt: skip
UNK, PAD, START, STOP = 0, 1, 2, 3
N_CONTENT, N_RARE, P_RARE, MAX_SUMMARY = 10, 200, 0.15, 6
N_TRAIN, N_HELD_OUT, EVAL_EVERY = 3000, 200, 100


# --------------------------------------------------------------------------- the data (the CNN/DM stand-in)


def articles(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(article, abstract) as word numbers: 4..vocab_size-1 are in the vocabulary (4..13 the
    content words), vocab_size.. are rare words (never in the vocabulary)."""
    rng = np.random.default_rng(seed)
    v = CONFIG["vocab_size"]
    out = []
    for _ in range(n):
        length = int(rng.integers(8, CONFIG["max_enc_steps"] + 1))
        words = [int(v + rng.integers(N_RARE)) if rng.random() < P_RARE else int(rng.integers(4, v))
                 for _ in range(length)]  # fmt: skip
        abstract = [w for w in words if w >= v or w < 4 + N_CONTENT][:MAX_SUMMARY]
        out.append((words, abstract))
    return out


class Example:
    """batcher.Example: the ids of one (article, abstract) pair."""

    def __init__(self, article: list[int], abstract: list[int], variant: str) -> None:
        v = CONFIG["vocab_size"]
        article = article[: CONFIG["max_enc_steps"]]
        self.enc_len = len(article)
        self.enc_input = [w if w < v else UNK for w in article]
        abs_ids = [w if w < v else UNK for w in abstract]
        self.dec_input, self.target = self.get_dec_inp_targ_seqs(abs_ids, variant)
        # article2ids / abstract2ids: in-article OOVs get temporary ids vocab_size + i
        self.article_oovs: list[int] = []
        self.enc_input_extend_vocab = []
        for w in article:
            if w < v:
                self.enc_input_extend_vocab.append(w)
            else:
                if w not in self.article_oovs:
                    self.article_oovs.append(w)
                self.enc_input_extend_vocab.append(v + self.article_oovs.index(w))
        abs_extend = [w if w < v else (v + self.article_oovs.index(w) if w in self.article_oovs else UNK)
                      for w in abstract]  # fmt: skip
        _, self.target = self.get_dec_inp_targ_seqs(abs_extend, variant)
        self.dec_len = len(self.dec_input)
        self.original_abstract = abstract

    @staticmethod
    def get_dec_inp_targ_seqs(sequence: list[int], variant: str) -> tuple[list[int], list[int]]:
        max_len = CONFIG["max_dec_steps"]
        inp, target = [START] + sequence[:], sequence[:]
        if len(inp) > max_len:
            inp, target = inp[:max_len], target[:max_len]
        else:
            target.append(STOP)
        if variant == "decoder_input_is_target":
            inp = [t if t < CONFIG["vocab_size"] else UNK for t in target]  # the target, OOVs as UNK
        return inp, target


class Batch:
    """batcher.Batch (examples sorted by article length, as the Batcher does)."""

    def __init__(self, examples: list[Example]) -> None:
        examples = sorted(examples, key=lambda ex: ex.enc_len, reverse=True)
        b = len(examples)
        max_enc = max(ex.enc_len for ex in examples)
        self.enc_batch = np.full((b, max_enc), PAD, dtype=np.int64)
        self.enc_batch_extend_vocab = np.full((b, max_enc), PAD, dtype=np.int64)
        self.enc_padding_mask = np.zeros((b, max_enc), dtype=np.float32)
        self.enc_lens = np.array([ex.enc_len for ex in examples], dtype=np.int64)
        for i, ex in enumerate(examples):
            self.enc_batch[i, : ex.enc_len] = ex.enc_input
            self.enc_batch_extend_vocab[i, : ex.enc_len] = ex.enc_input_extend_vocab
            self.enc_padding_mask[i, : ex.enc_len] = 1
        self.max_art_oovs = max(len(ex.article_oovs) for ex in examples)
        max_dec = CONFIG["max_dec_steps"]
        self.dec_batch = np.full((b, max_dec), PAD, dtype=np.int64)
        self.target_batch = np.full((b, max_dec), PAD, dtype=np.int64)
        self.dec_padding_mask = np.zeros((b, max_dec), dtype=np.float32)
        self.dec_lens = np.array([ex.dec_len for ex in examples], dtype=np.int64)
        for i, ex in enumerate(examples):
            self.dec_batch[i, : ex.dec_len] = ex.dec_input
            self.target_batch[i, : len(ex.target)] = ex.target
            self.dec_padding_mask[i, : ex.dec_len] = 1
        self.examples = examples


def get_input_from_batch(batch: Batch):
    b = len(batch.enc_lens)
    enc_batch = torch.from_numpy(batch.enc_batch)
    enc_padding_mask = torch.from_numpy(batch.enc_padding_mask)
    enc_lens = torch.from_numpy(batch.enc_lens)
    enc_batch_extend_vocab = torch.from_numpy(batch.enc_batch_extend_vocab)
    extra_zeros = torch.zeros((b, batch.max_art_oovs)) if batch.max_art_oovs > 0 else None
    c_t_1 = torch.zeros((b, 2 * CONFIG["hidden_dim"]))
    coverage = torch.zeros(enc_batch.size()) if CONFIG["is_coverage"] else None
    return enc_batch, enc_padding_mask, enc_lens, enc_batch_extend_vocab, extra_zeros, c_t_1, coverage


# --------------------------------------------------------------------------- training_ptr_gen/model.py


def init_lstm_wt(lstm: nn.LSTM) -> None:
    for name, p in lstm.named_parameters():
        if name.startswith("weight_"):
            p.data.uniform_(-CONFIG["rand_unif_init_mag"], CONFIG["rand_unif_init_mag"])
        elif name.startswith("bias_"):
            n = p.size(0)
            p.data.fill_(0.0)
            p.data[n // 4 : n // 2].fill_(1.0)  # forget gate bias 1


def init_linear_wt(linear: nn.Linear) -> None:
    linear.weight.data.normal_(std=CONFIG["trunc_norm_init_std"])
    if linear.bias is not None:
        linear.bias.data.normal_(std=CONFIG["trunc_norm_init_std"])


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hd, ed = CONFIG["hidden_dim"], CONFIG["emb_dim"]
        self.embedding = nn.Embedding(CONFIG["vocab_size"], ed)
        self.embedding.weight.data.normal_(std=CONFIG["trunc_norm_init_std"])
        self.lstm = nn.LSTM(ed, hd, num_layers=1, batch_first=True, bidirectional=True)
        init_lstm_wt(self.lstm)
        self.W_h = nn.Linear(hd * 2, hd * 2, bias=False)

    def forward(self, input: torch.Tensor, seq_lens: torch.Tensor):
        embedded = self.embedding(input)
        packed = pack_padded_sequence(embedded, seq_lens.cpu(), batch_first=True)
        output, hidden = self.lstm(packed)
        encoder_outputs, _ = pad_packed_sequence(output, batch_first=True)
        encoder_outputs = encoder_outputs.contiguous()
        encoder_feature = self.W_h(encoder_outputs.view(-1, 2 * CONFIG["hidden_dim"]))
        return encoder_outputs, encoder_feature, hidden


class ReduceState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hd = CONFIG["hidden_dim"]
        self.reduce_h = nn.Linear(hd * 2, hd)
        init_linear_wt(self.reduce_h)
        self.reduce_c = nn.Linear(hd * 2, hd)
        init_linear_wt(self.reduce_c)

    def forward(self, hidden):
        hd = CONFIG["hidden_dim"]
        h, c = hidden
        h_in = h.transpose(0, 1).contiguous().view(-1, hd * 2)
        c_in = c.transpose(0, 1).contiguous().view(-1, hd * 2)
        return F.relu(self.reduce_h(h_in)).unsqueeze(0), F.relu(self.reduce_c(c_in)).unsqueeze(0)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hd = CONFIG["hidden_dim"]
        if CONFIG["is_coverage"]:
            self.W_c = nn.Linear(1, hd * 2, bias=False)
        self.decode_proj = nn.Linear(hd * 2, hd * 2)
        self.v = nn.Linear(hd * 2, 1, bias=False)
        self.softmax_dim = 1  # over the source positions (the bug: 0, over the batch)

    def forward(self, s_t_hat, encoder_outputs, encoder_feature, enc_padding_mask, coverage):
        b, t_k, n = encoder_outputs.size()
        dec_fea = self.decode_proj(s_t_hat)
        dec_fea_expanded = dec_fea.unsqueeze(1).expand(b, t_k, n).contiguous().view(-1, n)
        att_features = encoder_feature + dec_fea_expanded
        if CONFIG["is_coverage"]:
            att_features = att_features + self.W_c(coverage.view(-1, 1))
        scores = self.v(torch.tanh(att_features)).view(-1, t_k)
        attn_dist_ = F.softmax(scores, dim=self.softmax_dim) * enc_padding_mask
        attn_dist = attn_dist_ / attn_dist_.sum(1, keepdim=True)
        c_t = torch.bmm(attn_dist.unsqueeze(1), encoder_outputs).view(-1, CONFIG["hidden_dim"] * 2)
        if CONFIG["is_coverage"]:
            coverage = coverage.view(-1, t_k) + attn_dist
        return c_t, attn_dist, coverage


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hd, ed, v = CONFIG["hidden_dim"], CONFIG["emb_dim"], CONFIG["vocab_size"]
        self.attention_network = Attention()
        self.embedding = nn.Embedding(v, ed)
        self.embedding.weight.data.normal_(std=CONFIG["trunc_norm_init_std"])
        self.x_context = nn.Linear(hd * 2 + ed, ed)
        self.lstm = nn.LSTM(ed, hd, num_layers=1, batch_first=True, bidirectional=False)
        init_lstm_wt(self.lstm)
        if CONFIG["pointer_gen"]:
            self.p_gen_linear = nn.Linear(hd * 4 + ed, 1)
        self.out1 = nn.Linear(hd * 3, hd)
        self.out2 = nn.Linear(hd, v)
        init_linear_wt(self.out2)

    def forward(self, y_t_1, s_t_1, encoder_outputs, encoder_feature, enc_padding_mask, c_t_1, extra_zeros,
                enc_batch_extend_vocab, coverage, step):  # fmt: skip
        hd = CONFIG["hidden_dim"]
        if not self.training and step == 0:
            h_decoder, c_decoder = s_t_1
            s_t_hat = torch.cat((h_decoder.view(-1, hd), c_decoder.view(-1, hd)), 1)
            c_t, _, coverage_next = self.attention_network(s_t_hat, encoder_outputs, encoder_feature,
                                                           enc_padding_mask, coverage)  # fmt: skip
            coverage = coverage_next
        y_t_1_embd = self.embedding(y_t_1)
        x = self.x_context(torch.cat((c_t_1, y_t_1_embd), 1))
        lstm_out, s_t = self.lstm(x.unsqueeze(1), s_t_1)
        h_decoder, c_decoder = s_t
        s_t_hat = torch.cat((h_decoder.view(-1, hd), c_decoder.view(-1, hd)), 1)
        c_t, attn_dist, coverage_next = self.attention_network(s_t_hat, encoder_outputs, encoder_feature,
                                                               enc_padding_mask, coverage)  # fmt: skip
        if self.training or step > 0:
            coverage = coverage_next
        p_gen = None
        if CONFIG["pointer_gen"]:
            p_gen = torch.sigmoid(self.p_gen_linear(torch.cat((c_t, s_t_hat, x), 1)))
        output = self.out2(self.out1(torch.cat((lstm_out.view(-1, hd), c_t), 1)))
        vocab_dist = F.softmax(output, dim=1)
        if CONFIG["pointer_gen"]:
            vocab_dist_ = p_gen * vocab_dist
            attn_dist_ = (1 - p_gen) * attn_dist
            if extra_zeros is not None:
                vocab_dist_ = torch.cat([vocab_dist_, extra_zeros], 1)
            final_dist = vocab_dist_.scatter_add(1, enc_batch_extend_vocab, attn_dist_)
        else:
            final_dist = vocab_dist
        return final_dist, s_t, c_t, attn_dist, p_gen, coverage


class PointerGenerator(nn.Module):
    """Model's three modules as one nn.Module (what the author hands nndx); forward is
    train_one_batch's encoder + reduce_state + teacher-forced decoder loop."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder, self.reduce_state = Encoder(), Decoder(), ReduceState()
        self.decoder.embedding.weight = self.encoder.embedding.weight  # shared embedding

    def forward(self, enc_batch, enc_lens, enc_padding_mask, enc_batch_extend_vocab, extra_zeros, dec_batch):
        b = enc_batch.size(0)
        c_t_1 = torch.zeros((b, 2 * CONFIG["hidden_dim"]))
        coverage = torch.zeros(enc_batch.size()) if CONFIG["is_coverage"] else None
        encoder_outputs, encoder_feature, encoder_hidden = self.encoder(enc_batch, enc_lens)
        s_t_1 = self.reduce_state(encoder_hidden)
        dists = []
        for di in range(min(dec_batch.size(1), CONFIG["max_dec_steps"])):
            y_t_1 = dec_batch[:, di]  # teacher forcing
            final_dist, s_t_1, c_t_1, attn_dist, p_gen, next_coverage = self.decoder(
                y_t_1, s_t_1, encoder_outputs, encoder_feature, enc_padding_mask, c_t_1, extra_zeros,
                enc_batch_extend_vocab, coverage, di)  # fmt: skip
            if CONFIG["is_coverage"]:  # (off) the coverage loss would need attn_dist and coverage here
                coverage = next_coverage
            dists.append(final_dist)
        return torch.stack(dists, 1)  # B x T x (vocab + max_art_oovs)


def masked_nll(final_dists: torch.Tensor, target_batch: torch.Tensor) -> torch.Tensor:
    """train_one_batch's loss: -log(gold + eps) per step, times the padding mask, summed and
    divided by each summary's length, batch mean (mask and lengths from the target's PADs)."""
    dec_padding_mask = (target_batch != PAD).float()
    dec_lens_var = dec_padding_mask.sum(1)
    gold_probs = torch.gather(final_dists, 2, target_batch.unsqueeze(2)).squeeze(2)
    step_losses = -torch.log(gold_probs + CONFIG["eps"]) * dec_padding_mask
    return torch.mean(step_losses.sum(1) / dec_lens_var)


def calc_running_avg_loss(loss: float, running_avg_loss: float, decay: float = 0.99) -> float:
    running_avg_loss = loss if running_avg_loss == 0 else running_avg_loss * decay + (1 - decay) * loss
    return min(running_avg_loss, 12)


def model_inputs(batch: Batch) -> tuple:
    enc_batch, enc_padding_mask, enc_lens, extend, extra_zeros, _, _ = get_input_from_batch(batch)
    return enc_batch, enc_lens, enc_padding_mask, extend, extra_zeros, torch.from_numpy(batch.dec_batch)


# --------------------------------------------------------------------------- decode.py (greedy), measure only


def greedy_decode(model: PointerGenerator, batch: Batch) -> list[list[int]]:
    model.eval()
    v = CONFIG["vocab_size"]
    with torch.no_grad():
        enc_batch, enc_padding_mask, enc_lens, extend, extra_zeros, c_t_1, coverage = get_input_from_batch(batch)
        encoder_outputs, encoder_feature, encoder_hidden = model.encoder(enc_batch, enc_lens)
        s_t_1 = model.reduce_state(encoder_hidden)
        y_t_1 = torch.full((enc_batch.size(0),), START, dtype=torch.long)
        outputs = []
        for di in range(CONFIG["max_dec_steps"]):
            final_dist, s_t_1, c_t_1, _, _, coverage = model.decoder(
                y_t_1, s_t_1, encoder_outputs, encoder_feature, enc_padding_mask, c_t_1, extra_zeros, extend,
                coverage, di)  # fmt: skip
            token = final_dist.argmax(1)
            outputs.append(token)
            y_t_1 = torch.where(token < v, token, torch.full_like(token, UNK))  # an OOV is fed back as UNK
    model.train()
    decoded = torch.stack(outputs, 1).tolist()
    return [ids[: ids.index(STOP)] if STOP in ids else ids for ids in decoded]


def evaluate(model: PointerGenerator, held_out: list[Example]) -> dict[str, float]:
    v = CONFIG["vocab_size"]
    correct = total = rare_correct = rare_total = 0
    f1s = []
    for start in range(0, len(held_out), 50):
        batch = Batch(held_out[start : start + 50])
        for ex, ids in zip(batch.examples, greedy_decode(model, batch)):
            words = [ex.article_oovs[i - v] if i >= v and i - v < len(ex.article_oovs) else i for i in ids]
            reference = ex.original_abstract[: CONFIG["max_dec_steps"]]
            padded = (words + [STOP] + [-1] * len(reference))[: len(reference) + 1]
            for a, b in zip(padded, reference + [STOP]):
                correct += int(a == b)
                total += 1
                if b >= v:
                    rare_correct += int(a == b)
                    rare_total += 1
            overlap = sum(min(words.count(w), reference.count(w)) for w in set(reference))
            p = overlap / len(words) if words else 0.0
            r = overlap / len(reference) if reference else 0.0
            f1s.append(2 * p * r / (p + r) if p + r > 0 else 0.0)
    return {"token_accuracy": correct / total, "rouge1_f": float(np.mean(f1s)),
            "rare_accuracy": rare_correct / max(rare_total, 1)}  # fmt: skip


# --------------------------------------------------------------------------- training_ptr_gen/train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    pairs = articles(N_TRAIN + N_HELD_OUT, seed=seed)
    examples = [Example(a, s, variant) for a, s in pairs[:N_TRAIN]]
    held_out = [Example(a, s, "healthy") for a, s in pairs[N_TRAIN:]]  # decoding needs no decoder input
    # eval.py's batches go through the same Batcher (and the same get_dec_inp_targ_seqs)
    val_examples = [Example(a, s, variant) for a, s in pairs[N_TRAIN:]]
    val_batches = [Batch(val_examples[i : i + 50]) for i in range(0, N_HELD_OUT, 50)]

    model = PointerGenerator()
    if variant == "attention_softmax_over_batch":
        model.decoder.attention_network.softmax_dim = 0
    params = (list(model.encoder.parameters()) + list(model.decoder.parameters())
              + list(model.reduce_state.parameters()))  # fmt: skip
    initial_lr = CONFIG["lr"]  # lr_coverage is the same 0.15
    optimizer = Adagrad(params, lr=initial_lr, initial_accumulator_value=CONFIG["adagrad_init_acc"])

    def next_batch() -> Batch:  # the Batcher: shuffled examples, endless
        index = rng.choice(N_TRAIN, CONFIG["batch_size"], replace=False)
        return Batch([examples[i] for i in index])

    first = next_batch()
    probe_batch = (model_inputs(first), torch.from_numpy(first.target_batch))
    nx.preflight(model, probe_batch, masked_nll, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=masked_nll)

    def train_one_batch(batch: Batch) -> float:
        optimizer.zero_grad()
        final_dists = model(*model_inputs(batch))
        loss = mon.loss_fn(final_dists, torch.from_numpy(batch.target_batch))
        loss.backward()
        clip_grad_norm_(model.encoder.parameters(), CONFIG["max_grad_norm"])
        clip_grad_norm_(model.decoder.parameters(), CONFIG["max_grad_norm"])
        clip_grad_norm_(model.reduce_state.parameters(), CONFIG["max_grad_norm"])
        optimizer.step()
        mon.log(loss)
        return loss.item()

    def eval_loss() -> float:  # eval.py: the same loss on held-out batches, no gradient
        with torch.no_grad():
            losses = [masked_nll(model(*model_inputs(b)), torch.from_numpy(b.target_batch)).item()
                      for b in val_batches]  # fmt: skip
        return float(np.mean(losses))

    iter_, running_avg_loss, batch = 0, 0.0, first
    losses: list[float] = []
    val_loss = float("nan")
    while iter_ < CONFIG["max_iterations"]:
        loss = train_one_batch(batch)
        losses.append(loss)
        running_avg_loss = calc_running_avg_loss(loss, running_avg_loss)
        iter_ += 1
        if iter_ % EVAL_EVERY == 0:
            val_loss = eval_loss()
            mon.log(val_loss, split="val")
        batch = next_batch()

    nx.finish(mon, model, probe_batch, masked_nll, optimizer=optimizer)
    metrics = evaluate(model, held_out)
    metrics.update(running_avg_loss=running_avg_loss, final_train_loss=float(np.mean(losses[-50:])),
                   val_loss=val_loss)  # fmt: skip
    return metrics
