"""Port of kimiyoung/transformer-xl (PyTorch): a Transformer language model with segment-level
recurrence (a memory of the previous segment's hidden states) and relative positional attention.

Source: github.com/kimiyoung/transformer-xl, ``pytorch/mem_transformer.py``, ``pytorch/train.py``
and ``pytorch/data_utils.py`` at commit 44781ed21dbaec88b280f74d9ae2877f52b492a5 (Apache-2.0).
Written anew from the facts of those files; no code copied.

Kept: ``MemTransformerLM`` with ``attn_type 0`` (the default): ``AdaptiveEmbedding`` with
``div_val 1`` and no cutoffs (one ``nn.Embedding``, scaled by ``sqrt(d_model)``), embedding
dropout, sinusoidal ``PositionalEmbedding`` over the relative distances ``klen-1 ... 0``,
learnable ``r_w_bias`` / ``r_r_bias`` shared by all layers, and
``RelPartialLearnableDecoderLayer`` s: ``RelPartialLearnableMultiHeadAttn`` (``qkv_net`` over
``cat([mems, w])``, queries the last ``qlen`` rows, ``r_net`` of the position embeddings, the
content term ``AC`` with ``r_w_bias`` and the position term ``BD`` with ``r_r_bias`` through
``_rel_shift``, scale ``1/sqrt(d_head)``, the causal mask ``triu(ones(qlen, klen),
diagonal=1+mlen)`` filled with ``-inf``, softmax over the keys, ``dropatt``, ``o_net``,
dropout, post-LayerNorm residual) then ``PositionwiseFF`` (Linear, ReLU, dropout, Linear,
dropout, post-LayerNorm residual); the memory: ``init_mems`` (empty tensors for
``n_layer + 1`` hidden-state lists), ``_update_mems`` under ``no_grad`` keeping the last
``mem_len`` states of ``cat([mems[i], hids[i]])`` detached (called with ``mlen, qlen`` in the
order the source calls it, its issue #59: harmless at ``ext_len 0``); ``forward(data,
target, *mems)`` returning ``[loss (tgt_len x bsz), *new_mems]``; time-major ``[seq, batch]``
tensors throughout; the decoder weight tied to the embedding. ``weights_init`` (``init
normal``, std 0.02 for Linear/Embedding weights and ``r_w_bias``/``r_r_bias``, biases 0,
LayerNorm weights N(1, 0.02)). ``LMOrderedIterator`` (the stream cut into ``bsz`` columns,
fixed-length ``bptt`` chunks, ``target`` one step ahead). ``train.py``: ``Adam(lr)``,
``CosineAnnealingLR(optimizer, max_step, eta_min=0)`` stepped as ``scheduler.step(train_step)``
every step, ``model.zero_grad()``, ``loss.float().mean()``, ``backward``,
``clip_grad_norm_(model.parameters(), 0.25)``, ``step``; the mems carried from batch to batch
through the epochs; ``evaluate`` (``model.eval()``, ``reset_length(eval_tgt_len, ext_len,
mem_len + tgt_len - eval_tgt_len)``, mems carried, the loss weighted by ``seq_len``) every
``eval_interval`` steps, the best model (by validation loss) kept and evaluated on the test
stream at the end; the seed (``np.random.seed``, ``torch.manual_seed``); the log's ``bpc``
(``loss / log 2``, the enwik8/text8 convention for a character model).
Changed: the adaptive softmax replaced by the plain softmax the code takes with no cutoffs
(``-log_softmax(F.linear(hidden, emb.weight, bias)).gather(target)``); the mask made
``.bool()`` (the source's ``.byte()`` mask is refused by current ``masked_fill``).
Shrunk: a generated character stream (30-symbol alphabet: 24 "words" from a bigram grammar,
each paragraph opening with ``#`` and a 3-letter key and closing with ``=`` and the same key
40-70 characters later, so the key must be recalled through the memory) instead of enwik8;
``n_layer`` 2, ``n_head`` 2, ``d_head`` 16, ``d_model`` 32, ``d_inner`` 64 instead of
12/8/64/512/2048; ``tgt_len = mem_len = eval_tgt_len`` 24 instead of 512/512/128; batch 16
instead of 22; ``max_step`` 360 instead of 400,000, ``eval_interval`` 120; ``lr`` 2.5e-3
instead of 2.5e-4 (360 steps, not 400,000); dropout 0.1 as the enwik8 base script; no
multi-GPU, fp16, ``batch_chunk``, sampled softmax, checkpoint files or log files.
Measure only (not in the program): ``stream_bpc``, the test stream scored one character
at a time (``reset_length(1, 0, mem_len + tgt_len - 1)``: the memory holds the same
context, and one query can see no later position whatever the mask says), which is how
the model is used to generate; and the program's own ``test_bpc``.

nndx, as the author would add it: the model returns its loss, so a batch is ``((data,
target), target)`` and ``loss_fn`` is ``lambda ret, target: ret[0].float().mean()`` (the
memory starts empty for the probe); a preflight ``nndx.probe`` on the first training
chunk with the optimizer; ``nndx.Monitor(model, optimizer)`` around the loop, every
step's loss logged and every validation loss logged as ``split="val"``; after training
``nndx.probe(..., monitor=mon)`` on the first chunk.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "transformer_xl"
SOURCE = Source("kimiyoung/transformer-xl", "pytorch/train.py", "44781ed21dbaec88b280f74d9ae2877f52b492a5",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 2 layers, d_model 32, 360 steps)"),
        Variant(
            "causal_mask_off_by_one",
            "dec_attn_mask = triu(ones(qlen, klen), diagonal=2+mlen) instead of 1+mlen: every position "
            "attends to the next position of the segment, the very character it must predict",
            (C.DATA_LEAKAGE,),
            ("https://github.com/pytorch/examples/issues/649",
             "https://github.com/kzl/decision-transformer/issues/30",
             "https://github.com/lsdefine/attention-is-all-you-need-keras/issues/6",
             "https://github.com/xiaopengguo/ATKT/issues/1"),
            Measure("stream_bpc", "test bpc scored one character at a time (as generation uses the model) at "
                    "least 0.5 above the healthy run's, while the program's own validation bpc looks better",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "adam_lr_of_sgd",
            "--lr 0.25 with --optim adam (the SGD-sized rate; train.py's help reads '0.00025|5 for adam|sgd'): "
            "Adam's steps are 100x too large for the post-LayerNorm transformer",
            (C.LR_TOO_HIGH,),
            ("https://github.com/kimiyoung/transformer-xl/issues/92",
             "https://github.com/fastai/fastai/issues/1736",
             "https://github.com/tensorflow/tensor2tensor/issues/105"),
            Measure("test_bpc", "the program's test bpc at least 0.3 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

N_LAYER, N_HEAD, D_HEAD, D_MODEL, D_INNER = 2, 2, 16, 32, 64
DROPOUT, DROPATT, INIT_STD = 0.1, 0.0, 0.02
TGT_LEN, MEM_LEN, EXT_LEN, EVAL_TGT_LEN = 24, 24, 0, 24
BATCH_SIZE, EVAL_BATCH_SIZE, MAX_STEP, EVAL_INTERVAL = 16, 8, 360, 120
LR, CLIP = 2.5e-3, 0.25
N_TRAIN, N_VALID, N_TEST = 40000, 4000, 4000


# --------------------------------------------------------------------------- the corpus (the data)

ALPHABET = "abcdefghijklmnopqrstuvw #=."  # 27 symbols (the vocabulary: corpus.vocab)


def text(n_chars: int, seed: int) -> str:
    """Paragraphs ``#key word word ... .=key `` whose closing key repeats the opening one."""
    rng = np.random.default_rng(1000 + seed)
    grammar = np.random.default_rng(7)  # the language is fixed; only the sampling depends on the seed
    letters = list("abcdefghijklmnopqrstuvw")
    words = ["".join(grammar.choice(letters, size=grammar.integers(2, 5))) for _ in range(24)]
    successors = [grammar.choice(24, size=3, replace=False) for _ in range(24)]
    out: list[str] = []
    size = 0
    while size < n_chars:
        key = "".join(rng.choice(letters, size=3))
        body, w = [], int(rng.integers(24))
        length = int(rng.integers(40, 70))
        while sum(len(b) + 1 for b in body) < length:
            body.append(words[w])
            w = int(successors[w][rng.integers(3)])
        paragraph = f"#{key} {' '.join(body)}.={key} "
        out.append(paragraph)
        size += len(paragraph)
    return "".join(out)[:n_chars]


