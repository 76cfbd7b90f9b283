#!/usr/bin/env bash
# Interleaved A/B of CPU per proxied request between tailguard binaries.
#   R=6 D=3 bash ab.sh old=/path/to/tailguard-a new=/path/to/tailguard-b
# Each round runs every binary once (D seconds of wrk, 50 connections, one worker pinned to
# core 0, wrk and the upstream on core 1) via ../2026-11-22-proxy-cpu/cpu-per-request.sh,
# then prints per binary the run with the least CPU per request (the quietest moment of a
# shared host) and the median run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
R=${R:-6}; D=${D:-3}
out=$(mktemp)
for _ in $(seq "$R"); do
  for pair in "$@"; do
    name=${pair%%=*}; exe=${pair#*=}
    EXE=$exe D=$D bash "$here/../2026-11-22-proxy-cpu/cpu-per-request.sh" 2>&1 | sed "s/^/$name /" | tee -a "$out"
  done
done
for pair in "$@"; do
  name=${pair%%=*}
  grep "^$name " "$out" | awk '{split($3,r,"=");split($4,u,"=");split($5,s,"=");split($6,t,"="); print r[2], u[2], s[2], t[2]}' | sort -k4 -n |
    awk -v b="$name" '{rq[NR]=$1;u[NR]=$2;s[NR]=$3;t[NR]=$4} END{m=int((NR+1)/2); printf "%-6s least CPU: req/s=%s user=%s sys=%s total=%s us | median: req/s=%s user=%s sys=%s total=%s us (n=%d)\n", b, rq[1],u[1],s[1],t[1], rq[m],u[m],s[m],t[m], NR}'
done
rm -f "$out"
