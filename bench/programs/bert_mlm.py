"""Port of codertimo/BERT-pytorch: BERT pre-training, masked LM + next-sentence prediction.

Source: github.com/codertimo/BERT-pytorch, ``bert_pytorch/trainer/pretrain.py``,
``trainer/optim_schedule.py``, ``dataset/dataset.py``, ``dataset/vocab.py``, ``model/`` and
``__main__.py`` at commit d10dc4f9d5a6f2ca74380f62039526eb7277c671 (Apache-2.0, Copyright
Junseong Kim). Written anew from the facts of those files; no code copied.

Kept: ``WordVocab`` (the specials ``<pad>`` 0, ``<unk>`` 1, ``<eos>`` 2, ``<sos>`` 3, ``<mask>`` 4,
then the words by frequency, ties alphabetical, from the corpus lines with the tab removed);
``BERTDataset`` on memory (each line ``t1 \\t t2``): ``random_sent`` (with probability 1/2 the
line's own second sentence, label 1, else the second sentence of a random line, label 0),
``random_word`` (each token with probability 0.15 chosen: 80% ``<mask>``, 10% a random index
of the vocabulary, 10% itself, its label the token's index; every other token label 0), ``[sos]
t1 [eos] t2 [eos]`` with labels padded by 0, segment labels 1 and 2, all cut and padded to
``seq_len``; python's ``random``. ``BERT``: ``BERTEmbedding`` (token and segment embeddings
with ``padding_idx=0``, the fixed sinusoidal ``PositionalEmbedding`` buffer, dropout), the
padding mask ``(x > 0)`` repeated to (batch, 1, seq, seq), ``TransformerBlock`` s of
``SublayerConnection`` (the repository's ``LayerNorm`` with ``std`` and eps 1e-6, applied
first, residual after dropout) around ``MultiHeadedAttention`` (three ``Linear`` projections,
``view``/``transpose`` to heads, scores / sqrt(d_k), ``masked_fill(mask == 0, -1e9)``,
softmax, dropout, the output ``Linear``) and ``PositionwiseFeedForward`` (w_1, the tanh
``GELU``, dropout, w_2), then a dropout; feed-forward width 4 x hidden. ``BERTLM``:
``NextSentencePrediction`` (``Linear(hidden, 2)`` on position 0 + ``LogSoftmax``) and
``MaskedLanguageModel`` (``Linear(hidden, vocab)`` + ``LogSoftmax``). ``BERTTrainer``:
``Adam(lr, betas=(0.9, 0.999), weight_decay=0.01)`` wrapped in ``ScheduledOptim`` (the LR set
before every step to ``hidden ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)``, so the
``--lr`` given to Adam is overwritten), ``nn.NLLLoss(ignore_index=0)`` for the masked LM on
``mask_lm_output.transpose(1, 2)``, ``loss = next_loss + mask_loss``; ``iteration``:
forward, the two losses, ``zero_grad`` / ``backward`` / ``step_and_update_lr`` when training,
the NSP accuracy, ``avg_loss``, the ``post_fix`` record every ``log_freq`` iterations;
``__main__``: the train loader (``DataLoader`` without shuffling, as written) and the test
loader, per epoch ``trainer.train(epoch)`` then ``trainer.test(epoch)`` (the repository's
test pass: same ``iteration`` without the step, model left in train mode).
Healthy: the next-sentence loss uses its own ``nn.NLLLoss()``, the fix the maintainer
accepted in issue #49 (#32, #98, PR #77); the published code shares the masked-LM criterion
with ``ignore_index=0``, which is the bug variant ``nsp_ignore_index``.
Shrunk: a generated corpus (4 topics of 16 words, each topic a Markov chain in which every
word has 2 likely successors, 6 function words mixed in at 15%; a line is 8-16 words of one
chain cut in two sentences of at least 4) of 2,000 training and 400 test lines instead of a
text file; hidden 64, 2 layers, 4 heads instead of 256, 8, 8 (``__main__``'s defaults);
``seq_len`` 20 kept; batch 64 kept; 12 epochs (384 steps) instead of 10 over a real corpus;
``warmup_steps`` 500 instead of 10,000 (the run stays inside the warm-up, as a short run of
the original does; the LR reaches 4.3e-3); ``adam_weight_decay`` 0.001 instead of 0.01 (Adam's
coupled L2 of 0.01 outweighs the next-sentence gradient at this size: the NSP accuracy stays
at 0.54 after 310 steps where it reaches 0.85 without it); ``log_freq`` 10 kept (records kept,
not printed); no model saving, no CUDA/DataParallel, no tqdm.
Measure only (not in the program): on the test lines with fixed draws of ``random_sent`` and
``random_word`` (seeded ``random``), model in ``eval()`` under ``no_grad``: the masked-LM
accuracy over the chosen positions and the next-sentence accuracy.

nndx, as the author would add it: a preflight ``nndx.probe`` on the ``BERTLM`` with the first
training batch, inputs ``(bert_input, segment_label)`` and targets ``(is_next, bert_label)``, the
loss the trainer computes (``next_loss + mask_loss``) as the loss function and the inner
``Adam`` (``ScheduledOptim`` is not a torch optimizer) as the optimizer; ``nndx.Monitor(model,
optim, loss_fn=that loss)`` around the epochs, the loss computed through ``mon.loss_fn``, each
training step's loss and NSP accuracy logged, each test pass's average loss and NSP accuracy
logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bert_mlm"
SOURCE = Source("codertimo/BERT-pytorch", "bert_pytorch/trainer/pretrain.py", "d10dc4f9d5a6f2ca74380f62039526eb7277c671",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published, with the next-sentence loss fixed as agreed in issue #49"),
        Variant(
            "nsp_ignore_index",
            "next_loss = self.criterion(next_sent_output, is_next) with the masked-LM criterion "
            "NLLLoss(ignore_index=0), as published: every IsNotNext (label 0) pair is ignored, so the NSP head is "
            "only ever taught 'IsNext' and its loss falls to ~0 while its accuracy stays at chance",
            (C.WRONG_LOSS,),
            ("https://github.com/codertimo/BERT-pytorch/issues/32",
             "https://github.com/codertimo/BERT-pytorch/issues/49",
             "https://github.com/codertimo/BERT-pytorch/issues/98",
             "https://github.com/codertimo/BERT-pytorch/pull/77"),
            Measure("test_nsp_acc", "held-out next-sentence accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "mlm_input_not_masked",
            "bert_input built from the sentences' own token indices instead of random_word's masked ones (the "
            "labels still mark the chosen 15%): the model is shown every token it is asked to predict and learns "
            "to copy it",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/huggingface/transformers/issues/243",
             "https://github.com/huggingface/transformers/issues/226",
             "https://github.com/huggingface/transformers/pull/244"),
            Measure("test_mlm_acc", "held-out masked-LM accuracy (inputs masked as published) at least 0.1 below "
                    "the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = {"hidden": 64, "layers": 2, "attn_heads": 4, "seq_len": 20, "batch_size": 64, "epochs": 12, "lr": 1e-3,
        "adam_weight_decay": 0.001, "adam_beta1": 0.9, "adam_beta2": 0.999, "warmup_steps": 500, "log_freq": 10,
        "dropout": 0.1, "train_lines": 2000, "test_lines": 400}  # fmt: skip
TOPICS, PER_TOPIC, SUCCESSORS, FUNCTION_WORDS = 4, 16, 2, 6


# --------------------------------------------------------------------------- the corpus (the data)


def corpus(n_lines: int, seed: int, grammar_seed: int = 0) -> list[str]:
    """Lines ``t1 \\t t2``: a topic's Markov chain run for 8-16 words, cut in two sentences."""
    g = np.random.default_rng(grammar_seed)
    successors = {(t, w): g.choice(PER_TOPIC, size=SUCCESSORS, replace=False) for t in range(TOPICS)
                  for w in range(PER_TOPIC)}  # fmt: skip
    probs = {key: g.dirichlet(np.full(SUCCESSORS, 2.0)) for key in successors}
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_lines):
        topic, word = int(rng.integers(TOPICS)), int(rng.integers(PER_TOPIC))
        words = []
        for _ in range(int(rng.integers(4, 9)) + int(rng.integers(4, 9))):
            if rng.random() < 0.15:
                words.append(f"f{int(rng.integers(FUNCTION_WORDS))}")
            else:
                words.append(f"t{topic}w{word}")
                word = int(successors[(topic, word)][rng.choice(SUCCESSORS, p=probs[(topic, word)])])
        cut = int(rng.integers(4, len(words) - 3))
        lines.append(" ".join(words[:cut]) + " \t " + " ".join(words[cut:]))
    return lines


