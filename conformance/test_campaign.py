"""``python -m conformance.campaign``: the plan, merged counts and fingerprints that do not depend on
how many workers (or which cluster) ran the chunks, failures grouped by signature, Ray."""

from __future__ import annotations

import json
import sys

import pytest

from backends import registry
from conformance import campaign
from conformance.campaign_worker import kind_of, operations, statement_of
from tile.errors import TileInputError

FAMILIES = ["contractions", "elementwise"]


def _device_or_skip(device_id: str) -> str:
    try:
        registry.get(device_id)
    except Exception as e:  # noqa: BLE001 - any reason the device is not here
        pytest.skip(f"{device_id} is not available here: {e}")
    return device_id


def _rows(data: dict) -> list[tuple]:
    return [(r["family"], r["target"], r["examples"], r["invalid"], r["unsupported"], r["fingerprint"])
            for r in data["rows"]]  # fmt: skip


def test_the_plan_shares_examples_and_fixes_each_chunks_seed():
    chunks = campaign.plan(103, FAMILIES, ["a", "b"], chunk=10, seed=5)
    assert sum(c.examples for c in chunks) == 103
    assert max(c.examples for c in chunks) == 10
    per = {}
    for c in chunks:
        per[c.family, c.target] = per.get((c.family, c.target), 0) + c.examples
    assert sorted(per.values()) == [25, 26, 26, 26]
    assert [c.family for c in chunks[:4]] == FAMILIES * 2  # interleaved: every worker gets a mix
    assert campaign.plan(103, FAMILIES, ["a", "b"], chunk=10, seed=5) == chunks
    assert len({c.seed for c in chunks}) == len(chunks)
    reseeded = campaign.plan(103, FAMILIES, ["a", "b"], 10, seed=6)
    assert {c.seed for c in reseeded}.isdisjoint(c.seed for c in chunks)


def test_two_workers_merge_to_what_one_process_finds(tmp_path):
    """The campaign's shards (its chunks) are fixed by the plan: run by two worker processes, the
    merged counts and fingerprints are those of the same campaign run unsharded in this process."""
    target = _device_or_skip("llvm_cpu.0")
    one = campaign.run(16, 1, tmp_path / "one", [target], FAMILIES, chunk=4, seed=11)
    two = campaign.run(16, 2, tmp_path / "two", [target], FAMILIES, chunk=4, seed=11)
    assert one["fingerprint"] == two["fingerprint"] != "0" * 16
    assert _rows(one) == _rows(two)
    assert sum(r["examples"] for r in one["rows"]) >= 12  # (a few drawn programs are invalid)
    assert two["workers"] == 2 and two["chunks"] == 4
    t = two["throughput"]
    assert t["examples_per_second_per_core"] == pytest.approx(t["examples_per_second"] / 2)
    other = campaign.run(16, 1, tmp_path / "three", [target], FAMILIES, chunk=4, seed=12)
    assert other["fingerprint"] != one["fingerprint"]  # another seed draws other examples


def test_failures_are_grouped_by_signature_and_written(tmp_path):
    _device_or_skip("llvm_cpu.0")
    target = "mutant:llvm_fadd_as_fsub"  # float + computes a - b
    data = campaign.run(12, 1, tmp_path, [target], ["elementwise"], chunk=12, seed=1)  # one chunk, one shrink
    assert data["signatures"], "the seeded defect was not found"
    found = sum(s["count"] for s in data["signatures"])
    # a chunk stops at its first failure
    assert found == sum(r["failed"] for r in data["rows"]) == 1
    for s in data["signatures"]:
        assert s["family"] == "elementwise" and s["kind"] == "wrong answer"
        assert s["culprit"] == "code generator"  # every pass agrees: the LLVM text is wrong
        assert s["operations"]  # the differing output's statement (round(x) adds in LLVM, too)
        for e in s["examples"]:
            assert (tmp_path / "failures").exists() and e["folder"].startswith(str(tmp_path / "failures"))
            assert {"case.tile", "inputs.npz", "expected.npz", "case.json"} <= {
                p.name for p in (tmp_path / "failures" / e["folder"].rsplit("/", 1)[1]).iterdir()
            }
            assert e["reproduce"].startswith("python -m conformance.reproduce ")
    assert json.loads((tmp_path / "campaign.json").read_text())["fingerprint"] == data["fingerprint"]
    report_text = (tmp_path / "campaign.txt").read_text()
    assert "failure signature(s)" in report_text and "examples/s/core" in report_text


