"""Rotary positions as transformers computes them: the settings read from config.json (Rope) and the cos/sin tables.

Reading: rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x) into a Rope, refusing the scalings not
computed here. Computing: each type's inverse frequencies, and the (cos, sin) tables at each token's position within
its packed segment, which models/llama.py's attention (and so ModernBERT's and rotary BERT's) applies to q and k.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from models.config_values import LAYER_TYPES, positive_number, shown
from models.errors import ModelLoadError
from models.layers import positions_in_segments, segment_lengths

# Rotary scalings docscore computes (Llama family, rotary BERT) exactly as transformers does; others (dynamic, ...)
# are refused by name.
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# YaRN's ramp bounds in rotations where a config leaves beta_fast / beta_slow out, null or 0 (transformers' `or 32`)
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
# The model types whose transformers attention rotates only a head's first int(head_dim * partial_rotary_factor)
# dimensions and passes the rest through (Phi3's apply_rotary_pos_emb slices q and k by cos's width); every other
# Llama-family attention rotates whole heads: transformers 5.24 fails there on a smaller factor with a scaled rope type
# (cos narrower than q) and ignores it with the default one
PARTIAL_ROTARY_MODEL_TYPES = ("phi3",)


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary position settings of a Llama-family config (hashable: it is static model structure)."""

    theta: float = 10_000.0
    kind: str = "default"              # one of ROPE_TYPES
    factor: float = 1.0                # linear, llama3 and yarn
    low_freq_factor: float = 1.0       # llama3
    high_freq_factor: float = 4.0      # llama3
    original_max_positions: int = 0    # llama3, yarn, longrope: the context the model was pretrained on
    attention_factor: float = 1.0      # yarn, longrope: multiplies cos and sin, as transformers' attention_scaling
    beta_fast: float = YARN_BETA_FAST  # yarn: the ramp between extrapolated and interpolated frequencies, in rotations
    beta_slow: float = YARN_BETA_SLOW  # yarn
    truncate: bool = True              # yarn: the ramp's ends rounded outwards to whole dimensions
    short_factor: tuple[float, ...] = ()  # longrope: each frequency's divisor in a segment within original_max_positions
    long_factor: tuple[float, ...] = ()   # longrope: the same in a longer segment
    rotary_dim: int = 0                # phi3's partial_rotary_factor: only a head's first rotary_dim turn; 0: all