# --------------------------------------------------------------------------- dataset/vocab.py


class WordVocab:
    """TorchVocab + Vocab + WordVocab: the specials, then the words by frequency (ties alphabetical)."""

    def __init__(self, texts: list[str], max_size: int | None = None, min_freq: int = 1) -> None:
        self.pad_index, self.unk_index, self.eos_index, self.sos_index, self.mask_index = 0, 1, 2, 3, 4
        specials = ["<pad>", "<unk>", "<eos>", "<sos>", "<mask>"]
        counter: Counter = Counter()
        for line in texts:
            for word in line.replace("\n", "").replace("\t", "").split():
                counter[word] += 1
        self.freqs = counter
        counter = counter.copy()
        min_freq = max(min_freq, 1)
        self.itos = list(specials)
        for tok in specials:
            del counter[tok]
        max_size = None if max_size is None else max_size + len(self.itos)
        words_and_frequencies = sorted(counter.items(), key=lambda tup: tup[0])
        words_and_frequencies.sort(key=lambda tup: tup[1], reverse=True)
        for word, freq in words_and_frequencies:
            if freq < min_freq or len(self.itos) == max_size:
                break
            self.itos.append(word)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)


# --------------------------------------------------------------------------- dataset/dataset.py


class BERTDataset(Dataset):
    def __init__(self, lines: list[str], vocab: WordVocab, seq_len: int, input_not_masked: bool = False) -> None:
        self.vocab, self.seq_len = vocab, seq_len
        self.lines = [line.split("\t") for line in lines]  # on_memory
        self.corpus_lines = len(self.lines)
        self.input_not_masked = input_not_masked

    def __len__(self) -> int:
        return self.corpus_lines

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        t1, t2, is_next_label = self.random_sent(item)
        t1_random, t1_label = self.random_word(t1)
        t2_random, t2_label = self.random_word(t2)
        if self.input_not_masked:  # the bug: the sentences' own indices go in, not random_word's
            t1_random = [self.vocab.stoi.get(tok, self.vocab.unk_index) for tok in t1.split()]
            t2_random = [self.vocab.stoi.get(tok, self.vocab.unk_index) for tok in t2.split()]

        t1 = [self.vocab.sos_index] + t1_random + [self.vocab.eos_index]  # [CLS] tag = SOS tag, [SEP] tag = EOS tag
        t2 = t2_random + [self.vocab.eos_index]
        t1_label = [self.vocab.pad_index] + t1_label + [self.vocab.pad_index]
        t2_label = t2_label + [self.vocab.pad_index]

        segment_label = ([1 for _ in range(len(t1))] + [2 for _ in range(len(t2))])[: self.seq_len]
        bert_input = (t1 + t2)[: self.seq_len]
        bert_label = (t1_label + t2_label)[: self.seq_len]
        padding = [self.vocab.pad_index for _ in range(self.seq_len - len(bert_input))]
        bert_input.extend(padding), bert_label.extend(padding), segment_label.extend(padding)
        output = {"bert_input": bert_input, "bert_label": bert_label, "segment_label": segment_label,
                  "is_next": is_next_label}  # fmt: skip
        return {key: torch.tensor(value) for key, value in output.items()}

    def random_word(self, sentence: str) -> tuple[list[int], list[int]]:
        tokens = sentence.split()
        output_label = []
        for i, token in enumerate(tokens):
            prob = random.random()
            if prob < 0.15:
                prob /= 0.15
                if prob < 0.8:  # 80% randomly change token to mask token
                    tokens[i] = self.vocab.mask_index
                elif prob < 0.9:  # 10% randomly change token to random token
                    tokens[i] = random.randrange(len(self.vocab))
                else:  # 10% randomly change token to current token
                    tokens[i] = self.vocab.stoi.get(token, self.vocab.unk_index)
                output_label.append(self.vocab.stoi.get(token, self.vocab.unk_index))
            else:
                tokens[i] = self.vocab.stoi.get(token, self.vocab.unk_index)
                output_label.append(0)
        return tokens, output_label

    def random_sent(self, index: int) -> tuple[str, str, int]:
        t1, t2 = self.lines[index][0], self.lines[index][1]
        if random.random() > 0.5:  # output_text, label(isNotNext:0, isNext:1)
            return t1, t2, 1
        return t1, self.lines[random.randrange(len(self.lines))][1], 0


