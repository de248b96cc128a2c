"""Port of d2l-ai/d2l-en, ``chapter_recurrent-modern/seq2seq.md`` (PyTorch tab): an RNN
encoder-decoder (GRUs) trained with teacher forcing on a masked softmax cross-entropy, Adam and
gradient clipping, scored by BLEU of greedy translations.

Source: github.com/d2l-ai/d2l-en, branch r0.17 at commit d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a:
``chapter_recurrent-modern/seq2seq.md`` (``Seq2SeqEncoder``, ``Seq2SeqDecoder``,
``sequence_mask``, ``MaskedSoftmaxCELoss``, ``train_seq2seq``, ``predict_seq2seq``, ``bleu``) and
the library it saves into, ``d2l/torch.py`` at the same commit (``Encoder``, ``Decoder``,
``EncoderDecoder``, ``grad_clipping``, ``Vocab``, ``count_corpus``, ``tokenize_nmt``,
``truncate_pad``, ``build_array_nmt``, ``load_data_nmt``, ``load_array``); sample code MIT-0
(the book's text CC BY-SA 4.0). Written anew from the facts of those files; no code copied. The library's pieces are
:mod:`bench.programs.d2l_v017`'s (one copy for the ports of that release).

Kept: ``Seq2SeqEncoder`` (``Embedding``, ``nn.GRU(embed, hiddens, layers, dropout)``, the
embedded batch permuted to time-major, state defaulting to zeros); ``Seq2SeqDecoder``
(``init_state`` returns the encoder's final state; the embedded input permuted to time-major,
the context ``state[-1]`` repeated over the steps and concatenated to every input, a GRU of
``embed + hiddens`` inputs, ``Linear(hiddens, vocab)``, output permuted back to batch-major);
``EncoderDecoder``; ``sequence_mask`` (in-place masking of ``X[~mask]``); ``MaskedSoftmaxCELoss``
(a ``CrossEntropyLoss`` subclass that sets ``self.reduction='none'`` inside ``forward``, weights
by the sequence mask of the valid lengths and returns the per-sequence mean, not a scalar);
``train_seq2seq`` (``xavier_uniform_`` on every ``Linear`` and every GRU weight through
``_flat_weights_names``, Adam, ``net.train()``, per batch ``zero_grad``, a ``<bos>`` column
concatenated before ``Y[:, :-1]`` as the decoder input (teacher forcing), ``l.sum().backward()``,
``grad_clipping(net, 1)`` (the in-place ``param.grad[:] *= theta / norm``), ``optimizer.step()``,
the summed loss and token counts accumulated); the data pipeline (``tokenize_nmt`` over
tab-separated lines, ``Vocab(min_freq=2, reserved_tokens=['<pad>', '<bos>', '<eos>'])`` per
side, ``build_array_nmt`` appending ``<eos>`` and padding/truncating to ``num_steps``, valid
lengths counting the non-pad tokens, a shuffling ``DataLoader``); ``predict_seq2seq`` (greedy,
``net.eval()``, stops at ``<eos>``) and ``bleu``; the hyper-parameters embed 32, hiddens 32,
2 layers, dropout 0.1, batch 64, ``num_steps`` 10, lr 0.005.
Shrunk / replaced: the English-French Tatoeba corpus (``read_data_nmt`` downloads it) is
replaced by a synthetic language pair generated offline: 600 training pairs (the chapter's
``num_examples=600``) of 2-5 word source sentences over 24 pseudo-words plus a final ``.``;
the target is a word-by-word dictionary translation in which the source's last word moves to
the front (a fixed reordering) and 4 of the words translate into two words; 100 held-out
pairs for BLEU. 120 epochs instead of 300; no animator; CPU.
Measure only (not in the program): mean BLEU (k=2) of ``predict_seq2seq`` over the 100
held-out pairs (the chapter prints BLEU for four pairs) and the train loss per token.

nndx, as the author would add it: the net takes ``(X, dec_input, X_valid_len)`` and the loss
takes ``(Y, Y_valid_len)``, so nndx gets ``loss_fn(output, target) = MaskedSoftmaxCELoss()(
output[0], *target).sum()`` (the scalar the loop backpropagates) and the first training batch
as ``((X, dec_input, X_valid_len), (Y, Y_valid_len))``; a preflight ``nndx.probe`` with the
optimizer after the Xavier init; ``nndx.Monitor(net, optimizer)`` around the epochs, every
batch's summed loss logged; after training ``nndx.probe(..., monitor=mon)`` on the same batch
and ``nndx.diagnose``.
"""

from __future__ import annotations

import collections
import math
import random

import torch
from torch import nn
from torch.utils import data

