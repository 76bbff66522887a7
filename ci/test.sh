#!/usr/bin/env bash
# Fresh machine -> every version pair built, its wheel installed, all tests run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/bootstrap.sh
nox -s test-matrix "$@"
