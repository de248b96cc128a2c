"""The programs' offline datasets leave the random streams as they found them."""

import subprocess
import sys

DRAWS = "print(random.random(), np.random.rand(), torch.rand(1).item())"


def _draws(load: bool) -> str:
    code = ("import random, numpy as np, torch; from bench.programs import data; "
            "random.seed(0); np.random.seed(0); torch.manual_seed(0); "
            + ("data.digit_images(); " if load else "") + DRAWS)  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_the_first_load_of_the_digits_draws_nothing_from_the_global_random_streams():
    """A port seeds, then loads its data: the first load in a process imports scikit-learn, whose
    import drew from the global streams, so a program's first run trained differently from its
    later ones (bentrevett_mlp's healthy run, 'training changed by nndx')."""
    assert _draws(load=True) == _draws(load=False)
