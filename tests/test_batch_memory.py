"""--batch_size checked against the memory there is before any data is read: the estimate of one model
call (pipeline/telemetry/memory.py) against what XLA's compiled programs report, the room (available RAM, a cgroup
limit, an accelerator's allocator), and `docscore run` exiting 2 naming --batch_size, the estimate, the
limit and a value that fits. Also the other run flags that were silently ignored: --shadow_fraction and
--shadow_tolerance out of range or without --shadow_attention."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from models.architecture import abstract_model
from models.config import config_from_hf
from models.loader import embed_packed_program, token_logprobs_program
from models import memory_room
from models.layers import stacked_abstract
from pipeline.telemetry import memory
from tests.conftest import TEST_BATCH, TEST_MAX_LEN, run_docscore

MINILM = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "max_position_embeddings": 512}
LONG_BERT = {**MINILM, "num_hidden_layers": 2, "max_position_embeddings": 2048}
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 2, "n_head": 12, "n_positions": 1024}
# ModernBERT-base's shapes in 3 layers (one global, two local): a gated MLP's gate, up and their product
MODERNBERT = {"model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 3,
              "num_attention_heads": 12, "intermediate_size": 1152, "max_position_embeddings": 8192, "local_attention": 128}


def compiled_bytes(config, attention: str, dtype: str, rows: int, length: int) -> int:
    """Arguments + outputs + temporaries of the model call's program as XLA compiles it (no weights needed), with
    the blocks stacked as LoadedModel's programs receive them."""
    graphdef, state = stacked_abstract(*abstract_model(config, attention_impl=attention, dtype=dtype))
    if config.is_encoder:
        call = jax.jit(lambda s, i, g: embed_packed_program(graphdef, s, i, g, max(1, length // 8)))
    else:
        call = jax.jit(lambda s, i, g: token_logprobs_program(graphdef, s, i, g))
    ids = jax.ShapeDtypeStruct((rows, length), jnp.int32)
    stats = call.lower(state, ids, ids).compile().memory_analysis()
    return stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes


@pytest.mark.integration
@pytest.mark.parametrize("hf, attention, dtype, rows, length", [
    (MINILM, "xla", "float32", 16, 256),      # the CPU default
    (MINILM, "xla", "bfloat16", 128, 256),    # scores dominate
    (MINILM, "xla", "float32", 256, 64),      # short packed rows
    (LONG_BERT, "xla", "float32", 4, 2048),   # [L, L] scores of long rows
    (LONG_BERT, "blockwise", "float32", 4, 2048),  # one block of scores at a time
    (GPT2, "xla", "float32", 4, 256),         # the [rows, L, vocab] logits dominate
    (GPT2, "xla", "float32", 16, 1024),       # logits of 3.3 GB: a block of positions at a time
    (MODERNBERT, "blockwise", "float32", 2, 2048),  # no [L, L] scores: the gated MLP's intermediates weigh
    (MODERNBERT, "xla", "bfloat16", 16, 256),
], ids=["minilm-16x256", "minilm-bf16-128x256", "minilm-256x64", "long-xla", "long-blockwise", "gpt2-4x256",
        "gpt2-blocked-16x1024", "modernbert-blockwise-2x2048", "modernbert-bf16-16x256"])
def test_the_estimate_is_close_to_what_xla_compiles(hf, attention, dtype, rows, length):
    if jax.default_backend() != "cpu":
        pytest.skip("calibrated against XLA:CPU's buffer assignment")
    config = config_from_hf(hf)
    estimate = memory.call_estimate(config, batch_size=rows, seq_len=length, dtype=dtype, attention=attention)
    ratio = estimate.total / compiled_bytes(config, attention, dtype, rows, length)
    assert 0.8 <= ratio <= 1.5, ratio


def _loaded_parameters(loaded) -> int:
    return sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))


def test_parameter_count_is_the_loaded_minilms(minilm):
    assert memory.parameter_count(minilm.config) == _loaded_parameters(minilm) == 22_565_376  # all-MiniLM-L6-v2 less its unused pooler


@pytest.mark.integration
@pytest.mark.parametrize("family", ["llama", "llama3", "mistral", "qwen2", "qwen3"])
def test_parameter_count_is_a_converted_llamas_and_transformers(family, tmp_path):
    """No position table, three MLP matrices, k/v over the kv heads, head_dim apart from hidden/heads (llama3),
    q/k/v biases (qwen2) or attention biases (llama3, qwen3), q/k norms (qwen3), tied (qwen2) or own LM head: the
    count of the config
    equals the converted model's parameters and transformers' own count of the same model."""
    import transformers

    import models
    from models.hf_import import convert_hf_dir
    from tests.test_models_llama import build_hf

    hf_dir = build_hf(tmp_path / "hf", family)
    convert_hf_dir(str(hf_dir), str(tmp_path / "docscore"))
    loaded = models.load(str(tmp_path / "docscore"), attention="native")
    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).num_parameters()  # tied counted once
    assert memory.parameter_count(loaded.config) == _loaded_parameters(loaded) == reference


