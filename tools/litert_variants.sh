#!/usr/bin/env bash
# Every structural variant of the test suite (both hub layouts, both drafter heads, e2b/e4b, k_eq_v) and the
# e2b-wide shape through the LiteRT path: `mtpkit make-tiny`, a float `--backend litert` export (graph check
# against PyTorch included) and `mtpkit parity --backend litert`. A report run by hand (minutes per variant);
# CI runs two of the variants (tests/conftest.py LITERT_VARIANTS).
#
#     tools/litert_variants.sh OUT        # OUT/summary.txt: one "<variant> rc=<exit>" line each; OUT/*-parity.json
set -uo pipefail
out=${1:?usage: tools/litert_variants.sh OUT}
mtpkit=${MTPKIT:-mtpkit}
mkdir -p "$out" && cd "$out" && : > summary.txt
flags=(--backend litert --max-cache-len 256 --prefill-len 16 --max-draft 8 --force)
while read -r name spec; do
  # shellcheck disable=SC2086  # spec is a list of make-tiny flags
  { $mtpkit make-tiny "$name" $spec --force &&
    $mtpkit export "$name/target" --drafter "$name/drafter" --out "$name-lite" "${flags[@]}" &&
    $mtpkit parity "$name-lite" --backend litert --json "$name-parity.json"; } > "$name.log" 2>&1
  echo "$name rc=$?" | tee -a summary.txt
done <<'VARIANTS'
e2b_gemma4_centroid --shape e2b --layout gemma4 --head centroid
e4b_text_dense_kv_eq --shape e4b --layout gemma4_text --head dense --k-eq-v
e2b_text_kv_eq --shape e2b --layout gemma4_text --head centroid --k-eq-v
e2b_wide --shape e2b-wide
VARIANTS
