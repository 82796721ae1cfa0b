"""Structured output: grammars compiled by xgrammar, one matcher per request.

A request's constraint travels as plain data, a :class:`GrammarSpec` (what the client asked for:
a JSON schema, any JSON, a regex, a list of choices or an EBNF grammar). The server checks it
(`GrammarSpec.check`: a bad schema or regex is a 400 before anything is submitted) and compiles it
with the engine's :class:`Grammars` (one ``xgrammar.GrammarCompiler`` over the engine's tokenizer
and the model's vocabulary, with a bounded cache) in its parsing worker thread, never on the
event loop or the engine's loop. The engine starts one :class:`RequestGrammar` per request from
the compiled grammar: it accepts every committed token, fills the next token's bitmask (int32
words, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed: xgrammar's layout) and
says when the grammar has terminated, which ends the request as a stop.

xgrammar is an optional dependency (the ``structured`` extra); it is imported on first use, so a
server without it starts and answers structured-output requests with a 400 naming the package
(:class:`GrammarUnavailable`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence

import numpy as np

XGRAMMAR = "xgrammar==0.2.9"
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
CACHE_BYTES = 64 << 20  # compiled grammars kept for reuse (xgrammar's cache, by size)


class GrammarUnavailable(RuntimeError):
    """xgrammar is not installed: structured output cannot be served."""

    def __init__(self):
        super().__init__(
            f"structured output needs the Python package xgrammar, which is not installed: pip install "
            f"'helios-jax[structured]' (or '{XGRAMMAR}'; docs/serving.md)"
        )


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise GrammarUnavailable() from None
    return xgrammar


def import_in_background() -> threading.Thread:
    """Import xgrammar in a daemon thread (when installed), so that the first structured-output
    request does not pay its import (it imports torch: seconds); a request that needs it meanwhile
    waits on the import lock as for any import."""

    def load() -> None:
        try:
            _xgrammar()
        except GrammarUnavailable:
            pass

    thread = threading.Thread(target=load, name="xgrammar-import", daemon=True)
    thread.start()
    return thread


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF whose language is exactly `choices` (vLLM's guided_choice): ``root ::= "a" | "b"``,
    each choice a JSON-escaped string literal (EBNF strings take JSON's escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
    """A structured-output constraint as the client gave it (hashable: the compile cache's key).

    Attributes:
      kind: ``json_schema`` (`source` the schema as JSON text), ``json_object`` (any JSON object
        or array; `source` empty), ``regex``, ``choice`` (`source` a JSON list of strings) or
        ``grammar`` (EBNF in xgrammar's dialect, GBNF-like).
      source: the constraint's text.
      any_whitespace: JSON kinds: any whitespace between elements (vLLM's default); False: the
        compact form (vLLM's ``disable_any_whitespace``).
    """

    kind: str
    source: str = ""
    any_whitespace: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def ebnf_source(self) -> str | None:
        """The EBNF of a grammar or choice constraint (None for the others)."""
        if self.kind == "choice":
            return choice_grammar(json.loads(self.source))
        return self.source if self.kind == "grammar" else None

    def check(self) -> None:
        """Parse the constraint without a tokenizer; ValueError saying what is wrong with it.

        Raises:
          GrammarUnavailable: xgrammar is not installed.
        """
        xgr = _xgrammar()
        try:
            if self.kind == "json_schema":
                xgr.Grammar.from_json_schema(self.source, any_whitespace=self.any_whitespace)
            elif self.kind == "regex":
                xgr.Grammar.from_regex(self.source)
            elif self.kind in ("choice", "grammar"):
                xgr.Grammar.from_ebnf(self.ebnf_source())
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar raises RuntimeError
            raise ValueError(f"invalid {self.kind}: {_reason(e)}") from None


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix (``[time] file:line: ``)."""
    text = str(error).strip()
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
    return text


class Grammars:
    """Compiles :class:`GrammarSpec`s for one engine's tokenizer and vocabulary (thread-safe).

    The xgrammar ``TokenizerInfo`` is built on first use from the tokenizer's vocabulary (padded
    to the model's `vocab_size`: the programs' logits, and so the mask, span the model's rows),
    with the engine's EOS ids as the grammar's stop tokens and the vocabulary's encoding (byte
    level or not) read from the tokenizer's own description, as xgrammar reads a Hugging Face
    fast tokenizer's.
    """

    def __init__(
        self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int], cache_bytes: int = CACHE_BYTES
    ):
        self._tokenizer = tokenizer  # runtime.tokenizer.HFTokenizer (its `backend` tokenizers.Tokenizer)
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.cache_bytes = cache_bytes
        self._compiler = None
        self._lock = threading.Lock()

    @property
    def mask_words(self) -> int:
        """int32 words of one token bitmask."""
        return (self.vocab_size + 31) // 32

    def _compiler_or_build(self):
        with self._lock:
            if self._compiler is None:
                xgr = _xgrammar()
                backend = self._tokenizer.backend
                encoded = [""] * self.vocab_size
                for token, index in backend.get_vocab(with_added_tokens=True).items():
                    if index < self.vocab_size:
                        encoded[index] = token
                meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
                info = xgr.TokenizerInfo(
                    encoded,
                    vocab_type=meta["vocab_type"],
                    vocab_size=self.vocab_size,
                    stop_token_ids=list(self.stop_token_ids) or None,
                    add_prefix_space=meta["add_prefix_space"],
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=self.cache_bytes)
            return self._compiler

    def compile(self, spec: GrammarSpec) -> CompiledConstraint:
        """The compiled constraint of `spec` (xgrammar caches compilations up to `cache_bytes`).

        Raises:
          ValueError: the constraint does not parse (the message says why).
          GrammarUnavailable: xgrammar is not installed.
        """
        compiler = self._compiler_or_build()
        try:
            if spec.kind == "json_schema":
                compiled = compiler.compile_json_schema(spec.source, any_whitespace=spec.any_whitespace)
            elif spec.kind == "json_object":
                compiled = compiler.compile_builtin_json_grammar()
            elif spec.kind == "regex":
                compiled = compiler.compile_regex(spec.source)
            else:
                compiled = compiler.compile_grammar(spec.ebnf_source())
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"invalid {spec.kind}: {_reason(e)}") from None
        return CompiledConstraint(spec, compiled, self.mask_words)


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledConstraint:
    """A compiled grammar, shared by every request (and every choice) that asked for it."""

    spec: GrammarSpec
    compiled: object  # xgrammar.CompiledGrammar
    mask_words: int

    def start(self) -> RequestGrammar:
        """A fresh matcher at the start of the output."""
        return RequestGrammar(_xgrammar().GrammarMatcher(self.compiled), self.mask_words)


class RequestGrammar:
    """One request's position in its grammar (the engine's loop thread only)."""

    def __init__(self, matcher, mask_words: int):
        self._matcher = matcher
        self.mask_words = mask_words
        self.accepted = 0  # tokens accepted so far

    def accept(self, tokens: Sequence[int]) -> None:
        """Advance over committed `tokens`; ValueError for one the grammar forbids (the mask
        allowed it, so a mask was not applied), after which the matcher stays where it was."""
        for i, token in enumerate(tokens):
            if not self._matcher.accept_token(int(token)):
                self.rollback(i)
                raise ValueError(f"token {int(token)} violates the request's grammar")
            self.accepted += 1

    def rollback(self, count: int) -> None:
        """Forget the last `count` accepted tokens."""
        if count:
            self._matcher.rollback(count)
            self.accepted -= count

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing more may follow."""
        return bool(self._matcher.is_terminated())

    def next_token_mask(self) -> np.ndarray:
        """i32[mask_words]: the tokens allowed next (all bits set when nothing is restricted)."""
        words = np.full((1, self.mask_words), -1, dtype=np.int32)
        self._matcher.fill_next_token_bitmask(words)
        return words[0]


def allowed_tokens(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool[vocab_size] of an i32 bitmask (xgrammar's layout): a reference for tests and tools."""
    bits = np.unpackbits(np.ascontiguousarray(words, dtype="<i4").view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)
