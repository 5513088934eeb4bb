"""The redactor over crafted inputs (issue #53): a generator makes secrets of every class — shapes the library knows
(AWS, private keys, JWT, Slack, GitHub, Stripe, ...), the harness's own (Hugging Face, npm, Google, OpenAI), values
named as credentials in every spelling a log, a dict, JSON, YAML, a URL or a command line gives them, and each of
those hidden by percent-escapes, \\u escapes, base64 or a line break — with fresh random characters from a seeded
generator, in the contexts results carry them in; no 8-character piece of any survives. What the reports print
legitimately (git shas, sha256 checkpoint hashes, cell ids, hub ids, paths, versions, the repro script's source)
survives whole."""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from matrix.redaction import REDACTED, redact, secret_spans

PIECE = 8  # no piece this long of a secret may survive
ALNUM = string.ascii_letters + string.digits
rng = random.Random(53)


def chars(alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


@dataclass(frozen=True)
class Secret:
    kind: str
    text: str
    """The secret as it is planted."""
    hidden: str
    """What must not show, whole or in PIECE-character pieces (the part after a well-known prefix)."""


def shaped() -> list[Secret]:
    """One token of every shape, its random part fresh."""
    upper = string.ascii_uppercase + string.digits
    b64url = ALNUM + "-_"
    tokens = {
        "hf": ("hf_", chars(ALNUM, 34)),
        "github classic": ("ghp_", chars(ALNUM, 36)),
        "github fine-grained": ("github_pat_", chars(ALNUM, 22) + "_" + chars(ALNUM, 59)),
        "aws access key": ("AKIA", chars(upper, 16)),
        "npm": ("npm_", chars(ALNUM, 36)),
        "slack": ("xoxb-", f"{chars(string.digits, 12)}-{chars(string.digits, 13)}-{chars(ALNUM, 24)}"),
        "google": ("AIza", chars(b64url, 35)),
        "openai project": ("sk-proj-", chars(b64url, 48)),
        "stripe": ("sk_live_", chars(ALNUM, 24)),
        "gitlab": ("glpat-", chars(ALNUM, 20)),
        "sendgrid": ("SG.", chars(b64url, 22) + "." + chars(b64url, 43)),
        "pypi": ("pypi-AgEIcHlwaS5vcmc", chars(b64url, 80)),
    }
    secrets = [Secret(kind, prefix + rest, rest) for kind, (prefix, rest) in tokens.items()]
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()).decode().rstrip("=")
    payload = base64.urlsafe_b64encode(json.dumps({"sub": chars(ALNUM, 12)}).encode()).decode().rstrip("=")
    signature = chars(b64url, 43)
    secrets.append(Secret("jwt", f"{header}.{payload}.{signature}", f"{payload}.{signature}"))
    body = "\n".join(chars(ALNUM + "+/", 64) for _ in range(4))
    key = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"
    secrets.append(Secret("private key", key, body))
    return secrets


def named(value: str) -> list[tuple[str, str]]:
    """(kind, text): a value with no shape, assigned to the name of a credential in every spelling results carry."""
    return [
        ("env line", f"HF_TOKEN={value}"),
        ("dict repr", f"{{'WANDB_API_KEY': '{value}', 'x': 1}}"),
        ("json", json.dumps({"aws_secret_access_key": value})),
        ("json in json", json.dumps(json.dumps({"client_secret": value}))),
        ("yaml", f"db_password: {value}\n"),
        ("command line", f"run --hf-token {value} --tp 2"),
        ("url query", f"https://hub.example/x?user=me&password={value}&y=1"),
        ("url userinfo", f"https://ci-bot:{value}@pypi.example.com/simple"),
        ("authorization", f"{{'Authorization': 'Bearer {value}'}}"),
        ("camel case", f"accessToken: {value}"),
    ]


ENCODINGS: dict[str, Callable[[str], str]] = {
    "as is": lambda text: text,
    "percent-escaped": lambda text: text.replace("_", "%5F").replace("-", "%2D"),
    "json \\u escape": lambda text: text.replace("_", "\\u005f").replace("-", "\\u002d"),
    "base64 of user:token": lambda text: base64.b64encode(f"user:{text}".encode()).decode(),
    "wrapped over lines": lambda text: f"{text[:7]}\n    {text[7:]}",
    "wrapped in json": lambda text: f"{text[:11]}\\n{text[11:]}",
    "wrapped, the break read as a space": lambda text: f"{text[:9]}  {text[9:]}",
}
# The shapes whose prefix says a token goes on after a space (the others' rest alone is a word).
BROKEN_BY_SPACE = ("hf", "github classic", "npm", "google", "openai project")
CONTEXTS = (
    "RuntimeError: 401 for {}",
    '{{"message": "failed with {}", "cell": "llama-eager-fp32-tp2"}}',
    "  File \"/x.py\", line 3\n    token = '{}'\n",
    "<td>{}</td>",
)


