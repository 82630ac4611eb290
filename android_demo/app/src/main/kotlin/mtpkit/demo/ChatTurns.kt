package mtpkit.demo

import mtpkit.core.ChatMessage
import mtpkit.core.ModelManifest

/**
 * The history as text in Gemma's turn format, what the export's chat template renders for a text chat with
 * add_generation_prompt (bos is prepended as an id by the caller, as the template's {{ bos_token }} encodes): per
 * message OPEN + ROLE + "\n" + CONTENT + CLOSE + "\n" (assistant is "model", content trimmed as the template's
 * `| trim`; Gemma 4 also strips an answer's thought channel), then OPEN + "model\n". Gemma 4 opens and closes turns
 * with `<|turn>` / `<turn|>`, Gemma 1-3 with `<start_of_turn>` / `<end_of_turn>`. There is no Jinja on the device,
 * so an export whose template uses neither is refused rather than rendered differently from the Python runtime.
 */
object ChatTurns {
    /** A turn format: the markers that open and close a turn, and whether an answer's thought channel goes. */
    data class Format(val open: String, val close: String, val stripsThinking: Boolean)

    val GEMMA4 = Format("<|turn>", "<turn|>", stripsThinking = true)
    val GEMMA = Format("<start_of_turn>", "<end_of_turn>", stripsThinking = false)

    /** This export's turn format; throws with the reason when its chat template is not one the app can render. */
    fun check(manifest: ModelManifest): Format {
        val name = manifest.chatTemplateFile
            ?: error("this export has no chat template, which the chat needs; re-export from a checkpoint with one")
        val template = manifest.path(name).readText()
        return listOf(GEMMA4, GEMMA).firstOrNull { it.open in template && it.close in template }
            ?: throw IllegalArgumentException("the chat template $name uses neither Gemma 4's <|turn> / <turn|> nor " +
                "Gemma's <start_of_turn> / <end_of_turn> turns, the only formats the app renders; chat with this " +
                "export through the Python runtime (mtpkit chat)")
    }

    fun render(messages: List<ChatMessage>, format: Format = GEMMA): String =
        spliced(messages, emptyMap(), format) { listOf(it) }.joinToString("")

    /**
     * The history's ids with each kept answer (message index -> the ids generated) as those ids where its text
     * would stand, the text between them through [encode]: runtime/tokenizer.py's encode_chat with kept. An answer
     * whose thought channel the format strips renders as text, as the Python runtime does.
     */
    fun <T> spliced(messages: List<ChatMessage>, kept: Map<Int, List<T>>, format: Format,
                    encode: (String) -> List<T>): List<T> {
        val out = ArrayList<T>()
        val text = StringBuilder()
        for ((i, m) in messages.withIndex()) {
            val model = m.role == "assistant"
            text.append(format.open).append(if (model) "model" else m.role).append('\n')
            val content = if (model && format.stripsThinking) stripThinking(m.content) else m.content.trim()
            val ids = kept[i]?.takeIf { content == m.content.trim() }
            if (ids == null) {
                text.append(content)
            } else {
                out += encode(text.toString()).also { text.clear() }
                out += ids
            }
            text.append(format.close).append('\n')
        }
        return out + encode(text.append(format.open).append("model\n").toString())
    }

    /** Gemma 4's strip_thinking: each `<|channel>...<channel|>` thought dropped, then trimmed. */
    private fun stripThinking(content: String): String =
        content.split("<channel|>").joinToString("") { it.substringBefore("<|channel>") }.trim()
}
