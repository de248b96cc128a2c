"""Port of d2l-ai/d2l-en, ``chapter_attention-mechanisms/transformer.md`` (PyTorch tab, release
0.17): the Transformer encoder-decoder trained on a machine-translation pair with d2l's
seq2seq training (masked softmax cross-entropy, teacher forcing, gradient clipping, Adam) and
scored by BLEU of greedy translations.

Source: github.com/d2l-ai/d2l-en, branch r0.17 at commit d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a
(the release whose library :mod:`bench.programs.d2l_v017` holds; on master the chapter moved to
``chapter_attention-mechanisms-and-transformers/transformer.md``):
``chapter_attention-mechanisms/transformer.md`` (``PositionWiseFFN``, ``AddNorm``,
``EncoderBlock``, ``TransformerEncoder``, ``DecoderBlock``, ``TransformerDecoder``, the training
cell), ``multihead-attention.md`` (``MultiHeadAttention``, ``transpose_qkv``,
``transpose_output``), ``attention-scoring-functions.md`` (``masked_softmax``,
``DotProductAttention``), ``self-attention-and-positional-encoding.md``
(``PositionalEncoding``), and ``seq2seq.md``/``d2l/torch.py`` for the training and evaluation
(``train_seq2seq``, ``MaskedSoftmaxCELoss``, ``sequence_mask``, ``predict_seq2seq``, ``bleu``,
``grad_clipping``, ``load_data_nmt``, ``AttentionDecoder``); sample code MIT-0 (the book's text
CC BY-SA 4.0). Written anew from those files; the seq2seq pieces are imported from the existing
port :mod:`bench.programs.d2l_seq2seq` (same release) and the library's from
:mod:`bench.programs.d2l_v017`.

Kept: the whole model as the chapter writes it: embeddings scaled by ``sqrt(num_hiddens)`` plus
the sinusoidal ``PositionalEncoding`` (with dropout); ``EncoderBlock`` = multi-head
self-attention with the source valid lengths + ``AddNorm`` (dropout, residual, ``LayerNorm``) +
``PositionWiseFFN`` + ``AddNorm``; ``DecoderBlock`` with the cached ``state[2][i]`` key-values,
the causal ``dec_valid_lens`` (rows ``[1..num_steps]``) built only when ``self.training``,
encoder-decoder attention and the FFN; ``MultiHeadAttention`` (bias-free ``W_q/W_k/W_v/W_o``,
heads split by ``transpose_qkv``, valid lengths ``repeat_interleave``d per head, merged by
``transpose_output``); ``DotProductAttention`` with ``masked_softmax`` (masked scores set to
-1e6 through the in-place ``sequence_mask``); d2l's ``train_seq2seq`` (Xavier init of every
``nn.Linear``, Adam, ``<bos>``-shifted teacher forcing, ``l.sum().backward()``,
``grad_clipping(net, 1)``) and ``predict_seq2seq`` + ``bleu`` (k=2). The chapter's hyper-
parameters: num_hiddens 32, 2 layers, dropout 0.1, batch 64, num_steps 10, lr 0.005, FFN 32/64,
4 heads, key/query/value size 32, norm_shape [32].
Shrunk / replaced: the Tatoeba English-French corpus (downloaded by ``read_data_nmt``) replaced by
the synthetic language pair of the d2l_seq2seq port (600 training pairs, 100 held out, reordering
and 1-to-2 word translations); 40 epochs instead of 200; CPU; no attention heat maps.
Measure only (not in the program): mean BLEU (k=2) of ``predict_seq2seq`` over the 100 held-out
pairs (the chapter prints BLEU for four pairs) and the last epoch's train loss per token.

nndx, as the author would add it: exactly as in the d2l_seq2seq port, inside d2l's
``train_seq2seq``: the net takes ``(X, dec_input, X_valid_len)`` and the loss takes
``(Y, Y_valid_len)``, so nndx gets ``loss_fn(output, target) = MaskedSoftmaxCELoss()(output[0],
*target).sum()`` and the first batch as ``((X, dec_input, X_valid_len), (Y, Y_valid_len))``; a
preflight ``nndx.probe`` with the optimizer after the Xavier init; ``nndx.Monitor(net,
optimizer)`` around the epochs, every batch's summed loss logged; ``nndx.probe(...,
monitor=mon)`` on the same batch after training, then ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bench.programs.d2l_seq2seq import bleu, language_pair, predict_seq2seq, sequence_mask, train_seq2seq
from bench.programs.d2l_v017 import Decoder, Encoder, EncoderDecoder, load_data_nmt
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_transformer"
SOURCE = Source("d2l-ai/d2l-en", "chapter_attention-mechanisms/transformer.md",
                "d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a", "MIT-0 (code) / CC BY-SA 4.0 (text)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's program as published (shrunk: synthetic language pair, 40 epochs)"),
        Variant(
            "no_causal_mask",
            "the decoder's self-attention gets no causal mask in training (DecoderBlock passes "
            "dec_valid_lens=None instead of the rows [1..num_steps] built when self.training): every target "
            "position attends to the later target tokens it is asked to predict, the training loss falls by "
            "copying, and greedy decoding, which has no future tokens, translates badly",
            (C.DATA_LEAKAGE,),
            ("https://github.com/pytorch/pytorch/issues/31567",
             "https://github.com/asyml/texar/issues/131",
             "https://github.com/hkproj/pytorch-transformer/issues/22"),
            Measure("bleu", "held-out BLEU at least 0.2 below the healthy run's: 0.12 against 0.59 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "heads_merged_without_permute",
            "transpose_output reshapes the attention output (batch*heads, steps, d/heads) straight to "
            "(batch, steps, d) without the permute(0, 2, 1, 3): the heads are not concatenated per position, "
            "each position's vector is made of chunks of other positions (later ones included) of one head",
            (C.WRONG_RESHAPE,),
            ("https://github.com/jsbaan/transformer-from-scratch/pull/6",
             "https://github.com/ajhalthor/Transformer-Neural-Network/issues/1",
             "https://github.com/reczoo/FuxiCTR/issues/30"),
            Measure("bleu", "held-out BLEU at least 0.2 below the healthy run's: 0.00 against 0.59 healthy on seed 0 "
                    "(train loss per token 0.004 against 0.070: the scrambled merge leaks later positions)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

NUM_HIDDENS, NUM_LAYERS, DROPOUT, BATCH_SIZE, NUM_STEPS = 32, 2, 0.1, 64, 10
LR, NUM_EPOCHS = 0.005, 40
FFN_NUM_INPUT, FFN_NUM_HIDDENS, NUM_HEADS = 32, 64, 4
KEY_SIZE, QUERY_SIZE, VALUE_SIZE = 32, 32, 32
NORM_SHAPE = [32]

_VARIANT = {"name": "healthy"}  # the variant being trained (the chapter's classes read no config)


# --------------------------------------------------------------------------- attention-scoring-functions.md


def masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot product attention."""

    def __init__(self, dropout, **kwargs):
        super(DotProductAttention, self).__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