def encode(s: str) -> torch.Tensor:
    index = {c: i for i, c in enumerate(ALPHABET)}
    return torch.tensor([index[c] for c in s], dtype=torch.long)


class LMOrderedIterator:
    def __init__(self, data: torch.Tensor, bsz: int, bptt: int, ext_len: int = 0) -> None:
        self.bsz, self.bptt, self.ext_len = bsz, bptt, ext_len
        self.n_step = data.size(0) // bsz
        data = data.narrow(0, 0, self.n_step * bsz)
        self.data = data.view(bsz, -1).t().contiguous()  # [seq, batch]
        self.n_batch = (self.n_step + self.bptt - 1) // self.bptt

    def get_batch(self, i: int, bptt: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        bptt = self.bptt if bptt is None else bptt
        seq_len = min(bptt, self.data.size(0) - 1 - i)
        beg_idx = max(0, i - self.ext_len)
        return self.data[beg_idx : i + seq_len], self.data[i + 1 : i + 1 + seq_len], seq_len

    def __iter__(self):
        for i in range(0, self.data.size(0) - 1, self.bptt):
            yield self.get_batch(i)


# --------------------------------------------------------------------------- mem_transformer.py


class PositionalEmbedding(nn.Module):
    def __init__(self, demb: int) -> None:
        super().__init__()
        self.demb = demb
        self.register_buffer("inv_freq", 1 / (10000 ** (torch.arange(0.0, demb, 2.0) / demb)))

    def forward(self, pos_seq: torch.Tensor) -> torch.Tensor:
        sinusoid_inp = torch.outer(pos_seq, self.inv_freq)
        return torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)[:, None, :]


