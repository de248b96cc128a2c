"""Port of coetaur0's ESIM (Enhanced LSTM for Natural Language Inference, Chen et al. 2017):
BiLSTM input encoding, masked soft alignment between premise and hypothesis, enhancement,
projection, BiLSTM composition, masked average and max pooling, an MLP classifier.

Source: github.com/coetaur0/ESIM, ``esim/model.py``, ``esim/layers.py``, ``esim/utils.py``,
``scripts/training/train_snli.py``, ``scripts/training/utils.py`` and
``config/training/snli_training.json`` at commit 65611601ff9f17f76e1f246e8e46b5fc4bee13fc
(the repository's HEAD; Apache-2.0, Aurelien Coet 2018). Written anew from the facts of
those files; no code copied.

Kept: the word dictionary's special indices (``_PAD_`` 0, ``_OOV_`` 1, ``_BOS_`` 2,
``_EOS_`` 3; every sentence wrapped in BOS/EOS as the SNLI preprocessing config asks);
``NLIDataset`` (every sequence padded with 0 to the longest of the whole split; items
``premise``, ``premise_length``, ``hypothesis``, ``hypothesis_length``, ``label``);
``ESIM``: ``nn.Embedding(padding_idx=0)``, ``RNNDropout`` (one dropout mask per sequence
over the feature dimension), ``Seq2SeqEncoder`` (sort by length, ``pack_padded_sequence``,
a bidirectional ``nn.LSTM(batch_first=True)``, ``pad_packed_sequence``, the outputs put
back in the batch's order with the restoration index), ``SoftmaxAttention`` (the
premise-hypothesis dot products, ``masked_softmax`` both ways with the 1e-13 renormalisation,
``weighted_sum`` masked), the enhancement ``[a; a~; a - a~; a * a~]``, the projection
``Linear(8h, h) + ReLU``, dropout, the composition BiLSTM, the masked average and the
``replace_masked(-1e7)`` max pooling, the classifier ``Dropout, Linear(8h, h), Tanh,
Dropout, Linear(h, 3)``, ``forward`` returning ``(logits, probabilities)``;
``_init_esim_weights`` (xavier-uniform Linear weights and zero biases; LSTM xavier-uniform
input weights, orthogonal recurrent weights, zero biases with the forget gate's
``bias_hh`` at 1, both directions); ``get_mask`` from the padding tokens up to the batch's
longest length; ``train_snli.main``: ``CrossEntropyLoss``, ``Adam(lr=4e-4)``,
``ReduceLROnPlateau(mode="max", factor=0.5, patience=0)`` stepped on the validation
accuracy after each epoch, a validation before training, early stopping on a patience
of 5 (never reached here); ``utils.train`` (``model.train()``, per batch ``zero_grad``,
forward, loss, backward, ``clip_grad_norm_(max_gradient_norm=10)``, step, the running
loss and the correct-prediction count) and ``utils.validate`` (``model.eval()``,
``torch.no_grad()``, loss and accuracy over the split); ``batch_size`` 32.
Shrunk: a generated NLI task instead of SNLI (see ``make_split``: 12 content words in 6
antonym pairs and a "not" token; a premise of 3-5 words from distinct pairs; an entailed
hypothesis is 2-3 premise words, shuffled; a contradiction 1-2 premise words then "not"
and the antonym of another premise word; a neutral one 1-2 premise words and a word
unrelated to the premise, shuffled: "not" alone gives contradictions away, entailment
against neutral needs the premise), 3,000 training, 400 validation and 400 test pairs;
random embeddings instead of GloVe (``embeddings=None``, trained); ``hidden_size`` and
``embedding_dim`` 32 instead of 300; ``dropout`` 0.3 instead of 0.5 (at 0.5 on 32
dimensions the model never gets past the "not" cue in this budget); 6 epochs instead of
64; ``lr`` 2e-3 instead of 4e-4 (far fewer steps); no checkpoint files, no plots, no
progress bars.
Measure only (not in the program): the test accuracy of the last model (the program's
``validate``, in eval mode, on a held-out test split); the last validation accuracy the
program printed is returned too. Seed 0 (without nndx): healthy test 0.86 / valid 0.87;
order_not_restored test 0.52; validate_without_eval valid 0.81 (test 0.83).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
as ``((premises, premises_lengths, hypotheses, hypotheses_lengths), labels)`` with the
criterion on the model's logits (``loss_fn(output, labels) = criterion(output[0],
labels)``) and the optimizer; ``nndx.Monitor(model, optimizer, loss_fn=...)`` around the
epochs, the loss called as ``mon.loss_fn``, each batch's loss logged with the batch
accuracy and each validation logged as ``split="val"`` with its accuracy; then
``nndx.probe(..., monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "esim"
SOURCE = Source("coetaur0/ESIM", "scripts/training/train_snli.py", "65611601ff9f17f76e1f246e8e46b5fc4bee13fc",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: hidden 32, 6 epochs, generated NLI pairs)"),
        Variant(
            "order_not_restored",
            "Seq2SeqEncoder returns the encoder outputs in the length-sorted order (the restoration index not "
            "applied): premises and hypotheses are sorted separately, so each premise is aligned with another "
            "pair's hypothesis, mask and label",
            (C.LABELS_MISALIGNED, C.WRONG_RESHAPE),
            ("https://github.com/pytorch/pytorch/issues/4927",
             "https://github.com/pytorch/pytorch/issues/2615",
             "https://github.com/ruotianluo/self-critical.pytorch/issues/125"),
            Measure("test_accuracy", "test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "validate_without_eval",
            "model.eval() left out of validate(): dropout (p=0.3, RNNDropout and the classifier's) stays on while "
            "the validation accuracy is measured, and ReduceLROnPlateau is stepped on that noisy number",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/wolny/pytorch-3dunet/issues/53",
             "https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/nshaud/DeepHyperX/issues/51"),
            Measure("valid_accuracy", "the last validation accuracy the program prints at least 0.03 below the "
                    "healthy run's", lambda healthy, buggy: not buggy > healthy - 0.03),
        ),
    )
}

HIDDEN, EMBED, DROPOUT, EPOCHS, BATCH, LR, PATIENCE, MAX_GRAD_NORM = 32, 32, 0.3, 6, 32, 2e-3, 5, 10.0
N_TRAIN, N_VALID, N_TEST, PAIRS, PREMISE = 3000, 400, 400, 6, (3, 5)
PAD, OOV, BOS, EOS, NOT, FIRST_WORD = 0, 1, 2, 3, 4, 5
LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}


# --------------------------------------------------------------------------- the data (SNLI stand-in)


def make_split(n: int, rng: np.random.Generator) -> dict[str, list]:
    """Premise/hypothesis word-index lists with BOS/EOS, and labels; word w's antonym is
    w + PAIRS (mod 2 * PAIRS)."""
    words = 2 * PAIRS
    antonym = lambda w: (w + PAIRS) % words  # noqa: E731
    out: dict[str, list] = {"premises": [], "hypotheses": [], "labels": []}
    for _ in range(n):
        pairs = rng.choice(PAIRS, size=rng.integers(PREMISE[0], PREMISE[1] + 1), replace=False)
        premise = [int(p + PAIRS * rng.integers(0, 2)) for p in pairs]
        label = int(rng.integers(0, 3))
        if label == LABELS["entailment"]:
            hyp = list(rng.choice(premise, size=rng.integers(2, 4), replace=False))
        else:
            keep = list(rng.choice(premise, size=rng.integers(1, 3), replace=False))
            if label == LABELS["contradiction"]:
                other = [w for w in premise if w not in keep]
                extra = [-1, antonym(int(rng.choice(other)))]  # -1: "not"
            else:
                unrelated = [w for w in range(words) if w not in premise and antonym(w) not in premise]
                extra = [int(rng.choice(unrelated))]
            hyp = keep + extra
        hyp = [int(w) for w in rng.permutation(hyp)] if label != LABELS["contradiction"] else [int(w) for w in hyp]
        out["premises"].append([BOS] + [w + FIRST_WORD for w in premise] + [EOS])
        out["hypotheses"].append([BOS] + [NOT if w == -1 else w + FIRST_WORD for w in hyp] + [EOS])
        out["labels"].append(label)
    return out


class NLIDataset(Dataset):
    def __init__(self, data: dict[str, list], padding_idx: int = 0) -> None:
        self.premises_lengths = [len(s) for s in data["premises"]]
        self.hypotheses_lengths = [len(s) for s in data["hypotheses"]]
        self.max_premise_length = max(self.premises_lengths)
        self.max_hypothesis_length = max(self.hypotheses_lengths)
        self.num_sequences = len(data["premises"])
        self.data = {
            "premises": torch.ones((self.num_sequences, self.max_premise_length), dtype=torch.long) * padding_idx,
            "hypotheses": torch.ones((self.num_sequences, self.max_hypothesis_length), dtype=torch.long) * padding_idx,
            "labels": torch.tensor(data["labels"], dtype=torch.long),
        }
        for i, (premise, hypothesis) in enumerate(zip(data["premises"], data["hypotheses"])):
            self.data["premises"][i][: len(premise)] = torch.tensor(premise)
            self.data["hypotheses"][i][: len(hypothesis)] = torch.tensor(hypothesis)

    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"premise": self.data["premises"][index], "premise_length": self.premises_lengths[index],
                "hypothesis": self.data["hypotheses"][index], "hypothesis_length": self.hypotheses_lengths[index],
                "label": self.data["labels"][index]}  # fmt: skip


# --------------------------------------------------------------------------- esim/utils.py


def sort_by_seq_lens(batch, sequences_lengths, descending=True):
    sorted_seq_lens, sorting_index = sequences_lengths.sort(0, descending=descending)
    sorted_batch = batch.index_select(0, sorting_index)
    idx_range = torch.arange(0, len(sequences_lengths), dtype=sequences_lengths.dtype)
    _, reverse_mapping = sorting_index.sort(0, descending=False)
    restoration_index = idx_range.index_select(0, reverse_mapping)
    return sorted_batch, sorted_seq_lens, sorting_index, restoration_index


def get_mask(sequences_batch, sequences_lengths):
    batch_size = sequences_batch.size()[0]
    max_length = torch.max(sequences_lengths)
    mask = torch.ones(batch_size, max_length, dtype=torch.float)
    mask[sequences_batch[:, :max_length] == 0] = 0.0
    return mask


def masked_softmax(tensor, mask):
    tensor_shape = tensor.size()
    reshaped_tensor = tensor.view(-1, tensor_shape[-1])
    while mask.dim() < tensor.dim():
        mask = mask.unsqueeze(1)
    mask = mask.expand_as(tensor).contiguous().float()
    reshaped_mask = mask.view(-1, mask.size()[-1])
    result = nn.functional.softmax(reshaped_tensor * reshaped_mask, dim=-1)
    result = result * reshaped_mask
    result = result / (result.sum(dim=-1, keepdim=True) + 1e-13)
    return result.view(*tensor_shape)


def weighted_sum(tensor, weights, mask):
    weighted = weights.bmm(tensor)
    while mask.dim() < weighted.dim():
        mask = mask.unsqueeze(1)
    mask = mask.transpose(-1, -2)
    mask = mask.expand_as(weighted).contiguous().float()
    return weighted * mask


def replace_masked(tensor, mask, value):
    mask = mask.unsqueeze(1).transpose(2, 1)
    reverse_mask = 1.0 - mask
    return tensor * mask + value * reverse_mask


def correct_predictions(output_probabilities, targets):
    _, out_classes = output_probabilities.max(dim=1)
    return (out_classes == targets).sum().item()


# --------------------------------------------------------------------------- esim/layers.py


class RNNDropout(nn.Dropout):
    def forward(self, sequences_batch):
        ones = sequences_batch.data.new_ones(sequences_batch.shape[0], sequences_batch.shape[-1])
        dropout_mask = nn.functional.dropout(ones, self.p, self.training, inplace=False)
        return dropout_mask.unsqueeze(1) * sequences_batch


class Seq2SeqEncoder(nn.Module):
    def __init__(self, rnn_type, input_size, hidden_size, num_layers=1, bias=True, dropout=0.0,
                 bidirectional=False, restore_order=True) -> None:  # fmt: skip
        assert issubclass(rnn_type, nn.RNNBase), "rnn_type must be a class inheriting from torch.nn.RNNBase"
        super().__init__()
        self._encoder = rnn_type(input_size, hidden_size, num_layers=num_layers, bias=bias, batch_first=True,
                                 dropout=dropout, bidirectional=bidirectional)  # fmt: skip
        self.restore_order = restore_order

    def forward(self, sequences_batch, sequences_lengths):
        sorted_batch, sorted_lengths, _, restoration_idx = sort_by_seq_lens(sequences_batch, sequences_lengths)
        packed_batch = nn.utils.rnn.pack_padded_sequence(sorted_batch, sorted_lengths, batch_first=True)
        outputs, _ = self._encoder(packed_batch, None)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True)
        if not self.restore_order:
            return outputs  # the bug: left in the length-sorted order
        return outputs.index_select(0, restoration_idx)


class SoftmaxAttention(nn.Module):
    def forward(self, premise_batch, premise_mask, hypothesis_batch, hypothesis_mask):
        similarity_matrix = premise_batch.bmm(hypothesis_batch.transpose(2, 1).contiguous())
        prem_hyp_attn = masked_softmax(similarity_matrix, hypothesis_mask)
        hyp_prem_attn = masked_softmax(similarity_matrix.transpose(1, 2).contiguous(), premise_mask)
        attended_premises = weighted_sum(hypothesis_batch, prem_hyp_attn, premise_mask)
        attended_hypotheses = weighted_sum(premise_batch, hyp_prem_attn, hypothesis_mask)
        return attended_premises, attended_hypotheses


# --------------------------------------------------------------------------- esim/model.py


class ESIM(nn.Module):
    def __init__(self, vocab_size, embedding_dim, hidden_size, embeddings=None, padding_idx=0, dropout=0.5,
                 num_classes=3, device="cpu", restore_order=True) -> None:  # fmt: skip
        super().__init__()
        self.vocab_size, self.embedding_dim, self.hidden_size = vocab_size, embedding_dim, hidden_size
        self.num_classes, self.dropout, self.device = num_classes, dropout, device
        self._word_embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx, _weight=embeddings)
        if self.dropout:
            self._rnn_dropout = RNNDropout(p=self.dropout)
        self._encoding = Seq2SeqEncoder(nn.LSTM, embedding_dim, hidden_size, bidirectional=True,
                                        restore_order=restore_order)  # fmt: skip
        self._attention = SoftmaxAttention()
        self._projection = nn.Sequential(nn.Linear(4 * 2 * hidden_size, hidden_size), nn.ReLU())
        self._composition = Seq2SeqEncoder(nn.LSTM, hidden_size, hidden_size, bidirectional=True,
                                           restore_order=restore_order)  # fmt: skip
        self._classification = nn.Sequential(nn.Dropout(p=self.dropout), nn.Linear(2 * 4 * hidden_size, hidden_size),
                                             nn.Tanh(), nn.Dropout(p=self.dropout),
                                             nn.Linear(hidden_size, num_classes))  # fmt: skip
        self.apply(_init_esim_weights)

    def forward(self, premises, premises_lengths, hypotheses, hypotheses_lengths):
        premises_mask = get_mask(premises, premises_lengths).to(self.device)
        hypotheses_mask = get_mask(hypotheses, hypotheses_lengths).to(self.device)
        embedded_premises = self._word_embedding(premises)
        embedded_hypotheses = self._word_embedding(hypotheses)
        if self.dropout:
            embedded_premises = self._rnn_dropout(embedded_premises)
            embedded_hypotheses = self._rnn_dropout(embedded_hypotheses)
        encoded_premises = self._encoding(embedded_premises, premises_lengths)
        encoded_hypotheses = self._encoding(embedded_hypotheses, hypotheses_lengths)
        attended_premises, attended_hypotheses = self._attention(encoded_premises, premises_mask,
                                                                 encoded_hypotheses, hypotheses_mask)  # fmt: skip
        enhanced_premises = torch.cat([encoded_premises, attended_premises, encoded_premises - attended_premises,
                                       encoded_premises * attended_premises], dim=-1)  # fmt: skip
        enhanced_hypotheses = torch.cat([encoded_hypotheses, attended_hypotheses,
                                         encoded_hypotheses - attended_hypotheses,
                                         encoded_hypotheses * attended_hypotheses], dim=-1)  # fmt: skip
        projected_premises = self._projection(enhanced_premises)
        projected_hypotheses = self._projection(enhanced_hypotheses)
        if self.dropout:
            projected_premises = self._rnn_dropout(projected_premises)
            projected_hypotheses = self._rnn_dropout(projected_hypotheses)
        v_ai = self._composition(projected_premises, premises_lengths)
        v_bj = self._composition(projected_hypotheses, hypotheses_lengths)
        v_a_avg = torch.sum(v_ai * premises_mask.unsqueeze(1).transpose(2, 1), dim=1) \
            / torch.sum(premises_mask, dim=1, keepdim=True)  # fmt: skip
        v_b_avg = torch.sum(v_bj * hypotheses_mask.unsqueeze(1).transpose(2, 1), dim=1) \
            / torch.sum(hypotheses_mask, dim=1, keepdim=True)  # fmt: skip
        v_a_max, _ = replace_masked(v_ai, premises_mask, -1e7).max(dim=1)
        v_b_max, _ = replace_masked(v_bj, hypotheses_mask, -1e7).max(dim=1)
        v = torch.cat([v_a_avg, v_a_max, v_b_avg, v_b_max], dim=1)
        logits = self._classification(v)
        probabilities = nn.functional.softmax(logits, dim=-1)
        return logits, probabilities


def _init_esim_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight.data)
        nn.init.constant_(module.bias.data, 0.0)
    elif isinstance(module, nn.LSTM):
        nn.init.xavier_uniform_(module.weight_ih_l0.data)
        nn.init.orthogonal_(module.weight_hh_l0.data)
        nn.init.constant_(module.bias_ih_l0.data, 0.0)
        nn.init.constant_(module.bias_hh_l0.data, 0.0)
        hidden_size = module.bias_hh_l0.data.shape[0] // 4
        module.bias_hh_l0.data[hidden_size : (2 * hidden_size)] = 1.0
        if module.bidirectional:
            nn.init.xavier_uniform_(module.weight_ih_l0_reverse.data)
            nn.init.orthogonal_(module.weight_hh_l0_reverse.data)
            nn.init.constant_(module.bias_ih_l0_reverse.data, 0.0)
            nn.init.constant_(module.bias_hh_l0_reverse.data, 0.0)
            module.bias_hh_l0_reverse.data[hidden_size : (2 * hidden_size)] = 1.0


# --------------------------------------------------------------------------- scripts/training


def _inputs(batch):
    return batch["premise"], batch["premise_length"], batch["hypothesis"], batch["hypothesis_length"]


def train_epoch(model, dataloader, optimizer, criterion, max_gradient_norm, nx: Nndx, mon) -> tuple[float, float]:
    model.train()
    running_loss, correct_preds = 0.0, 0
    for batch in dataloader:
        labels = batch["label"]
        optimizer.zero_grad()
        logits, probs = model(*_inputs(batch))
        loss = mon.loss_fn((logits, probs), labels)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_gradient_norm)
        optimizer.step()
        running_loss += loss.item()
        correct = correct_predictions(probs, labels)
        correct_preds += correct
        nx.timed(lambda: mon.log(loss, accuracy=correct / len(labels)))  # noqa: B023
    return running_loss / len(dataloader), correct_preds / len(dataloader.dataset)


def validate(model, dataloader, criterion, eval_mode: bool = True) -> tuple[float, float]:
    if eval_mode:
        model.eval()
    running_loss, running_accuracy = 0.0, 0.0
    with torch.no_grad():
        for batch in dataloader:
            logits, probs = model(*_inputs(batch))
            running_loss += criterion(logits, batch["label"]).item()
            running_accuracy += correct_predictions(probs, batch["label"])
    return running_loss / len(dataloader), running_accuracy / len(dataloader.dataset)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_data = NLIDataset(make_split(N_TRAIN, rng))
    valid_data = NLIDataset(make_split(N_VALID, rng))
    test_data = NLIDataset(make_split(N_TEST, rng))
    train_loader = DataLoader(train_data, shuffle=True, batch_size=BATCH,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    valid_loader = DataLoader(valid_data, shuffle=False, batch_size=BATCH)
    test_loader = DataLoader(test_data, shuffle=False, batch_size=BATCH)

    model = ESIM(FIRST_WORD + 2 * PAIRS, EMBED, HIDDEN, dropout=DROPOUT, num_classes=3,
                 restore_order=variant != "order_not_restored")  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
    eval_mode = variant != "validate_without_eval"

    def loss_fn(output, labels):
        return criterion(output[0], labels)

    first = next(iter(DataLoader(train_data, shuffle=False, batch_size=BATCH)))
    probe_batch = (_inputs(first), first["label"])
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=loss_fn)

    best_score, patience_counter = 0.0, 0
    _, valid_accuracy = validate(model, valid_loader, criterion, eval_mode)
    train_loss = 0.0
    for _epoch in range(1, EPOCHS + 1):
        train_loss, _train_acc = train_epoch(model, train_loader, optimizer, criterion, MAX_GRAD_NORM, nx, mon)
        valid_loss, valid_accuracy = validate(model, valid_loader, criterion, eval_mode)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_accuracy))  # noqa: B023
        scheduler.step(valid_accuracy)
        if valid_accuracy < best_score:
            patience_counter += 1
        else:
            best_score, patience_counter = valid_accuracy, 0
        if patience_counter >= PATIENCE:
            break

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    _, test_accuracy = validate(model, test_loader, criterion)  # measure only, in eval mode
    return {"test_accuracy": test_accuracy, "valid_accuracy": valid_accuracy, "train_loss": train_loss,
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
