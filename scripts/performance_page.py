"""Write docs/performance.md from benchmarks/results/latest.json.

The page's tables and every number in its prose come from one results file, so the
prose can never quote another run than the tables beside it. `make bench` runs this
after each run; tests/docs/test_performance_page.py fails when the page and the file differ.

    python scripts/performance_page.py            # rewrite docs/performance.md
    python scripts/performance_page.py --check    # exit 1 if it is not up to date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "latest.json"
PAGE = ROOT / "docs" / "performance.md"


def us(seconds: float) -> str:
    """A duration as the benchmark tables print it: 485 µs, 11.26 ms."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    out = ["| " + " | ".join(cell(h) for h in header) + " |"]
    out.append("|" + "|".join("---" for _ in header) + "|")
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def machine_line(results: dict[str, Any]) -> str:
    m = results["machine"]
    s = m.get("postgresql_settings") or {}
    when = m["date"].replace("T", " ")[:16] + " UTC"
    line = (
        f"{when}: {m['cores']} cores ({m['cpu']}, virtual), {m['memory_gib']} GiB, "
        f"PostgreSQL {m['postgresql'].split(' ')[0]} "
        f"(`synchronous_commit={s.get('synchronous_commit')}`, "
        f"`fsync={s.get('fsync')}`, `wal_sync_method={s.get('wal_sync_method')}`) on "
        f"{m['server']}, Python {m['python']}, psycopg {m['packages'].get('psycopg')}"
    )
    if m.get("redis"):
        line += f", Redis {m['redis']}"
    return line + f"; commit {m.get('git_commit', '?')}; {results['seconds']:.0f} s"


