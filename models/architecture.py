"""Which Flax module builds which model family, and its shape-only (abstract) form that parameters
are checked against and restored into.

Must not read files or pick a kernel; callers pass the resolved attention implementation name.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from models.bert import BertEncoder
from models.config import ModelConfig
from models.gpt2 import GPT2Decoder
from models.llama import LlamaDecoder
from models.modernbert import ModernBertEncoder
from models.rotary_bert import RotaryBertEncoder
from models.t5 import T5Encoder

MODULES = {"bert": BertEncoder, "modernbert": ModernBertEncoder, "rotary_bert": RotaryBertEncoder, "gpt2": GPT2Decoder,
           "llama": LlamaDecoder, "t5": T5Encoder}


def abstract_model(config: ModelConfig, *, attention_impl: str, dtype: str) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state of ShapeDtypeStructs): the model without allocating or initialising weights."""
    module = nnx.eval_shape(lambda: MODULES[config.family](config, attention_impl=attention_impl, dtype=dtype,
                                                          rngs=nnx.Rngs(0)))
    return nnx.split(module)


def param_shapes(config: ModelConfig) -> dict[str, Any]:
    """Nested dict (the Orbax/pure-dict layout) of jax.ShapeDtypeStruct for every parameter."""
    _, state = abstract_model(config, attention_impl="xla", dtype="float32")
    return nnx.to_pure_dict(state)


def flat_params(tree: dict[str, Any]) -> dict[str, Any]:
    """{'layers/0/attention/query/kernel': leaf, ...} of a nested parameter dict."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        flat["/".join(str(getattr(k, "key", k)) for k in path)] = leaf
    return flat


def every_param_shape(config: ModelConfig) -> dict[str, Any]:
    """flat_params of param_shapes(config) for all its layers, traced with two: layer 0 as itself and layer 1 for
    every later one (ModernBERT's layer 0 has no attention norm), so a config of hundreds of layers costs what two do."""
    traced = min(config.num_layers, 2)
    shapes = {}
    for name, spec in flat_params(param_shapes(dataclasses.replace(config, num_layers=traced))).items():
        if name.startswith("layers/"):
            _, index, rest = name.split("/", 2)
            layers = range(1) if index == "0" else range(1, config.num_layers)
            shapes.update({f"layers/{i}/{rest}": spec for i in layers})
        else:
            shapes[name] = spec
    return shapes


def check_param_shapes(params: dict[str, Any], config: ModelConfig, where: str) -> None:
    """Raise ValueError naming the first parameter missing, extra, or of the wrong shape/dtype."""
    want, got = flat_params(param_shapes(config)), flat_params(params)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise ValueError(f"{where}: parameters do not match the {config.family} config "
                         f"(missing {missing[:5]}, unexpected {extra[:5]})")
    for name, spec in want.items():
        array = got[name]
        if tuple(array.shape) != tuple(spec.shape) or np.dtype(array.dtype) != np.dtype(spec.dtype):
            raise ValueError(f"{where}: parameter {name} is {array.dtype}{list(array.shape)}, the config "
                             f"needs {np.dtype(spec.dtype)}{list(spec.shape)}; the weights were saved with other "
                             "sizes than config.json names (check its hidden, head, key/value head, intermediate "
                             "and vocabulary sizes)")
