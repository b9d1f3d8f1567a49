"""Every fenced code block of README.md and docs/*.md, run against a real database.

One test per page, on a fresh database of its own; its blocks run in order and share
state (a Python namespace, a psql session, a working directory). The conventions are
in docs/writing-docs.md; in short:

- ```python: executed; a following ```text block marked ``<!-- docs-test: output -->``
  is what it must print.
- ```console: ``$ command`` lines run in bash, the lines after each are its output
  (stdout and stderr), ``...`` matching anything.
- ```sql: a psql transcript: statements start in column 0 and end with ``;``, psql's
  output follows as psql prints it; a block of statements alone must run without error.
- ```bash / ```sh: a script, run (it must exit 0), or saved by ``<!-- docs-test: file NAME -->``.
- ```yaml / ```json / ```toml / ```ini: parsed; ```text: shown only.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

RUN = {"python", "console", "sql", "psql", "bash", "sh"}
PARSED = {"yaml", "yml", "json", "toml", "ini"}
SHOWN = {"text"}
BLOCK_TIMEOUT = 180.0

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
# On a line of its own: a directive quoted in prose (`<!-- docs-test: ... -->`) is not one.
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    tag: str
    text: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


@dataclass
class Page:
    path: Path
    blocks: list[Block]
    directives: dict[str, str]


def _directive(body: str) -> tuple[str, str]:
    key, _, value = body.partition(" ")
    return key.rstrip(":"), value.strip()


PAGE_DIRECTIVES = {"empty-database", "roles"}
BLOCK_DIRECTIVES = {"skip", "output", "file", "timeout"}


def parse(path: Path) -> Page:
    """The page's fenced blocks, each with the directives written just before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    page_directives: dict[str, str] = {}
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        found = DIRECTIVE.match(lines[i])
        if found:
            key, value = _directive(found["body"])
            if key in PAGE_DIRECTIVES:
                page_directives[key] = value
            elif key in BLOCK_DIRECTIVES:
                pending[key] = value
            else:
                raise AssertionError(f"{path.name}:{i + 1}: unknown docs-test directive {key!r}")
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        tag = opening["info"].strip().split(" ")[0].lstrip(".{").rstrip("}")
        body: list[str] = []
        start = i + 1
        i += 1
        while i < len(lines):
            closing = lines[i].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        else:
            raise AssertionError(f"{path.name}:{start}: unclosed code fence")
        blocks.append(Block(path, start, tag, "\n".join(body) + "\n", pending))
        pending = {}
        i += 1
    return Page(path, blocks, page_directives)


# -- comparing output -----------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """Lines without trailing whitespace; blank lines do not count."""
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def matches(expected: str, actual: str) -> bool:
    """``...`` alone on a line matches any lines (or none); inside a line, any text."""
    pattern = []
    for line in _lines(expected):
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            parts = (re.escape(part) for part in line.split("..."))
            pattern.append("[^\n]*?".join(parts) + r"\n")
    text = "".join(line + "\n" for line in _lines(actual))
    return re.fullmatch("".join(pattern), text) is not None


def assert_output(block: Block, what: str, expected: str, actual: str) -> None:
    if not matches(expected, actual):
        raise AssertionError(
            f"{block.where}: {what}\n--- expected\n{expected.rstrip()}\n"
            f"--- got\n{actual.rstrip()}\n---"
        )


# -- the page's world: a database, a working directory, an environment -------------------


def url_of(conninfo: str) -> str:
    p = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(p.get("user") or "postgres"), safe="")
    host = str(p.get("host") or "127.0.0.1")
    port = str(p.get("port") or 5432)
    db = quote(str(p["dbname"]), safe="")
    if host.startswith("/"):
        return f"postgresql:///{db}?host={quote(host, safe='')}&port={port}&user={user}"
    return f"postgresql://{user}@{host}:{port}/{db}"


