"""The models `nox -s model` runs: built-in Hugging Face families from their configs (random weights,
no download), or a user's own from `path/to/file.py:factory`.

A factory takes no argument and returns a ModelCase, or a dict with its fields:
    model           the original torch.nn.Module (built deterministically: the lab seeds torch first)
    inputs          (batch, seq, seed) -> {input name: numpy array}: the model's inputs at a shape
    dynamic_shapes  {input name: {axis: axis name}}; default: axes 0 and 1 of every input as batch, seq
    kwargs          non-tensor keyword arguments of every call (Hugging Face: use_cache=False)
Inputs are numpy so that the ONNX Runtime side never imports torch.
"""
from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

SEED = 0


@dataclass
class ModelCase:
    name: str
    model: object                                      # torch.nn.Module
    inputs: Callable[[int, int, int], dict]            # (batch, seq, seed) -> {name: np.ndarray}
    dynamic_shapes: dict | None = None
    kwargs: dict = field(default_factory=dict)
    export_shape: tuple[int, int] = (2, 16)            # the example the exporter traces
    check_shape: tuple[int, int] = (3, 11)             # layer 2 runs at another shape than the export's
    bench_shape: tuple[int, int] = (1, 128)
    description: str = ""

    def __post_init__(self):
        if self.dynamic_shapes is None:
            names = list(self.inputs(*self.export_shape, SEED))
            self.dynamic_shapes = {name: {0: "batch", 1: "seq"} for name in names}


class ModelSpecError(ValueError):
    """MODEL names no built-in model and no usable factory; the message says what to give instead."""


def _token_ids(vocab: int) -> Callable[[int, int, int], dict]:
    def inputs(batch: int, seq: int, seed: int) -> dict:
        return {"input_ids": np.random.default_rng([seed, batch, seq]).integers(0, vocab, (batch, seq), dtype=np.int64)}
    return inputs


# Per-layer sizes of small released models, truncated to a few layers and a 32,000-token vocabulary
# (the embedding and head would otherwise be most of the time); the -tiny ones are for the tests.
BUILT_IN = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                                      num_key_value_heads=3, num_hidden_layers=4, vocab_size=32000),
              "Llama with SmolLM-135M's layer sizes (hidden 576, MLP 1536, 9 heads, 3 KV heads), 4 layers, vocab 32000"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                                                      num_key_value_heads=2, num_hidden_layers=4, vocab_size=32000),
              "Qwen2 with Qwen2-0.5B's layer sizes (hidden 896, MLP 4864, 14 heads, 2 KV heads), 4 layers, vocab 32000"),
    "llama-tiny": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                                           num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000),
                   "Llama, 2 layers, hidden 256 (tests)"),
    "qwen2-tiny": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                                           num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000),
                   "Qwen2, 2 layers, hidden 256 (tests)"),
    # Gemma's RMSNorm scales by 1 + weight (ops.apply adds the 1 in the swapped module; fuse folds it into
    # a constant); with SiLU as its MLP's activation, Swish too.
    "gemma-tiny": ("GemmaConfig", "GemmaForCausalLM", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                                           num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000,
                                                           head_dim=64, hidden_act="silu"),
                   "Gemma with SiLU, 2 layers, hidden 256 (tests)"),
    # A CLIP vision tower (quick_gelu: Swish with beta 1.702); its attention's key bias gets a gradient
    # that is zero in exact math, which layer 1 judges against the model's largest.
    "clip-vision-tiny": ("CLIPVisionConfig", "CLIPVisionModel", dict(hidden_size=128, intermediate_size=512,
                                                                     num_attention_heads=4, num_hidden_layers=2,
                                                                     image_size=64, patch_size=16,
                                                                     hidden_act="quick_gelu"),
                         "CLIP vision tower, 2 layers, hidden 128, 64x64 images in 16x16 patches (tests)"),
}


def _built_in(name: str) -> ModelCase:
    try:
        import transformers
    except ImportError as exc:
        raise ModelSpecError(f"the built-in model {name!r} needs transformers, which this environment lacks: use an "
                             "entry whose matrix.yaml pins transformers (cpu), or pip install transformers") from exc
    config_class, model_class, sizes, description = BUILT_IN[name]
    if config_class == "CLIPVisionConfig":
        return _vision_tower(transformers, name, getattr(transformers, config_class)(**sizes),
                             getattr(transformers, model_class), description)
    config = getattr(transformers, config_class)(**sizes, max_position_embeddings=1024, use_cache=False,
                                                 tie_word_embeddings=False)
    model = getattr(transformers, model_class)(config).eval()
    return ModelCase(name, model, _token_ids(config.vocab_size), kwargs={"use_cache": False},
                     description=f"{description}; transformers {transformers.__version__}")


def _vision_tower(transformers, name: str, config, model_class, description: str) -> ModelCase:
    """Images in (batch x 3 x size x size; the sequence length of the shapes is not used), every
    output of the tower compared; only the batch is dynamic."""
    size = config.image_size

    def inputs(batch: int, seq: int, seed: int) -> dict:
        rng = np.random.default_rng([seed, batch])
        return {"pixel_values": rng.standard_normal((batch, 3, size, size)).astype(np.float32)}

    return ModelCase(name, model_class(config).eval(), inputs, dynamic_shapes={"pixel_values": {0: "batch"}},
                     check_shape=(3, 0), description=f"{description}; transformers {transformers.__version__}")


def _from_file(spec: str) -> ModelCase:
    path_text, _, factory_name = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise ModelSpecError(f"{path_text} is not a file: give a built-in model ({', '.join(BUILT_IN)}) or "
                             "path/to/file.py:factory")
    module_spec = importlib.util.spec_from_file_location(f"user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ModelSpecError(f"{path} has no function {factory_name!r}")
    made = factory()
    if isinstance(made, dict):
        unknown = sorted(set(made) - set(inspect.signature(ModelCase).parameters))
        if unknown or "model" not in made or "inputs" not in made:
            raise ModelSpecError(f"{spec} returned a dict with keys {sorted(made)}: it needs 'model' and 'inputs' "
                                 "(and optionally dynamic_shapes, kwargs, export_shape, check_shape, bench_shape)")
        made = ModelCase(name=made.pop("name", path.stem), **made)
    if not isinstance(made, ModelCase):
        raise ModelSpecError(f"{spec} returned a {type(made).__name__}: return a bench.models.catalog.ModelCase "
                             "or a dict with 'model' and 'inputs'")
    return made


def load(spec: str) -> ModelCase:
    """The model named `spec` (built-in) or made by `path/to/file.py:factory`, built with torch seeded."""
    import torch

    torch.manual_seed(SEED)
    if spec in BUILT_IN:
        return _built_in(spec)
    if ":" in spec and spec.rpartition(":")[0].endswith(".py"):
        return _from_file(spec)
    raise ModelSpecError(f"unknown model {spec!r}: give a built-in model ({', '.join(BUILT_IN)}) or "
                         "path/to/file.py:factory")


def slug(spec: str) -> str:
    """The results folder name of a model: a built-in's name, or the factory's file stem and name."""
    if spec in BUILT_IN:
        return spec
    path_text, _, factory_name = spec.rpartition(":")
    return f"{Path(path_text).stem}-{factory_name}"
