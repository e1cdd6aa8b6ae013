"""Text for a person's terminal: what agents wrote can neither drive it nor forge a line.

Workflow ids, step ids, tool names, results and errors are written by agents and tools.
Printed verbatim, an OSC sequence (``ESC ] ... BEL``) retitles the operator's terminal or,
in some terminals, writes the clipboard (OSC 52); a CSI sequence moves the cursor or erases
what was printed; a newline forges a whole log line.  Every human-readable output goes
through :func:`safe`, which shows each control character as a visible escape (``\\x1b``,
``\\n``, ``\\u202e``); JSON output needs nothing (``json.dumps`` escapes them already).

Commands printed for a person to copy (``stepledger approve WORKFLOW STEP --by NAME``)
quote each id with :func:`shell_arg`, so a hostile id is one argument, never shell text.
"""

from __future__ import annotations

import re
import shlex

# C0 controls (newline, tab and ESC included), DEL, the C1 controls (U+0080-U+009F: a lone
# U+009B is a CSI on terminals that take 8-bit controls), the line and paragraph separators,
# and the bidirectional overrides and isolates that reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe(value: object) -> str:
    """``str(value)`` with every control character shown as a visible escape."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_escape, text)


def has_control(value: str) -> bool:
    """Whether the text holds a character :func:`safe` would escape."""
    return _CONTROL.search(value) is not None


def shell_arg(value: str) -> str:
    """One shell argument that stands for exactly ``value``, printable as it is.

    Plain text is quoted with :func:`shlex.quote`.  Text holding control characters is
    written in ANSI-C quoting (``$'...'``, bash and zsh), which spells each one as an
    escape, so the argument is exact and the terminal sees no control character.
    """
    if not has_control(value):
        return shlex.quote(value)
    body = value.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _CONTROL.sub(_ansi_c, body) + "'"


def _ansi_c(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    # \xHH is a byte in ANSI-C quoting; a character above U+007F is written \uHHHH.
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"
