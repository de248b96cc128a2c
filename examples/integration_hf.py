"""A frozen encoder, caught in a Hugging Face ``Trainer`` run by ``NndxCallback``.

A tiny BERT classifier, built from a config (no download, ``HF_HUB_OFFLINE=1``), is
fine-tuned twice on CPU on synthetic token sequences whose label is whether the first
token is in the upper half of the vocabulary:

- ``healthy``: every parameter trains;
- ``frozen-encoder``: a leftover ``model.bert.requires_grad_(False)`` (from a linear-
  probe experiment) freezes the whole encoder. Training runs, the loss moves a little —
  only the classifier head learns — and nothing crashes.

``NndxCallback(preflight=True)`` runs the probes on the first training samples
(collated by the Trainer's collator, on copies), watches the model and the optimizer
the Trainer built, takes the losses from the Trainer's logs, and saves
``nndx-report.json`` and ``nndx-diagnosis.json`` into ``args.output_dir``. The script
prints each run's findings and exits 1 if the frozen run is not diagnosed
FROZEN_PARAMETERS or the healthy one raises a warning.

Run: ``.venv/bin/python examples/integration_hf.py`` (needs ``pip install 'nndx[hf]'``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub

import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from nndx.integrations.hf import NndxCallback  # noqa: E402
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport  # noqa: E402

VOCAB, LENGTH, SAMPLES = 64, 8, 256


class TokenTask(torch.utils.data.Dataset):
    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (SAMPLES, LENGTH), generator=generator)
        self.labels = (self.ids[:, 0] >= VOCAB // 2).long()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": self.labels[i]}


def tiny_bert(frozen_encoder: bool) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        vocab_size=VOCAB, max_position_embeddings=LENGTH, num_labels=2)  # fmt: skip
    model = BertForSequenceClassification(config)
    if frozen_encoder:
        model.bert.requires_grad_(False)
    return model


def run(frozen_encoder: bool, output_dir: Path) -> tuple[DiagnosticReport, Diagnosis]:
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=40, per_device_train_batch_size=16, learning_rate=3e-3,
        logging_steps=2, eval_strategy="steps", eval_steps=20, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    probe_options = {"overfit_one_batch": {"steps": 60}, "lr_range": {"steps": 30}}
    callback = NndxCallback(every=5, preflight=True, preflight_options=probe_options)
    trainer = Trainer(model=tiny_bert(frozen_encoder), args=args, train_dataset=TokenTask(0),
                      eval_dataset=TokenTask(1), callbacks=[callback])  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the findings below are the output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    report = DiagnosticReport.model_validate_json((output_dir / "nndx-report.json").read_text())
    diagnosis = Diagnosis.model_validate_json((output_dir / "nndx-diagnosis.json").read_text())
    return report, diagnosis


def main() -> int:
    hf_logging.set_verbosity_error()
    root = Path(tempfile.mkdtemp(prefix="nndx-hf-"))
    failures = 0
    for name, frozen in (("healthy", False), ("frozen-encoder", True)):
        report, diagnosis = run(frozen, root / name)
        alarms = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]]
        codes = [f.code.value for f in alarms]
        ok = "FROZEN_PARAMETERS" in codes if frozen else not alarms
        failures += not ok
        train, val = report.loss_history["train"], report.loss_history.get("val", [])
        overfit = report.probes.overfit_one_batch if report.probes else None
        print(f"{name:15s} train loss {train[0].value:.3f} -> {train[-1].value:.3f}, "
              f"val loss {val[-1].value if val else float('nan'):.3f}; "
              f"overfit-one-batch {overfit.status if overfit else 'not run'}; "
              f"findings: {', '.join(codes) or 'none'} {'ok' if ok else 'UNEXPECTED'}")  # fmt: skip
        for finding in alarms:
            if finding.code.value == "FROZEN_PARAMETERS":
                print(f"    {finding.severity}: {finding.title} — fix: {finding.fix}")
    print(f"\nreports and diagnoses in {root}/<run>/nndx-*.json")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
