"""The core package works without any integration library, and each integration says
which extra to install. Run in a subprocess where the libraries cannot be imported
(``sys.modules[name] = None`` makes ``import name`` raise ImportError)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    for name in ("tensorboard", "wandb", "pytorch_lightning", "lightning", "transformers", "accelerate"):
        sys.modules[name] = None

    import nndx.integrations
    import nndx.integrations.tensorboard
    import nndx.integrations.wandb
    import nndx.integrations.lightning
    import nndx.integrations.hf
    from nndx.integrations import MissingExtraError, make_sinks
    from nndx.integrations.tensorboard import TensorBoardSink
    from nndx.integrations.wandb import WandbSink

    def expect_missing(action, extra):
        try:
            action()
        except MissingExtraError as exc:
            assert f"pip install 'nndx[{extra}]'" in str(exc), str(exc)
            print("missing", extra)
        else:
            raise AssertionError(f"no error for the {extra} extra")

    assert make_sinks() == []
    expect_missing(lambda: TensorBoardSink("runs/x"), "tensorboard")
    expect_missing(lambda: make_sinks(tensorboard="runs/x"), "tensorboard")

    class FakeRun:  # a W&B-like run: scalars need no wandb, histograms do
        def __init__(self):
            self.rows = []
        def define_metric(self, *args, **kwargs):
            pass
        def log(self, row):
            self.rows.append(row)

    run = FakeRun()
    WandbSink(run).log_step(3, {"loss/train": 1.5})
    assert run.rows == [{"nndx/loss/train": 1.5, "nndx/step": 3}], run.rows
    expect_missing(lambda: WandbSink(run).log_step(4, {}, {"weights/w": [1.0]}), "wandb")

    def lightning_callback():
        from nndx.integrations.lightning import NndxCallback
    def hf_callback():
        from nndx.integrations.hf import NndxCallback
    expect_missing(lightning_callback, "lightning")
    expect_missing(hf_callback, "hf")

    # the core still works: a diagnosis and an exported report need no extra
    import nndx
    from nndx.integrations import export_report
    report = nndx.DiagnosticReport(loss_history={"train": [{"step": 0, "value": 2.0}]})
    assert nndx.diagnose(report).rules_run > 0
    class Collect:
        def __init__(self):
            self.steps = []
        def log_step(self, step, scalars, histograms=None):
            self.steps.append((step, dict(scalars)))
        def flush(self):
            pass
        def close(self):
            pass
    sink = Collect()
    assert export_report(sink, report) == 1 and sink.steps == [(0, {"loss/train": 2.0})]
    for name in ("tensorboard", "wandb", "pytorch_lightning", "transformers"):
        assert sys.modules[name] is None, name  # nothing managed to import them after all
    print("core ok")
    """
)


def test_integrations_import_without_their_libraries_and_name_the_extra():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [
        "missing tensorboard", "missing tensorboard", "missing wandb", "missing lightning", "missing hf", "core ok",
    ]  # fmt: skip
