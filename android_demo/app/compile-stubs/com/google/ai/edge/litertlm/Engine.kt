// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/Engine.kt: the public members of Engine
// except createSession and setNativeMinLogSeverity, which the app does not use.
package com.google.ai.edge.litertlm

class Engine(val engineConfig: EngineConfig) : AutoCloseable {
  fun isInitialized(): Boolean = TODO("compile-only declaration")

  fun initialize(): Unit = TODO("compile-only declaration")

  override fun close(): Unit = TODO("compile-only declaration")

  fun createConversation(
    conversationConfig: ConversationConfig = ConversationConfig()
  ): Conversation = TODO("compile-only declaration")
}
