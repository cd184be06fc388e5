"""The committed plan search: Llama 3 8B on a node of 8 H100s (fsdp=8), the largest batch and the
recomputation policy with the best expected tokens/s that fits (``jaxnet plan --search``), beside
the hand-chosen plans committed before it (``benchmarks/results/plan-llama3_8b-h100x8*.json``).

    python scripts/record_search.py            # about 11 compiles of the 8B step: 30-60 minutes on 2 cores
    python scripts/record_search.py --smoke    # llama3_8b:smoke on one H100, two policies: a few minutes

Writes ``benchmarks/results/searched-llama3_8b-h100x8-<date>.json`` (``--smoke``: prints only).
Needs the plan wheels (jaxnet.planner.plan_dir, as scripts/record_plans.py does).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The plan wheels' own directory (the rule of jaxnet.planner.plan_dir), before JAX is imported.
sys.path.insert(0, os.environ.get("JAXNET_PLAN_DIR") or os.path.join(sys.prefix, "jaxnet-plan"))

from jaxnet import config, plan_search, planner  # noqa: E402

# none and full, the hand-chosen plans' two policies: the search chooses their batch, and the record
# compares like with like. Each further policy costs about 8 more compiles of the 8B step (an hour on
# 2 shared cores): jaxnet plan llama3_8b mesh.fsdp=8 --target h100 --gpus 8 --search searches all six.
POLICIES = ("none", "full")


def hand_chosen() -> list[dict]:
    """The committed hand-chosen plans of llama3_8b on 8 H100s, with their expected tokens/s."""
    out, seq_len = [], config.load_experiment("llama3_8b").data.seq_len  # the searched step's
    for path in sorted((ROOT / "benchmarks" / "results").glob("plan-llama3_8b-h100x8*.json")):
        report = json.loads(path.read_text())
        if "model.matmul=fp8" in (report.get("command") or ""):
            continue  # another precision: the search compares bf16 plans
        if report.get("seq_len") != seq_len or report.get("mesh", {}).get("context", 1) != 1:
            continue  # another sequence length (the long-context plans): not the searched step
        p = report["prediction"]
        out.append(
            {
                "file": path.relative_to(ROOT).as_posix(),
                "command": report.get("command"),
                "batch_size": report["batch_size"],
                "fits": report["fits"],
                "expected_step_s": p.get("expected_step_s"),
                "expected_tokens_per_s": p.get("expected_tokens_per_s"),
            }
        )
    return out


def main(argv: list[str]) -> int:
    smoke = "--smoke" in argv
    if smoke:
        cfg = config.load_experiment("llama3_8b:smoke")
        found = plan_search.search(cfg, "h100", 1, policies=("none", "full"), say=print)
    else:
        cfg = config.load_experiment("llama3_8b", ["mesh.fsdp=8"])
        found = plan_search.search(cfg, "h100", 8, policies=POLICIES, say=print)
    print(plan_search.describe(found))
    date = datetime.date.today().isoformat()
    hand = [h for h in hand_chosen() if h["fits"] and h["expected_tokens_per_s"]]
    best_hand = max((h["expected_tokens_per_s"] for h in hand), default=None)
    for c in found["candidates"]:
        c["mesh"] = dict(c["mesh"])
    record = {
        "kind": "plan-search",
        "date": date,
        "command": "python scripts/record_search.py" + (" --smoke" if smoke else ""),
        "jaxnet_command": "jaxnet plan llama3_8b mesh.fsdp=8 --target h100 --gpus 8 --search --policies "
        + ",".join(POLICIES),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, shared)",
        "versions": planner._versions(),
        **found,
        "hand_chosen": hand,
        "best_hand_chosen_tokens_per_s": best_hand,
        "search_over_hand_chosen": found["best"]["tokens_per_s"] / best_hand if best_hand else None,
    }
    print(f"best {found['best']['tokens_per_s']:,.0f} expected tokens/s; hand-chosen best {best_hand or 0:,.0f}")
    if smoke:
        return 0
    path = ROOT / "benchmarks" / "results" / f"searched-llama3_8b-h100x8-{date}.json"
    for old in path.parent.glob("searched-llama3_8b-h100x8-*.json"):
        if old != path:
            old.unlink()
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
