#!/usr/bin/env bash
# JVM tests of android_demo: builds core + desktop with kotlinc and runs the JUnit 5 tests against an ONNX export
# of the trained tiny pair (ONNX Runtime's C API through JNA). Installs what it needs (apt, npm); prints one
# "android_demo: N passed, N failed" line and exits non-zero on any failure. Needs .venv (made by .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO=$ROOT/android_demo
BUILD=$DEMO/build
KOTLIN_VERSION=2.4.20
K=$DEMO/.tools/node_modules/kotlin-compiler
J=/usr/share/java
mkdir -p "$BUILD"

# --- tools: JDK, JUnit 5, JNA, aapt2 + framework-res (Debian); kotlinc (npm) -------------------------------
APT_PACKAGES="default-jdk-headless junit5 libjna-java aapt android-framework-res"
need_apt() {
  command -v java >/dev/null && command -v aapt2 >/dev/null && [ -f $J/junit-platform-console-standalone.jar ] \
    && [ -f $J/jna.jar ] && [ -f /usr/share/android-framework-res/framework-res.apk ] && return 1
  return 0
}
if need_apt; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q --no-install-recommends $APT_PACKAGES >/dev/null \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends $APT_PACKAGES >/dev/null; }
fi
if [ "$(cat "$K/package.json" 2>/dev/null | grep -o "\"version\": *\"$KOTLIN_VERSION\"")" = "" ]; then
  npm install --silent --prefix "$DEMO/.tools" --no-audit --no-fund "kotlin-compiler@$KOTLIN_VERSION" >/dev/null
fi
ORT_LIB=$(.venv/bin/python -c 'import glob, os, onnxruntime as o; print(sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so.*")))[0])')

# --- the export under test: remade only when the pair, the exporter or the runtime changed ------------------
EXPORT=$BUILD/tiny_export
STAMP=$(find export runtime mtpkit/tiny/assets/tiny_pair -type f -not -path '*/__pycache__/*' -print0 | sort -z \
  | xargs -0 sha256sum | sha256sum | cut -c1-64)
if [ ! -f "$EXPORT/manifest.json" ] || [ "$(cat "$BUILD/tiny_export.stamp" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$EXPORT" "$BUILD/quantized"
  .venv/bin/mtpkit -q export mtpkit/tiny/assets/tiny_pair/target --drafter mtpkit/tiny/assets/tiny_pair/drafter \
    --out "$EXPORT" --max-cache-len 256 >"$BUILD/export.log" 2>&1 || { cat "$BUILD/export.log"; exit 1; }
  # int8 target / int4 drafter, derived from the float export (what quant-report does; seconds, not an export)
  .venv/bin/python -c 'import sys; from pathlib import Path; from mtpkit.export.quant_report import derive_quantized
derive_quantized(Path(sys.argv[1]), Path(sys.argv[2]), ("int8", "int4"), 32)' "$EXPORT" "$BUILD/quantized" \
    >>"$BUILD/export.log" 2>&1 || { cat "$BUILD/export.log"; exit 1; }
  echo "$STAMP" >"$BUILD/tiny_export.stamp"
fi
QEXPORT=$BUILD/quantized/int8-int4

# --- build: core alone (no JNA, no Android on its classpath), then desktop, then both test sets --------------
kc() { "$K/bin/kotlinc" -jvm-target 17 -nowarn "$@" 2>&1 | { grep -v '^warning:' || true; }; }
TEST_CP=$J/junit-jupiter-api.jar:$J/apiguardian-api.jar:$J/opentest4j.jar:$J/junit-platform-commons.jar
rm -f "$BUILD"/*.jar
kc "$DEMO/core/src/main/kotlin" -d "$BUILD/core.jar"
kc "$DEMO/desktop/src/main/kotlin" -cp "$BUILD/core.jar:$J/jna.jar" -d "$BUILD/desktop.jar"
kc "$DEMO/core/src/test/kotlin" "$DEMO/desktop/src/test/kotlin" \
  -cp "$BUILD/core.jar:$BUILD/desktop.jar:$J/jna.jar:$TEST_CP" -d "$BUILD/tests.jar"
for jar in core desktop tests; do [ -f "$BUILD/$jar.jar" ] || { echo "android_demo: kotlinc failed ($jar)"; exit 1; }; done

# --- checks outside JUnit: core stays platform-free; the app's manifest and res/ link with aapt2 ------------
passed=0; failed=0
check() { if "$@" >"$BUILD/check.log" 2>&1; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; cat "$BUILD/check.log"; fi; }
no_android_imports() { ! grep -rn 'import android\.' "$DEMO/core"; }
check no_android_imports
check "$DEMO/app/lint-resources.sh" "$BUILD/aapt2"

# --- JUnit 5 ---------------------------------------------------------------------------------------------
set +e
# A 1 MB young generation makes the JVM collect every few allocations, so a native buffer that the JIT considers
# dead while ONNX Runtime still reads it gets freed and shows as a parity failure (5 of 6 runs before the fix in
# OrtGraphSession.run), instead of as a rare SIGSEGV.
java -Xmx48m -Xmn1m -XX:+UseSerialGC -Dmtpkit.export="$EXPORT" -Dmtpkit.exportQuantized="$QEXPORT" -Dmtpkit.cli="$ROOT/.venv/bin/mtpkit" -Dmtpkit.ortLib="$ORT_LIB" \
  -jar $J/junit-platform-console-standalone.jar \
  -cp "$BUILD/core.jar:$BUILD/desktop.jar:$BUILD/tests.jar:$J/jna.jar:$K/lib/kotlin-stdlib.jar" \
  --scan-classpath "$BUILD/tests.jar" --fail-if-no-tests --disable-banner --disable-ansi-colors --details=tree \
  >"$BUILD/junit.log" 2>&1
junit_rc=$?
set -e
grep -E '✘|FAILED|Exception' "$BUILD/junit.log" | head -40 || true
read -r jp jf cf <<<"$(awk '/tests successful/{p=$2} /tests failed/{f=$2} /containers failed/{c=$2} END{print p+0, f+0, c+0}' "$BUILD/junit.log")"
passed=$((passed + jp)); failed=$((failed + jf + cf))
if [ "$junit_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; tail -20 "$BUILD/junit.log"; fi
echo "android_demo: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