def layer_type_ropes(hf: dict[str, Any], thetas: dict[str, tuple[str | None, float]], model: str,
                     head_dim: Any) -> dict[str, Rope]:
    """Each layer type's Rope, as Gemma3TextConfig and Olmo3Config read them: rope_parameters[type] (transformers
    5), over which a non-null rope_scaling (4.x) is laid for the global layers; a theta left out is read from the
    key thetas[type] names (Gemma 3: rope_theta for the global layers, rope_local_base_freq for the local ones; None:
    no key), else thetas[type]'s number. A yarn or longrope original_max_position_embeddings left out is
    max_position_embeddings (a top-level one is not read), and yarn always truncates. `model` names the model in a
    refusal."""
    params = hf.get("rope_parameters")
    if params is not None and (not isinstance(params, dict) or not all(kind in LAYER_TYPES for kind in params)):
        raise ModelLoadError(f"rope_parameters is {shown(params)}; {model}'s are per layer type "
                             f"({' and '.join(LAYER_TYPES)}), as transformers 5 saves them")
    params = params or {}
    for kind in LAYER_TYPES:
        if not isinstance(params.get(kind) or {}, dict):
            raise ModelLoadError(f"rope_parameters.{kind} is {shown(params[kind])}; expected a JSON object")
    params = {kind: dict(params.get(kind) or {}) for kind in LAYER_TYPES}
    field = {kind: "rope_parameters" for kind in LAYER_TYPES}
    scaling = hf.get("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise ModelLoadError(f"rope_scaling is {shown(scaling)}; expected a JSON object")
        if scaling:  # as transformers: rope_scaling updates the global layers' settings, rope_parameters or not
            params["full_attention"].update(scaling)
            field["full_attention"] = "rope_scaling"  # named as the file holds it
    ropes = {}
    for kind in LAYER_TYPES:
        key, default = thetas[kind]
        own = {"rope_theta": hf.get(key, default) if key else default, **params[kind]}
        # transformers reads yarn's truncate from rope_parameters itself, which holds the layer types here
        own.pop("truncate", None)
        try:
            ropes[kind] = read_rope({field[kind]: own, "max_position_embeddings": hf.get("max_position_embeddings")},
                                    head_dim)
        except ModelLoadError as err:
            raise ModelLoadError(f"{kind} layers: {err}") from None
    return ropes


def read_rope(hf: dict[str, Any], head_dim: Any = None, *, partial: bool = False) -> Rope:
    """Rope of `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4.x), read as transformers
    5 reads them (a non-empty rope_scaling wins over rope_parameters; a top-level
    original_max_position_embeddings wins over the one in the rope settings, which else defaults to
    max_position_embeddings); yarn's and longrope's attention factor is computed here as transformers' init
    functions compute it, and longrope's factor lists are checked against `head_dim` where it is known (against the
    rotated dimensions where `partial`: phi3 rotates a head's first int(head_dim * partial_rotary_factor) only; else
    any factor but 1 is refused). Refuses the scalings the decoder does not compute (dynamic, ...) naming the field
    and value."""
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}
    if not isinstance(params, dict):
        raise ModelLoadError(f"{field} is {shown(params)}; expected a JSON object")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ModelLoadError(f"{field} holds per-layer-type settings ({sorted(params)}); only one rotary "
                             "setting for all layers is supported")
    kind_key = rope_type_key(params)
    kind = params.get(kind_key, "default")
    if kind not in ROPE_TYPES:
        raise ModelLoadError(f"{field}.{kind_key} {shown(kind)} is not supported; docscore "
                             f"computes rotary positions of rope_type {', '.join(map(repr, ROPE_TYPES))} only")
    rotary_dim = _rotary_dim(hf, params, field, head_dim) if partial else _whole_heads(hf, params, field)
    def positive(key: str, value: Any) -> float:
        """A rope setting as a positive, finite number, or a refusal naming it (0, a negative or NaN value makes
        every rotary frequency, and so every score, NaN)."""
        return positive_number(f"{key} of rope_type {kind!r}", value)

    theta = positive("rope_theta", params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    if kind == "yarn" and theta == 1.0:
        raise ModelLoadError("rope_theta of rope_type 'yarn' is 1; it must be a positive, finite number other than 1 "
                             "(YaRN's correction range divides by ln(rope_theta))")
    try:
        if kind == "default":
            return Rope(theta=theta, rotary_dim=rotary_dim)
        if kind == "linear":
            return Rope(theta=theta, kind=kind, factor=positive(f"{field}.factor", params["factor"]),
                        rotary_dim=rotary_dim)
        original = int(positive("original_max_position_embeddings", hf.get("original_max_position_embeddings")
                                or params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))))
        if kind == "llama3":
            return Rope(theta=theta, kind=kind, factor=positive(f"{field}.factor", params["factor"]),
                        low_freq_factor=positive(f"{field}.low_freq_factor", params["low_freq_factor"]),
                        high_freq_factor=positive(f"{field}.high_freq_factor", params["high_freq_factor"]),
                        original_max_positions=original, rotary_dim=rotary_dim)
        if kind == "yarn":
            settings = _yarn(params, field, original, hf.get("max_position_embeddings"), positive)
        else:
            settings = _longrope(params, field, original, hf.get("max_position_embeddings"), head_dim, rotary_dim,
                                 positive)
        return Rope(theta=theta, kind=kind, original_max_positions=original, rotary_dim=rotary_dim, **settings)
    except KeyError as missing:
        raise ModelLoadError(f"{field} of rope_type {kind!r} lacks {missing}") from None


