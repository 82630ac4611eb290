// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/Benchmark.kt: BenchmarkInfo whole (the
// benchmark() function, which the app does not use, is left out).
package com.google.ai.edge.litertlm

data class BenchmarkInfo(
  val initTimeInSecond: Double,
  val timeToFirstTokenInSecond: Double,
  val lastPrefillTokenCount: Int,
  val lastDecodeTokenCount: Int,
  val lastPrefillTokensPerSecond: Double,
  val lastDecodeTokensPerSecond: Double,
)
