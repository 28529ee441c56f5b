# Sourced by the scripts here (not run): their argument handling in one
# place. A script sets `usage` first; then `bad REASON` prints
# "SCRIPT: REASON" and the usage on stderr and exits 2, and `no_arguments
# "$@"` (for a script that takes none) answers --help with the usage and
# refuses anything else, before the script does any work.
bad() { echo "$(basename "$0"): $*" >&2; echo "$usage" >&2; exit 2; }
no_arguments() {
  case "${1:-}" in
    -h|--help) echo "$usage"; exit 0 ;;
  esac
  (($# == 0)) || bad "takes no arguments (got \"$1\")"
}
