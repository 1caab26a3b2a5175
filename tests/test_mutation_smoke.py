"""A smoke of the mutation campaign (issue #7) for CI: ``bench/mutation.py
--smoke`` runs mutmut, with the project's configuration, on the mutants of
the evictor's ordering key in a scratch copy of the project, judged by the
oracle's conformance test and the evictor's unit tests.  It proves the
plumbing (mutants in impl/ through the ``prefixcache/impl`` link, the tests
importing the mutated code, the equivalents list matching) and that the
oracle kills them; the whole campaign takes too long for CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "mutation.py"


@pytest.mark.skipif(not __debug__, reason="run once, not again under python -O")
def test_the_smoke_mutants_are_killed_or_listed_as_equivalent() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--max-children", "1"],
                         capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    score = re.search(r"^mutation score: (\d+)/(\d+) killed$", run.stdout, re.M)
    assert score is not None, output[-4000:]
    killed, total = int(score.group(1)), int(score.group(2))
    assert 0 < killed <= total
    assert "survivors not listed: 0" in run.stdout


def test_a_whole_campaign_rewrites_its_section_of_the_equivalents_file(tmp_path: Path) -> None:
    from collections import Counter

    from prefixcache.bench.mutation import FIGURES_HEADING, figures_text, write_figures

    path = tmp_path / "MUTATION.md"
    path.write_text("# Title\n\nprose\n\n## Equivalent mutants\n\n### `a.b`\n", encoding="utf-8")
    for killed in (3, 4):
        text = figures_text([f"mutation score: {killed}/5 killed"],
                            Counter({"killed": killed, "skipped": 5 - killed}),
                            [("prefixcache/impl/evictor.py", killed, 5)], 5 - killed, 5 - killed,
                            [], ["x.y"], 0, False)
        write_figures(text, path)
        document = path.read_text(encoding="utf-8")
        assert document.count(FIGURES_HEADING) == 1
        assert f"- mutation score: {killed}/5 killed" in document
        assert f"| evictor.py | {killed}/5 |" in document and "`x.y`" in document
        assert document.startswith("# Title\n\nprose\n\n" + FIGURES_HEADING)
        assert document.endswith("## Equivalent mutants\n\n### `a.b`\n")
