"""versions/<pair>/pair.json is the truth about each PyTorch x CANN pair; .bazelrc's per-pair
configs and README.md's table of pairs repeat it by hand and must agree with it.

(Bazel cannot read JSON from a .bazelrc, and a generated rc file would have to exist before
the first bazel command of a fresh checkout, so the configs stay hand-written and checked.)
Needs the source tree (skipped where only the tests are present, e.g. Bazel's runfiles).
"""
import glob
import json
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, ".bazelrc")),
                                reason="needs the repository's source tree (.bazelrc next to python/)")


def _pairs():
    pairs = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "versions", "*", "pair.json"))):
        with open(path) as f:
            pairs[os.path.basename(os.path.dirname(path))] = json.load(f)
    return pairs


def _bazelrc_configs():
    """config name -> {repo_env name: value} of the ``build:<config> --repo_env=...`` lines."""
    configs = {}
    with open(os.path.join(ROOT, ".bazelrc")) as f:
        for line in f:
            m = re.match(r"build:(\S+)\s+(.*)", line.strip())
            if m:
                env = dict(re.findall(r"--repo_env=(\w+)=(\S+)", m.group(2)))
                configs.setdefault(m.group(1), {}).update(env)
    return configs


def test_there_are_pairs():
    assert len(_pairs()) >= 2


@pytest.mark.parametrize("pair", sorted(_pairs()))
def test_bazelrc_config_matches_pair_json(pair):
    spec = _pairs()[pair]
    assert pair == f"v{spec['torch']}-{spec['cann']}", "the folder name is v<torch>-<cann>"
    configs = _bazelrc_configs()
    assert spec["bazel_config"] in configs, f".bazelrc has no build:{spec['bazel_config']} line for {pair}"
    assert configs[spec["bazel_config"]] == {"NPU_PAIR": pair, "TORCH_VENV": spec["venv"]}


def test_every_pair_config_has_a_pair():
    pairs = _pairs()
    for name, env in _bazelrc_configs().items():
        if "NPU_PAIR" in env:
            assert env["NPU_PAIR"] in pairs, f"build:{name} names {env['NPU_PAIR']}, which has no versions/ folder"
            assert pairs[env["NPU_PAIR"]]["bazel_config"] == name


def test_default_config_is_a_pair():
    with open(os.path.join(ROOT, ".bazelrc")) as f:
        default = re.search(r"^build --config=(\S+)", f.read(), re.M)
    assert default and default.group(1) in {spec["bazel_config"] for spec in _pairs().values()}


@pytest.mark.parametrize("pair", sorted(_pairs()))
def test_readme_table_row_matches_pair_json(pair):
    spec = _pairs()[pair]
    with open(os.path.join(ROOT, "README.md")) as f:
        rows = [line for line in f if line.startswith(f"| `{pair}`")]
    assert len(rows) == 1, f"README.md's table of pairs has no single row for {pair}"
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    assert cells[1:] == [spec["torch"], spec["cann"], f"`torch_npu=={spec['torch']}.post{spec['post']}`",
                         f"`--config={spec['bazel_config']}`"]
