#!/usr/bin/env bash
# redis_cluster.sh - a throwaway Redis Cluster on loopback ports for the
# remote-tier tests (io/rcluster.c), and for trying it by hand:
#   tests/redis_cluster.sh start DIR [BASEPORT] [MASTERS] [REPLICAS_PER_MASTER]
#   tests/redis_cluster.sh stop  DIR
# start makes MASTERS*(1+REPLICAS) nodes on ports BASEPORT.. (default from
# KVT_REDIS_PORT, else 7100; 3 masters, 1 replica each), joins them with
# `redis-cli --cluster create` and waits until every node says
# cluster_state:ok. Env KVT_REDIS_TEST_PASSWORD sets requirepass (and
# masterauth) on every node and adds an ACL user `kvt` with the same
# password. A failed start stops what it started. stop kills the nodes
# recorded in DIR and removes DIR's node files. Exit 77 (skip) when
# redis-server or redis-cli is not installed.
set -euo pipefail

usage() { echo "usage: $0 start DIR [BASEPORT] [MASTERS] [REPLICAS] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2
base=${3:-${KVT_REDIS_PORT:-7100}}
masters=${4:-3}
replicas=${5:-1}
pw=${KVT_REDIS_TEST_PASSWORD:-}

cli() { # cli PORT args...: redis-cli on a node, the password through the environment
  local p=$1; shift
  if [ -n "$pw" ]; then
    REDISCLI_AUTH="$pw" redis-cli -h 127.0.0.1 -p "$p" "$@"
  else
    redis-cli -h 127.0.0.1 -p "$p" "$@"
  fi
}

stop_nodes() {
  [ -d "$dir" ] || return 0
  local f pid
  for f in "$dir"/*/redis.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    # SIGCONT first: a test may have left a node stopped (SIGSTOP)
    [ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null || true
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  done
  for f in "$dir"/*/redis.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    for _ in $(seq 50); do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
  rm -rf "${dir:?}"/[0-9]*
}

case "$cmd" in
  start)
    for b in redis-server redis-cli; do
      if ! command -v "$b" >/dev/null; then
        echo "redis_cluster: $b not installed (apt-get install redis-server): skipped" >&2
        exit 77
      fi
    done
    mkdir -p "$dir"
    stop_nodes # leftovers of an earlier run in the same DIR
    trap 'rc=$?; [ $rc -eq 0 ] || stop_nodes; exit $rc' EXIT
    n=$((masters * (1 + replicas)))
    addrs=()
    for i in $(seq 0 $((n - 1))); do
      p=$((base + i))
      if cli "$p" ping >/dev/null 2>&1; then
        echo "redis_cluster: port $p is in use (set KVT_REDIS_PORT)" >&2
        exit 1
      fi
      d="$dir/$p"
      mkdir -p "$d"
      # a config file rather than arguments: the password stays out of ps
      {
        echo "port $p"
        echo "bind 127.0.0.1"
        echo "cluster-enabled yes"
        echo "cluster-config-file nodes.conf"
        echo "cluster-node-timeout 2000"
        # the masters left keep serving their slots when one is down
        echo "cluster-require-full-coverage no"
        echo "appendonly no"
        echo "save ''"
        echo "daemonize yes"
        echo "dir $d"
        echo "pidfile $d/redis.pid"
        echo "logfile $d/redis.log"
        if [ -n "$pw" ]; then
          echo "requirepass $pw"
          echo "masterauth $pw"
          echo "user kvt on >$pw ~* &* +@all"
        fi
      } >"$d/redis.conf"
      chmod 600 "$d/redis.conf"
      redis-server "$d/redis.conf"
      addrs+=("127.0.0.1:$p")
    done
    for i in $(seq 0 $((n - 1))); do # wait until each answers
      for _ in $(seq 100); do
        cli $((base + i)) ping 2>/dev/null | grep -q PONG && break
        sleep 0.1
      done
    done
    cli "$base" --cluster create "${addrs[@]}" --cluster-replicas "$replicas" \
      --cluster-yes >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; exit 1; }
    for i in $(seq 0 $((n - 1))); do
      ok=0
      for _ in $(seq 300); do
        if cli $((base + i)) cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
          ok=1; break
        fi
        sleep 0.1
      done
      if [ $ok -ne 1 ]; then
        echo "redis_cluster: node $((base + i)) never reached cluster_state:ok" >&2
        exit 1
      fi
    done
    echo "redis_cluster: $n nodes up on 127.0.0.1:$base..$((base + n - 1))" >&2
    ;;
  stop)
    stop_nodes
    ;;
  *) usage ;;
esac
