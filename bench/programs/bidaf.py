"""Port of galsang/BiDAF-pytorch (Bi-Directional Attention Flow for extractive QA: char-CNN
and word embeddings, a highway network, a contextual BiLSTM, the attention flow layer,
two modelling BiLSTMs, start/end pointers, Adadelta with an EMA of the weights for
evaluation).

Source: github.com/galsang/BiDAF-pytorch, ``model/model.py``, ``utils/nn.py``,
``model/ema.py``, ``model/data.py``, ``run.py`` and ``evaluate.py`` at commit
8e16379e33af725daec3ec6c170dfae69e54d51b (no LICENSE file in the repository). Written anew
from the facts of those files; no code copied.

Kept: ``char_emb`` (``padding_idx=1``, uniform +-0.001), dropout, the 2-D convolution of
height ``char_dim`` and width ``char_channel_width`` with ReLU, max-pooled over the word;
word embeddings frozen (``from_pretrained(..., freeze=True)``); two highway layers
(``g * relu(W x) + (1 - g) * x``); ``utils.nn.LSTM`` (input dropout, packed sequences sorted
by length, orthogonal hh / kaiming ih init, forget-gate bias 1) for the contextual,
modelling (two) and output BiLSTMs; ``att_flow_layer``: the similarity
``w_c . c + w_q . q + w_cq . (c * q_j)`` (three ``Linear(2d, 1)``, the cq term per
question word), ``softmax`` over the question for c2q, ``softmax(max_j s)`` over the
context for q2c, ``G = [c; c2q; c * c2q; c * q2c]``; the output layer (``p1`` from
``Linear(8d, 1)`` of G plus ``Linear(2d, 1)`` of M with dropout, ``p2`` the same over the
output LSTM's M2); ``CrossEntropyLoss`` on ``s_idx`` plus on ``e_idx`` (the answer's last
word, inclusive, as ``data.py`` computes it); ``optim.Adadelta`` over the trainable
parameters; ``EMA`` registered on every trainable parameter and updated after each step;
``test``: ``model.eval()``, the EMA weights swapped in, the dev loss, the best span by the
upper-triangular max of ``log_softmax(p1)[i] + log_softmax(p2)[j]``, the original
weights restored; ``evaluate.py``'s exact match and token F1 (on tokens: no articles or
punctuation here); the best dev F1 and its EM kept; the loop's ``zero_grad`` after the
forward, as written.
Shrunk: a synthetic extractive task instead of SQuAD: a context of 3-5 "key" words (made
of characters, so the char-CNN can read them) each followed by a value span of 1-2 value
words and a filler word, the question "what is the value of KEY ?" (its key among the
context's), the answer the key's value span; 1,280 training and 200 dev examples; random
frozen 24-d vectors instead of GloVe 100-d; ``hidden_size`` 24 instead of 100,
``char_channel_size`` 24 instead of 100, ``word_dim`` 24 instead of 100 (keeping
``2 * hidden = char_channel + word_dim``); batch 32 instead of 60; 4 epochs (160 steps);
the dev evaluation every 40 batches instead of 250; Adadelta's ``lr`` 5.0 instead of 0.5
(160 steps instead of tens of thousands: at 0.5 the best dev EM is 0.13 after 190 steps
on seed 0, at 5.0 it is 0.8-0.95); ``exp_decay_rate`` 0.99 instead of 0.999 (at 0.999 the
averaged weights would still be mostly the initial ones after 160 steps); batches drawn
from length-sorted buckets as the ``BucketIterator`` does; the ``squeeze()`` calls made
explicit about their axis; tensorboard, the prediction file and the saved model left out.
Measure only (not in the program): nothing beyond the program's own best dev EM / F1.

nndx, as the author would add it: ``forward`` takes the batch's fields as arguments
``(c_char, c_word, c_lens, q_char, q_word, q_lens)``; the targets are ``s_idx`` and
``e_idx`` stacked as (batch, 2) and the loss is the program's sum of two cross-entropies;
a preflight ``nndx.probe`` on the first batch with the optimizer;
``nndx.Monitor(model, optimizer)`` around the loop, each batch's loss logged and each dev
loss logged as ``split="val"``; after training ``nndx.probe(..., monitor=mon)`` on the
first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bidaf"
SOURCE = Source("galsang/BiDAF-pytorch", "run.py", "8e16379e33af725daec3ec6c170dfae69e54d51b",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: synthetic key-value QA, width 24, 160 steps, Adadelta lr 5)"),
        Variant(
            "end_index_exclusive",
            "e_idx taken as the word after the answer (an exclusive end, start + answer length) while the model's "
            "p2 and the decoding treat it as the answer's last word: every end label is one word late",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/huggingface/transformers/issues/12708",
             "https://github.com/huggingface/transformers/pull/250",
             "https://github.com/kushalj001/pytorch-question-answering/issues/8"),
            Measure("best_dev_exact", "best dev exact match at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: each Adadelta step follows the sum of every batch's "
            "gradients so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175", "https://github.com/IBM/aihwkit/issues/446",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("best_dev_exact", "best dev exact match at least 0.2 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

CHAR_DIM, CHAR_CHANNEL_WIDTH, CHAR_CHANNEL_SIZE, WORD_DIM, HIDDEN = 8, 5, 24, 24, 24
DROPOUT, EPOCHS, EXP_DECAY_RATE, LR, BATCH, DEV_BATCH, PRINT_FREQ = 0.2, 4, 0.99, 5.0, 32, 100, 40
N_TRAIN, N_DEV, N_KEYS, N_VALUES, N_FILLER, KEYS_PER_CONTEXT, MAX_SPAN = 1280, 200, 40, 60, 10, (3, 5), 2


# --------------------------------------------------------------------------- the data (model/data.py's fields)


class Vocab:
    def __init__(self) -> None:
        self.itos = ["<unk>", "<pad>"]
        self.stoi = {s: i for i, s in enumerate(self.itos)}

    def add(self, s: str) -> int:
        if s not in self.stoi:
            self.stoi[s] = len(self.itos)
            self.itos.append(s)
        return self.stoi[s]


def make_examples(seed: int):
    """Key-value contexts; each question asks for one key's value span."""
    rng = np.random.default_rng(seed + 3)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word(n):
        return "".join(rng.choice(list(letters), n))

    keys = sorted({"k" + word(4) for _ in range(N_KEYS * 2)})[:N_KEYS]
    values = sorted({word(int(rng.integers(3, 7))) for _ in range(N_VALUES * 2)})[:N_VALUES]
    fillers = ["and", "then", "also", "so", ",", ";", "next", "plus", "with", "."][:N_FILLER]
    examples = []
    for _ in range(N_TRAIN + N_DEV):
        chosen = rng.choice(len(keys), int(rng.integers(KEYS_PER_CONTEXT[0], KEYS_PER_CONTEXT[1] + 1)), replace=False)
        context, spans = [], []
        for k in chosen:
            context.append(keys[k])
            span = [values[v] for v in rng.choice(len(values), int(rng.integers(1, MAX_SPAN + 1)), replace=False)]
            spans.append((len(context), len(context) + len(span) - 1))
            context += span
            context.append(fillers[int(rng.integers(len(fillers)))])
        ask = int(rng.integers(len(chosen)))
        question = ["what", "is", "the", "value", "of", keys[chosen[ask]], "?"]
        s_idx, e_idx = spans[ask]
        examples.append((context, question, s_idx, e_idx))
    return examples


