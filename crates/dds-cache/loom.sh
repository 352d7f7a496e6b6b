#!/usr/bin/env bash
# Model-check the cache table's sequence lock with loom.
# LOOM_MAX_PREEMPTIONS (default 3 in the tests) bounds the explored schedules.
# The loom configuration is linted as strictly as the normal one: warnings fail the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom -D warnings"
cargo clippy -p dds-cache --lib --profile test -- -D warnings
cargo test -p dds-cache --release --lib -- loom "$@"