class World:
    """What a page's blocks share: database, directory, environment, sessions."""

    def __init__(self, dsn: str, home: Path) -> None:
        self.dsn = url_of(dsn)
        self.home = home
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        # The repository, seen from the page's directory: `make demo`, `sql/...` work.
        for entry in ("Makefile", "pyproject.toml", "sql", "migrations", "pylease", ".venv",
                      "benchmarks", "scripts", "tests", "README.md", "docs"):  # fmt: skip
            if (ROOT / entry).exists():
                (home / entry).symlink_to(ROOT / entry)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYLEASE_", "PG", "XDG_"))
            # Under `make test`, make's own variables would make a page's `make demo`
            # print "Entering directory" lines that a reader's run does not.
            and k not in ("DATABASE_URL", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
        }
        env.update(
            PYLEASE_DSN=self.dsn,
            PGHOST=str(params.get("host") or "127.0.0.1"),
            PGPORT=str(params.get("port") or 5432),
            PGUSER=str(params.get("user") or "postgres"),
            PGDATABASE=str(params["dbname"]),
            HOME=str(home),
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
            COLUMNS="100",
            TERM="dumb",
            NO_COLOR="1",
            LC_ALL="C.UTF-8",
            PYTHONUNBUFFERED="1",
        )
        self.env = env
        self.namespace: dict[str, object] = {"__name__": "__main__"}
        self.last_stdout = ""
        self._psql: Psql | None = None

    @property
    def psql(self) -> Psql:
        if self._psql is None:
            self._psql = Psql(self.env, self.home)
        return self._psql

    def close(self) -> None:
        if self._psql is not None:
            self._psql.close()


class Psql:
    """One psql session per page, fed block by block; `\\echo` marks each block's end."""

    MARK = "<<<docs-test-end-of-block>>>"

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        command = ["psql", "-X", "-a", "-v", "VERBOSITY=terse", "-v", "ON_ERROR_STOP=0"]
        self.proc = subprocess.Popen(
            ["stdbuf", "-o0", *command],  # psql's stdout to a pipe is buffered otherwise
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, script: str, timeout: float) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(script + f"\\echo {self.MARK}\n")
        self.proc.stdin.flush()
        out: list[str] = []
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError("psql exited:\n" + "".join(out))
            if line.rstrip("\n") == self.MARK:
                return "".join(out[:-1])  # the last line is the echoed \echo
            out.append(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- running each kind of block ------------------------------------------------------------

PSQL_OUTPUT = re.compile(
    r"^(?:\s|$)"  # aligned results start with a space
    r"|^[-+]+$"  # a header rule
    r"|^\(\d+ rows?\)$"
    r"|^[A-Z]+(?: [A-Z]+)*(?: \d+)*$"  # a command tag: INSERT 0 1, CREATE TABLE, SET
    r"|^(?:ERROR|WARNING|NOTICE|INFO|DETAIL|HINT|CONTEXT|LOG):"
    r"|^Asynchronous notification "
    r"|^\.\.\.$"
)
STATEMENT_END = re.compile(r";\s*(?:--.*)?$")


def sql_input(text: str) -> str:
    """The statements of a psql transcript, without its output."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if inside:
            out.append(line)
            inside = not STATEMENT_END.search(line)
        elif line.startswith("\\"):
            out.append(line)
        elif not PSQL_OUTPUT.match(line):
            out.append(line)
            inside = not STATEMENT_END.search(line)
    return "".join(line + "\n" for line in out)


def run_sql(block: Block, world: World, timeout: float) -> None:
    script = sql_input(block.text)
    assert script.strip(), f"{block.where}: a sql block without a statement"
    got = world.psql.run(script, timeout)
    if _lines(script) == _lines(block.text):
        # Statements without a transcript: they must run, whatever they print.
        errors = [line for line in got.splitlines() if line.startswith("ERROR:")]
        assert not errors, f"{block.where}: " + "; ".join(errors)
        return
    assert_output(block, "psql printed something else", block.text, got)


@dataclass
class Command:
    line: int
    text: str
    expected: list[str]


HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("$ ") or line == "$"):
            if not commands:
                raise AssertionError(f"{block.where}: a console block starts with '$ command'")
            commands[-1].expected.append(line)
            i += 1
            continue
        text = [line[2:]]
        start = i
        i += 1
        while text[-1].endswith("\\") and i < len(lines):
            text.append(lines[i].removeprefix("> "))
            i += 1
        for here in HEREDOC.finditer("\n".join(text)):
            while i < len(lines):
                text.append(lines[i].removeprefix("> "))
                i += 1
                if text[-1].strip() == here[2]:
                    break
        commands.append(Command(block.line + 1 + start, "\n".join(text), []))
    return commands


def run_console(block: Block, world: World, timeout: float) -> None:
    commands = console_commands(block)
    mark = f"<<<docs-test-{uuid.uuid4().hex}>>>"
    script = ["exec 2>&1 </dev/null"]
    for command in commands:
        script += [command.text, f"__rc=$?; printf '\\n%s\\n' {shlex.quote(mark)}; (exit $__rc)"]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        stdout=subprocess.PIPE,
        text=True,
        env=world.env,
        cwd=world.home,
        timeout=timeout,
    )
    outputs = done.stdout.split(mark)
    for n, command in enumerate(commands):
        got = outputs[n] if n < len(outputs) else "<the shell ended before this command>"
        at = Block(block.page, command.line, "console", "")
        assert_output(at, f"$ {command.text}", "\n".join(command.expected), got)


def run_shell(block: Block, world: World, timeout: float) -> None:
    done = subprocess.run(
        ["bash", "-c", block.text],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=world.env,
        cwd=world.home,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout}"


@contextlib.contextmanager
def page_process_state(world: World) -> Iterator[None]:
    """Python blocks see the environment and directory the console blocks see."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(world.env)
    os.chdir(world.home)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)


