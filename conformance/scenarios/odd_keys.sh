# Keys and values with unusual bytes (everything etcdctl can pass through argv).
keys=( "with space" $'new\nline' $'tab\there' "ünïcødé/ключ" $'\x01ctrl' $'\x7f' $'\xff' $'\xff\xff' $'\xfe\xff' "/" "//" "a/" "a/b" )
for k in "${keys[@]}"; do $ETCDCTL put "$k" "v" >/dev/null || echo "setup put failed"; done
section 'all keys (byte order), base64'
e get --prefix "" -w json
section 'single odd keys'
e get "with space" -w json
e get $'new\nline' -w json
e get "ünïcødé/ключ" -w json
section 'prefix ending in 0xff (range_end computed by stripping 0xff bytes)'
e get --prefix $'\xff' -w json
e get --prefix $'\xfe' -w json
e get --prefix $'\xfe\xff' -w json
section 'prefix with a multi-byte UTF-8 prefix'
e get --prefix "ü" -w json
section 'odd values'
e put v1 $'line1\nline2'
e put v2 $'\xff\xfe binary'
e get v1 -w json
e get v2 -w json
section 'long key (3000 bytes) and long value (100 KiB)'
longkey=$(printf 'k%.0s' $(seq 1 3000))
x $ETCDCTL put "$longkey" v
x $ETCDCTL get "$longkey" --print-value-only
python3 -c 'import sys; sys.stdout.write("v" * 102400)' >"$SCENARIO_TMP/v100k"
x $ETCDCTL put big100k <"$SCENARIO_TMP/v100k"
$ETCDCTL get big100k --print-value-only | wc -c
section 'simple output prints raw keys'
e get a/ --prefix
