"""Finding a model's chain of blocks, and the hidden state that chains them."""
from __future__ import annotations

# Where common models keep their chain of blocks (dotted paths, tried in order).
BLOCK_PATHS = [
    "transformer.h",                      # Hugging Face GPT-2, GPT-J, GPT-Neo
    "model.layers", "layers",             # Llama-style decoders
    "bert.encoder.layer", "roberta.encoder.layer", "encoder.layer",   # BERT-style encoders
    "encoder.block", "transformer.encoder.block",                      # T5-style encoders
    "blocks",                             # timm ViT, DeiT
    "vit.encoder.layer",
]


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def find_blocks(model, blocks=None):
    """(names, modules) of the model's chain of blocks.

    ``blocks``: a dotted path (``"transformer.h"``), a list of modules, or None to look in the
    usual places: an ``nn.Sequential`` model itself, ``transformer.h``, ``encoder.layer``,
    ``encoder.block``, ``blocks``, and ResNet's ``layer1..layer4`` (their blocks in order)."""
    import torch.nn as nn
    if blocks is not None and not isinstance(blocks, str):
        mods = list(blocks)
        if not mods or not all(isinstance(m, nn.Module) for m in mods):
            raise ValueError("blocks must be a non-empty list of nn.Module or a dotted path")
        names = {id(m): n for n, m in model.named_modules()}
        return [names.get(id(m), f"block{i}") for i, m in enumerate(mods)], mods
    paths = [blocks] if isinstance(blocks, str) else BLOCK_PATHS
    if blocks is None and isinstance(model, nn.Sequential):
        return [n for n, _ in model.named_children()], list(model.children())
    for p in paths:
        c = _get(model, p)
        if isinstance(c, (nn.ModuleList, nn.Sequential)) and len(c) > 0:
            return [f"{p}.{n}" for n, _ in c.named_children()], list(c.children())
    if blocks is None and all(isinstance(_get(model, f"layer{i}"), nn.Sequential) for i in range(1, 5)):
        names, mods = [], []
        for i in range(1, 5):
            for n, m in _get(model, f"layer{i}").named_children():
                names.append(f"layer{i}.{n}")
                mods.append(m)
        return names, mods
    where = f"at {blocks!r}" if isinstance(blocks, str) else "(tried nn.Sequential, " + ", ".join(BLOCK_PATHS) \
        + ", layer1..layer4)"
    raise ValueError(f"no chain of blocks found in {type(model).__name__} {where}; pass blocks=")


def _tensors(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
    elif hasattr(obj, "to_tuple"):            # Hugging Face ModelOutput
        yield from _tensors(obj.to_tuple())


def hidden_of(args, kwargs=None):
    """The tensor a block chains on: its first positional tensor, else ``hidden_states``."""
    import torch
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(args, torch.Tensor):
        return args
    if args and isinstance(args[0], (tuple, list)) and args[0] and isinstance(args[0][0], torch.Tensor):
        return args[0][0]
    kwargs = kwargs or {}
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    for t in _tensors(list(args) + list(kwargs.values())):
        return t
    return None