def _whole_heads(hf: dict[str, Any], params: dict[str, Any], field: str) -> int:
    """0 (every dimension of a head rotated) for a model whose attention rotates whole heads, or a refusal naming a
    partial_rotary_factor other than 1 in the rope settings, else at the top level (null: unset, as transformers
    reads it)."""
    where = field if params.get("partial_rotary_factor") is not None else None
    partial = params.get("partial_rotary_factor") if where else hf.get("partial_rotary_factor")
    if partial is not None and partial != 1.0:
        raise ModelLoadError(f"{f'{where}.' if where else ''}partial_rotary_factor {shown(partial)} is not supported; "
                             "docscore rotates every dimension of a head (1.0)")
    return 0


def _rotary_dim(hf: dict[str, Any], params: dict[str, Any], field: str, head_dim: Any) -> int:
    """How many of a head's first dimensions Phi-3 rotates (0: all of them), read as Phi3Config reads
    partial_rotary_factor: the rope settings' own (`field`, even null) over the top-level one, 1.0 when both are left
    out; int(head_dim * factor) as transformers' rope init functions compute it. A factor that is no number in (0, 1]
    (null too, which transformers fails on), or whose rotated dimensions are odd or fewer than 2, is refused naming
    its key."""
    own = "partial_rotary_factor" in params
    key = f"{field}.partial_rotary_factor" if own else "partial_rotary_factor"
    factor = params["partial_rotary_factor"] if own else hf.get("partial_rotary_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ModelLoadError(f"{key} is {shown(factor)}; it must be a number in (0, 1]: the share of each head's "
                             "dimensions rotary positions turn")
    if type(head_dim) is not int or head_dim < 1:
        return 0  # check_bounds refuses the head size itself
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2 or rotary_dim < 2:
        raise ModelLoadError(f"{key} {shown(factor)} rotates int(head_dim {head_dim} * {factor}) = {rotary_dim} "
                             "dimensions of each head; rotary positions turn pairs of dimensions, so it must give an "
                             "even number of at least 2")
    return 0 if rotary_dim == head_dim else rotary_dim


def rope_type_key(params: dict[str, Any]) -> str:
    """The key rope settings name their type by: rope_type, else transformers 4.x's type."""
    return "rope_type" if "rope_type" in params or "type" not in params else "type"


