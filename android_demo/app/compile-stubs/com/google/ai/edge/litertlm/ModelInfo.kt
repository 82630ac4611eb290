// Compile-only declarations (android_demo/test.sh's classpath, never packaged). Mirror
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/ModelInfo.kt: of the sealed ModelInfo, its
// factory from(modelPath) and close; of its subtypes, Llm with hasSpeculativeDecodingSupport, which Llm implements from
// the LlmCapability interface (declared here with that one member). Embedding, Unknown and the metadata getters the app
// does not read are left out. (Released versions up to 0.17 have a Capabilities class instead.)
package com.google.ai.edge.litertlm

interface LlmCapability {
  fun hasSpeculativeDecodingSupport(): Boolean
}

sealed class ModelInfo protected constructor() : AutoCloseable {
  override fun close(): Unit = TODO("compile-only declaration")

  class Llm internal constructor() : ModelInfo(), LlmCapability {
    override fun hasSpeculativeDecodingSupport(): Boolean = TODO("compile-only declaration")
  }

  companion object {
    @JvmStatic fun from(modelPath: String): ModelInfo = TODO("compile-only declaration")
  }
}
