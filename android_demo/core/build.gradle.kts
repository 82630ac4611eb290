// Pure Kotlin (no android.*): the loop, manifest reader, KV buffers, embedding lookup. Tests need -Dmtpkit.export.
plugins { alias(libs.plugins.kotlin.jvm) }

kotlin { jvmToolchain(17) }

dependencies { testImplementation(libs.junit.jupiter) }

tasks.test {
    useJUnitPlatform()
    systemProperty("mtpkit.export", providers.gradleProperty("mtpkitExport").getOrElse(""))
}
