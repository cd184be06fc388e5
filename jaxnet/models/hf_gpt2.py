"""Hugging Face GPT-2 checkpoints in and out of jaxnet's Transformer, with numpy alone.

A checkpoint is a directory as ``transformers``' ``save_pretrained`` writes it: ``config.json``
(``model_type: gpt2``) and the weights in ``model.safetensors`` (read with ``safetensors.numpy``;
no PyTorch), a sharded ``model.safetensors.index.json``, or ``pytorch_model.bin`` (which needs
PyTorch). jaxnet never downloads one: see the docs for where published weights come from.

GPT-2 is jaxnet's :class:`~jaxnet.models.transformer.TransformerLanguageModel` with learned
positions, tied embeddings, the tanh GELU (``gelu_new``), LayerNorm epsilon 1e-5, softmax scaled
by 1 / sqrt(head size), biases on every projection and a final LayerNorm. Its ``Conv1D`` layers
keep their weights as ``[inputs, outputs]``, as Flax's kernels do; ``c_attn`` packs queries,
keys and values along its outputs, which jaxnet's ``qkv`` kernel names as axes
``(width, 3, heads, head size)``. The tensors by name::

    wte.weight [vocab, width]          -> embed/embedding (rows past GPT-2's vocabulary: padding)
    wpe.weight [positions, width]      -> position
    h.N.ln_1.weight / .bias            -> block_N/norm_1/scale / bias      (ln_2 -> norm_2)
    h.N.attn.c_attn.weight [w, 3w]     -> block_N/attention/qkv/kernel [w, 3, heads, head size]
    h.N.attn.c_proj.weight [w, w]      -> block_N/attention/out/kernel [heads, head size, w]
    h.N.mlp.c_fc.weight [w, 4w]        -> block_N/mlp_in/kernel            (c_proj -> mlp_out)
    ln_f.weight / .bias                -> norm_out/scale / bias
    lm_head.weight [vocab, width]      -> output/kernel [width, vocab] (untied models only)

>>> hf = read_config("checkpoints/gpt2")                 # doctest: +SKIP
>>> fields = model_fields(hf)                             # {'layers': 12, 'width': 768, ...}  # doctest: +SKIP
>>> params = to_params(read_tensors("checkpoints/gpt2"), hf)   # {'embed/embedding': ..., ...}  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError

PREFIX = "hf:"
"""How ``train.init_from``, :func:`jaxnet.load` and :func:`jaxnet.load_params` name a checkpoint directory."""

SAFETENSORS, INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"

#: GPT-2's activation names -> ``model.gelu``.
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}

#: Buffers an older ``transformers`` (and the published checkpoints) saved beside the weights: the
#: causal mask, which jaxnet computes instead.
_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def is_hf(spec: Any) -> bool:
    """Whether ``spec`` names a Hugging Face checkpoint directory (``hf:PATH``)."""
    return isinstance(spec, str | os.PathLike) and str(spec).startswith(PREFIX)


def hf_dir(spec: str | os.PathLike) -> Path:
    """The directory of ``hf:PATH``."""
    path = str(spec)[len(PREFIX) :]
    if not path:
        raise UserError(f"{spec!r} names no directory; give hf:PATH, a directory that save_pretrained wrote")
    return Path(path).expanduser()


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a GPT-2 checkpoint directory, checked to be GPT-2's (one-line
    :class:`UserError` otherwise)."""
    directory = Path(directory)
    if not directory.is_dir():
        what = "is a file" if directory.exists() else "does not exist"
        raise UserError(f"hf:{directory} {what}; give a directory that transformers' save_pretrained wrote")
    path = directory / "config.json"
    try:
        hf = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"hf:{directory} has no config.json; give a directory that save_pretrained wrote") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(hf, dict):
        raise UserError(f"{path} is not a JSON object; give the config.json that save_pretrained wrote")
    kind = hf.get("model_type")
    if kind != "gpt2":
        raise UserError(
            f"hf:{directory} holds a {kind or 'model of no model_type'}, not GPT-2 (config.json model_type={kind!r}); "
            "jaxnet reads GPT-2 checkpoints (model_type gpt2) only"
        )
    return hf


