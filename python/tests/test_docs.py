"""The documentation names only what exists: repository paths and Bazel targets.

Scans README.md, docs/*.md and every component README for

* repository paths: words whose first component is a top-level folder of the repository
  or a subfolder of the document's folder (``core/src/npu_guard.cpp``, ``python/torch_npu/``,
  ``src/comm.{h,cpp}`` in distributed/README.md; ``*`` and ``.../`` globs too), resolved from
  the repository root or from the document's folder;
* Bazel targets: ``//pkg:name`` (the package's BUILD file exists and mentions ``"name"``),
  ``//pkg`` and ``//pkg/...`` (the package exists).

And the other way: every ``python/tests/test_*.py`` is named in python/tests/README.md, the
map of the test files.

Needs the source tree (skipped where only the tests are present, e.g. Bazel's runfiles).
"""
import glob
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "docs")),
                                reason="needs the repository's source tree (docs/ next to python/)")

# Built or generated files the docs may name; they exist only after a build or a run.
GENERATED = {"python/torch_npu/_C.so", "python/torch_npu/version.py", "python/torch_npu/_op_table.py"}
# Paths of other projects that look like ours: path -> whose.
OTHER_PROJECTS = {"third_party/acl/inc/acl/*.h": "Huawei's torch_npu tree (docs/COMPAT.md)"}


def _documents():
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "bazel-")) and d != "__pycache__")
        if top != ROOT and "README.md" in files:
            docs.append(os.path.join(top, "README.md"))
    return docs


def _folders(directory):
    return [name for name in os.listdir(directory) if os.path.isdir(os.path.join(directory, name))
            and not name.startswith((".git", ".venv", "bazel-", "__"))]


def _paths(text, doc_dir=ROOT):
    """The paths ``text`` names, brace lists expanded (``comm.{h,cpp}``: comm.h, comm.cpp)."""
    tops = "|".join(re.escape(t) for t in sorted(set(_folders(ROOT)) | set(_folders(doc_dir))))
    # A path starts a word (not after another path component, a dot or a URL) and stops at
    # whitespace, quotes, brackets or placeholders (<pair>, {worker}).
    for m in re.finditer(rf"(?<![\w./@:~-])(?:{tops})/(?:[^\s`'\"()<>{{}}\[\],;|]|{{[\w.]+(?:,[\w.]+)+}})*",
                         text):
        path = m.group(0).rstrip(".:")
        braces = re.search(r"{([^}]*)}", path)
        if braces:
            for alternative in braces.group(1).split(","):
                yield path[:braces.start()] + alternative + path[braces.end():]
        else:
            yield path


def _exists(path, doc_dir):
    if path.rstrip("/") in GENERATED or path in OTHER_PROJECTS:
        return True
    pattern = path.replace("/.../", "/**/")  # include/.../python.h: any depth
    for base in (ROOT, doc_dir):
        full = os.path.join(base, pattern)
        if glob.glob(full, recursive=True) if "*" in pattern else os.path.exists(full):
            return True
    return False


def _build_file(package):
    for name in ("BUILD.bazel", "BUILD"):
        path = os.path.join(ROOT, package, name)
        if os.path.isfile(path):
            return path
    return None


def _target_problem(target):
    """None if the Bazel target ``target`` (``//pkg:name``, ``//pkg``, ``//pkg/...``) exists."""
    if target.endswith("/..."):
        package = target[2:-4]
        return None if os.path.isdir(os.path.join(ROOT, package)) else f"no package folder {package}"
    package, _, name = target[2:].partition(":")
    build = _build_file(package)
    if build is None:
        return f"no BUILD file in {package or 'the root'}"
    name = name or os.path.basename(package)
    with open(build) as f:
        if f'"{name}"' not in f.read():
            return f'{os.path.relpath(build, ROOT)} does not mention "{name}"'
    return None


def _targets(text):
    for m in re.finditer(r"(?<![\w:@/])//([\w/-]*(?:\.\.\.)?)(?::[\w./+-]*\w)?", text):
        if m.group(1) not in ("", "..."):  # not //... (every package) nor a comment's //
            yield m.group(0)


def test_documents_are_found():
    names = {os.path.relpath(d, ROOT) for d in _documents()}
    assert {"README.md", "docs/ARCHITECTURE.md", "compiler/README.md", "python/torch_npu/README.md"} <= names


@pytest.mark.parametrize("doc", _documents(), ids=lambda d: os.path.relpath(d, ROOT))
def test_named_paths_exist(doc):
    with open(doc) as f:
        text = f.read()
    missing = sorted({p for p in _paths(text, os.path.dirname(doc)) if not _exists(p, os.path.dirname(doc))})
    assert not missing, f"{os.path.relpath(doc, ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", _documents(), ids=lambda d: os.path.relpath(d, ROOT))
def test_named_bazel_targets_exist(doc):
    with open(doc) as f:
        text = f.read()
    problems = sorted({f"{t}: {p}" for t in _targets(text) for p in [_target_problem(t)] if p})
    assert not problems, f"{os.path.relpath(doc, ROOT)} names Bazel targets that do not exist: {problems}"


def test_every_test_file_is_in_the_tests_readme():
    tests = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(tests, "README.md")) as f:
        readme = f.read()
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tests, "test_*.py")))
    assert "test_docs.py" in files
    unnamed = [name for name in files if not re.search(rf"(?<![\w/]){re.escape(name)}", readme)]
    assert not unnamed, f"python/tests/README.md does not name these test files: {unnamed}"


def test_the_readme_example_runs_as_written():
    """README.md's first Python block, run as a script in a fresh interpreter."""
    import subprocess
    import sys

    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    assert "import torch, torch_npu" in block
    run = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "device='npu:0'" in run.stdout


def test_the_checks_catch_broken_references(tmp_path):
    assert _exists("core/src", ROOT) and not _exists("core/src/no_such_file.cpp", ROOT)
    assert _exists("python/csrc/*.cpp", ROOT) and not _exists("python/csrc/*.nothing", ROOT)
    assert list(_paths("see core/acl/README.md, and `python/torch_npu/`.")) == ["core/acl/README.md",
                                                                               "python/torch_npu/"]
    assert list(_paths("https://example.org/docs/x and foo/docs/y")) == []
    assert list(_paths("`src/comm.{h,cpp}`", os.path.join(ROOT, "distributed"))) == ["src/comm.h", "src/comm.cpp"]
    assert _exists("include/.../python.h", os.path.join(ROOT, "distributed"))
    assert list(_targets("bazel test //python:python_tests //core/... //... tcp://host:1 @repo//x:y")) == [
        "//python:python_tests", "//core/..."]
    assert _target_problem("//python:python_tests") is None
    assert _target_problem("//python:no_such_target") is not None
    assert _target_problem("//no_such_package:x") is not None
