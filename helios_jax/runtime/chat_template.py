"""Chat templates rendered as Hugging Face renders them, with user text kept out of control tokens.

A model folder's chat template is jinja source from the Hub: untrusted code. It is compiled in
jinja2's `ImmutableSandboxedEnvironment` with the globals and filters transformers gives it
(`raise_exception`, `strftime_now`, a JSON `tojson` that does not escape HTML, `namespace`
refusing underscore names, loop controls, ``{% generation %}`` blocks), so a template renders
here exactly as ``tokenizer.apply_chat_template(..., tokenize=False)`` renders it.

Control tokens in user text (docs/chat-templates.md), the scheme of transformers'
``sanitize_control_tokens``:

  1. `mark_control_tokens`: every control token found in a message's strings (and in the
     template kwargs) is wrapped in two private-use characters before rendering:
     ``"<|im_start|>"`` -> ``"\\U000f0000<|im_start|>\\U000f0001"``; any such character the user
     typed is removed first, so a marked token cannot be forged.
  2. the template renders the marked messages; its own markup is never marked.
  3. `encode_marked`: the rendering is split at the markers; unmarked text is encoded with
     added tokens parsed (the template's ``<|im_start|>`` becomes its id), each marked token is
     encoded as plain text (``<``, ``|``, ``im``, ...), never as the control token's id.

The control tokens are the tokenizer's special added tokens, plus its other added tokens that
the template's literal text contains (``<think>`` for Qwen3), or exactly the folder's
``chat_control_tokens`` when it lists them.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import tokenizers

MARK_START, MARK_END = "\U000f0000", "\U000f0001"

# The fallbacks when a model folder has no template: ChatML for a vocabulary with its markers
# (the Qwen family, the embedded model), else a plain "role: content" rendering.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


class _GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag) renders its
    body unchanged; templates that mark their assistant turns with it compile here too."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """A `namespace()` that refuses underscore-prefixed names (no reach into Python internals)."""

    def __init__(*args, **kwargs):  # noqa: N805 -- jinja2's Namespace signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled in a sandbox with transformers' environment (cached by source)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlocks, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def template_literal_text(source: str) -> str:
    """The template's literal text and string constants, joined by NULs so that a search for a
    token cannot match across two of them."""
    ast = compile_template(source).environment.parse(source)
    literals = {node.data for node in ast.find_all(jinja2.nodes.TemplateData)}
    literals |= {node.value for node in ast.find_all(jinja2.nodes.Const) if isinstance(node.value, str)}
    return "\0".join(sorted(literals))


def control_tokens(
    tokenizer: tokenizers.Tokenizer, source: str, listed: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The added tokens that user text must never produce: the special ones, plus `listed`
    (the folder's ``chat_control_tokens``) or, when nothing is listed, the non-whitespace
    added tokens the template's literal text contains."""
    added = tokenizer.get_added_tokens_decoder().values()
    if listed is not None:
        chosen = set(listed)
        return tuple(t.content for t in added if t.special or t.content in chosen)
    literal = template_literal_text(source)
    return tuple(t.content for t in added if t.special or (t.content in literal and not t.content.isspace()))


def control_token_patterns(tokens: Iterable[str]) -> tuple[re.Pattern, re.Pattern]:
    """A regex matching any of `tokens` (longest first, so a token wins over one it contains),
    and one matching a marked token (captured) or a lone marker."""
    longest_first = sorted(set(tokens), key=len, reverse=True)
    tokens_re = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")  # (?!) never matches
    markers_re = re.compile(f"{MARK_START}({tokens_re.pattern}){MARK_END}|[{MARK_START}{MARK_END}]")
    return tokens_re, markers_re


def mark_control_tokens(obj, tokens_re: re.Pattern):
    """`obj` (a string, or dicts and lists of them) with every control token in its strings
    wrapped in markers; markers already present are removed first. Dict keys are not marked."""
    if isinstance(obj, str):
        obj = obj.replace(MARK_START, "").replace(MARK_END, "")
        return tokens_re.sub(f"{MARK_START}\\g<0>{MARK_END}", obj)
    if isinstance(obj, Mapping):
        return {key: mark_control_tokens(value, tokens_re) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [mark_control_tokens(value, tokens_re) for value in obj]
    return obj
