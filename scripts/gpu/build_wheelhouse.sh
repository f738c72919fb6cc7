#!/usr/bin/env bash
# The wheels one vLLM release needs on the offline GPU machine (Python 3.12, CUDA 13.0 image),
# downloaded on a connected machine and split into parts small enough to send one per transfer:
#
#   scripts/gpu/build_wheelhouse.sh RELEASE [OUT_DIR] [PART_MIB]
#
# RELEASE picks scripts/gpu/requirements-vllm-RELEASE.txt (0.34.0: vLLM 0.34.0, torch 2.14.0,
# Triton 3.8.0, FlashInfer 0.7.4, NIXL 1.5.1, lm-eval 0.4.13; 0.26.0: the release the image's own
# torch 2.11 runs). OUT_DIR (default .gpu-carry, git-ignored) receives p00/, p01/, ... each with
# one part, and MANIFEST.txt (sizes, the sha256 of the whole). PART_MIB defaults to 63: a part
# plus a one-file tree stays under a 64 MiB transfer. On the GPU machine, with the parts in
# /tmp/parts: `source scripts/gpu/offline_env.sh RELEASE`.
#
# The wheels travel as they are (a tar of them): they are zip files already, and xz gained 2 %
# on NCCL's (206 -> 201 MB) in two minutes of two cores, so the set is not repacked.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
release=${1:?usage: build_wheelhouse.sh RELEASE [OUT_DIR] [PART_MIB]}
out=${2:-.gpu-carry}
part_mib=${3:-63}
reqs=$here/requirements-vllm-$release.txt
[ -f "$reqs" ] || { echo "build_wheelhouse: no $reqs (releases: $(ls "$here" | sed -n 's/^requirements-vllm-\(.*\)\.txt$/\1/p' | xargs))" >&2; exit 2; }
work=${WHEELHOUSE_WORK:-/tmp/gpu-wheelhouse-$release}
mkdir -p "$work/wheels" "$work/built"
plat=(--platform any --platform manylinux1_x86_64 --platform manylinux2010_x86_64
      --platform manylinux2014_x86_64)
for n in 5 12 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35; do
  plat+=(--platform "manylinux_2_${n}_x86_64")    # pip matches each tag exactly
done
sdist_only="sqlitedict word2number rouge-score"     # published only as sdists: built here
binary=$(grep -v -E '^[[:space:]]*(#|$)' "$reqs" | grep -v -E "^($(echo $sdist_only | tr ' ' '|'))==")
echo "downloading $(echo "$binary" | wc -l) wheels into $work/wheels" >&2
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$work/wheels" $binary
# shellcheck disable=SC2046
python3 -m pip wheel -q --no-deps -w "$work/built" $(grep -E "^($(echo $sdist_only | tr ' ' '|'))==" "$reqs")
packed=$work/wheels.tar
tar -C "$work" -cf "$packed" wheels built
rm -rf "$out" && mkdir -p "$out"
(cd "$out" && split -b $((part_mib * 1024 * 1024)) -d -a 2 "$packed" part.)
for p in "$out"/part.*; do n=${p##*.}; mkdir -p "$out/p$n"; mv "$p" "$out/p$n/"; done
ls -l "$out"/p*/part.* | awk '{print $5, $9}' > "$out/MANIFEST.txt"
sha256sum "$packed" | cut -d' ' -f1 >> "$out/MANIFEST.txt"
echo "$(ls -d "$out"/p* | wc -l) parts ($(du -sh "$packed" | cut -f1)) in $out for vLLM $release" >&2
