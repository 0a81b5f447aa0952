"""Weight-only quantization of a PyTorch module's linear layers.

>>> from vramkit.quant.torch import quantize_linear_weights
>>> report = quantize_linear_weights(model, "nf4", block=64)
>>> report["weight_bytes_after"] / report["weight_bytes_before"]

Each ``torch.nn.Linear`` (and Hugging Face ``Conv1D``, which GPT-2 uses) is replaced by a
``QuantizedLinear`` that keeps its weight as a ``vramkit.quant.QuantizedBuffer`` and dequantizes it
into a temporary tensor (from vramkit's pool) at every forward; activations, biases and the other
parameters stay as they were. Weights tied to another parameter (GPT-2's ``lm_head`` shares the
token embedding) are left alone: quantizing one copy would keep both in memory. Inference only: the
quantized weights get no gradient.
"""
from __future__ import annotations

import torch

from . import QuantizedBuffer, quantize


class QuantizedLinear(torch.nn.Module):
    """A linear layer whose weight is stored quantized and dequantized on the fly in forward."""

    def __init__(self, layer: torch.nn.Module, format: str, block: int | None, double_quant: bool = False):
        super().__init__()
        w = layer.weight.detach()
        self.transposed = _is_conv1d(layer)  # HF Conv1D stores (in, out) and computes x @ W + b
        self.in_features = w.shape[0] if self.transposed else w.shape[1]
        self.out_features = w.shape[1] if self.transposed else w.shape[0]
        self.qweight: QuantizedBuffer = quantize(w.contiguous(), format, block, double_quant)
        self.bias = layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight.dequantize()
        if self.transposed:
            y = x.reshape(-1, self.in_features) @ w
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*x.shape[:-1], self.out_features)
        return torch.nn.functional.linear(x, w, self.bias)

    def extra_repr(self) -> str:
        q = self.qweight
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={q.format}, block={q.block}, {q.dtype} weight {q.original_nbytes} -> {q.nbytes} bytes")


def _is_conv1d(m: torch.nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) is not None \
        and m.weight.dim() == 2


def _targets(module: torch.nn.Module):
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear) or _is_conv1d(m):
            yield name, m


def quantize_linear_weights(module: torch.nn.Module, format: str = "int8", block: int | None = None, *,
                            double_quant: bool = False, skip=()) -> dict:
    """Replaces module's linear layers by QuantizedLinear (in place); returns a report: the layers
    quantized and skipped, and their weights' bytes before and after (``weight_bytes_before``,
    ``weight_bytes_after``, ``ratio``), plus all parameter bytes of the module before and after."""
    if format not in ("int8", "int8_dynamic", "fp8_e4m3", "fp8_e5m2", "nf4", "fp4"):
        raise ValueError(f"quantize_linear_weights: unknown format {format!r}")
    params_before = sum(p.numel() * p.element_size() for p in module.parameters())
    counts: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    done, skipped = [], []
    before = after = 0
    for name, layer in list(_targets(module)):
        if not name:
            skipped.append((name, "the module itself is the layer: pass a module that holds it"))
            continue
        if any(name == s or name.startswith(s + ".") for s in skip):
            skipped.append((name, "asked"))
            continue
        if counts.get(id(layer.weight), 0) > 1:
            skipped.append((name, "weight tied to another parameter"))
            continue
        q = QuantizedLinear(layer, format, block, double_quant)
        before += q.qweight.original_nbytes
        after += q.qweight.nbytes
        parent_name, _, leaf = name.rpartition(".")
        setattr(_first(module, parent_name) if parent_name else module, leaf, q)
        done.append(name)
    params_after = sum(p.numel() * p.element_size() for p in module.parameters()) + after
    return {"format": format, "block": None if not done else _first(module, done[0]).qweight.block,
            "double_quant": double_quant, "quantized": done, "skipped": skipped,
            "weight_bytes_before": before, "weight_bytes_after": after,
            "ratio": after / before if before else float("nan"),
            "param_bytes_before": params_before, "param_bytes_after": params_after}


def _first(module, name):
    m = module
    for part in name.split("."):
        m = getattr(m, part)
    return m