def model_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The ``model.*`` values of jaxnet's Transformer that compute what the GPT-2 of config ``hf``
    computes, and ``vocab``: GPT-2's vocabulary size. Options jaxnet does not compute are refused."""
    width, heads = int(hf.get("n_embd", 768)), int(hf.get("n_head", 12))
    inner = hf.get("n_inner") or 4 * width
    activation = hf.get("activation_function", "gelu_new")
    refused = []
    if activation not in GELU:
        refused.append(f"activation_function={activation!r} (jaxnet has {', '.join(GELU)})")
    if inner % width:
        refused.append(f"n_inner={inner}, not a multiple of n_embd={width}")
    if width % heads:
        refused.append(f"n_embd={width} not divisible by n_head={heads}")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        refused.append("scale_attn_by_inverse_layer_idx=true")
    if hf.get("scale_attn_weights", True) is False:
        refused.append("scale_attn_weights=false")
    if hf.get("add_cross_attention"):
        refused.append("add_cross_attention=true")
    if refused:
        raise UserError(f"this GPT-2 config has {'; '.join(refused)}, which jaxnet's Transformer does not compute")
    return {
        "layers": int(hf.get("n_layer", 12)),
        "width": width,
        "heads": heads,
        "mlp_ratio": int(inner) // width,
        "position": "learned",
        "causal": True,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "gelu": GELU[activation],
        "norm_eps": float(hf.get("layer_norm_epsilon", 1e-5)),
        "context": int(hf.get("n_positions", hf.get("n_ctx", 1024))),
        "vocab": int(hf.get("vocab_size", 50257)),
    }


