#!/usr/bin/env bash
# Every line Baton logs goes through baton::logger() (common/log.h), never
# spdlog's default logger: that one is the program's (stdout, its level),
# and a stray call printed into `baton serve`'s address line and JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
if grep -rnE 'spdlog::(log|trace|debug|info|warn|error|critical)\(' src tools python/src include; then
  echo "no_default_logger: the lines above log through spdlog's default logger; use baton::logger()" >&2
  exit 1
fi
echo "no_default_logger: ok"
