// Compile-only declarations (android_demo/test.sh's classpath, never packaged). Mirror
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/Config.kt: Backend, ActivationDataType and
// EngineConfig whole; of ConversationConfig only enableSpeculativeDecoding (its other parameters all have defaults
// upstream and come first, so callers must pass it by name, as the app does).
package com.google.ai.edge.litertlm

sealed class Backend(val name: String) {
  data class CPU(
    val threadCount: Int? = null,
    @Deprecated("Use threadCount instead", ReplaceWith("threadCount")) val numOfThreads: Int? = null,
  ) : Backend("CPU")

  class GPU : Backend("GPU")

  data class NPU(val nativeLibraryDir: String = "") : Backend("NPU")

  class GOOGLE_TENSOR : Backend("GOOGLE_TENSOR_ARTISAN")
}

enum class ActivationDataType(val value: Int) {
  FLOAT32(0),
  FLOAT16(1),
  INT16(2),
  INT8(3),
}

data class EngineConfig
@JvmOverloads
constructor(
  val modelPath: String,
  val backend: Backend = Backend.CPU(),
  val visionBackend: Backend? = null,
  val audioBackend: Backend? = null,
  val maxNumTokens: Int? = null,
  val maxNumImages: Int? = null,
  val cacheDir: String? = null,
  val activationDataType: ActivationDataType? = null,
)

data class ConversationConfig
@JvmOverloads
constructor(val enableSpeculativeDecoding: Boolean? = null)