def test_the_estimate_grows_with_rows_and_is_smaller_without_score_tensors():
    config = config_from_hf(LONG_BERT)
    one, many = (memory.call_estimate(config, batch_size=b, seq_len=2048, dtype="float32", attention="xla") for b in (1, 64))
    assert many.parameters == one.parameters and many.activations > 60 * one.activations
    flash = [memory.call_estimate(config, batch_size=64, seq_len=2048, dtype="float32", attention=k).activations
             for k in ("blockwise", "cudnn", "splash_tpu")]
    assert many.activations > 5 * flash[0] > 5 * flash[1]
    assert flash[2] == flash[1]  # splash, what auto runs on TPU, holds no [L, L] scores either


def test_todays_defaults_and_test_settings_fit_this_machine():
    config, room = config_from_hf(MINILM), memory_room.host_memory_room()
    for dtype in ("float32", "bfloat16"):
        for attention in ("xla", "blockwise"):
            assert memory.batch_size_problem(config, batch_size=16, seq_len=256, dtype=dtype, attention=attention,
                                             room=room) is None
    assert memory.batch_size_problem(config, batch_size=TEST_BATCH, seq_len=TEST_MAX_LEN, dtype="float32",
                                     attention="xla", room=room, concurrent_calls=2, model_copies=2) is None


def test_a_call_larger_than_the_room_names_the_flag_the_estimate_the_limit_and_a_value_that_fits():
    config, gib = config_from_hf(MINILM), 2**30
    room = memory_room.MemoryRoom(gib, "of the test's room")
    message = memory.batch_size_problem(config, batch_size=4096, seq_len=256, dtype="float32", attention="xla", room=room)
    assert message.startswith("--batch_size=4096: a model call of 4096 rows x 256 tokens needs about 36.0 GiB"), message
    assert "more than the 1.0 GiB of the test's room; use --batch_size=32 or less" in message, message
    fits = memory.call_estimate(config, batch_size=32, seq_len=256, dtype="float32", attention="xla").activations
    assert fits <= gib // 2 < memory.call_estimate(config, batch_size=64, seq_len=256, dtype="float32", attention="xla").activations
    # an accelerator: each of 8 devices holds an eighth of the rows, and the suggestion counts all of them
    device = memory_room.MemoryRoom(gib, "free on gpu:0", per_device=True)
    assert memory.batch_size_problem(config, batch_size=128, seq_len=256, dtype="float32", attention="xla", room=device,
                                     devices=8) is None
    message = memory.batch_size_problem(config, batch_size=4096, seq_len=256, dtype="float32", attention="xla",
                                        room=device, devices=8)
    assert "per device (8 devices share a call's rows)" in message and "use --batch_size=256 or less" in message, message
    # nothing fits: say what else to change
    message = memory.batch_size_problem(config, batch_size=8, seq_len=256, dtype="float32", attention="xla",
                                        room=memory_room.MemoryRoom(2**20, "left"))
    assert "even --batch_size=1 does not fit: use a shorter --max_seq_len or --attention=flash" in message, message
    assert "--direct_num_workers" not in message  # one call at a time: fewer workers would not help
    # many worker processes, each with its call and its copy of the model, where one alone fits: the message
    # leads with the workers, not with a --batch_size nobody set
    many = memory.batch_size_problem(config, batch_size=16, seq_len=256, dtype="float32", attention="xla",
                                     room=room, concurrent_calls=1000, model_copies=1000)
    assert memory.batch_size_problem(config, batch_size=16, seq_len=256, dtype="float32", attention="xla",
                                     room=room) is None
    assert many.startswith("--direct_num_workers: 1000 model calls at once of --batch_size=16 rows"), many
    assert "use fewer --direct_num_workers" in many, many
    # a few threads whose calls together do not fit at this batch size: a smaller --batch_size is the fix
    few = memory.batch_size_problem(config, batch_size=4096, seq_len=256, dtype="float32", attention="xla",
                                    room=room, concurrent_calls=2)
    assert few.startswith("--batch_size=4096") and "for 2 calls at once (--direct_num_workers)" in few, few


def test_the_room_is_the_cgroup_limit_when_that_is_smaller_than_available_ram(tmp_path):
    v2, v1, unlimited = tmp_path / "v2", tmp_path / "v1", tmp_path / "unlimited"
    for d in (v2, v1 / "memory", unlimited):
        d.mkdir(parents=True)
    (v2 / "memory.max").write_text(f"{3 * 2**30}\n")
    (v2 / "memory.current").write_text(f"{2**30}\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{2**28}\n")
    (unlimited / "memory.max").write_text("max\n")
    (unlimited / "memory.current").write_text("12345\n")
    assert memory_room.cgroup_memory_room(str(v2)).bytes == 2 * 2**30
    assert memory_room.cgroup_memory_room(str(v1)).bytes == 3 * 2**28
    assert memory_room.cgroup_memory_room(str(unlimited)) is None
    assert memory_room.cgroup_memory_room(str(tmp_path / "none")) is None
    room = memory_room.host_memory_room(str(v1))
    assert room.bytes == 3 * 2**28 and "cgroup memory limit" in room.source
    assert "available RAM" in memory_room.host_memory_room(str(unlimited)).source