def tensorize(examples, word_vocab: Vocab, char_vocab: Vocab, exclusive_end: bool):
    """A batch as the iterator gives it: words padded with <pad> (1), chars nested and
    padded to the longest word (at least the conv width), lengths, s_idx and e_idx."""
    def words(seqs):
        n = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), n), 1, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor([word_vocab.stoi.get(w, 0) for w in s])
        return ids, torch.tensor([len(s) for s in seqs])

    def chars(seqs):
        n = max(len(s) for s in seqs)
        wl = max(CHAR_CHANNEL_WIDTH, max(len(w) for s in seqs for w in s))
        ids = torch.full((len(seqs), n, wl), 1, dtype=torch.long)
        for i, s in enumerate(seqs):
            for j, w in enumerate(s):
                ids[i, j, : len(w)] = torch.tensor([char_vocab.stoi.get(c, 0) for c in w])
        return ids

    contexts, questions = [e[0] for e in examples], [e[1] for e in examples]
    c_word, c_lens = words(contexts)
    q_word, q_lens = words(questions)
    s_idx = torch.tensor([e[2] for e in examples])
    e_idx = torch.tensor([e[3] + (1 if exclusive_end else 0) for e in examples])
    return (chars(contexts), c_word, c_lens, chars(questions), q_word, q_lens), torch.stack([s_idx, e_idx], 1)


