#!/usr/bin/env bash
# Model-checks the ring protocols with loom (release build: loom explores many executions).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUSTFLAGS="${RUSTFLAGS:-} --cfg loom" cargo test -p dds-ring --release --lib loom "$@"
