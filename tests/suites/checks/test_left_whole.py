"""Which split projection a tensor left whole is named beside (suites/checks/sharding.py `_left_whole`), on a module
tree alone: no rank runs."""

import torch

from suites.checks.sharding import _left_whole, snapshot
from suites.verdicts.mechanism import Replaced


class Attention(torch.nn.Module):
    """olmo2's shape: q_norm and k_norm over the widths of q_proj and k_proj, equal with as many kv heads as heads."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(width, width)
        self.k_proj = torch.nn.Linear(width, width)
        self.q_norm = torch.nn.RMSNorm(width)
        self.k_norm = torch.nn.RMSNorm(width)


def test_a_norm_is_named_beside_the_projection_it_is_named_for():
    model = torch.nn.Sequential(Attention(8))
    column = [
        (f"0.{name}", Replaced(f"0.{name}", "Linear", "LinearLayer", (8, 8), 0, 4)) for name in ("q_proj", "k_proj")
    ]
    beside = {w.tensor: w.beside for w in _left_whole(snapshot(model), model, column, head_dim=4)}
    assert beside == {"0.q_norm.weight": "0.q_proj", "0.k_norm.weight": "0.k_proj"}
