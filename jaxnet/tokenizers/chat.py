"""A checkpoint's chat template: conversations rendered as transformers renders them, and which
tokens are the assistant's.

The template is the Jinja text a chat model ships: ``chat_template.jinja`` beside its tokenizer
(what transformers 5 writes; named templates in ``additional_chat_templates/*.jinja``), else
``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}``).
Files take priority over the config, and of several named templates ``default`` is used, as
transformers loads them. It renders in a sandboxed Jinja environment set up as transformers'
``apply_chat_template`` sets up its own (``trim_blocks``, ``lstrip_blocks``, loop controls, the
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` globals, its ``tojson`` filter, the
``{% generation %}`` block), with the same variables (``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the tokenizer's named special tokens: ``bos_token``, ``eos_token``,
...), and the text is encoded without special tokens added, so the ids equal
``apply_chat_template``'s.

**The assistant's tokens** (:meth:`ChatTemplate.encode`): a template with ``{% generation %}``
blocks marks them itself, and a token counts if it overlaps a marked span of the text (the rule of
transformers' ``return_assistant_tokens_mask``). A template without them (most checkpoints'
templates) gets its spans derived by rendering prefixes of the conversation: an assistant turn
``i`` is the text that rendering turns ``0..i`` adds to rendering turns ``0..i-1`` with the
generation prompt (from where the two first differ), less the whitespace at its end (the line
break some templates put after the end-of-turn token), so the reply and its end-of-turn token
count, the header that opens the turn does not. Where the template does not render turn after
turn (the conversation before a turn, or up to it, renders differently once more turns follow:
some templates drop earlier turns' reasoning, or write the system text last), the prefixes
cannot say, and it is a one-line error asking for a template with ``{% generation %}`` blocks.

Why not transformers itself: it is a test-time reference here (with torch), not a dependency; the
rendering is jinja2's, which is.

>>> template = load("checkpoints/my-llama")                                     # doctest: +SKIP
>>> text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)  # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError

#: The named special tokens a template sees (transformers' ``SPECIAL_TOKENS_ATTRIBUTES``).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
GENERATION = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
#: Message keys transformers also passes under another name (a message's reasoning).
REASONING = ("reasoning_content", "thinking", "reasoning")


# ---------------------------------------------------------------------------------------------
# The Jinja environment


_SPANS: contextvars.ContextVar = contextvars.ContextVar("jaxnet_generation_spans", default=None)


@functools.cache
def _environment() -> Any:
    """The sandboxed environment every template compiles in (built once: it imports jinja2)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UserError("chat templates need jinja2; run `pip install jinja2`") from None

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body, and while spans are being
        recorded, records where in the output the body lies."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller: Any) -> str:
            text = caller()
            record = _SPANS.get()
            if record is not None:
                written, spans = record
                start = sum(len(b) for b in written)
                spans.append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
        # Jinja's own filter escapes HTML characters; templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        """``dict(...)`` and ``dict.fromkeys(...)`` inside a template, nothing more of the type."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        """Jinja's ``namespace`` refusing names that start with an underscore."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = Namespace
    return env


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template does not compile: {e.message} (line {e.lineno})") from None


# ---------------------------------------------------------------------------------------------
# The template


