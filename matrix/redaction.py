"""Secrets (HF_TOKEN, GITHUB_TOKEN, any credential) never reach a log, a record, a report or a repro script: everything
that writes text another person may read passes it through `redact`, or through one `Redactor` for many texts. It sits
in the lowest layer so that every layer (prefetch, records, the door of reports/) redacts the same way.

What is replaced by `***`:
- the values of this environment's variables whose names look like credentials (only values of at least
  MIN_SECRET_LENGTH characters: `TOKENIZERS_PARALLELISM=false` must not blank out every "false");
- secrets by shape, wherever they come from (a failure recorded on a machine whose environment this process never
  saw): every pattern of detect-secrets' regex plugins (AWS, private keys, JWT, Slack, npm, GitHub, GitLab, Stripe,
  PyPI, ...; the maintained list), and the harness's own (_SHAPES: Hugging Face, GitHub, npm, Google and OpenAI keys,
  a whole private-key block, a JWT's signature, the credential after `Authorization:` or `Bearer`, a URL's
  user:password, a prefixed token cut by a space where its line was wrapped);
- secrets by name: the value of every `key=value`, `key: value`, `'KEY': 'value'` or `--key value` whose key names a
  credential (detect-secrets' keyword list, plus tokens and credentials; _credential_values);
- quoted strings of high entropy (detect-secrets' Base64 measure and limit): an unnamed random token. Hex strings
  stay, whatever their entropy (git shas, sha256 checkpoint hashes: the reports print them), and so do paths (two
  slashes or more: `deepspeedai/DeepSpeed/blob/<sha>`);
- the same, found in the text as it reads once decoded (_DECODINGS: percent-escapes, JSON and Python escapes, base64,
  a token wrapped over lines): the encoded text is replaced where it is.

Host paths go too (`without_host_paths`): a traceback's frames keep the path a reader can follow from where the code
is installed (`site-packages/deepspeed/…`, `python3.11/importlib/…`, the harness's `suites/…`), never the folders of
the machine that ran it (`/work/envs/<combination>/lib/python3.11/`, `/root/.pyenv/…`, the checkout's folder).

A secret's match is stretched over the rest of its token (the plugins' lengths are exact: a longer token would
leave its tail). Every pattern is looked for only where the text holds what it needs (a literal, an escape): an
8 MB report.json redacts in a fraction of a second."""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import itertools
import os
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD", re.IGNORECASE)
MIN_SECRET_LENGTH = 8
REDACTED = "***"
# A token of a known prefix cut short by spaces or a line break (a wrapped line read back from an XML attribute, whose
# line breaks became spaces), then its rest: 16 letters and digits or more (longer than words), not all hex (a sha).
_BROKEN_BY_SPACE = r"(?:[ \t]+|[ \t]*(?:\\n|\r?\n)[ \t]*)"
_HEX_ONLY = r"[0-9a-f]+(?![a-z0-9_-])"
# The harness's own shapes, written in lowercase and matched against an ASCII-lowercased copy of the text (same
# length, so the spans carry over), each with the literal it starts with (looked for first, as it is cheaper: a
# case-insensitive or \b-led pattern took 1.4 s instead of 0.01 s over an 8 MB report.json). Lengths are minimums, so
# that a longer future format is caught too. A group `lead` is kept (the words before a credential).
_SHAPES = (
    ("hf_", re.compile(r"hf_[a-z0-9]{20,}")),  # Hugging Face
    ("gh", re.compile(r"gh[pousr]_[a-z0-9]{20,}")),  # GitHub, classic
    ("github_pat_", re.compile(r"github_pat_[a-z0-9_]{20,}")),  # GitHub, fine-grained
    ("npm_", re.compile(r"npm_[a-z0-9]{30,}")),  # npm's access tokens (detect-secrets knows only .npmrc lines)
    ("aiza", re.compile(r"aiza[a-z0-9_-]{30,}")),  # Google API keys
    ("sk-", re.compile(r"sk-(?:proj-|svcacct-|admin-|ant-)?[a-z0-9_-]{20,}")),  # OpenAI, Anthropic
    ("xox", re.compile(r"xox[abposr]-[a-z0-9-]{10,}")),  # Slack, any segment layout
    ("eyj", re.compile(r"eyj[a-z0-9_=-]{8,}\.[a-z0-9_=-]{8,}(?:\.[a-z0-9_=+/-]*)?")),  # a JWT, its signature too
    (  # a private key's whole block (detect-secrets matches its first line), JSON's \n escapes included
        "-----begin",
        re.compile(
            r"-----begin[a-z ]{0,30}private key(?: block)?-----(?:\\[nr]|[\sa-z0-9+/=])*(?:-----end[a-z ]{0,40}-----)?"
        ),
    ),
    (
        "authorization",
        re.compile(
            r"(?P<lead>authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|token|basic)\s+)?)"
            r"[^\s\"',;]{8,}"
        ),
    ),
    ("bearer", re.compile(r"(?P<lead>bearer\s+)[^\s\"',;]{8,}")),
    # The user:password of a URL (a private index in pip's configuration, handed to uv on its command line).
    ("://", re.compile(r"(?P<lead>://)[^\s/@:\"']+:[^\s/@\"']+(?=@)")),
    *(
        (literal, re.compile(rf"{prefix}[{rest}]{{0,{short}}}{_BROKEN_BY_SPACE}(?!{_HEX_ONLY})[{rest}]{{16,}}"))
        for literal, prefix, rest, short in (
            ("hf_", "hf_", "a-z0-9", 19),
            ("gh", "gh[pousr]_", "a-z0-9", 19),
            ("npm_", "npm_", "a-z0-9", 29),
            ("aiza", "aiza", "a-z0-9_-", 29),
            ("sk-", "sk-(?:proj|svcacct|admin)-", "a-z0-9_-", 19),
        )
    ),
)
# The names of credentials (lowercase): detect-secrets' keyword list (api_key, password, secret, ...) and these. A
# name is a credential when one of them ends it, or is followed by `_`, `-` or `.` only: `max_new_tokens`,
# `tokenizer` and `author` are no credentials; `HF_TOKEN`, `aws_secret_access_key`, `wandb_api_key` are.
_OWN_CREDENTIAL_WORDS = ("token", "access_?key", "secret_?key", "credentials?", "passphrase", "auth", "authorization")
# Tokenizers' special tokens are names, not credentials (`pad_token='<pad>'`).
_NOT_CREDENTIALS = re.compile(r"(?:pad|eos|bos|unk|mask|sep|cls|special|additional_special|chat)_token$")
_NAME_CHARACTERS = frozenset(string.ascii_lowercase + string.digits + "_-.")
# After the name: closing quotes or bracket, an assignment (`=`, `:`, `:=`, `=>`; `--name value` on a command line),
# an opening quote and the scheme words of an Authorization value; then the value, up to a quote, space or delimiter.
_ASSIGNMENT = re.compile(r"""(?:\\?["'\]]){0,2}[ \t]*(?::=|=>|[:=])[ \t]*(?:\\?["'])?(?:(?:bearer|token|basic)\s+)?""")
_OPTION_ASSIGNMENT = re.compile(r"""[ \t]+(?:\\?["'])?""")
_VALUE = re.compile(r"""[^\s"'`\\,;&(){}\[\]<>]{4,}""")
# Quoted strings the entropy measure reads; the characters of a token (a match is stretched over the rest of them).
_QUOTED = re.compile(r"""["']([A-Za-z0-9+/=_-]{20,})\\?["']""")
_WORD = re.compile(r"\w")
# What every pattern of the library needs (a run of 8 token characters, a private key's header or a URL's userinfo):
# a text without any is not read by them (a version, a cell id's parts, a count).
_LIBRARY_GATE = re.compile(r"[A-Za-z0-9_+/=-]{8}|PRIVATE KEY|://", re.IGNORECASE)
LONG_TEXT = 1 << 16
_HEX = re.compile(r"[0-9a-fA-F]+")
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_+/=-]*")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def secret_values(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Values of environment variables that look like credentials (HF_TOKEN, GITHUB_TOKEN, ...), longest first."""
    return sorted(
        {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True
    )


@dataclass(frozen=True)
class _Library:
    """What detect-secrets gives the redactor, loaded once per process (its import takes a fifth of a second)."""

    patterns: tuple[tuple[re.Pattern[str], bool], ...]
    """The denylist patterns of its regex plugins, but the public-IP one (an address is no secret), each with whether
    it is an assignment (`<service>_key = value`, written by RegexBasedDetector.build_assignment_regex): those start
    with a lookbehind (a non-word character before), checked on each match here instead, as a pattern led by a
    lookbehind is tried at every position (2.8 of the 4 s CPU the plugins took over an 8 MB report.json)."""
    credential_name: re.Pattern[str]
    """Its keyword list and _OWN_CREDENTIAL_WORDS, as one pattern over lowercase text."""
    entropy: Callable[[str], float]
    """Shannon entropy over the Base64 charset, the measure of its Base64HighEntropyString plugin."""
    entropy_limit: float
    """That plugin's default limit (4.5 bits per character)."""


@functools.cache
def _library() -> _Library:
    # lazily: nox's own process imports this module before sessions/installers.py installs detect-secrets
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
    from detect_secrets.plugins.ip_public import IPPublicDetector
    from detect_secrets.plugins.keyword import DENYLIST

    plugins: list[type[BasePlugin]] = list(get_mapping_from_secret_type_to_class().values())
    patterns = tuple(
        _unanchored(pattern)
        for plugin in plugins
        if issubclass(plugin, RegexBasedDetector) and plugin is not IPPublicDetector
        # a class attribute in every regex plugin (the base class declares it an abstract property)
        for pattern in cast(Iterable[re.Pattern[str]], plugin.denylist)
    )
    words = "|".join(word.replace("_?", "[_-]?") for word in (*DENYLIST, *_OWN_CREDENTIAL_WORDS))
    entropy_plugin = Base64HighEntropyString()
    return _Library(
        patterns=patterns,
        credential_name=re.compile(rf"(?:{words})(?![a-z0-9])"),
        entropy=entropy_plugin.calculate_shannon_entropy,
        entropy_limit=entropy_plugin.entropy_limit,
    )


_ASSIGNMENT_START = r"(?:(?<=\W)|(?<=^))"  # how RegexBasedDetector.build_assignment_regex begins its patterns


def load_detectors() -> None:
    """Import detect-secrets and compile its patterns now (a process that forks workers does it once for them all)."""
    _library()


def _unanchored(pattern: re.Pattern[str]) -> tuple[re.Pattern[str], bool]:
    if pattern.pattern.startswith(_ASSIGNMENT_START):
        return re.compile(pattern.pattern.removeprefix(_ASSIGNMENT_START), pattern.flags), True
    return pattern, False


class Redactor:
    """The secrets of one environment, read once: for redacting many texts (a whole import) in one go."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        self._values = secret_values(environ)  # longest first: a value inside another goes too

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        return without_host_paths(_replaced(text, secret_spans(text)))


_FOLDERS = r"(?:[A-Za-z]:)?[\\/]?(?:[^\s\"'\\/]+[\\/])+?"
"""Folders from the root, or from where a cut text begins (a traceback kept by its last characters)."""
_INSTALLED = re.compile(rf"{_FOLDERS}((?:site|dist)-packages)[\\/]")
"""An installed package's folder: `/work/envs/x/lib/python3.11/site-packages/` (kept: `site-packages/`)."""
_STANDARD_LIBRARY = re.compile(rf"{_FOLDERS}lib[\\/](python3\.\d+)[\\/](?!(?:site|dist)-packages)")
"""Python's own modules: `/root/.pyenv/versions/3.11.7/lib/python3.11/` (kept: `python3.11/`)."""
_FRAME_FILE = re.compile(
    r'(File ")(/[^"]*?/)((?:suites|matrix|sessions|reports|tests|benchmarks|conftest\.py'
    r'|deepspeed|transformers|accelerate)(?:/[^"/]+)*")'
)
"""A traceback frame of the harness's own code or of a library under test run from a clone (a DeepSpeed checkout):
the folders above the package (the checkout's, `/work/wt/x/`) go, the package's path stays (`suites/engine/…`)."""
_KEPT_LOGS = re.compile(r"(?m)^(logs: )?(?:[A-Za-z]:)?[\\/](?:[^\s\"'\\/]+[\\/])*?logs[\\/]([^\s\"'\\/]+)[\\/]?$")
"""A failing cell's kept-logs pointer as records before it was relative held it (a record's `logs`, a message's
`logs:` line): `/root/x/results/logs/<cell>` keeps what the results folder calls it, `logs/<cell>/`."""


def without_host_paths(text: str) -> str:
    """`text` with the host's folders cut from the paths of installed packages, of Python's own modules and of the
    frames of a traceback (`_INSTALLED`, `_STANDARD_LIBRARY`, `_FRAME_FILE`) and from a kept-logs pointer
    (`_KEPT_LOGS`); every other word stays."""
    text = _substituted_in_words(_INSTALLED, r"\1/", text, "-packages")
    text = _substituted_in_words(_STANDARD_LIBRARY, r"\1/", text, "python3.")
    if 'File "/' in text:
        text = _FRAME_FILE.sub(r"\1\3", text)
    if "logs" in text:
        text = _KEPT_LOGS.sub(r"\1logs/\2/", text)
    return text


_SPACE = re.compile(r"\s")


def _substituted_in_words(pattern: re.Pattern[str], replacement: str, text: str, literal: str) -> str:
    """`pattern.sub(replacement, text)` for a host-path pattern, read only in the words (runs without whitespace) that
    hold `literal`. Every match of these patterns lies inside one word and holds the literal, and a word alone
    decides where they match (no lookbehind; the closing lookahead fails at a word's end as at the space after it).
    Tried at every position of the text instead, they took 0.35 of a warm render's 0.8 s of redaction (#58)."""
    pieces, done = [], 0
    found = text.find(literal)
    while found != -1:
        start = found
        while start > done and not text[start - 1].isspace():  # str.isspace is the regex's \s (Py_UNICODE_ISSPACE)
            start -= 1
        space = _SPACE.search(text, found)
        end = space.start() if space else len(text)
        pieces += [text[done:start], pattern.sub(replacement, text[start:end])]
        done = end
        found = text.find(literal, end)
    return "".join(pieces) + text[done:] if pieces else text


def redact(text: str) -> str:
    return Redactor()(text)


def copy_redacted(source: Path, destination: Path) -> None:
    """Copy a log with its secrets replaced; bytes that are not UTF-8 (a crashed rank's output) pass unchanged."""
    text = Path(source).read_bytes().decode("utf-8", errors="surrogateescape")
    Path(destination).write_bytes(redact(text).encode("utf-8", errors="surrogateescape"))


def secret_spans(text: str) -> list[tuple[int, int]]:
    """Where the text holds a secret by shape or by name, as it reads and as it reads decoded (start, end), sorted."""
    return sorted([*_direct_spans(text, entropy=True), *_decoded_spans(text)])


def _replaced(text: str, spans: list[tuple[int, int]]) -> str:
    pieces, done = [], 0
    for start, end in spans:
        if end > done:  # overlapping matches (a token after `Authorization: token`) are one
            pieces += [text[done : max(start, done)], REDACTED]
            done = end
    return "".join(pieces) + text[done:]


def _direct_spans(text: str, *, entropy: bool) -> Iterator[tuple[int, int]]:
    """The secrets of the text as it reads: by the harness's shapes, the library's patterns, credential names and
    (with `entropy`) quoted strings of high entropy."""
    library = _library()
    lowered = _lowered(text)
    for literal, pattern in _SHAPES:
        if literal in lowered:
            for match in pattern.finditer(lowered):
                yield _stretched(text, match.end("lead") if "lead" in pattern.groupindex else match.start(), match)
    yield from _library_spans(text)
    yield from _credential_values(lowered, library.credential_name)
    if entropy and ('"' in text or "'" in text):
        for match in _QUOTED.finditer(text):
            value = match.group(1)
            if value.count("/") < 2 and not _HEX.fullmatch(value) and library.entropy(value) > library.entropy_limit:
                yield match.span(1)


def _library_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where the library's patterns match: each distinct line is read once (no pattern spans lines), and each secret
    found is then replaced wherever it shows in the text. Lines are remembered across texts (`_line_secrets`): a
    render redacts 119 repro scripts and 15 drafts that share most of their lines."""
    if _LIBRARY_GATE.search(text) is None:
        return
    with_assignments = len(text) <= LONG_TEXT
    secrets = {secret for line in dict.fromkeys(text.split("\n")) for secret in _line_secrets(line, with_assignments)}
    if secrets:
        alternatives = "|".join(re.escape(secret) for secret in sorted(secrets, key=len, reverse=True))
        yield from (match.span() for match in re.finditer(alternatives, text))


@functools.lru_cache(maxsize=1 << 16)
def _line_secrets(line: str, with_assignments: bool) -> frozenset[str]:
    """The secrets the library's patterns find in one line. A long text (a report, assembled from texts that each
    passed the door) is read without the assignment patterns (`ibm_cloud_iam_key = ...`): tried at every position,
    they took 0.14 of the 0.23 s CPU over 500 kB, and the credential-name rule reads the same assignments."""
    if _LIBRARY_GATE.search(line) is None:
        return frozenset()
    found = [
        _stretched(line, match.start(), match)
        for pattern, assignment in _library().patterns
        if with_assignments or not assignment
        for match in pattern.finditer(line)
        if not assignment or match.start() == 0 or not _WORD.match(line, match.start() - 1)
    ]
    return frozenset(line[start:end] for start, end in found if end > start)


def _stretched(text: str, start: int, match: re.Match[str]) -> tuple[int, int]:
    """A match's span, without the delimiters some patterns include (a space, quote, `=` or `:` around the token)
    and stretched over the rest of the token it ends in."""
    end = match.end()
    while end > start and text[end - 1] in " \t\r\n\"'`:=@,":
        end -= 1
    while start < end and text[start] in " \t\r\n\"'`:=/":
        start += 1
    tail = _TOKEN_TAIL.match(text, end)
    return start, tail.end() if tail else end


def _credential_values(lowered: str, credential_name: re.Pattern[str]) -> Iterator[tuple[int, int]]:
    """The values assigned to names of credentials (module docstring), in lowercase text."""
    for word in credential_name.finditer(lowered):
        start = word.start()
        while start > 0 and lowered[start - 1] in _NAME_CHARACTERS:
            start -= 1
        name, end = lowered[start : word.end()], word.end()
        if _NOT_CREDENTIALS.search(name):
            continue
        option = name.startswith("--")
        assignment = (_OPTION_ASSIGNMENT if option else _ASSIGNMENT).match(lowered, end)
        if assignment is None or (not option and not assignment.group().strip()):
            continue
        value = _VALUE.match(lowered, assignment.end())
        if value is not None and value.group() != REDACTED:
            yield value.span()


def _lowered(text: str) -> str:
    """The text in lower case, each character where it was (the patterns' spans carry over). str.lower() is one C
    loop; it keeps every position unless a character lowers to two (only U+0130, "İ"), and then the ASCII-only
    translation is used: a per-character table lookup once the text holds any non-ASCII character (a report with
    "…" or "×"): 2.1 s CPU against lower()'s 0.28 s over a year's 42 M-character report.html. lower() also lowers
    non-ASCII letters, which only ever lets a pattern match more (a Kelvin sign "K" reads as "k"), never less."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


def _decoded_spans(text: str) -> list[tuple[int, int]]:
    """The secrets the text holds once decoded (percent-escapes, JSON and Python escapes of ASCII characters, base64,
    tokens wrapped over lines), as spans of the text: each piece that decodes is read decoded, and where its decoded
    form holds a secret, what it was read from is replaced (the escaped characters of a line; a token whole). The
    pieces are read together, as one text, in one pass."""
    pieces = sorted({*_escaped_pieces(text), *_wrapped_pieces(text), *_base64_pieces(text)})
    if not pieces:
        return []
    view_starts = list(itertools.accumulate((len(decoded) + 1 for _, _, decoded in pieces[:-1]), initial=0))
    view = "\n".join(decoded for _, _, decoded in pieces)
    found = []
    for start, end in _direct_spans(view, entropy=False):
        first = bisect.bisect_right(view_starts, start) - 1
        last = bisect.bisect_right(view_starts, max(end - 1, start)) - 1
        piece_start, piece_end, _ = pieces[first]
        if first == last and _ESCAPE.search(text, piece_start, piece_end):  # a line with escapes
            offset = view_starts[first]
            found.append(_escaped_span(text, piece_start, piece_end, start - offset, end - offset))
        else:
            found += [(pieces[index][0], pieces[index][1]) for index in range(first, last + 1)]
    return found


def _escaped_span(text: str, start: int, end: int, decoded_start: int, decoded_end: int) -> tuple[int, int]:
    """The span of text[start:end] that the span of its unescaped form was read from."""
    origins = []  # per character of the unescaped form: where it starts and ends in the text
    position = start
    for escape in _ESCAPE.finditer(text, start, end):
        origins += [(index, index + 1) for index in range(position, escape.start())]
        origins.append(escape.span())
        position = escape.end()
    origins += [(index, index + 1) for index in range(position, end)]
    last = min(max(decoded_end - 1, decoded_start), len(origins) - 1)
    return origins[min(decoded_start, last)][0], origins[last][1]


# Escapes of printable ASCII characters, which neither JSON nor a URL needs for a token's characters (json.dumps
# escapes only quotes, backslashes and control characters; "…" is \u2026): a token's shape hidden by them.
_ESCAPE = re.compile(r"%[2-7][0-9A-Fa-f]|\\u00[2-7][0-9A-Fa-f]|\\x[2-7][0-9A-Fa-f]")
_LINE_END = frozenset("\r\n")
_LONGEST_PIECE = 4096
# A line break inside a token: token characters on both sides (the `\n` of JSON too), any indentation and a quote
# mark or a comment's `#` before the rest of the token. Led by the break, so it is looked for as a literal.
_TOKEN = "A-Za-z0-9_+/=-"
_WRAP = re.compile(
    rf"(?:\n(?<=[{_TOKEN}]{{3}}\n)|\r\n(?<=[{_TOKEN}]{{3}}\r\n)|\\n(?<=[{_TOKEN}]{{3}}\\n))"
    rf"[ \t]*(?:[>#|*][ \t]*)?(?=[{_TOKEN}]{{3}})"
)
_SHORTEST_WRAPPED = 16  # the characters a wrapped token has on its lines, together: shorter ones are words
# The token a break is inside: its characters and dots (a JWT's, SendGrid's parts).
_TOKEN_RUN = re.compile(rf"[.{_TOKEN}]+")
_TOKEN_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_+/=-.")
_BASE64 = re.compile(rf"[{_TOKEN}]{{16,}}")


def _escaped_pieces(text: str) -> Iterator[tuple[int, int, str]]:
    """Each line holding an escape of a printable ASCII character, unescaped (the name of a credential may be escaped
    and its value not: the line is read whole, and redacted whole where it holds a secret)."""
    ends = -1
    for escape in _ESCAPE.finditer(text):
        if escape.start() < ends:
            continue  # in the run just read
        start, ends = escape.start(), escape.end()
        while start > 0 and escape.start() - start < _LONGEST_PIECE and text[start - 1] not in _LINE_END:
            start -= 1
        while ends < len(text) and ends - escape.end() < _LONGEST_PIECE and text[ends] not in _LINE_END:
            ends += 1
        yield start, ends, _ESCAPE.sub(_unescaped, text[start:ends])


def _unescaped(match: re.Match[str]) -> str:
    return chr(int(match.group()[-2:], 16))


def _wrapped_pieces(text: str) -> Iterator[tuple[int, int, str]]:
    """Each token broken over lines (at least _SHORTEST_WRAPPED characters on its lines together), joined."""
    start = end = -1
    for wrap in _WRAP.finditer(text):
        left = wrap.start()
        while left > 0 and wrap.start() - left < _LONGEST_PIECE and text[left - 1] in _TOKEN_CHARACTERS:
            left -= 1
        right = _TOKEN_RUN.match(text, wrap.end())
        if right is None:
            continue
        if left > end:  # not the previous token going on over another line
            if end - start >= _SHORTEST_WRAPPED:
                yield start, end, _WRAP.sub("", text[start:end])
            start = left
        end = right.end()
    if end - start >= _SHORTEST_WRAPPED:
        yield start, end, _WRAP.sub("", text[start:end])


def _base64_pieces(text: str) -> Iterator[tuple[int, int, str]]:
    """Each run of base64 characters that decodes to printable ASCII text (hex shas and words decode to noise)."""
    for run in _BASE64.finditer(text):
        encoded = run.group().rstrip("=")
        if len(encoded) % 4 == 1 or _HEX.fullmatch(encoded):
            continue
        try:
            decoded = base64.b64decode(encoded.replace("-", "+").replace("_", "/") + "=" * (-len(encoded) % 4))
            plain = decoded.decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if plain.isprintable():
            yield run.start(), run.end(), plain
