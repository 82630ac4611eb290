// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors
// google-ai-edge/LiteRT-LM v0.18.0 kotlin/java/com/google/ai/edge/litertlm/Message.kt: Message's internal constructor
// and its toString (the text of its contents); the role, contents, tool calls and channels the app does not read are
// left out.
package com.google.ai.edge.litertlm

class Message internal constructor() {
  override fun toString(): String = TODO("compile-only declaration")
}
