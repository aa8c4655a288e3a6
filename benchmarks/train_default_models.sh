#!/usr/bin/env bash
# Re-fit the embedded default model set (models/default) from scratch, reproducibly (seed 0):
# every dataset `opcast collect replay` makes from ../shared/published, plus our own collected
# datasets in data/datasets. Run from anywhere:  bash benchmarks/train_default_models.sh [PUBLISHED]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
published="${1:-$repo/../shared/published}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for source in neusight vidur estimate-train-time; do
  opcast collect replay "$source" "$published/$source" --out "$work/published" --json > /dev/null
done
cd "$repo"  # so that meta.json records repo-relative paths
time opcast train fit "$work/published" data/datasets --out models --name default --seed 0 --jobs 2