class PositionwiseFF(nn.Module):
    def __init__(self, d_model: int, d_inner: int, dropout: float) -> None:
        super().__init__()
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(d_inner, d_model), nn.Dropout(dropout),
        )  # fmt: skip
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(inp + self.CoreNet(inp))  # post-norm (pre_lnorm False)


class RelPartialLearnableMultiHeadAttn(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0) -> None:
        super().__init__()
        self.n_head, self.d_model, self.d_head = n_head, d_model, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.drop = nn.Dropout(dropout)
        self.dropatt = nn.Dropout(dropatt)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.scale = 1 / (d_head**0.5)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)

    @staticmethod
    def _rel_shift(x: torch.Tensor) -> torch.Tensor:
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1).view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    def forward(self, w, r, r_w_bias, r_r_bias, attn_mask=None, mems=None) -> torch.Tensor:
        qlen, rlen, bsz = w.size(0), r.size(0), w.size(1)
        cat = torch.cat([mems, w], 0) if mems is not None else w
        w_heads = self.qkv_net(cat)
        r_head_k = self.r_net(r)
        w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
        w_head_q = w_head_q[-qlen:]
        klen = w_head_k.size(0)
        w_head_q = w_head_q.view(qlen, bsz, self.n_head, self.d_head)
        w_head_k = w_head_k.view(klen, bsz, self.n_head, self.d_head)
        w_head_v = w_head_v.view(klen, bsz, self.n_head, self.d_head)
        r_head_k = r_head_k.view(rlen, self.n_head, self.d_head)

        AC = torch.einsum("ibnd,jbnd->ijbn", w_head_q + r_w_bias, w_head_k)  # noqa: N806
        BD = self._rel_shift(torch.einsum("ibnd,jnd->ijbn", w_head_q + r_r_bias, r_head_k))  # noqa: N806
        attn_score = (AC + BD) * self.scale
        if attn_mask is not None and attn_mask.any().item():
            attn_score = attn_score.float().masked_fill(attn_mask[:, :, :, None], -float("inf")).type_as(attn_score)
        attn_prob = self.dropatt(F.softmax(attn_score, dim=1))
        attn_vec = torch.einsum("ijbn,jbnd->ibnd", attn_prob, w_head_v)
        attn_vec = attn_vec.contiguous().view(attn_vec.size(0), attn_vec.size(1), self.n_head * self.d_head)
        attn_out = self.drop(self.o_net(attn_vec))
        return self.layer_norm(w + attn_out)


class RelPartialLearnableDecoderLayer(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float, dropatt: float) -> None:
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(n_head, d_model, d_head, dropout, dropatt)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout)

    def forward(self, dec_inp, r, r_w_bias, r_r_bias, dec_attn_mask=None, mems=None) -> torch.Tensor:
        return self.pos_ff(self.dec_attn(dec_inp, r, r_w_bias, r_r_bias, attn_mask=dec_attn_mask, mems=mems))


class AdaptiveEmbedding(nn.Module):
    """div_val 1, d_proj == d_embed: one embedding table, scaled by sqrt(d_proj)."""

    def __init__(self, n_token: int, d_embed: int) -> None:
        super().__init__()
        self.emb_scale = d_embed**0.5
        self.emb_layers = nn.ModuleList([nn.Embedding(n_token, d_embed)])

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.emb_layers[0](inp).mul_(self.emb_scale)