def pieces_left(text: str, hidden: str) -> list[str]:
    """The PIECE-character pieces of `hidden` (line breaks aside) that show in text."""
    flat = hidden.replace("\n", "")
    return sorted({flat[i : i + PIECE] for i in range(len(flat) - PIECE + 1) if flat[i : i + PIECE] in text})


def crafted() -> list[tuple[str, str, str]]:
    """(name, input, what must not show): every shape in every encoding and context, every named value in every
    spelling, plain and percent- or \\u-escaped."""
    cases = []
    for secret in shaped():
        for encoding, encode in ENCODINGS.items():
            if secret.kind == "private key" and encoding != "as is":
                continue  # a block of lines: plain only
            if encoding.startswith("wrapped, the break") and secret.kind not in BROKEN_BY_SPACE:
                continue
            for n, context in enumerate(CONTEXTS):
                cases.append(
                    (f"{secret.kind}, {encoding}, context {n}", context.format(encode(secret.text)), secret.hidden)
                )
    for encoding in ("as is", "percent-escaped", "json \\u escape"):
        value = chars(ALNUM, 7)  # `hunter2`'s length: no shape, only the name says it is a secret
        for kind, text in named(value):
            cases.append((f"named, {kind}, {encoding}", ENCODINGS[encoding](text), value))
    return cases


CASES = crafted()


@pytest.mark.parametrize(("name", "text", "hidden"), CASES, ids=[name for name, _, _ in CASES])
def test_no_piece_of_a_crafted_secret_survives(name, text, hidden):
    redacted = redact(text)
    assert REDACTED in redacted
    flat = hidden.replace("\n", "")
    if len(flat) < PIECE:  # a short named value: it must not show at all
        assert flat not in redacted
    else:
        assert pieces_left(redacted, hidden) == []


def test_the_generator_covers_every_class():
    kinds = {name.split(",")[0] for name, _, _ in CASES}
    assert {"jwt", "private key", "aws access key", "slack", "npm", "google", "openai project", "hf"} <= kinds
    encodings = {
        name.split(", ", 1)[1].rsplit(", context", 1)[0] for name, _, _ in CASES if not name.startswith("named")
    }
    assert encodings == set(ENCODINGS)
    assert len(CASES) > 250


KEPT = (
    "commit 0123456789abcdef0123456789abcdef01234567 of deepspeedai/DeepSpeed",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    '{"checkpoint": "' + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" + '"}',
    '{"commit": "' + "".join(random.Random(1).choice("0123456789abcdef") for _ in range(40)) + '"}',
    '{"cell": "llama-eager-fp32-tp2", "hub_id": "hf-internal-testing/tiny-random-LlamaForCausalLM"}',
    '"https://github.com/deepspeedai/DeepSpeed/blob/edaa7221267243c7be7fb49c5d5f5c4fb7a1e0b2/deepspeed/x.py#L293"',
    '"deepspeed/module_inject/auto_tp.py" "transformers==5.24.0" "torch==2.13.0+cpu"',
    "TOKENIZERS_PARALLELISM=false max_new_tokens=20 pad_token='<pad>' author: someone hf_device_map",
    "hf_device_map 0123456789abcdef01234567 and hf_hub downloads, sk-learn classifier, npm_config registry",
    "RuntimeError: shape '[2, 64, 4096]' is invalid for input of size 524288",
    "run nightly@2025-01-02T00%3A00%3A00Z@runner-1 and run%40twin",
    '{"text": "line one\\nline two\\n  File \\"/site-packages/deepspeed/module_inject/auto_tp.py\\", line 12"}',
)


@pytest.mark.parametrize("text", KEPT)
def test_what_reports_print_legitimately_survives(text):
    assert redact(text) == text


def test_the_repro_scripts_source_survives():
    """A repro script is redacted whole: its code must come through unchanged."""
    template = Path(__file__).resolve().parents[2] / "suites" / "records" / "repro_template.py"
    source = template.read_text()
    assert [source[start:end] for start, end in secret_spans(source)] == []


def test_a_secret_repeated_in_a_long_text_goes_everywhere():
    """Over a long text the library's patterns read its distinct lines once: every copy of a secret still goes."""
    token = "AKIA" + chars(string.ascii_uppercase, 16)
    text = "\n".join(f"line {n % 50} of a report" for n in range(20000)) + f"\n{token}\nx {token} y\n" * 3
    redacted = redact(text)
    assert token[4:12] not in redacted and redacted.count(REDACTED) == 6
