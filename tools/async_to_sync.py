#!/usr/bin/env python
"""Write pylease's synchronous modules from their asynchronous sources.

The async modules are the single source of the lease layer; each sync twin is
what this script makes of one of them. It reads the source's syntax tree to find
what to change, then edits the source text at those places, so everything else
(comments, blank lines, the order of things) comes through as written; ruff then
sorts the imports, drops the ones the sync side no longer uses, and formats.

What changes, in code:

- ``async def``/``async with``/``async for`` lose ``async``, ``await x`` becomes ``x``;
- names in :data:`NAMES` are renamed (``AsyncLink`` -> ``Link``, ``alease`` -> ``lease``,
  ``ALock`` -> ``Lock``, ``pylease._links_async`` -> ``pylease._links``, ...);
- ``if True:  # ASYNC`` blocks keep only their ``else:`` body (none without one): the
  deliberate differences, marked where they are;
- an ``except ...:  # ASYNC`` clause is dropped with its body;
- a parameter or a keyword argument on a line of its own that ends in ``# ASYNC`` is
  dropped (an option only the async side has, such as ``cancel_on_lost``);
- an ``else:  # sync: as is`` body keeps its names (sync code that uses an async name);
- a comment line ``# sync: <code>`` becomes ``<code>``, names as they are: the sync
  side's import of an async name (``AsyncBackend`` from the async module).

In strings and comments the same names are renamed as whole words, and the phrases
of :data:`PHRASES` are replaced, so docstrings and messages read right on both sides.

Usage::

    python tools/async_to_sync.py           # rewrite every generated file
    python tools/async_to_sync.py --check   # fail if any is stale or was edited by hand
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (source, generated): phase 1 the library, phase 2 the tests whose sync twin is the
# async test without its awaits.
PAIRS = [
    ("pylease/_backend_async.py", "pylease/_backend.py"),
    ("pylease/postgres/_backend_async.py", "pylease/postgres/_backend.py"),
    ("pylease/_links_async.py", "pylease/_links.py"),
    ("pylease/postgres/_sources_async.py", "pylease/postgres/_sources.py"),
    ("pylease/_hub_async.py", "pylease/_hub.py"),
    ("pylease/_waiting_async.py", "pylease/_waiting.py"),
    ("pylease/_attempts_async.py", "pylease/_attempts.py"),
    ("pylease/_keeper_async.py", "pylease/_keeper.py"),
    ("pylease/_tenure_async.py", "pylease/_tenure.py"),
    ("pylease/_telling_async.py", "pylease/_telling.py"),
    ("pylease/leasing_async.py", "pylease/leasing.py"),
    ("pylease/renewing_async.py", "pylease/renewing.py"),
    ("pylease/_standby_async.py", "pylease/_standby.py"),
    ("pylease/leadership_async.py", "pylease/leadership.py"),
    ("pylease/permits_async.py", "pylease/permits.py"),
    ("pylease/inspection_async.py", "pylease/inspection.py"),
    ("pylease/membership_async.py", "pylease/membership.py"),
    ("pylease/partitioning_async.py", "pylease/partitioning.py"),
    ("tests/api/test_keeper_async.py", "tests/api/test_keeper.py"),
    ("tests/api/test_lease_async.py", "tests/api/test_lease.py"),
    ("tests/api/test_waiting_async.py", "tests/api/test_waiting.py"),
    ("tests/api/test_logging_async.py", "tests/api/test_logging.py"),
    ("tests/api/test_exclusive_async.py", "tests/api/test_exclusive.py"),
    ("tests/api/test_waiting_fleet_async.py", "tests/api/test_waiting_fleet.py"),
    ("tests/leader/test_leader_async.py", "tests/leader/test_leader.py"),
    ("tests/api/test_belief_async.py", "tests/api/test_belief.py"),
    ("tests/api/test_permits_async.py", "tests/api/test_permits.py"),
    ("tests/api/test_readers_async.py", "tests/api/test_readers.py"),
    ("tests/api/test_lock_api_async.py", "tests/api/test_lock_api.py"),
    ("tests/api/test_groups_async.py", "tests/api/test_groups.py"),
]

NAMES = {
    # modules
    "_backend_async": "_backend",
    "_links_async": "_links",
    "_sources_async": "_sources",
    "_keeper_async": "_keeper",
    "leasing_async": "leasing",
    "renewing_async": "renewing",
    "_waiting_async": "_waiting",
    "_attempts_async": "_attempts",
    "_hub_async": "_hub",
    "_tenure_async": "_tenure",
    "_telling_async": "_telling",
    # the public API
    "alease": "lease",
    "arun_exclusive": "run_exclusive",
    "akeep_fresh": "keep_fresh",
    "inspection_async": "inspection",
    "alocked": "locked",  # and astatus, with the tests' helpers below
    # permits and several names
    "permits_async": "permits",
    "apermit": "permit",
    "aleases": "leases",
    "AsyncPermit": "Permit",
    "AsyncNames": "Names",
    "AsyncLostCallback": "LostCallback",
    "AsyncTarget": "Target",
    # groups and partitions
    "membership_async": "membership",
    "partitioning_async": "partitioning",
    "agroup": "group",
    "apartitions": "partitions",
    "AsyncGroup": "Group",
    "AsyncPartitions": "Partitions",
    "AsyncBell": "Bell",
    # leader election
    "leadership_async": "leadership",
    "_standby_async": "_standby",
    "aleader": "leader",
    "arun_as_leader": "run_as_leader",
    "acurrent_leader": "current_leader",
    "awatch_leader": "watch_leader",
    "AsyncLeader": "Leader",
    "AsyncStop": "Stop",
    "AsyncWatch": "Watch",
    "AsyncObserver": "Observer",
    # the lease layer's classes
    "AsyncBackend": "Backend",
    "AsyncPostgresBackend": "PostgresBackend",
    "AsyncSqliteBackend": "SqliteBackend",
    "AsyncSource": "Source",
    "AsyncConninfoSource": "ConninfoSource",
    "AsyncPoolSource": "PoolSource",
    "AsyncConnectionSource": "ConnectionSource",
    "AsyncSqliteSource": "SqliteSource",
    "AsyncSchemaSource": "SchemaSource",
    "AsyncRegistry": "Registry",
    "AsyncWatcher": "Watcher",
    "AsyncHub": "Hub",
    "AsyncWaiter": "Waiter",
    "AsyncWait": "Wait",
    "AsyncLink": "Link",
    "AsyncLease": "Lease",
    "AsyncKeepFresh": "KeepFresh",
    "AsyncKeeper": "Keeper",
    "AsyncTicket": "Ticket",
    "AsyncHeld": "Held",
    "AsyncPermitsHeld": "PermitsHeld",
    "AsyncNamesHeld": "NamesHeld",
    "AsyncOp": "Op",
    "AsyncRenewOp": "RenewOp",
    "AsyncReleaseOp": "ReleaseOp",
    # the drivers'
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "is_async_connection": "is_connection",
    "is_async_pool": "is_pool",
    # the protocol of context managers and iterators
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    # pylease._acompat: threads for asyncio
    "ALock": "Lock",
    "ACondition": "Condition",
    "AEvent": "Event",
    "AMutex": "Mutex",
    "AWorker": "Worker",
    "aspawn": "spawn",
    "asleep": "sleep",
    "ato_thread": "to_thread",
    "acondition_wait": "condition_wait",
    "alock_within": "lock_within",
    # the keeper's worker
    "_task": "_thread",
    # names the tests use
    "aconn": "conn",
    "AConn": "Conn",
    "aconn2": "conn2",
    "asleep_until": "wait_until",
    "aenter_once": "enter_once",
    "atogether": "together",
    "await_until": "wait_until",
    "afunction_calls": "function_calls",
    "atrack_functions": "track_functions",
    "asynccontextmanager": "contextmanager",
    "anext": "next",
    "aclose": "close",
    "astart_worker": "start_worker",
    "ajoin_workers": "join_workers",
    "afinished_within": "finished_within",
    "akeep_sampling": "keep_sampling",
    "aleave": "leave",
    "aclaim": "claim",
    "asteal": "steal",
    "astatus": "status",
    "abackends": "backends",
    "aterminate": "terminate",
    "AsyncExitStack": "ExitStack",
    "enter_async_context": "enter_context",
}

# Replaced in strings and comments, before the word renames.
PHRASES = [
    ("an alease()", "a lease()"),
    ("an akeep_fresh()", "a keep_fresh()"),
    ("an async ", "a "),
    ("An async ", "A "),
    ("async ", ""),
    ("Async ", ""),
    ("``async with``", "``with``"),
]

HEADER = (
    "# WARNING: generated by tools/async_to_sync.py from {source}: do not edit.\n"
    "# Change the source and run `python tools/async_to_sync.py`.\n"
)

LINE_LENGTH = 100  # ruff's, in pyproject.toml

_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, NAMES), key=len, reverse=True)) + r")\b")


_SYNC_LINE = re.compile(r"\s*# sync: ")


def _rename_text(text: str) -> str:
    for old, new in PHRASES:
        text = text.replace(old, new)
    return _WORD.sub(lambda m: NAMES[m.group(1)], text)


def _has_marker(line: str) -> bool:
    return re.search(r"#\s*ASYNC\b", line) is not None


class _Plan(ast.NodeVisitor):
    """Which lines the sync side drops, and which it dedents (the kept else bodies)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.drop: set[int] = set()  # 1-based line numbers
        self.dedent: set[int] = set()
        self.as_is: set[int] = set()
        # Text to cut: ((line, column), (line, column)), columns in characters.
        self.cuts: list[tuple[tuple[int, int], tuple[int, int]]] = []

    def _pos(self, line: int, byte_col: int) -> tuple[int, int]:
        # The tree counts columns in UTF-8 bytes, tokenize in characters.
        return line, len(self.lines[line - 1].encode()[:byte_col].decode())

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # `Awaitable[X]` is `X` on the sync side: cut `Awaitable[` and its `]`.
        if isinstance(node.value, ast.Name) and node.value.id == "Awaitable":
            inner = node.slice
            assert node.end_lineno is not None and node.end_col_offset is not None
            assert inner.end_lineno is not None and inner.end_col_offset is not None
            self.cuts.append(
                (self._pos(node.lineno, node.col_offset), self._pos(inner.lineno, inner.col_offset))
            )
            self.cuts.append(
                (
                    self._pos(inner.end_lineno, inner.end_col_offset),
                    self._pos(node.end_lineno, node.end_col_offset),
                )
            )
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        line = self.lines[node.lineno - 1]
        if not _has_marker(line):
            self.generic_visit(node)
            return
        if not (isinstance(node.test, ast.Constant) and node.test.value is True):
            raise SyntaxError(f"line {node.lineno}: an ASYNC block is `if True:  # ASYNC`")
        if (
            node.orelse
            and isinstance(node.orelse[0], ast.If)
            and node.orelse[0].lineno == (self._else_line(node) or 0)
        ):
            raise SyntaxError(f"line {node.lineno}: no elif after `if True:  # ASYNC`")
        end = node.end_lineno or node.lineno
        if not node.orelse:
            self.drop.update(range(node.lineno, end + 1))
            return
        else_line = self._else_line(node)
        if else_line is None:
            raise SyntaxError(f"line {node.lineno}: cannot find the else of this ASYNC block")
        self.drop.update(range(node.lineno, else_line + 1))
        self.dedent.update(range(else_line + 1, end + 1))
        if re.search(r"#\s*sync: as is\b", self.lines[else_line - 1]):
            # Sync code as it stands, with sync names only (a test of the async API
            # from sync code, say): nothing in it is renamed.
            self.as_is.update(range(else_line + 1, end + 1))
        for child in node.orelse:
            self.visit(child)

    def _else_line(self, node: ast.If) -> int | None:
        last = node.body[-1].end_lineno or node.body[-1].lineno
        first = node.orelse[0].lineno if node.orelse else last
        for number in range(last + 1, first + 1):
            if self.lines[number - 1].strip().startswith("else:"):
                return number
        return None

    def visit_arg(self, node: ast.arg) -> None:
        self._drop_marked_line(node.lineno, node.arg)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg is not None:
            self._drop_marked_line(node.lineno, node.arg)
        self.generic_visit(node)

    def _drop_marked_line(self, number: int, name: str) -> None:
        """A parameter or keyword argument alone on an ``# ASYNC`` line: async only."""
        line = self.lines[number - 1]
        if not _has_marker(line):
            return
        if not re.match(rf"\s*{re.escape(name)}\b.*,\s*#", line):
            raise SyntaxError(f"line {number}: an ASYNC argument is alone on its line")
        self.drop.add(number)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if _has_marker(self.lines[node.lineno - 1]):
            self.drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            return
        self.generic_visit(node)


