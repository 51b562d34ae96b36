"""README.md, docs/tutorial.md, docs/frameworks.md and docs/onnx.md as doctests: every ``sh`` and
``python`` block runs as written, in order, in an empty folder of its own (one per document).

The folder holds nothing but links to the checkout's ``examples/`` and ``conformance/`` (what a
block may name, as a reader runs them from the checkout's root); every other file a block uses an
earlier block makes. Shell blocks run in ``bash -e`` with ``python`` being this interpreter; Python
blocks share one namespace per document, and a block of ``>>>`` lines is a doctest whose printed
output must match. A block is marked by an HTML comment on the line before it:

* ``<!-- doctest: skip (reason) -->``: not run, reported as skipped with the reason;
* ``<!-- doctest: needs PREFIX (reason) -->``: run only where a device id starts with PREFIX
  (``opencl_gpu``), else skipped with the reason;
* ``<!-- doctest: imports M1,M2 (reason) -->``: run only where those modules are installed
  (``torch``, ``jax``: optional extras), else skipped with the reason.

Each block is a test of its own (``test_block[README.md:57 sh]``); after a failing block the rest
of its document are skipped, since they may depend on it.
"""

from __future__ import annotations

import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/tutorial.md", "docs/frameworks.md", "docs/onnx.md")
SHIPPED = ("examples", "conformance")  # the checkout's folders a block may name
FENCE = re.compile(
    r"^(?:<!-- doctest: (?P<mark>[^\n]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.M | re.S
)
MARK = re.compile(
    r"^(?P<kind>skip|needs (?P<prefix>[\w.]+)|imports (?P<modules>[\w.,]+)) \((?P<reason>.+)\)$"
)


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    lang: str
    body: str
    mark: str | None

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line} {self.lang}"


def blocks(document: str) -> list[Block]:
    """The runnable blocks of ``document`` (``sh`` and ``python``), in order."""
    text = (REPO / document).read_text()
    found = []
    for m in FENCE.finditer(text):
        if m["lang"] in ("sh", "python"):
            line = text.count("\n", 0, m.start("lang")) + 1
            found.append(Block(document, line, m["lang"], m["body"], m["mark"]))
    return found


ALL = [b for d in DOCUMENTS for b in blocks(d)]


def python_shim(bin_dir: Path) -> Path:
    """``bin_dir`` holding a ``python`` that is this interpreter, in its environment. A script that
    execs ``sys.executable``, not a link to it: a link to a virtual environment's interpreter placed
    outside the environment finds no ``pyvenv.cfg`` beside it and runs the base interpreter, without
    the environment's packages ("No module named tile")."""
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "python"
    shim.unlink(missing_ok=True)
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    shim.chmod(0o755)
    return bin_dir


class Session:
    """A document's folder, Python namespace and state (a block failed: the rest are skipped)."""

    def __init__(self, root: Path):
        self.root = root
        self.namespace: dict = {"__name__": "__main__"}
        self.failed: str | None = None
        self.ran = 0  # the blocks of the document run so far in this process
        bin_dir = python_shim(root.parent / "bin")
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.env.pop("TILE_DEBUG", None)
        for name in SHIPPED:
            (root / name).symlink_to(REPO / name)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> dict[str, Session]:
    return {d: Session(tmp_path_factory.mktemp(Path(d).stem)) for d in DOCUMENTS}


def skip_reason(block: Block) -> str | None:
    if block.mark is None:
        return None
    m = MARK.match(block.mark)
    assert m, (f"{block.id}: a doctest mark is 'skip (reason)', 'needs PREFIX (reason)' or "
               f"'imports MODULES (reason)', not {block.mark!r}")
    if m["kind"] == "skip":
        return m["reason"]
    if m["modules"]:
        import importlib.util

        missing = [n for n in m["modules"].split(",") if importlib.util.find_spec(n) is None]
        return f"needs {', '.join(missing)}: {m['reason']}" if missing else None
    from backends import registry

    if any(i.startswith(m["prefix"]) for i in registry.ids()):
        return None
    return f"needs {m['prefix']}: {m['reason']}"


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_block(block: Block, sessions: dict[str, Session]):
    session = sessions[block.document]
    order = [b for b in ALL if b.document == block.document]
    # the blocks before this one first, where this process has not run them (pytest-xdist may
    # give a document's blocks to several workers): a block runs in the folder they made
    for earlier in order[session.ran : order.index(block)]:
        if not session.failed and not skip_reason(earlier):
            run_block(earlier, session)
    session.ran = order.index(block) + 1
    if session.failed:
        pytest.skip(f"an earlier block of {block.document} failed ({session.failed})")
    reason = skip_reason(block)
    if reason:
        pytest.skip(reason)
    run_block(block, session)


def run_block(block: Block, session: Session) -> None:
    try:
        if block.lang == "sh":
            run_shell(block, session)
        elif block.body.lstrip().startswith(">>>"):
            run_doctest(block, session)
        else:
            run_python(block, session)
    except BaseException:
        session.failed = block.id
        raise


def run_shell(block: Block, session: Session) -> None:
    r = subprocess.run(["bash", "-e", "-c", block.body], cwd=session.root, env=session.env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (
        f"{block.id} failed (exit status {r.returncode}):\n{block.body}\n--- stdout\n{r.stdout[-3000:]}"
        f"\n--- stderr\n{r.stderr[-3000:]}"
    )


def run_python(block: Block, session: Session) -> None:
    code = compile(block.body, f"{block.document}:{block.line}", "exec")
    here = os.getcwd()
    os.chdir(session.root)
    try:
        with redirect_stdout(io.StringIO()):
            exec(code, session.namespace)  # noqa: S102 - the document's own example code
    finally:
        os.chdir(here)


def run_doctest(block: Block, session: Session) -> None:
    test = doctest.DocTestParser().get_doctest(block.body, session.namespace, block.id, block.document,
                                               block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(session.root)
    try:
        runner.run(test, out=out.write, clear_globs=False)
    finally:
        os.chdir(here)
    session.namespace.update(test.globs)  # (a DocTest runs in a copy of the namespace it is given)
    assert runner.failures == 0, f"{block.id}:\n{out.getvalue()}"


def test_the_documents_have_blocks_and_every_skip_gives_its_reason():
    assert len(blocks("README.md")) >= 10 and len(blocks("docs/tutorial.md")) >= 10
    for b in ALL:
        if b.mark is not None:
            assert MARK.match(b.mark), b.id
    skipped = [b for b in blocks("README.md") if b.mark and b.mark.startswith("skip")]
    assert len(skipped) <= 2  # setup + test run, a package install: everything else runs


def test_the_blocks_python_is_this_interpreter_with_its_packages(tmp_path):
    """In a virtual environment too: the blocks' ``python`` sees this environment (its prefix), not
    the base interpreter the environment was made from."""
    env = {**os.environ, "PATH": f"{python_shim(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(["bash", "-e", "-c", "python -c 'import sys, tile; print(sys.prefix)'"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == sys.prefix
