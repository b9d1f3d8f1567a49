"""What ``model/check.sh`` runs is what the model seeds and docs/model.md tells.

Every mutant macro of the model (``MUT_...``) is seeded by a ``verify fail`` line of the
check, and no such line names a macro the model lacks (a mutant that seeds nothing
passes as "caught" only if the unchanged model fails). Every property (``ltl``) is named
in docs/model.md, and its "Running it" line counts the CI set as check.sh runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model"
CHECK = (MODEL / "check.sh").read_text(encoding="utf-8")
DOC = (ROOT / "docs" / "model.md").read_text(encoding="utf-8")


def model_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(MODEL.glob("*.pml")))


def verify_lines(kind: str, text: str = CHECK) -> list[str]:
    return [line for line in text.splitlines() if re.match(rf"\s*verify {kind} ", line)]


def ci_set() -> str:
    """check.sh without its deep set (the branch of ``if [ "$set_name" = deep ]``)."""
    start = CHECK.index('if [ "$set_name" = deep ]')
    middle = CHECK.index("\nelse\n", start)
    return CHECK[:start] + CHECK[middle:]


def test_every_mutant_macro_is_seeded_by_a_failing_check() -> None:
    text = model_text()
    seeded = set(re.findall(r"#\s*(?:ifdef|ifndef)\s+(MUT_\w+)", text))
    seeded |= set(re.findall(r"defined\((MUT_\w+)\)", text))
    checked = set(re.findall(r"-D(MUT_\w+)", "\n".join(verify_lines("fail"))))
    assert seeded, "no mutant found in the model"
    assert seeded == checked, (sorted(seeded - checked), sorted(checked - seeded))


def test_every_property_is_told_in_docs() -> None:
    properties = set(re.findall(r"^ltl (\w+)", model_text(), re.MULTILINE))
    assert {"belief", "partitions", "members", "owned_again"} <= properties
    untold = sorted(p for p in properties if f"`{p}`" not in DOC)
    assert not untold, untold


def test_the_docs_count_the_ci_set_as_check_sh_runs_it() -> None:
    ci = ci_set()
    counted = re.search(
        r"the CI set: the table, (\d+) configurations, (\d+) mutants, (\d+) states to reach", DOC
    )
    assert counted is not None
    configurations, mutants, reach = (int(n) for n in counted.groups())
    assert len(verify_lines("pass", ci)) == configurations
    assert len(verify_lines("fail", ci)) == mutants
    assert len(verify_lines("reach", ci)) == reach
