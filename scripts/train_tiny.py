"""Train the embedded default model: a tiny Qwen3 and its MTP draft head, on the stdlib's sources.

    python scripts/train_tiny.py                  # train, save helios_jax/assets/default_model, measure
    python scripts/train_tiny.py --eval_only      # measure the saved folder again (--out_dir=...)

What every step does (docs/default-model.md has the numbers of the shipped run):

  1. Corpus. Every `*.py` under `sysconfig.get_paths()["stdlib"]`, sorted by relative path,
     except folders named test, tests, idle_test (test suites), encodings and pydoc_data
     (generated tables and docs), site-packages and dist-packages, and files that are not
     UTF-8. A file is held out when sha256(relative path) % 20 == 0: the rule does not depend
     on which other files exist, so the same paths are held out on every Python build.
     A third of the documented functions (at most 40 lines) of the training files also appear
     as chat examples in the template of tokenizer_config.json, which teaches the role markers
     and <|im_end|>. Documents are joined with <|endoftext|> into one token stream per split.
  2. Tokenizer. Byte-level BPE (`tokenizers`: ByteLevel pre-tokenizer and decoder, so every
     string round-trips) trained on the training files only, with the special tokens
     <|endoftext|>, <|im_start|>, <|im_end|> at ids 0, 1, 2.
  3. Model. A Qwen3 decoder with tied embeddings, GQA, q/k norms, and one MTP block
     (`ModelConfig`; max_position_embeddings 4096: rope needs no training at that length, the
     windows here are --seq_len tokens).
  4. Training. AdamW with warmup and cosine decay, random windows of the training stream,
     one jitted step. The loss is the next-token loss plus --mtp_weight times the mean of
     --mtp_passes MTP losses (computed on the first --mtp_rows sequences of each batch):
       pass 0: the entry at i is (h_i, x_{i+1}) and predicts x_{i+2}, the standard MTP objective,
               with h the target's final-normed hidden state (gradient stopped: the MTP loss
               does not steer the trunk, only the head and the shared embedding and norm);
       pass k: the entry at i is (g^{k-1}_{i-1}, x_{i+1}) and predicts x_{i+2}, where g^{k-1} is
               pass k-1's draft hidden state. It attends to pass 0's entries at positions
               <= i-k and to one entry of each pass 1..k (at i-k+1, ..., i): exactly the draft
               context `draft_proposals` builds at step k of a round that starts at p = i - k (with the
               true tokens in place of the drafts). This trains draft depths 2 and 3 on the
               inputs they see when serving.
  5. Save. `helios_jax.model.save_checkpoint` (bfloat16 by default, --save_dtype), plus
     tokenizer_config.json (chat template), generation_config.json, training_info.json and a
     README.md model card.
  6. Measure (also --eval_only). Loads the saved folder with `load_checkpoint` (float32 compute
     by default, --eval_dtype) and reports: next-token and MTP losses on fixed windows of both
     splits; greedy speculative decoding with --spec_depth drafts from --spec_prompts prompts
     of the held-out stream (`helios_jax.model.default.greedy_speculative_decode`): tokens per
     target forward and the acceptance per draft position; and checks that the speculative
     output equals plain greedy decoding on the first prompts.

Runs are seeded and, with the default single-threaded XLA (set before jax loads; pass
XLA_FLAGS yourself to change it), repeatable on one machine.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pathlib
import sys
import sysconfig
import textwrap
import time

if "XLA_FLAGS" not in os.environ:
    # The machines this runs on are shared: one XLA thread is as fast as two under load, and it
    # makes every run repeatable.
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import traverse_util
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from helios_jax.model import (
    ModelConfig,
    Qwen3,
    compute_logits,
    forward_full,
    init_params,
    load_checkpoint,
    save_checkpoint,
    softmax_scale,
)
from helios_jax.model.default import SpeculationStats, greedy_decode, greedy_speculative_decode

REPO = pathlib.Path(__file__).resolve().parents[1]

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", str(REPO / "helios_jax/assets/default_model"), "checkpoint folder")
flags.DEFINE_bool("eval_only", False, "measure the folder at --out_dir instead of training")
flags.DEFINE_integer("seed", 0, "seeds the parameters and the window sampling")
# Tokenizer and model.
flags.DEFINE_integer("vocab_size", 4096, "BPE vocabulary, special tokens included")
flags.DEFINE_integer("hidden_size", 192, "")
flags.DEFINE_integer("intermediate_size", 512, "")
flags.DEFINE_integer("num_layers", 3, "target decoder blocks")
flags.DEFINE_integer("num_heads", 6, "")
flags.DEFINE_integer("num_kv_heads", 2, "")
flags.DEFINE_integer("head_dim", 32, "")
flags.DEFINE_integer("max_position_embeddings", 4096, "declared context (rope is computed)")
flags.DEFINE_float("rope_theta", 1_000_000.0, "")
# Training.
flags.DEFINE_integer("steps", 600, "optimizer steps")
flags.DEFINE_integer("batch", 16, "sequences per step")
flags.DEFINE_integer("seq_len", 256, "tokens per training window")
flags.DEFINE_float("lr", 3e-3, "peak learning rate")
flags.DEFINE_integer("warmup", 40, "linear warmup steps")
flags.DEFINE_float("weight_decay", 0.1, "AdamW decay of matrices (norm scales are not decayed)")
flags.DEFINE_integer("mtp_passes", 3, "MTP training passes (draft depths trained), >= 1")
flags.DEFINE_integer("mtp_rows", 4, "sequences of each batch that get the MTP losses")
flags.DEFINE_float("mtp_weight", 0.5, "weight of the mean MTP loss")
flags.DEFINE_integer("log_every", 25, "steps between progress lines")
flags.DEFINE_enum("save_dtype", "bfloat16", ["float32", "bfloat16"], "dtype of the saved weights")
# Measurement.
flags.DEFINE_enum("eval_dtype", "float32", ["float32", "bfloat16"], "compute dtype when measuring")
flags.DEFINE_integer("eval_windows", 48, "fixed windows per split for the losses")
flags.DEFINE_integer("spec_prompts", 32, "held-out prompts for the speculation measurement")
flags.DEFINE_integer("spec_prompt_len", 96, "tokens per prompt")
flags.DEFINE_integer("spec_new_tokens", 128, "tokens generated per prompt")
flags.DEFINE_integer("spec_depth", 3, "drafts per round")
flags.DEFINE_integer("spec_check_greedy", 4, "prompts whose output is compared with plain greedy")
flags.DEFINE_integer("spec_text_rounds", 256, "single rounds started from held-out text contexts")

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages", "dist-packages", "__pycache__"}
)
HELD_OUT_MODULUS = 20
CHAT_MODULUS = 3  # a function becomes a chat example when sha256(module.qualname) % 3 == 0
CHAT_MAX_LINES = 40


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# 1. Corpus


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def is_held_out(rel_path: str) -> bool:
    return _hash(rel_path) % HELD_OUT_MODULUS == 0


def stdlib_sources(root: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the corpus files, sorted by path (module docstring, step 1)."""
    root = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            found.append((rel.as_posix(), text))
    return sorted(found)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE in Python: <|im_start|>role\\ncontent<|im_end|>\\n per message."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def chat_examples(rel_path: str, text: str) -> list[str]:
    """Chat documents: the user asks for a documented function by name and docstring summary,
    the assistant answers with its source."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    module = rel_path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    lines = text.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or _hash(f"{module}.{node.name}:{node.lineno}") % CHAT_MODULUS:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if node.end_lineno - start + 1 > CHAT_MAX_LINES:
            continue
        source = textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
        summary = doc.strip().splitlines()[0].strip()
        out.append(
            render_chat(
                [
                    {
                        "role": "user",
                        "content": f"Write the Python function `{node.name}` of `{module}`: {summary}",
                    },
                    {"role": "assistant", "content": f"```python\n{source}\n```"},
                ]
            )
        )
    return out


# ----------------------------------------------------------------------------------------------
# 2. Tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_stream(tokenizer: Tokenizer, docs: list[str]) -> np.ndarray:
    """The documents' ids, each followed by <|endoftext|>, as one i32 array."""
    eot = tokenizer.token_to_id(EOT)
    parts = []
    for enc in tokenizer.encode_batch(docs, add_special_tokens=False):
        parts.append(np.asarray(enc.ids, np.int32))
        parts.append(np.asarray([eot], np.int32))
    return np.concatenate(parts)


