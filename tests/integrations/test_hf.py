"""NndxCallback with real, tiny Hugging Face Trainer runs on CPU: a BERT built from a
config in the test (no hub download), random token data."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402

from nndx.integrations.hf import NndxCallback, first_batch  # noqa: E402
from nndx.report import Diagnosis, DiagnosticReport  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLES, BATCH, STEPS, VOCAB, LENGTH = 32, 8, 6, 50, 8


class TokenData(torch.utils.data.Dataset):
    """Random token sequences; the label is whether token 0 is in the vocabulary's upper half."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (SAMPLES, LENGTH), generator=generator)
        self.labels = (self.ids[:, 0] >= VOCAB // 2).long()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": self.labels[i]}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        vocab_size=VOCAB, max_position_embeddings=LENGTH, num_labels=2)  # fmt: skip
    return BertForSequenceClassification(config)


def train(model, callback, output_dir, **overrides) -> Trainer:
    options = dict(
        output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=BATCH, per_device_eval_batch_size=16,
        learning_rate=1e-3, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    options.update(overrides)
    trainer = Trainer(model=model, args=TrainingArguments(**options), train_dataset=TokenData(),
                      eval_dataset=TokenData(), callbacks=[callback])  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


def saved(directory) -> tuple[DiagnosticReport, Diagnosis]:
    report = DiagnosticReport.model_validate_json((directory / "nndx-report.json").read_text())
    diagnosis = Diagnosis.model_validate_json((directory / "nndx-diagnosis.json").read_text())
    return report, diagnosis


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """One watched run of the tiny BERT, shared by the tests that only read it."""
    output_dir = tmp_path_factory.mktemp("hf-healthy")
    callback = NndxCallback(every=2)
    trainer = train(tiny_bert(), callback, output_dir)
    return trainer, callback, *saved(output_dir)


def test_callback_records_a_trainer_run_and_saves_into_output_dir(healthy_run):
    trainer, callback, report, diagnosis = healthy_run

    assert report.loop.steps == STEPS and report.loop.backward_calls == STEPS
    assert report.loop.zero_grad_calls >= STEPS
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert [p.value for p in report.loss_history["train"]] == pytest.approx(logged)
    assert [p.step for p in report.loss_history["train"]] == list(range(STEPS))
    evaluated = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    assert [p.value for p in report.loss_history["val"]] == pytest.approx(evaluated) and len(evaluated) == 2
    assert {layer.step for layer in report.layers} == {0, 2, 4}
    # the Monitor hooks the torch optimizer inside accelerate's wrapper, so it sees the norm of
    # every recorded step
    assert [p.step for p in report.loop.grad_norm_history] == [0, 2, 4]
    assert report.model.param_count == sum(p.numel() for p in trainer.model.parameters())
    assert report.run.name == "BertForSequenceClassification"
    assert report.errors == []
    assert callback.report == report
    assert diagnosis.rules_run > 0


def test_a_healthy_bert_run_raises_no_alarm(healthy_run):
    # BERT's parallel query/key/value Linears and its own GELU class once read as MISSING_ACTIVATION
    _, _, _, diagnosis = healthy_run
    assert [f.code.value for f in diagnosis.findings if f.severity != "info"] == []


def test_preflight_runs_on_the_first_samples_and_leaves_training_unchanged(tmp_path):
    short = {"max_steps": 3, "eval_strategy": "no"}
    plain = train(tiny_bert(), NndxCallback(), tmp_path / "plain", **short)
    callback = NndxCallback(preflight=True, preflight_options={"overfit_one_batch": {"steps": 30}, "lr_range": {"steps": 10}})
    probed = train(tiny_bert(), callback, tmp_path / "probed", **short)
    report, _ = saved(tmp_path / "probed")

    assert [e.get("loss") for e in probed.state.log_history] == [e.get("loss") for e in plain.state.log_history]
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), probed.model.state_dict().items()):
        assert torch.equal(a, b), name
    probes = report.probes
    assert probes.overfit_one_batch.status in ("passed", "failed") and probes.overfit_one_batch.steps > 0
    assert probes.overfit_one_batch.losses[-1] < probes.overfit_one_batch.losses[0]
    assert len(probes.lr_range.lrs) > 0
    assert probes.grad_check.status == "passed", probes.grad_check.message
    assert report.task == "classification"
    assert report.loop.steps == 3
    assert report.errors == []


def test_preflight_with_a_users_loss_fn(tmp_path):
    def loss_from_logits(output, labels):
        return nn.functional.cross_entropy(output.logits, labels)

    callback = NndxCallback(preflight=True, loss_fn=loss_from_logits, preflight_probes=["grad_check"])
    train(tiny_bert(), callback, tmp_path, max_steps=2, eval_strategy="no")
    report, _ = saved(tmp_path)

    assert report.probes.grad_check.status == "passed", report.probes.grad_check.message
    assert report.probes.overfit_one_batch is None  # only what was asked for ran
    assert report.loop.steps == 2


class AugmentedTokenData(TokenData):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(i)
        torch.rand(1)  # random augmentation draws from the global RNG
        return sample


def test_first_batch_reads_samples_without_iterating_the_loader():
    class CountingLoader:
        dataset = AugmentedTokenData()
        collate_fn = staticmethod(lambda samples: {k: torch.stack([s[k] for s in samples]) for k in samples[0]})

        def __iter__(self):
            raise AssertionError("iterating the loader would draw from the user's RNG")

    model = nn.Linear(1, 1)
    state = torch.get_rng_state()
    batch = first_batch(CountingLoader(), 4, model)
    assert torch.equal(torch.get_rng_state(), state)
    assert batch["input_ids"].shape == (4, LENGTH) and torch.equal(batch["labels"], TokenData().labels[:4])
    with pytest.raises(ValueError, match="train_dataloader"):
        first_batch(None, 4, model)


def test_stop_on_error_stops_the_trainer_gracefully_and_saves_the_report(tmp_path):
    callback = NndxCallback(stop_on="error", alert_every=1)
    # no clipping and an absurd learning rate: the weights overflow, gradients turn non-finite
    trainer = train(tiny_bert(), callback, tmp_path, max_steps=40, eval_strategy="no", learning_rate=1e30,
                    max_grad_norm=0.0)  # fmt: skip
    report, diagnosis = saved(tmp_path)

    assert trainer.state.global_step < 40  # the Trainer stopped early, through on_train_end
    assert report.loop.steps == trainer.state.global_step
    stops = [e for e in report.errors if e.source == "hf.stop_on"]
    assert len(stops) == 1 and stops[0].type == "TrainingFailure"
    assert any(f.severity == "error" for f in diagnosis.findings)
