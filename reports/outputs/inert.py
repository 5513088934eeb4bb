"""Markdown that carries text from the results, made inert with a real CommonMark parser (markdown-it-py).

Every markdown output (report.md, the step summary, supported-models.md, the PR comment, issues, draft issues) is
passed through `inert` last. It parses the text as GitHub would (CommonMark with tables), so it knows exactly which
characters are code — fenced and indented blocks, code spans of any backtick count — and which are text, and in text
it neutralises what GitHub would act on: links and images (`[` `]` `!` escaped), autolinks and raw HTML (`<` as
`&lt;`), bare URLs, e-mail addresses and @mentions (put in code spans), entities (`&#64;` is an @). What stays
active is what this harness writes itself: its own links (to commits, pull requests, issues and comparisons on GitHub,
OUR_URL),
its markers (`<!-- autotp-matrix:… -->`) and its `<details>` frames. Fenced blocks the harness writes take their fence
from their content (`fence`), so no line of a log or script can close them early."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable("table")
# The links this harness writes: a commit, pull request, issue or comparison on GitHub (reports.analysis.answers,
# matrix/known_failures.toml's upstream URLs, publish's compare links).
OUR_URL = re.compile(
    r"https://github\.com/[A-Za-z0-9-]+/[A-Za-z0-9._-]+/(?:commit|pull|issues|compare)/[A-Za-z0-9._#/-]+"
)
OUR_LINK = re.compile(rf"\[[^\[\]\n`]+\]\({OUR_URL.pattern}\)")
# The HTML blocks this harness writes: hidden markers and collapsible frames.
OUR_HTML = re.compile(
    r"<!-- autotp-matrix:[a-z-]+(?: cause=[0-9a-f]+)? -->|</?details>|<details><summary>[^<>]*</summary>|</summary>"
)
_ASCII_PUNCTUATION = r"!-/:-@\[-`{-~"
_MENTION_PATTERN = r"(?<![\w`@/.+-])@[A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9_.-]+)?"
_MENTION = re.compile(_MENTION_PATTERN)
_TEXT = re.compile(
    rf"""(?P<escape>\\[{_ASCII_PUNCTUATION}])
    |(?P<ours>{OUR_LINK.pattern})
    |(?P<url>(?:(?:https?|ftp)://|(?<![\w.-])www\.)[^\s<>`()]+(?:\([^\s<>`()]*\)[^\s<>`()]*)*)
    |(?P<email>(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)
    |(?P<mention>{_MENTION_PATTERN})
    |(?P<entity>&(?:\#[0-9]{{1,7}}|\#[xX][0-9a-fA-F]{{1,6}}|[A-Za-z][A-Za-z0-9]{{1,31}});)
    |(?P<image>!(?=\[))
    |(?P<bracket>[\[\]])
    |(?P<angle><)""",
    re.VERBOSE,
)
# Where inline content needs a look: an escaped character, or a run of backticks (a code span's or a literal one).
_SPECIAL = re.compile(rf"\\[{_ASCII_PUNCTUATION}]|`+")
_BACKTICKS = re.compile(r"`+")


def fence(text: str, info: str = "") -> list[str]:
    """A fenced code block around `text`, its fence one backtick longer than the longest run of backticks in it (at
    least three), so no line of the text closes it."""
    runs = [len(run) for run in re.findall(r"`+", text)]
    marks = "`" * max(3, max(runs, default=0) + 1)
    return [f"{marks}{info}", *text.split("\n"), marks]


def inert(markdown: str, *, title: bool = False) -> str:
    """The markdown with everything from the results that GitHub would act on neutralised (module docstring). An
    issue title renders code spans and mentions only: there only mentions are put in code spans."""
    if title:
        return _inline(markdown.replace("\n", " "), title=True)
    text = markdown.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")  # as the parser reads it
    lines = text.split("\n")
    cursors: dict[int, int] = {}  # per line, where the next inline content on it is looked for (table cells)
    for token in _PARSER.parse(text):
        if token.map is None:
            continue
        first, end = token.map
        if token.type == "html_block":
            for number in range(first, end):
                if not OUR_HTML.fullmatch(lines[number].strip()):  # then it is text, and made inert as text
                    lines[number] = _inline(lines[number])
        elif token.type == "inline":
            _neutralise_inline(lines, first, token.content, cursors)
    return "\n".join(lines)


def _neutralise_inline(lines: list[str], first: int, content: str, cursors: dict[int, int]) -> None:
    """Replace, line by line, an inline token's content in the source lines it came from (each of its lines is found
    after the container's prefix: a list marker, `>`, a table's `|`) with its neutralised form."""
    neutral = _inline(content).split("\n")
    for offset, (original, replacement) in enumerate(zip(content.split("\n"), neutral)):
        number = first + offset
        line = lines[number]
        at = line.find(original, cursors.get(number, 0)) if original else -1
        if at < 0:  # not where the parser says it is: neutralise the whole line, as text
            lines[number] = _inline(line)
            cursors[number] = len(lines[number])
            continue
        lines[number] = line[:at] + replacement + line[at + len(original) :]
        cursors[number] = at + len(replacement)


def _inline(content: str, *, title: bool = False) -> str:
    """Inline content with its code spans kept as they are (CommonMark's rule: a run of n backticks opens a span
    that the next run of exactly n closes; an unclosed run is literal) and its text neutralised."""
    pieces: list[str] = []
    position = text_start = 0
    while (found := _SPECIAL.search(content, position)) is not None:
        if found.group().startswith("\\"):
            position = found.end()  # an escaped character is text, and an escaped backtick opens nothing
            continue
        run = len(found.group())
        close = _closing_run(content, found.end(), run)
        pieces.append(_text(content[text_start : found.start()], title))
        if close is None:  # literal backticks: escaped, so no backtick put in below can pair with them
            pieces.append("'" * run if title else "\\`" * run)
            position = text_start = found.end()
        else:
            pieces.append(content[found.start() : close + run])
            position = text_start = close + run
    pieces.append(_text(content[text_start:], title))
    return "".join(pieces)


def _closing_run(content: str, start: int, length: int) -> int | None:
    """Where the next run of exactly `length` backticks after `start` begins, None if there is none."""
    return next((m.start() for m in _BACKTICKS.finditer(content, start) if len(m.group()) == length), None)


def _text(text: str, title: bool) -> str:
    if title:
        return _MENTION.sub(lambda m: f"`{m.group()}`", text)
    return _TEXT.sub(_neutral, text)


def _neutral(match: re.Match) -> str:
    kind, value = match.lastgroup, match.group()
    if kind in ("escape", "ours") or kind == "url" and OUR_URL.fullmatch(value.rstrip(".,;:!?")):
        return value  # our links, and our own bare links (publish's comparisons), stay links
    if kind in ("url", "email", "mention"):
        return f"`{value}`"  # the characters matched hold no backtick
    if kind == "entity":
        return "&amp;" + value[1:]
    if kind == "angle":
        return "&lt;"
    return "\\" + value  # image, bracket
