#!/usr/bin/env bash
# install_check.sh: libmoetune as a program outside the tree sees it.
# Installs the build into a fresh prefix (cmake --install --prefix), then,
# with nothing but what the prefix holds:
#   - compiles examples/moe_example.c with `cc` and `pkg-config --cflags
#     --libs moetune` (plus -lm for its own reference) and runs the GLM-5.2
#     MoE layer on cpu and on emu (4 tokens each) against the example's
#     plain C reference;
#   - compiles the C example in docs/LIBRARY.md (examples/quickstart.c, which
#     must be the same text) against the shared library and against
#     libmoetune.a (`pkg-config --static`), and runs both;
#   - builds it again with CMake's find_package(moetune);
#   - runs the Python example in docs/LIBRARY.md on the installed package
#     (skipped without torch).
# Usage: install_check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moetune-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
step() { echo "== install_check: $*"; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(dirname "$(find "$prefix" -name moetune.pc -path '*pkgconfig*' | head -1)")
libdir=${libdir%/pkgconfig}
export PKG_CONFIG_PATH=$libdir/pkgconfig
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for f in include/moetune/moetune.h "${libdir#$prefix/}/libmoetune.so.1" \
         "${libdir#$prefix/}/libmoetune.a" "${libdir#$prefix/}/cmake/moetune/moetuneConfig.cmake"; do
  [ -e "$prefix/$f" ] || { echo "install_check: $f is not installed" >&2; exit 1; }
done
echo "pkg-config --cflags --libs moetune: $(pkg-config --cflags --libs moetune)"

# The docs' C example must be examples/quickstart.c itself.
awk '/^```c$/{on=1;next} /^```$/{if(on)exit} on' "$src/docs/LIBRARY.md" >"$work/doc_example.c"
if ! diff -u "$src/examples/quickstart.c" "$work/doc_example.c"; then
  echo "install_check: docs/LIBRARY.md's C example differs from examples/quickstart.c" >&2
  exit 1
fi

step "examples/moe_example.c with cc and pkg-config"
cc -std=c11 -O2 -Wall -Wextra -Werror "$src/examples/moe_example.c" \
   $(pkg-config --cflags --libs moetune) -lm -o "$work/moe_example"
"$work/moe_example" cpu glm5.2 4
"$work/moe_example" emu glm5.2 4

step "the docs' C example, shared and static"
cc -std=c11 -Wall -Wextra -Werror "$work/doc_example.c" $(pkg-config --cflags --libs moetune) \
   -o "$work/quickstart"
"$work/quickstart" >"$work/quickstart.out"
grep -q "^summary:" "$work/quickstart.out"
cc -std=c11 -Wall -Wextra -Werror "$work/doc_example.c" $(pkg-config --cflags moetune) \
   "$libdir/libmoetune.a" $(pkg-config --static --libs moetune | sed 's/-lmoetune//') \
   -o "$work/quickstart_static"
if ldd "$work/quickstart_static" | grep -q libmoetune; then
  echo "install_check: the static build still loads libmoetune.so" >&2
  exit 1
fi
"$work/quickstart_static" | grep -q "^summary:"
leaked=$(nm -g --defined-only "$work/quickstart_static" | awk '{print $3}' \
         | grep -E '^(mt|dev|db|kern|model|moe)_' | head -5 || true)
if [ -n "$leaked" ]; then
  echo "install_check: libmoetune.a exports internal names: $leaked" >&2
  exit 1
fi

step "find_package(moetune)"
mkdir -p "$work/cmake-app"
cp "$work/doc_example.c" "$work/cmake-app/quickstart.c"
cat >"$work/cmake-app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(quickstart C)
find_package(moetune 0.1 REQUIRED)
add_executable(quickstart quickstart.c)
target_link_libraries(quickstart PRIVATE moetune::moetune)
CMAKE
cmake -S "$work/cmake-app" -B "$work/cmake-app/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$work/cmake-app.log"
cmake --build "$work/cmake-app/build" >>"$work/cmake-app.log"
"$work/cmake-app/build/quickstart" | grep -q "^summary:"

step "the docs' Python example on the installed package"
awk '/^```python$/{on=1;next} /^```$/{if(on)exit} on' "$src/docs/LIBRARY.md" >"$work/doc_example.py"
pydir=$(dirname "$(find "$prefix" -name __init__.py -path '*moetune*' | head -1)")
py=""
for cand in "${MOETUNE_PYTHON:-}" /usr/bin/python3 python3; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null \
    && { py=$cand; break; }
done
if [ -n "$py" ]; then
  (cd "$work" && env -u MOETUNE_LIBRARY PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$(dirname "$pydir")" "$py" doc_example.py)
else
  echo "install_check: no Python with torch; the Python example is skipped"
fi
step "ok"