def _yarn(params: dict[str, Any], field: str, original: int, max_positions: Any,
          positive: Callable[[str, Any], float]) -> dict[str, Any]:
    """The Rope fields of a yarn setting as transformers' _compute_yarn_parameters reads them: factor (null:
    max_position_embeddings / original), attention_factor, else its mscale ratio, else 0.1 ln(factor) + 1 (1 for a
    factor <= 1), beta_fast and beta_slow (null or 0: 32 and 1), truncate (left out: true; null: false)."""
    factor = params["factor"]
    if factor is None:  # transformers' DeepSeek-V3 reading: the ratio of the context lengths
        factor = positive_number("max_position_embeddings", max_positions) / original
    else:
        factor = positive(f"{field}.factor", factor)
    attention, mscale, mscale_all_dim = (params.get(key) for key in ("attention_factor", "mscale", "mscale_all_dim"))
    if attention is not None:
        attention = positive(f"{field}.attention_factor", attention)
    elif mscale and mscale_all_dim:
        attention = (_yarn_mscale(factor, positive(f"{field}.mscale", mscale))
                     / _yarn_mscale(factor, positive(f"{field}.mscale_all_dim", mscale_all_dim)))
    else:
        attention = _yarn_mscale(factor)
    truncate = params.get("truncate", True)
    if truncate is not None and not isinstance(truncate, bool):
        raise ModelLoadError(f"{field}.truncate is {shown(truncate)}; it must be true or false")
    return dict(factor=factor, attention_factor=attention, truncate=bool(truncate),
                beta_fast=positive(f"{field}.beta_fast", params.get("beta_fast") or YARN_BETA_FAST),
                beta_slow=positive(f"{field}.beta_slow", params.get("beta_slow") or YARN_BETA_SLOW))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for `factor` (transformers' get_mscale, in Python floats as it computes it)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _longrope(params: dict[str, Any], field: str, original: int, max_positions: Any, head_dim: Any, rotary_dim: int,
              positive: Callable[[str, Any], float]) -> dict[str, Any]:
    """The Rope fields of a longrope setting as transformers' _compute_longrope_parameters reads them: short_factor
    and long_factor (one positive number per rotated pair of a head's dimensions: rotary_dim / 2 where only
    rotary_dim are rotated), attention_factor, else
    sqrt(1 + ln(factor) / ln(original)) for factor (left out or null: max_position_embeddings / original) above 1."""
    lists = {key: _rope_factors(f"{field}.{key}", params[key], head_dim, rotary_dim)
             for key in ("short_factor", "long_factor")}
    factor = params.get("factor")
    if factor is None:  # Phi-3's reading: the ratio of the context lengths
        factor = positive_number("max_position_embeddings", max_positions) / original
    else:
        factor = positive(f"{field}.factor", factor)
    attention = params.get("attention_factor")
    if attention is not None:
        attention = positive(f"{field}.attention_factor", attention)
    elif factor <= 1.0:
        attention = 1.0
    elif original < 2:  # ln(1) = 0: transformers divides by zero
        raise ModelLoadError(f"original_max_position_embeddings is {original}; rope_type 'longrope' needs at least 2 "
                             "to compute its attention factor (or set attention_factor)")
    else:
        attention = math.sqrt(1 + math.log(factor) / math.log(original))
    return dict(attention_factor=attention, **lists)


def _rope_factors(key: str, values: Any, head_dim: Any, rotary_dim: int) -> tuple[float, ...]:
    """A longrope factor list as a tuple of positive, finite numbers, one per rotated pair of a head's dimensions:
    rotary_dim / 2 (phi3's partial rotary, as Phi3Config checks them), else head_dim / 2 where head_dim is a whole
    number (else check_bounds refuses it); or a refusal naming `key`."""
    if not isinstance(values, list):
        raise ModelLoadError(f"{key} is {shown(values)}; expected a list of positive numbers, one per rotated pair "
                             "of a head's dimensions")
    if rotary_dim and len(values) != rotary_dim // 2:
        raise ModelLoadError(f"{key} has {len(values)} entries; rope_type 'longrope' needs int(head_dim {head_dim} * "
                             f"partial_rotary_factor) / 2 = {rotary_dim // 2}, one per rotated pair of a head's "
                             "dimensions")
    if not rotary_dim and type(head_dim) is int and head_dim > 0 and len(values) != head_dim // 2:
        raise ModelLoadError(f"{key} has {len(values)} entries; rope_type 'longrope' needs head_dim / 2 = "
                             f"{head_dim // 2}, one per rotated pair of a head's dimensions")
    return tuple(positive_number(f"{key}[{i}]", value) for i, value in enumerate(values))


def rotary_width(rope: Rope, head_dim: int) -> int:
    """How many of a head's first dimensions rotary positions turn: Phi-3's partial rotary_dim, else all of them."""
    return rope.rotary_dim or head_dim