# --------------------------------------------------------------------------- utils/nn.py


class LSTM(nn.Module):
    def __init__(self, input_size, hidden_size, batch_first=False, num_layers=1, bidirectional=False, dropout=0.2):
        super().__init__()
        self.rnn = nn.LSTM(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                           bidirectional=bidirectional, batch_first=batch_first)  # fmt: skip
        for i in range(num_layers):
            for suffix in ("", "_reverse") if bidirectional else ("",):
                nn.init.orthogonal_(getattr(self.rnn, f"weight_hh_l{i}{suffix}"))
                nn.init.kaiming_normal_(getattr(self.rnn, f"weight_ih_l{i}{suffix}"))
                nn.init.constant_(getattr(self.rnn, f"bias_hh_l{i}{suffix}"), val=0)
                nn.init.constant_(getattr(self.rnn, f"bias_ih_l{i}{suffix}"), val=0)
                getattr(self.rnn, f"bias_hh_l{i}{suffix}").data.chunk(4)[1].fill_(1)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x):
        x, x_len = x
        x = self.dropout(x)
        x_len_sorted, x_idx = torch.sort(x_len, descending=True)
        x_sorted = x.index_select(dim=0, index=x_idx)
        _, x_ori_idx = torch.sort(x_idx)
        packed = nn.utils.rnn.pack_padded_sequence(x_sorted, x_len_sorted.cpu(), batch_first=True)
        packed, (h, _c) = self.rnn(packed)
        x = nn.utils.rnn.pad_packed_sequence(packed, batch_first=True, total_length=x.size(1))[0]
        x = x.index_select(dim=0, index=x_ori_idx)
        h = h.permute(1, 0, 2).contiguous().view(-1, h.size(0) * h.size(2)).index_select(dim=0, index=x_ori_idx)
        return x, h


class Linear(nn.Module):
    def __init__(self, in_features, out_features, dropout=0.0):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        if dropout > 0:
            self.dropout = nn.Dropout(p=dropout)
        nn.init.kaiming_normal_(self.linear.weight)
        nn.init.constant_(self.linear.bias, 0)

    def forward(self, x):
        if hasattr(self, "dropout"):
            x = self.dropout(x)
        return self.linear(x)


# --------------------------------------------------------------------------- model/model.py


