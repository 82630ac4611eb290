// Thin adapters over core (ONNX Runtime Android) and LiteRT-LM; workstation-only (Google Maven, Maven Central).
plugins {
    alias(libs.plugins.android.application)
    alias(libs.plugins.kotlin.android)
}

android {
    namespace = "mtpkit.demo"
    compileSdk = 35
    defaultConfig {
        applicationId = "mtpkit.demo"
        minSdk = 26
        targetSdk = 35
        versionCode = 1
        versionName = "0.1"
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    sourceSets["main"].java.srcDirs("src/main/kotlin")
    packaging { jniLibs.useLegacyPackaging = true } // .litertlm / .onnx files are read from storage, not assets
}

kotlin { jvmToolchain(17) }

dependencies {
    implementation(project(":core"))
    implementation(libs.onnxruntime.android)
    implementation(libs.litertlm.android)
    implementation(libs.djl.tokenizers)
    implementation(libs.djl.tokenizer.native)
    implementation(libs.coroutines.android)
}