class LogSoftmaxCrit(nn.Module):
    """ProjectedAdaptiveLogSoftmax with no cutoffs: one output layer, plain softmax."""

    def __init__(self, n_token: int, d_embed: int) -> None:
        super().__init__()
        self.out_layers = nn.ModuleList([nn.Linear(d_embed, n_token)])

    def forward(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logit = F.linear(hidden, self.out_layers[0].weight, bias=self.out_layers[0].bias)
        return -F.log_softmax(logit, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)


class MemTransformerLM(nn.Module):
    def __init__(self, n_token: int, n_layer: int, n_head: int, d_model: int, d_head: int, d_inner: int,
                 dropout: float, dropatt: float, tgt_len: int, ext_len: int, mem_len: int,
                 mask_diagonal: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.n_token, self.d_model, self.n_head, self.d_head, self.n_layer = n_token, d_model, n_head, d_head, n_layer
        self.word_emb = AdaptiveEmbedding(n_token, d_model)
        self.drop = nn.Dropout(dropout)
        self.tgt_len, self.mem_len, self.ext_len = tgt_len, mem_len, ext_len
        self.layers = nn.ModuleList(
            RelPartialLearnableDecoderLayer(n_head, d_model, d_head, d_inner, dropout, dropatt) for _ in range(n_layer)
        )
        self.crit = LogSoftmaxCrit(n_token, d_model)
        self.crit.out_layers[0].weight = self.word_emb.emb_layers[0].weight  # tie_weight
        self.pos_emb = PositionalEmbedding(d_model)
        self.r_w_bias = nn.Parameter(torch.Tensor(n_head, d_head))
        self.r_r_bias = nn.Parameter(torch.Tensor(n_head, d_head))
        self.mask_diagonal = mask_diagonal  # 1: triu(..., diagonal=1+mlen), as published

    def reset_length(self, tgt_len: int, ext_len: int, mem_len: int) -> None:
        self.tgt_len, self.mem_len, self.ext_len = tgt_len, mem_len, ext_len

    def init_mems(self) -> list[torch.Tensor] | None:
        if self.mem_len > 0:
            param = next(self.parameters())
            return [torch.empty(0, dtype=param.dtype, device=param.device) for _ in range(self.n_layer + 1)]
        return None

    def _update_mems(self, hids, mems, qlen: int, mlen: int):
        if mems is None:
            return None
        assert len(hids) == len(mems), "len(hids) != len(mems)"
        with torch.no_grad():
            new_mems = []
            end_idx = mlen + max(0, qlen - 0 - self.ext_len)
            beg_idx = max(0, end_idx - self.mem_len)
            for i in range(len(hids)):
                cat = torch.cat([mems[i], hids[i]], dim=0)
                new_mems.append(cat[beg_idx:end_idx].detach())
        return new_mems

    def _forward(self, dec_inp: torch.Tensor, mems=None):
        qlen, _bsz = dec_inp.size()
        word_emb = self.word_emb(dec_inp)
        mlen = mems[0].size(0) if mems is not None else 0
        klen = mlen + qlen
        dec_attn_mask = torch.triu(word_emb.new_ones(qlen, klen), diagonal=self.mask_diagonal + mlen).bool()[:, :, None]
        hids = []
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=word_emb.device, dtype=word_emb.dtype)
        pos_emb = self.drop(self.pos_emb(pos_seq))
        core_out = self.drop(word_emb)
        hids.append(core_out)
        for i, layer in enumerate(self.layers):
            mems_i = None if mems is None else mems[i]
            core_out = layer(core_out, pos_emb, self.r_w_bias, self.r_r_bias, dec_attn_mask=dec_attn_mask, mems=mems_i)
            hids.append(core_out)
        core_out = self.drop(core_out)
        new_mems = self._update_mems(hids, mems, mlen, qlen)  # the argument order the source uses
        return core_out, new_mems

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems):
        if not mems:
            mems = self.init_mems()
        tgt_len = target.size(0)
        hidden, new_mems = self._forward(data, mems=mems)
        pred_hid = hidden[-tgt_len:]
        loss = self.crit(pred_hid.reshape(-1, pred_hid.size(-1)), target.reshape(-1)).view(tgt_len, -1)
        return [loss] if new_mems is None else [loss] + new_mems


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Linear") != -1:
        if getattr(m, "weight", None) is not None:
            nn.init.normal_(m.weight, 0.0, INIT_STD)
        if getattr(m, "bias", None) is not None:
            nn.init.constant_(m.bias, 0.0)
    elif classname.find("AdaptiveEmbedding") != -1:
        pass  # div_val 1, d_proj == d_embed: no emb_projs
    elif classname.find("Embedding") != -1:
        if hasattr(m, "weight"):  # PositionalEmbedding has none
            nn.init.normal_(m.weight, 0.0, INIT_STD)
    elif classname.find("LayerNorm") != -1:
        nn.init.normal_(m.weight, 1.0, INIT_STD)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0.0)
    elif classname.find("TransformerLM") != -1:
        nn.init.normal_(m.r_w_bias, 0.0, INIT_STD)
        nn.init.normal_(m.r_r_bias, 0.0, INIT_STD)


