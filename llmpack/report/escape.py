"""The one escaping of a text from a store (a tag, an error, a path or run name) for every place it is shown.

:func:`inert` makes it one line and shows every control, escape and direction-changing character
as a visible ``\\xNN`` / ``\\uNNNN`` (C0, DEL, C1 — ESC and CSI start terminal sequences such as
OSC 52, which writes the clipboard — bidi overrides and isolates, zero-width marks, line separators);
:func:`md`, :func:`html_text` and :func:`terminal` add what report.md, report.html and a rich console
each need on top. A planted tag is shown as its characters, never rendered, run or obeyed.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Any

# C0 and DEL and C1; zero-width and direction marks; line/paragraph separators, bidi embeddings and
# overrides (U+202A-U+202E), bidi isolates (U+2066-U+2069); the BOM / zero-width no-break space.
# Also: the soft hyphen, the combining grapheme joiner, the Arabic letter mark (a direction mark of the Trojan
# Source list), the Mongolian vowel separator, Hangul fillers, variation selectors and the invisible tag characters.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
                        "\u2060-\u2069\u3164\ufe00-\ufe0f\uffa0\ufeff\U000e0000-\U000e0fff"
                        # Khmer's inherent vowels, Mongolian's free variation selectors, the braille blank, the
                        # combining overlays (blank, or strike a text through)
                        "\u17b4\u17b5\u180b-\u180f\u2800\u0334-\u0338]")
# Markdown's own characters (emphasis, code, links and images, tables, headings, HTML) and the backslash. Not $:
# the money figures a report line carries (GitHub's maths changes how $x$ looks, nothing it links or runs).
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|<>~])")
# What GitHub's Markdown turns into a live link without brackets: ``scheme:`` before ``//`` and ``www.``.
_AUTOLINK = re.compile(r"(?i)\b(?:[a-z][a-z0-9+.-]*:(?=//)|www\.)")
MAX_CHARS = 2000  # a tag value shown in a report: MLflow allows 8,000; the rest is cut with a count


def _format_chars(text: str) -> str:
    """Every character of Unicode's format category (Cf: U+0600, U+06DD, U+FFF9, U+1D173...) not already in
    :data:`_INVISIBLE`, shown as its escape."""
    if text.isascii():
        return text
    return "".join(_visible_char(c) if unicodedata.category(c) == "Cf" else c for c in text)


def _visible_char(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _visible(match: re.Match[str]) -> str:
    return _visible_char(match.group())


def inert(value: Any) -> str:
    """``value`` as one line of plain characters: credentials redacted (a URI's password, a secret query value, every
    secret this process knows, typed or encoded), whitespace runs made one space, every invisible or controlling
    character (Unicode's whole format category too) shown as its escape, at most :data:`MAX_CHARS` characters."""
    from components.redaction import redact_text, strong_secrets

    text = _format_chars(_INVISIBLE.sub(_visible, " ".join(redact_text(value, strong_secrets()).split())))
    if len(text) > MAX_CHARS:
        text = f"{text[:MAX_CHARS]}... ({len(text):,} characters)"
    return text


def md(value: Any) -> str:
    """For report.md: :func:`inert`, HTML escaped (``<img onerror>`` is text), Markdown's characters
    backslash-escaped (no link, image, table cell, emphasis or heading can start inside it)."""
    text = _MD_SPECIAL.sub(r"\\\1", html.escape(inert(value), quote=False))
    return _AUTOLINK.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], text)  # no bare link: https\:// www\.


def html_text(value: Any) -> str:
    """For report.html (text or a quoted attribute): :func:`inert`, then HTML escaped, quotes included."""
    return html.escape(inert(value), quote=True)


def terminal(value: Any) -> str:
    """For a rich console's markup: :func:`inert` (no escape byte reaches the terminal), ``[`` escaped."""
    from rich.markup import escape

    return escape(inert(value))


def blanked_data(value: Any) -> Any:
    """``value`` (report.json's data) with every strong known secret (:func:`~components.redaction.strong_secrets`)
    blanked in each string, key or value, before it is JSON-encoded (the encoding escapes a quote, a backslash or a
    non-ASCII letter of a secret)."""
    from components.redaction import blank_known, strong_secrets

    if isinstance(value, str):
        return blank_known(value, strong_secrets())
    if isinstance(value, dict):  # a store's tag names too (strong secrets only: run ids and names stay exact)
        return {blanked_data(k) if isinstance(k, str) else k: blanked_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [blanked_data(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return blank_known(str(value), strong_secrets())