class BiDAF(nn.Module):
    def __init__(self, char_vocab_size: int, pretrained: torch.Tensor) -> None:
        super().__init__()
        self.char_emb = nn.Embedding(char_vocab_size, CHAR_DIM, padding_idx=1)
        nn.init.uniform_(self.char_emb.weight, -0.001, 0.001)
        self.char_conv = nn.Sequential(nn.Conv2d(1, CHAR_CHANNEL_SIZE, (CHAR_DIM, CHAR_CHANNEL_WIDTH)), nn.ReLU())
        self.word_emb = nn.Embedding.from_pretrained(pretrained, freeze=True)
        assert HIDDEN * 2 == CHAR_CHANNEL_SIZE + WORD_DIM
        for i in range(2):
            setattr(self, f"highway_linear{i}", nn.Sequential(Linear(HIDDEN * 2, HIDDEN * 2), nn.ReLU()))
            setattr(self, f"highway_gate{i}", nn.Sequential(Linear(HIDDEN * 2, HIDDEN * 2), nn.Sigmoid()))
        self.context_LSTM = LSTM(HIDDEN * 2, HIDDEN, bidirectional=True, batch_first=True, dropout=DROPOUT)
        self.att_weight_c = Linear(HIDDEN * 2, 1)
        self.att_weight_q = Linear(HIDDEN * 2, 1)
        self.att_weight_cq = Linear(HIDDEN * 2, 1)
        self.modeling_LSTM1 = LSTM(HIDDEN * 8, HIDDEN, bidirectional=True, batch_first=True, dropout=DROPOUT)
        self.modeling_LSTM2 = LSTM(HIDDEN * 2, HIDDEN, bidirectional=True, batch_first=True, dropout=DROPOUT)
        self.p1_weight_g = Linear(HIDDEN * 8, 1, dropout=DROPOUT)
        self.p1_weight_m = Linear(HIDDEN * 2, 1, dropout=DROPOUT)
        self.p2_weight_g = Linear(HIDDEN * 8, 1, dropout=DROPOUT)
        self.p2_weight_m = Linear(HIDDEN * 2, 1, dropout=DROPOUT)
        self.output_LSTM = LSTM(HIDDEN * 2, HIDDEN, bidirectional=True, batch_first=True, dropout=DROPOUT)
        self.dropout = nn.Dropout(p=DROPOUT)

    def char_emb_layer(self, x):
        batch_size = x.size(0)
        x = self.dropout(self.char_emb(x))  # (batch, seq, word_len, char_dim)
        x = x.transpose(2, 3)
        x = x.reshape(-1, CHAR_DIM, x.size(3)).unsqueeze(1)  # (batch * seq, 1, char_dim, word_len)
        x = self.char_conv(x).squeeze(2)  # (batch * seq, channels, conv_len)
        x = F.max_pool1d(x, x.size(2)).squeeze(2)
        return x.view(batch_size, -1, CHAR_CHANNEL_SIZE)

    def highway_network(self, x1, x2):
        x = torch.cat([x1, x2], dim=-1)
        for i in range(2):
            h = getattr(self, f"highway_linear{i}")(x)
            g = getattr(self, f"highway_gate{i}")(x)
            x = g * h + (1 - g) * x
        return x

    def att_flow_layer(self, c, q):
        c_len, q_len = c.size(1), q.size(1)
        cq = []
        for i in range(q_len):
            qi = q.select(1, i).unsqueeze(1)
            cq.append(self.att_weight_cq(c * qi).squeeze(-1))
        cq = torch.stack(cq, dim=-1)  # (batch, c_len, q_len)
        s = (self.att_weight_c(c).expand(-1, -1, q_len)
             + self.att_weight_q(q).permute(0, 2, 1).expand(-1, c_len, -1) + cq)  # fmt: skip
        a = F.softmax(s, dim=2)
        c2q_att = torch.bmm(a, q)
        b = F.softmax(torch.max(s, dim=2)[0], dim=1).unsqueeze(1)
        q2c_att = torch.bmm(b, c).squeeze(1).unsqueeze(1).expand(-1, c_len, -1)
        return torch.cat([c, c2q_att, c * c2q_att, c * q2c_att], dim=-1)

    def output_layer(self, g, m, lens):
        p1 = (self.p1_weight_g(g) + self.p1_weight_m(m)).squeeze(-1)
        m2 = self.output_LSTM((m, lens))[0]
        p2 = (self.p2_weight_g(g) + self.p2_weight_m(m2)).squeeze(-1)
        return p1, p2

    def forward(self, c_char, c_word, c_lens, q_char, q_word, q_lens):
        c = self.highway_network(self.char_emb_layer(c_char), self.word_emb(c_word))
        q = self.highway_network(self.char_emb_layer(q_char), self.word_emb(q_word))
        c = self.context_LSTM((c, c_lens))[0]
        q = self.context_LSTM((q, q_lens))[0]
        g = self.att_flow_layer(c, q)
        m = self.modeling_LSTM2((self.modeling_LSTM1((g, c_lens))[0], c_lens))[0]
        return self.output_layer(g, m, c_lens)


# --------------------------------------------------------------------------- model/ema.py


class EMA:
    def __init__(self, mu: float) -> None:
        self.mu, self.shadow = mu, {}

    def register(self, name, val):
        self.shadow[name] = val.clone()

    def get(self, name):
        return self.shadow[name]

    def update(self, name, x):
        assert name in self.shadow
        self.shadow[name] = ((1.0 - self.mu) * x + self.mu * self.shadow[name]).clone()


# --------------------------------------------------------------------------- run.py / evaluate.py


criterion = nn.CrossEntropyLoss()


def span_loss(output, targets):
    p1, p2 = output
    return criterion(p1, targets[:, 0]) + criterion(p2, targets[:, 1])


