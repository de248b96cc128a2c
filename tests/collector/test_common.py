import torch

from nndx.collector._common import trailing_runs


def test_trailing_runs_read_the_padding_each_row_ends_in():
    rows = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0], [5, 6, 7, 8], [0, 5, 6, 0]])
    pad, run = trailing_runs(rows)
    assert pad == 0
    assert run.tolist() == [2, 3, 0, 1]  # a pad id inside a row is no part of its run


def test_trailing_runs_leave_an_ignore_index_out_and_break_ties_to_the_smallest_id():
    ignored = torch.tensor([[3, -100], [4, -100], [5, -100]])
    assert trailing_runs(ignored) is None
    pad, run = trailing_runs(torch.tensor([[1, 9], [2, 9], [3, 2], [4, 2]]))
    assert pad == 2 and run.tolist() == [0, 0, 1, 1]
