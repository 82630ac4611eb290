// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors google-ai-edge/LiteRT-LM
// kotlin/java/com/google/ai/edge/litertlm/Benchmark.kt at commit 0ea540e401e3: BenchmarkInfo whole (the
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
