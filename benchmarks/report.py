"""The results: JSON for machines, a markdown table for the README, a PNG plot."""

from __future__ import annotations

import json
import os
from typing import Any

from benchmarks._core import Section, Target


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def targets_table(targets: list[Target]) -> list[str]:
    rows = [
        [t.key.split("-")[0], t.title, t.value_text(), t.goal_text(), t.verdict, t.detail or t.note]
        for t in targets
    ]
    return _md_table(["#", "target", "measured", "goal", "result", "detail"], rows)


def _loads(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def machine_line(machine: dict[str, Any]) -> str:
    parts = [
        f"{machine.get('date', '?')}",
        f"{machine.get('cores', '?')} cores ({machine.get('cpu', '?')})",
        f"PostgreSQL {machine.get('postgresql', '?')}",
        f"Python {machine.get('python', '?')}",
    ]
    if machine.get("redis"):
        parts.append(f"Redis {machine['redis']}")
    settings = machine.get("postgresql_settings") or {}
    if settings:
        parts.append(
            f"synchronous_commit={settings.get('synchronous_commit')}, "
            f"fsync={settings.get('fsync')}, wal_sync_method={settings.get('wal_sync_method')}"
        )
    if machine.get("git_commit"):
        parts.append(f"commit {machine['git_commit']}")
    others = machine.get("other_sessions_at_start")
    if others:
        parts.append(
            f"other databases' sessions on the server at start: {others['connected']} "
            f"({others['active']} active)"
        )
    return "; ".join(parts)


def markdown(results: dict[str, Any], sections: list[Section], plot: str | None) -> str:
    machine = results["machine"]
    lines = [
        "# pylease benchmarks: latest results",
        "",
        f"Measured {machine_line(machine)}. The run took {results['seconds']:.0f} s"
        + (" (smoke mode: tiny samples, numbers meaningless)" if results.get("smoke") else "")
        + ".",
        f"Load average at start: {_loads(machine['load_average_at_start'])}; "
        f"at end: {_loads(results['load_average_at_end'])}.",
        "Reproduce with `make bench`. Every ratio is taken between contenders measured in the same "
        "run, interleaved round by round; [min..max] is the spread over the rounds.",
        "",
        "## Targets",
        "",
        *targets_table([t for s in sections for t in s.targets]),
        "",
    ]
    for s in sections:
        lines += [f"## {s.title}", ""]
        if s.rows:
            lines += _md_table(s.header, s.rows)
            lines.append("")
        for extra in s.extra:
            lines += [f"{extra['title']}:", "", *_md_table(extra["header"], extra["rows"]), ""]
        for note in s.notes:
            lines += [note, ""]
    if plot:
        lines += ["## Throughput", "", f"![cycles per second against workers]({plot})", ""]
    return "\n".join(lines)


def _write(path: str, data: str | bytes) -> None:
    tmp = path + ".tmp"
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
        f.write(data)
    os.replace(tmp, path)


def write_json(path: str, results: dict[str, Any]) -> None:
    _write(path, json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def write_markdown(path: str, text: str) -> None:
    _write(path, text)


def plot(path: str, sections: list[Section], machine: dict[str, Any]) -> str | None:
    """cycles/s against workers (1 name, 64 names), beside the peers' single-client rates."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    by_key = {s.key: s for s in sections}
    contention = by_key.get("contention")
    peers = by_key.get("peers")
    if (contention is None or not contention.data) and (peers is None or not peers.data):
        return "no contention or peer results to plot"
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.1, 1]}
    )
    if contention is not None and contention.data:
        d = contention.data
        for n, marker in zip(d["names"], "os^D", strict=False):
            xs, ys, lo, hi = [], [], [], []
            for w in d["workers"]:
                st = d["cycles_per_second"][f"{w}x{n}"]
                xs.append(w)
                ys.append(st["median"])
                lo.append(st["median"] - st["min"])
                hi.append(st["max"] - st["median"])
            left.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                marker=marker,
                capsize=3,
                label=f"pylease, {n} name{'s' if n > 1 else ''}",
            )
        left.set_xscale("log", base=2)
        left.set_xticks(d["workers"], [str(w) for w in d["workers"]])
        left.set_xlabel("worker processes")
        left.set_ylabel("cycles per second (claim, 2 fenced writes, release)")
        left.set_ylim(bottom=0)
        left.set_title("Contention (median, min..max over rounds)")
        left.grid(True, alpha=0.3)
        left.legend()
    else:
        left.set_axis_off()
    if peers is not None and peers.data:
        d = peers.data["cycles_per_second"]
        labels = list(d)
        values = [d[k]["median"] for k in labels]
        errs = [
            [d[k]["median"] - d[k]["min"] for k in labels],
            [d[k]["max"] - d[k]["median"] for k in labels],
        ]
        colours = ["tab:blue" if k.startswith("pylease") else "tab:gray" for k in labels]
        bars = right.barh(labels, values, xerr=errs, color=colours, capsize=3)
        right.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=4, fontsize=8)
        groups = peers.data.get("groups", {})
        local = [i for i, k in enumerate(labels) if groups.get(k) == "local"]
        if local and local[0] > 0:
            # Server-arbitrated locks above the line, one-host locks below it.
            right.axhline(local[0] - 0.5, color="black", linestyle="--", linewidth=0.8)
        right.invert_yaxis()
        right.set_xlim(0, max(d[k]["max"] for k in labels) * 1.2)
        right.set_xlabel("cycles per second, one client")
        right.set_title("Peers, one client, uncontended\n(below the line: one host only)")
        right.grid(True, axis="x", alpha=0.3)
    else:
        right.set_axis_off()
    fig.suptitle(
        f"pylease benchmarks, {machine.get('date', '')[:10]}: {machine.get('cores')} cores, "
        f"PostgreSQL {machine.get('postgresql')}, Python {machine.get('python')}"
    )
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return None
