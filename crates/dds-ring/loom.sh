#!/usr/bin/env bash
# Model-checks the ring protocols with loom (release build: loom explores many executions).
# The loom configuration is linted as strictly as the normal one: warnings fail the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom -D warnings"
# The model tests are the only users of the protocol core under loom: lint the test build.
cargo clippy -p dds-ring --lib --profile test -- -D warnings
cargo test -p dds-ring --release --lib loom "$@"
