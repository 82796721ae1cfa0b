"""The embedded default model, and a greedy speculative decoding loop that measures its MTP head.

The package ships a tiny Qwen3 checkpoint with an MTP draft head, trained by
`scripts/train_tiny.py` on the Python standard library's sources (docs/default-model.md):

    folder = default_model_path()          # helios_jax/assets/default_model
    model = load_default_model()           # LoadedModel: config, params, tokenizer

`greedy_speculative_decode` is the measurement behind "speculation pays": a straightforward
cache-free loop over the pure forwards, one round per target forward.

    round (verified tokens x_0..x_{p+1}; x_{p+1} is pending, chosen by the target):
      drafts   step k = 0..D-1 runs the head over the draft context, whose entry at i <= p is
               (h_i, x_{i+1}) and whose entry at p + j (1 <= j <= k) is (g_{p+j-1}, d_{p+j+1}),
               exactly what `draft_proposals` keeps in its paged cache; step k drafts d_{p+k+2}
      verify   one target forward over x_0..x_{p+1}, d_{p+2}..d_{p+D+1} gives the greedy tokens
               y_{p+2}..y_{p+D+2}; the drafts are accepted up to the first mismatch (a of them),
               and y_{p+a+2} becomes the next pending token
      so a round adds a + 1 tokens for one target forward, and the output equals plain greedy
      decoding token for token.

Every call runs on a fixed-length buffer (causal attention makes the padding after the context
irrelevant), so one compilation serves a whole measurement. The paged serving path
(`forward_packed`, `helios_jax.programs.proposals.draft_proposals`) computes the same drafts:
tests/model/test_mtp.py holds the paged oracle `reference/mtp.py: paged_proposals` to the naive one,
and tests/programs/test_speculative.py holds `draft_proposals` to the paged oracle.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.model.checkpoint import LoadedModel, load_checkpoint
from helios_jax.model.config import ModelConfig
from helios_jax.model.forward import compute_logits, draft_forward_full, forward_full
from helios_jax.model.qwen3 import Params

DEFAULT_MODEL_DIR = ("assets", "default_model")


def default_model_path() -> pathlib.Path:
    """The packaged default model folder (config.json, model.safetensors, tokenizer.json).

    Raises:
      FileNotFoundError: the package was installed without its assets, or from a zip archive
        (the loader needs real files).
    """
    resource = importlib.resources.files("helios_jax").joinpath(*DEFAULT_MODEL_DIR)
    path = pathlib.Path(str(resource))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the default model is missing at {path}: the package was installed without "
            "helios_jax/assets (package_data) or is not on a file system"
        )
    return path


def load_default_model(dtype: str | None = None) -> LoadedModel:
    """Loads the packaged default model.

    Args:
      dtype: "float32" or "bfloat16" to override the shipped dtype (bfloat16). On a CPU,
        "float32" is faster and computes with the same (bf16-rounded) weights.
    """
    return load_checkpoint(default_model_path(), dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Greedy speculative decoding (measurement loop)


@dataclasses.dataclass(frozen=True)
class SpeculationStats:
    """Accepted drafts per round of greedy speculative decoding at a fixed depth.

    Attributes:
      depth: drafts proposed per round (D).
      accepted: drafts accepted in each round, 0..D; a round is one target forward.
    """

    depth: int
    accepted: tuple[int, ...]

    def __add__(self, other: SpeculationStats) -> SpeculationStats:
        if other.depth != self.depth:
            raise ValueError(f"cannot pool depth {self.depth} with depth {other.depth}")
        return SpeculationStats(self.depth, self.accepted + other.accepted)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tokens_per_forward(self) -> float:
        """Mean of (accepted drafts + 1) over rounds: tokens gained per target forward."""
        return float(np.mean(np.asarray(self.accepted) + 1.0))

    def reached(self) -> list[float]:
        """Entry k-1 is the fraction of rounds whose first k drafts were all accepted (k = 1..D);
        1 + their sum is `tokens_per_forward`."""
        a = np.asarray(self.accepted)
        return [float(np.mean(a >= k)) for k in range(1, self.depth + 1)]

    def conditional_acceptance(self) -> list[float | None]:
        """Entry k-1 is P(draft k accepted | drafts 1..k-1 accepted); None when never reached."""
        a = np.asarray(self.accepted)
        out = []
        for k in range(1, self.depth + 1):
            offered = int(np.sum(a >= k - 1))
            out.append(float(np.sum(a >= k)) / offered if offered else None)
        return out

    def summary(self) -> dict:
        return {
            "depth": self.depth,
            "rounds": self.rounds,
            "tokens_per_forward": self.tokens_per_forward,
            "acceptance_conditional": self.conditional_acceptance(),
            "acceptance_reached": self.reached(),
        }


@functools.partial(jax.jit, static_argnums=(0, 3))
def speculation_round(config: ModelConfig, params: Params, hidden, depth: int, buf, p):
    """One round of `greedy_speculative_decode`: D greedy drafts after position p + 1, then the
    verifying target forward. Jitted; `config` and `depth` are static.

    Args:
      hidden: [L, H] target hidden states, valid at positions <= p.
      buf: i32[L] tokens, valid at positions <= p + 1 (x_{p+1} is the pending token).
      p: i32[] the last position whose hidden state is known.
    Returns:
      (drafts i32[D] for positions p+2.., targets i32[D+1] for positions p+2.., the verifying
      forward's hidden states [L, H], valid through position p + 1 + D).
    """
    next_tokens = jnp.roll(buf, -1)  # entry i pairs h_i with x_{i+1}
    draft_hidden_in = hidden
    drafts = []
    for k in range(depth):
        g = draft_forward_full(config, params, draft_hidden_in, next_tokens)
        g_k = jax.lax.dynamic_index_in_dim(g, p + k, keepdims=False)
        d = jnp.argmax(compute_logits(config, params, g_k)).astype(jnp.int32)
        drafts.append(d)
        # The next step's entry at p + k + 1 is (g_{p+k}, d_{p+k+2}).
        draft_hidden_in = jax.lax.dynamic_update_index_in_dim(draft_hidden_in, g_k, p + k + 1, 0)
        next_tokens = jax.lax.dynamic_update_index_in_dim(next_tokens, d, p + k + 1, 0)
    drafts = jnp.stack(drafts)
    verify = jax.lax.dynamic_update_slice(buf, drafts, (p + 2,))
    new_hidden = forward_full(config, params, verify)
    rows = jax.lax.dynamic_slice_in_dim(new_hidden, p + 1, depth + 1)
    targets = jnp.argmax(compute_logits(config, params, rows), axis=-1).astype(jnp.int32)
    return drafts, targets, new_hidden


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy_step(config: ModelConfig, params: Params, buf, rows: int, t):
    """The greedy token at position t + 1 given buf[0..t], and the target hidden states [L, H].

    The logits are computed for `rows` = D + 1 consecutive rows, the shape of the verifying
    forward's, so that both paths run the same matmul and agree bit for bit.
    """
    hidden = forward_full(config, params, buf)
    h = jax.lax.dynamic_slice_in_dim(hidden, t, rows)
    return jnp.argmax(compute_logits(config, params, h)[0]).astype(jnp.int32), hidden


def _buffer_len(prompt_len: int, max_new_tokens: int, depth: int) -> int:
    # Rounds may overshoot max_new_tokens by up to D tokens, and a round writes D drafts past
    # the pending token; round up to a multiple of 64 so that nearby lengths share a compile.
    need = prompt_len + max_new_tokens + 2 * depth + 2
    return -(-need // 64) * 64


def greedy_decode(model: LoadedModel, prompt, max_new_tokens: int, *, depth: int = 3) -> list[int]:
    """Plain greedy decoding, one full forward per token (the reference for speculation).

    `depth` only sizes the buffer, so that the buffer (and every logit) matches
    `greedy_speculative_decode` at that depth.
    """
    prompt = [int(t) for t in prompt]
    n = len(prompt)
    buf = np.zeros(_buffer_len(n, max_new_tokens, depth), np.int32)
    buf[:n] = prompt
    out = []
    for t in range(n - 1, n - 1 + max_new_tokens):
        token, _ = _greedy_step(model.config, model.params, jnp.asarray(buf), depth + 1, t)
        buf[t + 1] = int(token)
        out.append(int(token))
    return out


def greedy_speculative_decode(
    model: LoadedModel, prompt, max_new_tokens: int, *, depth: int = 3
) -> tuple[list[int], SpeculationStats]:
    """Greedy decoding with D MTP drafts per target forward (module docstring).

    Args:
      model: a model with an MTP head.
      prompt: token ids, at least one.
      max_new_tokens: tokens to generate (the last round may produce more; they are cut).
      depth: D, drafts per round.
    Returns:
      (the generated tokens, equal to `greedy_decode`'s, the accepted drafts of each round).
    """
    if not model.has_mtp:
        raise ValueError("greedy_speculative_decode needs a model with an MTP head")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt is empty")
    config, params = model.config, model.params
    n = len(prompt)
    buf = np.zeros(_buffer_len(n, max_new_tokens, depth), np.int32)
    buf[:n] = prompt
    # Prefill: the first pending token and the hidden states of the prompt.
    token, hidden = _greedy_step(config, params, jnp.asarray(buf), depth + 1, n - 1)
    buf[n] = int(token)
    out = [int(token)]
    p = n - 1  # last position with a known hidden state; x_{p+1} = out[-1] is pending
    accepted = []
    while len(out) < max_new_tokens:
        drafts, targets, hidden = speculation_round(config, params, hidden, depth, jnp.asarray(buf), p)
        drafts, targets = np.asarray(drafts), np.asarray(targets)
        a = 0
        while a < depth and drafts[a] == targets[a]:
            a += 1
        new = [int(t) for t in drafts[:a]] + [int(targets[a])]
        buf[p + 2 : p + 2 + len(new)] = new
        out.extend(new)
        p += a + 1
        accepted.append(a)
    return out[:max_new_tokens], SpeculationStats(depth, tuple(accepted))
