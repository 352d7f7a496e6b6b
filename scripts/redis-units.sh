#!/usr/bin/env bash
# Redis's own Tcl test suite as a check of `dds kv` (docs/kv-service.md, "Redis's test
# suite"): runs Redis 7's units in external-server mode (`runtest --host H --port P
# --singledb --durable`: a test whose command is refused counts as failed and the unit goes
# on) against `redis-server`, against `dds kv` directly and against the same `dds kv` through
# the DPU's traffic director (the `redis` offload app), and prints per unit the tests each
# one passed, side by side.
#
#   scripts/redis-units.sh [REDIS_SOURCE_DIR] [UNIT ...]
#
# REDIS_SOURCE_DIR (or $REDIS_SRC): a Redis 7 source tree (its `runtest` and `tests/`; nothing
# is built). The suite cannot be downloaded here: without a tree the script says so and exits
# 0. UNITs default to type/string type/incr keyspace expire protocol info-command type/hash
# type/list type/set type/zset.
#
# Environment:
#   REDIS_UNITS_TAGS  tags given to `runtest --tags` on every side (default
#                     "-needs:repl -needs:debug": replication streams and DEBUG's reload,
#                     object and sleep subcommands are mechanisms `dds kv` does not have; ""
#                     runs every test).
#   REDIS_UNITS_OUT   directory that keeps the logs and the per-test comparison (default: a
#                     temporary directory, removed at the end).
#   REDIS_UNITS_TIMEOUT  seconds one unit may run on one side (default 900): past it the
#                     unit counts as hung.
#   DDS               the `dds` binary (default target/release/dds, built when missing).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

