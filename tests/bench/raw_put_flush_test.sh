#!/usr/bin/env bash
# baton_raw_put_flush (bench/raw_put_flush.cc), the raw-UCX write baseline of
# scripts/bench-vs-perftest: bad arguments end with a message and status 1,
# and a short run over TCP on 127.0.0.1 moves every put it counts.
set -uo pipefail
bin="$1"
fail() { echo "raw_put_flush_test: $*" >&2; exit 1; }

expect_refused() {  # args... : exit 1, a message naming the problem
  local want="$1"; shift
  local err rc
  err=$(timeout 10 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  [[ $rc -eq 1 ]] || fail "'$*' exited $rc, wanted 1"
  [[ "$err" == *"$want"* ]] || fail "'$*' said '$err', wanted '$want'"
}
expect_refused "give one of" 
expect_refused "give one of" --listen 1 --connect 127.0.0.1:1
expect_refused "unknown argument --bogus" --bogus
expect_refused "--size wants a value" --connect 127.0.0.1:1 --size
expect_refused "--listen wants a port" --listen 70000
expect_refused "is not an IPv4 address" --listen nowhere:5000
expect_refused "--size wants" --connect 127.0.0.1:1 --size 0
expect_refused "--window wants" --connect 127.0.0.1:1 --size 4096 --window 0
expect_refused "--duration wants" --connect 127.0.0.1:1 --size 4096 --duration -1
expect_refused "--connect wants HOST:PORT" --connect localhost --size 4096

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export UCX_TLS=tcp UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
timeout 60 "$bin" --listen "$port" --err-peer & server=$!
out=$(timeout 60 "$bin" --connect "127.0.0.1:$port" --size 4096 --window 4 --duration 0.2 --err-peer) || fail "the run failed"
wait "$server" || fail "the server exited $?"
/usr/bin/python3 - "$out" <<'PY' || fail "bad result: $out"
import json, sys
r = json.loads(sys.argv[1])
assert r["size"] == 4096 and r["window"] == 4, r
assert r["puts"] > 0 and r["puts"] % 4 == 0, r  # whole windows only
assert 0 < r["window_p50_us"] <= r["window_p99_us"] <= r["seconds"] * 1e6, r
assert abs(r["gbps"] - r["puts"] * 4096 / r["seconds"] / 1e9) < 1e-3 * r["gbps"] + 1e-9, r
PY

# A target killed under the run: the client ends with a message, not a hang.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --listen "$port" --err-peer & server=$!
disown "$server"  # its death is the point, not a job to report
( sleep 0.5; kill -9 "$server" ) &
start=$SECONDS
err=$(timeout 60 "$bin" --connect "127.0.0.1:$port" --size 65536 --window 4 --duration 20 --err-peer 2>&1 >/dev/null); rc=$?
{ wait; } 2>/dev/null
[[ $rc -eq 1 ]] || fail "a run whose target died exited $rc, wanted 1 ($err)"
(( SECONDS - start < 45 )) || fail "a run whose target died took $((SECONDS - start)) s"
[[ "$err" == *"baton_raw_put_flush:"* ]] || fail "a run whose target died said '$err'"
echo "raw_put_flush_test: ok ($out; a dead target: $err)"
