"""Which attention kernel a packed step compiles to on a GPU, beside the same step on unpacked rows:
gpt2_shakespeare (4 blocks, 128 wide, 4 heads) at 8 rows of 2,048 tokens, compiled for one H100 on
this CPU-only machine (XLA deviceless compilation, `jaxnet plan`), once with window rows and once
with packed documents (`data.batching=packed`), on one corpus of synthetic short documents
prepared here (byte tokenizer, written to a temporary directory).

    python scripts/plan_packed_attention.py        # writes benchmarks/results/packed-attention-h100-<date>.json

Memory, kernels and the attention calls come from the compiled program; the step time is a
PREDICTION (a roofline bound), not measured. Needs the CUDA plugin wheels in
jaxnet.planner.plan_dir() (scripts/test installs them).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.environ.get("JAXNET_PLAN_DIR") or os.path.join(sys.prefix, "jaxnet-plan"))

import jax  # noqa: E402

from jaxnet import config, planner  # noqa: E402
from jaxnet.data import prepare  # noqa: E402

SETTINGS = ["data.vocab_size=0", "data.seq_len=2048", "train.batch_size=8", "data.overlong=truncate"]


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "docs.jsonl"
        source.write_text("".join(json.dumps({"text": f"document {i} " * (20 + i % 200)}) + "\n" for i in range(400)))
        corpus = Path(tmp) / "corpus"
        prepare.prepare(str(source), "byte", corpus, workers=1, progress=False, say=lambda *_: None)
        runs = {}
        for batching in ("windows", "packed"):
            overrides = [f"data.path={corpus}", f"data.batching={batching}", *SETTINGS]
            report = planner.plan(config.load_experiment("gpt2_shakespeare", overrides), "h100")
            runs[batching] = {
                "overrides": overrides,
                "attention": report["attention"],
                "memory": report["memory"],
                "kernels_per_step": report["kernels"]["launches"]["total"],
                "bytes_per_step_per_device": report["bytes_per_step"]["per_device"],
                "predicted_step_s": report["prediction"]["predicted_step_s"],
                "prediction_label": report["prediction"]["label"],
            }
            print(batching, report["attention"]["description"], f"temp {report['memory']['temp'] / 2**20:.1f} MiB")
    record = {
        "what": "the attention kernel of gpt2_shakespeare's train step compiled for one H100, window rows against "
        "packed documents (8 x 2,048 tokens, bfloat16)",
        "device": "compiled for NVIDIA H100 80GB HBM3 on a CPU-only machine (deviceless XLA); nothing ran on a GPU",
        "date": datetime.date.today().isoformat(),
        "command": "python scripts/plan_packed_attention.py",
        "python": platform.python_version(),
        "versions": report["versions"],
        "runs": runs,
        "temp_bytes_added_by_packing": runs["packed"]["memory"]["temp"] - runs["windows"]["memory"]["temp"],
        "bias_bytes": 8 * 2048 * 2048 * 2,
        "note": "packed rows pass their segment mask to jax.nn.dot_product_attention, which hands cuDNN an "
        "additive bias (batch, 1, time, time) in bfloat16; the backward call also returns that bias's gradient "
        "(unused). Memory for cuDNN workspaces is not counted (not known without a GPU).",
    }
    out = ROOT / "benchmarks" / "results" / f"packed-attention-h100-{record['date']}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
