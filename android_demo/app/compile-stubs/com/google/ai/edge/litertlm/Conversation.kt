// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/Conversation.kt: the text-to-Flow overload
// of sendMessageAsync (without its optional sampling parameters, which follow extraContext upstream), getBenchmarkInfo
// and close. Upstream's constructor takes a native handle; apps get a Conversation from Engine.createConversation, so
// it is private here.
package com.google.ai.edge.litertlm

import kotlinx.coroutines.flow.Flow

class Conversation private constructor() : AutoCloseable {
  @JvmOverloads
  fun sendMessageAsync(text: String, extraContext: Map<String, Any> = emptyMap()): Flow<Message> =
    TODO("compile-only declaration")

  @ExperimentalApi fun getBenchmarkInfo(): BenchmarkInfo = TODO("compile-only declaration")

  override fun close(): Unit = TODO("compile-only declaration")
}
