#!/bin/sh
# Backup and restore of SPACE's Redis (the state of record: sandboxes, nodes, operations, keys).
# POSIX sh + redis-cli + redis-server only, so it runs where Redis runs: inside the Redis pod
# (`kubectl exec`, the redis:alpine image has no bash) or on the control VM.
#
#   redis-backup.sh backup  <file.rdb>   point-in-time snapshot of the live Redis
#   redis-backup.sh restore <file.rdb>   copies every key of the snapshot into the live Redis
#
# Which Redis: REDIS_HOST (default 127.0.0.1), REDIS_PORT (default 6379), and the password in
# REDISCLI_AUTH (redis-cli reads it from there, so it never shows in the process list).
#
# backup uses `redis-cli --rdb`: the server forks and streams an RDB snapshot as it would to a
# replica (redis.io/docs/latest/develop/tools/cli/, "Remote backups of RDB files").
#
# restore does not touch the live server's files: with AOF on, Redis ignores a dump.rdb at start
# (it loads the AOF, or starts empty and makes a new one), so dropping the file in place would
# silently restore nothing. Instead it loads the snapshot into a throwaway redis-server on a
# loopback port (same binary, so the same RDB version) and MIGRATEs every key from it into the
# live server with COPY REPLACE (TTLs kept; redis.io/docs/latest/commands/migrate/). The writes go
# through the live server, so they land in its AOF. Stop the API and agents first (scale the API
# to 0, or stop space-api on the control VM) so nothing writes meanwhile; keys absent from the
# snapshot are left as they are (restore into an empty Redis for an exact copy).
set -eu

host=${REDIS_HOST:-127.0.0.1}
port=${REDIS_PORT:-6379}
cmd=${1:-}
file=${2:-}
[ -n "$cmd" ] && [ -n "$file" ] || {
  echo "usage: $0 backup|restore <file.rdb>" >&2
  exit 2
}

live() { redis-cli -h "$host" -p "$port" "$@"; }

case "$cmd" in
backup)
  live --rdb "$file" >&2
  echo "redis-backup: snapshot of $host:$port in $file ($(wc -c <"$file") bytes)"
  ;;
restore)
  [ -s "$file" ] || {
    echo "redis-backup: $file is empty or missing" >&2
    exit 1
  }
  tmp=$(mktemp -d)
  tport=${RESTORE_PORT:-16379}
  cp "$file" "$tmp/restore.rdb"
  # the snapshot's server: loopback only, no password, no persistence of its own
  redis-server --port "$tport" --bind 127.0.0.1 --dir "$tmp" --dbfilename restore.rdb \
    --appendonly no --save '' --daemonize yes --logfile "$tmp/redis.log" --pidfile "$tmp/redis.pid"
  # a subshell without the live password (an empty REDISCLI_AUTH would still send AUTH)
  snap() { (
    unset REDISCLI_AUTH
    redis-cli -h 127.0.0.1 -p "$tport" "$@"
  ); }
  cleanup() {
    snap shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$tmp"
  }
  trap cleanup EXIT
  i=0
  until [ "$(snap ping 2>/dev/null)" = PONG ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || {
      cat "$tmp/redis.log" >&2
      exit 1
    }
    sleep 0.1
  done
  total=$(snap dbsize)
  auth=''
  [ -n "${REDISCLI_AUTH:-}" ] && auth="AUTH $REDISCLI_AUTH"
  # batches of 100 keys per MIGRATE; SPACE keys contain no whitespace
  : >"$tmp/migrated"
  snap --scan | while read -r first; do
    batch=$first
    n=1
    while [ "$n" -lt 100 ] && read -r k; do
      batch="$batch $k"
      n=$((n + 1))
    done
    # shellcheck disable=SC2086 # word splitting of the key batch and AUTH is intended
    out=$(snap MIGRATE "$host" "$port" "" 0 10000 COPY REPLACE $auth KEYS $batch)
    [ "$out" = OK ] || {
      echo "redis-backup: MIGRATE failed: $out" >&2
      exit 1
    }
    echo "$n" >>"$tmp/migrated"
  done
  migrated=$(awk '{ n += $1 } END { print n + 0 }' "$tmp/migrated")
  [ "$migrated" = "$total" ] || {
    echo "redis-backup: the snapshot holds $total keys but $migrated were copied" >&2
    exit 1
  }
  echo "redis-backup: restored $total keys from $file into $host:$port (it now holds $(live dbsize))"
  ;;
*)
  echo "usage: $0 backup|restore <file.rdb>" >&2
  exit 2
  ;;
esac