def _convert_tokens(
    source: str,
    drop: set[int],
    cuts: list[tuple[tuple[int, int], tuple[int, int]]],
    as_is: set[int],
) -> str:
    """The source with async keywords gone and names renamed; its lines stay where they are."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    edits = [(offset(start), offset(end), "") for start, end in cuts if start[0] not in drop]
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.start[0] in drop or tok.start[0] in as_is:
            continue
        if tok.type == tokenize.COMMENT and _SYNC_LINE.match(tok.line):
            edits.append((offset(tok.start), offset(tok.end), tok.string.split(":", 1)[1][1:]))
            continue
        if tok.type == tokenize.NAME and tok.string in ("async", "await"):
            # The keyword and the space after it.
            edits.append((offset(tok.start), offset(tokens[i + 1].start), ""))
        elif tok.type == tokenize.NAME and tok.string in NAMES:
            edits.append((offset(tok.start), offset(tok.end), NAMES[tok.string]))
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            new = _rename_text(tok.string)
            if new != tok.string:
                if new.count("\n") != tok.string.count("\n"):
                    raise ValueError(f"line {tok.start[0]}: a rename changed the line count")
                edits.append((offset(tok.start), offset(tok.end), new))
    text = source
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def convert(source: str, source_name: str) -> str:
    """The sync module for the async ``source``, before ruff formats it."""
    tree = ast.parse(source, filename=source_name)
    plan = _Plan(source.splitlines(keepends=True))
    plan.visit(tree)
    # The source's leading comments (which say it is the source) give way to the header.
    for number, line in enumerate(source.splitlines(), start=1):
        if not line.startswith("#"):
            break
        plan.drop.add(number)
    lines = _convert_tokens(source, plan.drop, plan.cuts, plan.as_is).splitlines(keepends=True)
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        if number in plan.drop:
            continue
        if number in plan.dedent and line.startswith("    "):
            line = line[4:]
        out.append(line)
    text = "".join(out)
    header = HEADER.format(source=source_name)
    first, rest = header.split("\n", 1)
    if len(first) > LINE_LENGTH:
        first += "  # noqa: E501"  # a long source name; the header stays one line
    return first + "\n" + rest + text


def ruff(text: str, filename: str) -> str:
    """Apply ruff's safe fixes (sorted imports, unused ones gone, ...), then format."""
    exe = Path(sys.executable).parent / "ruff"
    cmd = str(exe) if exe.exists() else "ruff"
    fixed = subprocess.run(
        [cmd, "check", "--quiet", "--fix-only", "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return subprocess.run(
        [cmd, "format", "--quiet", "--stdin-filename", filename, "-"],
        input=fixed,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def generate(source: str, target: str) -> str:
    text = (ROOT / source).read_text()
    return ruff(convert(text, source), target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; fail if a generated file differs"
    )
    parser.add_argument("files", nargs="*", help="only these sources (default: all)")
    opts = parser.parse_args(argv)
    stale = []
    for source, target in PAIRS:
        if opts.files and source not in opts.files:
            continue
        wanted = generate(source, target)
        path = ROOT / target
        current = path.read_text() if path.exists() else ""
        if current == wanted:
            continue
        if opts.check:
            stale.append(target)
            diff = difflib.unified_diff(
                wanted.splitlines(keepends=True),
                current.splitlines(keepends=True),
                f"{target} (as generated from {source})",
                f"{target} (on disk)",
            )
            sys.stderr.writelines(list(diff)[:60])
        else:
            path.write_text(wanted)
            print(f"wrote {target} from {source}")
    if stale:
        print(
            "stale or hand-edited generated files: "
            + ", ".join(stale)
            + "\nchange the async source instead and run: python tools/async_to_sync.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