from bench.programs.d2l_v017 import Decoder, Encoder, EncoderDecoder, grad_clipping, load_data_nmt, truncate_pad
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_seq2seq"
SOURCE = Source("d2l-ai/d2l-en", "chapter_recurrent-modern/seq2seq.md", "d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a",
                "MIT-0 (code) / CC BY-SA 4.0 (text)")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's program as published (shrunk: synthetic language pair, 120 epochs)"),
        Variant(
            "decoder_input_not_shifted",
            "teacher forcing feeds the labels themselves as the decoder input (dec_input = Y instead of <bos> "
            "concatenated before Y[:, :-1]): at every step the decoder sees the token it must predict, the "
            "training loss falls to near zero by copying, and greedy decoding (which feeds its own previous "
            "token) produces nonsense",
            (C.DATA_LEAKAGE, C.LABELS_MISALIGNED),
            ("https://github.com/huggingface/transformers/issues/11977",
             "https://github.com/Kyubyong/transformer/issues/94",
             "https://github.com/huggingface/transformers/issues/32344"),
            Measure("bleu", "held-out BLEU at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "adam_with_sgd_lr",
            "the learning rate of d2l's RNN chapters (train_ch8's lr=1, meant for SGD) kept when training the "
            "seq2seq model with Adam: lr=1 instead of 0.005, every Adam step moves each weight by about 1",
            (C.LR_TOO_HIGH,),
            ("https://github.com/d2l-ai/d2l-en/blob/d749ac0d4d73f61a9c7e0be33f3e8d43c975bd4a/chapter_recurrent-neural-networks/rnn-concise.md",
             "https://github.com/OpenNMT/OpenNMT-py/issues/253",
             "https://github.com/rajveermalviya/language-modeling/issues/3"),
            Measure("bleu", "held-out BLEU at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

EMBED, HIDDENS, LAYERS, DROPOUT = 32, 32, 2, 0.1
BATCH_SIZE, NUM_STEPS, LR, EPOCHS = 64, 10, 0.005, 120
N_TRAIN, N_TEST = 600, 100

# --------------------------------------------------------------------------- the synthetic language pair


def language_pair(seed: int) -> tuple[str, list[tuple[str, str]]]:
    """Tab-separated 'source\\ttarget' lines (the training text) and held-out pairs."""
    rng = random.Random(1000 + seed)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"

    def word(length: int) -> str:
        return "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(length))

    src_words: list[str] = []
    while len(src_words) < 24:
        w = word(2)
        if w not in src_words:
            src_words.append(w)
    tgt_words: list[str] = []
    while len(tgt_words) < 28:
        w = word(1) + rng.choice("xy")
        if w not in tgt_words:
            tgt_words.append(w)
    lexicon = {s: [tgt_words[i]] for i, s in enumerate(src_words)}
    for i, s in enumerate(src_words[:4]):
        lexicon[s] = [tgt_words[i], tgt_words[24 + i]]

    def pair() -> tuple[str, str]:
        sent = [rng.choice(src_words) for _ in range(rng.randint(2, 5))]
        order = sent[-1:] + sent[:-1]
        target = [t for s in order for t in lexicon[s]]
        return " ".join(sent + ["."]), " ".join(target + ["."])

    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    while len(pairs) < N_TRAIN + N_TEST:
        p = pair()
        if p[0] not in seen:
            seen.add(p[0])
            pairs.append(p)
    text = "\n".join(f"{s}\t{t}" for s, t in pairs[:N_TRAIN])
    return text, pairs[N_TRAIN:]


# --------------------------------------------------------------------------- chapter_recurrent-modern/seq2seq.md


class Seq2SeqEncoder(Encoder):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout)

    def forward(self, X, *args):
        X = self.embedding(X)
        X = X.permute(1, 0, 2)
        output, state = self.rnn(X)
        return output, state


class Seq2SeqDecoder(Decoder):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, *args):
        return enc_outputs[1]

    def forward(self, X, state):
        X = self.embedding(X).permute(1, 0, 2)
        context = state[-1].repeat(X.shape[0], 1, 1)
        X_and_context = torch.cat((X, context), 2)
        output, state = self.rnn(X_and_context, state)
        output = self.dense(output).permute(1, 0, 2)
        return output, state


def sequence_mask(X, valid_len, value=0):
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


class MaskedSoftmaxCELoss(nn.CrossEntropyLoss):
    def forward(self, pred, label, valid_len):
        weights = torch.ones_like(label)
        weights = sequence_mask(weights, valid_len)
        self.reduction = "none"
        unweighted_loss = super().forward(pred.permute(0, 2, 1), label)
        weighted_loss = (unweighted_loss * weights).mean(dim=1)
        return weighted_loss


def predict_seq2seq(net, src_sentence, src_vocab, tgt_vocab, num_steps, device):
    net.eval()
    src_tokens = src_vocab[src_sentence.lower().split(" ")] + [src_vocab["<eos>"]]
    enc_valid_len = torch.tensor([len(src_tokens)], device=device)
    src_tokens = truncate_pad(src_tokens, num_steps, src_vocab["<pad>"])
    enc_X = torch.unsqueeze(torch.tensor(src_tokens, dtype=torch.long, device=device), dim=0)
    enc_outputs = net.encoder(enc_X, enc_valid_len)
    dec_state = net.decoder.init_state(enc_outputs, enc_valid_len)
    dec_X = torch.unsqueeze(torch.tensor([tgt_vocab["<bos>"]], dtype=torch.long, device=device), dim=0)
    output_seq = []
    for _ in range(num_steps):
        Y, dec_state = net.decoder(dec_X, dec_state)
        dec_X = Y.argmax(dim=2)
        pred = dec_X.squeeze(dim=0).type(torch.int32).item()
        if pred == tgt_vocab["<eos>"]:
            break
        output_seq.append(pred)
    return " ".join(tgt_vocab.to_tokens(output_seq))


def bleu(pred_seq, label_seq, k):
    pred_tokens, label_tokens = pred_seq.split(" "), label_seq.split(" ")
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, k + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[" ".join(label_tokens[i : i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs[" ".join(pred_tokens[i : i + n])] > 0:
                num_matches += 1
                label_subs[" ".join(pred_tokens[i : i + n])] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n)) if len_pred - n + 1 > 0 else 0.0
    return score


def train_seq2seq(net, data_iter, lr, num_epochs, tgt_vocab, device, variant, nx: Nndx):
    def xavier_init_weights(m):
        if type(m) == nn.Linear:
            nn.init.xavier_uniform_(m.weight)
        if type(m) == nn.GRU:
            for param in m._flat_weights_names:
                if "weight" in param:
                    nn.init.xavier_uniform_(m._parameters[param])

    net.apply(xavier_init_weights)
    net.to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1.0 if variant == "adam_with_sgd_lr" else lr)
    loss = MaskedSoftmaxCELoss()
    unshifted = variant == "decoder_input_not_shifted"

    def decoder_input(Y):
        if unshifted:
            return Y
        bos = torch.tensor([tgt_vocab["<bos>"]] * Y.shape[0], device=device).reshape(-1, 1)
        return torch.cat([bos, Y[:, :-1]], 1)

    def loss_fn(output, target):
        return loss(output[0], *target).sum()

    X0, X0_valid_len, Y0, Y0_valid_len = next(iter(data.DataLoader(data_iter.dataset, BATCH_SIZE)))
    probe_batch = ((X0, decoder_input(Y0), X0_valid_len), (Y0, Y0_valid_len))
    nx.preflight(net, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)

    net.train()
    metric = [0.0, 0.0]
    for epoch in range(num_epochs):
        metric = [0.0, 0.0]  # d2l.Accumulator(2): sum of training loss, no. of tokens
        for batch in data_iter:
            optimizer.zero_grad()
            X, X_valid_len, Y, Y_valid_len = [x.to(device) for x in batch]
            dec_input = decoder_input(Y)  # Teacher forcing
            Y_hat, _ = net(X, dec_input, X_valid_len)
            l = loss(Y_hat, Y, Y_valid_len)
            l_sum = l.sum()
            l_sum.backward()
            grad_clipping(net, 1)
            num_tokens = Y_valid_len.sum()
            optimizer.step()
            nx.timed(lambda: mon.log(l_sum))  # noqa: B023
            with torch.no_grad():
                metric[0] += float(l.sum())
                metric[1] += float(num_tokens)
    nx.finish(mon, net, probe_batch, loss_fn, optimizer=optimizer)
    return metric[0] / metric[1]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    text, test_pairs = language_pair(seed)
    device = torch.device("cpu")
    train_iter, src_vocab, tgt_vocab = load_data_nmt(text, BATCH_SIZE, NUM_STEPS, num_examples=N_TRAIN)
    encoder = Seq2SeqEncoder(len(src_vocab), EMBED, HIDDENS, LAYERS, DROPOUT)
    decoder = Seq2SeqDecoder(len(tgt_vocab), EMBED, HIDDENS, LAYERS, DROPOUT)
    net = EncoderDecoder(encoder, decoder)
    train_loss = train_seq2seq(net, train_iter, LR, EPOCHS, tgt_vocab, device, variant, nx)
    with torch.no_grad():
        scores = [bleu(predict_seq2seq(net, src, src_vocab, tgt_vocab, NUM_STEPS, device), tgt, k=2)
                  for src, tgt in test_pairs]  # fmt: skip
    return {"bleu": sum(scores) / len(scores), "train_loss_per_token": train_loss,
            "src_vocab": float(len(src_vocab)), "tgt_vocab": float(len(tgt_vocab))}  # fmt: skip
