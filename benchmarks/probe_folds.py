"""Could two of a cell's probe forwards be one? For each pair of probes whose values might coincide, whether they are
bit-identical (torch.equal) on real tiny checkpoints, unsharded and sharded by AutoTP on real ranks: a fold is only
sound where the values the checks compare today come out of it unchanged (docs/findings.md, "#58 the probes' forwards
folded: none can be").

    python benchmarks/probe_folds.py --checkpoints '{"llama": "<tiny checkpoint folder>", ...}' --tp 1,2,3

Run with the combination's python; tiny checkpoints are the harness cache's (`$AUTOTP_CACHE/tiny/*`, written by any run
of those models). tp 1 runs in this process, tp N in N rank processes on this machine (DeepSpeed's CPU accelerator).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))


def compare(checkpoint: str, tp: int) -> dict[str, bool | str]:
    """Each candidate pair: equal bit for bit, or the exception a probe raised (the pair is then not one)."""
    # lazily: torch and the harness after the path above, in the rank processes too
    import torch

    from suites.base.elementwise_math import settle_elementwise_math
    from suites.checks.inputs import ByteTokenizer, ProbeSpec, build_inputs
    from suites.checks.probes import _greedy
    from suites.variants.loading import load_model

    settle_elementwise_math()
    spec = ProbeSpec()
    inputs = build_inputs(ByteTokenizer(), spec)
    model: Any = load_model(checkpoint, "fp32", False)
    if tp > 1:
        import deepspeed  # lazily: only a rank process shards

        engine = deepspeed.init_inference(
            model, tensor_parallel={"tp_size": tp}, dtype=torch.float32, replace_with_kernel_inject=False
        )
        model = engine.module
    ids, mask = inputs.batch_ids, inputs.batch_mask
    window = inputs.corpus_ids[:, : spec.ppl_window]
    try:
        with torch.no_grad():
            masked = model(ids, attention_mask=mask).logits.float()  # the probes' padded batch
            plain = model(ids[:1]).logits.float()  # their prompt without a mask
            single = _greedy(model, ids[:1], mask[:1], spec)[1]  # generate's logits, the prompt alone
            batched = _greedy(model, ids, mask, spec)[1]  # and the padded batch
            first_window = model(window, labels=window).logits.float()  # perplexity's first window
    except Exception as raised:  # noqa: BLE001 - a probe that raises folds with nothing; said, not fatal
        return {"raised": f"{type(raised).__name__}: {str(raised)[:120]}"}
    return {
        "prompt's last logits = generate's first step": torch.equal(plain[0, -1], single[0, 0]),
        "prompt = padded batch's row 0 (no mask / mask)": torch.equal(plain[0], masked[0]),
        "padded batch's last logits = generate's first step": torch.equal(masked[:, -1], batched[:, 0]),
        "generate(prompt) = generate(padded batch) row 0": torch.equal(single[0], batched[0]),
        "prompt = perplexity's first window, its first tokens": torch.equal(plain[0], first_window[0, : ids.shape[1]]),
    }


def _rank_main(checkpoints: dict[str, str], tp: int) -> None:
    import deepspeed  # lazily: the launching process never imports DeepSpeed

    deepspeed.init_distributed()
    found = {name: compare(path, tp) for name, path in checkpoints.items()}
    if int(os.environ["RANK"]) == 0:
        print("RESULT " + json.dumps(found), flush=True)


def _sharded(checkpoints: dict[str, str], tp: int, port: int) -> dict[str, Any]:
    """The comparisons on `tp` rank processes, as rank 0 found them."""
    ranks = []
    for rank in range(tp):
        environment = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            **dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(tp), LOCAL_SIZE=str(tp)),
            **dict(CROSS_RANK="0", CROSS_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, __file__, "--rank-of", json.dumps(checkpoints), "--tp", str(tp)]
        ranks.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True))
    outputs = [rank.communicate(timeout=1800)[0] for rank in ranks]
    lines = [line for line in outputs[0].splitlines() if line.startswith("RESULT ")]
    if not lines or any(rank.returncode for rank in ranks):
        raise RuntimeError(f"tp {tp}: the ranks ended {[rank.returncode for rank in ranks]} without a result")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", help="JSON: name -> tiny checkpoint folder")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--port", type=int, default=29631)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)  # a rank process's own call
    args = parser.parse_args()
    if args.rank_of:
        _rank_main(json.loads(args.rank_of), int(args.tp))
        return
    os.environ["DS_ACCELERATOR"] = "cpu"
    checkpoints: dict[str, str] = json.loads(args.checkpoints)
    for tp in map(int, args.tp.split(",")):
        if tp == 1:
            found: dict[str, Any] = {name: compare(path, 1) for name, path in checkpoints.items()}
        else:
            found = _sharded(checkpoints, tp, args.port + tp)
        for name, pairs in found.items():
            for pair, equal in pairs.items():
                print(f"tp {tp}  {name:28} {pair:54} {equal}")


if __name__ == "__main__":
    main()