def run_python(block: Block, world: World, timeout: float) -> None:
    # Leading newlines make a traceback's line numbers the page's own.
    code = compile("\n" * block.line + block.text, str(block.page), "exec")
    out = io.StringIO()
    with page_process_state(world), contextlib.redirect_stdout(out):
        exec(code, world.namespace)
    world.last_stdout = out.getvalue()


def check_parsed(block: Block) -> None:
    try:
        if block.tag in ("yaml", "yml"):
            list(yaml.safe_load_all(block.text))
        elif block.tag == "json":
            json.loads(block.text)
        elif block.tag == "toml":
            tomllib.loads(block.text)
        elif block.tag == "ini":
            parser = configparser.ConfigParser(strict=False, interpolation=None)
            parser.optionxform = str  # type: ignore[assignment,method-assign]
            parser.read_string(block.text)
    except Exception as exc:
        raise AssertionError(f"{block.where}: not valid {block.tag}: {exc}") from exc


RUNNERS: dict[str, Callable[[Block, World, float], None]] = {
    "python": run_python,
    "console": run_console,
    "sql": run_sql,
    "psql": run_sql,
    "bash": run_shell,
    "sh": run_shell,
}


def run_page(page: Page, world: World) -> None:
    for block in page.blocks:
        if block.tag not in RUN | PARSED | SHOWN:
            raise AssertionError(
                f"{block.where}: code block tagged {block.tag!r}; use one of "
                f"{sorted(RUN | PARSED | SHOWN)} (see docs/writing-docs.md)"
            )
        if "skip" in block.directives:
            assert block.directives["skip"], f"{block.where}: 'skip' needs a reason"
            continue
        if "file" in block.directives:
            target = world.home / block.directives["file"]
            target.write_text(block.text, encoding="utf-8")
            if block.tag in ("bash", "sh"):
                target.chmod(0o755)
                syntax = subprocess.run(["bash", "-n", str(target)], capture_output=True)
                assert syntax.returncode == 0, f"{block.where}: {syntax.stderr.decode()}"
            if block.tag in PARSED:
                check_parsed(block)
            continue
        if "output" in block.directives:
            assert_output(block, "the Python block above printed", block.text, world.last_stdout)
            continue
        if block.tag in PARSED:
            check_parsed(block)
        elif block.tag in RUNNERS:
            timeout = float(block.directives.get("timeout") or BLOCK_TIMEOUT)
            RUNNERS[block.tag](block, world, timeout)


# -- the tests --------------------------------------------------------------------------------


def _drop_roles(admin: str, roles: list[str]) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        for role in roles:
            conn.execute(
                psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(role))
            )


# A liveness bound: a page runs dozens of commands, each a Python start, which a
# loaded machine may make take seconds.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_runs(
    path: Path,
    pg_admin_dsn: str,
    pg_template: str,
    fresh_db: Callable[..., str],
    tmp_path: Path,
) -> None:
    page = parse(path)
    roles = page.directives.get("roles", "").split()
    with contextlib.ExitStack() as stack:
        if roles:
            # Roles belong to the whole server: one page that creates them at a time.
            lock = stack.enter_context(psycopg.connect(pg_admin_dsn, autocommit=True))
            lock.execute("SELECT pg_advisory_lock(hashtext('pylease docs-test roles'))")
            _drop_roles(pg_admin_dsn, roles)
            stack.callback(_drop_roles, pg_admin_dsn, roles)
        dsn = fresh_db() if "empty-database" in page.directives else fresh_db(pg_template)
        # The database goes before its roles (the callbacks run last in, first out).
        stack.callback(_drop_database, pg_admin_dsn, dsn)
        world = World(dsn, tmp_path)
        stack.callback(world.close)
        run_page(page, world)


def _drop_database(admin: str, dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(str(name))
            )
        )


# -- the runner's own rules, checked on small pages -----------------------------------------


def test_wildcards() -> None:
    assert matches("a ... c\n", "a bbb c\n")
    assert matches("x\n...\nz\n", "x\n1\n2\nz\n")
    assert matches("x\n...\nz\n", "x\nz\n")
    assert not matches("a\n", "b\n")
    assert not matches("x\n...\nz\n", "x\ny\n")