class ChatTemplate:
    """A chat template with the variables it renders with (see the module docstring).

    ``source`` is the Jinja text, ``variables`` the tokenizer's named special tokens as strings,
    ``origin`` where it came from (for messages).

    >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", {})
    >>> t.render([{"role": "user", "content": "Hi"}])
    '<user>Hi'
    """

    def __init__(self, source: str, variables: Mapping[str, str] | None = None, origin: str = "the chat template"):
        self.source = source
        self.variables = dict(variables or {})
        self.origin = origin
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
        self.marked = bool(GENERATION.search(source))
        self._template = _compiled(source)

    def __repr__(self) -> str:
        how = "generation blocks" if self.marked else "no generation blocks"
        return f"<chat template {self.sha256[:12]} from {self.origin}, {how}>"

    def _context(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> dict[str, Any]:
        return {
            **self.variables,
            "messages": prepared(messages),
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False) -> str:
        """The text of a conversation (a list of ``{"role", "content"}``), with the header of an
        assistant turn after it when ``add_generation_prompt``.

        >>> ChatTemplate("{{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}").render(
        ...     [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        'Hi>'
        """
        return self._run(lambda: self._template.render(self._context(messages, add_generation_prompt)))

    def render_marked(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """The text of a conversation and the spans (character start, end) of its
        ``{% generation %}`` blocks, as transformers records them.

        >>> ChatTemplate("a{% generation %}bc{% endgeneration %}").render_marked([])
        ('abc', [(1, 3)])
        """
        written: list[str] = []
        spans: list[tuple[int, int]] = []

        def run() -> str:
            token = _SPANS.set((written, spans))
            try:
                for block in self._template.generate(self._context(messages, False)):
                    written.append(block)
            finally:
                _SPANS.reset(token)
            return "".join(written)

        return self._run(run), spans

    def _run(self, render: Any) -> Any:
        import jinja2

        try:
            return render()
        except jinja2.TemplateError as e:
            raise UserError(f"{self.origin} refused the conversation: {e}") from None
        except Exception as e:  # noqa: BLE001 - a template's own error (a key it needs, a wrong type)
            raise UserError(f"{self.origin} failed on the conversation: {type(e).__name__}: {e}") from None

    def assistant_spans(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """The text of a conversation and the character spans of the assistant's turns: the
        template's ``{% generation %}`` blocks where it has them, else derived from rendering
        prefixes (module docstring).

        >>> t = ChatTemplate("{% for m in messages %}[{{ m.role }}]{{ m.content }}.\\n{% endfor %}"
        ...                  "{% if add_generation_prompt %}[assistant]{% endif %}")
        >>> t.assistant_spans([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])
        ('[user]Hi.\\n[assistant]Yo.\\n', [(21, 24)])
        """
        if self.marked:
            return self.render_marked(messages)
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            earlier = self.render(messages[:i]) if i else ""
            prompted = self.render(messages[:i], add_generation_prompt=True) if i else ""
            through = self.render(messages[: i + 1])
            start = _common_prefix(prompted, through)
            end = len(through.rstrip())
            if not through.startswith(earlier) or not text.startswith(through[:end]):
                raise UserError(
                    f"{self.origin} does not render a conversation turn after turn (the turns before assistant turn "
                    f"{i + 1}, or the conversation up to it, render differently once more turns follow), so the "
                    "assistant's tokens cannot be found from prefixes; give a template that marks them with "
                    "{% generation %} ... {% endgeneration %} (--chat-template FILE)"
                )
            if end > start:
                spans.append((start, end))
        return text, spans

    def end_of_turn(self, encode: Any) -> tuple[int, ...]:
        """The ids this template closes an assistant's reply with (``<|im_end|>``, ``<|eot_id|>``,
        ...): what it writes after a reply inside the assistant's span (:meth:`assistant_spans`),
        encoded by ``encode`` (text -> ids); empty when it writes nothing there, or cannot say.

        >>> ChatTemplate("{% for m in messages %}{{ m.content }}<end>\\n{% endfor %}").end_of_turn(list)
        ('<', 'e', 'n', 'd', '>')
        """
        probe = "jaxnet"
        messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": probe}]
        try:
            text, spans = self.assistant_spans(messages)
        except UserError:
            return ()
        if not spans:
            return ()
        start, end = spans[-1]
        piece = text[start:end]
        at = piece.rfind(probe)
        tail = piece[at + len(probe) :] if at >= 0 else ""
        return tuple(encode(tail)) if tail.strip() else ()

    def encode(self, messages: Sequence[Mapping[str, Any]], tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
        """The conversation's token ids (as ``apply_chat_template`` gives them) and a 0/1 mask of
        the assistant's tokens (``return_assistant_tokens_mask``'s rule: a token overlapping an
        assistant span counts), for an ``hf:DIR`` tokenizer (:class:`~jaxnet.tokenizers.hf.HF`).

        >>> ids, mask = template.encode(conversation, tokenizers.get("hf:checkpoints/my-llama"))  # doctest: +SKIP
        """
        text, spans = self.assistant_spans(messages)
        ids, offsets = tokenizer.encode_with_offsets([text])[0]
        return np.asarray(ids, np.int64), overlap_mask(offsets, spans)


def overlap_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """1 for each token (character ``offsets`` start, end) that overlaps one of ``spans`` (in order),
    else 0: a token counts if it ends after a span starts and starts before it ends.

    >>> overlap_mask([(0, 2), (2, 4), (4, 6)], [(3, 4)]).tolist()
    [0, 1, 0]
    """
    mask = np.zeros(len(offsets), np.uint8)
    k = 0
    for i, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[i] = 1
    return mask


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def prepared(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: keys whose value is None dropped, a
    reasoning field given under each name templates read it by."""
    out = []
    for message in messages:
        m = {k: v for k, v in message.items() if v is not None}
        reasoning = next((m[k] for k in REASONING if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------------
# Finding a checkpoint's template


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return value if isinstance(value, dict) else {}


def _token_string(value: Any, named: bool) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or (a named one) an
    ``AddedToken`` object with its ``content``."""
    if isinstance(value, str):
        return value
    if named and isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens(directory: str | Path) -> dict[str, str]:
    """The named special tokens of a checkpoint's tokenizer, as transformers passes them to a
    template: ``tokenizer_config.json``'s ``bos_token``, ``eos_token``, ... (and its own
    ``*_token`` keys), from ``special_tokens_map.json`` where the config predates
    ``added_tokens_decoder``.

    >>> special_tokens("checkpoints/my-llama")["bos_token"]        # doctest: +SKIP
    '<|begin_of_text|>'
    """
    path = Path(directory)
    config = _json(path / "tokenizer_config.json")
    found: dict[str, str] = {}
    for key, value in config.items():
        if key.endswith("_token"):
            token = _token_string(value, key in SPECIAL_TOKENS)
            if token is not None:
                found[key] = token
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        found.update({k: v for k, v in extra.items() if isinstance(v, str)})
    if "added_tokens_decoder" not in config:
        for key, value in _json(path / "special_tokens_map.json").items():
            token = _token_string(value, True)
            if key.endswith("_token") and token is not None:
                found[key] = token
    return found


def sources(directory: str | Path) -> dict[str, str]:
    """The chat templates of a checkpoint directory by name (``default`` for a single one): its
    ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``, else ``tokenizer_config.json``'s
    ``chat_template``."""
    path = Path(directory)
    found: dict[str, str] = {}
    if (path / TEMPLATE_FILE).is_file():
        found["default"] = (path / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (path / TEMPLATE_DIR).is_dir():
        for f in sorted((path / TEMPLATE_DIR).glob("*.jinja")):
            found[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
    if found:
        return found
    value = _json(path / "tokenizer_config.json").get("chat_template")
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {t["name"]: t["template"] for t in value if isinstance(t, dict) and {"name", "template"} <= set(t)}
    return {}


def load(directory: str | Path, file: str | Path | None = None) -> ChatTemplate:
    """The chat template of checkpoint ``directory`` (or the Jinja text of ``file`` in its place),
    with the directory's special tokens; a one-line error if it has none.

    >>> load("checkpoints/my-llama").marked                          # doctest: +SKIP
    False
    """
    path = Path(directory)
    variables = special_tokens(path)
    if file is not None:
        try:
            source = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--chat-template {file}: cannot read it ({e})") from None
        return ChatTemplate(source, variables, f"the chat template {file}")
    found = sources(path)
    if not found:
        raise UserError(
            f"hf:{directory} has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json); "
            "give a chat model's directory, or a template with --chat-template FILE"
        )
    if len(found) > 1 and "default" not in found:
        raise UserError(
            f"hf:{directory} has chat templates {', '.join(sorted(found))} and none named default; "
            "give the one to use with --chat-template FILE"
        )
    name = "default" if "default" in found else next(iter(found))
    return ChatTemplate(found[name], variables, f"the chat template of hf:{directory}")


# ---------------------------------------------------------------------------------------------
# Rendering and tokenizing conversations for jaxnet prepare chat, in its own process or in its
# worker processes (this module imports nothing of jaxnet.data, and so nothing of JAX)

_WORKER: tuple[Any, ChatTemplate] | None = None


def worker_init(tokenizer: Any, template_source: str, variables: dict, origin: str) -> None:
    """Keep a ``jaxnet prepare chat`` worker's tokenizer and template (started by
    :func:`jaxnet.tokenizers.workers.start`) for :func:`worker_encode`."""
    global _WORKER
    _WORKER = (tokenizer, ChatTemplate(template_source, variables, origin))


def encode_conversations(
    tokenizer: Any, template: ChatTemplate, conversations: Sequence[tuple[str, list]], dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The conversations one after another: their ids (in ``dtype``), the assistant mask (uint8)
    and each one's length. A template error names the conversation's line."""
    texts, spans = [], []
    for where, messages in conversations:
        try:
            text, found = template.assistant_spans(messages)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        texts.append(text)
        spans.append(found)
    encoded = tokenizer.encode_with_offsets(texts)
    ids = [np.asarray(i, dtype) for i, _ in encoded]
    masks = [overlap_mask(offsets, s) for (_, offsets), s in zip(encoded, spans, strict=True)]
    lengths = np.asarray([len(i) for i in ids], np.uint32)
    if not ids:
        return np.zeros(0, dtype), np.zeros(0, np.uint8), lengths
    return np.concatenate(ids), np.concatenate(masks), lengths


def worker_encode(conversations: Sequence[tuple[str, list]], dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`encode_conversations` in a worker process started with :func:`worker_init`."""
    assert _WORKER is not None, "worker_init first"
    return encode_conversations(*_WORKER, conversations, dtype)


__all__ = [
    "ChatTemplate",
    "encode_conversations",
    "load",
    "overlap_mask",
    "prepared",
    "sources",
    "special_tokens",
]