def write_tokenizer_files(folder: pathlib.Path) -> None:
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": IM_END,
                "pad_token": EOT,
                "unk_token": None,
                "additional_special_tokens": SPECIAL_TOKENS,
                "model_max_length": FLAGS.max_position_embeddings,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )


# ----------------------------------------------------------------------------------------------
# 3-4. Model and training


def model_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=FLAGS.hidden_size,
        intermediate_size=FLAGS.intermediate_size,
        num_layers=FLAGS.num_layers,
        num_heads=FLAGS.num_heads,
        num_kv_heads=FLAGS.num_kv_heads,
        head_dim=FLAGS.head_dim,
        rms_norm_eps=1e-6,
        rope_theta=FLAGS.rope_theta,
        max_position_embeddings=FLAGS.max_position_embeddings,
        tie_word_embeddings=True,
        dtype="float32",
        mtp_num_layers=1,
    )


def pass_attend(sm_scale: float):
    """`attend` of MTP training pass K (module docstring, step 4): K = the number of earlier
    passes in `state["prev"][layer]`, a list of (k, v) [n, kv_heads, head_dim] per pass.

    Query i of pass K sees pass 0's keys j <= i - K, and one key of each pass s = 1..K at
    j = i - K + s (its own key for s = K). Example, K = 2, i = 5: pass-0 keys 0..3, pass-1 key 4,
    pass-2 key 5. Pass 0 (K = 0) is plain causal attention. The chosen keys are gathered by
    shifting pass s down by K - s positions, so no [n, n] score block is wasted on a diagonal.
    """

    def attend(layer, q, k, v, state):
        prev = state["prev"][layer]
        passes = len(prev)
        keys = [kv[0] for kv in prev] + [k]
        values = [kv[1] for kv in prev] + [v]
        n, heads, dim = q.shape
        kv_heads = k.shape[1]
        hi = jax.lax.Precision.HIGHEST
        qg = q.reshape(n, kv_heads, heads // kv_heads, dim)
        i = jnp.arange(n)
        scores = jnp.einsum("tgrd,sgd->grts", qg, keys[0], precision=hi) * sm_scale
        scores = [jnp.where(i[None, :] <= i[:, None] - passes, scores, -jnp.inf)]
        shifted_values = []
        for s in range(1, passes + 1):
            shift = passes - s
            ks = jnp.pad(keys[s], ((shift, 0), (0, 0), (0, 0)))[:n]  # row i holds key i - shift
            vs = jnp.pad(values[s], ((shift, 0), (0, 0), (0, 0)))[:n]
            diag = jnp.einsum("tgrd,tgd->grt", qg, ks, precision=hi) * sm_scale
            scores.append(jnp.where(i >= shift, diag, -jnp.inf)[..., None])
            shifted_values.append(vs)
        probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
        out = jnp.einsum("grts,sgd->tgrd", probs[..., :n], values[0], precision=hi)
        for s, vs in enumerate(shifted_values):
            out = out + jnp.einsum("grt,tgd->tgrd", probs[..., n + s], vs, precision=hi)
        cur = dict(state.get("cur", {}))
        cur[layer] = (k, v)
        return out.reshape(n, heads, dim), {**state, "cur": cur}

    return attend


def _cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def mtp_pass_losses(config: ModelConfig, params, hidden, window, passes: int):
    """Mean cross-entropy of each MTP training pass on one window.

    Args:
      hidden: [S, H] target hidden states of window[:S] (gradient already stopped).
      window: i32[S + 1].
    Returns:
      f32[passes].
    """
    s = hidden.shape[0]
    n = s - 1  # entries i = 0..S-2: (h_i, x_{i+1}) -> x_{i+2}
    next_tokens, labels = window[1:s], window[2 : s + 1]
    positions = jnp.arange(n, dtype=jnp.int32)
    attend = pass_attend(softmax_scale(config))
    prev = {layer: [] for layer in range(config.mtp_num_layers)}
    hidden_in = hidden[:n]
    losses = []
    for k in range(passes):
        g, state = Qwen3(config).apply(
            {"params": params},
            hidden_in,
            next_tokens,
            positions,
            attend,
            {"prev": prev},
            method=Qwen3.draft,
        )
        ce = _cross_entropy(compute_logits(config, params, g), labels)
        losses.append(ce[k:].mean())  # entries i < k have no round start p = i - k >= 0
        prev = {layer: prev[layer] + [state["cur"][layer]] for layer in prev}
        hidden_in = jnp.concatenate([jnp.zeros_like(g[:1]), g[:-1]], axis=0)  # entry i <- g_{i-1}
    return jnp.stack(losses)


def batch_losses(config: ModelConfig, params, batch, passes: int, mtp_rows: int):
    """(next-token loss, f32[passes] MTP losses) of a batch i32[B, S + 1]."""
    hidden = jax.vmap(forward_full, (None, None, 0))(config, params, batch[:, :-1])
    main = _cross_entropy(compute_logits(config, params, hidden), batch[:, 1:]).mean()
    mtp = jax.vmap(mtp_pass_losses, (None, None, 0, 0, None))(
        config, params, jax.lax.stop_gradient(hidden[:mtp_rows]), batch[:mtp_rows], passes
    )
    return main, mtp.mean(axis=0)


def make_optimizer(steps: int) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, FLAGS.lr, FLAGS.warmup, steps, end_value=FLAGS.lr * 0.1
    )

    def decay_mask(params):
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict({k: k[-1] != "weight" for k in flat})

    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=FLAGS.weight_decay, mask=decay_mask),
    )


