#!/usr/bin/env bash
# device_stage.sh — prepares, on a machine with the project's Debian packages
# (scripts/setup.sh), what scripts/device_check.sh needs on a GPU machine whose image has
# CUDA, CMake, ninja and a C++ compiler but none of the project's libraries, and which can
# reach no network.
#
#   scripts/device_stage.sh [--piece MiB] [--app BUILD_DIR] [MODEL...]
#
# It writes two ignored folders in the repository root:
#   .devdeps/          headers of CLI11, nlohmann/json, GoogleTest and PCRE2, the static
#                      GoogleTest and PCRE2 libraries and GoogleTest's CMake package, laid
#                      out like /usr so that CMAKE_PREFIX_PATH and CPATH find them;
#   .devmodel/NN/      the models' .gguf files (MODEL: smollm2-135m, the default, and/or
#                      gemma3-270m) cut into pieces of at most --piece MiB (default 52), one
#                      piece per numbered folder, so that each folder fits one transfer to a
#                      machine that takes a limited amount at a time. device_check.sh joins
#                      the pieces it finds and checks each model's pinned sha256.
#   .devapp/           with --app: BUILD_DIR's kvscope (built with the app and CUDA for the
#                      GPU's architecture), its shaders, the shared libraries it loads that
#                      are neither glibc's, the compiler's nor CUDA's (and libGL/libGLX,
#                      which Dear ImGui opens at run time), and DejaVu Sans, for
#                      the headless capture on the GPU (device_check.sh's capture stage).
# It prints the folders in the order they should travel.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
piece=52
models=()
app_build=
while [ $# -gt 0 ]; do
  case "$1" in
    --piece) piece=$2; shift 2 ;;
    --app) app_build=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    smollm2-135m|gemma3-270m) models+=("$1"); shift ;;
    *) echo "device_stage: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[ ${#models[@]} -gt 0 ] || models=(smollm2-135m)

arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
deps=$root/.devdeps
rm -rf "$deps"
mkdir -p "$deps/include" "$deps/lib/$arch/cmake"
for h in CLI nlohmann gtest gmock pcre2.h; do
  [ -e "/usr/include/$h" ] || { echo "device_stage: /usr/include/$h is missing: run scripts/setup.sh first" >&2; exit 1; }
  cp -r "/usr/include/$h" "$deps/include/"
done
for l in libgtest.a libgtest_main.a libgmock.a libgmock_main.a libpcre2-8.a; do
  cp "/usr/lib/$arch/$l" "$deps/lib/$arch/"
done
cp -r "/usr/lib/$arch/cmake/GTest" "$deps/lib/$arch/cmake/"
echo ".devdeps: $(du -sh "$deps" | cut -f1)"

path_of() {
  case "$1" in
    smollm2-135m) echo "$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    gemma3-270m) echo "$root/assets/models/gemma-3-270m-q4_k_m.gguf" ;;
  esac
}
rm -rf "$root/.devmodel"
n=0
for m in "${models[@]}"; do
  f=$(path_of "$m")
  [ -f "$f" ] || "$root/scripts/fetch_model.sh" "$m"
  tmp=$(mktemp -d)
  split -b "${piece}M" -d -a 2 "$f" "$tmp/$(basename "$f").part-"
  for p in "$tmp"/*; do
    n=$((n + 1))
    dir=$root/.devmodel/$(printf %02d $n)
    mkdir -p "$dir"
    mv "$p" "$dir/"
    echo ".devmodel/$(printf %02d $n): $(basename "$p") ($(du -m "$dir/$(basename "$p")" | cut -f1) MiB)"
  done
  rmdir "$tmp"
done

if [ -n "$app_build" ]; then
  exe=$app_build/app/kvscope
  [ -x "$exe" ] || { echo "device_stage: $exe is missing" >&2; exit 1; }
  "$exe" --help 2>/dev/null | grep -q -- "--screenshot" ||
    { echo "device_stage: $exe was built without the app" >&2; exit 1; }
  app=$root/.devapp
  rm -rf "$app"
  mkdir -p "$app/lib"
  cp "$exe" "$app/"
  cp -r "$app_build/app/shaders" "$app/"
  ldd "$exe" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      libcuda.so*|libcublas*|libcudart*) ;;
      *) cp -L "$path" "$app/lib/$name" ;;
    esac
  done
  # Loaded at run time rather than linked: Dear ImGui's OpenGL loader opens libGL.so.1,
  # which goes through libGLX to the driver's vendor library.
  for l in libGL.so.1 libGLX.so.0; do
    [ -e "/usr/lib/$arch/$l" ] && cp -L "/usr/lib/$arch/$l" "$app/lib/"
  done
  font=$(ls /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf 2>/dev/null || true)
  [ -n "$font" ] && cp "$font" "$app/"
  echo ".devapp: $(du -sh "$app" | cut -f1) ($(ls "$app/lib" | tr '\n' ' '))"
fi
