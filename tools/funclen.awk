# funclen.awk - lengths of the C functions of the files given, for the
# 80-line limit: awk -f tools/funclen.awk base/*.c codec/*.c engine/*.c tiers/*.c io/*.c | sort -rn
# Prints "lines file:line name" for every top-level function definition:
# a line in column 0 that opens a parameter list, up to the "}" in column 0.
/^[A-Za-z_].*\(/ && !/;[[:space:]]*$/ && !/^(typedef|struct|enum|union|#)/ && !infn {
  start = FNR; name = $0; sub(/\(.*/, "", name); n = split(name, w, /[ *]+/); name = w[n]; cand = 1
}
cand && /\{[[:space:]]*(\/\*.*\*\/[[:space:]]*)?$/ { infn = 1; cand = 0 }
cand && /;[[:space:]]*$/ { cand = 0 }
infn && /^\}/ { print FNR - start + 1, FILENAME ":" start, name; infn = 0 }
