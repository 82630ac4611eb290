#!/usr/bin/env bash
# JVM tests of android_demo: builds core + desktop with kotlinc and runs the JUnit 5 tests against an ONNX export
# of the trained tiny pair (ONNX Runtime's C API through JNA); links the app's resources and compiles the app's
# Kotlin against Android API 23, the ONNX Runtime Android AAR and the LiteRT-LM / DJL compile stubs, at the versions
# gradle/libs.versions.toml pins (and fails if they differ). Installs what it needs (apt, npm, one Debian .deb kept
# under .tools); prints one "android_demo: N passed, N failed" line and exits non-zero on any failure. Needs .venv
# (made by .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO=$ROOT/android_demo
BUILD=$DEMO/build
K=$DEMO/.tools/node_modules/kotlin-compiler
J=/usr/share/java
mkdir -p "$BUILD"
passed=0; failed=0
check() { if "$@" >"$BUILD/check.log" 2>&1; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; cat "$BUILD/check.log"; fi; }
summary() { echo "android_demo: $passed passed, $failed failed"; }

# --- versions: gradle/libs.versions.toml is the one place; what the app compiles against follows it -----------
TOML=$DEMO/gradle/libs.versions.toml
STUBS=$DEMO/app/compile-stubs
toml_version() { sed -n "s/^$2 *= *\"\([^\"]*\)\".*/\1/p" "$1" | head -n 1; } # FILE KEY: that [versions] entry
KOTLIN_VERSION=$(toml_version "$TOML" kotlin)  # kotlinc here and the Kotlin Gradle plugin: one version
# The release a set of compile stubs mirrors: each file names it as "REPO vX.Y.Z" in its header; prints the one
# version they all name, or says which file names none or another one.
stub_version() { # DIR REPO
  local f v first="" first_file=""
  for f in $(find "$1" -name '*.kt' -o -name '*.java' | sort); do
    v=$(grep -o "$2 v[0-9][0-9A-Za-z.+-]*" "$f" | head -n 1 || true)
    [ -n "$v" ] || { echo "${f#"$DEMO"/} names no $2 release it mirrors"; return 1; }
    v=${v##* v}; first=${first:-$v}; first_file=${first_file:-$(basename "$f")}
    [ "$v" = "$first" ] || { echo "${f#"$DEMO"/} mirrors $2 $v, $first_file $first"; return 1; }
  done
  [ -n "$first" ] && echo "$first"
}
# TOML pins the versions of the APIs the app compiles against here: onnxruntime = the version of the ONNX Runtime
# AAR in use (read from the AAR when it was fetched), litertlm / djl = the releases STUBS' LiteRT-LM / DJL stubs
# mirror. One line per difference.
pin_differs() { echo "android_demo: $1 pins $2 ${3:-nothing}, but the app compiles against $4"; } # TOML KEY PIN API
versions_match() { # TOML STUBS
  local name=${1#"$DEMO"/} want have ok=0
  want=$(toml_version "$1" onnxruntime); have=$(cat "$ORT_DIR/VERSION" 2>/dev/null || true)
  [ "$want" = "$have" ] || { ok=1; pin_differs "$name" onnxruntime "$want" "the onnxruntime-android ${have:-?} AAR"; }
  want=$(toml_version "$1" litertlm)
  if ! have=$(stub_version "$2/com/google/ai/edge/litertlm" google-ai-edge/LiteRT-LM); then ok=1; echo "android_demo: $have"
  elif [ "$want" != "$have" ]; then ok=1; pin_differs "$name" litertlm "$want" "stubs of LiteRT-LM $have"; fi
  want=$(toml_version "$1" djl)
  if ! have=$(stub_version "$2/ai/djl" deepjavalibrary/djl); then ok=1; echo "android_demo: $have"
  elif [ "$want" != "$have" ]; then ok=1; pin_differs "$name" djl "$want" "stubs of DJL $have"; fi
  return $ok
}
# versions_match catches a difference on either side: each pinned version changed in a copy of the toml, and one
# LiteRT-LM stub naming another release in a copy of the stubs, must each fail it with a line naming the difference.
versions_mismatch_caught() {
  local key tmp=$BUILD/versions-check log=$BUILD/versions-check/log
  rm -rf "$tmp" && mkdir -p "$tmp" && cp -r "$STUBS" "$tmp/stubs"
  for key in onnxruntime litertlm djl; do
    sed "s/^\($key *= *\"\)[^\"]*\"/\10.0.0-other\"/" "$TOML" >"$tmp/libs.versions.toml"
    ! versions_match "$tmp/libs.versions.toml" "$STUBS" >"$log" || { echo "$key 0.0.0-other went unnoticed"; return 1; }
    grep -q "pins $key 0.0.0-other" "$log" || { echo "no line names $key:"; cat "$log"; return 1; }
  done
  sed -i "s#google-ai-edge/LiteRT-LM v[0-9][^ ]*#google-ai-edge/LiteRT-LM v0.0.0-other#" \
    "$tmp/stubs/com/google/ai/edge/litertlm/Engine.kt"
  ! versions_match "$TOML" "$tmp/stubs" >"$log" || { echo "a stub of LiteRT-LM 0.0.0-other went unnoticed"; return 1; }
  grep -q "Engine.kt mirrors google-ai-edge/LiteRT-LM 0.0.0-other" "$log" || { echo "no line names Engine.kt:"; cat "$log"; return 1; }
}

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

# --- the app's compile classpath, fetched once into .tools: android.jar (API 23) and ONNX Runtime Android's Java API
# Debian ships android.jar only in bullseye and sid: a private apt configuration (the machine's own Debian mirror,
# Debian's keyring) downloads the one .deb without touching the system's sources; the hash pins the exact file.
ANDROID_JAR=$DEMO/.tools/android-23/android.jar
ANDROID_PKG=libandroid-23-java=6.0.1+r72-6
ANDROID_DEB=libandroid-23-java_6.0.1+r72-6_all.deb
ANDROID_DEB_SHA256=8af1b6df556971dda0a6da3536ea526a838e0c363afcdd454213d8bce94793e3
fetch_android_jar() {
  local tmp=$DEMO/.tools/apt mirror codename
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  mirror=$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' \
    | awk -v r="$codename" '$2 == r {print $1; exit}')
  [ -n "$mirror" ] || { echo "android_demo: no Debian mirror for $codename in the apt sources"; return 1; }
  rm -rf "$tmp" && mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
    "$mirror" bullseye "$mirror" sid >"$tmp/sources.list"
  local apt=(apt-get -q -o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts="$tmp/parts"
    -o Dir::State::lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o APT::Sandbox::User=root)
  "${apt[@]}" update >"$tmp/apt.log" 2>&1 || true # one suite is enough; the download below says if none had it
  (cd "$tmp" && "${apt[@]}" download "$ANDROID_PKG") >>"$tmp/apt.log" 2>&1 \
    && echo "$ANDROID_DEB_SHA256  $tmp/$ANDROID_DEB" | sha256sum -c --quiet \
    || { cat "$tmp/apt.log"; echo "android_demo: could not fetch $ANDROID_DEB"; return 1; }
  mkdir -p "$(dirname "$ANDROID_JAR")"
  dpkg-deb --fsys-tarfile "$tmp/$ANDROID_DEB" | tar -xO ./usr/share/java/com.android.android-23.jar >"$ANDROID_JAR.part" \
    && mv "$ANDROID_JAR.part" "$ANDROID_JAR" && rm -rf "$tmp"
}
# The official onnxruntime-android AAR of the version the toml pins. Where each version can be had here: a Unity
# plugin on npm that redistributes it (npm checks the tarball's integrity), and the AAR's sha256. Only its
# classes.jar is kept, with the version its native library reports (VERSION), which versions_match compares.
ort_aar_source() {
  case $1 in
    1.29.0) echo "com.github.asus4.onnxruntime@0.4.9 98cddbac92640b4a6af72a03c42e0491851f366d3da66bbaeb5dd66310946cf2" ;;
    *) return 1 ;;
  esac
}
ORT_VERSION=$(toml_version "$TOML" onnxruntime)
ORT_SOURCE=$(ort_aar_source "$ORT_VERSION") || {
  echo "android_demo: gradle/libs.versions.toml pins onnxruntime ${ORT_VERSION:-nothing}; ort_aar_source has no AAR for it"
  failed=1; summary; exit 1; }
