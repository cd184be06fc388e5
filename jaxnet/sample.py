"""Generate text from a trained language model: jit-compiled, one token per step, with a cache.

The Transformer decodes with its key/value cache (``decode=True``), the LSTM with its carried
state, so each new token costs one position. A whole pass over a buffer of positions is one
``lax.scan``: at position ``i`` the input is the prompt token if ``i`` is inside the prompt,
otherwise the token chosen at ``i - 1``.

A Transformer sees at most ``context`` positions. To write more, generation restarts with a
fresh cache on the last ``context // 2`` tokens (a sliding window that moves half a context at a
time), so text of any length can be generated; a prompt must fit in the context. A pass walks
only the positions it needs (the prompt and the tokens asked for, up to the context), so a
model of a long context samples a few tokens in a few steps.

With a checkpoint's own tokenizer (``hf:DIR``), generation stops at any of its end ids
(``Tokenizer.end_ids``: Llama 3's ``generation_config.json`` lists several).

**Chat** (``chat=MESSAGE``, ``jaxnet sample --chat``): the message (after a ``system`` turn when
given) is rendered with the chat template and its generation prompt, as transformers'
``apply_chat_template(..., add_generation_prompt=True)`` renders it (:mod:`jaxnet.tokenizers.chat`);
the reply is generated until the template's end-of-turn token (found by rendering a reply: what
the template writes after it) or one of the end ids, and returned alone. The template is the one
the run was fine-tuned with (its chat corpus's, kept in the run's ``vocab.json``), else the
checkpoint's own (``hf:DIR``, or the directory of the run's tokenizer).

>>> text = sample("runs/transformer_shakespeare", prompt="ROMEO:", tokens=200)   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.errors import UserError
from jaxnet.models import hf


def penalize(logits: jnp.ndarray, penalty: float, seen: jnp.ndarray) -> jnp.ndarray:
    """``logits`` (..., vocab) with the repetition guard applied to the tokens ``seen`` (a bool mask
    of the same shape): divided by ``penalty`` where positive, multiplied where negative."""
    return jnp.where(seen, jnp.where(logits > 0, logits / penalty, logits * penalty), logits)


def check_repetition_penalty(penalty: float) -> None:
    """A one-line error for a repetition guard that is not a number > 0."""
    if not (np.isfinite(penalty) and penalty > 0):
        raise UserError(f"--repetition-penalty {penalty}: give a number > 0 (1 = none; 1.2-1.5 guards)")


def choose(
    logits: jnp.ndarray, key: jax.Array, temperature: float, top_k: int, penalty: float = 1.0, seen: Any = None
) -> jnp.ndarray:
    """The next token from float32 ``logits`` (vocab,): argmax at temperature 0, else a draw from
    the softmax of ``logits / temperature`` restricted to the ``top_k`` most likely (0 = all).

    ``penalty`` > 1 is the repetition guard of CTRL (Keskar et al., 2019), as transformers'
    ``repetition_penalty`` applies it: the logit of every token in ``seen`` (a (vocab,) bool mask of
    the tokens of the sequence so far, prompt included) is divided by ``penalty`` where positive and
    multiplied by it where negative, before the temperature."""
    if penalty != 1.0 and seen is not None:
        logits = penalize(logits, penalty, seen)
    if temperature == 0:
        return jnp.argmax(logits).astype(jnp.int32)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits).astype(jnp.int32)


def decode_state(model: nn.Module) -> dict:
    """Empty decoding state (the ``cache`` or ``carry`` collections) for a batch of one sequence."""
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32), decode=True))
    variables = dict(nn.unbox(variables))
    variables.pop("params")
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)


@functools.partial(jax.jit, static_argnames=("model", "temperature", "top_k", "penalty"))
def _scan(
    model: nn.Module,
    params: Any,
    state: dict,
    tokens: jnp.ndarray,
    given: jnp.ndarray,
    key: jax.Array,
    temperature: float,
    top_k: int,
    penalty: float,
    seen: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Walk every position of ``tokens``; returns the token at each position and the one after.
    ``seen``: the tokens already in the sequence before ``tokens`` (the repetition guard's mask)."""

    def body(carry: tuple, i: jnp.ndarray) -> tuple:
        state, previous, seen = carry
        token = jnp.where(i < given, tokens[i], previous)
        seen = seen.at[token].set(True)
        logits, state = model.apply(
            {"params": params, **state}, token[None, None], train=False, decode=True, mutable=list(state)
        )
        after = choose(logits[0, -1], jax.random.fold_in(key, i), temperature, top_k, penalty, seen)
        return (dict(state), after, seen), token

    start = (state, jnp.zeros((), jnp.int32), seen)
    (_, after, _), placed = jax.lax.scan(body, start, jnp.arange(tokens.shape[0]))
    return placed, after


