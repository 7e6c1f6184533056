"""The distributions are complete and clean: the sdist is the whole source tree, so the
test suite runs from an unpacked sdist; the wheel ships the licence and asks at runtime
only for what the package imports.

The sdist and the wheel are built with the setuptools backend called directly
(``setuptools.build_meta``, no build isolation, no network), in a child process so that
setuptools' global state, its working directory and its warnings stay out of the pytest
process. The build runs on a copy of the source tree in a temporary directory, so the
checkout gets no ``*.egg-info`` and parallel workers do not share a build directory.
Nothing here names a module inside ``vargather/``: the checks hold whatever the package's
internal layout.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Source files that stay in the repository and are not part of the sdist.
REPO_ONLY = {".gitignore"}
# The files the brief of the sdist names, checked by name on top of the whole tree, so
# that a broken source listing cannot make this test vacuous.
MUST_CARRY = ("pyproject.toml", "README.md", "LICENSE", "constraints.txt", "tox.ini")
# What a source tree holds that is not source (caches, venvs, build output).
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    ".tox",
    "__pycache__",
    "*.py[cod]",
    ".hypothesis",
    ".*_cache",
    "*.egg-info",
    "build",
    "dist",
    "bench-out",
    ".gl",
)
# A quick subset of the suite, run from the unpacked sdist.
QUICK_TESTS = ("tests/test_api_single_process.py", "tests/test_repo.py")


def source_files() -> list[str]:
    """The source tree's files, relative to ROOT: what git tracks plus new files it does
    not ignore; from a tree that is no git checkout (an unpacked sdist), every file that
    is not a cache or build output."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        top = None
    if top is not None and top.returncode == 0 and Path(top.stdout.strip()).resolve() == ROOT:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        skipped = NOT_SOURCE(dirpath, dirnames + filenames)
        dirnames[:] = [d for d in dirnames if d not in skipped]
        rel = Path(dirpath).relative_to(ROOT)
        files += [(rel / f).as_posix() for f in filenames if f not in skipped]
    # setuptools writes these into the sdist itself; they are no source of their own.
    return sorted(set(files) - {"PKG-INFO", "setup.cfg"})


def build(hook: str, source: Path, out: Path) -> Path:
    """Run one setuptools backend hook (build_sdist or build_wheel) in ``source``."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{hook} failed:\n{done.stdout}\n{done.stderr}"
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    return build("build_sdist", src, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def unpacked(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    (top,) = into.iterdir()
    return top


def sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    return {name.split("/", 1)[1] for name in names}


def test_sdist_carries_the_whole_source_tree(sdist: Path) -> None:
    names = sdist_names(sdist)
    expected = set(source_files()) - REPO_ONLY
    assert {"tests", "fuzz"} <= {name.split("/", 1)[0] for name in expected}
    assert set(MUST_CARRY) <= expected, "the source listing lost a file the sdist must carry"
    missing = sorted(expected - names)
    assert not missing, (
        f"the sdist lacks {len(missing)} source file(s), e.g. {missing[:10]}: "
        "add them to MANIFEST.in (or to REPO_ONLY in this test if they stay in the repository)"
    )
    junk = sorted(n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo")))
    assert not junk, f"the sdist carries bytecode: {junk[:10]}"


def test_sdist_metadata_declares_the_licence(unpacked: Path) -> None:
    metadata = email.parser.Parser().parsestr((unpacked / "PKG-INFO").read_text())
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert (unpacked / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


# The slow schedule's (an interpreter compiling the unpacked tree: 8-10 s of the default
# run's 2 cores); the default run checks the sdist's files and metadata above.
@pytest.mark.slow
def test_unpacked_sdist_runs_its_own_tests(unpacked: Path) -> None:
    # A fresh pytest run: none of this worker's xdist or current-test variables.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))
    }
    env["PYTHONPATH"] = str(unpacked)
    gone = [name for name in QUICK_TESTS if not (unpacked / name).is_file()]
    assert not gone, f"QUICK_TESTS names files the tree no longer has: {gone}"
    # One interpreter (each imports torch, about 2 CPU-seconds): pytest's entry point on
    # QUICK_TESTS, saying on stderr which vargather the session imported (once pytest's
    # import hooks are in place: before them, pytest refuses vargather as already
    # imported, unrewritten).
    code = (
        "import sys, pytest\n"
        "class Where:\n"
        "    def pytest_sessionstart(self, session):\n"
        "        import vargather\n"
        "        print('vargather from', vargather.__file__, file=sys.stderr, flush=True)\n"
        "sys.exit(pytest.main(sys.argv[1:], plugins=[Where()]))\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            *QUICK_TESTS,
        ],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (where,) = [line for line in done.stderr.splitlines() if line.startswith("vargather from ")]
    where = where.removeprefix("vargather from ")
    assert Path(where).resolve().is_relative_to(unpacked.resolve()), where
    assert done.returncode == 0, f"pytest in the unpacked sdist:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"\b\d+ passed\b", done.stdout), done.stdout
    assert "skipped" not in done.stdout, done.stdout


def test_wheel_ships_the_licence_and_only_runtime_dependencies(
    unpacked: Path, tmp_path: Path
) -> None:
    # pip builds a wheel from an sdist the same way: backend, in the unpacked tree.
    wheel = build("build_wheel", unpacked, tmp_path)
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (dist_info,) = {
            n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")
        }
        metadata_text = whl.read(f"{dist_info}/METADATA").decode()
        licences = [n for n in names if n.startswith(f"{dist_info}/") and n.endswith("/LICENSE")]
        assert licences, f"no LICENSE in {dist_info}: {names}"
        assert whl.read(licences[0]).decode() == (ROOT / "LICENSE").read_text()
        entry_points = whl.read(f"{dist_info}/entry_points.txt").decode()
    top = {"vargather", dist_info, "_vargather_pytestplugin.py"}
    assert all(n.split("/", 1)[0] in top for n in names), names
    assert "vargather/py.typed" in names
    assert "_vargather_pytestplugin.py" in names, "the pytest plugin's module is missing"
    assert re.search(
        r"^\[pytest11\]\s*^vargather\s*=\s*_vargather_pytestplugin\s*$", entry_points, re.M
    ), entry_points

    metadata = email.parser.Parser().parsestr(metadata_text)
    assert metadata["License-Expression"] == "MIT"
    requires = metadata.get_all("Requires-Dist") or []

    def name(req: str) -> str:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert match, req
        return match.group(1).lower()

    runtime = {name(r) for r in requires if "extra ==" not in r}
    assert runtime == {"torch"}, f"runtime requirements beyond what the package imports: {requires}"
    einops = [r for r in requires if name(r) == "einops"]
    assert einops, "einops left the test extra (tests/seed_impl.py needs it)"
    assert all('extra == "test"' in r for r in einops), einops
