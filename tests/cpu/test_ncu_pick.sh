#!/usr/bin/env bash
# test_ncu_pick.sh — lab/ncu_pick.sh with a stand-in for ncu: which launch it picks from the listing
# (the first of at least MIN_US on the grid asked, whatever unit ncu scaled each row to), that the
# profile skips exactly the launches before it, and that no match or a bad command line profiles
# nothing.
set -u
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '    %s\n' "$@"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"

# ncu's CSV as `--csv --metrics gpu__time_duration.sum` prints it: a header, then a row a launch
cat >"$tmp/listing.csv" <<'EOF'
==PROF== Connected to process 1 (bench)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","bench","h","mt_refresh_tensor_store_bf16","1","13","(64, 4, 1)","(224, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.20"
"1","1","bench","h","mt_refresh_tensor_store_bf16","1","13","(64, 4, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","8.61"
"2","1","bench","h","mt_refresh_tensor_store_bf16","1","13","(32, 8, 1)","(16, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","286.78"
"3","1","bench","h","mt_refresh_tensor_store_bf16","1","13","(64, 4, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","216,032"
"4","1","bench","h","mt_refresh_tensor_store_bf16","1","13","(64, 4, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","215.26"
EOF
cat >"$tmp/bin/ncu" <<EOF
#!/usr/bin/env bash
case " \$* " in
*" --csv --clock-control none --metrics "*) cat "$tmp/listing.csv" ;;
*" --launch-skip "*)
  echo "\$*" >"$tmp/profiled"
  while [ \$# -gt 0 ]; do [ "\$1" = -o ] && : >"\$2.ncu-rep"; shift; done ;;
*" -i "*) echo report ;;
esac
EOF
chmod +x "$tmp/bin/ncu"
pick() { OUT=$tmp/out PATH=$tmp/bin:$PATH lab/ncu_pick.sh "$@" >"$tmp/log" 2>&1; }

rm -f "$tmp/profiled"
if pick mt_refresh_tensor 100 32 -- bench --only qwen3 &&
  [ "$(cat "$tmp/out/pick.txt")" = "3 216.0 (32, 1, 1)" ] &&
  grep -q -- "--launch-skip 3 --launch-count 1 .* bench --only qwen3" "$tmp/profiled"; then
  ok first_long_launch_on_the_grid_in_any_unit
else bad first_long_launch_on_the_grid_in_any_unit "$(cat "$tmp/log")" \
  "pick: $(cat "$tmp/out/pick.txt" 2>/dev/null)"; fi

rm -f "$tmp/profiled"
if pick mt_refresh_tensor 100 any -- bench && [ "$(cut -d' ' -f1 "$tmp/out/pick.txt")" = 0 ] &&
  grep -q -- "--launch-skip 0 " "$tmp/profiled"; then ok any_grid_takes_the_first_long_launch
else bad any_grid_takes_the_first_long_launch "$(cat "$tmp/log")"; fi

rm -f "$tmp/profiled"
if ! pick mt_refresh_tensor 300 32 -- bench && [ ! -e "$tmp/profiled" ] &&
  grep -q "no launch of at least 300" "$tmp/log"; then
  ok no_match_profiles_nothing
else bad no_match_profiles_nothing "$(cat "$tmp/log")"; fi

pick mt_refresh_tensor 100 32 bench
if [ $? -eq 2 ] && grep -q usage "$tmp/log"; then ok usage_without_the_separator
else bad usage_without_the_separator "$(cat "$tmp/log")"; fi
echo "#mt-counts $pass $fail 0"
[ "$fail" -eq 0 ]