def generate(
    model: nn.Module,
    params: Any,
    prompt: np.ndarray,
    num_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    stop_ids: tuple[int, ...] = (),
    repetition_penalty: float = 1.0,
) -> np.ndarray:
    """``num_tokens`` token ids following ``prompt``: the ids of one sequence, (T,) or a batch of
    one (1, T), not empty; fewer when one of ``stop_ids`` is generated (the ids end with it).
    ``repetition_penalty`` > 1 makes every token already in the sequence (prompt included) less
    likely, as transformers' ``repetition_penalty`` does (:func:`choose`); 1 leaves the logits alone.

    ``model`` is called as ``model.apply(variables, tokens, train=False, decode=True)``; a model
    with a ``context`` attribute (the Transformer) is decoded in windows of that
    many positions::

        ids = generate(trained.model.module, trained.params, np.array([[3, 17, 5]]), 20, temperature=0)
    """
    prompt = np.asarray(prompt)
    if prompt.ndim == 2 and prompt.shape[0] == 1:  # one sequence as a model takes it: a batch of one
        prompt = prompt[0]
    if prompt.ndim != 1 or (prompt.size and prompt.dtype.kind not in "iu"):
        raise UserError(
            f"the prompt is {prompt.dtype} of shape {prompt.shape}; give the token ids of one sequence, "
            "shaped (T,) or (1, T)"
        )
    if len(prompt) == 0:
        raise UserError("the prompt is empty; give at least one token of text")
    prompt = prompt.astype(np.int32)
    check_repetition_penalty(repetition_penalty)
    if num_tokens < 1:
        return np.zeros(0, np.int32)
    context = getattr(model, "context", None)
    if context is not None and len(prompt) >= context:
        raise UserError(
            f"the prompt is {len(prompt)} tokens, longer than the model's context of {context} tokens allows "
            f"(the prompt and one new token); give a prompt of at most {context - 1} tokens"
        )
    key = jax.random.PRNGKey(seed)
    empty = decode_state(model)
    # the guard's mask spans the vocabulary; without a guard a one-element stand-in (never read)
    vocab_size = _vocab_size(model, params) if repetition_penalty != 1.0 else 1
    text, new = list(prompt), 0
    window = prompt
    stops = set(int(i) for i in stop_ids)
    while new < num_tokens:
        length = len(window) + num_tokens - new - 1  # the positions this pass needs
        length = min(context, length) if context is not None else length
        buffer = np.zeros(length, np.int32)
        buffer[: len(window)] = window
        seen = np.zeros(vocab_size, bool)  # the guard's mask: the text before this window
        if vocab_size > 1:
            seen[np.asarray(text[: len(text) - len(window)], np.int64)] = True
        placed, after = _scan(
            model,
            params,
            empty,
            jnp.asarray(buffer),
            jnp.asarray(len(window)),
            jax.random.fold_in(key, new),
            temperature,
            top_k,
            float(repetition_penalty),
            jnp.asarray(seen),
        )
        produced = [*np.asarray(placed)[len(window) :].tolist(), int(after)][: num_tokens - new]
        ended = next((i for i, t in enumerate(produced) if t in stops), None)
        if ended is not None:
            text += produced[: ended + 1]
            break
        text += produced
        new += len(produced)
        window = np.asarray(text[-(context // 2) :] if context is not None else text, np.int32)
    return np.asarray(text[len(prompt) :], np.int32)


def _vocab_size(model: nn.Module, params: Any) -> int:
    """The number of logits ``model`` gives a token (its vocabulary), read from its output's shape."""
    variables = {"params": params, **decode_state(model)}
    shape = jax.eval_shape(
        lambda v: model.apply(v, jnp.zeros((1, 1), jnp.int32), train=False, decode=True, mutable=list(v))[0],
        variables,
    ).shape
    return int(shape[-1])


def hf_tokenizer(directory: Path, vocab: int, table: str) -> Any:
    """The tokenizer a checkpoint directory is read with: its own ``tokenizer.json``, else GPT-2's
    for a GPT-2 of GPT-2's vocabulary, else None (token ids only)."""
    from jaxnet import tokenizers

    if (directory / "tokenizer.json").is_file():
        return tokenizers.get(f"hf:{directory}")
    gpt2 = tokenizers.get("gpt2") if table == "gpt2" else None
    return gpt2 if gpt2 is not None and gpt2.vocab_size == vocab else None


def chat_template_of(tokenizer: Any, saved: str | None, where: str) -> Any:
    """The chat template ``--chat`` renders with: ``saved`` (Jinja text: the one a run was
    fine-tuned with) with the special tokens of the tokenizer's directory, else the directory's own
    template; a one-line error where there is none."""
    from jaxnet.tokenizers import chat as chat_lib

    if tokenizer is None or tokenizer.kind != "hf":
        name = getattr(tokenizer, "name", "none")
        raise UserError(
            f"--chat needs a chat template, and {where} has none (its tokenizer is {name}, not a checkpoint's "
            "tokenizer.json with a template); fine-tune it on a chat corpus (jaxnet prepare chat FILE... --tokenizer "
            "hf:DIR), or export it with --chat-template FILE and sample the export (--workdir hf:OUT)"
        )
    directory = tokenizer.directory
    if saved:
        return chat_lib.ChatTemplate(saved, chat_lib.special_tokens(directory), f"the chat template of {where}")
    if not chat_lib.sources(directory):
        raise UserError(
            f"--chat needs a chat template, and {where} has none (hf:{directory} has no chat_template.jinja and no "
            "chat_template in tokenizer_config.json); sample a chat model, or export the run with --chat-template "
            "FILE and sample the export (--workdir hf:OUT)"
        )
    return chat_lib.load(directory)


def end_of_turn(template: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids ``template`` closes an assistant's reply with, in ``tokenizer``'s ids
    (:meth:`~jaxnet.tokenizers.chat.ChatTemplate.end_of_turn`).

    >>> end_of_turn(chat.load("checkpoints/qwen"), tokenizers.get("hf:checkpoints/qwen"))   # doctest: +SKIP
    (151645,)
    """
    return template.end_of_turn(lambda text: [int(i) for i in tokenizer.encode_batch([text])[0].tolist()])


def chat_prompt(template: Any, tokenizer: Any, message: str, system: str | None = None) -> np.ndarray:
    """The ids of a conversation of ``message`` (after a ``system`` turn when given) with the
    generation prompt: ``apply_chat_template(messages, add_generation_prompt=True)``'s ids.

    >>> chat_prompt(chat.load("checkpoints/qwen"), tokenizers.get("hf:checkpoints/qwen"), "Hi")  # doctest: +SKIP
    array([151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198], dtype=int32)
    """
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": message})
    text = template.render(messages, add_generation_prompt=True)
    return np.asarray(tokenizer.encode_batch([text])[0], np.int32)


def check_prompt(start: np.ndarray, vocab: int, what: str, where: str) -> None:
    """A one-line error when ``start`` (the ids ``what`` encodes to) holds an id past the ``vocab``
    ids of the model of ``where``: a tokenizer of more ids than its model would otherwise feed it
    ids it has no row for, and the reply would be noise.

    >>> check_prompt(np.array([5, 2100]), 2000, "--prompt", "hf:ckpt")
    Traceback (most recent call last):
    jaxnet.errors.UserError: --prompt encodes to id 2,100, past the 2,000 ids of hf:ckpt's model ...
    """
    if start.size and int(start.max()) >= vocab:
        raise UserError(
            f"{what} encodes to id {int(start.max()):,}, past the {vocab:,} ids of {where}'s model: its tokenizer has "
            "more ids than the model (config.json's vocab_size); put the tokenizer the checkpoint was trained with "
            "into the directory"
        )


def _chat(
    template: Any,
    tokenizer: Any,
    message: str,
    system: str | None,
    tokens: int,
    run: Any,
    vocab: int,
    where: str,
) -> str:
    """The reply to ``message``: generated by ``run(start_ids, stop_ids)`` until the template's
    end-of-turn or an end id (neither printed); ``vocab`` is the model's number of ids (of ``where``)."""
    start = chat_prompt(template, tokenizer, message, system)
    if not len(start):
        raise UserError(f"{template.origin} renders the conversation as no text; give a chat model's template")
    check_prompt(start, vocab, "the --chat conversation", where)
    turn = end_of_turn(template, tokenizer)
    stops = tuple(dict.fromkeys([*tokenizer.end_ids, *(turn if len(turn) == 1 else ())]))
    out = run(start, stops).tolist()
    if out and out[-1] in stops:
        out = out[:-1]
    reply = tokenizer.decode(out, None)
    if len(turn) > 1:  # an end of turn of several tokens: cut at it
        reply = reply.split(tokenizer.decode(list(turn), None))[0]
    return reply


def sample_hf(
    spec: str,
    prompt: str | None,
    tokens: int,
    *,
    temperature: float,
    top_k: int,
    seed: int,
    ids: list[int] | None = None,
    chat: str | None = None,
    system: str | None = None,
    repetition_penalty: float = 1.0,
) -> str:
    """:func:`sample` of a Hugging Face checkpoint ``hf:PATH`` before any training. With ``ids``
    (token ids) the continuation's ids are returned, space-separated. A text ``prompt`` is encoded
    with the checkpoint's own tokenizer (its ``tokenizer.json``, after the ids it puts before a
    text, e.g. Llama's BOS; GPT-2's for a GPT-2 without one) and text returned, generation
    stopping at any of its end ids. Without either, generation starts a new document (the BOS or
    end-of-text id; GPT-2's last id). With ``chat``, the reply to that message (module docstring)."""
    from jaxnet.predict import hf_model

    checkpoint = hf.read(spec)
    vocab = checkpoint.vocab
    tok = hf_tokenizer(checkpoint.directory, vocab, checkpoint.table.model_type)
    stops = tok.end_ids if tok is not None and tok.kind == "hf" else ()
    if chat is not None:
        template = chat_template_of(tok, None, spec)

        def run(start: np.ndarray, stop_ids: tuple[int, ...]) -> np.ndarray:
            _, model, params = hf_model(checkpoint, context=-(-(len(start) + tokens) // 256) * 256)
            kw = dict(temperature=temperature, top_k=top_k, seed=seed, stop_ids=stop_ids)
            return generate(model, params, start, tokens, **kw, repetition_penalty=repetition_penalty)

        return _chat(template, tok, chat, system, tokens, run, vocab, spec)
    if ids is not None:
        start = np.asarray(ids, np.int32)
        if start.size and (start.min() < 0 or start.max() >= vocab):
            raise UserError(f"--ids holds ids {start.min()}..{start.max()}; this checkpoint has ids 0..{vocab - 1}")
    elif tok is None:
        if prompt:
            raise UserError(
                f"{spec} has no tokenizer.json to encode --prompt with; give the prompt as token ids (--ids 1,2,3) "
                "or save the checkpoint's tokenizer into the directory (tokenizer.save_pretrained)"
            )
        start = np.asarray([vocab - 1], np.int32)
    elif prompt:
        before = list(tok.before) if tok.kind == "hf" else []
        start = np.asarray(before + tok.encode_batch([prompt])[0].tolist(), np.int32)
    else:
        start = np.asarray([tok.start_id({})], np.int32)  # a new document
    if ids is None:
        check_prompt(start, vocab, "--prompt" if prompt else "the start of a document", spec)
    # A rotary model is built with the positions this sample needs (a multiple of 256), not its
    # whole context: the decoding cache of a 128K-context model would not fit beside it.
    _, model, params = hf_model(checkpoint, context=-(-(len(start) + tokens) // 256) * 256)
    kw = dict(temperature=temperature, top_k=top_k, seed=seed, stop_ids=stops, repetition_penalty=repetition_penalty)
    out = generate(model, params, start, tokens, **kw)
    if ids is not None or tok is None:
        return " ".join(map(str, out.tolist()))
    if len(out) and int(out[-1]) in stops:
        out = out[:-1]
    return (prompt or "") + tok.decode(out.tolist(), None)


def _refuse_without_vocabulary(workdir: Path) -> None:
    """A one-line error for a run whose data was token ids given from Python or an experiment
    file's ``data(cfg)``: it never had a vocabulary, so say how to generate ids instead."""
    import json

    from jaxnet.config import RUN_KEY

    try:
        data = json.loads((workdir / "config.json").read_text())[RUN_KEY]["trained"]["data"]
        given, kind = data["from"], data["kind"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # a run from before the record: read_vocab says what is missing
    if given == "config":
        return
    where = "from Python" if given == "python" else "by its experiment file's data(cfg)"
    raise UserError(
        f"{workdir} was trained on token ids given {where} ({kind}), so it has no vocab.json to turn a prompt into "
        "ids and ids into text; generate ids from Python: trained = jaxnet.load(workdir); "
        "jaxnet.generate(trained.model.module, trained.params, prompt_ids, 200), then decode them with the "
        "tokenizer that made your ids"
    )


def sample(
    workdir: str | os.PathLike,
    prompt: str | None = None,
    tokens: int = 500,
    *,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
    ids: list[int] | None = None,
    chat: str | None = None,
    system: str | None = None,
    repetition_penalty: float = 1.0,
) -> str:
    """Text generated by the newest checkpoint of a language-model run, continuing ``prompt``
    (default: the start of a line); with ``ids`` (a prompt of token ids) the token ids generated,
    space-separated. ``workdir`` ``"hf:PATH"`` samples a Hugging Face checkpoint (:func:`sample_hf`).
    A run whose tokenizer is a checkpoint's (``hf:DIR``) stops at any of its end ids. With
    ``chat`` (a user's message; ``system``: a system turn before it) the reply alone, rendered and
    stopped by the chat template (module docstring). ``repetition_penalty`` > 1: the repetition
    guard of :func:`generate`::

        reply = sample("runs/chat", chat="Good morrow, sir.", temperature=0)
    """
    from jaxnet import config as config_lib
    from jaxnet import models
    from jaxnet.data.text import TextDataset, read_vocab

    if not hf.is_hf(workdir) and not (Path(workdir) / "config.json").is_file():
        raise UserError(f"{workdir} is not a run directory (no config.json); pass the --workdir of a training run")
    if tokens < 0:
        raise UserError(f"--tokens {tokens}: give a number of tokens >= 0")
    if temperature < 0 or not np.isfinite(temperature):
        raise UserError(f"--temperature {temperature}: give a finite temperature >= 0 (0 = always the likeliest)")
    if top_k < 0:
        raise UserError(f"--top-k {top_k}: give a count >= 0 (0 = no limit)")
    check_repetition_penalty(repetition_penalty)
    if ids is not None and not ids:
        raise UserError("--ids is empty; give at least one token id")
    if chat is not None and not chat.strip():
        raise UserError("--chat is empty; give the user's message")
    if hf.is_hf(workdir):
        kw = dict(temperature=temperature, top_k=top_k, seed=seed, ids=ids, chat=chat, system=system)
        return sample_hf(str(workdir), prompt, tokens, **kw, repetition_penalty=repetition_penalty)
    workdir = Path(workdir)
    cfg = config_lib.apply_overrides(
        config_lib.load(workdir / "config.json"),
        ["mesh.data=1", "mesh.fsdp=1", "mesh.expert=1", "mesh.context=1", "mesh.tensor=1"],
    )
    language_models = [name for name, family in models.REGISTRY.items() if family.inputs == "tokens"]
    if models.family(cfg.model.name).inputs != "tokens":
        raise UserError(
            f"{workdir} trained a {cfg.model.name}, not a language model; sampling needs one of "
            f"{', '.join(language_models)}"
        )
    if not getattr(cfg.model, "causal", True):
        raise UserError(
            f"{workdir} trained a bidirectional transformer (model.causal=false), which cannot generate text; "
            "sampling needs a causal model"
        )
    # The vocabulary comes from the run directory, so sampling does not need the training text.
    if not (workdir / "vocab.json").exists():
        _refuse_without_vocabulary(workdir)
    vocab, tokenizer = read_vocab(workdir / "vocab.json")
    dummy = np.zeros(2, np.int32)
    dataset = TextDataset(dummy, dummy[:0], dummy[:0], vocab, tokenizer, name="vocab.json")
    template = None
    if chat is not None:  # checked before the model is built
        from jaxnet.predict import run_tokenizer

        template = chat_template_of(dataset.codec, run_tokenizer(workdir, cfg)[1], str(workdir))
    if not (workdir / "checkpoints").exists():  # a file there is named by Checkpoints below
        raise UserError(f"{workdir} has no checkpoints yet; train first with `jaxnet train`")
    from jaxnet.predict import load

    trained = load(workdir)  # the one way a run's model is rebuilt and restored (LoRA adapters merged)
    model, params = trained.model.module, trained.params
    codec = dataset.codec
    stops = codec.end_ids if codec.kind == "hf" else ()
    kw = dict(temperature=temperature, top_k=top_k, seed=seed, stop_ids=stops, repetition_penalty=repetition_penalty)
    if template is not None:
        run = lambda start, stop_ids: generate(model, params, start, tokens, **{**kw, "stop_ids": stop_ids})
        return _chat(template, codec, chat, system, tokens, run, len(vocab), str(workdir))
    if ids is not None:
        start = np.asarray(ids, np.int32)
        if start.min() < 0 or start.max() >= len(vocab):
            raise UserError(f"--ids holds ids {start.min()}..{start.max()}; the run has ids 0..{len(vocab) - 1}")
        out = generate(model, params, start, tokens, **kw)
        return " ".join(map(str, out.tolist()))
    if not prompt:  # a new document (GPT-2, hf:DIR), line (characters, bytes) or sentence (words)
        start = np.asarray([codec.start_id(dataset.index)], np.int32)
    else:
        start = dataset.encode(prompt)
        if codec.kind == "hf":  # as documents were prepared: after the ids the tokenizer puts first (BOS)
            start = np.concatenate([np.asarray(codec.before, np.int32), start]).astype(np.int32)
    out = generate(model, params, start, tokens, **kw)
    if len(out) and int(out[-1]) in stops:
        out = out[:-1]
    return codec.join(prompt or "", dataset.decode(out))
