"""The end-to-end workloads: real models built offline from configs (random weights, fixed seeds).

Each builder takes ``(torch, seed)`` and returns a :class:`Runner`. ``inputs(i)`` makes step i's
batch on the GPU (its shape drawn from a seeded ``random.Random`` for the dynamic workloads, its
values from a seeded CUDA generator), outside the timed region; ``step(batch)`` runs one training
or inference step and returns a small float64 tensor of checksum values (the loss, or sums of the
outputs), whose transfer to the host ends the step. ``digest()`` gives checksum values of the final
state (the trained parameters). Every run of a workload, whatever the allocator, sees the same
shapes and the same data.

The importing parent never imports torch: builders import their libraries inside.
"""
from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Runner:
    inputs: Callable[[int], Any]
    step: Callable[[Any], Any]
    digest: Callable[[], list]
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    name: str
    mode: str      # "train" or "infer"
    shapes: str    # "static" or "dynamic"
    summary: str
    build: Callable


def _shape_rng(seed: int, i: int) -> random.Random:
    return random.Random(seed * 1_000_003 + i)


def _gen(torch, seed: int, i: int):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 1_000_003 + i)
    return g


def _on_gpu(torch, make):
    # Parameters are created and initialized on the GPU: initializing a few hundred million
    # parameters on the CPU would cost each process seconds.
    with torch.device("cuda"):
        return make()


def _param_digest(torch, model) -> Callable[[], list]:
    def digest():
        with torch.no_grad():
            sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in model.parameters()])
            return [float(sums.sum()), float(sums.abs().sum()), float((sums * sums).sum())]
    return digest


def _autocast(torch):
    return torch.autocast("cuda", dtype=torch.bfloat16)


def _train_step(torch, model, opt, forward):
    def step(batch):
        with _autocast(torch):
            loss = forward(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach().to(torch.float64).reshape(1)
    return step


def _out_sums(torch, out):
    # Two sums of an inference output, accumulated in fp32 without a full-size copy.
    return torch.stack([out.sum(dtype=torch.float32),
                        torch.linalg.vector_norm(out, 2, dtype=torch.float32)]).to(torch.float64)


# ---- static shapes, training ----------------------------------------------------------------

def build_gpt2(torch, seed: int) -> Runner:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(use_cache=False)  # GPT-2 small, 124M parameters
    model = _on_gpu(torch, lambda: GPT2LMHeadModel(cfg)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = 8, 1024

    def inputs(i):
        return torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=_gen(torch, seed, i))

    step = _train_step(torch, model, opt, lambda x: model(input_ids=x, labels=x).loss)
    return Runner(inputs, step, _param_digest(torch, model), {"batch": batch, "seq": seq})


def build_resnet50(torch, seed: int) -> Runner:
    try:
        import torchvision
        model, source = _on_gpu(torch, lambda: torchvision.models.resnet50(weights=None)), "torchvision"
    except ImportError:
        import timm
        model, source = _on_gpu(torch, lambda: timm.create_model("resnet50", pretrained=False)), "timm"
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = 128

    def inputs(i):
        g = _gen(torch, seed, i)
        x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=g)
        return x, y

    step = _train_step(torch, model, opt, lambda b: loss_fn(model(b[0]), b[1]))
    return Runner(inputs, step, _param_digest(torch, model), {"batch": batch, "image": 224, "source": source})


# ---- dynamic shapes -------------------------------------------------------------------------

