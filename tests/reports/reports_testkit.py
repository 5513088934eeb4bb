"""Test helpers: the one JUnit writer (exactly README.md "Results") and CLI shortcuts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from junitparser import Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite
from markdown_it import MarkdownIt
from markdown_it.token import Token

from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey


@dataclass
class Cell:
    model: str
    outcome: str = "pass"
    failure_class: str = ""
    signature: str = ""
    tp: int = 2
    variant: str = "eager"
    dtype: str = "fp32"
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""  # the failure's text (its traceback); default "Traceback ...\n<signature>"
    properties: dict[str, str] = field(default_factory=dict)  # more JUnit properties (a cause, a break point, ...)
    checkpoints: tuple[str, ...] = ()  # the hub ids a faithful cell stands for

    @property
    def id(self) -> str:
        return f"{self.model}-{self.variant}-{self.dtype}-tp{self.tp}"


def fail(model: str, failure_class: str, signature: str = "", **kwargs) -> Cell:
    return Cell(model, "fail", failure_class, signature or f"{failure_class.title()}Error: broken", **kwargs)


def write_junit(
    path: Path,
    cells: list[Cell],
    *,
    run_id: str,
    started: str,
    host: str = "runner-1",
    deepspeed: str = "0.14.2",
    deepspeed_git: str = "",
    transformers: str = "4.44.0",
    torch: str = "2.4.0",
    python: str = "3.11.7",
    harness_git: str | None = "",
    session: str = "",
) -> Path:
    """harness_git None: a file from before run.harness_git was recorded (the property is absent); the session is
    the run id's first part unless given (a session named after a git ref holds an @ itself)."""
    suite = TestSuite("pytest")
    for cell in cells:
        case = TestCase(f"test_cell[{cell.id}]", classname="suites.test_autotp")
        properties = {
            "cell.id": cell.id,
            "cell.model": cell.model,
            "cell.variant": cell.variant,
            "cell.dtype": cell.dtype,
            "cell.tp": str(cell.tp),
            "outcome": cell.outcome,
            "failure_class": cell.failure_class,
            "signature": cell.signature,
            "version.deepspeed": deepspeed,
            "version.transformers": transformers,
            "version.torch": torch,
            "version.python": python,
            "version.deepspeed_git": deepspeed_git,
            "run.id": run_id,
            "run.session": session or run_id.split("@")[0],
            "run.host": host,
            "run.started": started,
            "run.accelerator": "cpu",
            "run.backend": "gloo",
            **({"run.harness_git": harness_git} if harness_git is not None else {}),
            **{f"metric.{name}": repr(value) for name, value in cell.metrics.items()},
            **cell.properties,
            **({"checkpoints": ",".join(cell.checkpoints)} if cell.checkpoints else {}),
        }
        for name, value in properties.items():
            case.add_property(name, value)
        if cell.outcome == "fail":
            failure = Failure(f"{cell.failure_class}: {cell.signature}")
            failure.text = cell.message or f"Traceback ...\n{cell.signature}"
            case.result = [failure]
        elif cell.outcome in ("skip", "unsupported"):  # pytest.skip either way; the outcome property says which
            case.result = [Skipped(cell.message or "needs 4 ranks")]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(path), pretty=True)
    return path


# The versions write_junit holds fixed by default, as report lines print them for a DeepSpeed transition.
CONTEXT = "transformers 4.44.0, torch 2.4.0, python 3.11.7"


def render(junit_dir, tmp_path, *extra):
    """merge junit_dir into a fresh store, render it, and return the output folder."""
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(junit_dir), "--store", str(store)]) == 0
    assert main(["render", "--store", str(store), "--out", str(out), *extra]) == 0
    return out


def section(markdown: str, title: str) -> list[str]:
    """The lines of one '## title' section, without the heading and blank lines."""
    lines = markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    return [line for line in lines if line]


# ---- The multi-version scenario of issue #18 ---------------------------------------------------------------------

