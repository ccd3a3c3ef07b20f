"""`DocTokenizer`: text -> model input windows, with the Hugging Face `tokenizers` library.

Holds batch encoding, the model's prompts (a sentence-transformers model's text before every document or query)
and the split of long documents into overlapping windows (each window a full model input with its special tokens
and prompt). Must not pad or pack rows (pipeline/stages/packing.py does) nor gather documents into lists
(pipeline/stages/preprocess.py does).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tokenizers

from models.errors import ModelLoadError

# What a prompt is put before (sentence-transformers' encode_document and encode_query): the texts docscore embeds
# as documents (documents, classify's label descriptions) and similarity's `query` fields
PROMPT_ROLES = ("document", "query")
NO_TOKENS = np.zeros(0, np.int32)


@dataclasses.dataclass
class EncodedDoc:
    """One document as model inputs: `windows` (int32 ids including special tokens, each at most
    max_len long), `n_tokens` (tokens of the text without specials), `truncated` (max_windows cut it)."""

    windows: list[np.ndarray]
    n_tokens: int
    truncated: bool


MIN_SEQ_LEN = 8  # the shortest window docscore runs or converts a model for: a few tokens beside the special ones


class DocTokenizer:
    """A tokenizer.json tokenizer whose own truncation and padding are switched off: long texts are
    windowed here, never silently cut."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, max_seq_len: int, path: str = "tokenizer.json",
                 prompts: dict[str, str] | None = None):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._max_seq_len = int(max_seq_len)
        self.path = path
        self.prefix, self.suffix = _special_tokens_around_text(tokenizer)
        self.prompts = {role: text for role, text in (prompts or {}).items() if text}  # PROMPT_ROLES -> its text
        self._prompt_ids = {role: self.encode_ids([text])[0] for role, text in self.prompts.items()}

    @classmethod
    def from_str(cls, text: str, *, max_seq_len: int, path: str = "tokenizer.json",
                 prompts: dict[str, str] | None = None) -> "DocTokenizer":
        try:
            tokenizer = tokenizers.Tokenizer.from_str(text)
        except (AttributeError, TypeError, ImportError, NameError) as err:  # the library, not the file
            raise ModelLoadError(f"{path}: the installed tokenizers {getattr(tokenizers, '__version__', '?')} cannot "
                                 f"read tokenizer files as docscore calls it ({type(err).__name__}: {err}); install "
                                 "the tokenizers version docscore pins (setup.py)") from None
        except Exception as err:  # the Rust parser raises a bare Exception
            raise ModelLoadError(f"{path}: not a Hugging Face tokenizers file ({err}); save a fast "
                                 "tokenizer with tokenizer.save_pretrained or Tokenizer.save") from None
        return cls(tokenizer, max_seq_len=max_seq_len, path=path, prompts=prompts)

    def with_prompts(self, overrides: dict[str, str]) -> "DocTokenizer":
        """This tokenizer with some roles' prompts replaced (a run's --document_prompt, --query_prompt; "" removes
        one), the other roles' kept."""
        return DocTokenizer(self._tokenizer, max_seq_len=self._max_seq_len, path=self.path,
                            prompts={**self.prompts, **overrides})

    @property
    def max_seq_len(self) -> int:
        """Longest model input (special tokens included) this model was trained for."""
        return self._max_seq_len

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return self._tokenizer

    @property
    def n_special(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def max_token_id(self) -> int:
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values())

    def check_vocab(self, vocab_size: int, config_path: str) -> None:
        """Raise ModelLoadError when this tokenizer can emit ids the model has no embedding for."""
        top = self.max_token_id()
        if top >= vocab_size:
            raise ModelLoadError(
                f"{self.path}: tokenizer does not match the model vocabulary: it emits ids up to {top} "
                f"but {config_path} has vocab_size {vocab_size}; use the tokenizer.json the model "
                "was trained with")

    def encode_ids(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text, without special tokens (fast batch encoding)."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def prompt_tokens(self, role: str | None) -> int:
        """Tokens of `role`'s prompt (PROMPT_ROLES; None or a role without one: 0), which each of its windows holds
        beside the special tokens (at most: a text may take the prompt's last token into its own first)."""
        return len(self._prompt_ids.get(role, NO_TOKENS)) if role else 0

    def prompted_ids(self, texts: list[str], role: str | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(prompt ids, text ids) of each text with `role`'s prompt before it (None: no prompt). The prompt and text
        are tokenised together, as sentence-transformers does, and split where their ids leave the prompt's own
        ("query: " + "how": the space joins the text's first token), so prompt + text ids are exactly the
        joint tokenisation."""
        prompt = self.prompts.get(role, "") if role else ""
        if not prompt:
            return [(NO_TOKENS, ids) for ids in self.encode_ids(texts)]
        alone = self._prompt_ids[role]
        pairs = []
        for joint in self.encode_ids([prompt + text for text in texts]):
            shared = min(len(joint), len(alone))
            split = next((i for i in range(shared) if joint[i] != alone[i]), shared)
            pairs.append((joint[:split], joint[split:]))
        return pairs

    def encode_windows(self, texts: list[str], *, max_len: int | None = None, stride: int = 0,
                       max_windows: int | None = None, role: str | None = None) -> list[EncodedDoc]:
        """Each text as windows of at most `max_len` tokens (specials included); consecutive windows
        overlap by `stride` text tokens (HF semantics); at most `max_windows` windows per text. With `role`
        (PROMPT_ROLES), each window starts with that role's prompt, if the model has one."""
        return [self.windows(ids, max_len=max_len, stride=stride, max_windows=max_windows, lead=lead)
                for lead, ids in self.prompted_ids(texts, role)]

    def windows(self, ids: np.ndarray, *, max_len: int | None = None, stride: int = 0,
                max_windows: int | None = None, lead: np.ndarray = NO_TOKENS) -> EncodedDoc:
        """encode_windows of a text given as its token ids (encode_ids; pieces of one text concatenated), each
        window's text after `lead` (the prompt's ids, prompted_ids)."""
        max_len = self._max_seq_len if max_len is None else int(max_len)
        content = max_len - self.n_special - len(lead)
        if max_len > self._max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds this model's max_seq_len {self._max_seq_len}; "
                             f"use a window length <= {self._max_seq_len}")
        if content < 1:
            raise ValueError(f"max_len={max_len} leaves no room for text after {self.n_special} special tokens"
                             + (f" and a prompt of {len(lead)}" if len(lead) else ""))
        if not 0 <= stride < content:
            raise ValueError(f"stride={stride} must be >= 0 and < {content} (max_len minus special tokens and prompt), "
                             "or windows would never advance")
        if max_windows is not None and max_windows < 1:
            raise ValueError(f"max_windows={max_windows} must be >= 1 or None (no limit)")
        windows, start, truncated = [], 0, False
        while True:
            windows.append(np.concatenate([self.prefix, lead, ids[start:start + content], self.suffix]))
            if start + content >= len(ids):
                break
            if max_windows is not None and len(windows) == max_windows:
                truncated = True
                break
            start += content - stride
        return EncodedDoc(windows=windows, n_tokens=int(len(ids)), truncated=truncated)


def _special_tokens_around_text(tokenizer: tokenizers.Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The special token ids the post-processor puts before and after a single text."""
    encoding = tokenizer.encode("a", add_special_tokens=True)
    in_text = [i for i, sequence in enumerate(encoding.sequence_ids) if sequence is not None]
    ids = np.asarray(encoding.ids, dtype=np.int32)
    if not in_text:  # the probe text vanished (a vocabulary without it): all specials go first
        return ids, np.zeros(0, np.int32)
    return ids[:in_text[0]], ids[in_text[-1] + 1:]