# --------------------------------------------------------------------------- model/


class GELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


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


class SublayerConnection(nn.Module):
    """A residual connection around a sublayer, the layer norm applied first."""

    def __init__(self, size: int, dropout: float) -> None:
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class Attention(nn.Module):
    """Scaled dot-product attention."""

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
        query, key, value = [lin(x).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linear_layers, (query, key, value))]  # fmt: skip
        x, _attn = self.attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(batch_size, -1, self.h * self.d_k)
        return self.output_linear(x)


class TransformerBlock(nn.Module):
    def __init__(self, hidden: int, attn_heads: int, feed_forward_hidden: int, dropout: float) -> None:
        super().__init__()
        self.attention = MultiHeadedAttention(h=attn_heads, d_model=hidden)
        self.feed_forward = PositionwiseFeedForward(d_model=hidden, d_ff=feed_forward_hidden, dropout=dropout)
        self.input_sublayer = SublayerConnection(size=hidden, dropout=dropout)
        self.output_sublayer = SublayerConnection(size=hidden, dropout=dropout)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.input_sublayer(x, lambda _x: self.attention.forward(_x, _x, _x, mask=mask))
        x = self.output_sublayer(x, self.feed_forward)
        return self.dropout(x)


class PositionalEmbedding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 512) -> None:
        super().__init__()
        pe = torch.zeros(max_len, d_model).float()
        pe.require_grad = False  # sic
        position = torch.arange(0, max_len).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pe[:, : x.size(1)]