def test_the_device_room_comes_from_the_allocator_where_jax_reports_one():
    room = memory.local_memory_room(jax.default_backend())
    if jax.default_backend() == "cpu":
        assert memory.device_memory_room(jax.local_devices()) is None  # XLA:CPU reports no memory stats
        assert room is not None and "available RAM" in room.source
    else:
        stats = jax.local_devices()[0].memory_stats()
        assert room.per_device and 0 < room.bytes <= stats["bytes_limit"]


@pytest.mark.parametrize("batch_size", [10**6, 10**9])
def test_docscore_run_refuses_a_batch_size_beyond_memory_before_reading_data(batch_size, corpus, tmp_path, capsys,
                                                                              no_data_read):
    """Before: the run read its data and failed out of memory in the first model call."""
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--run_id", "r1", "--attention", "native",
                      "--batch_size", batch_size)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--batch_size={batch_size}: a model call of {batch_size} rows x 256 tokens needs about" in err, err
    assert "more than the" in err and "use --batch_size=" in err, err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


# ---- --shadow_fraction / --shadow_tolerance: never silently ignored -----------------------------------

SHADOW_CASES = {
    "fraction_out_of_range_without_shadow": (["--shadow_fraction", "2"], "--shadow_fraction=2.0 must be in (0, 1]"),
    "fraction_zero_without_shadow": (["--shadow_fraction", "0"], "--shadow_fraction=0.0 must be in (0, 1]"),
    "fraction_nan": (["--shadow_fraction", "nan"], "--shadow_fraction=nan must be in (0, 1]"),
    "fraction_without_shadow": (["--shadow_fraction", "0.5"],
                                "--shadow_fraction=0.5 has no effect without --shadow_attention"),
    "tolerance_without_shadow": (["--shadow_tolerance", "0.001"],
                                 "--shadow_tolerance=0.001 has no effect without --shadow_attention"),
    "tolerance_negative_without_shadow": (["--shadow_tolerance", "-1"], "--shadow_tolerance=-1.0 must be > 0"),
    "fraction_out_of_range_with_shadow": (["--shadow_attention", "flash", "--shadow_fraction", "1.5"],
                                          "--shadow_fraction=1.5 must be in (0, 1]"),
}


@pytest.mark.parametrize("case", sorted(SHADOW_CASES))
def test_shadow_flags_out_of_range_or_without_shadow_attention_exit_2(case, corpus, tmp_path, capsys, no_data_read):
    flags, says = SHADOW_CASES[case]
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--run_id", "r1", "--attention", "native", *flags)
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    if "no effect" in says:
        assert "add --shadow_attention=KERNEL" in err, err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


@pytest.mark.integration
def test_a_decoders_logits_in_blocks_give_the_same_logprobs_in_a_fraction_of_the_memory(monkeypatch):
    """A decoder's log-softmax runs on blocks of positions when the whole call's logits are large: the same
    log-probabilities as one block (uneven blocks included), and XLA's compiled program holds a fraction of the
    [rows, L, vocab] logits."""
    from models import heads

    tiny = config_from_hf({**GPT2, "vocab_size": 1000, "n_embd": 64, "n_head": 4, "n_positions": 128})
    graphdef, shapes = abstract_model(tiny, attention_impl="xla", dtype="float32")
    state = jax.tree.map(lambda x: jax.random.normal(jax.random.key(0), x.shape, x.dtype) * 0.2, shapes)
    ids = jax.random.randint(jax.random.key(1), (3, 64), 0, 1000)
    segments = jnp.array([[1] * 40 + [2] * 20 + [0] * 4, [1] * 64, [1] * 10 + [0] * 54])
    whole = token_logprobs_program(graphdef, state, ids, segments)
    monkeypatch.setattr(heads, "LOGITS_BLOCK_BYTES", 4 * 1000 * 3 * 10)  # 10 positions a block: 63 = 6 x 10 + 3
    assert heads.logits_block_positions(3, 63, 1000) == 10
    blocked = token_logprobs_program(graphdef, state, ids, segments)
    assert float(jnp.abs(whole).max()) > 1.0
    assert jnp.allclose(blocked, whole, atol=1e-5, rtol=1e-5)
    assert not jnp.any(blocked[2, 9:]) and not jnp.any(blocked[0, 59:])  # padding and segment ends stay 0
    monkeypatch.undo()

    if jax.default_backend() != "cpu":
        return
    config, rows, length = config_from_hf(GPT2), 16, 1024
    logits = rows * length * config.vocab_size * 4
    assert heads.logits_block_positions(rows, length - 1, config.vocab_size) < length // 4
    assert compiled_bytes(config, "xla", "float32", rows, length) < logits
