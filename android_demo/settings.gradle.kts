// Workstation-only build (needs Google Maven and Maven Central); on the dev machine use ./test.sh instead.
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "mtpkit-android-demo"
include(":core", ":desktop", ":app")