# --------------------------------------------------------------------------- multihead-attention.md


class MultiHeadAttention(nn.Module):
    """Multi-head attention."""

    def __init__(self, key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False, **kwargs):
        super(MultiHeadAttention, self).__init__(**kwargs)
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = transpose_qkv(self.W_q(queries), self.num_heads)
        keys = transpose_qkv(self.W_k(keys), self.num_heads)
        values = transpose_qkv(self.W_v(values), self.num_heads)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        output_concat = transpose_output(output, self.num_heads)
        return self.W_o(output_concat)


def transpose_qkv(X, num_heads):
    """Transposition for parallel computation of multiple attention heads."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    """Reverse the operation of `transpose_qkv`."""
    if _VARIANT["name"] == "heads_merged_without_permute":
        return X.reshape(-1, X.shape[1], X.shape[2] * num_heads)  # the bug: no permute before the merge
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


# --------------------------------------------------------------------------- self-attention-and-positional-encoding.md


class PositionalEncoding(nn.Module):
    """Positional encoding."""

    def __init__(self, num_hiddens, dropout, max_len=1000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
        self.P[:, :, 0::2] = torch.sin(X)
        self.P[:, :, 1::2] = torch.cos(X)

    def forward(self, X):
        X = X + self.P[:, :X.shape[1], :].to(X.device)
        return self.dropout(X)


# --------------------------------------------------------------------------- transformer.md


class PositionWiseFFN(nn.Module):
    """Positionwise feed-forward network."""

    def __init__(self, ffn_num_input, ffn_num_hiddens, ffn_num_outputs, **kwargs):
        super(PositionWiseFFN, self).__init__(**kwargs)
        self.dense1 = nn.Linear(ffn_num_input, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """Residual connection followed by layer normalization."""

    def __init__(self, normalized_shape, dropout, **kwargs):
        super(AddNorm, self).__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class EncoderBlock(nn.Module):
    """Transformer encoder block."""

    def __init__(self, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens,
                 num_heads, dropout, use_bias=False, **kwargs):  # fmt: skip
        super(EncoderBlock, self).__init__(**kwargs)
        self.attention = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                                            use_bias)  # fmt: skip
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm2 = AddNorm(norm_shape, dropout)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class TransformerEncoder(Encoder):
    """Transformer encoder."""

    def __init__(self, vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                 ffn_num_hiddens, num_heads, num_layers, dropout, use_bias=False, **kwargs):  # fmt: skip
        super(TransformerEncoder, self).__init__(**kwargs)
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module("block" + str(i),
                                 EncoderBlock(key_size, query_size, value_size, num_hiddens, norm_shape,
                                              ffn_num_input, ffn_num_hiddens, num_heads, dropout, use_bias))  # fmt: skip

    def forward(self, X, valid_lens, *args):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        self.attention_weights = [None] * len(self.blks)
        for i, blk in enumerate(self.blks):
            X = blk(X, valid_lens)
            self.attention_weights[i] = blk.attention.attention.attention_weights
        return X


class AttentionDecoder(Decoder):
    """The base attention-based decoder interface (d2l/torch.py)."""

    def __init__(self, **kwargs):
        super(AttentionDecoder, self).__init__(**kwargs)

    @property
    def attention_weights(self):
        raise NotImplementedError


class DecoderBlock(nn.Module):
    # The `i`-th block in the decoder
    def __init__(self, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens,
                 num_heads, dropout, i, **kwargs):  # fmt: skip
        super(DecoderBlock, self).__init__(**kwargs)
        self.i = i
        self.attention1 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout)
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.attention2 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout)
        self.addnorm2 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm3 = AddNorm(norm_shape, dropout)

    def forward(self, X, state):
        enc_outputs, enc_valid_lens = state[0], state[1]
        if state[2][self.i] is None:
            key_values = X
        else:
            key_values = torch.cat((state[2][self.i], X), axis=1)
        state[2][self.i] = key_values
        if self.training and _VARIANT["name"] != "no_causal_mask":  # the bug: the causal mask left out
            batch_size, num_steps, _ = X.shape
            dec_valid_lens = torch.arange(1, num_steps + 1, device=X.device).repeat(batch_size, 1)
        else:
            dec_valid_lens = None
        X2 = self.attention1(X, key_values, key_values, dec_valid_lens)
        Y = self.addnorm1(X, X2)
        Y2 = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)
        Z = self.addnorm2(Y, Y2)
        return self.addnorm3(Z, self.ffn(Z)), state


class TransformerDecoder(AttentionDecoder):
    def __init__(self, vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                 ffn_num_hiddens, num_heads, num_layers, dropout, **kwargs):  # fmt: skip
        super(TransformerDecoder, self).__init__(**kwargs)
        self.num_hiddens = num_hiddens
        self.num_layers = num_layers
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module("block" + str(i),
                                 DecoderBlock(key_size, query_size, value_size, num_hiddens, norm_shape,
                                              ffn_num_input, ffn_num_hiddens, num_heads, dropout, i))  # fmt: skip
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens, *args):
        return [enc_outputs, enc_valid_lens, [None] * self.num_layers]

    def forward(self, X, state):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        self._attention_weights = [[None] * len(self.blks) for _ in range(2)]
        for i, blk in enumerate(self.blks):
            X, state = blk(X, state)
            self._attention_weights[0][i] = blk.attention1.attention.attention_weights
            self._attention_weights[1][i] = blk.attention2.attention.attention_weights
        return self.dense(X), state

    @property
    def attention_weights(self):
        return self._attention_weights


# --------------------------------------------------------------------------- the chapter's training cell


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    _VARIANT["name"] = variant
    torch.manual_seed(seed)
    text, test_pairs = language_pair(seed)
    device = torch.device("cpu")
    train_iter, src_vocab, tgt_vocab = load_data_nmt(text, BATCH_SIZE, NUM_STEPS, num_examples=600)
    encoder = TransformerEncoder(len(src_vocab), KEY_SIZE, QUERY_SIZE, VALUE_SIZE, NUM_HIDDENS, NORM_SHAPE,
                                 FFN_NUM_INPUT, FFN_NUM_HIDDENS, NUM_HEADS, NUM_LAYERS, DROPOUT)  # fmt: skip
    decoder = TransformerDecoder(len(tgt_vocab), KEY_SIZE, QUERY_SIZE, VALUE_SIZE, NUM_HIDDENS, NORM_SHAPE,
                                 FFN_NUM_INPUT, FFN_NUM_HIDDENS, NUM_HEADS, NUM_LAYERS, DROPOUT)  # fmt: skip
    net = EncoderDecoder(encoder, decoder)
    # d2l.train_seq2seq (the d2l_seq2seq port's, nndx attached inside it as there); the variant's bug
    # lives in the model code above, so the loop is the published one
    train_loss = train_seq2seq(net, train_iter, LR, NUM_EPOCHS, tgt_vocab, device, "healthy", nx)
    with torch.no_grad():
        scores = [bleu(predict_seq2seq(net, src, src_vocab, tgt_vocab, NUM_STEPS, device), tgt, k=2)
                  for src, tgt in test_pairs]  # fmt: skip
    return {"bleu": sum(scores) / len(scores), "train_loss_per_token": train_loss}