def build_bert_infer(torch, seed: int) -> Runner:
    """BERT-base inference, bf16 weights; batch 16-256 and sequence 64-512 drawn per step, each
    row padded from a random length (so the attention mask is real)."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig()
    model = _on_gpu(torch, lambda: BertModel(cfg)).eval().to(torch.bfloat16)

    def inputs(i):
        r = _shape_rng(seed, i)
        b, t = r.randint(16, 256), r.randint(64, 512)
        g = _gen(torch, seed, i)
        ids = torch.randint(0, cfg.vocab_size, (b, t), device="cuda", generator=g)
        lengths = torch.randint(t // 2, t + 1, (b, 1), device="cuda", generator=g)
        mask = (torch.arange(t, device="cuda")[None, :] < lengths).to(torch.long)
        return ids, mask

    def step(b):
        with torch.inference_mode():
            out = model(input_ids=b[0], attention_mask=b[1]).last_hidden_state
            return _out_sums(torch, out)
    return Runner(inputs, step, lambda: [], {"batch": "16-256", "seq": "64-512"})


def build_t5(torch, seed: int) -> Runner:
    """T5-base (220M) training, batch 16, source 64-512 and target 16-160 tokens per step."""
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
                   use_cache=False)
    model = _on_gpu(torch, lambda: T5ForConditionalGeneration(cfg)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = 16

    def inputs(i):
        r = _shape_rng(seed, i)
        src, tgt = r.randint(64, 512), r.randint(16, 160)
        g = _gen(torch, seed, i)
        # Token 0 is T5's padding and 1 its end of sequence: keep them out of the random text.
        x = torch.randint(2, cfg.vocab_size, (batch, src), device="cuda", generator=g)
        y = torch.randint(2, cfg.vocab_size, (batch, tgt), device="cuda", generator=g)
        return x, y

    def forward(b):
        x, y = b
        # The decoder input is the target shifted right behind T5's start token (0, its padding):
        # made here, as transformers 5's T5Config no longer carries decoder_start_token_id.
        dec = torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)
        return model(input_ids=x, decoder_input_ids=dec, labels=y).loss

    step = _train_step(torch, model, opt, forward)
    return Runner(inputs, step, _param_digest(torch, model), {"batch": batch, "src": "64-512", "tgt": "16-160"})


def build_moe(torch, seed: int) -> Runner:
    """Mixtral-style MoE (transformers MixtralForCausalLM, 4 layers, 8 experts, top-2, ~430M
    parameters) training, batch 8 x 1024. The eager expert loop is used: each expert gets the
    tokens routed to it, so tensor sizes change with the routing from step to step."""
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
                        num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=4096, output_router_logits=True,
                        router_aux_loss_coef=0.01, use_cache=False)
    model = _on_gpu(torch, lambda: MixtralForCausalLM(cfg)).train()
    experts = "default"
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
        experts = "eager"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = 8, 1024

    def inputs(i):
        return torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=_gen(torch, seed, i))

    step = _train_step(torch, model, opt, lambda x: model(input_ids=x, labels=x).loss)
    return Runner(inputs, step, _param_digest(torch, model),
                  {"batch": batch, "seq": seq, "experts": 8, "top_k": 2, "experts_impl": experts})


def build_vit(torch, seed: int) -> Runner:
    """ViT-B/16 (86M) training at 224x224 with a batch of 32-160 drawn per step."""
    try:
        import timm
        model = _on_gpu(torch, lambda: timm.create_model("vit_base_patch16_224", pretrained=False,
                                                         num_classes=1000))
        source, forward = "timm", None
    except ImportError:
        from transformers import ViTConfig, ViTForImageClassification
        model = _on_gpu(torch, lambda: ViTForImageClassification(ViTConfig(num_labels=1000)))
        source = "transformers"
        forward = lambda x: model(pixel_values=x).logits  # noqa: E731
    forward = forward or model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def inputs(i):
        b = _shape_rng(seed, i).randint(32, 160)
        g = _gen(torch, seed, i)
        return (torch.randn(b, 3, 224, 224, device="cuda", generator=g),
                torch.randint(0, 1000, (b,), device="cuda", generator=g))

    step = _train_step(torch, model, opt, lambda b: loss_fn(forward(b[0]), b[1]))
    return Runner(inputs, step, _param_digest(torch, model), {"batch": "32-160", "source": source})


def build_llama_gen(torch, seed: int) -> Runner:
    """Greedy generation with a Llama-style model (8 layers, hidden 1024, ~200M parameters, bf16):
    batch 8-64 and prompt 64-1024 tokens drawn per step, then 16-32 new tokens one at a time; the
    KV cache (transformers' DynamicCache) grows by one token per layer at every new token."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096)
    model = _on_gpu(torch, lambda: LlamaForCausalLM(cfg)).eval().to(torch.bfloat16)

    def inputs(i):
        r = _shape_rng(seed, i)
        b, prompt, new = r.randint(8, 64), r.randint(64, 1024), r.randint(16, 32)
        ids = torch.randint(3, cfg.vocab_size, (b, prompt), device="cuda", generator=_gen(torch, seed, i))
        return ids, new

    def step(b):
        ids, new = b
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            toks = [tok]
            for _ in range(new - 1):
                out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                toks.append(tok)
            gen = torch.cat(toks, dim=1).to(torch.float64)
            weights = torch.arange(1, gen.numel() + 1, device="cuda", dtype=torch.float64).view_as(gen)
            return torch.stack([gen.sum(), (gen * weights).sum()])
    return Runner(inputs, step, lambda: [], {"batch": "8-64", "prompt": "64-1024", "new_tokens": "16-32"})


WORKLOADS = {w.name: w for w in (
    Workload("gpt2", "train", "static", "GPT-2 small (124M), batch 8 x 1024, bf16 autocast, AdamW", build_gpt2),
    Workload("resnet50", "train", "static", "ResNet-50, batch 128 at 224x224, bf16 autocast, SGD momentum",
             build_resnet50),
    Workload("bert", "infer", "dynamic", "BERT-base inference, bf16, batch 16-256 x seq 64-512 per step, padded",
             build_bert_infer),
    Workload("t5", "train", "dynamic", "T5-base (220M), batch 16, source 64-512 / target 16-160 per step, "
             "bf16 autocast, AdamW", build_t5),
    Workload("moe", "train", "dynamic", "Mixtral-style MoE (4 layers, 8 experts, top-2, ~430M), batch 8 x 1024, "
             "per-expert token counts from the routing, bf16 autocast, AdamW", build_moe),
    Workload("vit", "train", "dynamic", "ViT-B/16 (86M), batch 32-160 per step at 224x224, bf16 autocast, AdamW",
             build_vit),
    Workload("llama_gen", "infer", "dynamic", "Llama-style (8 x 1024, ~200M) greedy generation, bf16, batch 8-64, "
             "prompt 64-1024, 16-32 new tokens, growing KV cache", build_llama_gen),
)}


# What each builder imports, for a zygote to import once before forking the runs (zygote.py).
_IMPORTS = {
    "gpt2": [("transformers", ("GPT2Config", "GPT2LMHeadModel"))],
    "resnet50": [("torchvision.models", ("resnet50",)), ("timm", ())],
    "bert": [("transformers", ("BertConfig", "BertModel"))],
    "t5": [("transformers", ("T5Config", "T5ForConditionalGeneration"))],
    "moe": [("transformers", ("MixtralConfig", "MixtralForCausalLM"))],
    "vit": [("timm", ()), ("transformers", ("ViTConfig", "ViTForImageClassification"))],
    "llama_gen": [("transformers", ("LlamaConfig", "LlamaForCausalLM"))],
}


def preload(names) -> None:
    """Imports torch and what the named workloads' builders import (without touching CUDA)."""
    import torch  # noqa: F401
    for name in names:
        for module, attrs in _IMPORTS[name]:
            try:
                m = importlib.import_module(module)
                for a in attrs:
                    getattr(m, a)  # transformers imports a model's module on first access
            except ImportError:  # the builder falls back to another library, or says what is missing
                pass