def f1_score(prediction: list[int], truth: list[int]) -> float:
    common: dict[int, int] = {}
    for t in set(prediction):
        common[t] = min(prediction.count(t), truth.count(t))
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(prediction), num_same / len(truth)
    return 2 * precision * recall / (precision + recall)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    examples = make_examples(seed)
    train_ex, dev_ex = examples[:N_TRAIN], examples[N_TRAIN:]
    word_vocab, char_vocab = Vocab(), Vocab()
    for context, question, _, _ in train_ex:
        for w in context + question:
            word_vocab.add(w)
            for ch in w:
                char_vocab.add(ch)
    pretrained = torch.randn(len(word_vocab.itos), WORD_DIM, generator=torch.Generator().manual_seed(seed + 5))
    exclusive = variant == "end_index_exclusive"

    def batches(ex, size, shuffle):
        order = sorted(range(len(ex)), key=lambda i: len(ex[i][0]))  # BucketIterator: similar lengths together
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
        if shuffle:
            chunks = [chunks[i] for i in rng.permutation(len(chunks))]
        return [tensorize([ex[i] for i in chunk], word_vocab, char_vocab, exclusive) for chunk in chunks]

    dev_batches = batches(dev_ex, DEV_BATCH, False)
    dev_truth = {}
    model = BiDAF(len(char_vocab.itos), pretrained)
    ema = EMA(EXP_DECAY_RATE)
    for name, param in model.named_parameters():
        if param.requires_grad:
            ema.register(name, param.data)
    optimizer = optim.Adadelta(filter(lambda p: p.requires_grad, model.parameters()), lr=LR)

    def test():
        loss, exact, f1, n = 0.0, 0.0, 0.0, 0
        model.eval()
        backup = EMA(0)
        for name, param in model.named_parameters():
            if param.requires_grad:
                backup.register(name, param.data)
                param.data.copy_(ema.get(name))
        with torch.no_grad():
            for bi, (inputs, targets) in enumerate(dev_batches):
                p1, p2 = model(*inputs)
                loss += span_loss((p1, p2), targets).item()
                batch_size, c_len = p1.size()
                mask = (torch.ones(c_len, c_len) * float("-inf")).tril(-1).unsqueeze(0).expand(batch_size, -1, -1)
                score = F.log_softmax(p1, dim=1).unsqueeze(2) + F.log_softmax(p2, dim=1).unsqueeze(1) + mask
                score, s_idx = score.max(dim=1)
                score, e_idx = score.max(dim=1)
                s_idx = torch.gather(s_idx, 1, e_idx.view(-1, 1)).squeeze(1)
                c_word = inputs[1]
                for i in range(batch_size):
                    answer = c_word[i][s_idx[i] : e_idx[i] + 1].tolist()
                    truth = dev_truth[(bi, i)]
                    exact += float(answer == truth)
                    f1 += f1_score(answer, truth)
                    n += 1
            for name, param in model.named_parameters():
                if param.requires_grad:
                    param.data.copy_(backup.get(name))
        return loss, exact / n, f1 / n

    # the gold answers, as evaluate.py reads them from the dev file (never shifted)
    order = sorted(range(len(dev_ex)), key=lambda i: len(dev_ex[i][0]))
    for k, i in enumerate(order):
        context, _, s, e = dev_ex[i]
        ids = [word_vocab.stoi.get(w, 0) for w in context[s : e + 1]]
        dev_truth[(k // DEV_BATCH, k % DEV_BATCH)] = ids

    model.train()
    first = None
    mon = None
    loss_sum, max_dev_exact, max_dev_f1, dev_loss, step = 0.0, -1.0, -1.0, float("nan"), 0
    train_loss = float("nan")
    best_model = None
    for _epoch in range(EPOCHS):
        for inputs, targets in batches(train_ex, BATCH, True):
            if first is None:  # the author's preflight, on the first batch
                first = (inputs, targets)
                nx.preflight(model, first, span_loss, optimizer=optimizer)
                mon = nx.monitor(model, optimizer, every=5)
                model.train()
            p1, p2 = model(*inputs)
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            batch_loss = span_loss((p1, p2), targets)
            loss_sum += batch_loss.item()
            batch_loss.backward()
            optimizer.step()
            mon.log(batch_loss)
            for name, param in model.named_parameters():
                if param.requires_grad:
                    ema.update(name, param.data)
            step += 1
            if step % PRINT_FREQ == 0:
                dev_loss, dev_exact, dev_f1 = test()
                mon.log(torch.tensor(dev_loss / len(dev_batches)), split="val")
                train_loss = loss_sum / PRINT_FREQ
                if dev_f1 > max_dev_f1:
                    max_dev_f1, max_dev_exact = dev_f1, dev_exact
                    best_model = copy.deepcopy(model)
                loss_sum = 0.0
                model.train()
    nx.finish(mon, model, first, span_loss, optimizer=optimizer)
    del best_model
    return {"best_dev_exact": max_dev_exact, "best_dev_f1": max_dev_f1, "last_dev_loss": dev_loss / len(dev_batches),
            "train_loss": train_loss}  # fmt: skip