class BERTEmbedding(nn.Module):
    """Token + positional + segment embeddings, then dropout."""

    def __init__(self, vocab_size: int, embed_size: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, embed_size, padding_idx=0)  # TokenEmbedding
        self.position = PositionalEmbedding(d_model=self.token.embedding_dim)
        self.segment = nn.Embedding(3, self.token.embedding_dim, padding_idx=0)  # SegmentEmbedding
        self.dropout = nn.Dropout(p=dropout)
        self.embed_size = embed_size

    def forward(self, sequence: torch.Tensor, segment_label: torch.Tensor) -> torch.Tensor:
        x = self.token(sequence) + self.position(sequence) + self.segment(segment_label)
        return self.dropout(x)


class BERT(nn.Module):
    def __init__(self, vocab_size: int, hidden: int = 768, n_layers: int = 12, attn_heads: int = 12,
                 dropout: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.hidden, self.n_layers, self.attn_heads = hidden, n_layers, attn_heads
        self.feed_forward_hidden = hidden * 4
        self.embedding = BERTEmbedding(vocab_size=vocab_size, embed_size=hidden)
        self.transformer_blocks = nn.ModuleList(
            [TransformerBlock(hidden, attn_heads, hidden * 4, dropout) for _ in range(n_layers)])

    def forward(self, x: torch.Tensor, segment_info: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).unsqueeze(1).repeat(1, x.size(1), 1).unsqueeze(1)  # attention masking for padded token
        x = self.embedding(x, segment_info)
        for transformer in self.transformer_blocks:
            x = transformer.forward(x, mask)
        return x


class NextSentencePrediction(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, 2)
        self.softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.linear(x[:, 0]))


class MaskedLanguageModel(nn.Module):
    def __init__(self, hidden: int, vocab_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, vocab_size)
        self.softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.linear(x))


class BERTLM(nn.Module):
    """Next-sentence prediction + masked language model."""

    def __init__(self, bert: BERT, vocab_size: int) -> None:
        super().__init__()
        self.bert = bert
        self.next_sentence = NextSentencePrediction(self.bert.hidden)
        self.mask_lm = MaskedLanguageModel(self.bert.hidden, vocab_size)

    def forward(self, x: torch.Tensor, segment_label: torch.Tensor):
        x = self.bert(x, segment_label)
        return self.next_sentence(x), self.mask_lm(x)


