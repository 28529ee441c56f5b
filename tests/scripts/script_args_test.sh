#!/usr/bin/env bash
# The helper scripts' argument handling: --help prints a usage line on stdout
# and exits 0; bad arguments exit 2 with a message naming the script on
# stderr, never a traceback or a bash "unbound variable". Both before any
# work: no install, build, network namespace or bench. As a safety net the
# commands that work would start (apt-get, cmake, ninja, ip, flock…) are
# stubs here that fail loudly, so a regression fails this test instead of
# installing or building.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
scripts="$root/scripts"
tmp="$(mktemp -d /tmp/baton-script-args-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/stubs"
for c in apt-get sudo dpkg-query cmake ninja ctest clang++-16 protoc strip ldd ip tc nft flock \
         ucx_perftest iperf3 nvidia-smi; do
  printf '#!/bin/sh\necho "STUB %s ran: the script did work" >&2\nexit 97\n' "$c" >"$tmp/stubs/$c"
  chmod +x "$tmp/stubs/$c"
done
export PATH="$tmp/stubs:$PATH"
echo '{"rows": []}' >"$tmp/empty.json"
# The smallest `bench mixed` result plot draws: for an output it cannot write.
cat >"$tmp/mixed.json" <<'EOF'
{"workload": {"prefill": {"request_bytes": 1048576}, "decode": {"request_bytes": 4096, "deadline_us": 2000}},
 "policies": {"fifo": {"decode_critical": {"p99_us": 9, "miss_ratio": 0, "cdf_us": [1, 5, 9]}}}}
EOF

passed=0
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

# expect_help SCRIPT ARGS…: exit 0, a usage line on stdout
expect_help() {
  local script="$1" out rc=0
  shift
  out="$(cd "$tmp" && timeout 30 "$scripts/$script" "$@" 2>"$tmp/err" </dev/null)" || rc=$?
  if ((rc != 0)); then fail "$script $*: exit $rc, wanted 0: $(head -c 400 "$tmp/err")"; return; fi
  if ! grep -qi '^usage' <<<"$out"; then fail "$script $*: no usage line on stdout"; return; fi
  passed=$((passed + 1))
}

# expect_bad SCRIPT ARGS…: exit 2, "SCRIPT:" on stderr, no traceback or bash error
expect_bad() {
  local script="$1" err rc=0
  shift
  (cd "$tmp" && timeout 30 "$scripts/$script" "$@" >/dev/null 2>"$tmp/err" </dev/null) || rc=$?
  err="$(cat "$tmp/err")"
  if ((rc != 2)); then fail "$script $*: exit $rc, wanted 2: ${err:0:400}"; return; fi
  if [[ "$err" != *"$script:"* ]]; then fail "$script $*: stderr does not name the script: ${err:0:400}"; return; fi
  if [[ "$err" == *Traceback* || "$err" == *"unbound variable"* || "$err" == *STUB* ]]; then
    fail "$script $*: ${err:0:400}"
    return
  fi
  passed=$((passed + 1))
}

for script in garbage-listener plot bench-vs-perftest soak bench-nics bench-compress gpu-copy-engine.py \
              sanitize gpu-slices netns-link fuzz setup test demo gpu-bundle; do
  expect_help "$script" --help
done
expect_help soak -h
expect_help setup -h

expect_bad garbage-listener localhost
expect_bad garbage-listener 127.0.0.1:1 -5
expect_bad plot "$tmp/absent.json" out.txt
expect_bad plot "$tmp/empty.json" "$tmp/x.png"
expect_bad plot "$tmp/mixed.json" /nonexistent/x.png
expect_bad bench-vs-perftest --duration 1.2.3
expect_bad bench-vs-perftest --calls submit
expect_bad soak --seed
expect_bad soak --seed abc
expect_bad soak --duration
expect_bad bench-nics --rate
expect_bad bench-nics --repeat
expect_bad bench-nics --duration
expect_bad bench-compress --rate
expect_bad bench-compress --size 4MiB --rate bogus
expect_bad gpu-copy-engine.py extra
expect_bad sanitize foo
expect_bad gpu-slices -x
expect_bad netns-link up bogus
expect_bad netns-link frob
expect_bad fuzz abc
expect_bad fuzz 0
expect_bad setup --frob
expect_bad test x
expect_bad demo x
expect_bad gpu-bundle x

echo "script_args_test: $passed passed, $failed failed"
((failed == 0))
