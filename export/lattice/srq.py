"""Static activation rounding ("SRQ") as the QAT checkpoint computes it: the loaded PyTorch model's linear layers
that carry static int8 activation scales round their input and output to them, as transformers' `apply_srq`
(transformers 5.24 `integrations/gemma_quant.py`) does, so the graphs traced from the model compute it too."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .types import Lattice, key


def rounded(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """clamp(round(x / s), -128, 127) * s, in x's dtype: int8 at a fixed scale, as apply_srq."""
    s = scale.to(x.dtype)
    return torch.clamp(torch.round(x / s), -128.0, 127.0) * s


class SRQLinear(nn.Linear):
    """A Linear whose input and / or output are rounded to static int8 scales (a zero scale: none)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rounded_linear(x, self.weight, self.bias)

    def rounded_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """This layer's computation with `weight` / `bias` in place of its own (an export's reordered copy):
        the scales are per tensor, so rounding commutes with any reordering of channels."""
        if self.srq_input:
            x = rounded(x, self.input_activation_scale)
        out = F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
        return rounded(out, self.output_activation_scale) if self.srq_output else out


def linear(module: nn.Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) in the place of `module`, rounded as the module rounds where it is an SRQLinear:
    for code that computes a layer with a reordered copy of its weight instead of calling it."""
    if isinstance(module, SRQLinear):
        return module.rounded_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def rounds(lattice: Lattice) -> bool:
    """Whether any linear layer of the checkpoint has a static activation scale (0 everywhere: weights only)."""
    return any(any(scales) for scales in lattice.activations.values())


def apply(model: nn.Module, lattice: Lattice | None) -> int:
    """Turn each nn.Linear of `model` with static activation scales in `lattice` into an SRQLinear (in place: same
    parameters, names and module tree); returns how many."""
    if lattice is None or not lattice.activations:
        return 0
    changed = 0
    for name, module in model.named_modules():
        scales = lattice.activations.get(key(name))
        if type(module) is not nn.Linear or not scales or not any(scales):
            continue
        module.register_buffer("input_activation_scale", torch.tensor(float(scales[0])), persistent=False)
        module.register_buffer("output_activation_scale", torch.tensor(float(scales[1])), persistent=False)
        module.srq_input, module.srq_output = scales[0] != 0, scales[1] != 0
        module.__class__ = SRQLinear
        changed += 1
    return changed
