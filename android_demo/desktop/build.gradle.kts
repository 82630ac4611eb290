// Test-only: core's GraphSession over ONNX Runtime's C API (JNA) on the desktop JVM, and the parity test.
// Run: gradle :desktop:test -PmtpkitExport=DIR -PmtpkitExportQuantized=QDIR -PmtpkitCli=.venv/bin/mtpkit
//      -PortLib=.../libonnxruntime.so.1.x -PmtpkitConversation=JSON  (QDIR: an int8-target / int4-drafter export,
//      as android_demo/test.sh makes; JSON: what src/test/python/conversation_reference.py DIR JSON writes)
plugins { alias(libs.plugins.kotlin.jvm) }

kotlin { jvmToolchain(17) }

dependencies {
    implementation(project(":core"))
    implementation(libs.jna)
    testImplementation(libs.junit.jupiter)
}

tasks.test {
    useJUnitPlatform()
    systemProperty("mtpkit.export", providers.gradleProperty("mtpkitExport").getOrElse(""))
    systemProperty("mtpkit.exportQuantized", providers.gradleProperty("mtpkitExportQuantized").getOrElse(""))
    systemProperty("mtpkit.cli", providers.gradleProperty("mtpkitCli").getOrElse(""))
    systemProperty("mtpkit.ortLib", providers.gradleProperty("ortLib").getOrElse(""))
    systemProperty("mtpkit.conversation", providers.gradleProperty("mtpkitConversation").getOrElse(""))
}
