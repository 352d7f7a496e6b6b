#!/usr/bin/env bash
# Model-check the cache table's sequence lock with loom.
# LOOM_MAX_PREEMPTIONS (default 3 in the tests) bounds the explored schedules.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUSTFLAGS="--cfg loom" cargo test -p dds-cache --release --lib -- loom "$@"
