"""The derived architectures' build check: `python -m sessions.build_check [--only gptj,opt] [--registry]`
runs the cell setup of every derived architecture on CPU (the tiny checkpoint written and reloaded,
the unsharded reference computed, both into the caches the cells reuse) and lists what fails: the way
to keep matrix/derived.toml's skips honest. add-model runs the same check on the entry it writes."""

from __future__ import annotations

import argparse
import warnings

import torch
from transformers import AutoModelForCausalLM

from matrix.checkpoints import folder_checkpoint, tiny_checkpoint, tiny_config
from matrix.config_keys import MAX_PARAMS
from matrix.derive import listed_entries
from matrix.registry import ModelEntry
from suites.checks.inputs import ProbeSpec
from suites.reference.cache import cached_reference
from suites.reference.checkpoint_sizes import checkpoint_size
from suites.reference.memory_plan import Runner, plan_reference


def build_problem(entry: ModelEntry) -> str | None:
    """None when the tiny config stays under MAX_PARAMS and passes the harness's own cell setup:
    the tiny checkpoint is written and reloaded, and the unsharded reference (forward with mask,
    greedy generation, labels= perplexity) is computed, both into the caches the cells reuse."""

    try:
        with torch.device("meta"):
            # transformers leaves from_config unannotated (its signature is *args, **kwargs)
            model = AutoModelForCausalLM.from_config(tiny_config(entry))  # type: ignore[no-untyped-call]
            params = sum(p.numel() for p in model.parameters())
        if params > MAX_PARAMS:
            return f"too large: {params} parameters > {MAX_PARAMS} after shrinking"
        checkpoint = folder_checkpoint(tiny_checkpoint(entry, log=lambda *_: None))
        plan = plan_reference(checkpoint_size(checkpoint.folder), "fp32", Runner.detect())
        cached_reference(checkpoint, "fp32", ProbeSpec(), plan=plan, trust_remote_code=entry.trust_remote_code)
    except Exception as error:
        return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model_types to check")
    parser.add_argument(
        "--registry",
        action="store_true",
        help="also derive the registry's architectures from their class defaults (a wider test of the rules)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    only = {t for t in args.only.split(",") if t}
    problems = {}
    for name, entry in listed_entries(args.registry).items():
        if entry.skip_reason or (only and entry.model_type not in only):
            continue
        problem = entry.expansion_error.describe() if entry.expansion_error else build_problem(entry)
        print(f"  {'ok  ' if problem is None else 'FAIL'} {name}" + (f": {problem}" if problem else ""), flush=True)
        if problem:
            problems[name] = problem
    print(f"{len(problems)} derived architecture(s) fail to build")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
