"""What an architecture table is, and the one converter every table shares.

A table (:class:`Table`) says, for one Hugging Face architecture, how its ``config.json`` becomes
the Transformer's ``model.*`` keys and back, and which file tensor holds which of the model's
parameters: :class:`Rule` s with per-layer names as templates (``h.{i}.attn.c_attn.weight`` ->
``block_{i}/attention/query/kernel``, ...) and a :class:`Layout` that says how the model's arrays
sit in the file's tensor (transposed, several concatenated, the vocabulary padded). Shapes come
from the model itself (``jax.eval_shape`` of its ``init``), never from a table of their own, and
the converter (:func:`fill`, :func:`file_tensors`) checks that every model tensor is filled and
every file tensor used before it reads anything.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxnet.errors import UserError
from jaxnet.models.hf.files import Tensors


@dataclass(frozen=True)
class Layout:
    """How one or more of the model's arrays sit in one file tensor.

    Each model array is seen as a matrix (``inputs`` leading axes by the rest; a vector when
    ``inputs`` is 0); several are concatenated along the outputs; the file holds that matrix as it
    is (``[inputs, outputs]``, GPT-2's ``Conv1D``) or ``transposed`` (``[outputs, inputs]``,
    PyTorch's ``Linear``). ``vocab`` names the model's axis that is the vocabulary (``"rows"``:
    the first, an embedding; ``"cols"``: the last, an output kernel), where the model may have
    more ids than the file (padding: zeros in, dropped out).
    """

    inputs: int = 1
    transposed: bool = False
    vocab: str = ""

    def _matrix(self, shape: tuple[int, ...], vocab: int | None) -> tuple[int, ...]:
        shape = list(shape)
        if self.vocab == "rows" and vocab is not None:
            shape[0] = vocab
        elif self.vocab == "cols" and vocab is not None:
            shape[-1] = vocab
        if self.inputs == 0:
            return (math.prod(shape),)
        return (math.prod(shape[: self.inputs]), math.prod(shape[self.inputs :]))

    def file_shape(self, shapes: list[tuple[int, ...]], vocab: int | None) -> tuple[int, ...]:
        """The file tensor's shape that holds arrays of ``shapes`` (the file's vocabulary ``vocab``)."""
        views = [self._matrix(s, vocab) for s in shapes]
        if len(views[0]) == 1:
            return (sum(v[0] for v in views),)
        matrix = (views[0][0], sum(v[1] for v in views))
        return matrix[::-1] if self.transposed else matrix

    def to_model(self, tensor: np.ndarray, shapes: list[tuple[int, ...]], vocab: int | None) -> list[np.ndarray]:
        """The model's arrays (of ``shapes``) that file ``tensor`` holds."""
        if self.transposed:
            tensor = tensor.T
        sizes = [self._matrix(s, vocab)[-1] for s in shapes]
        parts = np.split(tensor, np.cumsum(sizes)[:-1], axis=-1) if len(shapes) > 1 else [tensor]
        out = []
        for part, shape in zip(parts, shapes, strict=True):
            have = list(shape)
            if self.vocab == "rows" and vocab is not None:
                have[0] = vocab
            elif self.vocab == "cols" and vocab is not None:
                have[-1] = vocab
            array = part.reshape(have)
            if tuple(have) != tuple(shape):  # the model's vocabulary is larger: zero rows or columns
                pad = [(0, want - got) for want, got in zip(shape, have, strict=True)]
                array = np.pad(array, pad)
            out.append(np.ascontiguousarray(array))
        return out

    def to_file(self, arrays: list[np.ndarray], vocab: int | None) -> np.ndarray:
        """The file tensor that holds the model's ``arrays`` (padding past ``vocab`` dropped)."""
        views = []
        for a in arrays:
            if self.vocab == "rows" and vocab is not None:
                a = a[:vocab]
            elif self.vocab == "cols" and vocab is not None:
                a = a[..., :vocab]
            views.append(a.reshape(self._matrix(a.shape, None)))
        matrix = np.concatenate(views, axis=-1) if len(views) > 1 else views[0]
        return np.ascontiguousarray(matrix.T if self.transposed else matrix)


