import csv

import torch
from _probe_models import batch, mlp, single_thread  # noqa: F401
from torch import nn

from nndx.cli import main
from nndx.collector import cli as collector_cli
from nndx.collector.probe import PROBES
from nndx.report import DiagnosticReport


def factory():
    return mlp(), batch(), nn.CrossEntropyLoss()


def dict_factory():
    model = mlp()
    return {"model": model, "batch": batch(), "loss_fn": nn.CrossEntropyLoss(),
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}  # fmt: skip


def not_a_setup():
    return 42


def loader_factory():
    from torch.utils.data import DataLoader, TensorDataset

    x, _ = batch(n=128)
    y = x[:, :3].argmax(1)  # learnable labels: a sweep over minibatches must see the loss fall
    return mlp(), DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), nn.CrossEntropyLoss()


def test_probe_writes_report_and_a_summary_without_progress_off_a_terminal(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["probe", f"{__file__}:factory", "--out", str(out), "--probes", "nan_origin", "grad_check"])
    assert code == 0
    report = DiagnosticReport.model_validate_json(out.read_text())
    assert report.probes.grad_check.status == "passed" and report.probes.overfit_one_batch is None
    captured = capsys.readouterr()
    assert "grad_check: passed" in captured.err and "nan_origin: passed" in captured.err
    assert "[2/2]" not in captured.err and "\r" not in captured.err  # stderr is no terminal here: no progress
    assert captured.out.strip() == str(out)


def test_probe_dict_factory_with_optimizer(tmp_path):
    out = tmp_path / "r.json"
    # MODULE as an importable module name (pytest put this test's folder on sys.path)
    assert main(["probe", f"{__name__}:dict_factory", "--out", str(out), "--probes", "hooks", "--quiet"]) == 0
    report = DiagnosticReport.model_validate_json(out.read_text())
    assert report.layers and report.loop.params_not_in_optimizer == []


def test_lr_find_writes_csv_png_and_prints_suggestion(tmp_path, capsys):
    csv_path, png = tmp_path / "lr.csv", tmp_path / "lr.png"
    code = main(["lr-find", f"{__file__}:factory", "--csv", str(csv_path), "--png", str(png), "--steps", "40"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("suggested lr: ") and "trains well from" in out and "valley" not in out
    rows = list(csv.reader(csv_path.open()))
    assert rows[0] == ["lr", "loss", "smoothed"] and len(rows) > 10
    assert png.read_bytes()[:4] == b"\x89PNG"
    # lr-plot re-reads the sweep and gives the same suggestion
    png2 = tmp_path / "again.png"
    assert main(["lr-plot", str(csv_path), "--png", str(png2)]) == 0
    assert capsys.readouterr().out.split(";")[0] == out.split(";")[0]
    assert png2.is_file()


def test_lr_find_reads_a_dataloader_from_the_factory(capsys):
    assert main(["lr-find", f"{__file__}:loader_factory", "--steps", "60", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("suggested lr: ") and captured.err == ""


def huber_factory():
    x, _ = batch(n=64)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 1))
    return model, (x, x[:, :1] * 2), nn.HuberLoss(), torch.optim.SGD(model.parameters(), lr=0.01)


def test_lr_find_with_an_interval_and_no_trusted_point_says_why_and_succeeds(capsys):
    """Huber regression: no point was measured to train well, so none is printed — but the
    sweep worked and its interval is the answer, not a failure."""
    assert main(["lr-find", f"{__file__}:huber_factory", "--steps", "60", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no suggestion: no suggested lr") and "trains from" in out


def mse_momentum_factory():
    x, _ = batch(n=64)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 1))
    return model, (x, x[:, :1] * 2), nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def test_lr_plot_reads_a_regression_sweep_as_lr_find_did_when_told_its_loss_and_optimizer(tmp_path, capsys):
    csv_path = tmp_path / "lr.csv"
    assert main(["lr-find", f"{__file__}:mse_momentum_factory", "--csv", str(csv_path), "--steps", "60", "--quiet"]) == 0
    found = capsys.readouterr().out
    args = ["lr-plot", str(csv_path), "--png", str(tmp_path / "lr.png")]
    assert main(args + ["--loss", "MSELoss", "--optimizer", "SGD with momentum"]) == 0
    assert capsys.readouterr().out.split(";")[0] == found.split(";")[0]
    assert main(args) == 0  # unnamed: the knee rule's reading, not the one lr-find printed
    assert capsys.readouterr().out.split(";")[0] != found.split(";")[0]


def test_bad_factories_and_files_are_usage_errors(tmp_path, capsys):
    assert main(["probe", "no_colon_here"]) == 2
    assert "MODULE:FACTORY" in capsys.readouterr().err
    assert main(["probe", f"{__file__}:missing"]) == 2
    assert "no callable 'missing'" in capsys.readouterr().err
    assert main(["probe", f"{__file__}:not_a_setup"]) == 2
    assert "must return" in capsys.readouterr().err
    assert main(["probe", "nndx_no_such_module:f"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert main(["lr-plot", str(tmp_path / "missing.csv"), "--png", str(tmp_path / "x.png")]) == 2


def test_cli_probe_names_match_the_probes():
    assert collector_cli.PROBE_NAMES == tuple(PROBES)
