#!/usr/bin/env bash
# test_generated.sh — the generated headers in the tree (kernels/wgmma.cuh, kernels/wgmma_rs.cuh)
# are kernels/wgmma_gen.py's output as `make format` leaves it, and its --check says so when one is
# not (checked on a copy of the generator and headers, one of them edited).
set -u
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '    %s\n' "$@"; fail=$((fail + 1)); }
py=${PYTHON:-python3}

if out=$("$py" kernels/wgmma_gen.py --check 2>&1); then ok headers_are_the_generators_output
else bad headers_are_the_generators_output "$out"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels"
cp .clang-format "$tmp/"
cp kernels/.clang-format kernels/wgmma_gen.py kernels/wgmma.cuh kernels/wgmma_rs.cuh "$tmp/kernels/"
"$py" "$tmp/kernels/wgmma_gen.py" --check >/dev/null 2>&1
clean=$?
sed -i '0,/wgmma.mma_async/s//wgmma.mma_async.edited/' "$tmp/kernels/wgmma_rs.cuh"
out=$("$py" "$tmp/kernels/wgmma_gen.py" --check 2>&1)
edited=$?
if [ "$clean" = 0 ] && [ "$edited" = 1 ] &&
   [[ $out == *wgmma_rs.cuh* ]]; then ok check_names_an_edited_header
else bad check_names_an_edited_header "copy: exit $clean, edited: exit $edited: $out"; fi

echo "#mt-counts $pass $fail 0"
[ "$fail" = 0 ]