# --------------------------------------------------------------------------- train.py


def evaluate(model: MemTransformerLM, eval_iter: LMOrderedIterator, eval_tgt_len: int) -> float:
    model.eval()
    model.reset_length(eval_tgt_len, EXT_LEN, MEM_LEN + TGT_LEN - eval_tgt_len)
    total_len, total_loss = 0, 0.0
    with torch.no_grad():
        mems: tuple | list = tuple()
        for data, target, seq_len in eval_iter:
            ret = model(data, target, *mems)
            loss, mems = ret[0], ret[1:]
            total_loss += seq_len * loss.mean().float().item()
            total_len += seq_len
    model.reset_length(TGT_LEN, EXT_LEN, MEM_LEN)
    model.train()
    return total_loss / total_len


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(1111 + seed)
    torch.manual_seed(1111 + seed)
    corpus = encode(text(N_TRAIN + N_VALID + N_TEST, seed))
    train_data, valid_data, test_data = corpus[:N_TRAIN], corpus[N_TRAIN : N_TRAIN + N_VALID], corpus[-N_TEST:]
    ntokens = len(ALPHABET)
    tr_iter = LMOrderedIterator(train_data, BATCH_SIZE, TGT_LEN, ext_len=EXT_LEN)
    va_iter = LMOrderedIterator(valid_data, EVAL_BATCH_SIZE, EVAL_TGT_LEN, ext_len=EXT_LEN)
    te_iter = LMOrderedIterator(test_data, EVAL_BATCH_SIZE, EVAL_TGT_LEN, ext_len=EXT_LEN)

    model = MemTransformerLM(ntokens, N_LAYER, N_HEAD, D_MODEL, D_HEAD, D_INNER, DROPOUT, DROPATT,
                             tgt_len=TGT_LEN, ext_len=EXT_LEN, mem_len=MEM_LEN,
                             mask_diagonal=2 if variant == "causal_mask_off_by_one" else 1)  # fmt: skip
    model.apply(weights_init)
    model.word_emb.apply(weights_init)
    lr = 0.25 if variant == "adam_lr_of_sgd" else LR
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, MAX_STEP, eta_min=0.0)

    def loss_fn(ret, _target) -> torch.Tensor:
        return ret[0].float().mean()

    data0, target0, _ = next(iter(tr_iter))
    probe_batch = ((data0, target0), target0)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    train_step, best_val_loss, best_model = 0, None, None
    train_losses: list[float] = []
    val_losses: list[float] = []
    model.train()
    done = False
    while not done:  # for epoch in itertools.count(start=1): train()
        mems: tuple | list = tuple()
        for data, target, _seq_len in tr_iter:
            model.zero_grad()
            ret = model(data, target, *mems)
            loss, mems = ret[0], ret[1:]
            loss = loss.float().mean().type_as(loss)
            loss.backward()
            train_losses.append(loss.float().item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            train_step += 1
            scheduler.step(train_step)
            if train_step % EVAL_INTERVAL == 0:
                val_loss = evaluate(model, va_iter, EVAL_TGT_LEN)
                val_losses.append(val_loss)
                nx.timed(lambda: mon.log(val_loss, split="val"))
                if best_val_loss is None or val_loss < best_val_loss:
                    best_model = copy.deepcopy(model)  # torch.save(model, f)
                    best_val_loss = val_loss
            if train_step == MAX_STEP:
                done = True
                break

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    model = best_model if best_model is not None else model  # load the best saved model
    test_loss = evaluate(model, te_iter, EVAL_TGT_LEN)
    stream_loss = evaluate(model, LMOrderedIterator(test_data, EVAL_BATCH_SIZE, 1, ext_len=EXT_LEN), 1)
    late = train_losses[-40:]
    return {
        "test_bpc": test_loss / math.log(2),
        "stream_bpc": stream_loss / math.log(2),
        "best_val_bpc": (best_val_loss if best_val_loss is not None else float("nan")) / math.log(2),
        "late_train_loss": float(sum(late) / len(late)),
    }