def test_signature_parts():
    src = "function (X[N]) -> (O_sum, O_eq) { O_sum[i: 5] = +(X[i]); O_eq = X == X ? X : -X; }"
    assert operations(statement_of(src, "O_sum: 4 of 5 elements differ")) == "agg+"
    assert operations(statement_of(src, "O_eq: 1 of 5 elements differ")).split() == ["-", "==", "?"]
    assert operations(statement_of(src, "llvm_cpu.0 raised KeyError: 'x'")).split()[0] == "agg+"
    assert kind_of("llvm_cpu.0 raised DuplicatedNameError: llvm.fabs.f64", {}) == "raised DuplicatedNameError"
    assert kind_of("the interpreter refuses it with X\nbut d answered", {"refusal": "X"}) == (
        "answered a refused program"
    )


def test_usage_errors(capsys):
    with pytest.raises(SystemExit):
        campaign.main(["--examples", "0"])
    with pytest.raises(SystemExit):
        campaign.main(["--examples", "5", "--target", "no_such_device.0"])
    assert "no_such_device.0" in capsys.readouterr().err


class FakeRay:
    """Ray's calls the campaign makes, run in this process: a task runs when its result is got."""

    def __init__(self):
        self.address, self.submitted, self.most_running, self.running = None, 0, 0, 0

    def is_initialized(self):
        return self.address is not None

    def init(self, address=None, **_):
        self.address = address

    def cluster_resources(self):
        return {"CPU": 2.0}

    def remote(self, **_):
        def task(fn):
            def submit(*args):
                self.submitted += 1
                self.running += 1
                self.most_running = max(self.most_running, self.running)
                return fn, args

            return type("Remote", (), {"remote": staticmethod(submit)})

        return task

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        self.running -= 1
        fn, args = ref
        return fn(*args)


def test_the_ray_path_schedules_and_merges_like_local_workers(tmp_path, monkeypatch):
    """``--ray``'s scheduling without a cluster (the real one: ``--long``): each chunk one task,
    at most two per CPU running, the same rows and fingerprint as local workers."""
    target = _device_or_skip("llvm_cpu.0")
    one = campaign.run(10, 1, tmp_path / "one", [target], FAMILIES, chunk=2, seed=2)
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    on_ray = campaign.run(10, 1, tmp_path / "ray", [target], FAMILIES, chunk=2, seed=2, ray_address="auto")
    assert fake.address == "auto" and fake.submitted == 6 and fake.most_running == 4  # 2 CPUs x 2
    assert on_ray["where"] == "Ray cluster auto" and on_ray["workers"] == 2 and on_ray["chunks"] == 6
    assert _rows(on_ray) == _rows(one) and on_ray["fingerprint"] == one["fingerprint"]


