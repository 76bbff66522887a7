"""Sessions over the version matrix (versions/<torch>-<cann>/).

  nox -s wheels        build the wheel of every pair into dist/
  nox -s test-matrix   per pair: build, C++ tests, install the wheel into the pair's venv,
                       run the Python tests against the installed wheel
  nox -s quickstart    build the default pair and train a small transformer on npu:0
  nox -s benchmarks    run benchmarks/ and write docs/BENCHMARKS.md
  nox -s conformance   the full OpInfo conformance suite -> the Conformance section of docs/OPS.md
Select pairs with `-- v2.13.0-8.5.0 ...` (default: all).
"""
import json
import os
import shutil

import nox

ROOT = os.path.dirname(os.path.abspath(__file__))
PAIRS = sorted(os.listdir(os.path.join(ROOT, "versions")))
DEFAULT_PAIR = "v2.13.0-8.5.0"
nox.options.sessions = ["test-matrix"]


def _spec(pair):
    with open(os.path.join(ROOT, "versions", pair, "pair.json")) as f:
        return json.load(f)


def _pairs(session):
    chosen = session.posargs or PAIRS
    unknown = [p for p in chosen if p not in PAIRS]
    if unknown:
        session.error(f"unknown pair(s) {unknown}; known: {PAIRS}")
    return chosen


def _venv(session, pair):
    return session.run("python3", "tools/venv.py", pair, silent=True, external=True).strip().splitlines()[-1]


def _build_wheel(session, pair):
    """Builds the pair's wheel, copies it to dist/ and returns its path."""
    spec = _spec(pair)
    _venv(session, pair)
    try:
        session.run("bazel", "build", "//python:wheel", f"--config={spec['bazel_config']}", external=True)
    except nox.command.CommandFailed:
        session.error(f"pair {pair} does not build (see the bazel output above)")
    os.makedirs(os.path.join(ROOT, "dist"), exist_ok=True)
    name = f"torch_npu-{spec['torch']}.post{spec['post']}-cp311-cp311-linux_x86_64.whl"
    src = os.path.join(ROOT, "bazel-bin", "python", name)
    if not os.path.exists(src):
        session.error(f"pair {pair}: expected {src} after the build")
    dst = os.path.join(ROOT, "dist", name)
    shutil.copyfile(src, dst)
    return dst


def _install(session, pair):
    """Builds the pair's wheel, installs it into the pair's venv; returns that venv's python."""
    wheel = _build_wheel(session, pair)
    python = _venv(session, pair)
    session.run(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel, external=True)
    return python


@nox.session(python=False)
def wheels(session):
    for pair in _pairs(session):
        session.log(f"wheel for {pair}: {_build_wheel(session, pair)}")


@nox.session(name="test-matrix", python=False)
def test_matrix(session):
    for pair in _pairs(session):
        spec = _spec(pair)
        session.log(f"=== pair {pair} (torch {spec['torch']}, CANN {spec['cann']}) ===")
        python = _install(session, pair)
        # The C++ tests; the Python ones (tagged "python") run below on the installed wheel.
        session.run("bazel", "test", "//core/...", "--test_tag_filters=-python", f"--config={spec['bazel_config']}",
                    external=True)
        # Run from outside the tree so `import torch_npu` is the installed wheel. One worker per
        # core, each taking whole files (a file's tests share module fixtures and run in order).
        session.chdir(os.path.join(ROOT, "python", "tests"))
        session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", "--dist", "loadfile",
                    ".", external=True)
        session.chdir(ROOT)


@nox.session(python=False)
def quickstart(session):
    python = _install(session, DEFAULT_PAIR)
    session.chdir(os.path.join(ROOT, "examples"))
    session.run(python, "quickstart.py", external=True)


@nox.session(python=False)
def benchmarks(session):
    python = _install(session, DEFAULT_PAIR)
    session.chdir(os.path.join(ROOT, "benchmarks"))
    session.run(python, "run_all.py", "--write", os.path.join(ROOT, "docs", "BENCHMARKS.md"), external=True)


@nox.session(python=False)
def conformance(session):
    """The full OpInfo conformance suite (every dtype, backward) of the default pair ->
    the Conformance section of docs/OPS.md (the default pytest run has a fast slice only)."""
    python = _install(session, DEFAULT_PAIR)
    # From outside the tree so `import torch_npu` is the installed wheel.
    session.chdir(os.path.join(ROOT, "python", "tests"))
    session.run(python, os.path.join("ops", "report.py"), "--write", os.path.join(ROOT, "docs", "OPS.md"),
                *session.posargs, external=True)


@nox.session(python=False)
def fuzz(session):
    """Differential fuzzing of the asynchronous path (python/tests/async_fuzz.py) against the
    installed wheel of the default pair: `-- --programs N --seed S` (default 20000 from seed 0)."""
    python = _install(session, DEFAULT_PAIR)
    # From outside the tree so `import torch_npu` is the installed wheel.
    session.chdir(os.path.join(ROOT, "python", "tests"))
    session.run(python, "async_fuzz.py", "--programs", "20000", *session.posargs, external=True)