@dataclass(frozen=True)
class Rule:
    """File tensor ``file`` holds the model's parameters ``model`` (paths) as ``layout`` says. A
    ``{i}`` in the names stands for the block's number::

        Rule("h.{i}.attn.c_attn.weight", ("block_{i}/attention/query/kernel", ...), Layout(inputs=1))

    ``stack`` names the model key that counts file tensors held by one model array along its first
    axis: ``{e}`` in ``file`` stands for each one's number (a mixture's experts, one tensor each in
    the files, one stacked array in the model), each laid out as ``layout`` says. ``into`` and
    ``out`` transform a value on its way into the model and back out (each the other's inverse)::

        Rule("layers.{i}.mlp.experts.{e}.w1.weight", ("block_{i}/experts/gate",), LINEAR, stack="experts")
        Rule("norm.weight", ("norm_out/scale",), VECTOR, into=lambda w: w + 1, out=lambda s: s - 1)
    """

    file: str
    model: tuple[str, ...]
    layout: Layout = Layout()
    stack: str = ""
    into: Callable[[np.ndarray], np.ndarray] | None = None
    out: Callable[[np.ndarray], np.ndarray] | None = None

    def expand(self, layers: int) -> list[Rule]:
        """The rule for each block (or itself when it names none)."""
        if "{i}" not in self.file:
            return [self]
        each = lambda i: dataclasses.replace(  # noqa: E731
            self, file=self.file.replace("{i}", str(i)), model=tuple(m.format(i=i) for m in self.model)
        )
        return [each(i) for i in range(layers)]

    def files(self, keys: dict[str, Any]) -> list[str]:
        """The file tensors this (expanded) rule reads or writes: ``file``, or one per stacked entry."""
        if not self.stack:
            return [self.file]
        return [self.file.replace("{e}", str(e)) for e in range(int(keys[self.stack]))]

    def shapes(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The shapes of the model's arrays as one file tensor holds them (a stacked one's first axis off)."""
        return [tuple(s[1:]) for s in shapes] if self.stack else shapes


class Table:
    """One Hugging Face architecture: its ``config.json`` both ways and its tensors.

    A table defines ``model_type`` (``config.json``'s), ``title`` (for messages), ``family`` (the
    registered model family it builds: ``model.name``), ``prefix`` (put before every file name but
    those in ``unprefixed``), ``ignored`` (a regex of file tensors that are not weights: buffers),
    and the methods :meth:`keys` (config -> ``model.*`` keys, refusing what the family does not
    compute), :meth:`config` (back), :meth:`model` (the family's config of those keys) and
    :meth:`rules` (the tensors, for a model of these keys). ``aliases`` are file tensors that must
    equal another (a tied output head saved anyway). Whether a run's model can be written as this
    architecture is found by writing its ``config.json`` and reading it back
    (:func:`jaxnet.models.hf.refusals`): a key the table cannot write comes back otherwise, so a
    key added to the family later is refused without editing any table.
    """

    model_type: str = ""
    title: str = ""
    family: str = "transformer"
    prefix: str = ""
    unprefixed: tuple[str, ...] = ()
    ignored: str = r"(?!)"
    architectures: tuple[str, ...] = ()

    def keys(self, config: dict[str, Any]) -> dict[str, Any]:
        """``model.*`` keys of the Transformer that computes what ``config`` describes, plus
        ``vocab`` (the checkpoint's vocabulary) and ``context`` (its positions)."""
        raise NotImplementedError

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        """The ``config.json`` of a model of ``model.*`` keys ``keys`` (a dict of them), ``vocab``
        ids and ``context`` positions."""
        raise NotImplementedError

    def model(self, keys: dict[str, Any], vocab: int) -> Any:
        """The ``model.*`` config (of :attr:`family`) of keys ``keys`` (:meth:`keys` less ``vocab``
        and ``context``), predicting the checkpoint's ``vocab`` ids."""
        from jaxnet.models.base import family

        return family(self.family).config(**keys, vocab_used=vocab)

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        """Every rule of a model of these keys, per-layer templates included."""
        raise NotImplementedError

    def aliases(self, keys: dict[str, Any]) -> dict[str, str]:
        """File tensors that, present, must equal another (name -> the other's name)."""
        return {}

    def file_name(self, name: str) -> str:
        """The name a tensor is saved under (with ``prefix``)."""
        return name if name in self.unprefixed else self.prefix + name


def _expanded(table: Table, keys: dict[str, Any]) -> list[Rule]:
    return [r for rule in table.rules(keys) for r in rule.expand(keys["layers"])]


def check(
    table: Table, keys: dict[str, Any], tensors: Tensors, shapes: dict[str, tuple[int, ...]], vocab: int
) -> tuple[list[Rule], dict[str, str], dict[str, str]]:
    """Check a checkpoint's tensors against the model without reading any: a file tensor no rule
    places, a rule's tensor the file lacks, a model parameter no rule fills, a tensor of another
    shape than the model makes it is a one-line :class:`UserError` naming the first. ``shapes``
    are the model's parameter shapes by path (from ``jax.eval_shape`` of its init), ``vocab`` the
    file's vocabulary. Returns the rules, the file's names (short -> saved) and the aliases."""
    names = {}
    ignored = re.compile(table.ignored)
    for name in tensors.names():
        short = name[len(table.prefix) :] if table.prefix and name.startswith(table.prefix) else name
        if not ignored.fullmatch(short):
            names[short] = name
    aliases = {a: b for a, b in table.aliases(keys).items() if a in names}
    rules = _expanded(table, keys)
    by_file = {f: r for r in rules for f in r.files(keys)}
    unplaced = [n for n in names if n not in by_file and n not in aliases]
    if unplaced:
        first = unplaced[0]
        raise UserError(
            f"{table.title} tensor {first} {tensors.shape(names[first])} has no place in jaxnet's Transformer of "
            f"{keys['layers']} blocks (config.json)" + (f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1 else "")
        )
    missing = [(f, r) for r in rules for f in r.files(keys) if f not in names]
    if missing:
        raise UserError(
            f"the checkpoint lacks {missing[0][0]}, which jaxnet's {missing[0][1].model[0]} needs"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    filled = {p for r in rules for p in r.model}
    unfilled = [p for p in shapes if p not in filled]
    if unfilled:
        raise UserError(f"no {table.title} tensor fills jaxnet's {unfilled[0]}; this checkpoint cannot start the model")
    for rule in rules:
        want = rule.layout.file_shape(rule.shapes([shapes[p] for p in rule.model]), vocab)
        for file in rule.files(keys):
            have = tensors.shape(names[file])
            if have != want:
                raise UserError(
                    f"{table.title} tensor {file} has shape {have}, but config.json makes it {want} "
                    f"(jaxnet's {', '.join(rule.model)})"
                )
    return rules, names, aliases


def fill(
    table: Table,
    keys: dict[str, Any],
    tensors: Tensors,
    shapes: dict[str, tuple[int, ...]],
    vocab: int,
    dtype: Any = np.float32,
) -> Iterator[tuple[str, np.ndarray]]:
    """Every model parameter (path, array of ``dtype``; None: the file's) from the file
    ``tensors``, one file tensor read at a time, after :func:`check` (everything is checked before
    the first read)."""
    rules, names, aliases = check(table, keys, tensors, shapes, vocab)
    for alias, source in aliases.items():
        if not np.array_equal(tensors.read(names[alias]), tensors.read(names[source])):
            raise UserError(
                f"{alias} differs from {names[source]} although config.json has tie_word_embeddings=true; set it "
                "to false in config.json, or save the model again"
            )
    for rule in rules:
        each = rule.shapes([shapes[p] for p in rule.model])
        parts = [rule.layout.to_model(tensors.read(names[f], dtype), each, vocab) for f in rule.files(keys)]
        arrays = [np.stack(stacked) for stacked in zip(*parts, strict=True)] if rule.stack else parts[0]
        for path, array in zip(rule.model, arrays, strict=True):
            # a transformed value in float32 (w + 1 in bfloat16 would lose w's low bits)
            yield path, array if rule.into is None else np.asarray(rule.into(array.astype(np.float32)), np.float32)


def file_tensors(
    table: Table, keys: dict[str, Any], get: Callable[[str], np.ndarray], vocab: int, dtype: Any = np.float32
) -> Iterator[tuple[str, np.ndarray]]:
    """Every file tensor (saved name, array of ``dtype``: float32, or bfloat16) of a model of
    ``keys`` whose parameters ``get`` gives by path, with ``vocab`` ids (padding rows past it
    dropped), one at a time."""
    for rule in _expanded(table, keys):
        arrays = [np.asarray(get(p)) for p in rule.model]
        if rule.out is not None:  # in the model's precision, then the file's
            arrays = [np.asarray(rule.out(a.astype(np.float32)), np.float32) for a in arrays]
        arrays = [a.astype(dtype) for a in arrays]
        files = rule.files(keys)
        for e, file in enumerate(files):
            held = [a[e] for a in arrays] if rule.stack else arrays
            yield table.file_name(file), rule.layout.to_file(held, vocab)
