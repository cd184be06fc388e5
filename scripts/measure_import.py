"""The host memory of importing a Hugging Face checkpoint (``train.init_from=hf:DIR``), measured.

    python scripts/measure_import.py                   # a ~1 GB and a ~2 GB checkpoint; a few minutes here
    python scripts/measure_import.py --layers 8 22     # the same (TinyLlama's shape with that many layers)

Writes benchmarks/results/import-memory-cpu-DATE.json (device, library versions, date, command,
every figure). For each size, a random Llama checkpoint of TinyLlama-1.1B's shape (width 2,048,
32 heads, 4 key/value heads, MLP 5,632, vocabulary 32,000, untied head) with ``--layers`` blocks
is written in bfloat16 as transformers' ``save_pretrained`` lays it out (shards of at most 500 MB
and ``model.safetensors.index.json``) into a temporary directory, deleted afterwards. Then, in a
fresh process each:

placed (jaxnet's import)
    the run of ``train.init_from=hf:DIR`` (``hf_finetune``'s model: the checkpoint's shape,
    ``model.param_dtype=bfloat16`` so the run holds the parameters as the file does) is built,
    and :func:`jaxnet.train.init_from.load` reads the tensors one at a time, each placed on the
    run's device as it is read (on this CPU the device's memory is the host's).
gathered (for comparison)
    the same tensors first gathered into one dict of host arrays, then placed: what reading a
    checkpoint whole does.

Each process resets its peak resident set size (``/proc/self/clear_refs``) just before the import
and reads it (``VmHWM``) after. The figure is the **overhead**: peak minus the resident size
before the import minus the bytes of the placed parameters (which on a GPU would live on the
device, not the host). jaxnet's import should hold about one tensor at a time (the largest
tensor, the embedding, is 131 MB in float32), whatever the checkpoint's size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)
SHARD_BYTES = 500 * 10**6


def write_checkpoint(directory: Path, layers: int) -> int:
    """A random bfloat16 Llama of SHAPE with ``layers`` blocks, in shards; returns its bytes."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    w, mlp, vocab = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"]
    kv = w // SHAPE["num_attention_heads"] * SHAPE["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (vocab, w)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (w,),
            p + "self_attn.q_proj.weight": (w, w),
            p + "self_attn.k_proj.weight": (kv, w),
            p + "self_attn.v_proj.weight": (kv, w),
            p + "self_attn.o_proj.weight": (w, w),
            p + "post_attention_layernorm.weight": (w,),
            p + "mlp.gate_proj.weight": (mlp, w),
            p + "mlp.up_proj.weight": (mlp, w),
            p + "mlp.down_proj.weight": (w, mlp),
        }
    shapes |= {"model.norm.weight": (w,), "lm_head.weight": (vocab, w)}
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    shards: list[dict] = [{}]
    size = total = 0
    for name, shape in shapes.items():
        array = (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        if size + array.nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
        total += array.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **SHAPE,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return total


def write_corpus(directory: Path) -> None:
    """A small corpus of byte ids (they fit any vocabulary): the run needs data to be built."""
    from jaxnet.data import prepare

    source = directory.parent / "text.txt"
    source.write_text("To be, or not to be, that is the question.\n\n" * 20000)
    prepare.prepare(str(source), "byte", directory, workers=1, progress=False, say=lambda _: None)


CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
import jax
from jaxnet import config
from jaxnet.train import init_from
from jaxnet.train.loop import Run

checkpoint, corpus, how = sys.argv[1], sys.argv[2], sys.argv[3]


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


cfg = config.load_experiment("hf_finetune", [f"train.init_from=hf:{checkpoint}", f"data.path={corpus}",
                             "data.seq_len=64", "model.param_dtype=bfloat16", "train.batch_size=2"])
cfg = init_from.with_hf_shape(cfg)
run = Run(cfg)
target = init_from.variables(run.abstract_state())
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
start = time.perf_counter()
if how == "placed":
    values = init_from.load(cfg, run, Path(checkpoint) / "no-run")
else:
    from jaxnet.models import hf
    pretrained = hf.read(f"hf:{checkpoint}")
    host = {f"params/{p}": v for p, v in pretrained.tensors(target["params/embed/embedding"].shape[0], None)}
    values = {n: init_from.place(v, target[n]) for n, v in host.items()}
jax.block_until_ready(values)
seconds = time.perf_counter() - start
peak = status("VmHWM")
placed = sum(v.nbytes for v in values.values())
print(json.dumps({"rss_before": before, "peak": peak, "rss_after": status("VmRSS"), "placed_bytes": placed,
                  "seconds": seconds, "arrays": len(values)}))
"""


def measure(checkpoint: Path, corpus: Path, how: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(checkpoint), str(corpus), how],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1800,
    )
    if result.returncode:
        raise SystemExit(f"{how} on {checkpoint} failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["overhead"] = figures["peak"] - figures["rss_before"] - figures["placed_bytes"]
    return figures


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("jax", "jaxlib", "flax", "safetensors", "numpy", "ml_dtypes")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 22])
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxnet-import-") as tmp:
        corpus = Path(tmp) / "corpus"
        write_corpus(corpus)
        for layers in args.layers:
            directory = Path(tmp) / f"llama-{layers}"
            size = write_checkpoint(directory, layers)
            row = {"layers": layers, "checkpoint_bytes": size, "files": len(list(directory.glob("*.safetensors")))}
            row["parameters"] = size // 2
            for how in ("placed", "gathered"):
                row[how] = measure(directory, corpus, how)
                print(f"{layers} layers, {size / 1e9:.2f} GB, {how}: {json.dumps(row[how])}", flush=True)
            rows.append(row)
            shutil.rmtree(directory)
    w, mlp, vocab = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"]
    record = {
        "kind": "import-memory",
        "date": started.date().isoformat(),
        "command": "python scripts/measure_import.py " + " ".join(sys.argv[1:]),
        "device": f"{platform.node()} ({os.cpu_count()} CPUs, shared), CPU backend: device memory is host memory",
        "versions": versions(),
        "shape": SHAPE,
        "largest_tensor_bytes_bf16": max(vocab * w, mlp * w) * 2,
        "largest_tensor_bytes_f32": max(vocab * w, mlp * w) * 4,
        "method": "a fresh process per measurement: peak resident set size (VmHWM, reset by /proc/self/clear_refs "
        "just before the import) minus the resident size before it minus the bytes of the placed parameters "
        "(bfloat16, as the file holds them) = overhead, what the import held on the host beyond its result",
        "rows": rows,
        "overhead_placed_growth": rows[-1]["placed"]["overhead"] - rows[0]["placed"]["overhead"],
        "checkpoint_growth": rows[-1]["checkpoint_bytes"] - rows[0]["checkpoint_bytes"],
    }
    out = ROOT / "benchmarks" / "results" / f"import-memory-cpu-{record['date']}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    for r in rows:
        print(
            f"{r['checkpoint_bytes'] / 1e9:.2f} GB checkpoint: overhead placed "
            f"{r['placed']['overhead'] / 1e6:,.0f} MB, gathered {r['gathered']['overhead'] / 1e6:,.0f} MB"
        )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
