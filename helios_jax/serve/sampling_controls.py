"""vLLM's sampling controls on the wire: penalties, logit_bias, min_p, min_tokens, allowed ids,
bad words (both endpoints). Each bad value is a 400 naming the field; the engine applies them on
the device (`programs/processors.py`).

- presence_penalty, frequency_penalty: numbers in [-2, 2] (OpenAI's range);
- repetition_penalty: a number > 0 (vLLM's; 1 is off);
- logit_bias: {token id as a string: bias in [-100, 100]}, ids inside the vocabulary, at most
  `api.MAX_LOGIT_BIAS` entries;
- min_p in [0, 1]; min_tokens an integer from 0 to the request's max_tokens;
- allowed_token_ids: a nonempty list of ids inside the vocabulary;
- bad_words: strings, tokenized as vLLM does (the word, and with a leading space when that is
  another token sequence of the same length); a word of one token is banned on the device
  (``bad_token_ids``), a word of several tokens on the host (``bad_word_sequences``: its last
  token is masked out whenever the output ends with its other tokens, ``runtime/bad_words.py``).
"""

from __future__ import annotations

from helios_jax.runtime.api import MAX_LOGIT_BIAS, Tokenizer
from helios_jax.serve.openai_errors import bad_request


def controls(body, tokenizer: Tokenizer, max_tokens: int) -> dict:
    """The SamplingParams fields of `body`'s controls (absent: off)."""
    out: dict = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value is not None:
            if not -2 <= value <= 2:
                raise bad_request(f"'{name}' must lie in [-2, 2], got {value}", param=name)
            out[name] = float(value)
    if body.repetition_penalty is not None:
        if body.repetition_penalty <= 0:
            raise bad_request(
                f"'repetition_penalty' must be > 0, got {body.repetition_penalty}", param="repetition_penalty"
            )
        out["repetition_penalty"] = float(body.repetition_penalty)
    if body.min_p is not None:
        if not 0 <= body.min_p <= 1:
            raise bad_request(f"'min_p' must lie in [0, 1], got {body.min_p}", param="min_p")
        out["min_p"] = float(body.min_p)
    if body.min_tokens is not None:
        if not 0 <= body.min_tokens <= max_tokens:
            raise bad_request(
                f"'min_tokens' must be from 0 to max_tokens ({max_tokens}), got {body.min_tokens}",
                param="min_tokens",
            )
        out["min_tokens"] = body.min_tokens
    vocab = getattr(tokenizer, "vocab_size", None)
    if body.logit_bias:
        out["logit_bias"] = _logit_bias(body.logit_bias, vocab)
    if body.allowed_token_ids is not None:
        out["allowed_token_ids"] = _ids(body.allowed_token_ids, vocab, "allowed_token_ids")
    if body.bad_words:
        out["bad_token_ids"], out["bad_word_sequences"] = _bad_words(body.bad_words, tokenizer)
        if "allowed_token_ids" in out and not set(out["allowed_token_ids"]) - set(out["bad_token_ids"]):
            raise bad_request("every allowed token is a bad word", param="bad_words")
    return out


def _ids(ids: list[int], vocab: int | None, param: str) -> tuple[int, ...]:
    if not ids:
        raise bad_request(f"'{param}' must not be empty", param=param)
    for t in ids:
        if t < 0 or (vocab is not None and t >= vocab):
            bound = f" below {vocab}" if vocab is not None else ""
            raise bad_request(f"'{param}': token ids must be integers from 0{bound}, got {t}", param=param)
    return tuple(dict.fromkeys(ids))


def _logit_bias(bias: dict, vocab: int | None) -> tuple[tuple[int, float], ...]:
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(
            f"'logit_bias' holds at most {MAX_LOGIT_BIAS} entries, got {len(bias)}", param="logit_bias"
        )
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request(
                f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias"
            ) from None
        if token < 0 or (vocab is not None and token >= vocab):
            raise bad_request(f"'logit_bias': token id {token} outside the vocabulary", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad_request(
                f"'logit_bias' values must be numbers in [-100, 100], got {value!r}", param="logit_bias"
            )
        out.append((token, float(value)))
    return tuple(out)


def _bad_words(words: list[str], tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(banned tokens of single-token words, token sequences of multi-token words), from vLLM's
    two spellings of each word: the word without leading spaces, and with one leading space when
    that is as many tokens and starts with another token."""
    encode = getattr(tokenizer, "encode_plain", tokenizer.encode)
    spellings: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(encode(word.lstrip()))
        if not bare:
            raise bad_request("bad_words must not be empty or blank", param="bad_words")
        spaced = tuple(encode(" " + word.lstrip()))
        spellings.append(bare)
        if len(spaced) == len(bare) and spaced[0] != bare[0]:
            spellings.append(spaced)
    single = tuple(dict.fromkeys(s[0] for s in spellings if len(s) == 1))
    return single, tuple(dict.fromkeys(s for s in spellings if len(s) > 1))