def read_tensors(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory by its name, float32 (``model.safetensors``, a sharded
    safetensors index, or ``pytorch_model.bin`` when PyTorch is installed)."""
    directory = Path(directory)
    if (directory / SAFETENSORS).is_file() or (directory / INDEX).is_file():
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise UserError(
                "reading model.safetensors needs the safetensors package: pip install safetensors"
            ) from None
        if (directory / SAFETENSORS).is_file():
            files = [directory / SAFETENSORS]
        else:
            try:
                index = json.loads((directory / INDEX).read_text())
                files = [directory / name for name in sorted(set(index["weight_map"].values()))]
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise UserError(f"cannot read {directory / INDEX}: {e}") from None
        tensors: dict[str, np.ndarray] = {}
        for file in files:
            try:
                tensors.update(load_file(str(file)))
            except Exception as e:  # a truncated or foreign file: safetensors raises its own types
                raise UserError(f"cannot read {file} as safetensors: {type(e).__name__}: {str(e)[:200]}") from None
    elif (directory / TORCH_BIN).is_file():
        try:
            import torch
        except ImportError:
            raise UserError(
                f"hf:{directory} holds {TORCH_BIN}, which needs PyTorch to read: pip install torch, or convert "
                "it to model.safetensors (transformers' save_pretrained writes safetensors)"
            ) from None
        try:
            state = torch.load(directory / TORCH_BIN, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(f"cannot read {directory / TORCH_BIN}: {type(e).__name__}: {str(e)[:200]}") from None
        tensors = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise UserError(
            f"hf:{directory} has no weights ({SAFETENSORS} or {TORCH_BIN}); give a directory that save_pretrained wrote"
        )
    return {name: np.asarray(t, np.float32) for name, t in tensors.items()}


def _layer_map(fields: dict[str, Any]) -> dict[str, tuple[str, Any, Any]]:
    """GPT-2 tensor name -> (jaxnet path, GPT-2 array -> jaxnet array, jaxnet array -> GPT-2 array)."""
    w, heads = fields["width"], fields["heads"]
    hd = w // heads
    same = (lambda a: a, lambda a: a)
    mapping: dict[str, tuple[str, Any, Any]] = {
        "wte.weight": ("embed/embedding", *same),
        "wpe.weight": ("position", *same),
        "ln_f.weight": ("norm_out/scale", *same),
        "ln_f.bias": ("norm_out/bias", *same),
    }
    if not fields["tie_embeddings"]:
        mapping["lm_head.weight"] = ("output/kernel", lambda a: a.T, lambda a: a.T)
    for i in range(fields["layers"]):
        h, b = f"h.{i}.", f"block_{i}/"
        mapping |= {
            h + "ln_1.weight": (b + "norm_1/scale", *same),
            h + "ln_1.bias": (b + "norm_1/bias", *same),
            h + "ln_2.weight": (b + "norm_2/scale", *same),
            h + "ln_2.bias": (b + "norm_2/bias", *same),
            h + "attn.c_attn.weight": (
                b + "attention/qkv/kernel",
                lambda a: a.reshape(a.shape[0], 3, heads, hd),
                lambda a: a.reshape(a.shape[0], -1),
            ),
            h + "attn.c_attn.bias": (
                b + "attention/qkv/bias",
                lambda a: a.reshape(3, heads, hd),
                lambda a: a.reshape(-1),
            ),
            h + "attn.c_proj.weight": (
                b + "attention/out/kernel",
                lambda a: a.reshape(heads, hd, a.shape[-1]),
                lambda a: a.reshape(-1, a.shape[-1]),
            ),
            h + "attn.c_proj.bias": (b + "attention/out/bias", *same),
            h + "mlp.c_fc.weight": (b + "mlp_in/kernel", *same),
            h + "mlp.c_fc.bias": (b + "mlp_in/bias", *same),
            h + "mlp.c_proj.weight": (b + "mlp_out/kernel", *same),
            h + "mlp.c_proj.bias": (b + "mlp_out/bias", *same),
        }
    return mapping


def _shapes(fields: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape GPT-2 gives each of its tensors for ``fields``."""
    w, v, inner = fields["width"], fields["vocab"], fields["mlp_ratio"] * fields["width"]
    shapes = {"wte.weight": (v, w), "wpe.weight": (fields["context"], w), "ln_f.weight": (w,), "ln_f.bias": (w,)}
    if not fields["tie_embeddings"]:
        shapes["lm_head.weight"] = (v, w)
    for i in range(fields["layers"]):
        h = f"h.{i}."
        shapes |= {h + f"ln_{k}.{p}": (w,) for k in (1, 2) for p in ("weight", "bias")}
        shapes |= {
            h + "attn.c_attn.weight": (w, 3 * w),
            h + "attn.c_attn.bias": (3 * w,),
            h + "attn.c_proj.weight": (w, w),
            h + "attn.c_proj.bias": (w,),
            h + "mlp.c_fc.weight": (w, inner),
            h + "mlp.c_fc.bias": (inner,),
            h + "mlp.c_proj.weight": (inner, w),
            h + "mlp.c_proj.bias": (w,),
        }
    return shapes


def to_params(tensors: dict[str, np.ndarray], hf: dict[str, Any], vocab: int | None = None) -> dict[str, np.ndarray]:
    """jaxnet's Transformer parameters, by path (``block_0/attention/qkv/kernel``), from GPT-2's
    tensors. ``vocab`` (default GPT-2's) is the vocabulary jaxnet's model has: the rows past
    GPT-2's are zeros (padding, masked by ``model.vocab_used``). Every tensor must find its place
    and have the shape the config gives it, else a one-line :class:`UserError` naming both."""
    fields = model_fields(hf)
    names = {n.removeprefix("transformer."): t for n, t in tensors.items()}
    names = {n: t for n, t in names.items() if not _BUFFERS.fullmatch(n)}
    if fields["tie_embeddings"] and "lm_head.weight" in names:  # written out although tied: must be the same
        head = names.pop("lm_head.weight")
        if "wte.weight" in names and not np.array_equal(head, names["wte.weight"]):
            raise UserError(
                "lm_head.weight differs from transformer.wte.weight although config.json has tie_word_embeddings=true; "
                "set it to false in config.json, or save the model again"
            )
    mapping, shapes = _layer_map(fields), _shapes(fields)
    unplaced = sorted(set(names) - set(mapping))
    if unplaced:
        raise UserError(
            f"GPT-2 tensor {unplaced[0]} {tuple(names[unplaced[0]].shape)} has no place in jaxnet's Transformer of "
            f"{fields['layers']} blocks (config.json)"
            + (f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1 else "")
        )
    missing = [n for n in mapping if n not in names]
    if missing:
        raise UserError(
            f"the checkpoint lacks {missing[0]}, which jaxnet's {mapping[missing[0]][0]} needs"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    params = {}
    for name, (path, convert, _) in mapping.items():
        tensor = names[name]
        if tuple(tensor.shape) != shapes[name]:
            raise UserError(
                f"GPT-2 tensor {name} has shape {tuple(tensor.shape)}, but config.json makes it {shapes[name]} "
                f"(jaxnet's {path})"
            )
        params[path] = np.ascontiguousarray(convert(tensor))
    rows = fields["vocab"] if vocab is None else vocab
    if rows < fields["vocab"]:
        raise UserError(
            f"the data's vocabulary has {rows} ids, fewer than this GPT-2's {fields['vocab']}; tokenize with GPT-2's "
            "tokenizer (data.tokenizer=gpt2)"
        )
    for path in ("embed/embedding", "output/kernel"):
        if path in params and rows > fields["vocab"]:
            axis = 0 if path == "embed/embedding" else 1
            pad = [(0, 0), (0, 0)]
            pad[axis] = (0, rows - fields["vocab"])
            params[path] = np.pad(params[path], pad)
    return params


def nested(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """``{"a/b": x}`` as ``{"a": {"b": x}}``: the nesting Flax's parameters have."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def from_params(params: Any, model: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """GPT-2's ``config.json`` and tensors (named as ``GPT2LMHeadModel`` saves them) of jaxnet
    Transformer parameters (nested dicts) and their ``model.*`` config ``model`` (a
    :class:`~jaxnet.models.TransformerConfig` whose ``context`` is set). Padding rows past
    ``model.vocab_used`` are dropped. A model GPT-2 cannot express is a one-line :class:`UserError`."""
    different = []
    if model.name != "transformer":
        raise UserError(f"a Hugging Face GPT-2 checkpoint holds a Transformer; this run trained a {model.name}")
    if model.position != "learned":
        different.append(f"model.position={model.position} (GPT-2 learns its positions)")
    if not model.causal:
        different.append("model.causal=false (GPT-2 is causal)")
    if different:
        raise UserError(f"GPT-2 cannot hold this model: {'; '.join(different)}")
    flat = {"/".join(k): np.asarray(v, np.float32) for k, v in _flatten(params)}
    vocab_rows = flat["embed/embedding"].shape[0]
    vocab = model.vocab_used if 0 < model.vocab_used < vocab_rows else vocab_rows
    fields = {
        "layers": model.layers,
        "width": model.width,
        "heads": model.heads,
        "mlp_ratio": model.mlp_ratio,
        "tie_embeddings": model.tie_embeddings,
        "context": flat["position"].shape[0],
        "vocab": vocab,
    }
    tensors = {}
    for name, (path, _, back) in _layer_map(fields).items():
        if path not in flat:
            raise UserError(f"the run's parameters have no {path}, which GPT-2's {name} needs")
        value = flat[path]
        if path == "embed/embedding":
            value = value[:vocab]
        elif path == "output/kernel":
            value = value[:, :vocab]
        tensors[name if name == "lm_head.weight" else "transformer." + name] = np.ascontiguousarray(back(value))
    activation = {"tanh": "gelu_new", "exact": "gelu"}[model.gelu]
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_positions": fields["context"],
        "n_embd": model.width,
        "n_layer": model.layers,
        "n_head": model.heads,
        "n_inner": model.mlp_ratio * model.width,
        "activation_function": activation,
        "layer_norm_epsilon": model.norm_eps,
        "resid_pdrop": model.dropout,
        "embd_pdrop": model.dropout,
        "attn_pdrop": 0.0,  # jaxnet drops the attention's output, not its weights
        "tie_word_embeddings": model.tie_embeddings,
        "scale_attn_weights": True,
        "initializer_range": 0.02,
        "bos_token_id": vocab - 1,
        "eos_token_id": vocab - 1,
        "torch_dtype": "float32",
    }
    return config, tensors


def _flatten(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, dict) or hasattr(tree, "items"):
        out = []
        for k, v in tree.items():
            out += _flatten(v, (*prefix, str(k)))
        return out
    return [(prefix, tree)]


def write(directory: str | os.PathLike, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory`` (absent or empty) as one
    step: both are written into a temporary directory beside it, which is then renamed, so a failed
    write leaves nothing. A non-empty ``directory`` is refused (one line)."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise UserError("writing model.safetensors needs the safetensors package: pip install safetensors") from None
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        what = "is a file" if not directory.is_dir() else "is not empty"
        raise UserError(f"--out {directory} {what}; give a new or empty directory")
    if not directory.parent.is_dir():
        raise UserError(f"--out {directory}: directory {directory.parent} does not exist")
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(
            {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
            str(tmp / SAFETENSORS),
            metadata={"format": "pt"},
        )
        os.replace(tmp, directory)  # an empty directory there is replaced
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write {directory}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