@pytest.mark.long("a local Ray cluster takes 30-80 s to start and run on 2 shared cores")
def test_a_ray_cluster_runs_the_same_campaign(tmp_path):
    """A local Ray cluster (two CPUs) runs each chunk as a task and merges the same rows and counts
    and the same fingerprint as one process (a Ray worker imports other modules than a local process:
    the same examples are drawn because ``conformance.reproducible`` keeps Hypothesis's constants of
    local modules out of the draws). Skipped without ray (``pip install 'tile[campaign]'``)."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'tile[campaign]'")
    target = _device_or_skip("llvm_cpu.0")
    one = campaign.run(8, 1, tmp_path / "one", [target], FAMILIES, chunk=4, seed=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        on_ray = campaign.run(8, 1, tmp_path / "ray", [target], FAMILIES, chunk=4, seed=2, ray_address="auto")
    finally:
        ray.shutdown()
    assert on_ray["where"] == "Ray cluster auto" and on_ray["workers"] == 2
    assert on_ray["chunks"] == one["chunks"] == 2
    assert _rows(on_ray) == _rows(one)
    assert on_ray["fingerprint"] == one["fingerprint"]


def test_pieces_of_the_plan_merge_to_the_whole_run(tmp_path):
    """A campaign run in pieces (``--first-chunk``/``--chunks``, or until ``--seconds``) and merged
    has the counts and fingerprint of the same plan run at once; pieces of another plan, or that
    overlap, are refused."""
    target = _device_or_skip("llvm_cpu.0")
    whole = campaign.run(12, 1, tmp_path / "whole", [target], FAMILIES, chunk=3, seed=4)
    assert whole["plan"]["ranges"] == [[0, 4]] and "the whole plan" in campaign.text(whole)
    # seconds=0: only the first chunk starts; the report names where the next piece starts
    a = campaign.run(12, 1, tmp_path / "a", [target], FAMILIES, chunk=3, seed=4, seconds=0)
    assert a["plan"]["ranges"] == [[0, 1]] and "next: --first-chunk 1" in campaign.text(a)
    b = campaign.run(12, 2, tmp_path / "b", [target], FAMILIES, chunk=3, seed=4, first_chunk=1, chunks=2)
    assert b["plan"]["ranges"] == [[1, 3]]
    campaign.run(12, 1, tmp_path / "c", [target], FAMILIES, chunk=3, seed=4, first_chunk=3)
    pieces = [tmp_path / "c", tmp_path / "a", tmp_path / "b" / "campaign.json"]  # any order, file or folder
    merged = campaign.merge(pieces, tmp_path / "m")
    assert merged["fingerprint"] == whole["fingerprint"] != a["fingerprint"]
    assert _rows(merged) == _rows(whole) and merged["chunks"] == 4
    assert merged["plan"]["ranges"] == [[0, 1], [1, 3], [3, 4]] and "the whole plan" in campaign.text(merged)
    assert json.loads((tmp_path / "m" / "campaign.json").read_text())["fingerprint"] == whole["fingerprint"]
    partial = campaign.merge([tmp_path / "a", tmp_path / "c"], tmp_path / "p")
    assert "next: --first-chunk 1" in campaign.text(partial)
    with pytest.raises(TileInputError, match="overlap"):
        campaign.merge([tmp_path / "whole", tmp_path / "b"], tmp_path / "x")
    campaign.run(12, 1, tmp_path / "other", [target], FAMILIES, chunk=3, seed=5, chunks=1)
    with pytest.raises(TileInputError, match="another campaign.*seed"):
        campaign.merge([tmp_path / "a", tmp_path / "other"], tmp_path / "x")


def test_merge_on_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        campaign.main(["--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path / "m")])
    assert "cannot read campaign report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        campaign.main(["--workers", "1"])
    assert "--examples is required" in capsys.readouterr().err


def test_chunks_seek_distinguishing_examples_only_when_asked():
    """Each chunk counts coverage in a fresh ``Stats``, so a search for K distinguishing examples
    per operation would start anew in every chunk (a sixth of a worker's time): off by default."""
    from conformance.campaign_worker import run_chunk

    target = _device_or_skip("llvm_cpu.0")
    plain, asked = (campaign.plan(4, ["contractions"], [target], 4, 3, k)[0] for k in (0, 2))
    assert plain.distinguish == 0 and asked.distinguish == 2 and plain.seed == asked.seed
    cov = [json.loads(run_chunk(c)["stats"])["coverage"] for c in (plain, asked)]
    assert cov[0]["mutants"] == 0 and not cov[0]["distinguishing"] and cov[0]["examples"]
    assert cov[1]["mutants"] > 0 and sum(n for *_, n in cov[1]["distinguishing"]) > 0
