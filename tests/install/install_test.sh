#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds two consumers
# against that prefix alone: a C++ one with find_package(Baton CONFIG) and a
# C one with `cc $(pkg-config --cflags --libs baton)`, and runs each against
# a `baton serve` started from the installed command on 127.0.0.1.
# Exits 77 (ctest: skipped) when a tool or a build output it needs is missing.
# Usage: install_test.sh BUILD_DIR CMAKE C_COMPILER CXX_COMPILER LIBDIR LIBBATON BATON
set -euo pipefail

if (($# != 7)); then
  echo "usage: install_test.sh BUILD_DIR CMAKE C_COMPILER CXX_COMPILER LIBDIR LIBBATON BATON" >&2
  exit 2
fi
build="$1" cmake="$2" cc="$3" cxx="$4" libdir="$5" built_lib="$6" built_baton="$7"
here="$(cd "$(dirname "$0")" && pwd)"

skip() {
  echo "install_test: skipped: $*"
  exit 77
}
for tool in "$cmake" "$cc" "$cxx" pkg-config timeout; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done
for built in "$built_lib" "$built_baton"; do
  [[ -e "$built" ]] || skip "$built is not built (ninja -C $build baton_shared baton)"
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/baton-install-test.XXXXXX")"
serve_pid=""
cleanup() {
  if [[ -n "$serve_pid" ]]; then
    kill "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # through the EXIT trap

fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}
# Runs a command quietly; on failure shows its output and fails.
quiet() {
  local what="$1"
  shift
  "$@" >"$tmp/step.log" 2>&1 || { cat "$tmp/step.log" >&2; fail "$what"; }
}

prefix="$tmp/prefix"
if ! "$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  # Another target's output (libbaton and baton are there): a partial build.
  if missing="$(grep -A2 'file INSTALL cannot find' "$tmp/install.log")"; then
    skip "the build tree is not fully built (ninja -C $build): $(tr -s ' \n' ' ' <<<"$missing")"
  fi
  cat "$tmp/install.log" >&2
  fail "cmake --install"
fi
lib="$prefix/$libdir"
for f in bin/baton "$libdir/libbaton.so" "$libdir/libbaton_store.so" "$libdir/pkgconfig/baton-store.pc" \
  include/baton/c/baton.h include/baton/engine/engine.h include/baton/store/service.h share/baton/sched_policy.yaml \
  include/baton/common/status.h "$libdir/cmake/Baton/BatonConfig.cmake" \
  "$libdir/cmake/Baton/BatonConfigVersion.cmake" "$libdir/pkgconfig/baton.pc"; do
  [[ -e "$prefix/$f" ]] || fail "$f was not installed"
done
# The command and nothing else: no test binary, benchmark or fuzzer.
[[ "$(ls "$prefix/bin")" == baton ]] || fail "bin/ holds more than baton: $(ls "$prefix/bin" | tr '\n' ' ')"
if command -v nm >/dev/null; then
  symbols="$(nm -D --defined-only "$lib/libbaton.so" "$lib/libbaton_store.so")"
  for s in baton_engine_create baton_submit baton_last_error _ZN5baton6engine6Engine6create; do
    grep -q " T $s" <<<"$symbols" || fail "libbaton.so does not export $s"
  done
  # Unmangled, only the C ABI and protobuf's table of our own file: any other
  # plain name would bind a program's function of that name in its place.
  stray="$(awk 'NF == 3 && $3 !~ /^(_Z|baton_|descriptor_table_baton_)/ {print $3}' <<<"$symbols")"
  [[ -z "$stray" ]] || fail "libbaton exports plain names outside baton_*: $(tr '\n' ' ' <<<"$stray")"
fi

# The C++ consumer: find_package(Baton CONFIG) from the prefix alone.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
quiet "configure the C++ consumer" "$cmake" -S "$here/cxx_consumer" -B "$tmp/cxx" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
quiet "build the C++ consumer" "$cmake" --build "$tmp/cxx"

# The C consumer: pkg-config from the prefix alone, as C99 without warnings.
export PKG_CONFIG_PATH="$lib/pkgconfig"
pc_flags="$(pkg-config --cflags --libs baton)" || fail "pkg-config --cflags --libs baton"
# shellcheck disable=SC2086  # pkg-config's flags are words
quiet "build the C consumer" "$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror "$here/c_consumer.c" \
  -o "$tmp/c_consumer" $pc_flags

export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for consumer in "$tmp/cxx/cxx_consumer" "$tmp/c_consumer"; do
  ldd "$consumer" | grep "libbaton.so.* => $lib/" >/dev/null ||
    fail "$consumer does not load libbaton from $lib: $(ldd "$consumer")"
done

# 4 MiB: the C++ consumer reads the first 2, the C one writes the last 1.
"$prefix/bin/baton" serve --buffer-size 4MiB --listen 127.0.0.1:0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
serve_pid=$!
for _ in $(seq 300); do
  grep -q '^region ' "$tmp/serve.out" && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$tmp/serve.err" >&2; fail "baton serve exited"; }
  sleep 0.1
done
address="$(sed -n 's/^address \(.*\)$/\1/p' "$tmp/serve.out")"
region="$(sed -n 's/^region \([0-9]*\) bytes [0-9]*$/\1/p' "$tmp/serve.out")"
bytes="$(sed -n 's/^region [0-9]* bytes \([0-9]*\)$/\1/p' "$tmp/serve.out")"
if [[ -z "$address" || -z "$region" || -z "$bytes" ]]; then
  cat "$tmp/serve.out" "$tmp/serve.err" >&2
  fail "no address and region lines from baton serve within 30 s"
fi
echo "install_test: baton serve at $address, region $region of $bytes bytes"

# The library's log obeys BATON_LOG_LEVEL and goes to stderr, never into
# the program's stdout (spdlog's default logger would print info lines there).
BATON_LOG_LEVEL=info timeout 60 "$tmp/cxx/cxx_consumer" "$address" "$region" "$bytes" \
  >"$tmp/cxx.out" 2>"$tmp/cxx.err" || { cat "$tmp/cxx.out" "$tmp/cxx.err" >&2; fail "the C++ consumer"; }
grep -q "127.0.0.1:1" "$tmp/cxx.err" || fail "the C++ consumer's refused connect was not logged on stderr: $(cat "$tmp/cxx.err")"
[[ "$(grep -cv '^cxx_consumer: read ' "$tmp/cxx.out")" == 0 ]] || fail "log lines on the C++ consumer's stdout: $(cat "$tmp/cxx.out")"
# A mistyped level is said once, on stderr, and the library logs at warn.
BATON_LOG_LEVEL=debgu timeout 60 "$tmp/cxx/cxx_consumer" "$address" "$region" "$bytes" \
  >"$tmp/cxx.out" 2>"$tmp/cxx.err" || { cat "$tmp/cxx.out" "$tmp/cxx.err" >&2; fail "the C++ consumer (BATON_LOG_LEVEL=debgu)"; }
grep -q 'BATON_LOG_LEVEL="debgu" is not a level' "$tmp/cxx.err" || fail "no word of the unknown BATON_LOG_LEVEL: $(cat "$tmp/cxx.err")"
if grep -q "127.0.0.1:1" "$tmp/cxx.err"; then fail "an info line logged at the warn fallback: $(cat "$tmp/cxx.err")"; fi
timeout 60 "$tmp/c_consumer" "$address" "$region" "$bytes" || fail "the C consumer"
# The store's RPC side, with its own library (every declared function there).
timeout 60 "$tmp/cxx/store_consumer" || fail "the store consumer"
ldd "$tmp/cxx/store_consumer" | grep "libbaton_store.so.* => $lib/" >/dev/null ||
  fail "the store consumer does not load libbaton_store from $lib"
echo "install_test: ok"
