"""Port of d2l-ai/d2l-en, ``chapter_attention-mechanisms/bahdanau-attention.md`` (PyTorch tab): the
RNN encoder-decoder of the seq2seq section with its decoder replaced by a GRU decoder with
Bahdanau (additive) attention over the encoder's outputs, trained with d2l's ``train_seq2seq``
(masked softmax cross-entropy, Adam, gradient clipping) and scored by BLEU of greedy translations.

Source: github.com/d2l-ai/d2l-en, branch r0.17 at commit d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a:
``chapter_attention-mechanisms/bahdanau-attention.md`` (``AttentionDecoder``,
``Seq2SeqAttentionDecoder``, the training cell, the translation cell) and the library it calls,
``d2l/torch.py`` at the same commit (``masked_softmax``, ``AdditiveAttention``,
``Seq2SeqEncoder``, ``sequence_mask``, ``MaskedSoftmaxCELoss``, ``train_seq2seq``,
``predict_seq2seq``, ``bleu``, ``EncoderDecoder``, ``grad_clipping``, ``load_data_nmt`` and the
vocabulary); sample code MIT-0 (the book's text CC BY-SA 4.0). Written anew from the facts of
those files; no code copied. The library's generic pieces are :mod:`bench.programs.d2l_v017`'s;
the seq2seq section's (``Seq2SeqEncoder``, ``sequence_mask``, ``MaskedSoftmaxCELoss``, ``bleu``, and
``train_seq2seq`` with its nndx wiring)
and the synthetic language pair are :mod:`bench.programs.d2l_seq2seq`'s.

Kept: ``masked_softmax`` (valid lengths ``repeat_interleave``d over the queries, the masked
scores set to -1e6 in place through ``sequence_mask`` on a reshaped view, softmax on the last
axis); ``AdditiveAttention`` (``W_k``, ``W_q`` and ``w_v`` bias-free ``Linear``s, the
broadcast sum of queries and keys, ``tanh``, scores squeezed, attention weights kept on the
module, dropout on the weights, ``bmm`` with the values); ``Seq2SeqAttentionDecoder``
(``init_state`` returns the encoder outputs permuted to batch-major, the final hidden state and
the source valid lengths; ``forward`` loops over the time-major embedded target: the query is
the last layer's hidden state, the context from the attention is concatenated before the
step's embedding, one GRU step per token, the outputs concatenated and passed through
``Linear(hiddens, vocab)``); the encoder of the seq2seq section; ``EncoderDecoder``;
``train_seq2seq`` (Xavier-uniform init of every ``Linear`` and GRU weight, Adam, ``net.train()``,
per batch ``optimizer.zero_grad()``, ``<bos>`` concatenated before ``Y[:, :-1]`` as the decoder
input, ``l.sum().backward()``, ``grad_clipping(net, 1)``, ``optimizer.step()``, the loss and
token counts accumulated); ``predict_seq2seq`` (``net.eval()``, greedy, stops at ``<eos>``)
and ``bleu(k=2)``; the hyper-parameters embed 32, hiddens 32, 2 layers, dropout 0.1, batch 64,
``num_steps`` 10, lr 0.005.
Shrunk / replaced: Tatoeba's English-French (downloaded) is replaced by d2l_seq2seq's
synthetic language pair (600 training pairs, a dictionary translation whose last source word
moves to the front, 100 held-out pairs); 60 epochs instead of 250; no animator, no
attention heat-map; CPU.
Measure only (not in the program): mean BLEU (k=2) of ``predict_seq2seq`` over the 100
held-out pairs (the chapter prints it for four pairs) and the train loss per token.

nndx, as the author would add it (as in d2l_seq2seq): ``loss_fn(output, target) =
MaskedSoftmaxCELoss()(output[0], *target).sum()`` (the scalar the loop backpropagates) and the
first training batch as ``((X, dec_input, X_valid_len), (Y, Y_valid_len))``; a preflight
``nndx.probe`` with the optimizer after the Xavier init; ``nndx.Monitor(net, optimizer)``
around the epochs, every batch's summed loss logged after ``optimizer.step()``; after training
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``. Prediction comes after
``train_seq2seq`` returns, as in the chapter.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs.d2l_seq2seq import Seq2SeqEncoder, bleu, language_pair, sequence_mask, train_seq2seq
from bench.programs.d2l_v017 import Decoder, EncoderDecoder, load_data_nmt, truncate_pad
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_bahdanau"
SOURCE = Source("d2l-ai/d2l-en", "chapter_attention-mechanisms/bahdanau-attention.md",
                "d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a", "MIT-0 (code) / CC BY-SA 4.0 (text)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's program as published (shrunk: synthetic language pair, fewer epochs)"),
        Variant(
            "predict_without_eval",
            "predict_seq2seq without net.eval(): the net stays in training mode after train_seq2seq, so the "
            "GRUs' inter-layer dropout and the attention-weight dropout stay on while translating greedily",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/d2l-ai/d2l-en/pull/1528",
             "https://github.com/pytorch/tutorials/issues/208",
             "https://github.com/IBM/pytorch-seq2seq/issues/33"),
            Measure("bleu", "held-out BLEU at least 0.03 below the healthy run's: 0.833 against 0.878 healthy on "
                    "seed 0 (same training: train loss per token 0.0121 in both)",
                    lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
        Variant(
            "decoder_input_not_shifted",
            "teacher forcing feeds the labels themselves as the decoder input (dec_input = Y instead of <bos> "
            "concatenated before Y[:, :-1]): at every step the attention decoder sees the token it must predict, "
            "the training loss falls to near zero by copying, and greedy decoding (which feeds its own previous "
            "token) produces nonsense",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/huggingface/transformers/issues/11977",
             "https://github.com/Kyubyong/transformer/issues/94",
             "https://github.com/huggingface/transformers/issues/32344"),
            Measure("bleu", "held-out BLEU at least 0.2 below the healthy run's: 0.003 against 0.878 healthy on "
                    "seed 0 (train loss per token 1.4e-5 against 0.0121)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

EMBED, HIDDENS, LAYERS, DROPOUT = 32, 32, 2, 0.1
BATCH_SIZE, NUM_STEPS, LR, EPOCHS = 64, 10, 0.005, 60
N_TRAIN = 600

# --------------------------------------------------------------------------- d2l/torch.py (attention scoring)


def masked_softmax(X, valid_lens):
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout, **kwargs):
        super().__init__(**kwargs)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = queries.unsqueeze(2) + keys.unsqueeze(1)
        features = torch.tanh(features)
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


# ------------------------------------------------------------- chapter_attention-mechanisms/bahdanau-attention.md


class AttentionDecoder(Decoder):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    @property
    def attention_weights(self):
        raise NotImplementedError


class Seq2SeqAttentionDecoder(AttentionDecoder):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens, *args):
        outputs, hidden_state = enc_outputs
        return (outputs.permute(1, 0, 2), hidden_state, enc_valid_lens)

    def forward(self, X, state):
        enc_outputs, hidden_state, enc_valid_lens = state
        X = self.embedding(X).permute(1, 0, 2)
        outputs, self._attention_weights = [], []
        for x in X:
            query = torch.unsqueeze(hidden_state[-1], dim=1)
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
            out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
            outputs.append(out)
            self._attention_weights.append(self.attention.attention_weights)
        outputs = self.dense(torch.cat(outputs, dim=0))
        return outputs.permute(1, 0, 2), [enc_outputs, hidden_state, enc_valid_lens]

    @property
    def attention_weights(self):
        return self._attention_weights


# --------------------------------------------------------------------------- d2l/torch.py (seq2seq training)


def predict_seq2seq(net, src_sentence, src_vocab, tgt_vocab, num_steps, device, save_attention_weights=False,
                    set_eval=True):  # fmt: skip
    if set_eval:
        net.eval()
    src_tokens = src_vocab[src_sentence.lower().split(" ")] + [src_vocab["<eos>"]]
    enc_valid_len = torch.tensor([len(src_tokens)], device=device)
    src_tokens = truncate_pad(src_tokens, num_steps, src_vocab["<pad>"])
    enc_X = torch.unsqueeze(torch.tensor(src_tokens, dtype=torch.long, device=device), dim=0)
    enc_outputs = net.encoder(enc_X, enc_valid_len)
    dec_state = net.decoder.init_state(enc_outputs, enc_valid_len)
    dec_X = torch.unsqueeze(torch.tensor([tgt_vocab["<bos>"]], dtype=torch.long, device=device), dim=0)
    output_seq, attention_weight_seq = [], []
    for _ in range(num_steps):
        Y, dec_state = net.decoder(dec_X, dec_state)
        dec_X = Y.argmax(dim=2)
        pred = dec_X.squeeze(dim=0).type(torch.int32).item()
        if save_attention_weights:
            attention_weight_seq.append(net.decoder.attention_weights)
        if pred == tgt_vocab["<eos>"]:
            break
        output_seq.append(pred)
    return " ".join(tgt_vocab.to_tokens(output_seq)), attention_weight_seq


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    text, test_pairs = language_pair(seed)
    device = torch.device("cpu")
    train_iter, src_vocab, tgt_vocab = load_data_nmt(text, BATCH_SIZE, NUM_STEPS, num_examples=N_TRAIN)
    encoder = Seq2SeqEncoder(len(src_vocab), EMBED, HIDDENS, LAYERS, DROPOUT)
    decoder = Seq2SeqAttentionDecoder(len(tgt_vocab), EMBED, HIDDENS, LAYERS, DROPOUT)
    net = EncoderDecoder(encoder, decoder)
    train_loss = train_seq2seq(net, train_iter, LR, EPOCHS, tgt_vocab, device, variant, nx)
    set_eval = variant != "predict_without_eval"
    scores = []
    for src, tgt in test_pairs:
        translation, _ = predict_seq2seq(net, src, src_vocab, tgt_vocab, NUM_STEPS, device, True, set_eval)
        scores.append(bleu(translation, tgt, k=2))
    return {"bleu": sum(scores) / len(scores), "train_loss_per_token": train_loss,
            "src_vocab": float(len(src_vocab)), "tgt_vocab": float(len(tgt_vocab))}  # fmt: skip