def make_train_step(config: ModelConfig, optimizer, passes: int, mtp_rows: int, mtp_weight: float):
    def loss_fn(params, batch):
        main, mtp = batch_losses(config, params, batch, passes, mtp_rows)
        return main + mtp_weight * mtp.mean(), (main, mtp)

    @jax.jit
    def step(params, opt_state, batch):
        (_, (main, mtp)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, main, mtp

    return step


# ----------------------------------------------------------------------------------------------
# 6. Measurement


def fixed_windows(stream: np.ndarray, count: int, length: int) -> np.ndarray:
    """`count` windows of `length` tokens at evenly spaced starts (deterministic)."""
    starts = np.linspace(0, len(stream) - length, count).astype(np.int64)
    return np.stack([stream[s : s + length] for s in starts])


def measure_losses(config: ModelConfig, params, stream: np.ndarray, passes: int) -> dict:
    windows = fixed_windows(stream, FLAGS.eval_windows, FLAGS.seq_len + 1)
    fn = jax.jit(lambda p, b: batch_losses(config, p, b, passes, b.shape[0]))
    mains, mtps = [], []
    for chunk in np.array_split(windows, max(1, len(windows) // 8)):
        main, mtp = fn(params, jnp.asarray(chunk))
        mains.append(float(main) * len(chunk))
        mtps.append(np.asarray(mtp) * len(chunk))
    return {
        "next_token": sum(mains) / len(windows),
        "mtp_by_pass": [float(x) for x in np.sum(mtps, axis=0) / len(windows)],
    }


def measure_speculation(model, stream: np.ndarray) -> tuple[SpeculationStats, SpeculationStats, int]:
    """Greedy speculative decoding on held-out text, two ways.

    decoding: --spec_new_tokens tokens from each of --spec_prompts evenly spaced prompts; later
      rounds continue the model's own output, which can be easier than text (a repetition
      loop is drafted perfectly).
    text rounds: one round from each of --spec_text_rounds evenly spaced held-out contexts, so
      every round starts from real text.

    Returns:
      (decoding rounds, text rounds, prompts whose output was checked against plain greedy).
    """
    depth = FLAGS.spec_depth
    prompts = fixed_windows(stream, FLAGS.spec_prompts, FLAGS.spec_prompt_len)
    decoding, checked = SpeculationStats(depth, ()), 0
    for j, prompt in enumerate(prompts):
        out, stats = greedy_speculative_decode(model, prompt, FLAGS.spec_new_tokens, depth=depth)
        decoding = decoding + stats
        if j < FLAGS.spec_check_greedy:
            if out != greedy_decode(model, prompt, FLAGS.spec_new_tokens, depth=depth):
                raise AssertionError(f"prompt {j}: speculative output differs from plain greedy")
            checked += 1
        if j % 8 == 7:
            log(
                f"  decoding: {j + 1}/{len(prompts)} prompts, tokens/forward so far "
                f"{decoding.tokens_per_forward:.3f}"
            )
    text = SpeculationStats(depth, ())
    # max_new_tokens=2: the prefill's token is pending, then exactly one round.
    for context in fixed_windows(stream, FLAGS.spec_text_rounds, FLAGS.spec_prompt_len):
        text = text + greedy_speculative_decode(model, context, 2, depth=depth)[1]
    return decoding, text, checked


def evaluate(folder: pathlib.Path, splits: dict[str, np.ndarray] | None = None) -> dict:
    """Every number of the model card, measured on the saved folder."""
    model = load_checkpoint(folder, dtype=FLAGS.eval_dtype)
    if splits is None:
        train_docs, held_docs = corpus_documents()
        splits = {
            "train": token_stream(model.tokenizer, train_docs),
            "held_out": token_stream(model.tokenizer, held_docs),
        }
    t0 = time.time()
    losses = {
        name: measure_losses(model.config, model.params, stream, FLAGS.spec_depth)
        for name, stream in splits.items()
    }
    log(f"losses: {json.dumps(losses)}")
    decoding, text, checked = measure_speculation(model, splits["held_out"])
    result = {
        "eval_dtype": FLAGS.eval_dtype,
        "losses": losses,
        "speculation": {
            "prompts": FLAGS.spec_prompts,
            "prompt_len": FLAGS.spec_prompt_len,
            "new_tokens": FLAGS.spec_new_tokens,
            **decoding.summary(),
            "text_rounds": {"contexts": FLAGS.spec_text_rounds, **text.summary()},
            "checked_equal_to_greedy": checked,
        },
        "eval_seconds": round(time.time() - t0, 1),
    }
    log(f"speculation: {json.dumps(result['speculation'])}")
    return result


def corpus_documents() -> tuple[list[str], list[str]]:
    """(training documents, held-out documents) in a fixed order: the training files with the
    chat examples spread evenly between them, and the held-out files."""
    files = stdlib_sources()
    train = [(rel, text) for rel, text in files if not is_held_out(rel)]
    held = [text for rel, text in files if is_held_out(rel)]
    chats = [c for rel, text in train for c in chat_examples(rel, text)]
    docs, c = [], 0
    for j, (_, text) in enumerate(train):
        docs.append(text)
        while c < len(chats) and c * len(train) <= j * len(chats):
            docs.append(chats[c])
            c += 1
    return docs + chats[c:], held


def folder_bytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def write_model_card(folder: pathlib.Path, info: dict) -> None:
    c, t, e = info["config"], info["training"], info["eval"]
    sp = e["speculation"]
    acc = ", ".join("n/a" if x is None else f"{x:.3f}" for x in sp["acceptance_conditional"])
    reached = ", ".join(f"{x:.3f}" for x in sp["acceptance_reached"])
    tr = sp["text_rounds"]
    tacc = ", ".join("n/a" if x is None else f"{x:.3f}" for x in tr["acceptance_conditional"])
    card = (
        "# helios_jax default model\n"
        "\n"
        "A tiny Qwen3-architecture causal LM with a multi-token-prediction (MTP) draft head, trained by\n"
        f"`scripts/train_tiny.py` on the Python {info['data']['python']} standard library's sources. It\n"
        "exists so that `python -m helios_jax.serve` runs with no download; it writes Python-like text\n"
        "and nothing more. docs/default-model.md describes it in full.\n"
        "\n"
        "| | |\n"
        "| --- | --- |\n"
        f"| architecture | Qwen3ForCausalLM, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
        f"MLP {c['intermediate_size']}, {c['num_attention_heads']} query / {c['num_key_value_heads']} kv "
        "heads "
        f"of {c['head_dim']}, tied embeddings |\n"
        f"| MTP head | {c['mtp_num_hidden_layers']} block (`mtp.*` tensors, docs/model.md) |\n"
        f"| context | {c['max_position_embeddings']} (trained on {t['seq_len']}-token windows) |\n"
        f"| vocabulary | {c['vocab_size']} byte-level BPE, `<|endoftext|>` `<|im_start|>` `<|im_end|>` |\n"
        f"| weights | {info['parameters']:,} parameters, {c['dtype']} |\n"
        f"| training | {t['steps']} steps x {t['batch']} x {t['seq_len']} tokens, "
        f"{t['wall_seconds'] / 60:.1f} min on one CPU core |\n"
        f"| loss (next token, nats) | train {e['losses']['train']['next_token']:.3f}, "
        f"held-out {e['losses']['held_out']['next_token']:.3f} |\n"
        f"| greedy speculation, {sp['depth']} drafts, held-out prompts | "
        f"{sp['tokens_per_forward']:.3f} tokens per target forward; "
        f"acceptance per position (conditional) {acc}; reached {reached} |\n"
        f"| the same, single rounds from held-out text | {tr['tokens_per_forward']:.3f} tokens per target "
        "forward; "
        f"acceptance per position (conditional) {tacc} |\n"
        "\n"
        "Files: config.json, model.safetensors, tokenizer.json, tokenizer_config.json (chat template),\n"
        "generation_config.json, training_info.json (every setting and measurement of the run).\n"
    )
    (folder / "README.md").write_text(card)


# ----------------------------------------------------------------------------------------------


def train_and_save(folder: pathlib.Path) -> None:
    t_start = time.time()
    train_docs, held_docs = corpus_documents()
    log(f"corpus: {len(train_docs)} training documents, {len(held_docs)} held-out files")
    tokenizer = train_tokenizer([d for d in train_docs if not d.startswith(IM_START)], FLAGS.vocab_size)
    splits = {"train": token_stream(tokenizer, train_docs), "held_out": token_stream(tokenizer, held_docs)}
    log(
        f"tokenizer: {tokenizer.get_vocab_size()} tokens; train {len(splits['train']):,} tokens, "
        f"held-out {len(splits['held_out']):,} ({time.time() - t_start:.0f} s)"
    )

    config = model_config(tokenizer.get_vocab_size())
    params = init_params(config, jax.random.key(FLAGS.seed))
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    optimizer = make_optimizer(FLAGS.steps)
    opt_state = optimizer.init(params)
    step = make_train_step(config, optimizer, FLAGS.mtp_passes, FLAGS.mtp_rows, FLAGS.mtp_weight)
    rng = np.random.default_rng(FLAGS.seed)
    train = splits["train"]
    window = FLAGS.seq_len + 1
    log(f"model: {n_params:,} parameters; {FLAGS.steps} steps of {FLAGS.batch} x {FLAGS.seq_len}")

    t_train = time.time()
    last_loss = None
    for i in range(FLAGS.steps):
        starts = rng.integers(0, len(train) - window, FLAGS.batch)
        batch = jnp.asarray(np.stack([train[s : s + window] for s in starts]))
        params, opt_state, main, mtp = step(params, opt_state, batch)
        if (i + 1) % FLAGS.log_every == 0 or i == 0 or i + 1 == FLAGS.steps:
            main, mtp = float(main), np.asarray(mtp)
            last_loss = main
            elapsed = time.time() - t_train
            log(
                f"step {i + 1}/{FLAGS.steps} loss {main:.3f} mtp "
                + " ".join(f"{x:.3f}" for x in mtp)
                + f"  {elapsed:.0f} s ({(i + 1) * FLAGS.batch * FLAGS.seq_len / elapsed:.0f} tok/s)"
            )
    jax.block_until_ready(params)
    train_seconds = time.time() - t_train
    log(f"trained in {train_seconds / 60:.1f} min ({(time.time() - t_start) / 60:.1f} min with data)")

    saved = jax.tree.map(lambda x: x.astype(jnp.dtype(FLAGS.save_dtype)), params)
    if folder.exists():
        for old in folder.iterdir():
            if old.is_file():
                old.unlink()
    save_checkpoint(folder, config.replace(dtype=FLAGS.save_dtype), saved, tokenizer)
    write_tokenizer_files(folder)
    eot, im_end = tokenizer.token_to_id(EOT), tokenizer.token_to_id(IM_END)
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "eos_token_id": [im_end, eot],
                "pad_token_id": eot,
                "do_sample": False,
            },
            indent=2,
        )
        + "\n"
    )
    wall = time.time() - t_start

    result = evaluate(folder, splits)
    files = stdlib_sources()
    info = {
        "config": json.loads((folder / "config.json").read_text()),
        "parameters": n_params,
        "data": {
            "python": sys.version.split()[0],
            "stdlib": sysconfig.get_paths()["stdlib"],
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "rule": f"held out when sha256(relative path) % {HELD_OUT_MODULUS} == 0",
            "files": len(files),
            "held_out_files": [rel for rel, _ in files if is_held_out(rel)],
            "chat_examples": sum(d.startswith(IM_START) for d in train_docs),
            "tokens": {name: int(len(s)) for name, s in splits.items()},
        },
        "training": {
            "command": " ".join(["python"] + sys.argv),
            "seed": FLAGS.seed,
            "steps": FLAGS.steps,
            "batch": FLAGS.batch,
            "seq_len": FLAGS.seq_len,
            "lr": FLAGS.lr,
            "warmup": FLAGS.warmup,
            "weight_decay": FLAGS.weight_decay,
            "mtp_passes": FLAGS.mtp_passes,
            "mtp_rows": FLAGS.mtp_rows,
            "mtp_weight": FLAGS.mtp_weight,
            "save_dtype": FLAGS.save_dtype,
            "tokens_seen": FLAGS.steps * FLAGS.batch * FLAGS.seq_len,
            "last_logged_loss": last_loss,
            "wall_seconds": round(wall, 1),
            "train_loop_seconds": round(train_seconds, 1),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        },
        "eval": result,
    }
    (folder / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    write_model_card(folder, info)
    for path in folder.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the package's data must be world-readable
    log(f"saved {folder} ({folder_bytes(folder) / 1e6:.2f} MB); total {(time.time() - t_start) / 60:.1f} min")


def main(argv):
    del argv
    folder = pathlib.Path(FLAGS.out_dir)
    if FLAGS.eval_only:
        result = evaluate(folder)
        print(json.dumps(result, indent=2))
        log(f"folder {folder}: {folder_bytes(folder) / 1e6:.2f} MB")
    else:
        train_and_save(folder)


if __name__ == "__main__":
    app.run(main)