src=${1:-${REDIS_SRC:-}}
[ $# -gt 0 ] && shift
if [ -z "$src" ] || [ ! -x "$src/runtest" ] || [ ! -d "$src/tests/unit" ]; then
  echo "redis-units: no Redis source tree (pass its directory or set REDIS_SRC): skipped"
  exit 0
fi
units=("$@")
[ ${#units[@]} -gt 0 ] || units=(type/string type/incr keyspace expire protocol info-command
  type/hash type/list type/set type/zset)
for tool in tclsh redis-server python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "redis-units: $tool is not installed: skipped"
    exit 0
  fi
done
tags=${REDIS_UNITS_TAGS--needs:repl -needs:debug}
unit_timeout=${REDIS_UNITS_TIMEOUT:-900}
dds=${DDS:-$root/target/release/dds}
if [ ! -x "$dds" ]; then
  cargo build --release -q -p dds-cli --bin dds || exit 1
fi

work=$(mktemp -d)
out=${REDIS_UNITS_OUT:-$work/out}
mkdir -p "$out"
: >"$out/differences.txt"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The suite writes into its tests/tmp: it runs from a copy of the tree's scripts.
cp -r "$src/tests" "$src/runtest" "$work/"
[ -d "$src/src" ] && ln -s "$src/src" "$work/src"
rm -rf "$work/tests/tmp" && mkdir -p "$work/tests/tmp"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 60 s for a line matching $2 in the file $1; prints it.
ready_line() {
  local i
  for i in $(seq 600); do
    if grep -m1 -e "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "redis-units: no ready line in $1:" >&2
  cat "$1" >&2
  return 1
}

start_redis() {
  redis_port=$(free_port)
  redis-server --port "$redis_port" --save "" --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  ready_line "$work/redis.log" "Ready to accept connections" >/dev/null
}

# A DPU with the `redis` offload app and its director, and `dds kv` on DDS behind it.
start_dds() {
  rm -rf "$work/dds" && mkdir -p "$work/dds"
  "$dds" format --size 4G --device "$work/dds/dev.img" >/dev/null || return 1
  "$dds" dpu --json --device "$work/dds/dev.img" --socket "$work/dds/dpu.sock" \
    --offload redis --director-listen 127.0.0.1:0 >"$work/dds/dpu.out" 2>"$work/dds/dpu.log" &
  dpu_pid=$!
  pids+=("$dpu_pid")
  local line
  line=$(ready_line "$work/dds/dpu.out" '"director"') || return 1
  director_port=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["director"].rsplit(":",1)[1])')
  "$dds" kv --listen 127.0.0.1:0 --socket "$work/dds/dpu.sock" --memory 128M --page-size 16M \
    --log-size 2G \
    >"$work/dds/kv.out" 2>"$work/dds/kv.log" &
  kv_pid=$!
  pids+=("$kv_pid")
  line=$(ready_line "$work/dds/kv.out" "listening on") || return 1
  kv_port=$(echo "$line" | sed -E 's/.*listening on [^ ]*:([0-9]+) .*/\1/')
}

alive() { kill -0 "$1" 2>/dev/null; }

# Runs one unit against the port $2, logging to $3.
run_unit() {
  local unit=$1 port=$2 log=$3 args=()
  [ -n "$tags" ] && args=(--tags "$tags")
  (cd "$work" && timeout "$unit_timeout" ./runtest --host 127.0.0.1 --port "$port" --singledb \
    --single "unit/$unit" --durable --timeout "$unit_timeout" "${args[@]}") >"$log" 2>&1
  return $?
}

# The passed, failed tests of a log, and how it ended.
tally() {
  local log=$1 rc=$2 plain ok err how
  plain=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log")
  ok=$(grep -c '^\[ok\]: ' <<<"$plain")
  err=$(grep -c '^\[err\]: ' <<<"$plain")
  how=""
  grep -q '^\[exception\]: ' <<<"$plain" && how=" stopped"
  [ "$rc" = 124 ] && how=" hung"
  echo "$ok passed, $err failed$how"
}

passed_names() {
  sed -E 's/\x1b\[[0-9;]*m//g' "$1" | sed -nE 's/^\[ok\]: (.*) \([0-9]+ ms\)$/\1/p' | sort -u
}

start_redis || exit 1
start_dds || exit 1
echo "redis-units: $(redis-server --version | cut -d' ' -f3) on port $redis_port; dds kv on port $kv_port, its director on $director_port; tags: ${tags:-(all)}"
printf '%-14s %-28s %-28s %-28s\n' unit redis-server "dds kv" "dds kv (director)"
for unit in "${units[@]}"; do
  if [ ! -f "$src/tests/unit/$unit.tcl" ]; then
    printf '%-14s no such unit in %s\n' "$unit" "$src"
    continue
  fi
  name=${unit//\//_}
  row=()
  for side in redis kv director; do
    case $side in
      redis) port=$redis_port ;;
      kv) port=$kv_port ;;
      director) port=$director_port ;;
    esac
    log="$out/$name.$side.log"
    run_unit "$unit" "$port" "$log"
    rc=$?
    cell=$(tally "$log" "$rc")
    if [ "$side" != redis ] && ! { alive "$kv_pid" && alive "$dpu_pid"; }; then
      cell="$cell, CRASHED"
      echo "redis-units: a dds process died during $unit ($side); restarting" >&2
      kill "$kv_pid" "$dpu_pid" 2>/dev/null
      start_dds || exit 1
    fi
    row+=("$cell")
  done
  printf '%-14s %-28s %-28s %-28s\n' "$unit" "${row[@]}"
  # The tests redis-server passes that a `dds kv` side does not.
  passed_names "$out/$name.redis.log" >"$work/ref"
  for side in kv director; do
    passed_names "$out/$name.$side.log" | comm -23 "$work/ref" - |
      sed "s|^|$unit ($side): |" >>"$out/differences.txt"
  done
done
n=$(wc -l <"$out/differences.txt")
echo "redis-units: $n tests redis-server passes and a dds kv side does not, listed in $out/differences.txt"
if [ -z "${REDIS_UNITS_OUT:-}" ] && [ "$n" -gt 0 ]; then
  cat "$out/differences.txt"
fi
exit 0
