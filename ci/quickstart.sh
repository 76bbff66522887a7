#!/usr/bin/env bash
# Fresh machine -> wheel of the default pair built, installed, quick start trained on npu:0.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/bootstrap.sh
nox -s quickstart