# Real signatures (recorded at DeepSpeed 0.18.9 and 0.19.8 on this machine): the uneven-sharding failure that
# 0.19.6 fixed reads [N, N] at tp 2 and [N, N, N] at tp 3; bloom's generate failure is the same at tp 2, 3 and 4.
UNEVEN = (
    "RuntimeError: split_with_sizes expects split_sizes to sum exactly to N (input tensor's size at dimension "
    "N), but got split_sizes={sizes} @ deepspeed/module_inject/layers.py:uneven_partition"
)
BLOOM = (
    "RuntimeError: The expanded size of the tensor (N) must match the existing size (N) at non-singleton "
    "dimension N.  Target sizes: [N, N, N].  Tensor sizes: [N, N, N] @ "
    "transformers/models/bloom/modeling_bloom.py:forward"
)
UNEVEN_MODELS = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "phi",
    "phi3",
    "gpt_neox",
    "gptj",
    "gpt_neo",
    "opt",
    "codegen",
    "gpt_bigcode",
    "starcoder2",
    "mpt",
    "gemma",
    "gemma2",
    "gemma3",
    "stablelm",
    "olmo",
    "cohere",
)  # 23 models × tp 2, 3, less gemma3 tp3 (passes throughout): 45 cells
FIXED_BY = {"commit": "8185" * 10, "subject": "Fix uneven sharding of split sizes (#8185)", "pr": 8185}


def _uneven(model: str, tp: int) -> Cell:
    if (model, tp) == ("gemma3", 3):
        return Cell(model, tp=tp)
    return fail(model, "shard", UNEVEN.format(sizes="[" + ", ".join(["N"] * tp) + "]"), tp=tp)


def issue_18_store(tmp_path: Path) -> Path:
    """Three sessions merged as issue #18 found them: DeepSpeed 0.17.6 and 0.18.9 at tp 2, 3 (45 cells fail with
    the uneven-sharding cause) and two nightlies of the default matrix at 0.19.8 (transformers 5.23.0, then
    5.24.0, where bloom breaks at tp 2, 3, 4). Triage answered the fix on llama tp2 and confirmed it on 43 cells;
    one cell is not yet triaged."""
    junit = tmp_path / "issue18"
    pins = dict(torch="2.13.0+cpu", python="3.11.7")
    for n, deepspeed in enumerate(("0.17.6", "0.18.9"), start=1):
        write_junit(
            junit / f"tp23-{deepspeed}.xml",
            [_uneven(m, tp) for m in UNEVEN_MODELS for tp in (2, 3)],
            run_id=f"autotp(ds{deepspeed}-tf5.24.0-pt2.13.0)@2026-12-0{n}T00:00:00Z@vm",
            started=f"2026-12-0{n}T00:00:00Z",
            deepspeed=deepspeed,
            transformers="5.24.0",
            **pins,
        )
    for n, transformers in enumerate(("5.23.0", "5.24.0"), start=3):
        bloom = [
            fail("bloom", "forward", BLOOM, tp=tp) if transformers == "5.24.0" else Cell("bloom", tp=tp)
            for tp in (2, 3, 4)
        ]
        write_junit(
            junit / f"nightly-{transformers}.xml",
            [*[Cell(m, tp=tp) for m in UNEVEN_MODELS for tp in (2, 3, 4)], *bloom],
            run_id=f"nightly@2026-12-0{n}T00:00:00Z@vm",
            started=f"2026-12-0{n}T00:00:00Z",
            deepspeed="0.19.8",
            transformers=transformers,
            **pins,
        )
    store = tmp_path / "issue18.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    representative = CellKey("llama", "eager", "fp32", 2)
    answered = [
        CellKey(m, "eager", "fp32", tp)
        for m in UNEVEN_MODELS
        for tp in (2, 3)
        if (m, tp) not in (("gemma3", 3), ("cohere", 3))
    ]  # cohere tp3: left for the next triage
    with HistoryStore(store, create=False) as history:
        for cell in answered:
            history.add_bisection(
                Bisection(
                    cell,
                    "fixed",
                    "deepspeed",
                    "0.19.5",
                    "0.19.6",
                    (("transformers", "5.24.0"), ("torch", "2.13.0")),
                    "shard",
                    UNEVEN.format(sizes="[" + ", ".join(["N"] * cell.tp) + "]"),
                    **FIXED_BY,
                    recorded_at="2026-12-05T00:00:00+00:00",
                    confirmed_from="" if cell == representative else representative.id,
                )
            )
    return store


# ---- A nightly at the latest versions like issue #26 found it: 94 failures, 27 causes --------------------------