read -r ORT_NPM ORT_AAR_SHA256 <<<"$ORT_SOURCE"
ORT_DIR=$DEMO/.tools/onnxruntime-android-$ORT_VERSION
ORT_JAR=$ORT_DIR/classes.jar
# The ONNX Runtime version in an AAR, as its arm64 libonnxruntime.so reports it: the one "1.<ORT_API_VERSION>.N"
# string in it, ORT_API_VERSION from the AAR's C API header.
aar_ort_version() {
  local api versions
  api=$(unzip -p "$1" headers/onnxruntime_c_api.h | sed -n 's/^#define ORT_API_VERSION \([0-9][0-9]*\).*/\1/p' || true)
  [ -n "$api" ] || return 1
  versions=$(unzip -p "$1" jni/arm64-v8a/libonnxruntime.so | tr '\0' '\n' | LC_ALL=C grep -axE "1\.$api\.[0-9]+" \
    | sort -u || true)
  [ -n "$versions" ] && [ "$(echo "$versions" | wc -l)" -eq 1 ] && echo "$versions"
}
fetch_ort_jar() {
  local tmp=$DEMO/.tools/ort-npm aar=package/Plugins/Android/onnxruntime.aar
  rm -rf "$tmp" "$ORT_DIR" && mkdir -p "$tmp" "$ORT_DIR"
  (cd "$tmp" && npm pack --silent "$ORT_NPM" >/dev/null) && tar -xzf "$tmp"/*.tgz -C "$tmp" "$aar" \
    && echo "$ORT_AAR_SHA256  $tmp/$aar" | sha256sum -c --quiet \
    || { echo "android_demo: could not fetch the ONNX Runtime Android AAR from npm $ORT_NPM"; return 1; }
  aar_ort_version "$tmp/$aar" >"$ORT_DIR/VERSION.part" \
    || { echo "android_demo: the AAR in npm $ORT_NPM reports no single ONNX Runtime version"; return 1; }
  unzip -p "$tmp/$aar" classes.jar >"$ORT_JAR.part" && mv "$ORT_JAR.part" "$ORT_JAR" \
    && mv "$ORT_DIR/VERSION.part" "$ORT_DIR/VERSION" && rm -rf "$tmp"
}
[ -f "$ANDROID_JAR" ] || fetch_android_jar
[ -f "$ORT_JAR" ] && [ -f "$ORT_DIR/VERSION" ] || fetch_ort_jar
# Before the build: the toml and the APIs about to be compiled against agree, and the check would see if they did not
check versions_match "$TOML" "$STUBS"
check versions_mismatch_caught
if [ "$failed" -ne 0 ]; then summary; exit 1; fi
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
# the Python runtime's multi-turn conversation on that export (ids per turn), which ConversationParityTest replays
CONVERSATION=$BUILD/conversation_reference.json
.venv/bin/python "$DEMO/desktop/src/test/python/conversation_reference.py" "$EXPORT" "$CONVERSATION" \
  >"$BUILD/conversation.log" 2>&1 || { cat "$BUILD/conversation.log"; failed=1; summary; exit 1; }

# --- build: core alone (no JNA, no Android on its classpath), then desktop, then both test sets --------------
kc() { "$K/bin/kotlinc" -jvm-target 17 -nowarn "$@" 2>&1 | { grep -v '^warning:' || true; }; }
TEST_CP=$J/junit-jupiter-api.jar:$J/apiguardian-api.jar:$J/opentest4j.jar:$J/junit-platform-commons.jar
rm -f "$BUILD"/*.jar
kc "$DEMO/core/src/main/kotlin" -d "$BUILD/core.jar"
kc "$DEMO/desktop/src/main/kotlin" -cp "$BUILD/core.jar:$J/jna.jar" -d "$BUILD/desktop.jar"
# with the app's one Android-free file that a test checks against the Python runtime (ChatTurnsTest)
kc "$DEMO/core/src/test/kotlin" "$DEMO/desktop/src/test/kotlin" "$DEMO/app/src/jvmTest/kotlin" \
  "$DEMO/app/src/main/kotlin/mtpkit/demo/ChatTurns.kt" -cp "$BUILD/core.jar:$BUILD/desktop.jar:$J/jna.jar:$TEST_CP" -d "$BUILD/tests.jar"
for jar in core desktop tests; do [ -f "$BUILD/$jar.jar" ] || { echo "android_demo: kotlinc failed ($jar)"; exit 1; }; done

# --- checks outside JUnit: core stays platform-free; the app's manifest and res/ link with aapt2 ------------
no_android_imports() { ! grep -rn 'import android\.' "$DEMO/core"; }
check no_android_imports
check "$DEMO/app/lint-resources.sh" "$BUILD/aapt2"
# core + app sources against android.jar alone (-no-jdk), with ORT's Java API, kotlinx-coroutines and the
# compile-only LiteRT-LM / DJL declarations of app/compile-stubs as libraries; R.java comes from the check above
app_compiles() {
  local stubs=$BUILD/compile-stubs coroutines=$K/lib/kotlinx-coroutines-core-jvm.jar
  local r_java; r_java=$(find "$BUILD/aapt2/gen" -name R.java 2>/dev/null)
  [ -n "$r_java" ] || { echo "no R.java under $BUILD/aapt2/gen: the resource check failed"; return 1; }
  rm -rf "$stubs" && javac --release 17 -d "$stubs" $(find "$DEMO/app/compile-stubs" -name '*.java') \
    && "$K/bin/kotlinc" -jvm-target 17 -nowarn $(find "$DEMO/app/compile-stubs" -name '*.kt') \
      -cp "$stubs:$coroutines" -d "$stubs" || { echo "the compile stubs do not compile"; return 1; }
  "$K/bin/kotlinc" -jvm-target 17 -nowarn -no-jdk "$DEMO/core/src/main/kotlin" "$DEMO/app/src/main/kotlin" "$r_java" \
    -cp "$ANDROID_JAR:$ORT_JAR:$stubs:$coroutines" -d "$BUILD/app.jar" \
    || { echo "android_demo: the app's Kotlin does not compile against Android API 23 (errors above)"; return 1; }
}
check app_compiles

# --- JUnit 5 ---------------------------------------------------------------------------------------------
set +e
# A 1 MB young generation makes the JVM collect every few allocations, so a native buffer that the JIT considers
# dead while ONNX Runtime still reads it gets freed and shows as a parity failure (5 of 6 runs before the fix in
# OrtGraphSession.run), instead of as a rare SIGSEGV.
java -Xmx48m -Xmn1m -XX:+UseSerialGC -Dmtpkit.export="$EXPORT" -Dmtpkit.exportQuantized="$QEXPORT" -Dmtpkit.cli="$ROOT/.venv/bin/mtpkit" -Dmtpkit.ortLib="$ORT_LIB" \
  -Dmtpkit.conversation="$CONVERSATION" -Dmtpkit.gemma4Template="$DEMO/desktop/src/test/python/gemma4_text_chat.jinja" \
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
summary
[ "$failed" -eq 0 ]