def test_sql_input_keeps_statements_only() -> None:
    transcript = (
        "SELECT 1 AS x;\n x \n---\n 1\n(1 row)\n\nCREATE TABLE t (\n  a int\n);\n"
        "CREATE TABLE\nINSERT INTO t VALUES (1);\nINSERT 0 1\nSELECT 1/0;\n"
        "ERROR:  division by zero\n"
    )
    assert sql_input(transcript) == (
        "SELECT 1 AS x;\nCREATE TABLE t (\n  a int\n);\nINSERT INTO t VALUES (1);\nSELECT 1/0;\n"
    )


def test_a_wrong_example_fails(
    tmp_path: Path, pg_template: str, fresh_db: Callable[..., str]
) -> None:
    page_file = tmp_path / "wrong.md"
    page_file.write_text("```console\n$ echo hello\ngoodbye\n```\n")
    (tmp_path / "home").mkdir()
    world = World(fresh_db(pg_template), tmp_path / "home")
    with pytest.raises(AssertionError, match="goodbye"):
        run_page(parse(page_file), world)


def test_python_output_is_checked(
    tmp_path: Path, pg_template: str, fresh_db: Callable[..., str]
) -> None:
    page_file = tmp_path / "python.md"
    page_file.write_text(
        "```python\nimport os\nprint(os.environ['PYLEASE_DSN'][:13])\nx = 1\n```\n\n"
        "<!-- docs-test: output -->\n```text\npostgresql://\n```\n\n"
        "```python\nprint(x + 1)\n```\n\n<!-- docs-test: output -->\n```text\n3\n```\n"
    )
    (tmp_path / "home").mkdir()
    world = World(fresh_db(pg_template), tmp_path / "home")
    with pytest.raises(AssertionError, match=r"python.md:17: the Python block above printed"):
        run_page(parse(page_file), world)


def _world(tmp_path: Path) -> World:
    """A world for blocks that need no database (console and shell only)."""
    home = tmp_path / "home"
    home.mkdir()
    return World("host=127.0.0.1 port=5432 user=postgres dbname=pylease_no_db", home)


def test_console_blocks_share_a_shell_and_see_the_last_status(tmp_path: Path) -> None:
    page_file = tmp_path / "console.md"
    page_file.write_text(
        "```console\n$ x=41; false\n$ echo $? $((x + 1)) $PYLEASE_DSN\n"
        "1 42 postgresql://postgres@127.0.0.1:5432/pylease_no_db\n"
        "$ cat <<'EOF'\n> two\n> lines\n> EOF\ntwo\nlines\n$ echo a \\\n  b\na b\n```\n"
    )
    run_page(parse(page_file), _world(tmp_path))


def test_untagged_and_unknown_blocks_fail(tmp_path: Path) -> None:
    for fence in ("```\necho hi\n```\n", "```cron\n* * * * * x\n```\n"):
        page_file = tmp_path / "bad.md"
        page_file.write_text(fence)
        with pytest.raises(AssertionError, match="code block tagged"):
            (tmp_path / str(len(fence))).mkdir()
            run_page(parse(page_file), _world(tmp_path / str(len(fence))))


def test_saved_files_are_syntax_checked_and_yaml_is_parsed(tmp_path: Path) -> None:
    page_file = tmp_path / "files.md"
    page_file.write_text("<!-- docs-test: file x.sh -->\n```bash\nif then fi\n```\n")
    with pytest.raises(AssertionError, match="syntax error"):
        run_page(parse(page_file), _world(tmp_path))
    page_file.write_text("```yaml\na: [1, 2\n```\n")
    (tmp_path / "2").mkdir()
    with pytest.raises(AssertionError, match="not valid yaml"):
        run_page(parse(page_file), _world(tmp_path / "2"))


def test_sql_statements_without_a_transcript_must_not_fail(
    tmp_path: Path, pg_template: str, fresh_db: Callable[..., str]
) -> None:
    page_file = tmp_path / "sql.md"
    page_file.write_text("```sql\nCREATE TABLE t (a int);\nINSERT INTO t VALUES (1);\n```\n")
    (tmp_path / "ok").mkdir()
    world = World(fresh_db(pg_template), tmp_path / "ok")
    run_page(parse(page_file), world)
    page_file.write_text("```sql\nINSERT INTO nowhere VALUES (1);\n```\n")
    with pytest.raises(AssertionError, match='relation "nowhere" does not exist'):
        run_page(parse(page_file), world)
    world.close()
