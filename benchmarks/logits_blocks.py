"""A decoder's log-softmax in blocks of positions (models/heads.py) against the whole call's logits at once:
GPT-2-shaped (vocabulary 50,257), 2 layers, random weights, 8 rows x 1024 tokens, seconds per call, both
interleaved twice in one process. Run: .venv/bin/python benchmarks/logits_blocks.py"""
import time, jax, jax.numpy as jnp
from models import heads
from models.config import config_from_hf
from models.architecture import abstract_model
from models.loader import token_logprobs_program
cfg = config_from_hf({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 2, "n_head": 12, "n_positions": 1024})
g, shapes = abstract_model(cfg, attention_impl="xla", dtype="float32")
state = jax.tree.map(lambda x: jax.random.normal(jax.random.key(0), x.shape, x.dtype) * 0.02, shapes)
ids = jax.random.randint(jax.random.key(1), (8, 1024), 0, 50257); seg = jnp.ones((8, 1024), jnp.int32)
res = {}
for name, b in (("blocked", heads.LOGITS_BLOCK_BYTES), ("whole", 2**40), ("blocked2", heads.LOGITS_BLOCK_BYTES), ("whole2", 2**40)):
    heads.LOGITS_BLOCK_BYTES = b
    f = jax.jit(lambda s, i, q: token_logprobs_program(g, s, i, q))
    f(state, ids, seg).block_until_ready()
    t = time.perf_counter()
    for _ in range(3): out = f(state, ids, seg).block_until_ready()
    res[name] = (time.perf_counter() - t) / 3; print(name, round(res[name], 3), heads.logits_block_positions(8, 1023, 50257), flush=True)
