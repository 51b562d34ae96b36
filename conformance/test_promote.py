"""``python -m conformance.promote`` and the corpus it writes (``conformance.corpus``): what is kept
is the interpreter's answer, never the failing target's; entries stay small and distinct; a
changed oracle is noticed; a replayed entry catches a wrong target."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ref_interp
from conformance import corpus, promote, report, targets
from conformance.strategies import Case
from conformance.test_regressions import replay

pytestmark = [
    pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning"),
    pytest.mark.filterwarnings(
        "ignore:Using `assume` outside:hypothesis.errors.HypothesisDeprecationWarning"
    ),
]

SOURCE = "function (A[N], B[N]) -> (O) {\n  O = A * B + 1;\n}\n"
INPUTS = {"A": np.array([1, -2, 3], np.float32), "B": np.array([4, 5, -6], np.float32)}


@pytest.fixture
def failure(tmp_path, monkeypatch):
    """A failure folder as the suite writes it, whose target answered wrongly (got = want + 7)."""
    monkeypatch.setattr(report, "FAILURES", tmp_path / "failures")
    monkeypatch.setattr(report, "STATS", report.Stats())
    want = ref_interp.run(SOURCE, INPUTS)
    got = {"O": want["O"] + 7}
    tol = report.Tolerance(True, 0.0, 1, 2.0**-23)
    report.write_failure(Case("elementwise", SOURCE, INPUTS), "broken.0", want, got, "O: 3 of 3 differ", tol)
    (folder,) = (tmp_path / "failures").iterdir()
    return folder


def test_a_failure_is_kept_with_the_interpreters_answer(failure, tmp_path):
    where = tmp_path / "corpus"
    np.savez(failure / "expected.npz", O=np.zeros(3, np.float32))  # a stale expected is not trusted either
    assert promote.main([str(failure), "--corpus", str(where), "--note", "the bug"]) == 0
    (entry,) = corpus.entries(where)
    assert entry.name.startswith("elementwise-")
    assert sorted(p.name for p in entry.failure.folder.iterdir()) == [
        "case.json", "case.tile", "expected.npz", "inputs.npz"
    ]  # no got.npz: the failing target's outputs are not kept
    np.testing.assert_array_equal(entry.failure.want["O"], ref_interp.run(SOURCE, INPUTS)["O"])
    assert corpus.program_text(entry.source) == SOURCE
    assert entry.meta["target"] == "broken.0" and entry.meta["note"] == "the bug"
    assert corpus.oracle_change(entry) is None
    case = entry.case()
    assert (case.family, case.exact, case.length) == ("regressions", True, 1)


def test_the_same_example_is_kept_once_and_names_are_not_reused(failure, tmp_path, capsys):
    where = tmp_path / "corpus"
    assert promote.main([str(failure), "--corpus", str(where), "--name", "first"]) == 0
    assert promote.main([str(failure), "--corpus", str(where)]) == 0
    assert "holds this program and inputs as 'first'" in capsys.readouterr().out
    assert len(corpus.entries(where)) == 1
    with pytest.raises(corpus.PromoteError, match="already has an entry 'first'"):
        corpus.write("first", "function (A) -> (O) { O = A; }", {"A": np.ones(2)}, family="f", target="t",
                     problem="p", tolerance=report.Tolerance(), origin="o", corpus=where)  # fmt: skip


def test_a_large_entry_is_refused_saying_how_large(failure, tmp_path, capsys):
    where = tmp_path / "corpus"
    big = {"A": np.arange(40000, dtype=np.float64), "B": np.arange(40000, dtype=np.float64)}
    np.savez(failure / "inputs.npz", **big)
    assert promote.main([str(failure), "--corpus", str(where)]) == 2
    err = capsys.readouterr().err
    assert "KiB, over the 64 KiB limit" in err and "--max-kib" in err
    assert corpus.entries(where) == [] and not any(where.iterdir())  # nothing half-written is left
    assert promote.main([str(failure), "--corpus", str(where), "--max-kib", "2000"]) == 0


def test_unusable_sources_are_refused_clearly(tmp_path, capsys):
    assert promote.main([str(tmp_path / "nope"), "--corpus", str(tmp_path)]) == 2
    assert "not a conformance failure folder" in capsys.readouterr().err
    assert promote.main(["--mutant", "no_such_defect", "--corpus", str(tmp_path)]) == 2
    assert "no seeded defect 'no_such_defect'" in capsys.readouterr().err
    (tmp_path / "bad.tile").write_text("function (A) -> (O) { O = B; }")
    np.savez(tmp_path / "in.npz", A=np.ones(2))
    args = ["--program", str(tmp_path / "bad.tile"), "--inputs", str(tmp_path / "in.npz"), "--name", "x"]
    assert promote.main([*args, "--corpus", str(tmp_path / "c")]) == 2
    assert "does not bind to its inputs" in capsys.readouterr().err
    with pytest.raises(corpus.PromoteError, match="not a usable entry name"):
        corpus._check_name("../up")


def test_a_refusal_is_kept_as_the_interpreters_error(tmp_path):
    src = "function (A[N]) -> (E) {\n  E[i: 3] = +(A[i + 5]);\n}\n"
    folder = corpus.write("refused", src, {"A": np.arange(3, dtype=np.float32)}, family="f", target="t",
                          problem="p", tolerance=report.Tolerance(), origin="o", corpus=tmp_path)  # fmt: skip
    meta = json.loads((folder / "case.json").read_text())
    assert meta["refusal"].startswith("TileIndexError: no index tuple of 'E' is valid")
    assert corpus.entries(tmp_path)[0].failure.want == {}


def test_a_changed_oracle_is_noticed_and_refreshed_on_request(failure, tmp_path):
    where = tmp_path / "corpus"
    assert promote.main([str(failure), "--corpus", str(where), "--name", "e"]) == 0
    once = np.array([5, -9, -16], np.float32)  # what the interpreter said once (now -17)
    np.savez_compressed(where / "e" / "expected.npz", O=once)
    (entry,) = corpus.entries(where)
    assert "O: 1 of 3 elements differ" in corpus.oracle_change(entry)
    assert promote.main(["--refresh", "e", "--corpus", str(where)]) == 0
    assert corpus.oracle_change(corpus.entries(where)[0]) is None


def _subject(device_id: str) -> targets.Subject:
    from backends import registry

    try:
        return targets.Subject(device_id, registry.get(device_id))
    except Exception as e:  # noqa: BLE001 - any reason the device is not here
        pytest.skip(f"{device_id} is not available here: {e}")


def test_a_replayed_entry_catches_a_wrong_target_and_passes_a_right_one(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "FAILURES", tmp_path / "failures")
    monkeypatch.setattr(report, "STATS", report.Stats())
    inputs = {"X": np.array([1.0, 2.0]), "Y": np.array([3.0, -4.0])}
    corpus.write("sum", "function (X, Y) -> (O) { O = X + Y; }", inputs, family="f", target="t",
                 problem="p", tolerance=report.Tolerance(), origin="o", corpus=tmp_path)  # fmt: skip
    (entry,) = corpus.entries(tmp_path)
    replay(entry, _subject("llvm_cpu.0"))
    with pytest.raises(AssertionError, match="O: 2 of 2 elements differ"):
        replay(entry, _subject("mutant:llvm_fadd_as_fsub"))
    assert [p.name.split("-")[0] for p in (tmp_path / "failures").iterdir()] == ["regressions"]


def test_the_checked_in_corpus_is_small_distinct_and_target_free():
    entries = corpus.entries()
    assert len(entries) >= 30
    assert len({e.digest() for e in entries}) == len(entries)
    for e in entries:
        files = {p.name: p.stat().st_size for p in e.failure.folder.iterdir()}
        assert set(files) == {"case.json", "case.tile", "expected.npz", "inputs.npz"}, e.name
        assert sum(files.values()) <= corpus.LIMIT_BYTES, e.name
        assert e.meta["digest"] == e.digest(), e.name
