"""SPEC.md stays true to spec/: its generated sections match what spec/ renders now."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from prefixcache.spec import error_table, invariants, render, transitions
from prefixcache.spec.transitions import Life, Transition

SPEC_MD = Path(__file__).resolve().parent.parent / "SPEC.md"
HOW = "run `python -m prefixcache.spec.render` and commit SPEC.md"


def spec_md() -> str:
    return SPEC_MD.read_text(encoding="utf-8")


def test_generated_sections_match_spec() -> None:
    stale = render.stale_sections(spec_md())
    assert stale == [], f"SPEC.md is out of date in {stale}: {HOW}"


def test_every_generated_section_is_present_once() -> None:
    text = spec_md()
    for name, _ in render.SECTIONS:
        assert text.count(render.BEGIN.format(name=name)) == 1, name
    assert text.count(render.END) == len(render.SECTIONS)


def test_rendering_changes_only_the_generated_sections() -> None:
    text = spec_md()
    assert render.render_spec(text) == text, f"SPEC.md is out of date: {HOW}"
    emptied = render._SECTION.sub(lambda m: render._wrap(m.group("name"), ""), text)
    assert emptied != text
    assert render.render_spec(emptied) == text  # the prose is kept, the sections filled
    with pytest.raises(ValueError):
        render.render_spec(text.replace(render.BEGIN.format(name="options"), ""))


def test_a_changed_invariant_meaning_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    first = invariants.INVARIANTS[0]
    changed = dataclasses.replace(first, meaning=first.meaning + " (changed)")
    monkeypatch.setattr(invariants, "INVARIANTS", (changed,) + invariants.INVARIANTS[1:])
    assert render.stale_sections(spec_md()) == ["invariants"]


def test_a_changed_invariant_docstring_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    check = invariants.INVARIANTS[1].check

    def partition(s: object) -> bool:
        """Every physical id is exactly one of free, in use, evictable or lost."""
        return check(s)  # type: ignore[arg-type]

    rebuilt = invariants._inv(partition)  # how the registry reads a docstring
    monkeypatch.setattr(invariants, "INVARIANTS",
                        invariants.INVARIANTS[:1] + (rebuilt,) + invariants.INVARIANTS[2:])
    assert render.stale_sections(spec_md()) == ["invariants"]


def test_a_new_transition_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = Transition(Life.IMMUTABLE, Life.FREE, "free", "a bug")
    monkeypatch.setattr(transitions, "TRANSITIONS", transitions.TRANSITIONS + (extra,))
    assert render.stale_sections(spec_md()) == ["id-life-cycle"]


def test_a_new_error_row_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    row = error_table.ErrorCase("free", "a new mistake", ValueError)
    monkeypatch.setattr(error_table, "ERROR_TABLE", error_table.ERROR_TABLE + (row,))
    assert render.stale_sections(spec_md()) == ["errors"]


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["--check"]) == 0
    copy = tmp_path / "SPEC.md"
    assert render.main(["--output", str(copy)]) == 2  # no prose to fill in
    copy.write_text(render._SECTION.sub(lambda m: render._wrap(m.group("name"), ""), spec_md()))
    assert render.main(["--check", "--output", str(copy)]) == 1
    assert render.main(["--output", str(copy)]) == 0
    assert copy.read_text() == spec_md()
    assert render.main(["--check", "--output", str(copy)]) == 0
    copy.write_text(copy.read_text().replace("| `partition` |", "| `partitioned` |"))
    assert render.main(["--check", "--output", str(copy)]) == 1
    assert "invariants" in capsys.readouterr().err
    assert render.main(["--check", "--output", str(tmp_path / "missing.md")]) == 1


def test_the_document_covers_the_spec() -> None:
    text = spec_md()
    for inv in invariants.INVARIANTS + (invariants.OWNERSHIP,):
        assert f"`{inv.name}`" in text
    for op in render.operations():
        assert f"### `{op}`" in text, op
    for op in error_table.operations():
        assert f"| `{op}` |" in text, op
    assert text.count("```mermaid") == 2
    for state in ("Free", "Mutable", "Immutable", "Evictable", "Evicted", "SwappedOut", "Freed"):
        assert f"    {state} : " in text, state
    assert "`prefixcache.spec.error_table`" in text          # Sphinx roles became Markdown
    assert ":class:" not in text and "``" not in text.replace("```", "")


def test_transitions_through_eviction_are_allowed_only_by_the_same_operation() -> None:
    assert transitions.allowed(Life.EVICTABLE, Life.MUTABLE, "allocate_mutable_block")
    assert transitions.allowed(Life.EVICTABLE, Life.FREE, "reset_prefix_cache")
    assert not transitions.allowed(Life.EVICTABLE, Life.FREE, "free")
    assert not transitions.allowed(Life.EVICTABLE, Life.MUTABLE, "reset_prefix_cache")
    assert transitions.allowed(Life.EVICTABLE, Life.IMMUTABLE)
    assert Life.EVICTED in transitions.TRANSIENT
