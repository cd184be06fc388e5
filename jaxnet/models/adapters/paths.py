"""A pytree's leaves as a nested dict named by their paths, and back: the form parameters take in
checkpoints and in :func:`jaxnet.load_params`, whichever library made them."""

from __future__ import annotations

from typing import Any

import jax


def names(tree: Any) -> list[tuple[str, ...]]:
    """Each leaf's path in ``tree`` as names (dict keys and list indices as strings), in leaf order."""
    return [tuple(_key(k) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def joined(path: tuple) -> str:
    """A key path (of ``jax.tree_util``) as one ``/``-joined name: ``params/Conv_0/kernel``."""
    return "/".join(_key(k) for k in path)


def _key(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))


def nested(names: list[tuple[str, ...]], leaves: list) -> dict:
    """``leaves`` as a nested dict, leaf ``i`` under path ``names[i]``."""
    out: dict = {}
    for path, leaf in zip(names, leaves, strict=True):
        node = out
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = leaf
    return out


def leaves_at(names: list[tuple[str, ...]], tree: dict) -> list:
    """The inverse of :func:`nested`: the leaves of ``tree`` at ``names``, in that order."""
    leaves = []
    for path in names:
        node = tree
        for name in path:
            node = node[name]
        leaves.append(node)
    return leaves
