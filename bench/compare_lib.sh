# Helpers the side-by-side scripts of bench/ share (sourced, not run).

# field FILE KEY: the value after "KEY " on the last line that starts with it.
field() { awk -v key="$2" '$1 == key { print $2 }' "$1" | tail -n 1; }
# stats V...: "median M (min A, max B, spread S%)", spread = (max - min) / median.
stats() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "median %.1f (min %.1f, max %.1f, spread %.1f%%)", m, v[1], v[NR], 100 * (v[NR] - v[1]) / m }'
}
# median V...: the median of the values.
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
