// Compile-only declarations (android_demo/test.sh's classpath, never packaged). Mirror
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/ExperimentalFlags.kt: the ExperimentalApi
// opt-in annotation whole and, of ExperimentalFlags, the enableBenchmark flag the app sets.
package com.google.ai.edge.litertlm

@ExperimentalApi
object ExperimentalFlags {
  var enableBenchmark: Boolean = false
}

@RequiresOptIn(
  message = "This API is experimental and temporary. It may change or be removed without notice.",
  level = RequiresOptIn.Level.ERROR,
)
@Retention(AnnotationRetention.BINARY)
@Target(AnnotationTarget.CLASS, AnnotationTarget.FUNCTION)
annotation class ExperimentalApi
