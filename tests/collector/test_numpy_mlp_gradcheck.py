import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "numpy_mlp_gradcheck.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("numpy_mlp_gradcheck", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["directional", "elementwise"])
def test_correct_backward_passes_and_transposed_weight_is_named(example, mode):
    assert example.check(bug=False, mode=mode).status == "passed"
    broken = example.check(bug=True, mode=mode)
    assert broken.status == "failed"
    assert [p.name for p in broken.parameters if p.status == "bug"] == ["W2"]


def test_the_bug_is_silent_otherwise(example):
    # the transposed gradient has the right shape: nothing but a gradient check notices
    params, (x, y) = example.init_params(), example.data()
    good, bad = example.backward(params, x, y), example.backward(params, x, y, bug=True)
    assert good["W2"].shape == bad["W2"].shape and not np.allclose(good["W2"], bad["W2"])


def test_script_exit_code(example, capsys):
    assert example.main() == 0
    assert "W2" in capsys.readouterr().out
