#!/usr/bin/env bash
# Links the app's AndroidManifest.xml and res/ with aapt2 against Debian's framework-res.apk (API 29), the one
# Android build step this machine can run. Usage: lint-resources.sh OUT_DIR
set -euo pipefail
APP=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: lint-resources.sh OUT_DIR}
FRAMEWORK=/usr/share/android-framework-res/framework-res.apk
rm -rf "$OUT" && mkdir -p "$OUT"
# AGP 8 manifests have no package attribute (the namespace is in build.gradle.kts); aapt2 link needs one
NAMESPACE=$(sed -n 's/^ *namespace = "\(.*\)"/\1/p' "$APP/build.gradle.kts")
sed "s/<manifest /<manifest package=\"$NAMESPACE\" /" "$APP/src/main/AndroidManifest.xml" >"$OUT/AndroidManifest.xml"
aapt2 compile --dir "$APP/src/main/res" -o "$OUT/res.zip"
aapt2 link -o "$OUT/app-resources.apk" -I "$FRAMEWORK" --manifest "$OUT/AndroidManifest.xml" \
  --min-sdk-version 26 --target-sdk-version 29 --java "$OUT/gen" "$OUT/res.zip"
# every R.id / R.string / R.layout the Kotlin sources use must exist in the generated R class
R_JAVA="$OUT/gen/${NAMESPACE//.//}/R.java"
REFS=$(grep -rhoE 'R\.(id|string|layout)\.[A-Za-z_0-9]+' "$APP/src/main/kotlin" | sort -u)
[ -n "$REFS" ] || { echo "no R references found in app/src/main/kotlin"; exit 1; }
for ref in $REFS; do
  kind=$(echo "$ref" | cut -d. -f2); name=$(echo "$ref" | cut -d. -f3)
  awk -v k="class $kind " -v n="int $name=" 'index($0, k){c=1} c && index($0, n){f=1} END{exit !f}' "$R_JAVA" \
    || { echo "$ref is used in app/src/main/kotlin but not defined in res/"; exit 1; }
done
