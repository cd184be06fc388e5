"""Hugging Face checkpoint files: tensors read one at a time, and written in shards.

Reading (:class:`Tensors`): ``model.safetensors``, a sharded ``model.safetensors.index.json``
(every file it names), or ``pytorch_model.bin`` (needs PyTorch). Safetensors files are opened
lazily (``safetensors.safe_open``): a tensor's name and shape are known without reading it, and
each tensor is read (in its own dtype or converted, e.g. to float32: bfloat16 through
``ml_dtypes``, which gives numpy the type) only when asked for, so a reader never holds much more
than one tensor. Each read opens the file and closes it again: ``safe_open`` memory-maps the file,
and every page of a mapping that stays open counts in the process's resident memory, so a reader
holding its files open would hold the whole checkpoint once every tensor was read.

Writing (:func:`write`): ``config.json`` and the tensors, in shards of at most
``max_shard_bytes`` as ``transformers``' ``save_pretrained`` cuts them (in order; a tensor that
would tip a shard over starts the next; one larger than the limit has a shard of its own):
``model.safetensors`` when one shard holds all, else ``model-00001-of-0000N.safetensors`` ... with
``model.safetensors.index.json`` (``metadata.total_size`` in bytes, ``metadata.total_parameters``,
``weight_map``). Everything is written into a temporary directory beside the target, which is
renamed into place at the end: a failed write leaves nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy: safetensors then reads bf16 tensors)
import numpy as np

from jaxnet.errors import UserError

SAFETENSORS, INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"

#: transformers' ``save_pretrained`` before 5.0 cut shards at 5 GB (``max_shard_size="5GB"``, 10**9
#: bytes to the GB), as the published multi-file checkpoints are cut.
MAX_SHARD_BYTES = 5 * 10**9


class Tensors:
    """The tensors of a checkpoint directory by name, read lazily::

    tensors = Tensors(Path("checkpoints/gpt2"))
    tensors.shape("wte.weight")        # (50257, 768): nothing read yet
    tensors.read("wte.weight")         # float32 numpy array
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._where: dict[str, str] = {}  # tensor name -> file name
        self._torch: dict[str, Any] | None = None
        if (directory / SAFETENSORS).is_file():
            self._open(SAFETENSORS)
        elif (directory / INDEX).is_file():
            try:
                index = json.loads((directory / INDEX).read_text())
                files = sorted(set(index["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise UserError(f"cannot read {directory / INDEX}: {e}") from None
            for name in files:
                self._open(name)
        elif (directory / TORCH_BIN).is_file():
            self._torch = _torch_state(directory / TORCH_BIN)
        else:
            raise UserError(
                f"hf:{directory} has no weights ({SAFETENSORS} or {TORCH_BIN}); give a directory that "
                "save_pretrained wrote"
            )

    def _open(self, name: str) -> None:
        from safetensors import safe_open

        path = self.directory / name
        try:
            with safe_open(str(path), framework="numpy") as handle:
                shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118
        except Exception as e:  # a missing, truncated or foreign file: safetensors raises its own types
            raise UserError(f"cannot read {path} as safetensors: {type(e).__name__}: {str(e)[:200]}") from None
        self._shapes.update(shapes)
        self._where.update(dict.fromkeys(shapes, name))

    def names(self) -> list[str]:
        """Every tensor's name, in the files' order."""
        return list(self._torch) if self._torch is not None else list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``, without reading it."""
        if self._torch is not None:
            return tuple(self._torch[name].shape)
        return self._shapes[name]

    def read(self, name: str, dtype: Any = np.float32) -> np.ndarray:
        """Tensor ``name`` as a numpy array of ``dtype`` (None: as the file holds it)."""
        if self._torch is not None:
            array = self._torch[name].float().numpy()  # numpy has no bfloat16 of torch's
            return array if dtype is None else array.astype(dtype, copy=False)
        from safetensors import safe_open

        file = self._where[name]
        try:
            with safe_open(str(self.directory / file), framework="numpy") as handle:
                tensor = handle.get_tensor(name)  # a copy: the mapping is gone when the file closes
        except Exception as e:
            raise UserError(f"cannot read {name} from {self.directory / file}: {type(e).__name__}: {e}") from None
        return tensor if dtype is None else np.asarray(tensor, dtype)


def _torch_state(path: Path) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise UserError(
            f"hf:{path.parent} holds {TORCH_BIN}, which needs PyTorch to read: pip install torch, or convert "
            "it to model.safetensors (transformers' save_pretrained writes safetensors)"
        ) from None
    try:  # memory-mapped: tensors are read as they are converted
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise UserError(f"cannot read {path}: {type(e).__name__}: {str(e)[:200]}") from None


def write(
    directory: str | os.PathLike,
    config: dict[str, Any],
    tensors: Iterable[tuple[str, np.ndarray]],
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    extra: dict[str, Path | bytes] | None = None,
) -> Path:
    """Write ``config.json`` and ``tensors`` (name, array: taken one at a time, a shard held at
    once) into ``directory`` (absent or empty) as one step (see the module's docstring), with the
    files ``extra`` names beside them (file name -> a source path to copy, or the bytes: a tokenizer). A
    non-empty ``directory`` is refused (one line)::

        write("out/gpt2", config, [("wte.weight", wte), ...], max_shard_bytes=2 * 10**9)
    """

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_shards(tmp, tensors, max_shard_bytes)
        for name, content in (extra or {}).items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                shutil.copyfile(content, tmp / name)

    return _write_whole(Path(directory), fill)


def _write_whole(directory: Path, fill: Any) -> Path:
    """``directory`` (absent or empty; else one line) written whole or not at all: ``fill(tmp)``
    writes the files into a temporary directory beside it, which then takes its name."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        what = "is a file" if not directory.is_dir() else "is not empty"
        raise UserError(f"--out {directory} {what}; give a new or empty directory")
    if not directory.parent.is_dir():
        raise UserError(f"--out {directory}: directory {directory.parent} does not exist")
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir()
        fill(tmp)
        os.replace(tmp, directory)  # an empty directory there is replaced
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write {directory}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def write_adapters(directory: str | os.PathLike, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    """Write PEFT's ``adapter_config.json`` and ``adapter_model.safetensors`` (``tensors``) into
    ``directory`` (absent or empty) as one step, as :func:`write` writes a checkpoint::

        write_adapters("out/adapters", {"peft_type": "LORA", ...}, {"base_model.model....lora_A.weight": a})
    """
    from safetensors.numpy import save_file

    def fill(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})

    return _write_whole(Path(directory), fill)


def _write_shards(directory: Path, tensors: Iterable[tuple[str, np.ndarray]], limit: int) -> list[str]:
    """Write the shards into ``directory``; returns their file names."""
    from safetensors.numpy import save_file

    written: list[tuple[Path, list[str]]] = []  # numbered temporary files and their tensors
    shard: dict[str, np.ndarray] = {}
    size = total = parameters = 0

    def save(tensors: dict[str, np.ndarray]) -> None:
        path = directory / f"shard-{len(written)}.tmp"
        save_file(tensors, str(path), metadata={"format": "pt"})
        written.append((path, list(tensors)))

    for name, array in _iterate(tensors):
        array = np.ascontiguousarray(array)
        total += array.nbytes
        parameters += math.prod(array.shape)
        if array.nbytes > limit:  # alone over the limit: a shard of its own, the open one stays open
            save({name: array})
            continue
        if size + array.nbytes > limit:
            save(shard)
            shard, size = {}, 0
        shard[name] = array
        size += array.nbytes
    if shard:
        save(shard)
    if len(written) <= 1:
        for path, _ in written:
            path.rename(directory / SAFETENSORS)
        return [SAFETENSORS]
    names, weight_map = [], {}
    for i, (path, keys) in enumerate(written):
        name = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        path.rename(directory / name)
        names.append(name)
        weight_map.update(dict.fromkeys(keys, name))
    index = {"metadata": {"total_parameters": parameters, "total_size": total}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


def _iterate(tensors: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    seen: set[str] = set()
    for name, array in tensors:
        if name in seen:
            raise ValueError(f"tensor {name} is given twice")
        seen.add(name)
        yield name, array
