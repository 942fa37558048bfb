#!/usr/bin/env bash
# check_headers.sh: the public headers stand alone. Every header in
# include/moetune/ includes only standard headers and its siblings, none by
# a path starting with "../", and compiles by itself as C11 (and as C++,
# when a C++ compiler is there) with nothing but -I include; and no file of
# the library's own folders (api/, examples/, tests/api/) includes by
# "../" either. Usage: check_headers.sh SOURCE_DIR [CC]
set -euo pipefail
cd "$1"
cc=${2:-cc}
fail=0
for h in include/moetune/*.h; do
  while IFS= read -r inc; do
    name=${inc#*[\"<]}
    name=${name%[\">]*}
    case "$inc" in
      *'"'*) if [ ! -f "include/moetune/$name" ]; then
               echo "check_headers.sh: $h includes \"$name\", not a sibling" >&2
               fail=1
             fi ;;
      *) case "$name" in
           stdint.h|stddef.h|stdbool.h) ;;
           *) echo "check_headers.sh: $h includes <$name>" >&2; fail=1 ;;
         esac ;;
    esac
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$h")
  echo "#include \"${h#include/}\"" | "$cc" -std=c11 -Wall -Wextra -Werror -pedantic \
    -fsyntax-only -I include -x c - || fail=1
  if command -v c++ >/dev/null 2>&1; then
    echo "#include \"${h#include/}\"" | c++ -Wall -Wextra -Werror -fsyntax-only -I include \
      -x c++ - || fail=1
  fi
done
hits=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]\.\./' include api examples \
       tests/api || true)
if [ -n "$hits" ]; then
  echo "check_headers.sh: includes by a path starting with ../:" >&2
  echo "$hits" >&2
  fail=1
fi
[ $fail -eq 0 ] && echo "check_headers.sh: the public headers stand alone"
exit $fail