def _tps(model: str, failure_class: str, signature_at, tps=(2, 3, 4)) -> list[Cell]:
    return [fail(model, failure_class, signature_at(tp), tp=tp) for tp in tps]


def _nightly_failures() -> list[Cell]:
    """94 failing cells with the shapes of real signatures: numbers the recording leaves in (memory's MiB, shape
    products, tolerances) differ per model and tp, so there are 53 distinct signatures but 27 causes."""
    cells = []
    size = (
        "RuntimeError: The size of tensor a (N) must match the size of tensor b (N) at non-singleton dimension N "
        "@ transformers/integrations/sdpa_attention.py:sdpa_attention_forward"
    )
    for model in ("falcon", "falcon_40b", "gpt_neo", "opt", "mpt", "stablelm", "xglm"):  # 21 forward cells
        cells += _tps(model, "forward", lambda tp: size)
    for model in ("gpt2", "openai_gpt"):  # 6 forward cells, the shape product differs per tp
        cells += _tps(
            model,
            "forward",
            lambda tp: (
                "RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                f"(Nx{12 // tp}N and Nx4) @ deepspeed/module_inject/layers.py:forward"
            ),
        )
    cells += [
        fail(
            "biogpt",
            "forward",
            "ValueError: Unsupported activation function: silu @ deepspeed/module_inject/containers/opt.py:__init__",
            tp=tp,
        )
        for tp in (2, 3, 4)
    ]
    for n, model in enumerate(("mixtral", "qwen2_moe", "qwen3_moe", "phimoe", "granitemoe", "jamba", "olmoe")):
        cells += _tps(
            model,
            "memory",
            lambda tp, n=n: (
                f"memory: experts not sharded: rank 0 holds {6.75 - n * 0.75:.3g} "
                f"of {6.75 - n * 0.75:.3g} MiB (100%; at most {(1 + 1 / tp) / 2:.0%} expected on tp {tp})"
            ),
        )
    for model in ("cohere2", "glm", "glm4", "persimmon", "nemotron", "helium", "exaone4", "arcee"):  # 24 cells
        cells += _tps(
            model,
            "forward",
            lambda tp, model=model: (
                f"IndexError: index out of range in self @ transformers/models/{model}/modeling_{model}.py:forward"
            ),
        )
    for n, model in enumerate(
        (
            "deepseek_v2",
            "deepseek_v3",
            "qwen3_next",
            "dbrx",
            "gpt_oss",
            "minimax",
            "bitnet",
            "jetmoe",
            "falcon_h1",
            "flex_olmo",
        )
    ):  # 14 shard cells in 10 causes
        cells += _tps(
            model,
            "shard",
            lambda tp, model=model: (
                f"AssertionError: the {model} policy splits N heads over {tp} ranks "
                "@ deepspeed/module_inject/auto_tp.py:_replace"
            ),
            tps=(2, 3) if n < 4 else (2,),
        )
    for n, model in enumerate(("gemma", "gemma2", "gemma3", "exaone", "vaultgemma")):  # 5 numerics cells
        cells.append(fail(model, "numerics", f"logits_{n}: max |dlogit| {0.3 + n / 10} > 0.0001"))
    return cells


NIGHTLY_PASSING = ("llama", "mistral", "qwen2", "qwen3", "phi", "phi3", "bloom", "gptj", "codegen")


def nightly_94(folder: Path, **versions) -> Path:
    """One nightly of the default matrix at the latest versions with issue #26's 94 failures (and some passes)."""
    passing = [Cell(model, tp=tp) for model in NIGHTLY_PASSING for tp in (2, 3, 4)]
    return write_junit(
        folder / "nightly.xml",
        [*_nightly_failures(), *passing],
        run_id="nightly@2026-12-03T00:00:00Z@vm",
        started="2026-12-03T00:00:00Z",
        **{"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0+cpu", **versions},
    )


def markdown_tokens(markdown: str) -> list[Token]:
    """Every token of the markdown as GitHub parses it (CommonMark with tables), inline children after their parent,
    depth first: what the hostile-input tests look through for anything GitHub would act on."""
    flat: list[Token] = []

    def walk(tokens: list[Token]) -> None:
        for token in tokens:
            flat.append(token)
            walk(token.children or [])

    walk(MarkdownIt("commonmark").enable("table").parse(markdown))
    return flat