def why(results: dict[str, Any]) -> list[str]:
    """What each target is measured against, and why: the run's own numbers only."""
    t = {x["key"].split("-")[0]: x for x in results["targets"]}
    s = {k: v["data"] for k, v in results["sections"].items()}

    def med(section: str, name: str) -> float:
        return float(s[section]["per_op_seconds"][name]["median"])

    cyc = s["cycle"]
    flush, needed = cyc["wal_flush_seconds"], cyc["flush_needed_for_goal_seconds"]
    update = med("cycle", "floor: 2 UPDATE commits") / 2
    update_nowal = med("cycle", "2 UPDATE commits, no WAL flush") / 2
    best = 2 * update / (update + update_nowal)
    claim_extra = cyc["claim_seconds"] - update
    release_extra = cyc["release_seconds"] - update_nowal

    select1 = med("busy", "SELECT 1")
    busy = med("busy", "busy lease_claim")
    noop = med("busy", "no-op SECURITY DEFINER PL/pgSQL call")

    ticks = {k: float(v["median"]) for k, v in s["heartbeat"]["tick_seconds"].items()}
    per_lease = (ticks["1000"] - ticks["1"]) / 999

    lat = s["handover"]["latency_seconds"]
    lease_p50, listen_p50 = lat["lease"]["p50"], lat["listen"]["p50"]

    con = s["contention"]
    witness = con["witness"]
    busy16 = con["busy_claims_per_second"][f"{max(con['workers'])}x1"]["median"]
    best64 = max(con["workers"], key=lambda w: con["cycles_per_second"][f"{w}x64"]["median"])
    best64_rate = con["cycles_per_second"][f"{best64}x64"]["median"]

    agree = (
        "as many as the workers reported"
        if witness["tenures_witnessed"] == witness["tenures_reported"]
        else "where the workers reported"
    )

    peers = {k: float(v["median"]) for k, v in s["peers"]["cycles_per_second"].items()}
    hand_written = peers["hand-written UPDATE-then-INSERT lease"] / peers["pylease: SQL cycle"]
    sqlite_vs_flock = peers["pylease: SQLite backend"] / peers["filelock"]

    def head(n: str, what: str) -> str:
        x = t[n]
        value = f"{x['value']:.2f} {x['unit']}" if x["unit"] == "ms" else ratio(x["value"])
        if x["unit"] == "count":
            value = f"{x['value']:.0f}"
        return f"**{n}. {what} (goal {x['goal_text']}): {x['verdict']}, {value}.**"

    return [
        head("1", "Cycle: claim + release against two single-row UPDATE commits")
        + " The floor is the cheapest durable way to write a row twice: two single-row "
        "`UPDATE`s on a plain table, each its own transaction, so each pays a round trip and "
        "a WAL flush (`fdatasync`). A pylease cycle is also two statements, but only the "
        "claim waits for the flush: a `lease_release` that is the first write of its "
        "transaction (as in autocommit) commits with `synchronous_commit = off`, since a "
        "release lost in a crash only keeps the lease until its expiry. The cycle thus saves "
        "one flush and pays two PL/pgSQL calls where the floor pays two plain `UPDATE`s. In "
        f"this run a flush cost {us(flush)}, and the lease functions cost {us(claim_extra)} "
        f"(claim) and {us(release_extra)} (release) more than a plain one-row `UPDATE` "
        "(argument checks, `SECURITY DEFINER` with a pinned `search_path`, fence and expiry "
        "logic, the `NOTIFY`). Even two statements with no function cost at all would reach "
        f"only {ratio(best)} here. With these statement costs the cycle reaches "
        f"{t['1']['goal_text'].split()[-1]} wherever a flush costs at least {us(needed)}, as "
        "on disks that honour `fdatasync` without a volatile cache; every run prints that "
        "threshold, so the verdict can be read against the disk.",
        head("2", "Busy claim against `SELECT 1`")
        + " `SELECT 1` is one round trip with nothing to execute. A busy claim is one round "
        "trip too and writes nothing (no row lock, no WAL, no transaction id, hence no "
        "flush): it reads the row and returns NULL. What it adds is PL/pgSQL: a call of a "
        "`SECURITY DEFINER` function with its `search_path` pinned, one test of its "
        "arguments, one index lookup. The third contender shows the floor of any call under "
        "the contract's rules: a PL/pgSQL function that does nothing, `SECURITY DEFINER` "
        f"with its `search_path` pinned; it alone cost {ratio(noop / select1)} `SELECT 1` in "
        f"this run ({us(noop - select1)} of the {us(busy - select1)} a busy claim adds to the "
        f"round trip of `SELECT 1`, {us(select1)}). The ratio depends on what a round trip "
        "costs, and on a virtual machine that depends on load: the same work weighs more "
        "against a round trip made short by busy CPUs than against one lengthened by waking "
        "idle ones.",
        head("3", "Python `with lease(...)`, heartbeat on, against the raw SQL cycle")
        + " The floor is the same two statements sent by hand on one psycopg connection. "
        "`lease()` sends the same two statements on the caller's connection, so everything "
        "above the floor is Python: the holder token, argument checks, the backend wrapper "
        "and its error mapping, registering the lease with the heartbeat keeper "
        f"({us(med('python', 'with lease(): heartbeat on'))} against "
        f"{us(med('python', 'raw SQL cycle'))} a cycle in this run).",
        head("4", "Heartbeat: one `lease_renew_many` against one `lease_renew` per lease")
        + " Renewing N leases one by one costs N round trips and N flushed commits; "
        "`lease_renew_many` costs one round trip and one flush whatever N, plus about "
        f"{us(per_lease)} a lease for the row update and the arrays it receives and returns. "
        f"A tick therefore stays cheap up to thousands of leases: {us(ticks['100'])} for "
        f"100, {us(ticks['1000'])} for 1,000, {us(ticks['10000'])} for 10,000.",
        head("5", "Handover")
        + " The floor is the raw SQL waiter in the same run: `LISTEN pylease`, and on the "
        "notification one claim. Its delay is the release's commit, the notification's "
        f"delivery and the claim with its flush: {us(listen_p50)} at the median. "
        "`lease(..., wait=...)` waits the same way and adds the Python work between its "
        f"claim and the body: {us(lease_p50)} at the median, p99 {us(lat['lease']['p99'])}. "
        "The pollers show what `LISTEN/NOTIFY` buys: polling every 100 ms (redis-py Lock's "
        "default) waits half a period at the median and a whole period at worst. "
        "python-redis-lock wakes through `BLPOP` as pylease wakes through `NOTIFY`, and is "
        "faster because Redis writes nothing to disk before it grants.",
        head("6", "Contention: overlapping tenures")
        + " Each worker process's tenure writes to a witness row through `lease_holds()` "
        f"when it enters and when it leaves; the witness counted {witness['tenures_witnessed']:,} "
        f"tenures, {agree} ({witness['tenures_reported']:,}), and "
        f"{witness['violations']} that found another still inside or an older fence after a "
        "newer one. Throughput is reported, not judged. On one name every worker queues for "
        "the same row: each release wakes every waiter (all wait on the one `pylease` "
        "channel), their claims race, one wins, and the others' busy claims "
        f"({busy16:,.0f}/s with {max(con['workers'])} workers) crowd out the holder, so "
        "cycles per second fall as workers are added. On 64 names workers rarely meet, and "
        f"throughput peaks at {best64_rate:,.0f} cycles/s with {best64} workers, each cycle "
        "four statements.",
        "**7. Peers (no target).** Each peer takes and gives back one lock the way its users "
        "write it: one client, no contention. The last column says what a granted lock "
        "stands on, since speed is bought with some of it. The hand-written lease of two "
        f"statements ran at {ratio(hand_written)} "
        "pylease's cycle (it pays both flushes but no function calls, see 1) and has no "
        "fence; pals' advisory lock lives in one session (lost with the connection or a "
        "failover, no expiry) and pays SQLAlchemy's pool and transactions; the Redis locks "
        "keep their state in memory. On one host, pylease's SQLite backend gives fences and "
        f"expiry at {ratio(sqlite_vs_flock)} the rate of filelock's `flock`.",
    ]


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Performance",
        "",
        "<!-- Generated by scripts/performance_page.py from benchmarks/results/latest.json:",
        "     edit the script, not this page; `make bench` regenerates both. -->",
        "",
        "`make bench` measures pylease against a floor and against its peers, side by side, on "
        "the same machine in the same run. Absolute times on a shared machine are noise; "
        "ratios between contenders measured seconds apart are not. So every comparison below "
        "is interleaved (A B C, then C B A, round after round, after one unrecorded warm-up "
        "round), reports the median over the rounds with its spread as [min..max], and takes "
        "each ratio round by round before the median. Each target is printed as PASS or MISS, "
        "so that a regression shows; no timing is asserted by `make test`.",
        "",
        f"This run: {machine_line(results)}. Every number on this page, prose included, "
        "comes from this one run.",
        "",
        "## Reproduce",
        "",
        "```text",
        "make bench      # drops, creates and migrates pylease_bench, then runs benchmarks/",
        "make bench BENCH_DSN=postgresql://user@host:5432/pylease_bench_mine  # another server",
        ".venv/bin/python -m benchmarks --only cycle,busy        # some sections, same database",
        ".venv/bin/python -m benchmarks --only python --profile  # where the time goes",
        ".venv/bin/python -m benchmarks --smoke --out /tmp/bench # seconds: checks it all runs",
        "```",
        "",
        "It needs PostgreSQL (by default on 127.0.0.1:5432 as `postgres`). Redis on "
        "127.0.0.1:6379 (`--redis URL`) is optional: without it the Redis peers are skipped "
        "with a note. The optional dependencies are the `bench` extra "
        "(`pip install -e '.[bench]'`, which `make bench` runs). Results go to "
        "`benchmarks/results/`: `latest.json` (every round's value, the machine, the scale), "
        "`latest.md` and `throughput.png`; then this page is regenerated from them.",
        "",
        "## Targets",
        "",
        *table(
            ["#", "target", "measured", "goal", "result", "detail"],
            [
                [
                    x["key"].split("-")[0],
                    x["title"],
                    _value(x),
                    x["goal_text"],
                    x["verdict"],
                    x["detail"] or x["note"],
                ]
                for x in results["targets"]
            ],
        ),
        "",
    ]
    for section in results["sections"].values():
        lines += [f"## {section['title']}", ""]
        if section["table"]["rows"]:
            lines += [*table(section["table"]["header"], section["table"]["rows"]), ""]
        for extra in section["extra_tables"]:
            lines += [f"{extra['title']}:", "", *table(extra["header"], extra["rows"]), ""]
        for note in section["notes"]:
            lines += [note, ""]
    lines += [
        "![pylease cycles per second against worker processes, on 1 name and on 64 names, "
        "beside the peers' single-client rates](assets/throughput.png)",
        "",
        "## What each target is measured against, and why",
        "",
    ]
    for paragraph in why(results):
        lines += [paragraph, ""]
    return "\n".join(lines)


def _value(target: dict[str, Any]) -> str:
    if target["value"] is None:
        return "n/a"
    if target["unit"] == "us":  # stored in seconds
        return f"{target['value'] * 1e6:.0f} µs"
    if target["unit"] == "ms":
        return f"{target['value']:.2f} ms"
    if target["unit"] == "count":
        return f"{target['value']:.0f}"
    return f"{target['value']:.2f}x"


def main(argv: list[str]) -> int:
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    text = render(results)
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is not {RESULTS.relative_to(ROOT)}'s: run "
                  "python scripts/performance_page.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
