// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors google-ai-edge/LiteRT-LM
// kotlin/java/com/google/ai/edge/litertlm/ModelInfo.kt at commit b5253edced6e: the constructor,
// hasSpeculativeDecodingSupport and close (released versions up to 0.17 call this class Capabilities).
package com.google.ai.edge.litertlm

class ModelInfo(modelPath: String) : AutoCloseable {
  fun hasSpeculativeDecodingSupport(): Boolean = TODO("compile-only declaration")

  override fun close(): Unit = TODO("compile-only declaration")
}
