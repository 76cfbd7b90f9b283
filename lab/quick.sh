#!/usr/bin/env bash
# Runs every lab scenario for seconds (`tailguard lab all --quick`) so CI keeps the lab
# working: the generator, the upstream, the runner and each scenario file. Conditions whose
# gateway feature has not landed are skipped with a message, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The axum apps of the axum-scrape scenario are found beside the tailguard binary.
# `--workspace --all-targets` resolves features as `cargo test --workspace` does, so after
# the tests (as in .ci/run) this only links: building the two packages alone resolved other
# features and recompiled ~80 s of dependencies on the 2-core CI machine.
cargo build --workspace --all-targets
exe=target/debug/tailguard
out=target/lab/quick
rm -rf "$out"
mkdir -p "$out"
# Generator sanity: a direct constant-rate run against the built-in upstream.
"$exe" upstream --listen 127.0.0.1:0 --threads 1 > "$out/upstream.out" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q '^listening on ' "$out/upstream.out" 2>/dev/null && break; sleep 0.1; done
addr=$(sed -n 's/^listening on //p' "$out/upstream.out")
"$exe" load "http://$addr/" --rate 500 --duration 2s --connections 4 --brief \
  --json "$out/direct.json" --hgrm "$out/direct.hgrm" --plot "$out/direct.svg"
grep -Eq '"completed": ?1000[,}]' "$out/direct.json"
kill $up; trap - EXIT
# About 3 min on the 2-vCPU machine (14 scenarios); the bound only stops a hung run.
timeout 480 "$exe" lab all --quick --out "$out"
