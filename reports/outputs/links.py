"""Links in the HTML pages (report.html and the checkpoint pages): text with real anchors, the hub model card and
atlas page of a checkpoint, a verdict's icon with its word, and paths made relative to a page below report.html."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath

from markupsafe import Markup, escape

from reports.analysis import ICONS, Link

ATLAS_FOLDER = "checkpoints"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


def linked_html(make_lines: Callable[[Link], list[str]], depth: int = 0) -> list[Markup]:
    """Lines built by a Link-taking function (answers, commits, files) as HTML: the text escaped, the links real
    anchors; a relative link from a page `depth` folders below report.html climbs to it."""
    anchors: list[Markup] = []

    def link(text: str, url: str) -> str:
        target = url if depth == 0 or "://" in url or url.startswith("#") else str(PurePosixPath(*[".."] * depth, url))
        anchors.append(Markup('<a href="{}">{}</a>').format(target, text))
        return f"\x00{len(anchors) - 1}\x00"  # survives escaping; replaced by its anchor afterwards

    return [Markup(_PLACEHOLDER.sub(lambda m: anchors[int(m[1])], str(escape(line)))) for line in make_lines(link)]


def hub_url(hub_id: str) -> str:
    """The checkpoint's model card on the Hugging Face hub ("" for a name that is no hub id)."""
    return f"https://huggingface.co/{hub_id}" if _HUB_ID.fullmatch(hub_id) else ""


def checkpoint_page(hub_id: str) -> str:
    """A checkpoint's atlas page, relative to report.html: `checkpoints/Qwen--Qwen2-7B.html`."""
    return f"{ATLAS_FOLDER}/{re.sub(r'[^A-Za-z0-9._-]+', '--', hub_id)}.html"


def verdict_html(status: str, failure_class: str = "") -> Markup:
    """A verdict's icon with its word beside it, what a reader without an emoji font still reads."""
    word = failure_class if status == "fail" and failure_class else status
    return Markup('<span class="verdict {}"><span aria-hidden="true">{}</span> {}</span>').format(
        status, ICONS.get(status, ""), word
    )


_CODE_SPAN = re.compile(r"`([^`]+)`")


def code_spans(text: str) -> Markup:
    """Text with Markdown code spans, as HTML: escaped, each span a <code>."""
    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", str(escape(text))))
