"""The pieces of a Hugging Face table: file tensors stacked into one array and split back out,
values transformed both ways, and a model refused by the tables that cannot write one of its keys."""

from __future__ import annotations

import numpy as np
import pytest

from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig, hf
from jaxnet.models.hf.table import Layout, Rule, Table, check, file_tensors, fill

LINEAR, VECTOR = Layout(inputs=1, transposed=True), Layout(inputs=0)


class Files:
    """File tensors in memory, with the reading interface of jaxnet.models.hf.files.Tensors."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors

    def names(self):
        return list(self.tensors)

    def shape(self, name):
        return tuple(self.tensors[name].shape)

    def read(self, name, dtype=np.float32):
        return self.tensors[name] if dtype is None else self.tensors[name].astype(dtype)


class Experts(Table):
    """Three experts' kernels a file holds one tensor each, a norm held as w with the model's scale 1 + w."""

    model_type, title = "experts", "Experts"

    def rules(self, keys):
        return [
            Rule("layers.{i}.experts.{e}.up.weight", ("block_{i}/experts/up",), LINEAR, stack="experts"),
            Rule("norm.weight", ("norm_out/scale",), VECTOR, into=lambda w: w + 1, out=lambda s: s - 1),
        ]


KEYS = {"layers": 2, "experts": 3}
SHAPES = {"block_0/experts/up": (3, 4, 5), "block_1/experts/up": (3, 4, 5), "norm_out/scale": (4,)}


def files():
    r = np.random.default_rng(0)
    tensors = {f"layers.{i}.experts.{e}.up.weight": r.normal(size=(5, 4)) for i in range(2) for e in range(3)}
    tensors["norm.weight"] = r.normal(size=4)
    return {k: v.astype(np.float32) for k, v in tensors.items()}


def test_file_tensors_of_each_expert_are_stacked_in_and_split_back_out():
    tensors = files()
    params = dict(fill(Experts(), KEYS, Files(tensors), SHAPES, vocab=0))
    for i in range(2):  # the reference: each expert's [out, in] tensor transposed, stacked along a new first axis
        want = np.stack([tensors[f"layers.{i}.experts.{e}.up.weight"].T for e in range(3)])
        np.testing.assert_array_equal(params[f"block_{i}/experts/up"], want)
    np.testing.assert_allclose(params["norm_out/scale"], tensors["norm.weight"] + 1, rtol=1e-7)
    written = dict(file_tensors(Experts(), KEYS, lambda p: params[p], vocab=0))
    assert written.keys() == tensors.keys()
    for name, tensor in tensors.items():
        np.testing.assert_allclose(written[name], tensor, rtol=1e-6, atol=1e-7)


def test_a_missing_or_misshapen_expert_tensor_is_named_before_anything_is_read():
    tensors = files()
    del tensors["layers.1.experts.2.up.weight"]
    with pytest.raises(UserError, match=r"lacks layers\.1\.experts\.2\.up\.weight"):
        check(Experts(), KEYS, Files(tensors), SHAPES, vocab=0)
    tensors = files()
    tensors["layers.0.experts.1.up.weight"] = np.zeros((5, 3), np.float32)
    with pytest.raises(UserError, match=r"layers\.0\.experts\.1\.up\.weight has shape \(5, 3\).*\(5, 4\)"):
        check(Experts(), KEYS, Files(tensors), SHAPES, vocab=0)


def test_a_table_refuses_every_key_it_cannot_write_without_naming_them_itself():
    llama = TransformerConfig.preset("llama", layers=2, width=16, heads=2)
    assert hf.refusals(hf.TABLES["llama"], llama) == []
    # keys no Llama config.json holds come back as Llama's: each named, whatever key it is
    odd = TransformerConfig.preset("llama", layers=2, width=16, heads=2, qk_norm=True, post_norms=True)
    assert hf.refusals(hf.TABLES["llama"], odd) == [
        "model.post_norms=true (Llama: false)",
        "model.qk_norm=true (Llama: false)",
    ]
    windowed = TransformerConfig.preset("llama", layers=2, width=16, heads=2, attention_pattern=("local",), window=4)
    assert hf.refusals(hf.TABLES["llama"], windowed) == ["model.attention_pattern=local,local (Llama: global,global)"]
    with pytest.raises(
        UserError, match=r"no Hugging Face architecture.*GPT-2: model.position=rotary \(GPT-2: learned\)"
    ):
        hf.table_for(llama.__class__.preset("bert_encoder", layers=1, width=16, heads=2))
    # keys of how a model is computed, not what, never stand in the way
    assert hf.refusals(hf.TABLES["llama"], TransformerConfig.preset("llama", width=16, heads=2, dropout=0.1)) == []