# --------------------------------------------------------------------------- trainer/


class ScheduledOptim:
    """A simple wrapper class for learning rate scheduling."""

    def __init__(self, optimizer: torch.optim.Optimizer, d_model: int, n_warmup_steps: int) -> None:
        self._optimizer = optimizer
        self.n_warmup_steps = n_warmup_steps
        self.n_current_steps = 0
        self.init_lr = np.power(d_model, -0.5)

    def step_and_update_lr(self) -> None:
        self._update_learning_rate()
        self._optimizer.step()

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()

    def _get_lr_scale(self) -> float:
        return np.min([np.power(self.n_current_steps, -0.5), np.power(self.n_warmup_steps, -1.5) * self.n_current_steps])

    def _update_learning_rate(self) -> None:
        self.n_current_steps += 1
        lr = self.init_lr * self._get_lr_scale()
        for param_group in self._optimizer.param_groups:
            param_group["lr"] = lr


class BERTTrainer:
    def __init__(self, bert: BERT, vocab_size: int, train_dataloader: DataLoader, test_dataloader=None,
                 lr: float = 1e-4, betas=(0.9, 0.999), weight_decay: float = 0.01, warmup_steps: int = 10000,
                 log_freq: int = 10, shared_nsp_criterion: bool = False) -> None:  # fmt: skip
        self.device = torch.device("cpu")
        self.bert = bert
        self.model = BERTLM(bert, vocab_size).to(self.device)
        self.train_data, self.test_data = train_dataloader, test_dataloader
        self.optim = Adam(self.model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.optim_schedule = ScheduledOptim(self.optim, self.bert.hidden, n_warmup_steps=warmup_steps)
        self.criterion = nn.NLLLoss(ignore_index=0)  # predicting the masked tokens
        # the fix of issue #49: is_next is 0 or 1, so the NSP loss must not ignore label 0
        self.nsp_criterion = self.criterion if shared_nsp_criterion else nn.NLLLoss()
        self.log_freq = log_freq
        self.records: list[dict] = []
        self.mon = None

    def loss_fn(self, output, targets) -> torch.Tensor:
        """The trainer's loss as a function of the model's output and (is_next, bert_label)."""
        next_sent_output, mask_lm_output = output
        is_next, bert_label = targets
        next_loss = self.nsp_criterion(next_sent_output, is_next)  # 2-1. NLL of the is_next classification
        mask_loss = self.criterion(mask_lm_output.transpose(1, 2), bert_label)  # 2-2. NLL of the masked words
        return next_loss + mask_loss  # 2-3. 3.4 Pre-training Procedure

    def train(self, epoch: int) -> None:
        self.iteration(epoch, self.train_data)

    def test(self, epoch: int) -> None:
        self.iteration(epoch, self.test_data, train=False)

    def iteration(self, epoch: int, data_loader: DataLoader, train: bool = True) -> None:
        str_code = "train" if train else "test"
        avg_loss, total_correct, total_element = 0.0, 0, 0
        for i, data in enumerate(data_loader):
            data = {key: value.to(self.device) for key, value in data.items()}
            output = self.model.forward(data["bert_input"], data["segment_label"])
            loss = self.mon.loss_fn(output, (data["is_next"], data["bert_label"]))
            if train:
                self.optim_schedule.zero_grad()
                loss.backward()
                self.optim_schedule.step_and_update_lr()
            correct = output[0].argmax(dim=-1).eq(data["is_next"]).sum().item()  # next sentence prediction accuracy
            avg_loss += loss.item()
            total_correct += correct
            total_element += data["is_next"].nelement()
            if train:
                self.mon.log(loss, accuracy=correct / data["is_next"].nelement())
            post_fix = {"epoch": epoch, "iter": i, "avg_loss": avg_loss / (i + 1),
                        "avg_acc": total_correct / total_element * 100, "loss": loss.item(), "split": str_code}  # fmt: skip
            if i % self.log_freq == 0:
                self.records.append(post_fix)
        summary = {"epoch": epoch, "split": str_code, "avg_loss": avg_loss / len(data_loader),
                   "total_acc": total_correct * 100.0 / total_element}  # fmt: skip
        self.records.append(summary)
        if not train:
            self.mon.log(summary["avg_loss"], split="val", accuracy=summary["total_acc"] / 100.0)


# --------------------------------------------------------------------------- measure only


@torch.no_grad()
def heldout(model: BERTLM, lines: list[str], vocab: WordVocab, seed: int) -> dict[str, float]:
    """Masked-LM accuracy over the chosen positions and NSP accuracy on the test lines, with fixed
    draws (inputs masked as published), eval mode."""
    state = random.getstate()
    random.seed(20_000 + seed)
    dataset = BERTDataset(lines, vocab, ARGS["seq_len"])
    items = [dataset[i] for i in range(len(dataset))]
    random.setstate(state)
    batch = {key: torch.stack([item[key] for item in items]) for key in items[0]}
    model.eval()
    nsp, mlm = model(batch["bert_input"], batch["segment_label"])
    model.train()
    chosen = batch["bert_label"] > 0
    return {
        "test_mlm_acc": float((mlm.argmax(-1)[chosen] == batch["bert_label"][chosen]).float().mean()),
        "test_nsp_acc": float((nsp.argmax(-1) == batch["is_next"]).float().mean()),
        "test_mlm_loss": float(F.nll_loss(mlm[chosen], batch["bert_label"][chosen])),
    }


# --------------------------------------------------------------------------- __main__.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(seed)
    torch.manual_seed(seed)
    train_lines, test_lines = corpus(args["train_lines"], seed + 1), corpus(args["test_lines"], seed + 2)
    vocab = WordVocab(train_lines)

    train_dataset = BERTDataset(train_lines, vocab, seq_len=args["seq_len"],
                                input_not_masked=variant == "mlm_input_not_masked")  # fmt: skip
    test_dataset = BERTDataset(test_lines, vocab, seq_len=args["seq_len"],
                               input_not_masked=variant == "mlm_input_not_masked")  # fmt: skip
    train_data_loader = DataLoader(train_dataset, batch_size=args["batch_size"], num_workers=0)
    test_data_loader = DataLoader(test_dataset, batch_size=args["batch_size"], num_workers=0)

    bert = BERT(len(vocab), hidden=args["hidden"], n_layers=args["layers"], attn_heads=args["attn_heads"],
                dropout=args["dropout"])  # fmt: skip
    trainer = BERTTrainer(bert, len(vocab), train_dataloader=train_data_loader, test_dataloader=test_data_loader,
                          lr=args["lr"], betas=(args["adam_beta1"], args["adam_beta2"]),
                          weight_decay=args["adam_weight_decay"], warmup_steps=args["warmup_steps"],
                          log_freq=args["log_freq"], shared_nsp_criterion=variant == "nsp_ignore_index")  # fmt: skip

    # the author's preflight: the first training batch (drawn with its own random state)
    state = random.getstate()
    first = next(iter(train_data_loader))
    random.setstate(state)
    probe_batch = ((first["bert_input"], first["segment_label"]), (first["is_next"], first["bert_label"]))
    nx.preflight(trainer.model, probe_batch, trainer.loss_fn, optimizer=trainer.optim)
    trainer.mon = nx.monitor(trainer.model, trainer.optim, every=10, loss_fn=trainer.loss_fn)

    for epoch in range(args["epochs"]):
        trainer.train(epoch)
        if test_data_loader is not None:
            trainer.test(epoch)
    nx.finish(trainer.mon, trainer.model, probe_batch, trainer.loss_fn, optimizer=trainer.optim)

    train_summaries = [r for r in trainer.records if r["split"] == "train" and "total_acc" in r]
    test_summaries = [r for r in trainer.records if r["split"] == "test" and "total_acc" in r]
    return {
        **heldout(trainer.model, test_lines, vocab, seed),
        "train_avg_loss": train_summaries[-1]["avg_loss"],
        "train_nsp_acc": train_summaries[-1]["total_acc"] / 100.0,
        "test_avg_loss": test_summaries[-1]["avg_loss"],
        "test_total_acc": test_summaries[-1]["total_acc"] / 100.0,
    }