def rope_frequencies(rope: Rope, head_dim: int, *, long: bool = False) -> np.ndarray:
    """Inverse frequencies [rotary_width / 2] float32, computed as transformers' rope init functions do
    (default, linear, llama3, yarn, longrope; over int(head_dim * partial_rotary_factor) dimensions where only those
    turn), so the angles match theirs to the last bits that matter at 1e-4. longrope's are its short factors'
    (transformers' inv_freq), or with `long` its long factors'."""
    f32 = np.float32  # every step in float32 as torch does: one ulp of a frequency is 1e-4 rad at 4k positions
    dim = rotary_width(rope, head_dim)  # transformers' init functions take dim = int(head_dim * partial_rotary_factor)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
    # theta ** e rounded once to float32, which torch's vectorised powf gives in nearly every element
    powers = np.power(float(rope.theta), exponents.astype(np.float64)).astype(f32)
    if rope.kind == "longrope":  # each frequency divided by its own factor
        factors = np.asarray(rope.long_factor if long else rope.short_factor, dtype=f32)
        return (f32(1.0) / (factors * powers)).astype(np.float32)
    inv_freq = f32(1.0) / powers
    if rope.kind == "linear":
        inv_freq = inv_freq / f32(rope.factor)
    elif rope.kind == "llama3":  # long wavelengths divided by factor, short ones kept, the band between blended
        old, factor = f32(rope.original_max_positions), f32(rope.factor)
        low, high = f32(rope.low_freq_factor), f32(rope.high_freq_factor)
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (f32(1) / inv_freq) * f32(2 * math.pi)  # torch's scalar / tensor is reciprocal(tensor) * scalar
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = ((f32(1) / wavelen) * old - low) / (high - low)
        blended = (f32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, blended, scaled)
    elif rope.kind == "yarn":
        inv_freq = yarn_frequencies(rope, dim, powers)
    return inv_freq.astype(np.float32)


def yarn_frequencies(rope: Rope, dim: int, powers: np.ndarray) -> np.ndarray:
    """YaRN's inverse frequencies over `dim` rotated dimensions from theta ** (2i / dim) (`powers`), as transformers'
    _compute_yarn_parameters: the fast-rotating dimensions kept (extrapolated), the slow ones divided by factor
    (interpolated), a linear ramp between the dimensions that turn beta_fast and beta_slow times in the original
    context (its ends rounded outwards where truncate)."""
    f32 = np.float32

    def dimension(rotations: float) -> float:  # in Python floats, as transformers' find_correction_dim
        return (dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta))

    low, high = dimension(rope.beta_fast), dimension(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    extrapolated = f32(1) - ramp  # the share of each dimension kept as is
    return (f32(1.0) / (f32(rope.factor) * powers)) * (f32(1) - extrapolated) + (f32(1.0) / powers) * extrapolated


def rotary_tables(segment_ids: jax.Array, rope: Rope, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) [B, L, 1, rotary_width] float32 at each token's position within its segment, both times the rope's
    attention_factor (yarn, longrope) as transformers scales them. longrope's frequencies are chosen per segment: its
    long factors where the segment is longer than original_max_positions, which is what transformers gives that
    document encoded alone (it chooses once per call, by the batch's longest position), so a document's scores and
    embedding never depend on what it is packed or batched with."""
    positions = positions_in_segments(segment_ids).astype(jnp.float32)[:, :, None]
    angles = positions * jnp.asarray(rope_frequencies(rope, head_dim))[None, None, :]
    if rope.kind == "longrope":  # both tables at static shapes, then each token's by its segment's length
        long = (segment_lengths(segment_ids) > rope.original_max_positions)[:, :, None]
        angles = jnp.where(long, positions * jnp.asarray(rope_frequencies(rope, head_dim, long=True))[None, None, :],
                           angles)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if rope.attention_factor != 1.0:
        scale = jnp.float32(rope.attention_factor)
        cos, sin = cos * scale, sin * scale
    return cos, sin


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin over the last axis (the halves layout of Hugging Face checkpoints), on its
    first cos.shape[-1] dimensions only where the tables are narrower (Phi-3's partial rotary: the rest pass through
    unchanged, as transformers' Phi3 apply_rotary_pos_emb slices them)."""
    width = cos.shape[-1]
    turned, passed = x[..., :width], x[..., width:]
    half = width // 2
    rotated = jnp.concatenate([-turned[..., half:], turned[..., :half]], axis=-1)
    turned = turned * cos + rotated * sin
    return turned if width == x.shape[-1] else jnp.concatenate([turned, passed.astype(turned.dtype)], axis=-1)
