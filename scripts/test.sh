#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, unit and end-to-end tests, the
# model-checked ring and cache-table protocols. Installs what the tests need when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v cc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v pkg-config >/dev/null || need_pkgs+=(pkg-config)
# Real Redis peers and clients of the key-value service's tests.
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-benchmark >/dev/null || need_pkgs+=(redis-tools)
# NBD clients and reference servers of `dds nbd`'s tests and benchmark.
command -v fio >/dev/null || need_pkgs+=(fio)
command -v nbdcopy >/dev/null || need_pkgs+=(libnbd-bin)
command -v nbdkit >/dev/null || need_pkgs+=(nbdkit)
command -v qemu-img >/dev/null || need_pkgs+=(qemu-utils)
# iproute2 and nftables: the network namespaces and flow rules of `dds nodes` and `dds wire`
# (osd_nodes.rs, wire.rs).
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v nft >/dev/null || need_pkgs+=(nftables)
command -v ping >/dev/null || need_pkgs+=(iputils-ping)
# etcd, where DPU-KV registers its endpoints.
command -v etcd >/dev/null || need_pkgs+=(etcd-server)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
  else
    echo "missing packages: ${need_pkgs[*]} (run as root to install them)" >&2
    exit 1
  fi
fi
python3 -c 'import redis' 2>/dev/null || python3 -m pip install -q redis 2>/dev/null \
  || python3 -m pip install -q --break-system-packages redis
# The S3 gateway's tests drive it with the real awscli and boto3.
{ command -v aws >/dev/null && python3 -c 'import boto3' 2>/dev/null; } \
  || python3 -m pip install -q awscli boto3 2>/dev/null \
  || python3 -m pip install -q --break-system-packages awscli boto3
command -v cargo >/dev/null || { echo "cargo (Rust stable) is required" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt"
cargo fmt --all --check
# `dds bench` and `dds demo` are in the `bench` feature of dds-cli (off by default): the suite
# runs with it, and checks the default build as well.
echo "== cargo clippy"
cargo clippy --workspace --all-targets --features dds-cli/bench -- -D warnings
cargo clippy -p dds-cli --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace --release --features dds-cli/bench
cargo test --release -p dds-cli --test cli
# Redis's own Tcl units against redis-server, `dds kv` and the director, side by side (a
# check that prints counts; skipped without a Redis source tree in $REDIS_SRC).
echo "== scripts/redis-units.sh"
scripts/redis-units.sh
for s in crates/*/loom.sh; do
  [ -x "$s" ] || continue
  echo "== $s"
  "$s"
done
echo "all tests passed"
